//! Snapshot publish time against a plain buffered write of the same bytes, in the same run.
//!
//! `cargo bench -p cascade-learner --bench snapshot_publish` prints, per model size, the median
//! of several runs of: `publish` (safetensors encoding, CRC-32C, fsync of every file and
//! directory, renames), a plain `BufWriter` write of the same number of bytes into the same
//! number of files (no fsync), and the same plain write followed by an fsync of each file.
//! Files go under cargo's target tmp dir (a real disk, not tmpfs). Set
//! `CASCADE_BENCH_SIZES_MIB=16,128` to choose the model sizes (f32 parameters, MiB).

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor, Var};
use cascade_learner::snapshot::{publish, SnapshotInput};
use cascade_learner::{AdamW, AdamWConfig};
use cascade_shared::snapshot::LearnerState;

const RUNS: usize = 5;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn plain_write(dir: &Path, sizes: &[u64], fsync: bool) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let chunk = vec![0x5au8; 1 << 20];
    for (i, &size) in sizes.iter().enumerate() {
        let file = std::fs::File::create(dir.join(format!("f{i}")))?;
        let mut out = std::io::BufWriter::new(file);
        let mut left = size;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            out.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        let file = out.into_inner().map_err(|e| e.into_error())?;
        if fsync {
            file.sync_all()?;
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let sizes: Vec<usize> = std::env::var("CASCADE_BENCH_SIZES_MIB")
        .unwrap_or_else(|_| "16,128".into())
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("snapshot_bench");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root)?;
    println!(
        "| model MiB | total MiB | publish ms | plain write ms | ratio | plain write+fsync ms | ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    for mib in sizes {
        // Eight f32 tensors totalling `mib` MiB.
        let per = mib * (1 << 20) / 4 / 8;
        let vars: Vec<(String, Var)> = (0..8)
            .map(|i| {
                let t = Tensor::randn(0f32, 1.0, per, &Device::Cpu)?;
                Ok((format!("model.layers.{i}.weight"), Var::from_tensor(&t)?))
            })
            .collect::<anyhow::Result<_>>()?;
        let model: Vec<(String, Tensor)> = vars
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().to_dtype(DType::F32).unwrap()))
            .collect();
        let opt = AdamW::new(vars, AdamWConfig::default())?;
        let state = LearnerState {
            step: 1,
            policy_version: 1,
            stage_step: 1,
            ..LearnerState::initial(serde_json::Value::Null)
        };
        let (mut t_publish, mut t_plain, mut t_sync) = (Vec::new(), Vec::new(), Vec::new());
        let mut file_sizes = Vec::new();
        for run in 0..RUNS {
            let dir = root.join(format!("snap-{mib}-{run}"));
            let start = Instant::now();
            let info = publish(
                &dir,
                1,
                &SnapshotInput {
                    model: &model,
                    optimizer: Some(&opt),
                    state: &state,
                    config_json: b"{}",
                    tokenizer_json: b"{}",
                    extra_files: &[],
                    stage_final: false,
                },
            )?;
            t_publish.push(start.elapsed());
            file_sizes = info.manifest.files.values().map(|e| e.bytes).collect();

            let start = Instant::now();
            plain_write(&root.join(format!("plain-{mib}-{run}")), &file_sizes, false)?;
            t_plain.push(start.elapsed());
            let start = Instant::now();
            plain_write(&root.join(format!("sync-{mib}-{run}")), &file_sizes, true)?;
            t_sync.push(start.elapsed());
            for d in ["snap", "plain", "sync"] {
                std::fs::remove_dir_all(root.join(format!("{d}-{mib}-{run}")))?;
            }
        }
        let total: u64 = file_sizes.iter().sum();
        let (p, w, s) = (median(t_publish), median(t_plain), median(t_sync));
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {mib} | {:.1} | {:.1} | {:.1} | {:.2} | {:.1} | {:.2} |",
            total as f64 / (1 << 20) as f64,
            ms(p),
            ms(w),
            ms(p) / ms(w),
            ms(s),
            ms(p) / ms(s)
        );
    }
    std::fs::remove_dir_all(&root)?;
    Ok(())
}
