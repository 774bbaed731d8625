//! The CPU kernels: tiled FlashAttention-2 forward and backward over contiguous
//! `(b, heads, t, d)` buffers.
//!
//! - Forward: parallel over (batch row, head, block of [`BLOCK_Q`] queries). Each task walks the
//!   key tiles its rows can see with an online softmax and writes its rows of `O` and `L`.
//! - Backward: parallel over (batch row, kv head), so that the task owning a kv head owns its
//!   `dK`/`dV` and the `dQ` rows of its query heads: no two tasks write the same memory. For
//!   each key tile it loops over the query heads of the group and the query tiles that can see
//!   the keys, recomputing `P = exp(S - L)`.
//!
//! Masking walks per-row key ranges (`[segment start, i]`) instead of masking a full tile, so
//! no work is spent on invisible pairs and nothing is `t × t`. Scratch per task is a few tiles.
//!
//! The products of a tile (`S = Q Kᵀ`, `O += P V`; in backward `S`, `dP = dO Vᵀ`, `dQ += dS K`,
//! `dV += Pᵀ dO`, `dK += dSᵀ Q`) are matrix products on the task's thread through the `gemm`
//! crate (candle's CPU matmul), with the masks and the softmax applied row by row between
//! them. On x86-64 with AVX2 + FMA (detected at run time) the row loops are compiled a second
//! time with those features enabled and fused multiply-adds.

use half::{bf16, f16};
use rayon::prelude::*;

use super::OUTSIDE;
use crate::model::fused::tile_product;
use crate::model::simd::{detect_isa, fast_exp, Isa};

/// Queries per forward task and per backward query tile.
pub(crate) const BLOCK_Q: usize = 64;
/// Keys per tile.
pub(crate) const BLOCK_K: usize = 64;
/// Keys per forward tile: the forward's two products per tile run as matrix products (the
/// `gemm` crate, as candle's matmul), which larger tiles make more efficient.
const FWD_BLOCK_K: usize = 128;

/// An element type the kernels read and write; arithmetic is always f32.
pub(crate) trait Elem: Copy + Send + Sync + 'static {
    /// Widens to f32.
    fn to_f32(self) -> f32;
    /// Rounds from f32.
    fn from_f32(x: f32) -> Self;
    /// `src` as f32: borrowed when it already is, else converted into `scratch`.
    fn as_f32<'a>(src: &'a [Self], scratch: &'a mut Vec<f32>) -> &'a [f32];
}

impl Elem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> f32 {
        x
    }
    #[inline(always)]
    fn as_f32<'a>(src: &'a [f32], _scratch: &'a mut Vec<f32>) -> &'a [f32] {
        src
    }
}

macro_rules! half_elem {
    ($t:ty) => {
        impl Elem for $t {
            #[inline(always)]
            fn to_f32(self) -> f32 {
                <$t>::to_f32(self)
            }
            #[inline(always)]
            fn from_f32(x: f32) -> $t {
                <$t>::from_f32(x)
            }
            #[inline(always)]
            fn as_f32<'a>(src: &'a [$t], scratch: &'a mut Vec<f32>) -> &'a [f32] {
                scratch.clear();
                scratch.extend(src.iter().map(|x| x.to_f32()));
                scratch
            }
        }
    };
}
half_elem!(bf16);
half_elem!(f16);

/// Shapes of one call: q/o are `(b, heads, t, d)`, k/v `(b, kv_heads, t, d)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    /// Batch rows.
    pub b: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Sequence length.
    pub t: usize,
    /// Head dimension.
    pub d: usize,
}

impl Dims {
    fn rep(&self) -> usize {
        self.heads / self.kv_heads
    }
}

// ---------------------------------------------------------------------------------------------
// Forward.

/// What one forward task reads: one (batch row, head) and the position table of its row.
struct FwdTask<'a, T> {
    q_head: &'a [T],
    k_head: &'a [T],
    v_head: &'a [T],
    table: &'a [(u32, u32)],
    q0: usize,
    d: usize,
    scale: f32,
}

