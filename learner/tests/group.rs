//! A learner group (issue 17): 2 and 3 ranks over the CPU collective train the same weights as
//! one process over the same SFT rows and the same rollouts, and a run checkpointed by one
//! number of ranks resumes with another.
//!
//! Each "process" here is a thread running [`run_learner_in_group`] with its own model and
//! optimizer shard, talking to the others over TCP exactly as separate processes do.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use cascade_learner::run::{run_learner_in_group, LearnerExit, LearnerOptions};
use cascade_replay::WriterOptions;
use cascade_shared::collective::{Collective, Rendezvous, Single, TcpGroup};
use cascade_shared::config::RunConfig;
use cascade_shared::rollout::{FinishReason, Sample, SampleTiming, VersionSpan};
use cascade_shared::snapshot::{load_model, version_dir_name};
use cascade_shared::transport::{ReplaySink, RolloutSink};
use cascade_shared::{Mode, RolloutGroup, StageKind};

const SFT_STEPS: u64 = 10;
const RL_STEPS: u64 = 10;
const BATCH_PROMPTS: usize = 3;

const MODEL: &str = r#"{
  "model_type": "qwen3", "vocab_size": 320, "hidden_size": 32, "intermediate_size": 64,
  "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
  "max_position_embeddings": 512, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
  "tie_word_embeddings": false, "initializer_range": 0.02
}"#;

fn tokenizer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/chat/tiny-tokenizer/tokenizer.json")
        .canonicalize()
        .unwrap()
}

/// An SFT stage then a math RL stage; `micro_batch = 1` so that every step has several
/// micro-batches to split over the ranks.
fn config_text(publish_every: u64) -> String {
    format!(
        r#"
[model]
init = {{ config = "model.json", tokenizer = "{tok}", seed = 3 }}
dtype = "f32"
[learner]
micro_batch = 1
publish_every = {publish_every}
max_staleness = 1000
keep_snapshots = 1000
seed = 5
[[stages]]
name = "sft"
kind = "sft"
dataset = "sft.jsonl"
steps = {SFT_STEPS}
lr = 1e-3
batch_prompts = 4
token_budget = 96
[[stages]]
name = "math"
kind = "math"
dataset = "math.jsonl"
steps = {RL_STEPS}
lr = 1e-3
batch_prompts = {BATCH_PROMPTS}
group_size = 2
max_response_tokens = 12
"#,
        tok = tokenizer().display()
    )
}

const WORDS: [&str; 12] = [
    "apple", "river", "stone", "cloud", "green", "seven", "north", "light", "table", "music",
    "paper", "bread",
];

fn write_inputs(dir: &Path) -> Result<()> {
    std::fs::write(dir.join("model.json"), MODEL)?;
    let mut sft = String::new();
    for i in 0..16 {
        let (a, b) = (WORDS[i % 12], WORDS[(i * 5 + 3) % 12]);
        let (mode, answer) = if i % 2 == 0 {
            (
                "think",
                format!("<think>\\n{a} then {b}\\n</think>\\n\\n{b} {a}"),
            )
        } else {
            ("no_think", format!("{b} and {a}."))
        };
        sft.push_str(&format!(
            "{{\"messages\": [{{\"role\": \"user\", \"content\": \"Say {a} {b}\"}}, \
             {{\"role\": \"assistant\", \"content\": \"{answer}\"}}], \"mode\": \"{mode}\"}}\n"
        ));
    }
    std::fs::write(dir.join("sft.jsonl"), sft)?;
    std::fs::write(dir.join("math.jsonl"), "")?;
    Ok(())
}

/// The same rollouts for every run: groups of the math stage (index 1), sampled at version 0,
/// with a right and a wrong answer each.
fn rollouts(n: usize) -> Vec<RolloutGroup> {
    let mut x = 12345u64;
    let mut next = |m: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((x >> 33) % m) as u32
    };
    (0..n)
        .map(|g| {
            let prompt_ids: Vec<u32> = (0..4 + g % 5).map(|_| 10 + next(240)).collect();
            let samples = (0..2)
                .map(|s| {
                    let len = 3 + next(9) as usize;
                    Sample {
                        response_ids: (0..len).map(|_| 10 + next(240)).collect(),
                        behaviour_logprobs: (0..len)
                            .map(|_| -5.5 - next(100) as f32 / 200.0)
                            .collect(),
                        policy_versions: vec![VersionSpan {
                            start_token: 0,
                            version: 0,
                        }],
                        finish_reason: FinishReason::Stop,
                        reward: if (s + g) % 2 == 0 { 1.0 } else { 0.0 },
                        reward_breakdown: Vec::new(),
                        timing: SampleTiming::default(),
                    }
                })
                .collect();
            RolloutGroup {
                stage: StageKind::Math,
                stage_index: 1,
                prompt_id: g as u64,
                mode: if g % 3 == 0 {
                    Mode::NoThink
                } else {
                    Mode::Think
                },
                actor_id: 0,
                prompt_ids,
                temperature: 1.0,
                samples,
            }
        })
        .collect()
}

