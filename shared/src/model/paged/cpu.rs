//! The CPU kernel of [`super::paged_attention`]: parallel over (row, kv head); each task keeps
//! the `rep` query heads of its group in f32 and walks the row's blocks once with an online
//! softmax, scoring a block's keys for every head of the group before reading its values.
//! Built twice, for AVX2 + FMA and generic x86-64/other CPUs, chosen at run time (the fused
//! attention's [`crate::model::simd`] primitives: a polynomial `exp` that vectorises).
//!
//! A prefill-shaped call (the queries of a chunk of one sequence, `CausalLm::extend`: runs of
//! rows with one block list, [`super::kernels::chunk_shaped`]) runs instead as one task per
//! (run of up to 64 rows, query head) through the fused attention's block kernel
//! ([`attend_block`]: the tile's two products as matrix products), its keys and values gathered
//! from the blocks a tile at a time.

use rayon::prelude::*;

use super::{kernels, PageTable, BLOCK_TOKENS};
#[cfg(target_arch = "x86_64")]
use crate::model::flash_attn::attend_block_avx2;
use crate::model::flash_attn::{attend_block, Elem, KeyTiles};
use crate::model::simd::{detect_isa, exp_sum_in_place, fast_exp, madd, row_max, Isa};

/// Shapes of one call.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Head dimension.
    pub d: usize,
}

/// Consecutive rows reading the same blocks (the queries of one sequence's chunk,
/// `CausalLm::extend`) run as one task per kv head, up to this many: each block's keys and
/// values are read once for all of them instead of once per row.
const TILE_ROWS: usize = 16;

