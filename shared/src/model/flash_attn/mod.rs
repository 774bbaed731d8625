//! Fused causal attention with a backward pass (the FlashAttention-2 algorithm), as a candle
//! custom op.
//!
//! The forward keeps only the output `O` and the per-row log-sum-exp `L`; the backward
//! recomputes the attention probabilities tile by tile (`P = exp(S - L)`) with
//! `D = rowsum(dO ∘ O)`. No `t × t` tensor exists at any point: memory is `O(t)` per head plus
//! one tile of scratch per thread.
//!
//! Masking is given as [`Segments`]: per batch row, sorted disjoint token ranges. Query `i`
//! attends key `j` iff both lie in the same segment and `j <= i`. Positions outside every
//! segment (padding) get a zero output and zero gradients. One segment `[0, t)` is plain causal
//! attention; one shorter segment is left or right padding; several are packed sequences.
//!
//! Grouped-query attention reads kv head `h / (n_heads / n_kv_heads)` for query head `h`,
//! without repeating k/v.
//!
//! Kernels: the CPU ([`cpu`]: f32, bf16, f16) and, with the `cuda` feature, CUDA
//! ([`kernels`] holds the sources, [`cuda`] launches them; f32 and bf16, head dim up to 128):
//! bf16 on tensor cores (`mma.sync`) on GPUs of compute capability 8.0 or newer, FMA loops
//! otherwise and for f32. On other devices or dtypes [`flash_attn`] is an error and the model
//! keeps its unfused attention.

mod cpu;
#[cfg(feature = "cuda-kernels")]
pub mod cuda;
pub mod kernels;
mod op;

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

#[cfg(target_arch = "x86_64")]
pub(crate) use cpu::attend_block_avx2;
pub(crate) use cpu::{attend_block, Elem, KeyTiles};
pub use op::FlashAttn;

/// Why a [`Segments`] description is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SegmentError {
    /// A segment with `start >= end`.
    #[error("row {row}, segment {index}: [{start}, {end}) is empty")]
    Empty {
        /// Batch row.
        row: usize,
        /// Index of the segment in its row.
        index: usize,
        /// Its start.
        start: usize,
        /// Its end.
        end: usize,
    },
    /// A segment that ends past the sequence length.
    #[error("row {row}, segment {index}: end {end} exceeds the sequence length {len}")]
    OutOfRange {
        /// Batch row.
        row: usize,
        /// Index of the segment in its row.
        index: usize,
        /// Its end.
        end: usize,
        /// The sequence length.
        len: usize,
    },
    /// A segment that starts before the previous one ends (unsorted or overlapping).
    #[error(
        "row {row}, segment {index}: starts at {start}, before the previous segment ends at \
         {previous_end} (segments must be sorted and disjoint)"
    )]
    Overlap {
        /// Batch row.
        row: usize,
        /// Index of the segment in its row.
        index: usize,
        /// Its start.
        start: usize,
        /// End of the segment before it.
        previous_end: usize,
    },
    /// A sequence length that does not fit the kernel's `u32` positions.
    #[error("sequence length {0} is too long for the fused attention (at most 2^31)")]
    TooLong(usize),
    /// Segments for another batch size or sequence length than the inputs'.
    #[error("segments describe {rows} rows of {len} tokens, the inputs have {batch} rows of {t}")]
    Mismatch {
        /// Rows in the segments.
        rows: usize,
        /// Sequence length of the segments.
        len: usize,
        /// Batch size of the inputs.
        batch: usize,
        /// Sequence length of the inputs.
        t: usize,
    },
}

/// Which positions of each batch row attend to each other: sorted, disjoint `[start, end)`
/// token ranges. Validated on construction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segments {
    len: usize,
    rows: Vec<Vec<(usize, usize)>>,
}

/// Sentinel of [`Segments::position_table`] for a position outside every segment.
pub(crate) const OUTSIDE: u32 = u32::MAX;

