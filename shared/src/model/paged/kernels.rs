//! The CUDA C source of the paged decode attention (`kernels/paged_attn.cu`), compiled at run
//! time with NVRTC by [`super::cuda`] (feature `cuda-kernels`), and what a launcher needs to
//! know about it: entry-point names, block size, grid, and how a call is split over the token
//! axis ([`split_plan`]). Plain data and pure functions, built everywhere, so that the PTX and
//! emulation tests read the same constants as the launcher.

/// `paged_attn.cu`: `paged_decode_{f32,bf16}_d{64,128}` (pass 1, or the whole call unsplit) and
/// `paged_combine_{f32,bf16}` (pass 2 of a split call).
pub const PAGED_ATTN_CU: &str = include_str!("kernels/paged_attn.cu");

/// NVRTC options (those of the fused attention). `--fmad=false` keeps `a * b + c` as two
/// rounded operations, as in the emulation (compiled with `-ffp-contract=off`); the kernel's
/// dot products and `P V` use explicit `fmaf`, fused in both.
pub const NVRTC_OPTIONS: &[&str] = &["--fmad=false", "--std=c++17"];

/// Threads per block (the `THREADS` default of `paged_attn.cu`).
pub const THREADS: u32 = 128;

/// Decode blocks one SM holds at once: the launch bound's `PA_MIN_BLOCKS = 512 / THREADS` (4:
/// at most 128 registers a thread; 11.2 KiB of shared memory a block).
pub const BLOCKS_PER_SM: usize = 512 / THREADS as usize;

/// The largest head dimension the kernel supports.
pub const MAX_HEAD_DIM: usize = 128;

/// Query heads of one kv head's group that one CUDA block serves (`PA_QUERIES`); a larger
/// group is split over several blocks, each reading the group's keys and values.
pub const QUERIES_PER_BLOCK: usize = 4;

/// Grids a split call aims for, in waves of `SM count × BLOCKS_PER_SM` blocks: with fewer
/// (unsplit) blocks than two waves, rows are split over the token axis until the grid reaches
/// about two waves, so that every SM holds blocks most of the time and the last wave's tail is
/// short.
pub const TARGET_WAVES: usize = 2;

/// The smallest split, in cache blocks (16 × 16 = 256 tokens): below it a block's fixed costs
/// (queries to shared memory, the warps' combine, its d + 2 floats of workspace per query head,
/// written and read back) weigh against reading 256 × d keys and values (64 KiB of bf16 K+V at
/// d = 128), and rows shorter than two such splits are not split.
pub const MIN_SPLIT_BLOCKS: usize = 16;

/// The most splits of one row (bounds the workspace: `rows × heads × MAX_SPLITS × (d + 2)` f32;
/// 128 splits already give a single row of 8 kv heads 1024 blocks, about two waves on 132 SMs).
pub const MAX_SPLITS: usize = 128;

/// How a call splits each row's cache blocks: `splits` ranges of `split_blocks` cache blocks
/// (the last shorter; none past a row's end), one CUDA block each (the kernel's `splits` and
/// `split_blocks` arguments). `splits == 1`: the unsplit path (one pass, no workspace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPlan {
    /// Splits of each row (1: unsplit).
    pub splits: usize,
    /// Cache blocks of each split (at least the longest row's count when unsplit).
    pub split_blocks: usize,
}

impl SplitPlan {
    /// No split: one block covers a row of up to `max_len` tokens.
    pub fn unsplit(max_len: usize) -> SplitPlan {
        SplitPlan {
            splits: 1,
            split_blocks: max_len.div_ceil(super::BLOCK_TOKENS).max(1),
        }
    }

    /// Exactly `splits` splits (at least 1) of rows of up to `max_len` tokens, each of
    /// `ceil(cache blocks / splits)` cache blocks (some may be empty for every row): for tests,
    /// which force the split path on small shapes.
    pub fn forced(max_len: usize, splits: usize) -> SplitPlan {
        let splits = splits.max(1);
        if splits == 1 {
            return SplitPlan::unsplit(max_len);
        }
        SplitPlan {
            splits,
            split_blocks: max_len
                .div_ceil(super::BLOCK_TOKENS)
                .div_ceil(splits)
                .max(1),
        }
    }

