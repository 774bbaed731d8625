//! A paged key/value cache for batched decoding, and the attention that reads it.
//!
//! The keys (and values) of one layer live in a pool of fixed-size blocks,
//! `(blocks × BLOCK_TOKENS, kv_heads, head_dim)`. A sequence owns a list of blocks, its *block
//! table*: its token `i` sits at row `table[i / BLOCK_TOKENS] * BLOCK_TOKENS + i % BLOCK_TOKENS`
//! of the pool. Sequences of any lengths share the pool without padding, a finished sequence's
//! blocks go straight back to the free list, and nothing is copied when a sequence starts, ends
//! or grows. The memory of a decode batch is therefore the number of tokens it holds, rounded up
//! to blocks, and a budget in tokens bounds it exactly (see [`super::DecodeBatch`]).
//!
//! [`paged_attention`] is one decode step's attention: each row's single query (all heads)
//! against the keys and values its block table lists, up to its length, with grouped-query
//! heads read in place. Kernels: the CPU ([`cpu`]: f32, bf16, f16), and CUDA with the `cuda`
//! feature where [`supported`] says so; elsewhere the same result comes from candle ops that
//! gather the rows first.

pub(crate) mod cpu;
#[cfg(feature = "cuda-kernels")]
pub mod cuda;
pub mod kernels;
mod op;

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

pub use op::PagedAttention;

/// Tokens per block of the pool.
pub const BLOCK_TOKENS: usize = 16;

/// Which pool rows each decode row reads: per row, its blocks (padded to the longest row's
/// count with block 0, never read) and its length in tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageTable {
    rows: usize,
    width: usize,
    blocks: Vec<u32>,
    lens: Vec<u32>,
}

impl PageTable {
    /// A table from each row's `(blocks, tokens)`. Every row needs at least one token and
    /// enough blocks for its tokens.
    pub fn new(rows: &[(&[u32], usize)]) -> Result<PageTable, String> {
        let width = rows.iter().map(|(b, _)| b.len()).max().unwrap_or(0);
        let mut blocks = vec![0u32; rows.len() * width];
        let mut lens = Vec::with_capacity(rows.len());
        for (r, (table, len)) in rows.iter().enumerate() {
            if *len == 0 || len.div_ceil(BLOCK_TOKENS) > table.len() {
                return Err(format!(
                    "paged attention: row {r} has {len} tokens in {} blocks of {BLOCK_TOKENS}",
                    table.len()
                ));
            }
            let len = u32::try_from(*len).map_err(|_| format!("row {r}: {len} tokens"))?;
            blocks[r * width..r * width + table.len()].copy_from_slice(table);
            lens.push(len);
        }
        Ok(PageTable {
            rows: rows.len(),
            width,
            blocks,
            lens,
        })
    }

    /// Rows (queries) of the table.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Block-table entries per row (the longest row's block count).
    pub fn width(&self) -> usize {
        self.width
    }

    /// `rows × width` block ids, row-major.
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    /// Tokens per row.
    pub fn lens(&self) -> &[u32] {
        &self.lens
    }

    /// The pool row of token `i` of row `r`.
    pub fn pool_row(&self, r: usize, i: usize) -> usize {
        self.blocks[r * self.width + i / BLOCK_TOKENS] as usize * BLOCK_TOKENS + i % BLOCK_TOKENS
    }

    /// The largest pool row any row reads, plus one (checked against the pool's size).
    fn rows_needed(&self) -> usize {
        (0..self.rows)
            .map(|r| self.pool_row(r, self.lens[r] as usize - 1) + 1)
            .max()
            .unwrap_or(0)
    }
}

/// Whether [`paged_attention`] has a kernel for this device, dtype and head dimension (else it
/// runs as candle ops over gathered rows).
pub fn supported(device: &Device, dtype: DType, head_dim: usize) -> bool {
    match device {
        Device::Cpu => matches!(dtype, DType::F32 | DType::BF16 | DType::F16),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            matches!(dtype, DType::F32 | DType::BF16) && head_dim <= kernels::MAX_HEAD_DIM
        }
        _ => {
            let _ = head_dim;
            false
        }
    }
}

/// One decode step's attention: `q` `(rows, heads, head_dim)` against the pool rows `table`
/// lists, `k_pool`/`v_pool` `(pool_rows, kv_heads, head_dim)`, scores multiplied by `scale`.
/// Returns `(rows, heads, head_dim)` in `q`'s dtype (arithmetic in f32). Not differentiable.
pub fn paged_attention(
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    table: &Arc<PageTable>,
    scale: f32,
) -> candle_core::Result<Tensor> {
    attend(q, k_pool, v_pool, &PagedAttention::new(table.clone(), scale))
}

