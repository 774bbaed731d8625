//! The CUDA C source of the fused-attention kernels (`kernels/flash_attn.cu`, and
//! `kernels/flash_attn_mma.cu` on tensor cores), compiled at run time with NVRTC by
//! [`super::cuda`] (feature `cuda-kernels`), and what a launcher needs to know about them:
//! entry-point names, block size, tile sizes. Plain data, built everywhere, so that the PTX and
//! emulation tests read the same constants as the launcher.

/// `flash_attn.cu`: `fa_fwd_*`, `fa_dq_*` and `fa_dkdv_*` for f32/bf16 and head dims 64/128,
/// with FMA loops (any GPU).
pub const FLASH_ATTN_CU: &str = include_str!("kernels/flash_attn.cu");

/// `flash_attn_mma.cu`: `fam_fwd_*`, `fam_dq_*` and `fam_dkdv_*` for bf16 and head dims
/// 64/128, on tensor cores (`mma.sync`, compute capability 8.0 or newer). It uses helpers of
/// [`FLASH_ATTN_CU`] and is compiled after it, as one source ([`mma_source`]).
pub const FLASH_ATTN_MMA_CU: &str = include_str!("kernels/flash_attn_mma.cu");

/// NVRTC options. `--fmad=false` keeps `a * b + c` as two rounded operations, as on the CPU
/// (and in the emulation, compiled with `-ffp-contract=off`).
pub const NVRTC_OPTIONS: &[&str] = &["--fmad=false", "--std=c++17"];

/// NVRTC options of the tensor-core source, for the virtual architecture that has `mma.sync`
/// with bf16 (the driver compiles the PTX for the device's own, newer or equal, architecture
/// when it loads the module). With fused multiply-adds: these kernels round P and dS to bf16
/// for the tensor cores, so they cannot match the CPU bit for bit anyway, and the softmax
/// arithmetic between the products takes half the instructions.
pub const MMA_NVRTC_OPTIONS: &[&str] = &["--std=c++17", "--gpu-architecture=compute_80"];

/// The smallest compute capability (major) of the tensor-core kernels.
pub const MMA_MIN_MAJOR: i32 = 8;

/// The source NVRTC compiles for the tensor-core kernels: [`FLASH_ATTN_CU`], then
/// [`FLASH_ATTN_MMA_CU`].
pub fn mma_source() -> String {
    format!("{FLASH_ATTN_CU}\n{FLASH_ATTN_MMA_CU}")
}

/// Threads per block of every kernel (the `THREADS` default of `flash_attn.cu`, and
/// `FAM_THREADS` of `flash_attn_mma.cu`).
pub const THREADS: u32 = 128;

/// The largest head dimension the kernels support.
pub const MAX_HEAD_DIM: usize = 128;

/// Which kernel of a forward/backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// `fa_fwd_*`: `O` and the log-sum-exp `L`, one block per (row, head, [`Tiles::fwd_m`]
    /// queries).
    Forward,
    /// `fa_dq_*`: `D = rowsum(dO ∘ O)` and `dQ`, one block per (row, head, [`Tiles::bwd_m`]
    /// queries).
    Dq,
    /// `fa_dkdv_*`: `dK` and `dV`, one block per (row, kv head, [`Tiles::bwd_n`] keys); runs
    /// after [`Kernel::Dq`] (reads `D`).
    DkDv,
}

/// Element type of the kernel inputs and outputs (arithmetic is f32 in both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelDtype {
    /// `float`.
    F32,
    /// bf16 as raw 16-bit words, rounded to nearest even like `half::bf16::from_f32`.
    Bf16,
}

