//! CUDA sampler against the CPU reference on a GPU: the same token for the same key on every
//! draw (the kernels take the same keys and make the same integer draw as the CPU reference,
//! so the tokens are equal by construction), log-probs to 1e-4, and the device Philox equal to
//! the host one.
#![cfg(feature = "cuda")]

mod golden;
use golden::gaussian_logits;

use cascade_actor::sampler::cuda::CudaSampler;
use cascade_actor::sampler::philox::uniform_bits;
use cascade_actor::sampler::{sample_batch, SampleKey, SamplerError, SamplingParams};

fn sampler() -> CudaSampler {
    CudaSampler::new(0).unwrap_or_else(|e| panic!("CUDA sampler unavailable: {e}"))
}

#[test]
fn device_philox_matches_host() {
    let s = sampler();
    let keys: Vec<SampleKey> = golden::philox_test_keys(4096);
    let device = s.philox_bits(&keys).unwrap();
    for (k, d) in keys.iter().zip(device) {
        assert_eq!(uniform_bits(k), d, "{k:?}");
    }
}

#[test]
fn gpu_tokens_match_cpu_reference() {
    let s = sampler();
    let cases = [
        (
            151_936usize,
            64usize,
            SamplingParams {
                temperature: 1.0,
                top_k: None,
                top_p: Some(0.95),
            },
        ),
        (
            151_936,
            64,
            SamplingParams {
                temperature: 0.7,
                top_k: Some(50),
                top_p: Some(0.9),
            },
        ),
        (
            151_936,
            32,
            SamplingParams {
                temperature: 1.0,
                top_k: None,
                top_p: None,
            },
        ),
        (
            32_000,
            64,
            SamplingParams {
                temperature: 1.2,
                top_k: Some(20),
                top_p: None,
            },
        ),
        (32_000, 64, SamplingParams::greedy()),
        (
            1000,
            128,
            SamplingParams {
                temperature: 0.6,
                top_k: Some(999),
                top_p: Some(0.5),
            },
        ),
    ];
    let mut draws = 0usize;
    let mut mismatches = Vec::new();
    let mut worst_logprob = 0.0f32;
    for (c, (vocab, rows, params)) in cases.iter().enumerate() {
        for step in 0..4u64 {
            let mut logits = gaussian_logits(vocab * rows, 3.0, 1000 * c as u64 + step);
            // A masked token and a tie in every row.
            for r in 0..*rows {
                logits[r * vocab + 3] = f32::NEG_INFINITY;
                logits[r * vocab + 5] = logits[r * vocab + 6];
            }
            let keys: Vec<SampleKey> = (0..*rows as u64)
                .map(|r| SampleKey::for_sample(7, r / 8, 8, r % 8, step))
                .collect();
            let cpu = sample_batch(&logits, *vocab, params, &keys).unwrap();
            let dev_logits = s.stream().clone_htod(&logits).unwrap();
            let gpu = s
                .sample_device(&dev_logits.as_view(), *vocab, params, &keys)
                .unwrap();
            assert_eq!(cpu.len(), gpu.len());
            for (row, (a, b)) in cpu.iter().zip(&gpu).enumerate() {
                draws += 1;
                if a.token == b.token {
                    worst_logprob = worst_logprob.max((a.logprob - b.logprob).abs());
                } else {
                    mismatches.push((c, step, row, a.token, b.token));
                }
            }
        }
    }
    eprintln!(
        "GPU vs CPU: {}/{draws} tokens equal, worst log-prob diff {worst_logprob:e}",
        draws - mismatches.len()
    );
    assert!(
        mismatches.is_empty(),
        "{} of {draws} draws differ (case, step, row, cpu token, gpu token), first ones: {:?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(8)]
    );
    assert!(worst_logprob <= 1e-4, "log-prob differs by {worst_logprob}");
}

#[test]
fn gpu_refuses_non_finite_rows() {
    let s = sampler();
    let mut logits = vec![0.5f32; 2 * 100];
    logits[150] = f32::NAN;
    let dev = s.stream().clone_htod(&logits).unwrap();
    let keys = [
        SampleKey {
            seed: 1,
            stream: 0,
            position: 0,
        },
        SampleKey {
            seed: 1,
            stream: 1,
            position: 0,
        },
    ];
    let err = s
        .sample_device(&dev.as_view(), 100, &SamplingParams::plain(), &keys)
        .unwrap_err();
    assert!(matches!(err, SamplerError::NonFinite { row: 1 }), "{err}");
}