/// [`paged_attention`] with the table and scale of `op`; one op can serve every layer of a
/// decode step (its table is uploaded to a GPU once).
pub fn attend(
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    op: &PagedAttention,
) -> candle_core::Result<Tensor> {
    let table = op.table();
    let (rows, heads, d) = q.dims3()?;
    let (pool_rows, kv_heads, dk) = k_pool.dims3()?;
    if v_pool.dims() != k_pool.dims()
        || dk != d
        || kv_heads == 0
        || heads % kv_heads != 0
        || rows != table.rows()
    {
        candle_core::bail!(
            "paged attention: q {:?}, k pool {:?}, v pool {:?} and a table of {} rows do not fit",
            q.dims(),
            k_pool.dims(),
            v_pool.dims(),
            table.rows()
        );
    }
    if table.rows_needed() > pool_rows {
        candle_core::bail!(
            "paged attention: the table reads pool row {} of {pool_rows}",
            table.rows_needed() - 1
        );
    }
    if supported(q.device(), q.dtype(), d) && k_pool.dtype() == q.dtype() {
        return q
            .contiguous()?
            .apply_op3_no_bwd(&k_pool.contiguous()?, &v_pool.contiguous()?, op);
    }
    gathered_attention(q, k_pool, v_pool, table, op.scale())
}

/// [`paged_attention`] as candle ops: each row's keys and values are gathered into a padded
/// `(rows, kv_heads, longest, d)` copy, then scored with an additive mask. The reference the
/// kernels are checked against, and the path on devices without one.
pub fn gathered_attention(
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    table: &PageTable,
    scale: f32,
) -> candle_core::Result<Tensor> {
    let (rows, heads, d) = q.dims3()?;
    let kv_heads = k_pool.dim(1)?;
    let rep = heads / kv_heads;
    let longest = table.lens().iter().copied().max().unwrap_or(0) as usize;
    let mut index = Vec::with_capacity(rows * longest);
    let mut bias = Vec::with_capacity(rows * longest);
    for r in 0..rows {
        let len = table.lens()[r] as usize;
        for i in 0..longest {
            if i < len {
                index.push(table.pool_row(r, i) as u32);
                bias.push(0f32);
            } else {
                index.push(table.pool_row(r, 0) as u32);
                bias.push(f32::NEG_INFINITY);
            }
        }
    }
    let dev = q.device();
    let index = Tensor::from_vec(index, rows * longest, dev)?;
    let gather = |pool: &Tensor| -> candle_core::Result<Tensor> {
        pool.index_select(&index, 0)?
            .reshape((rows, longest, kv_heads, d))?
            .transpose(1, 2)?
            .contiguous()
    };
    let (k, v) = (gather(k_pool)?, gather(v_pool)?); // (rows, kv, longest, d)
    let qg = q.reshape((rows, kv_heads, rep, d))?;
    let scores = (qg.matmul(&k.t()?)?.to_dtype(DType::F32)? * scale as f64)?; // (rows, kv, rep, longest)
    let bias = Tensor::from_vec(bias, (rows, 1, 1, longest), dev)?;
    let probs = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&bias)?)?;
    let out = probs.to_dtype(v.dtype())?.matmul(&v)?; // (rows, kv, rep, d)
    out.reshape((rows, heads, d))?.to_dtype(q.dtype())
}

/// Writes `src` `(n, kv_heads, head_dim)` into rows `rows[i]` of `pool`
/// `(pool_rows, kv_heads, head_dim)`, in place (candle's `scatter_set`, so any device).
pub fn write_rows(pool: &Tensor, src: &Tensor, rows: &Tensor) -> candle_core::Result<()> {
    let (n, kv, d) = src.dims3()?;
    let (pool_rows, pkv, pd) = pool.dims3()?;
    if (pkv, pd) != (kv, d) || rows.dims1()? != n {
        candle_core::bail!(
            "paged write: {:?} rows into a pool {:?} with {} row indices",
            src.dims(),
            pool.dims(),
            rows.elem_count()
        );
    }
    let flat = pool.reshape((pool_rows, kv * d))?;
    let index = rows
        .reshape((n, 1))?
        .broadcast_as((n, kv * d))?
        .contiguous()?;
    flat.scatter_set(&index, &src.reshape((n, kv * d))?.contiguous()?, 0)
}
