//! Sampler speed, as ratios against baselines measured in the same run:
//! - the one-pass memory-bandwidth bound: time to sum the same logits buffer once;
//! - candle-transformers' `LogitsProcessor` (softmax, then an argsort of the whole vocabulary
//!   for top-p) on the same rows.
//!
//! `cargo bench -p cascade-actor --bench sampler` prints a table. Env: `SAMPLER_BENCH_ROWS`
//! (default 64), `SAMPLER_BENCH_VOCAB` (default 151936), `SAMPLER_BENCH_REPS` (default 5),
//! `SAMPLER_BENCH_ONLY` (run only the settings whose name starts with it, e.g. `top-p`).
//! Logits are Gaussian with standard deviation 3 (a peaked, LM-like softmax).

#[path = "../tests/golden/mod.rs"]
mod golden;
use golden::gaussian_logits;

use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use candle_transformers::generation::{LogitsProcessor, Sampling};
use cascade_actor::sampler::{sample_batch, SampleKey, SamplingParams};
use rayon::prelude::*;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Median wall time of `reps` runs (after one warm-up run).
fn time<F: FnMut()>(reps: usize, mut f: F) -> Duration {
    f();
    let mut times: Vec<Duration> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[reps / 2]
}

fn main() {
    let rows = env_or("SAMPLER_BENCH_ROWS", 64);
    let vocab = env_or("SAMPLER_BENCH_VOCAB", 151_936);
    let reps = env_or("SAMPLER_BENCH_REPS", 5);
    let threads = rayon::current_num_threads();
    let logits = gaussian_logits(rows * vocab, 3.0, 1);
    let keys: Vec<SampleKey> = (0..rows as u64)
        .map(|r| SampleKey::for_sample(1, r / 8, 8, r % 8, 0))
        .collect();
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let bytes = (rows * vocab * 4) as f64;

    // One-pass bandwidth bound: read every logit once.
    let sum_1 = time(reps, || {
        std::hint::black_box(lane_sum(&logits));
    });
    let sum_n = time(reps, || {
        std::hint::black_box(logits.par_chunks(vocab).map(lane_sum).sum::<f32>());
    });

    // candle-transformers LogitsProcessor, one processor per row.
    let candle_rows: Vec<Tensor> = logits
        .chunks(vocab)
        .map(|r| Tensor::from_slice(r, vocab, &Device::Cpu).unwrap())
        .collect();
    println!(
        "sampler benchmark: batch {rows} x vocab {vocab} ({:.1} MB of f32 logits), {threads} threads, median of {reps}",
        bytes / 1e6
    );
    println!(
        "bandwidth bound (sum the buffer once): 1 thread {:.2} ms ({:.1} GB/s), {threads} threads {:.2} ms ({:.1} GB/s)",
        ms(sum_1),
        bytes / sum_1.as_secs_f64() / 1e9,
        ms(sum_n),
        bytes / sum_n.as_secs_f64() / 1e9
    );
    println!();
    println!(
        "| setting | ours 1 thr (ms) | ours {threads} thr (ms) | candle 1 thr (ms) | candle {threads} thr (ms) | candle/ours 1 thr | candle/ours {threads} thr | ours/bound 1 thr | ours/bound {threads} thr |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let settings: [(&str, SamplingParams, Sampling); 4] = [
        (
            "top-p 0.95, T 1",
            SamplingParams {
                temperature: 1.0,
                top_k: None,
                top_p: Some(0.95),
            },
            (Sampling::TopP {
                p: 0.95,
                temperature: 1.0,
            }),
        ),
        (
            "top-k 50 + top-p 0.95, T 0.7",
            SamplingParams {
                temperature: 0.7,
                top_k: Some(50),
                top_p: Some(0.95),
            },
            (Sampling::TopKThenTopP {
                k: 50,
                p: 0.95,
                temperature: 0.7,
            }),
        ),
        (
            "plain, T 1",
            SamplingParams::plain(),
            Sampling::All { temperature: 1.0 },
        ),
        ("greedy", SamplingParams::greedy(), Sampling::ArgMax),
    ];
    let only = std::env::var("SAMPLER_BENCH_ONLY").ok();
    for (name, params, reference) in settings {
        if only.as_deref().is_some_and(|o| !name.starts_with(o)) {
            continue;
        }
        let ours_1 = one.install(|| {
            time(reps, || {
                std::hint::black_box(sample_batch(&logits, vocab, &params, &keys).unwrap());
            })
        });
        let ours_n = time(reps, || {
            std::hint::black_box(sample_batch(&logits, vocab, &params, &keys).unwrap());
        });
        let c1 = one.install(|| time(reps, || candle_sample(&candle_rows, &reference, false)));
        let cn = time(reps, || candle_sample(&candle_rows, &reference, true));
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} | {:.2} | {:.2} |",
            ms(ours_1),
            ms(ours_n),
            ms(c1),
            ms(cn),
            c1.as_secs_f64() / ours_1.as_secs_f64(),
            cn.as_secs_f64() / ours_n.as_secs_f64(),
            ours_1.as_secs_f64() / sum_1.as_secs_f64(),
            ours_n.as_secs_f64() / sum_n.as_secs_f64(),
        );
    }
}

/// candle-transformers' sampler on every row, one `LogitsProcessor` per row.
fn candle_sample(rows: &[Tensor], sampling: &Sampling, parallel: bool) {
    let run = |(i, t): (usize, &Tensor)| {
        LogitsProcessor::from_sampling(i as u64, sampling.clone())
            .sample(t)
            .unwrap()
    };
    if parallel {
        std::hint::black_box(rows.par_iter().enumerate().map(run).collect::<Vec<_>>());
    } else {
        std::hint::black_box(rows.iter().enumerate().map(run).collect::<Vec<_>>());
    }
}

/// Sum with 16 independent accumulators, so the loop runs at memory speed, not add latency.
fn lane_sum(x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for j in 0..16 {
            lanes[j] += c[j];
        }
    }
    lanes.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