    /// Blocks of pass 1 (or of the unsplit call) for `rows` rows: one per (row, kv head, split,
    /// query chunk).
    pub fn grid(&self, rows: usize, heads: usize, kv_heads: usize) -> usize {
        grid(rows, heads, kv_heads) * self.splits
    }

    /// f32 elements of the workspace of pass 1: a record of `d + 2` per (row, head, split); 0
    /// when unsplit.
    pub fn workspace_len(&self, rows: usize, heads: usize, d: usize) -> usize {
        if self.splits <= 1 {
            0
        } else {
            rows * heads * self.splits * (d + 2)
        }
    }
}

/// The split of a call of `rows` rows, `kv_heads` kv heads and `q_chunks` query chunks
/// ([`query_chunks`]) whose longest row has `max_len` tokens, on a GPU of `sm_count` SMs. A pure
/// function of these (so a GPU gives the same result for the same call every time):
///
/// - 1 (unsplit) when the unsplit grid `rows × kv_heads × q_chunks` already has
///   [`TARGET_WAVES`] waves of `sm_count × BLOCKS_PER_SM` blocks, or when the longest row has
///   fewer than `2 × MIN_SPLIT_BLOCKS` cache blocks (rows of up to 496 tokens);
/// - else at least `want = ceil(TARGET_WAVES waves / unsplit grid)` splits (at most
///   `cache blocks / MIN_SPLIT_BLOCKS` and [`MAX_SPLITS`]); among `want ..= 2 × want` the count
///   whose grid wastes least of its last wave, by the time `ceil(grid / wave) × split_blocks`
///   that blocks of equal work would take (the fewest splits on a tie). E.g. 16 rows × 8 kv heads
///   × 40 960 tokens on 132 SMs: 128 blocks unsplit, `want` = 9 (1 152 blocks, 2.2 waves of
///   285 cache blocks: 3 × 285 = 855), chosen 16 (2 048 blocks, 3.9 waves of 160: 640; the ideal
///   is 2 560 × 128 / 528 = 621).
///
/// `split_blocks = ceil(cache blocks / splits)`, and `splits` then the splits that hold any of
/// the longest row's blocks.
pub fn split_plan(
    rows: usize,
    kv_heads: usize,
    q_chunks: usize,
    max_len: usize,
    sm_count: usize,
) -> SplitPlan {
    let max_blocks = max_len.div_ceil(super::BLOCK_TOKENS);
    let unsplit = SplitPlan::unsplit(max_len);
    let base = rows * kv_heads * q_chunks;
    let wave = sm_count * BLOCKS_PER_SM;
    let target = TARGET_WAVES * wave;
    if base == 0 || wave == 0 || base >= target {
        return unsplit;
    }
    let cap = (max_blocks / MIN_SPLIT_BLOCKS).min(MAX_SPLITS);
    if cap < 2 {
        return unsplit;
    }
    let want = target.div_ceil(base).clamp(2, cap);
    // (time in cache-block steps, plan) of `s` splits.
    let plan = |s: usize| {
        let split_blocks = max_blocks.div_ceil(s);
        let splits = max_blocks.div_ceil(split_blocks);
        let time = (base * splits).div_ceil(wave) * split_blocks;
        (
            time,
            SplitPlan {
                splits,
                split_blocks,
            },
        )
    };
    (want..=(2 * want).min(cap))
        .map(plan)
        .min_by_key(|&(time, p)| (time, p.splits))
        .map(|(_, p)| p)
        .unwrap_or(unsplit)
}

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

/// The pass-2 entry point of a split call for `dtype` (any head dimension up to
/// [`MAX_HEAD_DIM`]): `paged_combine_{f32,bf16}(part, out, d, splits)`, grid `rows × heads`.
pub fn combine_entry(dtype: KernelDtype) -> &'static str {
    match dtype {
        KernelDtype::F32 => "paged_combine_f32",
        KernelDtype::Bf16 => "paged_combine_bf16",
    }
}