impl Segments {
    /// Segments of `rows.len()` batch rows of `len` tokens each. Every segment must be
    /// non-empty, end at or before `len`, and start at or after the previous one's end.
    pub fn new(len: usize, rows: Vec<Vec<(usize, usize)>>) -> Result<Segments, SegmentError> {
        if len > (1usize << 31) {
            return Err(SegmentError::TooLong(len));
        }
        for (row, segs) in rows.iter().enumerate() {
            let mut previous_end = 0;
            for (index, &(start, end)) in segs.iter().enumerate() {
                if start >= end {
                    return Err(SegmentError::Empty {
                        row,
                        index,
                        start,
                        end,
                    });
                }
                if end > len {
                    return Err(SegmentError::OutOfRange {
                        row,
                        index,
                        end,
                        len,
                    });
                }
                if start < previous_end {
                    return Err(SegmentError::Overlap {
                        row,
                        index,
                        start,
                        previous_end,
                    });
                }
                previous_end = end;
            }
        }
        Ok(Segments { len, rows })
    }

    /// Plain causal attention: one segment `[0, len)` in each of `batch` rows.
    pub fn causal(batch: usize, len: usize) -> Segments {
        let rows = if len == 0 {
            vec![Vec::new(); batch]
        } else {
            vec![vec![(0, len)]; batch]
        };
        Segments { len, rows }
    }

    /// Number of batch rows.
    pub fn batch(&self) -> usize {
        self.rows.len()
    }

    /// Sequence length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the sequence length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The segments of each row.
    pub fn rows(&self) -> &[Vec<(usize, usize)>] {
        &self.rows
    }

    /// Per row and position, the `(start, end)` of the segment holding it, or
    /// `(OUTSIDE, OUTSIDE)` for a position outside every segment. `O(batch × len)`.
    pub(crate) fn position_table(&self) -> Vec<Vec<(u32, u32)>> {
        self.rows
            .iter()
            .map(|segs| {
                let mut table = vec![(OUTSIDE, OUTSIDE); self.len];
                for &(start, end) in segs {
                    table[start..end].fill((start as u32, end as u32));
                }
                table
            })
            .collect()
    }

    /// The segments as the CUDA kernels read them: `seg_off` (`batch + 1` entries; row `r`'s
    /// segments are pairs `seg_off[r]..seg_off[r + 1]`) and `segs` (`start, end` pairs of all
    /// rows, flattened). `segs` ends with one unused `(0, 0)` pair, so that it is never empty.
    pub fn device_arrays(&self) -> (Vec<u32>, Vec<u32>) {
        let mut seg_off = Vec::with_capacity(self.rows.len() + 1);
        let mut segs = Vec::new();
        seg_off.push(0u32);
        for row in &self.rows {
            for &(start, end) in row {
                segs.extend([start as u32, end as u32]);
            }
            seg_off.push((segs.len() / 2) as u32);
        }
        segs.extend([0, 0]);
        (seg_off, segs)
    }

    /// Checks that these segments describe inputs of `batch` rows of `t` tokens.
    pub(crate) fn check_shape(&self, batch: usize, t: usize) -> Result<(), SegmentError> {
        if self.rows.len() != batch || self.len != t {
            return Err(SegmentError::Mismatch {
                rows: self.rows.len(),
                len: self.len,
                batch,
                t,
            });
        }
        Ok(())
    }
}

/// Whether [`flash_attn`] has a kernel for `dtype` and head dim `head_dim` on `device`: the CPU
/// (f32, bf16, f16, any head dim) and, built with the `cuda` feature, CUDA (f32, bf16, head dim
/// up to [`kernels::MAX_HEAD_DIM`]).
pub fn supported(device: &Device, dtype: DType, head_dim: usize) -> bool {
    match device {
        Device::Cpu => matches!(dtype, DType::F32 | DType::BF16 | DType::F16),
        Device::Cuda(_) => {
            cfg!(feature = "cuda")
                && matches!(dtype, DType::F32 | DType::BF16)
                && (1..=kernels::MAX_HEAD_DIM).contains(&head_dim)
        }
        _ => false,
    }
}

/// Fused causal attention with backward. `q` `(b, n_heads, t, d)`, `k`/`v`
/// `(b, n_kv_heads, t, d)` with `n_heads` a multiple of `n_kv_heads`, all of one dtype with a
/// kernel on their device (see [`supported`]; f32 accumulation, output in the input dtype).
/// `scale` defaults to `1 / sqrt(d)`. Returns `(b, n_heads, t, d)`; rows outside every segment
/// are zero.
///
/// Differentiable with respect to `q`, `k` and `v` through candle's autograd. An error (not a
/// panic) for bad shapes, dtypes, segments, or a device or dtype without a kernel.
pub fn flash_attn(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    segments: &Arc<Segments>,
    scale: Option<f32>,
) -> candle_core::Result<Tensor> {
    let d = check_inputs(q, k, v, segments)?;
    let scale = scale.unwrap_or(1.0 / (d as f32).sqrt());
    let op = FlashAttn::new(segments.clone(), scale);
    q.contiguous()?
        .apply_op3(&k.contiguous()?, &v.contiguous()?, op)
}

