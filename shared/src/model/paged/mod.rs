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

    /// `(first row, rows)` of each run of at most `max_rows` consecutive rows with the same
    /// blocks: the queries of a prefill chunk of one sequence (which read one block table, each
    /// up to its own length) fall into runs of `max_rows`, the rows of a decode batch into runs
    /// of one.
    pub fn runs(&self, max_rows: usize) -> Vec<(usize, usize)> {
        let w = self.width;
        let blocks = |r: usize| &self.blocks[r * w..(r + 1) * w];
        let mut out: Vec<(usize, usize)> = Vec::new();
        for r in 0..self.rows {
            match out.last_mut() {
                Some((first, n)) if *n < max_rows && blocks(*first) == blocks(r) => *n += 1,
                _ => out.push((r, 1)),
            }
        }
        out
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
    attend(
        q,
        k_pool,
        v_pool,
        &PagedAttention::new(table.clone(), scale),
    )
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

/// Where [`write_rows`] puts `n` tokens: pool rows `rows` `(n)` u32, spread over a token's
/// `kv_heads × head_dim` elements, `(n, kv_heads × head_dim)` (built once per call of the
/// model, on its device, and used by every layer).
pub fn row_index(rows: &Tensor, kv_heads: usize, head_dim: usize) -> candle_core::Result<Tensor> {
    let n = rows.dims1()?;
    rows.reshape((n, 1))?
        .broadcast_as((n, kv_heads * head_dim))?
        .contiguous()
}

/// Writes `src` `(n, kv_heads, head_dim)` into `pool` `(pool_rows, kv_heads, head_dim)`, in
/// place, at the rows `index` ([`row_index`]) names (candle's `scatter_set`, so any device).
pub fn write_rows(pool: &Tensor, src: &Tensor, index: &Tensor) -> candle_core::Result<()> {
    let (n, kv, d) = src.dims3()?;
    let (pool_rows, pkv, pd) = pool.dims3()?;
    if (pkv, pd) != (kv, d) || index.dims() != [n, kv * d] {
        candle_core::bail!(
            "paged write: {:?} rows into a pool {:?} with an index {:?}",
            src.dims(),
            pool.dims(),
            index.dims()
        );
    }
    let flat = pool.reshape((pool_rows, kv * d))?;
    flat.scatter_set(index, &src.reshape((n, kv * d))?.contiguous()?, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Random q and pools, and a table whose rows own shuffled, interleaved blocks.
    fn case(
        rng: &mut ChaCha8Rng,
        lens: &[usize],
        (heads, kv_heads, d): (usize, usize, usize),
    ) -> (Tensor, Tensor, Tensor, Arc<PageTable>) {
        let blocks: usize = lens.iter().map(|l| l.div_ceil(BLOCK_TOKENS)).sum::<usize>() + 3;
        let mut ids: Vec<u32> = (0..blocks as u32).collect();
        ids.shuffle(rng);
        let mut tables = Vec::new();
        let mut next = 0;
        for l in lens {
            let n = l.div_ceil(BLOCK_TOKENS);
            tables.push(ids[next..next + n].to_vec());
            next += n;
        }
        let rows: Vec<(&[u32], usize)> = tables
            .iter()
            .zip(lens)
            .map(|(t, l)| (t.as_slice(), *l))
            .collect();
        let table = Arc::new(PageTable::new(&rows).unwrap());
        let mut randn = |shape: &[usize]| {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
            Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
        };
        let q = randn(&[lens.len(), heads, d]);
        let k = randn(&[blocks * BLOCK_TOKENS, kv_heads, d]);
        let v = randn(&[blocks * BLOCK_TOKENS, kv_heads, d]);
        (q, k, v, table)
    }

    fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
        let a: Vec<f32> = a
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let b: Vec<f32> = b
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs() / scale)
            .fold(0.0, f32::max)
    }

    #[test]
    fn the_cpu_kernel_equals_attention_over_the_gathered_rows() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let lens = [1, 15, 16, 17, 63, 300];
        for shape in [(16, 8, 128), (4, 1, 64), (4, 4, 40)] {
            let (q, k, v, table) = case(&mut rng, &lens, shape);
            let scale = 1.0 / (shape.2 as f32).sqrt();
            let fast = paged_attention(&q, &k, &v, &table, scale).unwrap();
            let reference = gathered_attention(&q, &k, &v, &table, scale).unwrap();
            assert_eq!(fast.dims(), &[lens.len(), shape.0, shape.2]);
            let err = max_rel(&fast, &reference);
            assert!(err < 1e-5, "{shape:?}: f32 max rel error {err}");
            for dtype in [DType::BF16, DType::F16] {
                let cast = |t: &Tensor| t.to_dtype(dtype).unwrap();
                let half = paged_attention(&cast(&q), &cast(&k), &cast(&v), &table, scale).unwrap();
                assert_eq!(half.dtype(), dtype);
                let err = max_rel(&half, &reference);
                assert!(err < 1e-2, "{shape:?}: {dtype:?} max rel error {err}");
            }
        }
    }

    #[test]
    fn the_queries_of_a_chunk_read_their_sequence_up_to_themselves() {
        // 37 queries of one sequence at positions 90..127 (tiles of 16, 16 and 5 rows), then
        // 3 of another at 5..8, then one more of the first: each against the gathered rows.
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let (heads, kv_heads, d) = (8, 2, 64);
        let (_, k, v, one) = case(&mut rng, &[127, 8], (heads, kv_heads, d));
        let w = one.width();
        let (a, b) = (&one.blocks()[..w], &one.blocks()[w..w + 1]);
        let mut rows: Vec<(&[u32], usize)> = (91..=127).map(|len| (a, len)).collect();
        rows.extend((6..=8).map(|len| (b, len)));
        rows.push((a, 50));
        let table = Arc::new(PageTable::new(&rows).unwrap());
        assert_eq!(
            cpu::tiles(&table),
            vec![(0, 16), (16, 16), (32, 5), (37, 3), (40, 1)]
        );
        assert_eq!(table.runs(64), vec![(0, 37), (37, 3), (40, 1)]);
        assert_eq!(table.runs(20), vec![(0, 20), (20, 17), (37, 3), (40, 1)]);
        // Prefill-shaped: the CPU kernel takes its chunk path (runs through the fused
        // attention's block kernel).
        assert!(kernels::chunk_shaped(
            table.rows(),
            table.runs(kernels::CHUNK_ROWS).len()
        ));
        let q = Tensor::randn(0f32, 1f32, (rows.len(), heads, d), &Device::Cpu).unwrap();
        let scale = 0.125;
        let fast = paged_attention(&q, &k, &v, &table, scale).unwrap();
        let reference = gathered_attention(&q, &k, &v, &table, scale).unwrap();
        let err = max_rel(&fast, &reference);
        assert!(err < 1e-5, "max rel error {err}");
        for dtype in [DType::BF16, DType::F16] {
            let cast = |t: &Tensor| t.to_dtype(dtype).unwrap();
            let half = paged_attention(&cast(&q), &cast(&k), &cast(&v), &table, scale).unwrap();
            assert_eq!(half.dtype(), dtype);
            let err = max_rel(&half, &reference);
            assert!(err < 1e-2, "{dtype:?} max rel error {err}");
        }
    }

    #[test]
    fn a_row_sees_only_its_own_tokens() {
        // Row 0's keys are changed past its length and in blocks it does not own: no effect.
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let (q, k, v, table) = case(&mut rng, &[20, 5], (4, 2, 16));
        let before = paged_attention(&q, &k, &v, &table, 0.25).unwrap();
        let mut kh: Vec<f32> = k.flatten_all().unwrap().to_vec1().unwrap();
        let owned: Vec<usize> = (0..20).map(|i| table.pool_row(0, i)).collect();
        for (row, chunk) in kh.chunks_mut(2 * 16).enumerate() {
            if !owned.contains(&row) {
                chunk.iter_mut().for_each(|x| *x = 1e3);
            }
        }
        let k2 = Tensor::from_vec(kh, k.dims(), &Device::Cpu).unwrap();
        let after = paged_attention(&q, &k2, &v, &table, 0.25).unwrap();
        let row0 = |t: &Tensor| t.narrow(0, 0, 1).unwrap();
        assert_eq!(max_rel(&row0(&before), &row0(&after)), 0.0);
    }

    #[test]
    fn bad_tables_and_shapes_are_errors() {
        assert!(
            PageTable::new(&[(&[0][..], 0)]).is_err(),
            "a row of no tokens"
        );
        assert!(
            PageTable::new(&[(&[0][..], 17)]).is_err(),
            "17 tokens in one block"
        );
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let (q, k, v, table) = case(&mut rng, &[16], (4, 2, 16));
        // A pool too small for the table.
        let short = k.narrow(0, 0, 8).unwrap();
        assert!(paged_attention(&q, &short, &short, &table, 1.0).is_err());
        // Heads not a multiple of the kv heads.
        let q3 = Tensor::zeros((1, 3, 16), DType::F32, &Device::Cpu).unwrap();
        assert!(paged_attention(&q3, &k, &v, &table, 1.0).is_err());
    }
}
