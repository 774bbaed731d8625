//! Errors of the samplers.

/// What can go wrong when sampling.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    /// The temperature is negative or not finite (0 means greedy).
    #[error("temperature must be finite and >= 0, got {0}")]
    Temperature(f32),
    /// `top_k` was `Some(0)`.
    #[error("top_k must be at least 1")]
    TopK,
    /// `top_p` is outside `(0, 1]`.
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    /// The vocabulary is empty or larger than the integer weights can hold.
    #[error("vocabulary size {0} is outside 1..={max}", max = super::weights::MAX_VOCAB)]
    Vocab(usize),
    /// The logits buffer is not `rows * vocab` long, or the number of keys differs from the rows.
    #[error("logits of length {len} do not hold {rows} rows of vocabulary {vocab}")]
    Shape {
        /// Length of the logits buffer.
        len: usize,
        /// Rows expected (the number of sample keys).
        rows: usize,
        /// Vocabulary size.
        vocab: usize,
    },
    /// A row has a NaN or `+inf` logit, or no finite logit at all.
    #[error("row {row}: logits must be finite or -inf, with at least one finite value")]
    NonFinite {
        /// Row index in the batch.
        row: usize,
    },
    /// No CUDA driver (`libcuda.so`) could be loaded.
    #[error("no CUDA driver found (libcuda.so could not be loaded); use the CPU sampler")]
    NoDriver,
    /// NVRTC could not be loaded or failed to compile a kernel.
    #[error("NVRTC compile of {kernel} failed: {log}")]
    Compile {
        /// Kernel source name.
        kernel: &'static str,
        /// NVRTC's log or error.
        log: String,
    },
    /// A CUDA driver call failed.
    #[cfg(feature = "cuda-kernels")]
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
}

/// Result with [`SamplerError`].
pub type Result<T> = std::result::Result<T, SamplerError>;