/// [`flash_attn`] that also returns the forward's per-row log-sum-exp `L` of the scaled scores
/// (`b * n_heads * t` values, row-major; `+inf` for rows outside every segment), copied to the
/// host. For checking the kernels against each other; the output is not differentiable.
pub fn flash_attn_lse(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    segments: &Arc<Segments>,
    scale: Option<f32>,
) -> candle_core::Result<(Tensor, Vec<f32>)> {
    let d = check_inputs(q, k, v, segments)?;
    let scale = scale.unwrap_or(1.0 / (d as f32).sqrt());
    let op = FlashAttn::new(segments.clone(), scale);
    let slot = op.lse_slot();
    let out = q.detach().contiguous()?.apply_op3_no_bwd(
        &k.detach().contiguous()?,
        &v.detach().contiguous()?,
        &op,
    )?;
    let lse = match slot.get() {
        Some(saved) => saved.to_host()?,
        None => candle_core::bail!("flash_attn_lse: the forward stored no log-sum-exp"),
    };
    Ok((out, lse))
}

/// The checks of [`flash_attn`]: shapes, dtypes, devices, segments. Returns the head dim.
fn check_inputs(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    segments: &Segments,
) -> candle_core::Result<usize> {
    let (b, nh, t, d) = q.dims4()?;
    let (bk, nkv, tk, dk) = k.dims4()?;
    if (bk, tk, dk) != (b, t, d) || v.dims() != k.dims() {
        candle_core::bail!(
            "flash_attn: q {:?}, k {:?}, v {:?} do not fit (b, heads, t, d) / (b, kv_heads, t, d)",
            q.dims(),
            k.dims(),
            v.dims()
        );
    }
    if nkv == 0 || nh % nkv != 0 {
        candle_core::bail!("flash_attn: {nh} query heads is not a multiple of {nkv} kv heads");
    }
    let dtype = q.dtype();
    if k.dtype() != dtype || v.dtype() != dtype {
        candle_core::bail!(
            "flash_attn: dtypes differ (q {:?}, k {:?}, v {:?})",
            dtype,
            k.dtype(),
            v.dtype()
        );
    }
    if !q.device().same_device(k.device()) || !q.device().same_device(v.device()) {
        candle_core::bail!(
            "flash_attn: q, k, v on different devices ({:?}, {:?}, {:?})",
            q.device(),
            k.device(),
            v.device()
        );
    }
    if !supported(q.device(), dtype, d) {
        candle_core::bail!(
            "flash_attn: no kernel for {dtype:?} with head dim {d} on {:?} (CPU: f32, bf16, \
             f16; CUDA with the `cuda` feature: f32, bf16, head dim <= {}); use the unfused \
             attention",
            q.device(),
            kernels::MAX_HEAD_DIM
        );
    }
    segments
        .check_shape(b, t)
        .map_err(candle_core::Error::wrap)?;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_validated() {
        assert!(Segments::new(8, vec![vec![(0, 3), (3, 8)], vec![(2, 5)]]).is_ok());
        assert!(matches!(
            Segments::new(8, vec![vec![(0, 3), (2, 8)]]),
            Err(SegmentError::Overlap {
                row: 0,
                index: 1,
                ..
            })
        ));
        assert!(matches!(
            Segments::new(8, vec![vec![(4, 8), (0, 3)]]),
            Err(SegmentError::Overlap { .. })
        ));
        assert!(matches!(
            Segments::new(8, vec![vec![(0, 9)]]),
            Err(SegmentError::OutOfRange { end: 9, len: 8, .. })
        ));
        assert!(matches!(
            Segments::new(8, vec![vec![], vec![(3, 3)]]),
            Err(SegmentError::Empty { row: 1, .. })
        ));
    }

    #[test]
    fn position_table_marks_padding() {
        let s = Segments::new(6, vec![vec![(1, 3), (4, 6)]]).unwrap();
        let table = s.position_table();
        assert_eq!(
            table[0],
            vec![
                (OUTSIDE, OUTSIDE),
                (1, 3),
                (1, 3),
                (OUTSIDE, OUTSIDE),
                (4, 6),
                (4, 6)
            ]
        );
    }
}