/// Every entry point of `paged_attn.cu`: the decode kernels, then the combine kernels.
pub fn entry_points() -> Vec<&'static str> {
    let mut names = Vec::new();
    for dtype in [KernelDtype::F32, KernelDtype::Bf16] {
        for d in [64, 128] {
            names.push(entry(dtype, d).expect("64 and 128 are supported"));
        }
    }
    for dtype in [KernelDtype::F32, KernelDtype::Bf16] {
        names.push(combine_entry(dtype));
    }
    names
}

/// Rows (queries) per block of the tensor-core prefill kernel, `fam_paged_bf16_d*` of
/// `flash_attn_mma.cu` (`FWD_M` of its `MmaTiles`).
pub const CHUNK_ROWS: usize = 64;

/// A call runs on the prefill kernel (bf16, tensor cores) when its runs of rows with the same
/// blocks ([`super::PageTable::runs`] of [`CHUNK_ROWS`]) hold this many rows on average:
/// prefill chunks (runs of 64), not decode batches (runs of one).
pub const CHUNK_MIN_AVG_ROWS: usize = 8;

/// The tensor-core prefill entry point for head dimension `head_dim` (bf16 only), or `None`
/// when `head_dim` is 0 or above [`MAX_HEAD_DIM`].
pub fn chunk_entry(head_dim: usize) -> Option<&'static str> {
    match head_dim {
        1..=64 => Some("fam_paged_bf16_d64"),
        65..=MAX_HEAD_DIM => Some("fam_paged_bf16_d128"),
        _ => None,
    }
}

/// Whether `rows` rows in `runs` runs are prefill-shaped (see [`CHUNK_MIN_AVG_ROWS`]).
pub fn chunk_shaped(rows: usize, runs: usize) -> bool {
    runs > 0 && rows >= CHUNK_MIN_AVG_ROWS * runs
}

/// Blocks per (row, kv head): the group's `heads / kv_heads` query heads in chunks of
/// [`QUERIES_PER_BLOCK`] (the kernel's `q_chunks` argument).
pub fn query_chunks(heads: usize, kv_heads: usize) -> usize {
    (heads / kv_heads.max(1)).div_ceil(QUERIES_PER_BLOCK)
}