/// `out[r, h] = softmax(scale · q[r, h] · K_rᵀ) V_r` over row `r`'s pool rows.
pub(crate) fn decode<T: Elem>(
    q: &[T],
    k: &[T],
    v: &[T],
    dims: Dims,
    table: &PageTable,
    scale: f32,
    out: &mut [T],
) {
    let Dims { heads, kv_heads, d } = dims;
    let rep = heads / kv_heads;
    let isa = detect_isa();
    let call = Call {
        q,
        k,
        v,
        dims,
        table,
        scale,
    };
    let runs = table.runs(kernels::CHUNK_ROWS);
    if kernels::chunk_shaped(table.rows(), runs.len()) {
        return chunk(&call, &runs, isa, out);
    }
    let tiles = tiles(table);
    let results: Vec<Vec<T>> = (0..tiles.len() * kv_heads)
        .into_par_iter()
        .map(|task| {
            let ((first, rows), g) = (tiles[task / kv_heads], task % kv_heads);
            let mut buf = vec![T::from_f32(0.0); rows * rep * d];
            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Isa::Avx2Fma` is only returned by `detect_isa` after
                // `is_x86_feature_detected!` confirmed AVX2 and FMA on this CPU.
                Isa::Avx2Fma => unsafe { group_avx2(&call, first, rows, g, &mut buf) },
                Isa::Generic => group::<T, false>(&call, first, rows, g, &mut buf),
            }
            buf
        })
        .collect();
    for (task, buf) in results.iter().enumerate() {
        let ((first, rows), g) = (tiles[task / kv_heads], task % kv_heads);
        for i in 0..rows {
            let o = ((first + i) * heads + g * rep) * d;
            out[o..o + rep * d].copy_from_slice(&buf[i * rep * d..(i + 1) * rep * d]);
        }
    }
}

/// `(first row, rows)` of each run of at most [`TILE_ROWS`] consecutive rows with the same
/// blocks ([`PageTable::runs`]).
pub(super) fn tiles(table: &PageTable) -> Vec<(usize, usize)> {
    table.runs(TILE_ROWS)
}

/// The keys and values of kv head `g` of the sequence of row `row`, gathered from its blocks a
/// tile at a time.
struct PagedKeys<'a, T> {
    k: &'a [T],
    v: &'a [T],
    table: &'a PageTable,
    row: usize,
    kv_heads: usize,
    g: usize,
    d: usize,
}

impl<T: Elem> KeyTiles for PagedKeys<'_, T> {
    #[inline(always)]
    fn tile<'s>(
        &'s self,
        k0: usize,
        nk: usize,
        k_buf: &'s mut Vec<f32>,
        v_buf: &'s mut Vec<f32>,
    ) -> (&'s [f32], &'s [f32]) {
        let d = self.d;
        k_buf.clear();
        v_buf.clear();
        for key in k0..k0 + nk {
            let off = (self.table.pool_row(self.row, key) * self.kv_heads + self.g) * d;
            k_buf.extend(self.k[off..off + d].iter().map(|x| x.to_f32()));
            v_buf.extend(self.v[off..off + d].iter().map(|x| x.to_f32()));
        }
        (k_buf, v_buf)
    }
}

/// The prefill-shaped call: one task per (run, query head), rows `first..first + n` of a run
/// reading their sequence's keys `[0, len)` through [`attend_block`].
fn chunk<T: Elem>(call: &Call<'_, T>, runs: &[(usize, usize)], isa: Isa, out: &mut [T]) {
    let Dims { heads, kv_heads, d } = call.dims;
    let rep = heads / kv_heads;
    let results: Vec<Vec<T>> = (0..runs.len() * heads)
        .into_par_iter()
        .map(|task| {
            let ((first, n), h) = (runs[task / heads], task % heads);
            let mut q_blk = Vec::with_capacity(n * d);
            for r in first..first + n {
                let o = (r * heads + h) * d;
                q_blk.extend(call.q[o..o + d].iter().map(|x| x.to_f32()));
            }
            let visible: Vec<(usize, usize)> = (first..first + n)
                .map(|r| (0, call.table.lens()[r] as usize))
                .collect();
            let keys = PagedKeys {
                k: call.k,
                v: call.v,
                table: call.table,
                row: first,
                kv_heads,
                g: h / rep,
                d,
            };
            let mut buf = vec![T::from_f32(0.0); n * d];
            let mut lse = vec![0f32; n];
            let (q, vis, scale) = (&q_blk[..], &visible[..], call.scale);
            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Isa::Avx2Fma` is only returned by `detect_isa` after
                // `is_x86_feature_detected!` confirmed AVX2 and FMA on this CPU.
                Isa::Avx2Fma => unsafe {
                    attend_block_avx2(q, vis, &keys, d, scale, &mut buf, &mut lse)
                },
                Isa::Generic => {
                    attend_block::<T, _, false>(q, vis, &keys, d, scale, &mut buf, &mut lse)
                }
            }
            buf
        })
        .collect();
    for (task, buf) in results.iter().enumerate() {
        let ((first, n), h) = (runs[task / heads], task % heads);
        for i in 0..n {
            let o = ((first + i) * heads + h) * d;
            out[o..o + d].copy_from_slice(&buf[i * d..(i + 1) * d]);
        }
    }
}

/// The inputs of one call.
struct Call<'a, T> {
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    dims: Dims,
    table: &'a PageTable,
    scale: f32,
}

/// [`group`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn group_avx2<T: Elem>(
    call: &Call<'_, T>,
    first: usize,
    rows: usize,
    g: usize,
    out: &mut [T],
) {
    group::<T, true>(call, first, rows, g, out)
}

