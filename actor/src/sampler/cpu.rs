//! The CPU reference sampler: one row of logits in, one token and its behaviour log-prob out.
//!
//! Per row, in passes over the logits (one row, 600 KB at vocabulary 151 936, stays in the
//! core's cache between passes):
//! 1. the max logit, checking for NaN / `+inf`;
//! 2. the weights `exp((logit - max) / T)` ([`exp_neg`]), their sum (the behaviour log-prob's
//!    normaliser), the integer mass per block of [`BLOCK`] tokens and, when truncating, the
//!    histogram of the logits' top radix digit;
//! 3. when truncating: one pass collecting, in index order, the tokens of the top digit bins
//!    that can hold the kept set (found from that histogram); top-k, then top-p over the top-k
//!    set, are radix-select thresholds ([`super::select`]) over that list, and the draw walks it;
//! 4. the inverse-CDF draw over the kept tokens in index order with the Philox uniform (without
//!    truncation: the block masses find the block, then one block is walked).
//!
//! Passes 1 and 2 run with AVX-512 or AVX2 where the CPU has them (runtime detection); no FMA,
//! so every weight is the same float as the scalar code's. Everything that decides the token is
//! integer arithmetic on [`super::weights`], so the CUDA kernel picks the same token for the
//! same key (`tests/sampler_golden.rs` locks the draws).

use rayon::prelude::*;

use super::error::{Result, SamplerError};
use super::params::{SampleKey, Sampled, SamplingParams};
use super::philox::uniform_bits;
use super::select::{threshold, By, Histogram, BINS};
use super::weights::{exp_neg, order_key, quantize, scale_uniform, top_p_target, MAX_VOCAB};
use super::Sampler;

/// Tokens per block of the weight pass (one integer mass per block for the draw).
const BLOCK: usize = 512;

/// Reusable per-thread buffers.
#[derive(Default)]
pub struct Scratch {
    /// One row's weights `exp((logit - max) / T)`.
    weights: Vec<f32>,
    /// Integer mass of each block of [`BLOCK`] weights.
    block_mass: Vec<u64>,
    /// The indices of the tokens that can be kept, in index order.
    top: Vec<u32>,
    /// Radix candidates of a threshold search.
    candidates: Vec<(u32, u64)>,
    /// The top digit's histogram of the weight pass.
    hist: Option<Box<TopHistogram>>,
}

/// The top digit's histogram, kept in four interleaved copies while it is filled: logits of a
/// row share few top digits, and one copy would make every add wait for the previous add to
/// the same bin.
struct TopHistogram {
    count: [[u64; BINS]; 4],
    mass: [[u64; BINS]; 4],
}

impl TopHistogram {
    fn new() -> Box<TopHistogram> {
        Box::new(TopHistogram {
            count: [[0; BINS]; 4],
            mass: [[0; BINS]; 4],
        })
    }

    fn clear(&mut self) {
        self.count = [[0; BINS]; 4];
        self.mass = [[0; BINS]; 4];
    }

    fn merged(&self) -> Histogram {
        let mut h = Histogram::default();
        for b in 0..BINS {
            h.count[b] = (0..4).map(|c| self.count[c][b]).sum();
            h.mass[b] = (0..4).map(|c| self.mass[c][b]).sum();
        }
        h
    }
}

