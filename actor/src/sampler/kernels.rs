//! CUDA C sources of the sampler kernels, compiled at run time with NVRTC (feature
//! `cuda-kernels`), and the NVRTC options they need.

/// `sampler.cu`: `sample_rows` (one block per row) and `philox_kat` (device Philox check).
pub const SAMPLER_CU: &str = include_str!("kernels/sampler.cu");

/// Every kernel source, by file name (the PTX test compiles each of them).
pub const SOURCES: &[(&str, &str)] = &[("sampler.cu", SAMPLER_CU)];

/// NVRTC options. `--fmad=false` keeps `a * b + c` as two rounded operations, as in Rust, so
/// the kernel's weights equal the CPU's bit for bit.
pub const NVRTC_OPTIONS: &[&str] = &["--fmad=false", "--std=c++17"];

/// Threads per block of `sample_rows` (must match `THREADS` in `sampler.cu`).
pub const THREADS: u32 = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_size_matches_the_kernel() {
        assert!(SAMPLER_CU.contains(&format!("#define THREADS {THREADS}\n")));
    }
}