/// A run directory with the inputs and `groups` rollouts in its replay log.
fn run_dir(root: &Path, name: &str, groups: usize) -> Result<PathBuf> {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir)?;
    write_inputs(&dir)?;
    let opts = WriterOptions {
        segment_size: 1 << 20,
        ..WriterOptions::default()
    };
    let mut sink = ReplaySink::open(dir.join("replay").join("actor-0"), opts)?;
    for g in rollouts(groups) {
        sink.send(&g)?;
    }
    Ok(dir)
}

fn options(dir: &Path, publish_every: u64, resume: bool, max_steps: Option<u64>) -> LearnerOptions {
    options_of(&config_text(publish_every), dir, resume, max_steps)
}

/// The learner options of the config `text`.
fn options_of(text: &str, dir: &Path, resume: bool, max_steps: Option<u64>) -> LearnerOptions {
    let config = RunConfig::parse(text, "group.toml", dir, &[]).unwrap();
    LearnerOptions {
        run_dir: dir.to_path_buf(),
        device: Device::Cpu,
        config,
        resume,
        max_steps,
    }
}

/// Runs `world` ranks (threads) of one learner on `dir`; returns rank 0's exit.
fn run_group(dir: &Path, world: usize, resume: bool, max_steps: Option<u64>) -> LearnerExit {
    run_group_with(options(dir, 4, resume, max_steps), world)
}

/// [`run_group`] with the given options.
fn run_group_with(opts: LearnerOptions, world: usize) -> LearnerExit {
    if world == 1 {
        let stop = Arc::new(AtomicBool::new(false));
        return run_learner_in_group(&opts, stop, Box::new(Single))
            .unwrap()
            .exit;
    }
    let timeout = Duration::from_secs(120);
    let rendezvous = Rendezvous::bind("127.0.0.1:0").unwrap();
    let addr = rendezvous.local_addr().unwrap();
    let mut rendezvous = Some(rendezvous);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let opts = opts.clone();
                let listener = rendezvous.take();
                s.spawn(move || {
                    let group: Box<dyn Collective> = match listener {
                        Some(l) => Box::new(l.accept(world, 7, timeout).unwrap()),
                        None => Box::new(TcpGroup::connect(addr, rank, world, 7, timeout).unwrap()),
                    };
                    let stop = Arc::new(AtomicBool::new(false));
                    run_learner_in_group(&opts, stop, group).unwrap().exit
                })
            })
            .collect();
        let exits: Vec<LearnerExit> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(exits.iter().all(|e| *e == exits[0]), "{exits:?}");
        exits[0]
    })
}

fn weights(dir: &Path, version: u64) -> BTreeMap<String, Tensor> {
    load_model(
        &dir.join("snapshots").join(version_dir_name(version)),
        &Device::Cpu,
    )
    .unwrap()
    .into_iter()
    .collect()
}

/// Largest |a − b| / max|a| over every tensor.
fn max_rel_diff(a: &BTreeMap<String, Tensor>, b: &BTreeMap<String, Tensor>) -> f64 {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let mut worst = 0f64;
    for (name, x) in a {
        let x = x.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
        let y = b[name].to_dtype(DType::F64).unwrap().flatten_all().unwrap();
        let scale = x.abs().unwrap().max(0).unwrap().to_scalar::<f64>().unwrap();
        let diff = (x - y)
            .unwrap()
            .abs()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        if std::env::var("GROUP_DEBUG").is_ok() {
            eprintln!(
                "  {name}: {:.3e} (scale {scale:.3e})",
                diff / scale.max(1e-12)
            );
        }
        worst = worst.max(diff / scale.max(1e-12));
    }
    worst
}

