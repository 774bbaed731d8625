//! The CPU kernel of [`super::paged_attention`]: parallel over (row, kv head); each task keeps
//! the `rep` query heads of its group in f32 and walks the row's blocks once with an online
//! softmax, scoring a block's keys for every head of the group before reading its values.

use rayon::prelude::*;

use super::{PageTable, BLOCK_TOKENS};
use crate::model::flash_attn::Elem;

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
    out.par_chunks_mut(rep * d)
        .enumerate()
        .for_each(|(task, out)| {
            let (r, g) = (task / kv_heads, task % kv_heads);
            let len = table.lens()[r] as usize;
            // The group's queries, pre-scaled: (rep, d).
            let q0 = (r * heads + g * rep) * d;
            let qf: Vec<f32> = q[q0..q0 + rep * d]
                .iter()
                .map(|x| x.to_f32() * scale)
                .collect();
            let mut m = vec![f32::NEG_INFINITY; rep];
            let mut l = vec![0f32; rep];
            let mut acc = vec![0f32; rep * d];
            let mut scores = vec![0f32; rep * BLOCK_TOKENS];
            let mut kbuf = Vec::new();
            let mut vbuf = Vec::new();
            for b in 0..len.div_ceil(BLOCK_TOKENS) {
                let start = b * BLOCK_TOKENS;
                let n = BLOCK_TOKENS.min(len - start);
                let base = table.pool_row(r, start);
                // 1. Scores of the block's keys for every head of the group.
                for j in 0..n {
                    let off = ((base + j) * kv_heads + g) * d;
                    let kr = T::as_f32(&k[off..off + d], &mut kbuf);
                    for h in 0..rep {
                        scores[h * BLOCK_TOKENS + j] = dot(&qf[h * d..(h + 1) * d], kr);
                    }
                }
                // 2. Online softmax: rescale what came before, exponentiate the block.
                for h in 0..rep {
                    let s = &mut scores[h * BLOCK_TOKENS..h * BLOCK_TOKENS + n];
                    let mx = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let m_new = m[h].max(mx);
                    let corr = if m[h] == f32::NEG_INFINITY {
                        0.0
                    } else {
                        (m[h] - m_new).exp()
                    };
                    let mut sum = 0f32;
                    for x in s.iter_mut() {
                        *x = (*x - m_new).exp();
                        sum += *x;
                    }
                    l[h] = l[h] * corr + sum;
                    m[h] = m_new;
                    if corr != 1.0 {
                        acc[h * d..(h + 1) * d].iter_mut().for_each(|a| *a *= corr);
                    }
                }
                // 3. The values, weighted.
                for j in 0..n {
                    let off = ((base + j) * kv_heads + g) * d;
                    let vr = T::as_f32(&v[off..off + d], &mut vbuf);
                    for h in 0..rep {
                        let p = scores[h * BLOCK_TOKENS + j];
                        axpy(&mut acc[h * d..(h + 1) * d], p, vr);
                    }
                }
            }
            for h in 0..rep {
                let inv = 1.0 / l[h];
                for (o, a) in out[h * d..(h + 1) * d].iter_mut().zip(&acc[h * d..]) {
                    *o = T::from_f32(a * inv);
                }
            }
        });
}

/// `Σ a·b` with eight partial sums (vectorisable).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut s = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            s[i] += x[i] * y[i];
        }
    }
    let mut t = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (x, y) in ra.iter().zip(rb) {
        t += x * y;
    }
    t
}

/// `acc += p · x`.
#[inline]
fn axpy(acc: &mut [f32], p: f32, x: &[f32]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a += p * b;
    }
}