/// Blocks of the unsplit 1-D grid for `rows` decode rows: one per (row, kv head, query chunk).
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
        assert!(src.contains("#define PA_MIN_BLOCKS (512 / THREADS)\n"));
        assert_eq!(BLOCKS_PER_SM, 4);
        assert!(src.contains(&format!(
            "#define PA_BLOCK_TOKENS {}\n",
            super::super::BLOCK_TOKENS
        )));
        for name in entry_points() {
            if let Some(dtype) = name.strip_prefix("paged_combine_") {
                let ty = if dtype == "f32" { "float" } else { "bf16_bits" };
                assert!(
                    src.contains(&format!("PA_COMBINE({ty}, {dtype})")),
                    "{name} is not instantiated"
                );
                continue;
            }
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
        assert_eq!(combine_entry(KernelDtype::F32), "paged_combine_f32");
        assert_eq!(combine_entry(KernelDtype::Bf16), "paged_combine_bf16");
        assert_eq!(entry_points().len(), 6);
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

    /// The splits of `split_plan` cover the longest row in whole cache blocks, every split
    /// holds some of its blocks, and a split is at least `MIN_SPLIT_BLOCKS` long.
    fn check_plan(p: SplitPlan, max_len: usize) {
        let max_blocks = max_len.div_ceil(super::super::BLOCK_TOKENS);
        assert!(p.splits >= 1 && p.splits <= MAX_SPLITS, "{p:?}");
        assert!(
            p.splits * p.split_blocks >= max_blocks,
            "{p:?} for {max_blocks}"
        );
        if p.splits > 1 {
            assert!(p.split_blocks >= MIN_SPLIT_BLOCKS, "{p:?}");
            assert!(
                (p.splits - 1) * p.split_blocks < max_blocks,
                "{p:?}: an empty split"
            );
        }
    }

    #[test]
    fn long_rows_on_few_blocks_are_split_to_two_waves() {
        let wave = 132 * BLOCKS_PER_SM;
        // Qwen3-8B decode of an actor: 16 rows × 8 kv heads × 40 960 tokens on an H100/H200.
        let p = split_plan(16, 8, query_chunks(32, 8), 40_960, 132);
        check_plan(p, 40_960);
        assert!(p.splits > 1, "{p:?}");
        assert!(p.grid(16, 32, 8) >= TARGET_WAVES * wave, "{p:?}");
        assert_eq!(
            p,
            SplitPlan {
                splits: 16,
                split_blocks: 160
            }
        );
        let p = split_plan(8, 8, 1, 16_384, 132);
        check_plan(p, 16_384);
        assert!(p.grid(8, 32, 8) >= TARGET_WAVES * wave, "{p:?}");
        // One row: as many splits as MAX_SPLITS allows.
        let p = split_plan(1, 8, 1, 40_960, 132);
        check_plan(p, 40_960);
        assert_eq!(p.splits, MAX_SPLITS);
        // Pure: the same call, the same plan.
        assert_eq!(
            split_plan(8, 8, 1, 16_384, 132),
            split_plan(8, 8, 1, 16_384, 132)
        );
        assert_eq!(p.workspace_len(1, 32, 128), 32 * MAX_SPLITS * 130);
    }

    #[test]
    fn full_grids_and_short_rows_are_not_split() {
        // 256 rows × 8 kv heads: 2 048 blocks, about four waves.
        assert_eq!(
            split_plan(256, 8, 1, 40_960, 132),
            SplitPlan::unsplit(40_960)
        );
        assert_eq!(split_plan(132, 8, 1, 4096, 132).splits, 1);
        // Rows too short for two splits of 256 tokens.
        assert_eq!(split_plan(16, 8, 1, 300, 132), SplitPlan::unsplit(300));
        assert_eq!(split_plan(1, 1, 1, 496, 132).splits, 1);
        assert_eq!(split_plan(1, 1, 1, 497, 132).splits, 2);
        // Degenerate: no rows, no SMs.
        assert_eq!(split_plan(0, 8, 1, 40_960, 132).splits, 1);
        assert_eq!(split_plan(16, 8, 1, 40_960, 0).splits, 1);
        assert_eq!(SplitPlan::unsplit(40_960).workspace_len(16, 32, 128), 0);
        assert_eq!(SplitPlan::unsplit(1).split_blocks, 1);
    }

    #[test]
    fn split_plans_hold_their_invariants() {
        for sms in [1, 16, 108, 132, 144] {
            for rows in [1, 2, 3, 8, 16, 64, 256] {
                for (kv, chunks) in [(1, 1), (8, 1), (8, 2), (2, 3)] {
                    for len in [
                        1, 16, 17, 511, 512, 513, 1000, 4096, 16_384, 40_960, 131_072,
                    ] {
                        let p = split_plan(rows, kv, chunks, len, sms);
                        check_plan(p, len);
                        let base = rows * kv * chunks;
                        if base >= TARGET_WAVES * sms * BLOCKS_PER_SM {
                            assert_eq!(p.splits, 1);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn forced_splits_cover_the_rows() {
        assert_eq!(SplitPlan::forced(1000, 1), SplitPlan::unsplit(1000));
        // 63 cache blocks in 7 splits of 9.
        assert_eq!(
            SplitPlan::forced(1000, 7),
            SplitPlan {
                splits: 7,
                split_blocks: 9
            }
        );
        // 2 cache blocks in 3 splits of 1: the last split is empty for every row.
        assert_eq!(
            SplitPlan::forced(17, 3),
            SplitPlan {
                splits: 3,
                split_blocks: 1
            }
        );
        assert_eq!(SplitPlan::forced(1, 3).split_blocks, 1);
        assert_eq!(SplitPlan::forced(1000, 2).grid(3, 32, 8), 3 * 8 * 2);
        assert_eq!(
            SplitPlan::forced(1000, 2).workspace_len(3, 4, 64),
            3 * 4 * 2 * 66
        );
    }
}
