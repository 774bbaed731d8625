//! The CUDA sampler kernels (`src/sampler/kernels/sampler.cu`), compiled unchanged as C++ and run
//! on the CPU by a small CUDA emulation (`../tests/cuda_emu/`, shared with the fused-attention
//! kernel's test: every CUDA thread an OS thread, `__syncthreads` a barrier, warp shuffles
//! through an exchange buffer, shared memory poisoned before each block), against the CPU
//! reference on the same keys. GPU checks need a lent machine (`tests/sampler_cuda.rs`, run by
//! `scripts/gpu-check.sh`); this one runs everywhere with a C++20
//! compiler and catches errors in the kernels' logic (thresholds, ties, masked tokens, the block
//! scan of the draw, the non-finite rows) before they reach a GPU. It does not check what only
//! the hardware decides: the NVRTC build of the device code, memory coalescing, speed.
//!
//! The launch arguments come from `sampler::launch::KernelArgs`, which the CUDA sampler passes.
//! The compiler is `$CXX` or `c++`. Every recorded draw is checked with blocks of 64 threads, a
//! subset with the 1024 threads the CUDA sampler launches (all of them with `CASCADE_EMU_ALL=1`:
//! about 5 minutes on 2 cores).

#[path = "../../tests/cuda_emu/build.rs"]
mod cuda_emu;
mod golden;

use std::path::{Path, PathBuf};
use std::process::Command;

use cascade_actor::sampler::kernels::THREADS;
use cascade_actor::sampler::launch::{flat_keys, philox_kat_input, KernelArgs};
use cascade_actor::sampler::philox::uniform_bits;
use cascade_actor::sampler::{sample_batch, sample_cpu, SampleKey, SamplerError, SamplingParams};
use golden::gaussian_logits;

const KERNEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/sampler/kernels/sampler.cu"
);
const DRIVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sampler_emu.cpp");

/// Builds the emulation binary for blocks of `threads` threads, once per test process.
fn runner(threads: u32) -> PathBuf {
    cuda_emu::emulated_binary(
        &format!("run_kernel_{threads}"),
        Path::new(KERNEL),
        Path::new(DRIVER),
        &[format!("THREADS={threads}")],
        Path::new(env!("CARGO_TARGET_TMPDIR")),
    )
}

