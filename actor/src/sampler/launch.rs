//! The host side of a `sample_rows` launch (`kernels/sampler.cu`), kept free of CUDA so that
//! the kernel's emulation on the CPU (`tests/sampler_kernel_emulated.rs`) is given exactly the
//! arguments the CUDA sampler passes.

use super::error::{Result, SamplerError};
use super::params::{SampleKey, SamplingParams};
use super::weights::MAX_VOCAB;

/// The scalar arguments of `sample_rows`, in its parameter order after the logits pointer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelArgs {
    /// Logits per row.
    pub vocab: u32,
    /// Temperature of the reported log-prob (1 for greedy).
    pub temperature: f32,
    /// `1 / temperature` (1 for greedy).
    pub inv_t: f32,
    /// 1: argmax.
    pub greedy: i32,
    /// 0: no top-k (also when `k >= vocab`).
    pub top_k: u32,
    /// `>= 1`: no top-p.
    pub top_p: f32,
}

impl KernelArgs {
    /// Checks `params` and `vocab` and derives the kernel's arguments. A temperature so small
    /// that `1 / T` overflows samples greedily (as the CPU sampler does).
    pub fn new(params: &SamplingParams, vocab: usize) -> Result<Self> {
        params.validate()?;
        if vocab == 0 || vocab > MAX_VOCAB {
            return Err(SamplerError::Vocab(vocab));
        }
        let inv_t = 1.0 / params.temperature;
        let greedy = params.is_greedy() || !inv_t.is_finite();
        let (temperature, inv_t) = if greedy {
            (1.0f32, 1.0f32)
        } else {
            (params.temperature, inv_t)
        };
        Ok(Self {
            vocab: vocab as u32,
            temperature,
            inv_t,
            greedy: i32::from(greedy),
            top_k: params.effective_top_k(vocab).unwrap_or(0) as u32,
            top_p: params.effective_top_p().unwrap_or(1.0),
        })
    }
}

/// The keys as the kernel reads them: 3 × u64 per row (seed, stream, position).
pub fn flat_keys(keys: &[SampleKey]) -> Vec<u64> {
    keys.iter()
        .flat_map(|k| [k.seed, k.stream, k.position])
        .collect()
}

/// The input of the `philox_kat` kernel: 6 × u32 per key (counter words 0–3, key words 0–1).
pub fn philox_kat_input(keys: &[SampleKey]) -> Vec<u32> {
    keys.iter()
        .flat_map(|k| {
            let (c, key) = super::philox::counter_and_key(k);
            [c[0], c[1], c[2], c[3], key[0], key[1]]
        })
        .collect()
}
