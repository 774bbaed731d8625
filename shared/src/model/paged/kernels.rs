//! The CUDA C source of the paged decode attention (`kernels/paged_attn.cu`), compiled at run
//! time with NVRTC by [`super::cuda`] (feature `cuda-kernels`), and what a launcher needs to
//! know about it: entry-point names, block size, grid. Plain data, built everywhere, so that
//! the PTX and emulation tests read the same constants as the launcher.

/// `paged_attn.cu`: `paged_decode_{f32,bf16}_d{64,128}`.
pub const PAGED_ATTN_CU: &str = include_str!("kernels/paged_attn.cu");

/// NVRTC options (those of the fused attention). `--fmad=false` keeps `a * b + c` as two
/// rounded operations, as in the emulation (compiled with `-ffp-contract=off`); the kernel's
/// dot products and `P V` use explicit `fmaf`, fused in both.
pub const NVRTC_OPTIONS: &[&str] = &["--fmad=false", "--std=c++17"];

/// Threads per block (the `THREADS` default of `paged_attn.cu`).
pub const THREADS: u32 = 128;

/// The largest head dimension the kernel supports.
pub const MAX_HEAD_DIM: usize = 128;

/// Query heads of one kv head's group that one CUDA block serves (`PA_QUERIES`); a larger
/// group is split over several blocks, each reading the group's keys and values.
pub const QUERIES_PER_BLOCK: usize = 4;

/// Element type of the kernel's inputs and output (arithmetic is f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelDtype {
    /// `float`.
    F32,
    /// bf16 as raw 16-bit words.
    Bf16,
}

/// The entry point for `dtype` and head dimension `head_dim` (the `_d64` kernels serve
/// `d <= 64`, the `_d128` ones `64 < d <= 128`), or `None` when `head_dim` is 0 or above
/// [`MAX_HEAD_DIM`].
pub fn entry(dtype: KernelDtype, head_dim: usize) -> Option<&'static str> {
    let small = match head_dim {
        1..=64 => true,
        65..=MAX_HEAD_DIM => false,
        _ => return None,
    };
    Some(match (dtype, small) {
        (KernelDtype::F32, true) => "paged_decode_f32_d64",
        (KernelDtype::F32, false) => "paged_decode_f32_d128",
        (KernelDtype::Bf16, true) => "paged_decode_bf16_d64",
        (KernelDtype::Bf16, false) => "paged_decode_bf16_d128",
    })
}

/// Every entry point of `paged_attn.cu`.
pub fn entry_points() -> Vec<&'static str> {
    let mut names = Vec::new();
    for dtype in [KernelDtype::F32, KernelDtype::Bf16] {
        for d in [64, 128] {
            names.push(entry(dtype, d).expect("64 and 128 are supported"));
        }
    }
    names
}

/// Blocks per (row, kv head): the group's `heads / kv_heads` query heads in chunks of
/// [`QUERIES_PER_BLOCK`] (the kernel's `q_chunks` argument).
pub fn query_chunks(heads: usize, kv_heads: usize) -> usize {
    (heads / kv_heads.max(1)).div_ceil(QUERIES_PER_BLOCK)
}

/// Blocks of the 1-D grid for `rows` decode rows: one per (row, kv head, query chunk).
pub fn grid(rows: usize, heads: usize, kv_heads: usize) -> usize {
    rows * kv_heads * query_chunks(heads, kv_heads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_match_the_kernel_source() {
        let src = PAGED_ATTN_CU;
        assert!(src.contains(&format!("#define THREADS {THREADS}\n")));
        assert!(src.contains(&format!("#define PA_MAX_HEAD_DIM {MAX_HEAD_DIM}\n")));
        assert!(src.contains(&format!("#define PA_QUERIES {QUERIES_PER_BLOCK}\n")));
        assert!(src.contains(&format!(
            "#define PA_BLOCK_TOKENS {}\n",
            super::super::BLOCK_TOKENS
        )));
        for name in entry_points() {
            let (_, rest) = name.split_once("paged_decode_").unwrap();
            let (dtype, dmax) = rest.split_once("_d").unwrap();
            let ty = if dtype == "f32" { "float" } else { "bf16_bits" };
            assert!(
                src.contains(&format!("PA_ENTRY({ty}, {dtype}, {dmax})")),
                "{name} is not instantiated"
            );
        }
    }

    #[test]
    fn head_dims_pick_an_entry() {
        assert_eq!(entry(KernelDtype::F32, 0), None);
        assert_eq!(entry(KernelDtype::F32, 1), Some("paged_decode_f32_d64"));
        assert_eq!(entry(KernelDtype::Bf16, 64), Some("paged_decode_bf16_d64"));
        assert_eq!(entry(KernelDtype::Bf16, 65), Some("paged_decode_bf16_d128"));
        assert_eq!(entry(KernelDtype::F32, 128), Some("paged_decode_f32_d128"));
        assert_eq!(entry(KernelDtype::Bf16, 129), None);
        assert_eq!(entry_points().len(), 4);
    }

    #[test]
    fn grid_covers_every_query_head() {
        assert_eq!(query_chunks(32, 8), 1);
        assert_eq!(query_chunks(16, 16), 1);
        assert_eq!(query_chunks(40, 8), 2);
        assert_eq!(query_chunks(64, 8), 2);
        assert_eq!(query_chunks(12, 1), 3);
        assert_eq!(grid(64, 32, 8), 64 * 8);
        assert_eq!(grid(3, 12, 1), 9);
        assert_eq!(grid(0, 4, 4), 0);
    }
}