/// Runs `$body` (an expression over the function's arguments) compiled for AVX-512, AVX2 or
/// the baseline, whichever the CPU has. The bodies use plain IEEE multiplies and adds (LLVM
/// never fuses them into FMA), so every variant computes the same floats.
macro_rules! simd_dispatch {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty $body:block) => {
        $(#[$doc])*
        fn $name($($arg: $ty),*) -> $ret {
            #[inline(always)]
            fn body($($arg: $ty),*) -> $ret $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2")]
                fn avx512($($arg: $ty),*) -> $ret { body($($arg),*) }
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) -> $ret { body($($arg),*) }
                if std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                {
                    // SAFETY: the CPU has every feature `avx512` is compiled for.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

simd_dispatch! {
    /// The max of a row and whether it holds a NaN or `+inf`.
    fn row_max(row: &[f32]) -> (f32, bool) {
        let mut lanes = [f32::NEG_INFINITY; 16];
        let mut bad = [false; 16];
        let mut chunks = row.chunks_exact(16);
        for c in &mut chunks {
            for j in 0..16 {
                bad[j] |= c[j].is_nan() | (c[j] == f32::INFINITY);
                lanes[j] = if c[j] > lanes[j] { c[j] } else { lanes[j] };
            }
        }
        let mut any_bad = bad.iter().any(|&b| b);
        for &x in chunks.remainder() {
            any_bad |= x.is_nan() | (x == f32::INFINITY);
            lanes[0] = if x > lanes[0] { x } else { lanes[0] };
        }
        (lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)), any_bad)
    }
}

simd_dispatch! {
    /// `sum exp((x - max) * inv_t)` over a row, in f64 (per-block f32 partial sums).
    fn exp_sum(row: &[f32], max_logit: f32, inv_t: f32) -> f64 {
        let mut sum = 0.0f64;
        for block in row.chunks(BLOCK) {
            let mut lanes = [0.0f32; 16];
            let mut chunks = block.chunks_exact(16);
            for c in &mut chunks {
                for j in 0..16 {
                    lanes[j] += exp_neg((c[j] - max_logit) * inv_t);
                }
            }
            for &x in chunks.remainder() {
                lanes[0] += exp_neg((x - max_logit) * inv_t);
            }
            sum += lanes.iter().map(|&p| f64::from(p)).sum::<f64>();
        }
        sum
    }
}

simd_dispatch! {
    /// The weight pass: `weights[i] = exp((row[i] - max) * inv_t)`, each block's integer mass
    /// into `block_mass`, the top digit's histogram into `top` when given; returns the sum of
    /// the weights in f64.
    fn weight_pass(
        row: &[f32],
        max_logit: f32,
        inv_t: f32,
        weights: &mut [f32],
        block_mass: &mut Vec<u64>,
        top: Option<&mut TopHistogram>
    ) -> f64 {
        let mut sum = 0.0f64;
        let mut top = top;
        for (wb, lb) in weights.chunks_mut(BLOCK).zip(row.chunks(BLOCK)) {
            let mut lanes = [0.0f32; 16];
            let mut wc = wb.chunks_exact_mut(16);
            let mut lc = lb.chunks_exact(16);
            for (w, l) in (&mut wc).zip(&mut lc) {
                for j in 0..16 {
                    let e = exp_neg((l[j] - max_logit) * inv_t);
                    w[j] = e;
                    lanes[j] += e;
                }
            }
            for (w, &l) in wc.into_remainder().iter_mut().zip(lc.remainder()) {
                *w = exp_neg((l - max_logit) * inv_t);
                lanes[0] += *w;
            }
            sum += lanes.iter().map(|&p| f64::from(p)).sum::<f64>();
            let mut q = [0u64; BLOCK];
            let q = &mut q[..wb.len()];
            for (q, &w) in q.iter_mut().zip(wb.iter()) {
                *q = quantize(w);
            }
            block_mass.push(q.iter().sum());
            if let Some(h) = top.as_deref_mut() {
                for (i, (&q, &l)) in q.iter().zip(lb).enumerate() {
                    let b = (order_key(l) >> 24) as usize;
                    h.count[i & 3][b] += 1;
                    h.mass[i & 3][b] += q;
                }
            }
        }
        sum
    }
}

/// The max logit of a row, refusing NaN, `+inf` and rows with no finite logit.
fn checked_max(row: &[f32], row_index: usize) -> Result<f32> {
    let (max_logit, bad) = row_max(row);
    if bad || max_logit == f32::NEG_INFINITY {
        return Err(SamplerError::NonFinite { row: row_index });
    }
    Ok(max_logit)
}

/// `log_softmax(logits / T)[token]` from the max and `sum exp((logit - max) / T)`, in f64.
fn behaviour_logprob(logit: f32, max_logit: f32, sum: f64, temperature: f32) -> f32 {
    (f64::from(logit - max_logit) / f64::from(temperature) - sum.ln()) as f32
}

/// Samples one token from one row of logits (length = vocabulary).
///
/// Temperature 0 is greedy: the first index of the largest logit, with the log-prob taken at
/// `T = 1`. Logits may be `-inf` (masked tokens, never drawn) but not NaN or `+inf`.
pub fn sample_cpu(logits: &[f32], params: &SamplingParams, key: &SampleKey) -> Result<Sampled> {
    params.validate()?;
    check_vocab(logits.len())?;
    sample_row(logits, params, key, &mut Scratch::default(), 0)
}

/// Samples one token per row of `logits` (`keys.len()` rows of `vocab`, row-major), in
/// parallel over rows on the rayon pool.
pub fn sample_batch(
    logits: &[f32],
    vocab: usize,
    params: &SamplingParams,
    keys: &[SampleKey],
) -> Result<Vec<Sampled>> {
    params.validate()?;
    check_vocab(vocab)?;
    if logits.len() != keys.len() * vocab {
        return Err(SamplerError::Shape {
            len: logits.len(),
            rows: keys.len(),
            vocab,
        });
    }
    thread_local! {
        // One per pool thread, kept between calls: a fresh one per row would page-fault in
        // its 1.2 MB of buffers every time (rayon's `map_init` makes one per work split).
        static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
    }
    logits
        .par_chunks(vocab)
        .zip(keys.par_iter())
        .enumerate()
        .map(|(i, (row, key))| {
            SCRATCH.with(|s| sample_row(row, params, key, &mut s.borrow_mut(), i))
        })
        .collect()
}

fn check_vocab(vocab: usize) -> Result<()> {
    if vocab == 0 || vocab > MAX_VOCAB {
        return Err(SamplerError::Vocab(vocab));
    }
    Ok(())
}

/// One row; `params` already validated and `row` non-empty.
pub fn sample_row(
    row: &[f32],
    params: &SamplingParams,
    key: &SampleKey,
    scratch: &mut Scratch,
    row_index: usize,
) -> Result<Sampled> {
    let max_logit = checked_max(row, row_index)?;
    let inv_t = 1.0 / params.temperature;
    if params.is_greedy() || !inv_t.is_finite() {
        let sum = exp_sum(row, max_logit, 1.0);
        let token = row
            .iter()
            .position(|&x| x == max_logit)
            .expect("max is in the row");
        return Ok(Sampled {
            token: token as u32,
            logprob: -(sum.ln() as f32),
        });
    }
    let top_k = params.effective_top_k(row.len());
    let top_p = params.effective_top_p();
    let truncate = top_k.is_some() || top_p.is_some();

    let Scratch {
        weights,
        block_mass,
        top,
        candidates,
        hist: hist_buf,
    } = scratch;
    weights.clear();
    weights.resize(row.len(), 0.0);
    block_mass.clear();
    let hist = truncate.then(|| {
        let h = hist_buf.get_or_insert_with(TopHistogram::new);
        h.clear();
        &mut **h
    });
    let sum = weight_pass(row, max_logit, inv_t, weights, block_mass, hist);
    let total: u64 = block_mass.iter().sum();
    let logprob = |token: usize| behaviour_logprob(row[token], max_logit, sum, params.temperature);

    if !truncate {
        // Inverse-CDF draw: find the block by its mass, then walk it.
        let target = scale_uniform(uniform_bits(key), total);
        let mut acc = 0u64;
        for (b, &m) in block_mass.iter().enumerate() {
            if acc + m > target {
                for (i, &w) in weights[b * BLOCK..].iter().enumerate() {
                    acc += quantize(w);
                    if acc > target {
                        let token = b * BLOCK + i;
                        return Ok(Sampled {
                            token: token as u32,
                            logprob: logprob(token),
                        });
                    }
                }
            }
            acc += m;
        }
        unreachable!("target < total mass, and the total is the sum of the block masses");
    }

    // The lowest top digit that can hold the kept set: top-k's bin (top-p then keeps a subset
    // of the top-k set), else top-p's.
    let hist = hist_buf.as_ref().expect("truncating").merged();
    let target_p = |mass: u64| top_p.map(|p| top_p_target(p, mass));
    let lowest_bin = match (top_k, target_p(total)) {
        (Some(k), _) => pick_top_bin(&hist, By::Count, k as u64),
        (None, Some(t)) => pick_top_bin(&hist, By::Mass, t),
        (None, None) => unreachable!("truncating"),
    };
    // Every token whose top digit is at or above that bin, in index order (branch-free: the
    // kept tokens are scattered over the row, a branch per token would mispredict).
    top.clear();
    top.resize(row.len(), 0);
    let lowest_key = lowest_bin << 24;
    let mut n = 0;
    for (i, &l) in row.iter().enumerate() {
        top[n] = i as u32;
        n += usize::from(order_key(l) >= lowest_key);
    }
    top.truncate(n);
    let listed = || {
        top.iter()
            .map(|&i| (order_key(row[i as usize]), quantize(weights[i as usize])))
    };

    // Thresholds: top-k first, then top-p within the top-k set.
    let mut floor = 0u32;
    let mut kept_mass = total;
    let mut top_hist = hist;
    if let Some(k) = top_k {
        let t = threshold(
            &top_hist,
            By::Count,
            k as u64,
            0,
            listed(),
            |q| q,
            candidates,
        );
        floor = t.key;
        kept_mass = t.mass;
        if top_p.is_some() {
            top_hist = Histogram::default();
            for (key, q) in listed().filter(|&(key, _)| key >= floor) {
                top_hist.add(key >> 24, q);
            }
        }
    }
    if let Some(target) = target_p(kept_mass) {
        let t = threshold(
            &top_hist,
            By::Mass,
            target,
            floor,
            listed(),
            |q| q,
            candidates,
        );
        floor = t.key;
        kept_mass = t.mass;
    }

    // Inverse-CDF draw over the kept tokens in index order.
    let target = scale_uniform(uniform_bits(key), kept_mass);
    let mut acc = 0u64;
    for (&i, (k, q)) in top.iter().zip(listed()) {
        if k >= floor {
            acc += q;
            if acc > target {
                return Ok(Sampled {
                    token: i,
                    logprob: logprob(i as usize),
                });
            }
        }
    }
    unreachable!("target < kept mass, and the kept tokens are all listed")
}

/// The highest top-digit bin at which the running total from the top reaches `target` (bin 0
/// if the whole row falls short).
fn pick_top_bin(h: &Histogram, by: By, target: u64) -> u32 {
    let mut acc = 0u64;
    for b in (0..BINS).rev() {
        acc += match by {
            By::Count => h.count[b],
            By::Mass => h.mass[b],
        };
        if acc >= target {
            return b as u32;
        }
    }
    0
}

/// The CPU sampler as a [`Sampler`]: logits in host memory, rows in parallel.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuSampler;

impl Sampler for CpuSampler {
    type Logits = [f32];

    fn sample(
        &self,
        logits: &[f32],
        vocab: usize,
        params: &SamplingParams,
        keys: &[SampleKey],
    ) -> Result<Vec<Sampled>> {
        sample_batch(logits, vocab, params, keys)
    }
}
