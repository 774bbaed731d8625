//! Token samplers: the CPU reference and the CUDA kernels (feature `cuda-kernels`).
//!
//! Both take raw logits, a [`SamplingParams`] and one [`SampleKey`] per row, and return the
//! token and its behaviour log-prob ([`Sampled`]). A draw depends only on its key (Philox
//! counter = position and sample stream, key = seed), and is decided in integer arithmetic
//! shared by both implementations ([`weights`]), so the GPU reproduces the CPU's tokens.

pub mod cpu;
#[cfg(feature = "cuda-kernels")]
pub mod cuda;
pub mod error;
pub mod kernels;
pub mod launch;
pub mod params;
pub mod philox;
pub mod select;
pub mod weights;

pub use cpu::{sample_batch, sample_cpu, CpuSampler};
pub use error::{Result, SamplerError};
pub use params::{SampleKey, Sampled, SamplingParams};

/// A batched sampler: one token per row of logits.
pub trait Sampler {
    /// Where the logits live (`[f32]` on the host, a device buffer on the GPU).
    type Logits: ?Sized;

    /// Samples one token per key from `keys.len()` row-major rows of `vocab` logits.
    fn sample(
        &self,
        logits: &Self::Logits,
        vocab: usize,
        params: &SamplingParams,
        keys: &[SampleKey],
    ) -> Result<Vec<Sampled>>;
}