/// The loss and gradient norm rank 0 logged for each step, in order.
fn step_log(dir: &Path) -> Vec<(String, f64, f64)> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["event"] == "learner_step" || e["event"] == "sft_step")
        .map(|e| {
            (
                e["event"].as_str().unwrap().to_string(),
                e["loss"].as_f64().unwrap(),
                e["grad_norm"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// The policy version the (first) resume of the run in `dir` started from.
fn resumed_at(dir: &Path) -> Option<u64> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["event"] == "resume")
        .and_then(|e| e["policy_version"].as_u64())
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-12)
}

/// 2 and 3 ranks against 1, after 10 SFT steps and after 10 more GRPO steps. Each rank runs
/// micro-batches the single process runs, with the same bits; only the order in which their
/// gradients are summed differs (each micro-batch's across ranks in rank order, then over the
/// step). With the default f64 sums (`learner.grad_accum`) every sum of f32 gradients is exact,
/// so the weights are the same to the last bit; the losses and gradient norms the metrics log
/// are f64 sums of per-rank figures and agree to 1e-12. With f32 sums the last bits depend on
/// the order, and AdamW, which divides by √v, turns last-bit differences in near-zero gradient
/// elements (GRPO's positive and negative advantages cancel) into larger relative differences
/// of the update: the SFT weights agree to 1e-5 (1.5e-6 measured), those after the GRPO steps
/// to 1e-4 (6.3e-6).
#[test]
fn two_and_three_ranks_train_the_weights_of_one() -> Result<()> {
    let root = tempfile::tempdir()?;
    let groups = BATCH_PROMPTS * RL_STEPS as usize;
    let mut exact_runs = Vec::new();
    for accum in ["f64", "f32"] {
        let text = config_text(4).replace(
            "seed = 5\n",
            &format!("seed = 5\ngrad_accum = \"{accum}\"\n"),
        );
        let mut runs = Vec::new();
        for world in [1usize, 2, 3] {
            let dir = run_dir(root.path(), &format!("{accum}-w{world}"), groups)?;
            let opts = options_of(&text, &dir, false, None);
            assert_eq!(
                format!("{:?}", opts.config.learner.grad_accum).to_lowercase(),
                accum
            );
            assert_eq!(run_group_with(opts, world), LearnerExit::Completed);
            runs.push(dir);
        }
        let (log_tol, sft_tol, rl_tol) = if accum == "f64" {
            (1e-12, 0.0, 0.0)
        } else {
            (1e-5, 1e-5, 1e-4)
        };
        let one = step_log(&runs[0]);
        assert_eq!(one.len() as u64, SFT_STEPS + RL_STEPS);
        for (world, dir) in [(2, &runs[1]), (3, &runs[2])] {
            let log = step_log(dir);
            assert_eq!(log.len(), one.len(), "{world} ranks");
            let worst = one
                .iter()
                .zip(&log)
                .map(|(a, b)| {
                    assert_eq!(a.0, b.0);
                    rel(a.1, b.1).max(rel(a.2, b.2))
                })
                .fold(0.0, f64::max);
            eprintln!("{accum}: {world} ranks vs 1: losses and gradient norms within {worst:.3e}");
            assert!(worst <= log_tol, "{accum}, {world} ranks: {worst:e}");
        }
        for (version, tol) in [(SFT_STEPS, sft_tol), (SFT_STEPS + RL_STEPS, rl_tol)] {
            let one = weights(&runs[0], version);
            for (world, dir) in [(2, &runs[1]), (3, &runs[2])] {
                let diff = max_rel_diff(&one, &weights(dir, version));
                eprintln!(
                    "{accum}: version {version}: {world} ranks vs 1: weights within {diff:.3e}"
                );
                assert!(
                    diff <= tol,
                    "{accum}, version {version}, {world} ranks: {diff:e}"
                );
            }
        }
        if accum == "f64" {
            exact_runs = runs;
        }
    }
    let runs = exact_runs;
    // Rank 0 alone wrote the metrics and the snapshots; inside a stage every rank wrote its
    // optimizer shard (f32 master, m, v of its third of the elements) into the snapshot, and
    // the three shards assemble into a single-process AdamW.
    let mid = runs[2]
        .join("snapshots")
        .join(version_dir_name(SFT_STEPS + 2));
    assert!(!mid.join("optimizer.safetensors").exists());
    let shards: Vec<PathBuf> = (0..3)
        .map(|r| mid.join(cascade_learner::zero::shard_file_name(r, 3)))
        .collect();
    let manifest = std::fs::read_to_string(mid.join("manifest.json"))?;
    let model = weights(&runs[2], SFT_STEPS + 2);
    let params: usize = model.values().map(|t| t.elem_count()).sum();
    for s in &shards {
        let name = s.file_name().unwrap().to_str().unwrap();
        assert!(manifest.contains(name), "{name} not in the manifest");
        let bytes = std::fs::metadata(s)?.len() as usize;
        assert!(
            bytes >= 12 * (params / 3) && bytes < 12 * (params / 3 + 1) + 4096,
            "{bytes}"
        );
    }
    let vars: Vec<(String, candle_core::Var)> = model
        .iter()
        .map(|(k, t)| (k.clone(), candle_core::Var::from_tensor(t).unwrap()))
        .collect();
    let mut whole = cascade_learner::AdamW::new(vars, Default::default())?;
    whole.load_shards(&shards)?;
    assert_eq!(whole.steps(), 2);
    // Stage-final snapshots carry weights only (the next stage starts a fresh optimizer).
    let stage_end = runs[2].join("snapshots").join(version_dir_name(SFT_STEPS));
    assert!(!stage_end.join("optimizer.safetensors").exists());
    Ok(())
}

/// A run stopped mid-stage by 2 ranks resumes with 2, 3 and 1 ranks, each bit-identical to
/// never stopping (the optimizer shards are re-cut from the saved state; for 1, after one of
/// the stop snapshot's shards was corrupted, from the checkpoint before it).
#[test]
fn a_run_checkpointed_by_two_ranks_resumes_with_one_two_or_three() -> Result<()> {
    let root = tempfile::tempdir()?;
    let groups = BATCH_PROMPTS * RL_STEPS as usize;
    let whole = run_dir(root.path(), "whole", groups)?;
    assert_eq!(run_group(&whole, 2, false, None), LearnerExit::Completed);
    let end = SFT_STEPS + RL_STEPS;
    let reference = weights(&whole, end);
    for world in [2usize, 3, 1] {
        let dir = run_dir(root.path(), &format!("resumed-{world}"), groups)?;
        // Stops after 3 GRPO steps, between the publishes (every 4 steps): the stop snapshot
        // holds the optimizer state of stage step 3.
        assert_eq!(
            run_group(&dir, 2, false, Some(SFT_STEPS + 3)),
            LearnerExit::Stopped
        );
        if world == 1 {
            // A corrupt shard: the stop snapshot (v13) fails its checksums and the run resumes
            // from the previous checkpoint (v12), redoing step 13 from the replay log.
            let shard = dir
                .join("snapshots")
                .join(version_dir_name(SFT_STEPS + 3))
                .join(cascade_learner::zero::shard_file_name(1, 2));
            let mut bytes = std::fs::read(&shard)?;
            let last = bytes.len() - 1;
            bytes[last] ^= 0xff;
            std::fs::write(&shard, bytes)?;
        }
        assert_eq!(run_group(&dir, world, true, None), LearnerExit::Completed);
        let expected = if world == 1 {
            SFT_STEPS + 2
        } else {
            SFT_STEPS + 3
        };
        assert_eq!(resumed_at(&dir), Some(expected), "{world} ranks");
        let diff = max_rel_diff(&reference, &weights(&dir, end));
        eprintln!("checkpointed by 2 ranks, resumed with {world}: weights within {diff:.3e} of the uninterrupted run");
        // The gradient sums are f64 (the default `grad_accum`), so the rank count does not
        // change a bit of the steps after the resume either.
        assert_eq!(diff, 0.0, "resumed with {world} ranks: not bit-identical");
    }
    Ok(())
}

/// One optimizer step sharded over 3 ranks is AdamW's step bit for bit, f32 and bf16 weights,
/// when the summed gradient is the same bits (rank 0 holds it, the others add zeros); its
/// gathered state loads into a plain AdamW and into another number of shards; with buckets of
/// every size.
#[test]
fn a_sharded_adamw_step_is_the_adamw_step() -> Result<()> {
    use candle_core::Var;
    use cascade_learner::optim::{AdamW, AdamWConfig};
    use cascade_learner::zero::{ShardedAdamW, BUCKET};

    let shapes: [(&str, &[usize], DType); 3] = [
        ("a", &[5, 3], DType::F32),
        ("b", &[7], DType::BF16),
        ("c", &[2, 2], DType::F32),
    ];
    let make = || -> Vec<(String, Var)> {
        shapes
            .iter()
            .enumerate()
            .map(|(i, (name, dims, dtype))| {
                let n: usize = dims.iter().product();
                let v: Vec<f32> = (0..n)
                    .map(|j| ((i * 31 + j * 7) % 11) as f32 / 10.0 - 0.5)
                    .collect();
                let t = Tensor::from_vec(v, *dims, &Device::Cpu)
                    .unwrap()
                    .to_dtype(*dtype)
                    .unwrap();
                (name.to_string(), Var::from_tensor(&t).unwrap())
            })
            .collect()
    };
    // loss = Σ w³ / 3 + Σ w: gradient w² + 1, different per element.
    let grads = |vars: &[(String, Var)]| {
        let mut loss = Tensor::new(0f32, &Device::Cpu).unwrap();
        for (_, v) in vars {
            let w = v.as_tensor().to_dtype(DType::F32).unwrap();
            let l = ((w.powf(3.0).unwrap() / 3.0).unwrap() + &w)
                .unwrap()
                .sum_all()
                .unwrap();
            loss = (loss + l).unwrap();
        }
        loss.backward().unwrap()
    };
    let cfg = AdamWConfig {
        max_grad_norm: None,
        ..AdamWConfig::default()
    };
    let values = |v: &Var| -> Result<Vec<f32>> {
        Ok(v.as_tensor()
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?)
    };
    let single = make();
    let mut adamw = AdamW::new(single.clone(), cfg.clone())?;
    for _ in 0..3 {
        adamw.accumulate(&grads(&single))?;
        adamw.step(1e-2, 1.0)?;
    }
    let world = 3;
    let dir = tempfile::tempdir()?;
    let saved = dir.path().join("optimizer.safetensors");
    // The default bucket holds every shard at once; 4 and 1 elements per rank cut the 26
    // elements (shards of 9, 9, 8) into buckets whose pieces cross parameter boundaries, and
    // leave ranks with empty pieces in the last bucket.
    for bucket in [BUCKET, 4, 1] {
        let rendezvous = Rendezvous::bind("127.0.0.1:0")?;
        let addr = rendezvous.local_addr()?;
        let mut rendezvous = Some(rendezvous);
        let results: Vec<Vec<(String, Var)>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..world)
                .map(|rank| {
                    let listener = rendezvous.take();
                    let (cfg, saved) = (cfg.clone(), saved.clone());
                    s.spawn(move || {
                        let timeout = Duration::from_secs(30);
                        let mut group: Box<dyn Collective> = match listener {
                            Some(l) => Box::new(l.accept(world, 1, timeout).unwrap()),
                            None => {
                                Box::new(TcpGroup::connect(addr, rank, world, 1, timeout).unwrap())
                            }
                        };
                        let vars = make();
                        let mut opt = ShardedAdamW::new(vars.clone(), cfg, rank, world)
                            .unwrap()
                            .with_bucket(bucket)
                            .unwrap();
                        for _ in 0..3 {
                            if rank == 0 {
                                opt.accumulate(&grads(&vars)).unwrap();
                            }
                            opt.step(1e-2, 1.0, group.as_mut()).unwrap();
                        }
                        opt.save_gathered(group.as_mut(), &saved).unwrap();
                        vars
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for vars in &results {
            for ((name, a), (_, b)) in single.iter().zip(vars) {
                assert_eq!(values(a)?, values(b)?, "{name}, bucket {bucket}");
            }
        }
    }
    // The gathered state is AdamW's file: a plain AdamW and 2 shards load it and take the
    // same next step.
    // (As in a resume, the weights come from the snapshot: the f32 ones are their own master.)
    let reloaded: Vec<(String, Var)> = single
        .iter()
        .map(|(n, v)| {
            (
                n.clone(),
                Var::from_tensor(&v.as_tensor().copy().unwrap()).unwrap(),
            )
        })
        .collect();
    let mut half = ShardedAdamW::new(reloaded.clone(), cfg.clone(), 1, 2)?;
    half.load(&saved)?;
    assert_eq!(half.steps(), 3);
    assert_eq!(half.shard(), 13..26);
    let mut plain = AdamW::new(reloaded.clone(), cfg.clone())?;
    plain.load(&saved)?;
    adamw.accumulate(&grads(&single))?;
    adamw.step(1e-2, 1.0)?;
    plain.accumulate(&grads(&reloaded))?;
    plain.step(1e-2, 1.0)?;
    for ((name, a), (_, b)) in single.iter().zip(&reloaded) {
        assert_eq!(values(a)?, values(b)?, "{name} after reload");
    }
    Ok(())
}

/// `learner.checkpoint_every` (issue 17): publishes every step, a checkpoint every 3. The
/// snapshots between checkpoints hold weights only (no optimizer file, `checkpoint: false`) and
/// do not commit the replay position. A run killed after a weights-only snapshot resumes from
/// the checkpoint before it, removes the later snapshots, reads the same rollouts again and
/// ends bit-identical to the uninterrupted run.
#[test]
fn weights_only_snapshots_between_checkpoints_and_resume_from_the_last_checkpoint() -> Result<()> {
    let root = tempfile::tempdir()?;
    let groups = BATCH_PROMPTS * RL_STEPS as usize;
    let text = config_text(1).replace(
        "publish_every = 1",
        "publish_every = 1\ncheckpoint_every = 3",
    );
    let opts = |dir: &Path, resume: bool, max_steps: Option<u64>| {
        let opts = options_of(&text, dir, resume, max_steps);
        assert_eq!(opts.config.learner.checkpoint_every, 3);
        opts
    };
    let whole = run_dir(root.path(), "whole", groups)?;
    assert_eq!(
        run_group_with(opts(&whole, false, None), 2),
        LearnerExit::Completed
    );
    let snap = |dir: &Path, v: u64| dir.join("snapshots").join(version_dir_name(v));
    let files = |dir: &Path, v: u64| -> Vec<String> {
        let mut f: Vec<String> = std::fs::read_dir(snap(dir, v))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("optimizer"))
            .collect();
        f.sort();
        f
    };
    let state = |dir: &Path, v: u64| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(snap(dir, v).join("state.json")).unwrap()).unwrap()
    };
    // SFT steps 1..=10 are v1..v10 (v10 is the stage end), the RL steps v11..v20.
    for v in 1..=SFT_STEPS + RL_STEPS {
        let stage_step = state(&whole, v)["stage_step"].as_u64().unwrap();
        let checkpoint = stage_step == 0 || stage_step % 3 == 0;
        assert_eq!(
            state(&whole, v)["checkpoint"].as_bool(),
            Some(checkpoint),
            "v{v} (stage step {stage_step})"
        );
        let want: Vec<String> = if checkpoint && stage_step > 0 {
            (0..2)
                .map(|r| cascade_learner::zero::shard_file_name(r, 2))
                .collect()
        } else {
            Vec::new()
        };
        assert_eq!(files(&whole, v), want, "v{v}");
    }
    // Killed after the weights-only v14 (RL stage step 4; its last checkpoint is v13): the
    // state a SIGKILL between the publishes of v14 and v15 leaves.
    let dir = run_dir(root.path(), "killed", groups)?;
    assert_eq!(
        run_group_with(opts(&dir, false, Some(SFT_STEPS + 5)), 2),
        LearnerExit::Stopped
    );
    assert_eq!(
        state(&dir, SFT_STEPS + 5)["checkpoint"],
        true,
        "a stop checkpoints"
    );
    std::fs::remove_dir_all(snap(&dir, SFT_STEPS + 5))?;
    std::fs::write(
        dir.join("snapshots").join("LATEST"),
        format!("{}\n", SFT_STEPS + 4),
    )?;
    assert_eq!(state(&dir, SFT_STEPS + 4)["checkpoint"], false);
    assert_eq!(
        run_group_with(opts(&dir, true, None), 2),
        LearnerExit::Completed
    );
    assert_eq!(resumed_at(&dir), Some(SFT_STEPS + 3));
    let end = SFT_STEPS + RL_STEPS;
    let diff = max_rel_diff(&weights(&whole, end), &weights(&dir, end));
    assert_eq!(diff, 0.0, "resumed from the last checkpoint: bit-identical");
    // The steps after the checkpoint were recomputed: v14 is the new run's, a weights-only
    // snapshot again, with the uninterrupted run's weights.
    assert_eq!(state(&dir, SFT_STEPS + 4)["checkpoint"], false);
    assert_eq!(
        max_rel_diff(
            &weights(&whole, SFT_STEPS + 4),
            &weights(&dir, SFT_STEPS + 4)
        ),
        0.0
    );
    Ok(())
}