/// Forward of all heads. `out` `(b, heads, t, d)` and `lse` `(b, heads, t)` are written in
/// full; rows outside every segment get zeros and `L = +inf`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward<T: Elem>(
    q: &[T],
    k: &[T],
    v: &[T],
    dims: Dims,
    table: &[Vec<(u32, u32)>],
    scale: f32,
    out: &mut [T],
    lse: &mut [f32],
) {
    let Dims {
        heads,
        kv_heads,
        t,
        d,
        ..
    } = dims;
    if t == 0 || d == 0 {
        lse.fill(f32::INFINITY);
        return;
    }
    let isa = detect_isa();
    let rep = dims.rep();
    out.par_chunks_mut(t * d)
        .zip(lse.par_chunks_mut(t))
        .enumerate()
        .for_each(|(bh, (o_head, l_head))| {
            let (row, h) = (bh / heads, bh % heads);
            let kv = (row * kv_heads + h / rep) * t * d;
            let head = FwdTask {
                q_head: &q[bh * t * d..(bh + 1) * t * d],
                k_head: &k[kv..kv + t * d],
                v_head: &v[kv..kv + t * d],
                table: &table[row],
                q0: 0,
                d,
                scale,
            };
            o_head
                .par_chunks_mut(BLOCK_Q * d)
                .zip(l_head.par_chunks_mut(BLOCK_Q))
                .enumerate()
                .for_each(|(qb, (o_blk, l_blk))| {
                    let task = FwdTask {
                        q0: qb * BLOCK_Q,
                        ..head
                    };
                    match isa {
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: `Isa::Avx2Fma` is only returned by `detect_isa` after
                        // `is_x86_feature_detected!` confirmed AVX2 and FMA on this CPU.
                        Isa::Avx2Fma => unsafe { forward_block_avx2(&task, o_blk, l_blk) },
                        Isa::Generic => forward_block::<T, false>(&task, o_blk, l_blk),
                    }
                });
        });
}

/// [`forward_block`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn forward_block_avx2<T: Elem>(task: &FwdTask<'_, T>, out: &mut [T], lse: &mut [f32]) {
    forward_block::<T, true>(task, out, lse)
}

/// One block of `out.len() / d` queries starting at `task.q0`.
#[inline(always)]
fn forward_block<T: Elem, const FMA: bool>(task: &FwdTask<'_, T>, out: &mut [T], lse: &mut [f32]) {
    let (d, q0) = (task.d, task.q0);
    let nq = lse.len();
    // Query q0 + r sees keys [segment start, q0 + r] (none outside every segment).
    let visible: Vec<(usize, usize)> = task.table[q0..q0 + nq]
        .iter()
        .enumerate()
        .map(|(r, &(start, _))| {
            if start == OUTSIDE {
                (0, 0)
            } else {
                (start as usize, q0 + r + 1)
            }
        })
        .collect();
    let mut q_buf = Vec::new();
    let q_blk = T::as_f32(&task.q_head[q0 * d..(q0 + nq) * d], &mut q_buf);
    let keys = ContiguousKeys {
        k: task.k_head,
        v: task.v_head,
        d,
    };
    attend_block::<T, _, FMA>(q_blk, &visible, &keys, d, task.scale, out, lse);
}

/// Where [`attend_block`] reads the keys and values of a tile: `(nk, d)` each as f32, for keys
/// `k0..k0 + nk` (positions in the key sequence), converted into the scratch vectors or
/// borrowed.
pub(crate) trait KeyTiles {
    fn tile<'s>(
        &'s self,
        k0: usize,
        nk: usize,
        k_buf: &'s mut Vec<f32>,
        v_buf: &'s mut Vec<f32>,
    ) -> (&'s [f32], &'s [f32]);
}

/// Keys and values of one head, contiguous `(t, d)`.
struct ContiguousKeys<'a, T> {
    k: &'a [T],
    v: &'a [T],
    d: usize,
}

impl<T: Elem> KeyTiles for ContiguousKeys<'_, T> {
    #[inline(always)]
    fn tile<'s>(
        &'s self,
        k0: usize,
        nk: usize,
        k_buf: &'s mut Vec<f32>,
        v_buf: &'s mut Vec<f32>,
    ) -> (&'s [f32], &'s [f32]) {
        let (a, b) = (k0 * self.d, (k0 + nk) * self.d);
        (
            T::as_f32(&self.k[a..b], k_buf),
            T::as_f32(&self.v[a..b], v_buf),
        )
    }
}

/// [`attend_block`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn attend_block_avx2<T: Elem, K: KeyTiles>(
    q_blk: &[f32],
    visible: &[(usize, usize)],
    keys: &K,
    d: usize,
    scale: f32,
    out: &mut [T],
    lse: &mut [f32],
) {
    attend_block::<T, K, true>(q_blk, visible, keys, d, scale, out, lse)
}