/// GPU sampler time per batch against the one-pass HBM bound (`rows * vocab * 4` bytes at the
/// bandwidth of a device-to-device copy measured in the same run, and at the H200's nominal
/// 4.8 TB/s), and against the CPU sampler on this host. Run by `scripts/gpu-check.sh`; writes a
/// markdown table to `$SAMPLER_BENCH_OUT` (or stdout).
#[test]
#[ignore = "benchmark; run by scripts/gpu-check.sh"]
fn gpu_sampler_benchmark() {
    use std::time::Instant;
    let s = sampler();
    let stream = s.stream().clone();

    // Measured bandwidth: copy 1 GiB device-to-device (reads and writes every byte).
    let n = 256 << 20;
    let src = stream.alloc_zeros::<f32>(n).unwrap();
    let mut dst = stream.alloc_zeros::<f32>(n).unwrap();
    stream.memcpy_dtod(&src, &mut dst).unwrap();
    stream.synchronize().unwrap();
    let reps = 10;
    let t = Instant::now();
    for _ in 0..reps {
        stream.memcpy_dtod(&src, &mut dst).unwrap();
    }
    stream.synchronize().unwrap();
    let bandwidth = (2 * n * 4 * reps) as f64 / t.elapsed().as_secs_f64();
    drop((src, dst));

    let mut table = format!(
        "## GPU sampler (one block per row)\n\nmeasured copy bandwidth {:.2} TB/s; nominal H200 4.8 TB/s\n\n\
         | batch x vocab | setting | GPU us/batch | bound us (measured bw) | GPU/bound | bound us (4.8 TB/s) | CPU ms/batch ({} thr) | CPU/GPU |\n\
         |---|---|---|---|---|---|---|---|\n",
        bandwidth / 1e12,
        rayon::current_num_threads()
    );
    let top_p = SamplingParams {
        temperature: 1.0,
        top_k: None,
        top_p: Some(0.95),
    };
    let cases = [
        (64usize, 151_936usize, "top-p 0.95", top_p),
        (
            64,
            151_936,
            "top-k 50 + top-p 0.95, T 0.7",
            SamplingParams {
                temperature: 0.7,
                top_k: Some(50),
                top_p: Some(0.95),
            },
        ),
        (64, 151_936, "plain", SamplingParams::plain()),
        (64, 151_936, "greedy", SamplingParams::greedy()),
        (256, 151_936, "top-p 0.95", top_p),
        (8, 151_936, "top-p 0.95", top_p),
    ];
    for (rows, vocab, name, params) in cases {
        let logits = gaussian_logits(rows * vocab, 3.0, 5);
        let keys: Vec<SampleKey> = (0..rows as u64)
            .map(|r| SampleKey::for_sample(1, r, 1, 0, 0))
            .collect();
        let dev_logits = stream.clone_htod(&logits).unwrap();
        let dev_keys = s.upload_keys(&keys).unwrap();
        let mut tokens = stream.alloc_zeros::<u32>(rows).unwrap();
        let mut logprobs = stream.alloc_zeros::<f32>(rows).unwrap();
        s.launch(
            &dev_logits.as_view(),
            vocab,
            &params,
            &dev_keys,
            &mut tokens,
            &mut logprobs,
        )
        .unwrap();
        stream.synchronize().unwrap();
        let iters = 50;
        let t = Instant::now();
        for _ in 0..iters {
            s.launch(
                &dev_logits.as_view(),
                vocab,
                &params,
                &dev_keys,
                &mut tokens,
                &mut logprobs,
            )
            .unwrap();
        }
        stream.synchronize().unwrap();
        let gpu = t.elapsed().as_secs_f64() / iters as f64;
        let t = Instant::now();
        let cpu_reps = 3;
        for _ in 0..cpu_reps {
            std::hint::black_box(sample_batch(&logits, vocab, &params, &keys).unwrap());
        }
        let cpu = t.elapsed().as_secs_f64() / cpu_reps as f64;
        let bytes = (rows * vocab * 4) as f64;
        let bound = bytes / bandwidth;
        table += &format!(
            "| {rows} x {vocab} | {name} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.0} |\n",
            gpu * 1e6,
            bound * 1e6,
            gpu / bound,
            bytes / 4.8e12 * 1e6,
            cpu * 1e3,
            cpu / gpu
        );
    }
    match std::env::var("SAMPLER_BENCH_OUT") {
        Ok(path) => std::fs::write(&path, &table).unwrap(),
        Err(_) => print!("{table}"),
    }
    println!("{table}");
}