/// Tile sizes of one kernel variant (must match `struct Tiles` in `flash_attn.cu`, or
/// `struct MmaTiles` in `flash_attn_mma.cu` for the tensor-core kernels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiles {
    /// Whether these are the tensor-core kernels (`fam_*`, bf16 only).
    pub tensor_cores: bool,
    /// Head-dimension bound of the variant (64 or 128); `d <= dmax`.
    pub dmax: usize,
    /// Queries per forward block.
    pub fwd_m: usize,
    /// Keys per forward tile.
    pub fwd_n: usize,
    /// Queries per `dQ` block.
    pub bwd_m: usize,
    /// Keys per `dK/dV` block.
    pub bwd_n: usize,
    /// Keys per tile of the `dQ` kernel's key loop.
    pub dq_n: usize,
    /// Queries per tile of the `dK/dV` kernel's query loop.
    pub dkdv_m: usize,
}

impl Tiles {
    /// The variant for head dimension `d`, or `None` when `d` is 0 or above
    /// [`MAX_HEAD_DIM`].
    pub fn for_head_dim(d: usize) -> Option<Tiles> {
        let (dmax, fwd_m, fwd_n, bwd) = match d {
            1..=64 => (64, 64, 32, 32),
            65..=MAX_HEAD_DIM => (128, 32, 16, 16),
            _ => return None,
        };
        Some(Tiles {
            tensor_cores: false,
            dmax,
            fwd_m,
            fwd_n,
            bwd_m: bwd,
            bwd_n: bwd,
            dq_n: bwd,
            dkdv_m: bwd,
        })
    }

    /// The tensor-core variant (bf16) for head dimension `d`, or `None` when `d` is 0 or above
    /// [`MAX_HEAD_DIM`]: blocks of 64 rows, 16 per warp.
    pub fn tensor_cores_for_head_dim(d: usize) -> Option<Tiles> {
        let (dmax, fwd_n, dq_n, dkdv_m) = match d {
            1..=64 => (64, 64, 32, 32),
            65..=MAX_HEAD_DIM => (128, 32, 16, 16),
            _ => return None,
        };
        Some(Tiles {
            tensor_cores: true,
            dmax,
            fwd_m: 64,
            fwd_n,
            bwd_m: 64,
            bwd_n: 64,
            dq_n,
            dkdv_m,
        })
    }

    /// Blocks of the 1-D grid of `kernel` for `b` rows, `heads`/`kv_heads` heads and `t`
    /// tokens.
    pub fn grid(&self, kernel: Kernel, b: usize, heads: usize, kv_heads: usize, t: usize) -> usize {
        match kernel {
            Kernel::Forward => b * heads * t.div_ceil(self.fwd_m),
            Kernel::Dq => b * heads * t.div_ceil(self.bwd_m),
            Kernel::DkDv => b * kv_heads * t.div_ceil(self.bwd_n),
        }
    }

    /// Tiles per (row, head) of `kernel` (its last scalar argument).
    pub fn blocks_per_head(&self, kernel: Kernel, t: usize) -> usize {
        match kernel {
            Kernel::Forward => t.div_ceil(self.fwd_m),
            Kernel::Dq => t.div_ceil(self.bwd_m),
            Kernel::DkDv => t.div_ceil(self.bwd_n),
        }
    }

    /// The entry point's name, e.g. `fa_fwd_bf16_d128` (`fam_fwd_bf16_d128` on tensor cores,
    /// which take bf16 only).
    pub fn entry(&self, kernel: Kernel, dtype: KernelDtype) -> String {
        let k = match kernel {
            Kernel::Forward => "fwd",
            Kernel::Dq => "dq",
            Kernel::DkDv => "dkdv",
        };
        let t = match dtype {
            KernelDtype::F32 => "f32",
            KernelDtype::Bf16 => "bf16",
        };
        let prefix = if self.tensor_cores { "fam" } else { "fa" };
        format!("{prefix}_{k}_{t}_d{}", self.dmax)
    }
}

/// Every entry point of `flash_attn.cu`.
pub fn entry_points() -> Vec<String> {
    let mut names = Vec::new();
    for d in [64, 128] {
        let tiles = Tiles::for_head_dim(d).expect("64 and 128 are supported");
        for dtype in [KernelDtype::F32, KernelDtype::Bf16] {
            for kernel in [Kernel::Forward, Kernel::Dq, Kernel::DkDv] {
                names.push(tiles.entry(kernel, dtype));
            }
        }
    }
    names
}