/// Attention of one block of queries, `q_blk` `(nq, d)` (f32, unscaled), row `r` seeing the keys
/// `visible[r]` (`[a, e)`; `a >= e`: none) of `keys`, scores multiplied by `scale`: writes
/// `out` `(nq, d)` (zero for a row that sees nothing) and `lse` `(nq)` (`+inf` for those). Tiles
/// of [`FWD_BLOCK_K`] keys over the block's visible range, each as two matrix products with the
/// online softmax between them.
#[inline(always)]
pub(crate) fn attend_block<T: Elem, K: KeyTiles, const FMA: bool>(
    q_blk: &[f32],
    visible: &[(usize, usize)],
    keys: &K,
    d: usize,
    scale: f32,
    out: &mut [T],
    lse: &mut [f32],
) {
    let nq = visible.len();
    // The keys any row of the block sees.
    let mut lo = usize::MAX;
    let mut hi = 0;
    for &(a, e) in visible {
        if a < e {
            lo = lo.min(a);
            hi = hi.max(e);
        }
    }
    if hi == 0 {
        out.fill(T::from_f32(0.0));
        lse.fill(f32::INFINITY);
        return;
    }
    let (mut k_buf, mut v_buf) = (Vec::new(), Vec::new());
    let mut m = vec![f32::NEG_INFINITY; nq];
    let mut l = vec![0f32; nq];
    let mut acc = vec![0f32; nq * d];
    // Scores, then probabilities, of the block's queries against one tile of keys.
    let mut p = vec![0f32; nq * FWD_BLOCK_K];
    let mut k0 = lo;
    while k0 < hi {
        let nk = FWD_BLOCK_K.min(hi - k0);
        let (k_t, v_t) = keys.tile(k0, nk, &mut k_buf, &mut v_buf);
        let p = &mut p[..nq * nk];
        // S = Q_blk · K_tileᵀ · scale, (nq, nk), as one matrix product.
        // SAFETY: the pointers and strides describe `q_blk` (nq, d), `k_t` read as (d, nk)
        // and `p` (nq, nk), all in bounds; nothing else aliases `p`.
        unsafe {
            gemm::gemm(
                nq,
                nk,
                d,
                p.as_mut_ptr(),
                1,
                nk as isize,
                false,
                q_blk.as_ptr(),
                1,
                d as isize,
                k_t.as_ptr(),
                d as isize,
                1,
                0.0,
                scale,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
        let mut any = false;
        for (r, (&(va, ve), p_r)) in visible.iter().zip(p.chunks_exact_mut(nk)).enumerate() {
            // Visible keys of this row in this tile: [max(a, k0), min(e, k0 + nk)).
            let a = va.max(k0);
            let e = ve.min(k0 + nk);
            if a >= e {
                p_r.fill(0.0);
                continue;
            }
            any = true;
            let (a, e) = (a - k0, e - k0);
            let tile_max = p_r[a..e].iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let m_new = m[r].max(tile_max);
            if m_new > m[r] && l[r] > 0.0 {
                let correction = fast_exp::<FMA>(m[r] - m_new);
                l[r] *= correction;
                for x in acc[r * d..(r + 1) * d].iter_mut() {
                    *x *= correction;
                }
            }
            m[r] = m_new;
            p_r[..a].fill(0.0);
            p_r[e..].fill(0.0);
            let mut sum = 0f32;
            for x in p_r[a..e].iter_mut() {
                *x = fast_exp::<FMA>(*x - m_new);
                sum += *x;
            }
            l[r] += sum;
        }
        if any {
            // acc += P · V_tile, (nq, d).
            // SAFETY: `p` (nq, nk), `v_t` (nk, d) and `acc` (nq, d) as described, in bounds;
            // `acc` is not aliased.
            unsafe {
                gemm::gemm(
                    nq,
                    d,
                    nk,
                    acc.as_mut_ptr(),
                    1,
                    d as isize,
                    true,
                    p.as_ptr(),
                    1,
                    nk as isize,
                    v_t.as_ptr(),
                    1,
                    d as isize,
                    1.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        }
        k0 += nk;
    }
    for (r, ((o_r, acc_r), lse_r)) in out
        .chunks_exact_mut(d)
        .zip(acc.chunks_exact(d))
        .zip(lse.iter_mut())
        .enumerate()
    {
        if l[r] > 0.0 {
            let inv = 1.0 / l[r];
            for (o, &a) in o_r.iter_mut().zip(acc_r) {
                *o = T::from_f32(a * inv);
            }
            *lse_r = m[r] + l[r].ln();
        } else {
            o_r.fill(T::from_f32(0.0));
            *lse_r = f32::INFINITY;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Backward.

/// What one backward task reads: one (batch row, kv head) and its `rep` query heads.
struct BwdTask<'a, T> {
    /// `(rep, t, d)` each.
    q: &'a [T],
    o: &'a [T],
    d_o: &'a [T],
    /// `(rep, t)`.
    lse: &'a [f32],
    /// `(t, d)` each.
    k: &'a [T],
    v: &'a [T],
    table: &'a [(u32, u32)],
    rep: usize,
    t: usize,
    d: usize,
    scale: f32,
}

/// Backward of all heads: `dq` `(b, heads, t, d)`, `dk`/`dv` `(b, kv_heads, t, d)` are written
/// in full (zero where nothing attends).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Elem>(
    q: &[T],
    k: &[T],
    v: &[T],
    o: &[T],
    d_o: &[T],
    lse: &[f32],
    dims: Dims,
    table: &[Vec<(u32, u32)>],
    scale: f32,
    dq: &mut [T],
    dk: &mut [T],
    dv: &mut [T],
) {
    let Dims { kv_heads, t, d, .. } = dims;
    if t == 0 || d == 0 {
        return;
    }
    let isa = detect_isa();
    let rep = dims.rep();
    let group = rep * t * d;
    dq.par_chunks_mut(group)
        .zip(dk.par_chunks_mut(t * d))
        .zip(dv.par_chunks_mut(t * d))
        .enumerate()
        .for_each(|(bg, ((dq_g, dk_h), dv_h))| {
            // The query heads of kv head `bg % kv_heads` are contiguous: `bg * rep ..`.
            let row = bg / kv_heads;
            let task = BwdTask {
                q: &q[bg * group..(bg + 1) * group],
                o: &o[bg * group..(bg + 1) * group],
                d_o: &d_o[bg * group..(bg + 1) * group],
                lse: &lse[bg * rep * t..(bg + 1) * rep * t],
                k: &k[bg * t * d..(bg + 1) * t * d],
                v: &v[bg * t * d..(bg + 1) * t * d],
                table: &table[row],
                rep,
                t,
                d,
                scale,
            };
            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Isa::Avx2Fma` is only returned by `detect_isa` after
                // `is_x86_feature_detected!` confirmed AVX2 and FMA on this CPU.
                Isa::Avx2Fma => unsafe { backward_group_avx2(&task, dq_g, dk_h, dv_h) },
                Isa::Generic => backward_group::<T, false>(&task, dq_g, dk_h, dv_h),
            }
        });
}

/// [`backward_group`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn backward_group_avx2<T: Elem>(
    task: &BwdTask<'_, T>,
    dq: &mut [T],
    dk: &mut [T],
    dv: &mut [T],
) {
    backward_group::<T, true>(task, dq, dk, dv)
}

/// The gradients of one kv head and its query heads.
#[inline(always)]
fn backward_group<T: Elem, const FMA: bool>(
    task: &BwdTask<'_, T>,
    dq: &mut [T],
    dk: &mut [T],
    dv: &mut [T],
) {
    let (rep, t, d) = (task.rep, task.t, task.d);
    // 1. D = rowsum(dO ∘ O), one per query row of the group.
    let delta: Vec<f32> = task
        .o
        .chunks_exact(d)
        .zip(task.d_o.chunks_exact(d))
        .map(|(o, g)| {
            o.iter()
                .zip(g)
                .map(|(&o, &g)| o.to_f32() * g.to_f32())
                .sum()
        })
        .collect();
    let mut dq_acc = vec![0f32; rep * t * d];
    let mut dk_acc = vec![0f32; BLOCK_K * d];
    let mut dv_acc = vec![0f32; BLOCK_K * d];
    let (mut k_buf, mut v_buf, mut q_buf, mut g_buf) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut p_tile = vec![0f32; BLOCK_Q * BLOCK_K];
    let mut ds_tile = vec![0f32; BLOCK_Q * BLOCK_K];
    // 2. Key tiles; each accumulates its dK/dV over every query that sees it.
    for (kb, (dk_blk, dv_blk)) in dk
        .chunks_mut(BLOCK_K * d)
        .zip(dv.chunks_mut(BLOCK_K * d))
        .enumerate()
    {
        let k0 = kb * BLOCK_K;
        let nk = dk_blk.len() / d;
        // Queries that see a key of this tile: from k0 to the end of the last key's segment.
        let q_hi = task.table[k0..k0 + nk]
            .iter()
            .filter(|(start, _)| *start != OUTSIDE)
            .map(|&(_, end)| end as usize)
            .max();
        let Some(q_hi) = q_hi else {
            dk_blk.fill(T::from_f32(0.0));
            dv_blk.fill(T::from_f32(0.0));
            continue;
        };
        let k_t = T::as_f32(&task.k[k0 * d..(k0 + nk) * d], &mut k_buf);
        let v_t = T::as_f32(&task.v[k0 * d..(k0 + nk) * d], &mut v_buf);
        let dk_acc = &mut dk_acc[..nk * d];
        let dv_acc = &mut dv_acc[..nk * d];
        dk_acc.fill(0.0);
        dv_acc.fill(0.0);
        for h in 0..rep {
            let mut q0 = k0;
            while q0 < q_hi {
                let nq = BLOCK_Q.min(q_hi - q0);
                let rows = h * t + q0..h * t + q0 + nq;
                let q_t = T::as_f32(&task.q[rows.start * d..rows.end * d], &mut q_buf);
                let g_t = T::as_f32(&task.d_o[rows.start * d..rows.end * d], &mut g_buf);
                let dq_t = &mut dq_acc[rows.start * d..rows.end * d];
                // 2a. S = Q Kᵀ · scale and dP = dO Vᵀ as matrix products into (nq, nk) tiles;
                //     then row by row P = exp(S - L) and dS = P ∘ (dP − D) · scale (the scale
                //     of S), zero where a key is invisible.
                let p_t = &mut p_tile[..nq * nk];
                let ds_t = &mut ds_tile[..nq * nk];
                // SAFETY: the slices hold the shapes given; the destinations alias no operand.
                unsafe {
                    tile_product(
                        p_t,
                        (nq, nk),
                        false,
                        q_t,
                        (1, d),
                        k_t,
                        (d, 1),
                        d,
                        task.scale,
                    );
                    tile_product(ds_t, (nq, nk), false, g_t, (1, d), v_t, (d, 1), d, 1.0);
                }
                let mut any = false;
                for (r, (p, ds)) in p_t
                    .chunks_exact_mut(nk)
                    .zip(ds_t.chunks_exact_mut(nk))
                    .enumerate()
                {
                    let i = q0 + r;
                    let (start, _) = task.table[i];
                    let a = if start == OUTSIDE {
                        k0 + nk
                    } else {
                        (start as usize).max(k0)
                    };
                    let e = (i + 1).min(k0 + nk);
                    if a >= e {
                        p.fill(0.0);
                        ds.fill(0.0);
                        continue;
                    }
                    any = true;
                    let (a, e) = (a - k0, e - k0);
                    let (lse_i, delta_i) = (task.lse[rows.start + r], delta[rows.start + r]);
                    p[..a].fill(0.0);
                    p[e..].fill(0.0);
                    ds[..a].fill(0.0);
                    ds[e..].fill(0.0);
                    if start as usize == i {
                        // The first query of a segment sees one key: its softmax has a zero
                        // gradient (dP − D is rounding noise there, dP and D being summed in
                        // different orders).
                        p[a..e].fill(1.0);
                        ds[a..e].fill(0.0);
                        continue;
                    }
                    for (p, ds) in p[a..e].iter_mut().zip(ds[a..e].iter_mut()) {
                        *p = fast_exp::<FMA>(*p - lse_i);
                        *ds = *p * (*ds - delta_i) * task.scale;
                    }
                }
                // 2b. dQ += dS K, dV += Pᵀ dO, dK += dSᵀ Q.
                if any {
                    // SAFETY: as in 2a.
                    unsafe {
                        tile_product(dq_t, (nq, d), true, ds_t, (1, nk), k_t, (1, d), nk, 1.0);
                        tile_product(dv_acc, (nk, d), true, p_t, (nk, 1), g_t, (1, d), nq, 1.0);
                        tile_product(dk_acc, (nk, d), true, ds_t, (nk, 1), q_t, (1, d), nq, 1.0);
                    }
                }
                q0 += nq;
            }
        }
        for (out, &x) in dk_blk.iter_mut().zip(dk_acc.iter()) {
            *out = T::from_f32(x);
        }
        for (out, &x) in dv_blk.iter_mut().zip(dv_acc.iter()) {
            *out = T::from_f32(x);
        }
    }
    for (out, &x) in dq.iter_mut().zip(&dq_acc) {
        *out = T::from_f32(x);
    }
}
