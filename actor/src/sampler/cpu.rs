//! The CPU reference sampler: one row of logits in, one token and its behaviour log-prob out.
//!
//! Per row, in passes over the logits (which stay in cache for a row at a time):
//! 1. online max + log-sum-exp of `logits / T` (block-wise: a block's max rescales the running
//!    sum once), giving the behaviour log-prob's normaliser in the same pass as the max;
//! 2. the weights `exp((logit - max) / T)` and, when truncating, the top digit's histogram;
//! 3. top-k, then top-p over the top-k set, as radix-select thresholds ([`super::select`]);
//! 4. the inverse-CDF draw over the kept tokens in index order with the Philox uniform.
//!
//! Everything that decides the token is integer arithmetic on [`super::weights`], so the CUDA
//! kernel picks the same token for the same key.

use rayon::prelude::*;

use super::error::{Result, SamplerError};
use super::params::{SampleKey, Sampled, SamplingParams};
use super::philox::uniform_bits;
use super::select::{threshold, By, Histogram};
use super::weights::{exp_neg, order_key, quantize, scale_uniform, top_p_target, MAX_VOCAB};
use super::Sampler;

/// Logits per block of the online max / log-sum-exp pass.
const BLOCK: usize = 512;

/// Reusable per-thread buffers (one row's weights and the radix candidates).
#[derive(Default)]
pub struct Scratch {
    weights: Vec<f32>,
    candidates: Vec<(u32, u64)>,
}

/// Max logit and `sum exp((logit - max) * inv_t)` of a row, in one pass.
struct Normaliser {
    max_logit: f32,
    sum: f64,
}

fn normaliser(row: &[f32], inv_t: f32, row_index: usize) -> Result<Normaliser> {
    let mut max_logit = f32::NEG_INFINITY;
    let mut sum = 0.0f64;
    let mut bad = false;
    for block in row.chunks(BLOCK) {
        // Lane-wise max and validity check; written so that it vectorises.
        let mut lanes = [f32::NEG_INFINITY; 8];
        let mut chunks = block.chunks_exact(8);
        for c in &mut chunks {
            for j in 0..8 {
                bad |= c[j].is_nan() | (c[j] == f32::INFINITY);
                lanes[j] = if c[j] > lanes[j] { c[j] } else { lanes[j] };
            }
        }
        for &x in chunks.remainder() {
            bad |= x.is_nan() | (x == f32::INFINITY);
            lanes[0] = if x > lanes[0] { x } else { lanes[0] };
        }
        let block_max = lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        if bad {
            return Err(SamplerError::NonFinite { row: row_index });
        }
        if block_max == f32::NEG_INFINITY {
            continue;
        }
        if block_max > max_logit {
            sum *= (f64::from(max_logit - block_max) * f64::from(inv_t)).exp();
            max_logit = block_max;
        }
        let mut partial = [0.0f32; 8];
        let mut chunks = block.chunks_exact(8);
        for c in &mut chunks {
            let e: [f32; 8] = std::array::from_fn(|j| exp_neg((c[j] - max_logit) * inv_t));
            for j in 0..8 {
                partial[j] += e[j];
            }
        }
        for &x in chunks.remainder() {
            partial[0] += exp_neg((x - max_logit) * inv_t);
        }
        sum += partial.iter().map(|&p| f64::from(p)).sum::<f64>();
    }
    if max_logit == f32::NEG_INFINITY {
        return Err(SamplerError::NonFinite { row: row_index });
    }
    Ok(Normaliser { max_logit, sum })
}

/// `log_softmax(logits / T)[token]` from the row's normaliser, in f64.
fn behaviour_logprob(logit: f32, norm: &Normaliser, temperature: f32) -> f32 {
    (f64::from(logit - norm.max_logit) / f64::from(temperature) - norm.sum.ln()) as f32
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
    logits
        .par_chunks(vocab)
        .zip(keys.par_iter())
        .enumerate()
        .map_init(Scratch::default, |scratch, (i, (row, key))| {
            sample_row(row, params, key, scratch, i)
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
    let inv_t = 1.0 / params.temperature;
    if params.is_greedy() || !inv_t.is_finite() {
        let norm = normaliser(row, 1.0, row_index)?;
        let token = row
            .iter()
            .position(|&x| x == norm.max_logit)
            .expect("max is in the row");
        return Ok(Sampled {
            token: token as u32,
            logprob: -(norm.sum.ln() as f32),
        });
    }
    let norm = normaliser(row, inv_t, row_index)?;
    let top_k = params.effective_top_k(row.len());
    let top_p = params.effective_top_p();
    let truncate = top_k.is_some() || top_p.is_some();

    // Pass 2: weights, total integer mass, and the top digit's histogram.
    let weights = &mut scratch.weights;
    weights.clear();
    weights.resize(row.len(), 0.0);
    let mut top = Histogram::default();
    let mut total = 0u64;
    for (w_block, l_block) in weights.chunks_mut(BLOCK).zip(row.chunks(BLOCK)) {
        for (w, &l) in w_block.iter_mut().zip(l_block) {
            *w = exp_neg((l - norm.max_logit) * inv_t);
        }
        if truncate {
            for (&w, &l) in w_block.iter().zip(l_block) {
                let q = quantize(w);
                top.add(order_key(l) >> 24, q);
                total += q;
            }
        } else {
            total += w_block.iter().map(|&w| quantize(w)).sum::<u64>();
        }
    }
    let tokens = || {
        row.iter()
            .zip(weights.iter())
            .map(|(&l, &w)| (order_key(l), w))
    };

    // Thresholds: top-k first, then top-p within the top-k set.
    let mut floor = 0u32;
    let mut kept_mass = total;
    if let Some(k) = top_k {
        let t = threshold(
            &top,
            By::Count,
            k as u64,
            0,
            tokens(),
            quantize,
            &mut scratch.candidates,
        );
        floor = t.key;
        kept_mass = t.mass;
        if top_p.is_some() {
            top = Histogram::default();
            for (key, w) in tokens().filter(|&(key, _)| key >= floor) {
                top.add(key >> 24, quantize(w));
            }
        }
    }
    if let Some(p) = top_p {
        let target = top_p_target(p, kept_mass);
        let t = threshold(
            &top,
            By::Mass,
            target,
            floor,
            tokens(),
            quantize,
            &mut scratch.candidates,
        );
        floor = t.key;
        kept_mass = t.mass;
    }

    // Inverse-CDF draw over the kept tokens in index order.
    let target = scale_uniform(uniform_bits(key), kept_mass);
    let mut acc = 0u64;
    let mut token = None;
    for (i, (k, w)) in tokens().enumerate() {
        if k >= floor {
            acc += quantize(w);
            if acc > target {
                token = Some(i);
                break;
            }
        }
    }
    let token = token.expect("target < kept mass, and the kept mass is all in the row");
    Ok(Sampled {
        token: token as u32,
        logprob: behaviour_logprob(row[token], &norm, params.temperature),
    })
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