/// One task: rows `first..first + rows` (the same blocks, each up to its own length), kv head
/// `g` and its `rep` query heads; `out` is `(rows, rep, d)`.
#[inline(always)]
fn group<T: Elem, const FMA: bool>(
    call: &Call<'_, T>,
    first: usize,
    rows: usize,
    g: usize,
    out: &mut [T],
) {
    let Dims { heads, kv_heads, d } = call.dims;
    let (k, v, table) = (call.k, call.v, call.table);
    let rep = heads / kv_heads;
    let lens: Vec<usize> = (first..first + rows)
        .map(|r| table.lens()[r] as usize)
        .collect();
    let longest = lens.iter().copied().max().unwrap_or(0);
    // The queries, pre-scaled: (rows, rep, d); per (row, head) the online softmax's state.
    let mut qf = Vec::with_capacity(rows * rep * d);
    for r in first..first + rows {
        let q0 = (r * heads + g * rep) * d;
        qf.extend(
            call.q[q0..q0 + rep * d]
                .iter()
                .map(|x| x.to_f32() * call.scale),
        );
    }
    let mut m = vec![f32::NEG_INFINITY; rows * rep];
    let mut l = vec![0f32; rows * rep];
    let mut acc = vec![0f32; rows * rep * d];
    let mut scores = [0f32; BLOCK_TOKENS];
    let mut kblk = vec![0f32; BLOCK_TOKENS * d];
    let mut vblk = vec![0f32; BLOCK_TOKENS * d];
    let mut buf = Vec::new();
    for b in 0..longest.div_ceil(BLOCK_TOKENS) {
        let start = b * BLOCK_TOKENS;
        let n = BLOCK_TOKENS.min(longest - start);
        let base = table.pool_row(first, start);
        // The block's keys and values for this kv head, once for every row of the tile.
        for j in 0..n {
            let off = ((base + j) * kv_heads + g) * d;
            kblk[j * d..(j + 1) * d].copy_from_slice(T::as_f32(&k[off..off + d], &mut buf));
            vblk[j * d..(j + 1) * d].copy_from_slice(T::as_f32(&v[off..off + d], &mut buf));
        }
        for (i, &len) in lens.iter().enumerate() {
            if len <= start {
                continue;
            }
            let ni = n.min(len - start);
            for h in 0..rep {
                let x = i * rep + h;
                let qx = &qf[x * d..(x + 1) * d];
                // Scores, then the online softmax: rescale what came before, exponentiate.
                let s = &mut scores[..ni];
                for (j, s) in s.iter_mut().enumerate() {
                    *s = dot::<FMA>(qx, &kblk[j * d..(j + 1) * d]);
                }
                let m_new = m[x].max(row_max(s));
                let corr = if m[x] == f32::NEG_INFINITY {
                    0.0
                } else {
                    fast_exp::<FMA>(m[x] - m_new)
                };
                let sum = exp_sum_in_place::<FMA>(s, m_new);
                l[x] = madd::<FMA>(l[x], corr, sum);
                m[x] = m_new;
                let a = &mut acc[x * d..(x + 1) * d];
                if corr != 1.0 {
                    a.iter_mut().for_each(|a| *a *= corr);
                }
                // The values, weighted.
                for (j, &p) in s.iter().enumerate() {
                    axpy::<FMA>(a, p, &vblk[j * d..(j + 1) * d]);
                }
            }
        }
    }
    for x in 0..rows * rep {
        let inv = 1.0 / l[x];
        for (o, a) in out[x * d..(x + 1) * d].iter_mut().zip(&acc[x * d..]) {
            *o = T::from_f32(a * inv);
        }
    }
}

/// Partial sums of [`dot`]: four vectors of eight, so that consecutive multiply-adds do not
/// wait on each other (one accumulator left the scores at a quarter of the FMA rate).
const DOT_LANES: usize = 32;

/// `Σ a·b` over [`DOT_LANES`] partial sums (vectorisable), summed pairwise in a fixed order.
#[inline(always)]
fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut s = [0f32; DOT_LANES];
    let (ca, cb) = (a.chunks_exact(DOT_LANES), b.chunks_exact(DOT_LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..DOT_LANES {
            s[i] = madd::<FMA>(x[i], y[i], s[i]);
        }
    }
    let mut w = DOT_LANES;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            s[i] += s[i + w];
        }
    }
    let mut t = s[0];
    for (x, y) in ra.iter().zip(rb) {
        t = madd::<FMA>(*x, *y, t);
    }
    t
}

/// `acc += p · x`.
#[inline(always)]
fn axpy<const FMA: bool>(acc: &mut [f32], p: f32, x: &[f32]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a = madd::<FMA>(p, *b, *a);
    }
}