fn run(threads: u32, mode: &str, input: &[u8], tag: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let (inp, outp) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::write(&inp, input).unwrap();
    let out = Command::new(runner(threads))
        .args([mode.as_ref(), inp.as_os_str(), outp.as_os_str()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{tag}: emulated kernel failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(&outp).unwrap()
}

/// `sample_rows` over `rows` rows, launched as the CUDA sampler launches it: (token, log-prob)
/// per row, token `u32::MAX` for a refused row.
fn emulated(
    logits: &[f32],
    vocab: usize,
    params: &SamplingParams,
    keys: &[SampleKey],
) -> Vec<(u32, f32)> {
    emulated_with(THREADS, logits, vocab, params, keys)
}

/// [`emulated`] with the kernel built for blocks of `threads` threads.
fn emulated_with(
    threads: u32,

    logits: &[f32],
    vocab: usize,
    params: &SamplingParams,
    keys: &[SampleKey],
) -> Vec<(u32, f32)> {
    let args = KernelArgs::new(params, vocab).unwrap();
    assert_eq!(logits.len(), keys.len() * vocab);
    let mut input = Vec::with_capacity(32 + logits.len() * 4 + keys.len() * 24);
    input.extend(args.vocab.to_le_bytes());
    input.extend((keys.len() as u32).to_le_bytes());
    input.extend(args.temperature.to_le_bytes());
    input.extend(args.inv_t.to_le_bytes());
    input.extend(args.greedy.to_le_bytes());
    input.extend(args.top_k.to_le_bytes());
    input.extend(args.top_p.to_le_bytes());
    input.extend(threads.to_le_bytes());
    input.extend(logits.iter().flat_map(|x| x.to_le_bytes()));
    input.extend(flat_keys(keys).iter().flat_map(|x| x.to_le_bytes()));
    let out = run(threads, "sample", &input, &format!("{params:?}"));
    let rows = keys.len();
    assert_eq!(out.len(), rows * 8);
    let word = |i: usize| u32::from_le_bytes(out[4 * i..4 * i + 4].try_into().unwrap());
    (0..rows)
        .map(|r| (word(r), f32::from_bits(word(rows + r))))
        .collect()
}

/// Log-probs: the CPU sums `exp` in another order than the kernel's tree, in f64.
const LOGPROB_TOL: f64 = 1e-5;

/// Runs the kernel (blocks of `threads`) on the first `rows(case)` rows of every recorded case
/// and setting; returns how many draws it checked.
fn check_recorded(threads: u32, rows: impl Fn(&golden::Case) -> usize) -> usize {
    let records = golden::records();
    let (mut checked, mut worst) = (0usize, 0f64);
    for (c, case) in golden::CASES.iter().enumerate() {
        let rows = rows(case).min(case.rows);
        let logits = &case.logits()[..rows * case.vocab];
        let keys: Vec<SampleKey> = (0..rows).map(|r| case.key(r)).collect();
        for (name, params) in &golden::settings() {
            let got = emulated_with(threads, logits, case.vocab, params, &keys);
            for (r, &(token, logprob)) in got.iter().enumerate() {
                let want = records
                    .iter()
                    .find(|x| x.case == c && x.setting == *name && x.row == r)
                    .unwrap_or_else(|| panic!("no record for case {c} {name} row {r}"));
                assert_eq!(
                    token, want.token,
                    "{threads} threads, case {c} ({case:?}) {name} row {r}: kernel draws \
                     {token}, recorded {}",
                    want.token
                );
                let d = (f64::from(logprob) - want.logprob).abs();
                assert!(
                    d <= LOGPROB_TOL * want.logprob.abs().max(1.0),
                    "{threads} threads, case {c} {name} row {r}: log-prob {logprob} vs \
                     recorded {}",
                    want.logprob
                );
                worst = worst.max(d);
                checked += 1;
            }
        }
    }
    eprintln!(
        "emulated kernel, {threads} threads a block: {checked} recorded draws reproduced, \
         worst log-prob diff {worst:e}"
    );
    checked
}

/// Every recorded draw, with the kernel built for blocks of 64 threads (two warps): the same
/// code with more work per thread, and 30 times faster to emulate than 1024 threads.
#[test]
fn kernel_reproduces_every_recorded_draw_in_small_blocks() {
    let checked = check_recorded(64, |case| case.rows);
    assert_eq!(checked, golden::records().len());
}

/// Recorded draws at the block size the CUDA sampler launches (1024 threads): a few rows of
/// each case, all of them with `CASCADE_EMU_ALL=1`.
#[test]
fn kernel_reproduces_recorded_draws_at_the_launch_block_size() {
    let all = std::env::var("CASCADE_EMU_ALL").is_ok_and(|v| v == "1");
    let checked = check_recorded(THREADS, |case| match case.vocab {
        _ if all => case.rows,
        v if v > 10_000 => 2,
        _ => 4,
    });
    assert!(checked >= 8 * (2 * 2 + 4 * 4));
}

/// Compares the kernel with `sample_batch` on one batch of finite rows.
fn assert_same_as_cpu(
    logits: &[f32],
    vocab: usize,
    params: &SamplingParams,
    keys: &[SampleKey],
    tag: &str,
) {
    let cpu = sample_batch(logits, vocab, params, keys).unwrap();
    let dev = emulated(logits, vocab, params, keys);
    for (r, (a, &(token, logprob))) in cpu.iter().zip(&dev).enumerate() {
        assert_eq!(
            a.token, token,
            "{tag} {params:?} row {r}: CPU {} kernel {token}",
            a.token
        );
        let d = (f64::from(a.logprob) - f64::from(logprob)).abs();
        assert!(
            d <= LOGPROB_TOL * f64::from(a.logprob.abs()).max(1.0),
            "{tag} {params:?} row {r}: log-prob CPU {} kernel {logprob}",
            a.logprob
        );
    }
}

#[test]
fn kernel_matches_cpu_on_edge_settings() {
    let p = |temperature, top_k, top_p| SamplingParams {
        temperature,
        top_k,
        top_p,
    };
    let vocab = 2000;
    let rows = 6;
    let keys: Vec<SampleKey> = (0..rows as u64)
        .map(|r| SampleKey::for_sample(99, r / 2, 2, r % 2, 17 + r))
        .collect();
    let mut logits = gaussian_logits(rows * vocab, 2.0, 3);
    for r in 0..rows {
        logits[r * vocab + 3] = f32::NEG_INFINITY;
        logits[r * vocab + 5] = logits[r * vocab + 6];
        // -0.0 and +0.0 are the same logit (one order key).
        logits[r * vocab + 7] = -0.0;
        logits[r * vocab + 8] = 0.0;
    }
    // A row whose logits span more than exp's range (weights clamp at exp(-87)).
    for (i, x) in logits[..vocab].iter_mut().enumerate() {
        *x = if i % 2 == 0 { 60.0 } else { -60.0 } + (i % 13) as f32;
    }
    let settings = [
        p(1.0, Some(vocab - 1), None),
        p(1.0, Some(vocab), Some(0.999)),
        p(0.8, None, Some(1e-6)),
        p(1.0, Some(2), Some(0.3)),
        p(1e-30, None, Some(0.9)), // 1 / T overflows: greedy
        p(2.5, Some(7), None),
    ];
    for (i, params) in settings.iter().enumerate() {
        assert_same_as_cpu(&logits, vocab, params, &keys, &format!("setting {i}"));
    }
    // A vocabulary of one, and one of 4097 (not a multiple of the block or its tiles).
    let keys1: Vec<SampleKey> = keys[..2].to_vec();
    assert_same_as_cpu(&[1.5, -2.0], 1, &p(1.0, None, Some(0.5)), &keys1, "vocab 1");
    let odd = gaussian_logits(2 * 4097, 3.0, 4);
    assert_same_as_cpu(
        &odd,
        4097,
        &p(0.9, Some(100), Some(0.95)),
        &keys1,
        "vocab 4097",
    );
    // Rows tied everywhere: the draw is uniform over the kept ties.
    let flat = vec![0.25f32; 2 * 3000];
    assert_same_as_cpu(
        &flat,
        3000,
        &p(1.0, Some(10), Some(0.5)),
        &keys1,
        "all tied",
    );
}

#[test]
fn kernel_matches_cpu_at_full_vocabulary() {
    let vocab = 151_936;
    let keys: Vec<SampleKey> = (0..2u64)
        .map(|r| SampleKey::for_sample(7, 3, 8, r, 40))
        .collect();
    let logits = gaussian_logits(2 * vocab, 3.0, 11);
    let params = SamplingParams {
        temperature: 0.7,
        top_k: Some(50),
        top_p: Some(0.9),
    };
    assert_same_as_cpu(&logits, vocab, &params, &keys, "151936");
    assert_same_as_cpu(&logits, vocab, &SamplingParams::plain(), &keys, "151936");
}

#[test]
fn kernel_refuses_non_finite_rows_like_the_cpu() {
    let vocab = 100;
    let mut logits = vec![0.5f32; 4 * vocab];
    logits[vocab + 50] = f32::NAN;
    logits[2 * vocab + 99] = f32::INFINITY;
    logits[3 * vocab..].fill(f32::NEG_INFINITY);
    let keys: Vec<SampleKey> = (0..4u64)
        .map(|r| SampleKey {
            seed: 1,
            stream: r,
            position: 0,
        })
        .collect();
    for params in [SamplingParams::plain(), SamplingParams::greedy()] {
        let dev = emulated(&logits, vocab, &params, &keys);
        let ok = sample_cpu(&logits[..vocab], &params, &keys[0]).unwrap();
        assert_eq!(dev[0].0, ok.token);
        for r in 1..4 {
            assert_eq!(dev[r].0, u32::MAX, "{params:?} row {r}: not refused");
            assert!(dev[r].1.is_nan());
            let row = &logits[r * vocab..(r + 1) * vocab];
            assert!(matches!(
                sample_cpu(row, &params, &keys[r]),
                Err(SamplerError::NonFinite { .. })
            ));
        }
    }
}

#[test]
fn kernel_philox_matches_host() {
    let keys: Vec<SampleKey> = golden::philox_test_keys(3000);
    let mut input = (keys.len() as u32).to_le_bytes().to_vec();
    input.extend(philox_kat_input(&keys).iter().flat_map(|x| x.to_le_bytes()));
    let out = run(THREADS, "philox", &input, "philox");
    for (i, k) in keys.iter().enumerate() {
        let got = u32::from_le_bytes(out[4 * i..4 * i + 4].try_into().unwrap());
        assert_eq!(got, uniform_bits(k), "{k:?}");
    }
}