/// Every entry point of `flash_attn_mma.cu`.
pub fn mma_entry_points() -> Vec<String> {
    let mut names = Vec::new();
    for d in [64, 128] {
        let tiles = Tiles::tensor_cores_for_head_dim(d).expect("64 and 128 are supported");
        for kernel in [Kernel::Forward, Kernel::Dq, Kernel::DkDv] {
            names.push(tiles.entry(kernel, KernelDtype::Bf16));
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_match_the_kernel_source() {
        assert!(FLASH_ATTN_CU.contains(&format!("#define THREADS {THREADS}\n")));
        for d in [64, 128] {
            let t = Tiles::for_head_dim(d).unwrap();
            let line = format!(
                "struct Tiles<{}> {{\n    static constexpr int FWD_M = {}, FWD_N = {}, BWD_M = {}, \
                 BWD_N = {};",
                t.dmax, t.fwd_m, t.fwd_n, t.bwd_m, t.bwd_n
            );
            assert!(FLASH_ATTN_CU.contains(&line), "missing {line:?}");
        }
        assert!(FLASH_ATTN_MMA_CU.contains(&format!("#define FAM_WARPS {}\n", THREADS / 32)));
        for d in [64, 128] {
            let t = Tiles::tensor_cores_for_head_dim(d).unwrap();
            let line = format!(
                "struct MmaTiles<{}> {{\n    static constexpr int FWD_M = {}, FWD_N = {}, DQ_M = {}, \
                 DQ_N = {}, DKDV_N = {}, DKDV_M = {};",
                t.dmax, t.fwd_m, t.fwd_n, t.bwd_m, t.dq_n, t.bwd_n, t.dkdv_m
            );
            assert!(FLASH_ATTN_MMA_CU.contains(&line), "missing {line:?}");
        }
        for d in ["64", "128"] {
            assert!(FLASH_ATTN_MMA_CU.contains(&format!("FAM_ENTRIES({d})")));
        }
        for name in entry_points() {
            let (_, rest) = name.split_once("fa_").unwrap();
            let (_kernel, rest) = rest.split_once('_').unwrap();
            let (dtype, dmax) = rest.split_once("_d").unwrap();
            let ty = if dtype == "f32" { "float" } else { "bf16_bits" };
            assert!(
                FLASH_ATTN_CU.contains(&format!("FA_ENTRIES({ty}, {dtype}, {dmax})")),
                "{name} is not instantiated"
            );
        }
    }

    #[test]
    fn head_dims_pick_a_variant() {
        assert_eq!(Tiles::for_head_dim(0), None);
        assert_eq!(Tiles::for_head_dim(1).unwrap().dmax, 64);
        assert_eq!(Tiles::for_head_dim(64).unwrap().dmax, 64);
        assert_eq!(Tiles::for_head_dim(65).unwrap().dmax, 128);
        assert_eq!(Tiles::for_head_dim(128).unwrap().dmax, 128);
        assert_eq!(Tiles::for_head_dim(129), None);
        let t = Tiles::for_head_dim(128).unwrap();
        assert_eq!(
            t.entry(Kernel::DkDv, KernelDtype::Bf16),
            "fa_dkdv_bf16_d128"
        );
        assert_eq!(t.grid(Kernel::Forward, 2, 4, 2, 65), 2 * 4 * 3);
        assert_eq!(t.grid(Kernel::DkDv, 2, 4, 2, 65), 2 * 2 * 5);
        let m = Tiles::tensor_cores_for_head_dim(100).unwrap();
        assert_eq!(m.dmax, 128);
        assert_eq!(m.entry(Kernel::Dq, KernelDtype::Bf16), "fam_dq_bf16_d128");
        assert_eq!(m.grid(Kernel::Forward, 2, 4, 2, 65), 2 * 4 * 2);
        assert_eq!(m.grid(Kernel::DkDv, 2, 4, 2, 65), 2 * 2 * 2);
        assert_eq!(Tiles::tensor_cores_for_head_dim(129), None);
    }
}
