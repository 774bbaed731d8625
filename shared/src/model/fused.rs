//! Fused CPU kernels, with backward, for chains that the training forward otherwise runs as
//! several candle ops, each a full pass over memory (and a fresh allocation):
//!
//! - [`rms_norm`]: `x / sqrt(mean(x²) + eps) * w` (unfused: 7 ops forward, about 15 in
//!   backward);
//! - [`swiglu`]: `silu(gate) * up` (unfused: 2 ops forward, 6 in backward);
//! - [`rotary_heads_first`]: rotary embeddings while moving the heads first (unfused: a
//!   transposing copy and 8 ops forward, about as many in backward);
//! - [`row_logprobs`] / [`logprob_grad`]: the log-softmax gather of one chunk of LM-head logits
//!   and its gradient (unfused: 6 and 7 passes over the `rows × vocab` chunk), and
//!   [`logprobs_into_grad`], both at once in the chunk's own buffer (one exp per logit);
//! - [`linear`]: `x · wᵀ` as one product reading the weight in place (unfused: two reshapes,
//!   a transpose and a matmul, each summed into a zeroed gradient buffer in backward);
//! - [`tile_product`] (on the calling thread) and [`add_transposed_product`]: matrix products
//!   into a destination slice through the `gemm` crate, for the fused attention's tiles and
//!   the LM head weight's gradient.
//!
//! f32 on the CPU only: callers check [`applies`] and keep the unfused path elsewhere (bf16,
//! CUDA), which is also the reference these are tested against (the tests below: values and
//! gradients to 1e-6 relative).
//!
//! Work is split into fixed-size tasks (independent of the thread count) and every reduction
//! across tasks is summed in task order, so results are the same bits with any number of
//! threads.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::simd::{detect_isa, exp_sum_in_place, fast_exp, madd, row_max, sum_exp, Isa};

/// Elements per parallel task of the elementwise kernels.
const TASK: usize = 1 << 14;

/// Whether the fused kernels apply: every tensor f32 on the CPU.
pub(crate) fn applies(tensors: &[&Tensor]) -> bool {
    tensors
        .iter()
        .all(|t| t.device().is_cpu() && t.dtype() == DType::F32)
}

/// The f32 elements of a contiguous CPU tensor.
fn f32s<'a>(op: &str, what: &str, s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(data) = s else {
        candle_core::bail!("{op}: {what} must be f32, got {:?}", s.dtype())
    };
    match l.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => candle_core::bail!("{op}: {what} is not contiguous"),
    }
}

/// The gradients of `a` and `b` from one flat buffer a backward kernel wrote them into (`a`'s
/// elements, then `b`'s), as views of it.
fn split_gradients(
    both: &Tensor,
    a: &Tensor,
    b: &Tensor,
) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
    let n = a.elem_count();
    let da = both.narrow(0, 0, n)?.reshape(a.shape())?;
    let db = both.narrow(0, n, b.elem_count())?.reshape(b.shape())?;
    Ok((Some(da), Some(db)))
}

/// Rows per task for rows of `width` elements.
fn rows_per_task(width: usize) -> usize {
    (TASK / width.max(1)).max(1)
}

/// `x / sqrt(mean(x²) + eps) * w` over the last dimension of `x` (f32, CPU); `w` has that
/// dimension's length. Differentiable in `x` and `w`.
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    x.contiguous()?
        .apply_op2(&w.contiguous()?, RmsNorm { eps: eps as f32 })
}

struct RmsNorm {
    eps: f32,
}

/// `sqrt(mean(x²) + eps)` of one row, summed in order as candle's `mean_keepdim` does.
fn rms(row: &[f32], eps: f32) -> f32 {
    let sq: f32 = row.iter().map(|v| v * v).sum();
    (sq / row.len() as f32 + eps).sqrt()
}

/// Checks `x`'s last dimension against `w` and returns it.
fn norm_width(op: &str, lx: &Layout, lw: &Layout) -> candle_core::Result<usize> {
    let h = lw.shape().elem_count();
    if lx.dims().last() != Some(&h) || lw.dims().len() != 1 {
        candle_core::bail!(
            "{op}: x {:?} and weight {:?} do not fit (weight is the last dimension)",
            lx.dims(),
            lw.dims()
        );
    }
    Ok(h)
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "fused-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let op = self.name();
        let h = norm_width(op, l1, l2)?;
        let (x, w) = (f32s(op, "x", s1, l1)?, f32s(op, "weight", s2, l2)?);
        let mut y = vec![0f32; x.len()];
        let chunk = rows_per_task(h) * h;
        y.par_chunks_mut(chunk)
            .zip(x.par_chunks(chunk))
            .for_each(|(yc, xc)| {
                for (yr, xr) in yc.chunks_mut(h).zip(xc.chunks(h)) {
                    let s = rms(xr, self.eps);
                    for ((y, &x), &w) in yr.iter_mut().zip(xr).zip(w) {
                        *y = x / s * w;
                    }
                }
            });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        // One kernel writes dx and dw into one buffer; dx is a view of it. dw is copied out: a
        // parameter's gradient lives until the end of backward (candle stores the first
        // gradient as it is, vendor/README.md), and a view would keep the (rows × h) buffer
        // alive with it.
        let both = x.apply_op3_no_bwd(w, &dy.contiguous()?, &RmsNormBwd { eps: self.eps })?;
        let (dx, dw) = split_gradients(&both, x, w)?;
        Ok((dx, dw.map(|dw| dw.force_contiguous()).transpose()?))
    }
}

/// The gradients of [`RmsNorm`], `(x, w, dy) -> [dx (x's elements), dw (h)]` flat.
///
/// With `r = 1/sqrt(mean(x²) + eps)`, `x̂ = x·r`, `g = dy ⊙ w`:
/// `dx = r·(g − x̂·mean(g ⊙ x̂))`, `dw = Σ_rows dy ⊙ x̂`.
struct RmsNormBwd {
    eps: f32,
}

impl CustomOp3 for RmsNormBwd {
    fn name(&self) -> &'static str {
        "fused-rms-norm-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let op = self.name();
        let h = norm_width(op, l1, l2)?;
        let (x, w) = (f32s(op, "x", s1, l1)?, f32s(op, "weight", s2, l2)?);
        let dy = f32s(op, "dy", s3, l3)?;
        if dy.len() != x.len() {
            candle_core::bail!("{op}: dy {:?} is not x's shape {:?}", l3.dims(), l1.dims());
        }
        let n = x.len();
        let mut out = vec![0f32; n + h];
        let (dx, dw) = out.split_at_mut(n);
        let chunk = rows_per_task(h) * h;
        // Each task's share of dw, summed below in task order.
        let partial: Vec<Vec<f32>> = dx
            .par_chunks_mut(chunk)
            .zip(x.par_chunks(chunk))
            .zip(dy.par_chunks(chunk))
            .map(|((dxc, xc), dyc)| {
                let mut dw = vec![0f32; h];
                for ((dxr, xr), dyr) in dxc.chunks_mut(h).zip(xc.chunks(h)).zip(dyc.chunks(h)) {
                    let r = 1.0 / rms(xr, self.eps);
                    let dot: f32 = xr
                        .iter()
                        .zip(dyr)
                        .zip(w)
                        .map(|((&x, &dy), &w)| dy * w * x * r)
                        .sum();
                    let c = dot / h as f32;
                    for j in 0..h {
                        let xh = xr[j] * r;
                        dxr[j] = r * (dyr[j] * w[j] - xh * c);
                        dw[j] += dyr[j] * xh;
                    }
                }
                dw
            })
            .collect();
        for p in partial {
            for (d, v) in dw.iter_mut().zip(p) {
                *d += v;
            }
        }
        Ok((CpuStorage::F32(out), Shape::from(n + h)))
    }
}

/// `silu(gate) * up` elementwise (f32, CPU, same shapes). Differentiable in both.
pub(crate) fn swiglu(gate: &Tensor, up: &Tensor) -> candle_core::Result<Tensor> {
    gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu)
}

struct SwiGlu;

/// `silu(g) · u` for a chunk, with the polynomial exp (vectorised).
#[inline(always)]
fn swiglu_chunk<const FMA: bool>(y: &mut [f32], g: &[f32], u: &[f32]) {
    for ((y, &g), &u) in y.iter_mut().zip(g).zip(u) {
        *y = g / (1.0 + fast_exp::<FMA>(-g)) * u;
    }
}

/// [`swiglu_chunk`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_chunk_avx2(y: &mut [f32], g: &[f32], u: &[f32]) {
    swiglu_chunk::<true>(y, g, u)
}

/// The gradients of `silu(g) · u` for a chunk: with `s = sigmoid(g)`,
/// `dg = dy·u·s·(1 + g·(1 − s))`, `du = dy·g·s`.
#[inline(always)]
fn swiglu_grad_chunk<const FMA: bool>(
    dg: &mut [f32],
    du: &mut [f32],
    g: &[f32],
    u: &[f32],
    dy: &[f32],
) {
    let inputs = g.iter().zip(u).zip(dy);
    for ((dg, du), ((&g, &u), &dy)) in dg.iter_mut().zip(du.iter_mut()).zip(inputs) {
        let s = 1.0 / (1.0 + fast_exp::<FMA>(-g));
        *dg = dy * u * s * (1.0 + g * (1.0 - s));
        *du = dy * (g * s);
    }
}

/// [`swiglu_grad_chunk`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_grad_chunk_avx2(dg: &mut [f32], du: &mut [f32], g: &[f32], u: &[f32], dy: &[f32]) {
    swiglu_grad_chunk::<true>(dg, du, g, u, dy)
}

fn same_shape(op: &str, l1: &Layout, l2: &Layout) -> candle_core::Result<()> {
    if l1.dims() != l2.dims() {
        candle_core::bail!("{op}: shapes {:?} and {:?} differ", l1.dims(), l2.dims());
    }
    Ok(())
}

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "fused-swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let op = self.name();
        same_shape(op, l1, l2)?;
        let (g, u) = (f32s(op, "gate", s1, l1)?, f32s(op, "up", s2, l2)?);
        let mut y = vec![0f32; g.len()];
        let isa = detect_isa();
        y.par_chunks_mut(TASK)
            .zip(g.par_chunks(TASK))
            .zip(u.par_chunks(TASK))
            .for_each(|((yc, gc), uc)| match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `detect_isa` returned AVX2 + FMA after checking this CPU.
                Isa::Avx2Fma => unsafe { swiglu_chunk_avx2(yc, gc, uc) },
                Isa::Generic => swiglu_chunk::<false>(yc, gc, uc),
            });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        g: &Tensor,
        u: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let both = g.apply_op3_no_bwd(u, &dy.contiguous()?, &SwiGluBwd)?;
        split_gradients(&both, g, u)
    }
}

/// The gradients of [`SwiGlu`], `(g, u, dy) -> [dg, du]` flat: with `s = sigmoid(g)`,
/// `dg = dy·u·s·(1 + g·(1 − s))`, `du = dy·silu(g)`.
struct SwiGluBwd;

impl CustomOp3 for SwiGluBwd {
    fn name(&self) -> &'static str {
        "fused-swiglu-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let op = self.name();
        same_shape(op, l1, l2)?;
        same_shape(op, l1, l3)?;
        let (g, u) = (f32s(op, "gate", s1, l1)?, f32s(op, "up", s2, l2)?);
        let dy = f32s(op, "dy", s3, l3)?;
        let n = g.len();
        let mut out = vec![0f32; 2 * n];
        let (dg, du) = out.split_at_mut(n);
        let isa = detect_isa();
        dg.par_chunks_mut(TASK)
            .zip(du.par_chunks_mut(TASK))
            .zip(g.par_chunks(TASK).zip(u.par_chunks(TASK)))
            .zip(dy.par_chunks(TASK))
            .for_each(|(((dgc, duc), (gc, uc)), dyc)| match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `detect_isa` returned AVX2 + FMA after checking this CPU.
                Isa::Avx2Fma => unsafe { swiglu_grad_chunk_avx2(dgc, duc, gc, uc, dyc) },
                Isa::Generic => swiglu_grad_chunk::<false>(dgc, duc, gc, uc, dyc),
            });
        Ok((CpuStorage::F32(out), Shape::from(2 * n)))
    }
}

/// Rotary embeddings ("rotate half", as transformers) applied while moving the heads first:
/// `x` `(b, s, heads, d)` → `(b, heads, s, d)`, with `cos`/`sin` `(b, 1, s, d / 2)` (f32,
/// CPU). Differentiable in `x` (the tables are constants). Unfused: a transposing copy, two
/// narrows, four products, a difference, a sum and a concatenation.
pub(crate) fn rotary_heads_first(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
) -> candle_core::Result<Tensor> {
    x.contiguous()?
        .apply_op3(&cos.contiguous()?, &sin.contiguous()?, Rotary)
}

struct Rotary;

/// `(b, s, heads, d)` and `half` from `x` and the tables, checked.
fn rotary_dims(
    op: &str,
    x: &[usize],
    cos: &Layout,
    sin: &Layout,
) -> candle_core::Result<(usize, usize, usize, usize)> {
    let &[b, s, h, d] = x else {
        candle_core::bail!("{op}: x {x:?} is not (b, s, heads, head_dim)")
    };
    if d % 2 != 0 || cos.dims() != [b, 1, s, d / 2] || sin.dims() != cos.dims() {
        candle_core::bail!(
            "{op}: tables {:?}/{:?} do not fit x {x:?} (want (b, 1, s, head_dim / 2))",
            cos.dims(),
            sin.dims()
        );
    }
    Ok((b, s, h, d))
}

impl CustomOp3 for Rotary {
    fn name(&self) -> &'static str {
        "fused-rotary"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (b, s, h, d) = rotary_dims(op, l1.dims(), l2, l3)?;
        let x = f32s(op, "x", s1, l1)?;
        let (cos, sin) = (f32s(op, "cos", s2, l2)?, f32s(op, "sin", s3, l3)?);
        let half = d / 2;
        let mut y = vec![0f32; x.len()];
        // One task per (row, head): its (s, d) block of the output.
        y.par_chunks_mut((s * d).max(1))
            .enumerate()
            .for_each(|(bh, out)| {
                let (bi, hi) = (bh / h, bh % h);
                for t in 0..s {
                    let src = &x[((bi * s + t) * h + hi) * d..][..d];
                    let c = &cos[(bi * s + t) * half..][..half];
                    let sn = &sin[(bi * s + t) * half..][..half];
                    let (o1, o2) = out[t * d..(t + 1) * d].split_at_mut(half);
                    let (x1, x2) = src.split_at(half);
                    for j in 0..half {
                        o1[j] = x1[j] * c[j] - x2[j] * sn[j];
                        o2[j] = x2[j] * c[j] + x1[j] * sn[j];
                    }
                }
            });
        Ok((CpuStorage::F32(y), Shape::from((b, h, s, d))))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dx = dy.contiguous()?.apply_op3_no_bwd(cos, sin, &RotaryBwd)?;
        Ok((Some(dx), None, None))
    }
}

/// The gradient of [`Rotary`]: `dy` `(b, heads, s, d)` rotated back and moved to
/// `(b, s, heads, d)`: `dx1 = dy1·cos + dy2·sin`, `dx2 = dy2·cos − dy1·sin`.
struct RotaryBwd;

impl CustomOp3 for RotaryBwd {
    fn name(&self) -> &'static str {
        "fused-rotary-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let op = self.name();
        let &[b, h, s, d] = l1.dims() else {
            candle_core::bail!("{op}: dy {:?} is not (b, heads, s, head_dim)", l1.dims())
        };
        rotary_dims(op, &[b, s, h, d], l2, l3)?;
        let dy = f32s(op, "dy", s1, l1)?;
        let (cos, sin) = (f32s(op, "cos", s2, l2)?, f32s(op, "sin", s3, l3)?);
        let half = d / 2;
        let mut dx = vec![0f32; dy.len()];
        // One task per (row, position): its (heads, d) block of the gradient.
        dx.par_chunks_mut((h * d).max(1))
            .enumerate()
            .for_each(|(bt, out)| {
                let (bi, t) = (bt / s, bt % s);
                let c = &cos[bt * half..][..half];
                let sn = &sin[bt * half..][..half];
                for hi in 0..h {
                    let g = &dy[((bi * h + hi) * s + t) * d..][..d];
                    let (g1, g2) = g.split_at(half);
                    let (o1, o2) = out[hi * d..(hi + 1) * d].split_at_mut(half);
                    for j in 0..half {
                        o1[j] = g1[j] * c[j] + g2[j] * sn[j];
                        o2[j] = g2[j] * c[j] - g1[j] * sn[j];
                    }
                }
            });
        Ok((CpuStorage::F32(dx), Shape::from((b, s, h, d))))
    }
}

/// For every row `i` of `z` `(n, vocab)` f32 (CPU): `[log_softmax(z_i)[targets_i], lse(z_i)]`,
/// `(n, 2)`. Not differentiable (the caller's backward uses [`logprob_grad`]).
pub(crate) fn row_logprobs(z: &Tensor, targets: &[u32]) -> candle_core::Result<Tensor> {
    z.contiguous()?.apply_op1_no_bwd(&RowLogprobs { targets })
}

struct RowLogprobs<'a> {
    targets: &'a [u32],
}

impl CustomOp1 for RowLogprobs<'_> {
    fn name(&self) -> &'static str {
        "fused-row-logprobs"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (n, vocab) = l.shape().dims2()?;
        let z = f32s(op, "logits", s, l)?;
        if self.targets.len() != n {
            candle_core::bail!("{op}: {} targets for {n} rows", self.targets.len());
        }
        if let Some(&t) = self.targets.iter().find(|&&t| t as usize >= vocab) {
            candle_core::bail!("{op}: target {t} outside the vocabulary of {vocab}");
        }
        let mut out = vec![0f32; 2 * n];
        let isa = detect_isa();
        out.par_chunks_mut(2)
            .zip(z.par_chunks(vocab.max(1)))
            .zip(self.targets.par_iter())
            .for_each(|((o, row), &t)| {
                // As the unfused path: shift by the max, log of the summed exps.
                let (max, log_sum) = match isa {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `detect_isa` returned AVX2 + FMA after checking this CPU.
                    Isa::Avx2Fma => unsafe { max_log_sum_avx2(row) },
                    Isa::Generic => max_log_sum::<false>(row),
                };
                o[0] = (row[t as usize] - max) - log_sum;
                o[1] = log_sum + max;
            });
        Ok((CpuStorage::F32(out), Shape::from((n, 2))))
    }
}

/// The gradient of the row log-probs with respect to a slice of the logits: for `z` `(n, len)`
/// holding vocabulary columns `v0..v0 + len`,
/// `dz_ij = g_i · (1[v0 + j = targets_i] − exp(z_ij − lse_i))`, f32 (CPU).
pub(crate) fn logprob_grad(
    z: &Tensor,
    v0: usize,
    targets: &[u32],
    lse: &[f32],
    g: &[f32],
) -> candle_core::Result<Tensor> {
    z.contiguous()?.apply_op1_no_bwd(&LogprobGrad {
        v0,
        targets,
        lse,
        g,
    })
}

struct LogprobGrad<'a> {
    v0: usize,
    targets: &'a [u32],
    lse: &'a [f32],
    g: &'a [f32],
}

impl CustomOp1 for LogprobGrad<'_> {
    fn name(&self) -> &'static str {
        "fused-logprob-grad"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (n, len) = l.shape().dims2()?;
        let z = f32s(op, "logits", s, l)?;
        if self.targets.len() != n || self.lse.len() != n || self.g.len() != n {
            candle_core::bail!(
                "{op}: {n} rows but {} targets, {} lse, {} gradients",
                self.targets.len(),
                self.lse.len(),
                self.g.len()
            );
        }
        let mut dz = vec![0f32; z.len()];
        let width = len.max(1);
        let isa = detect_isa();
        dz.par_chunks_mut(width)
            .zip(z.par_chunks(width))
            .enumerate()
            .for_each(|(i, (d, row))| {
                let (lse, g) = (self.lse[i], self.g[i]);
                match isa {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `detect_isa` returned AVX2 + FMA after checking this CPU.
                    Isa::Avx2Fma => unsafe { softmax_grad_avx2(d, row, lse, g) },
                    Isa::Generic => softmax_grad::<false>(d, row, lse, g),
                }
                let hit = (self.targets[i] as usize).wrapping_sub(self.v0);
                if let Some(d) = d.get_mut(hit) {
                    *d += g;
                }
            });
        Ok((CpuStorage::F32(dz), l.shape().clone()))
    }
}

/// `(max, ln Σ exp(row − max))` of one row of logits.
#[inline(always)]
fn max_log_sum<const FMA: bool>(row: &[f32]) -> (f32, f32) {
    let max = row_max(row);
    (max, sum_exp::<FMA>(row, max).ln())
}

/// [`max_log_sum`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn max_log_sum_avx2(row: &[f32]) -> (f32, f32) {
    max_log_sum::<true>(row)
}

/// `d_j = −g · exp(z_j − lse)`: the softmax part of a log-prob's gradient.
#[inline(always)]
fn softmax_grad<const FMA: bool>(d: &mut [f32], z: &[f32], lse: f32, g: f32) {
    for (d, &z) in d.iter_mut().zip(z) {
        *d = -g * fast_exp::<FMA>(z - lse);
    }
}

/// [`softmax_grad`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_grad_avx2(d: &mut [f32], z: &[f32], lse: f32, g: f32) {
    softmax_grad::<true>(d, z, lse, g)
}

/// For every row `i` of a chunk of LM-head logits `z` `(n, vocab)` (f32, CPU, contiguous, not
/// shared with another tensor): returns `log_softmax(z_i)[targets_i]` and overwrites the row
/// with the gradient of that log-prob, `1[j = targets_i] − softmax(z_i)_j`. One exp per logit
/// and no second `(n, vocab)` buffer: [`row_logprobs`] and [`logprob_grad`] in one pass.
pub(crate) fn logprobs_into_grad(z: &Tensor, targets: &[u32]) -> candle_core::Result<Vec<f32>> {
    let op = LogprobsIntoGrad {
        targets,
        out: std::sync::Mutex::new(Vec::new()),
    };
    z.inplace_op1(&op)?;
    op.out
        .into_inner()
        .map_err(|_| candle_core::Error::Msg("fused-logprobs-into-grad: poisoned".into()))
}

struct LogprobsIntoGrad<'a> {
    targets: &'a [u32],
    out: std::sync::Mutex<Vec<f32>>,
}

/// One row of [`logprobs_into_grad`]: its log-prob at `t`; the row becomes its gradient.
#[inline(always)]
fn logprob_into_grad<const FMA: bool>(row: &mut [f32], t: usize) -> f32 {
    let max = row_max(row);
    let picked = row[t];
    let sum = exp_sum_in_place::<FMA>(row, max);
    let inv = 1.0 / sum;
    for v in row.iter_mut() {
        *v = -(*v * inv);
    }
    row[t] += 1.0;
    (picked - max) - sum.ln()
}

/// [`logprob_into_grad`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn logprob_into_grad_avx2(row: &mut [f32], t: usize) -> f32 {
    logprob_into_grad::<true>(row, t)
}

impl candle_core::InplaceOp1 for LogprobsIntoGrad<'_> {
    fn name(&self) -> &'static str {
        "fused-logprobs-into-grad"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> candle_core::Result<()> {
        let op = self.name();
        let (n, vocab) = l.shape().dims2()?;
        let CpuStorage::F32(data) = s else {
            candle_core::bail!("{op}: logits must be f32, got {:?}", s.dtype())
        };
        let Some((start, end)) = l.contiguous_offsets() else {
            candle_core::bail!("{op}: logits are not contiguous")
        };
        if self.targets.len() != n {
            candle_core::bail!("{op}: {} targets for {n} rows", self.targets.len());
        }
        if let Some(&t) = self.targets.iter().find(|&&t| t as usize >= vocab) {
            candle_core::bail!("{op}: target {t} outside the vocabulary of {vocab}");
        }
        let mut lp = vec![0f32; n];
        let isa = detect_isa();
        data[start..end]
            .par_chunks_mut(vocab.max(1))
            .zip(lp.par_iter_mut())
            .zip(self.targets.par_iter())
            .for_each(|((row, lp), &t)| {
                *lp = match isa {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `detect_isa` returned AVX2 + FMA after checking this CPU.
                    Isa::Avx2Fma => unsafe { logprob_into_grad_avx2(row, t as usize) },
                    Isa::Generic => logprob_into_grad::<false>(row, t as usize),
                };
            });
        *self
            .out
            .lock()
            .map_err(|_| candle_core::Error::Msg(format!("{op}: poisoned")))? = lp;
        Ok(())
    }
}

/// `x (.., in) · wᵀ` for `w` `(out, in)` (f32, CPU): one GEMM forward reading `w` in place,
/// two in backward (`dx = dy · w`, `dw = dyᵀ · x`, the latter written in `w`'s layout).
/// Differentiable in both. Unfused, the same product is four graph nodes (two reshapes, a
/// transpose and the matmul), each of which backward sums into a zeroed buffer of its own, the
/// transpose's as a strided copy.
pub(crate) fn linear(x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op2(&w.contiguous()?, LinearOp)
}

struct LinearOp;

/// Rows up to which [`linear`]'s forward takes dot products with the weight's rows where they
/// lie ([`skinny_product`]) instead of a GEMM, which packs the whole weight on every call: for
/// a decode step's few rows that copy cost more than the product (batch 8 of the 22M bench
/// model: two thirds of the step). One row too: the `gemm` crate's matrix-vector path decoded
/// the 4-layer Qwen3-0.6B-shaped bench model at batch 1 at 16 tokens/s against 26 here.
const SKINNY_ROWS: usize = 32;

/// Outputs per parallel task of [`skinny_product`] (a multiple of 4).
const SKINNY_OUTPUTS: usize = 64;

/// Multiply-adds below which [`skinny_product`] runs on the calling thread.
const SKINNY_SERIAL_MACS: usize = 1 << 21;

/// `x (rows, in) · wᵀ` for `w` `(out, in)`, both row-major, as dot products: every weight row is
/// read once, from where it lies, against all `rows` inputs. Parallel over fixed blocks of
/// outputs; each output is one task's dot product, summed in a fixed lane order, so the result
/// does not depend on the thread count.
fn skinny_product(x: &[f32], w: &[f32], rows: usize, inner: usize, out: usize) -> Vec<f32> {
    if rows == 0 || out == 0 {
        return Vec::new();
    }
    let isa = detect_isa();
    // Transposed, (out, rows): each task writes one contiguous block.
    let mut yt = vec![0f32; out * rows];
    let task = |(task, block): (usize, &mut [f32])| {
        let o0 = task * SKINNY_OUTPUTS;
        let w = &w[o0 * inner..(o0 + block.len() / rows) * inner];
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `detect_isa` returned AVX2 + FMA after checking this CPU.
            Isa::Avx2Fma => unsafe { skinny_block_avx2(block, x, w, rows, inner) },
            Isa::Generic => skinny_block::<false>(block, x, w, rows, inner),
        }
    };
    // A small product runs on the calling thread: waking the pool costs more than it saves.
    if rows * inner * out < SKINNY_SERIAL_MACS {
        yt.chunks_mut(SKINNY_OUTPUTS * rows)
            .enumerate()
            .for_each(task);
    } else {
        yt.par_chunks_mut(SKINNY_OUTPUTS * rows)
            .enumerate()
            .for_each(task);
    }
    let mut y = vec![0f32; rows * out];
    for (o, col) in yt.chunks_exact(rows).enumerate() {
        for (r, &v) in col.iter().enumerate() {
            y[r * out + o] = v;
        }
    }
    y
}

/// [`skinny_block`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn skinny_block_avx2(yt: &mut [f32], x: &[f32], w: &[f32], rows: usize, inner: usize) {
    skinny_block::<true>(yt, x, w, rows, inner)
}

/// One block of [`skinny_product`]: `yt` `(n, rows)` for the `n` weight rows `w` `(n, in)`,
/// four weight rows at a time (eight independent accumulators under AVX2).
#[inline(always)]
fn skinny_block<const FMA: bool>(yt: &mut [f32], x: &[f32], w: &[f32], rows: usize, inner: usize) {
    let n = yt.len() / rows;
    let mut o = 0;
    while o + 4 <= n {
        let ws = [
            &w[o * inner..(o + 1) * inner],
            &w[(o + 1) * inner..(o + 2) * inner],
            &w[(o + 2) * inner..(o + 3) * inner],
            &w[(o + 3) * inner..(o + 4) * inner],
        ];
        for r in 0..rows {
            let d = dots4::<FMA>(&x[r * inner..(r + 1) * inner], ws);
            for (j, d) in d.into_iter().enumerate() {
                yt[(o + j) * rows + r] = d;
            }
        }
        o += 4;
    }
    for o in o..n {
        let wr = &w[o * inner..(o + 1) * inner];
        for r in 0..rows {
            let xr = &x[r * inner..(r + 1) * inner];
            yt[o * rows + r] = dots4::<FMA>(xr, [wr, wr, wr, wr])[0];
        }
    }
}

/// `[a · b_0, .., a · b_3]`, each over [`LANES`](super::simd::LANES) lanes summed in lane order.
#[inline(always)]
fn dots4<const FMA: bool>(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
    const L: usize = super::simd::LANES;
    let (mut s0, mut s1, mut s2, mut s3) = ([0f32; L], [0f32; L], [0f32; L], [0f32; L]);
    let full = a.len() / L * L;
    let lanes = |v: &[f32], k: usize| -> [f32; L] {
        let mut out = [0f32; L];
        out.copy_from_slice(&v[k..k + L]);
        out
    };
    for k in (0..full).step_by(L) {
        let (av, b0, b1, b2, b3) = (
            lanes(a, k),
            lanes(b[0], k),
            lanes(b[1], k),
            lanes(b[2], k),
            lanes(b[3], k),
        );
        for l in 0..L {
            s0[l] = madd::<FMA>(av[l], b0[l], s0[l]);
            s1[l] = madd::<FMA>(av[l], b1[l], s1[l]);
            s2[l] = madd::<FMA>(av[l], b2[l], s2[l]);
            s3[l] = madd::<FMA>(av[l], b3[l], s3[l]);
        }
    }
    let mut out = [0f32; 4];
    for ((o, s), b) in out.iter_mut().zip([s0, s1, s2, s3]).zip(b) {
        let tail: f32 = a[full..].iter().zip(&b[full..]).map(|(x, y)| x * y).sum();
        *o = s.iter().sum::<f32>() + tail;
    }
    out
}

/// `(rows, in, out)` of a linear layer's input `(.., in)` and weight `(out, in)`.
fn linear_dims(op: &str, lx: &Layout, lw: &Layout) -> candle_core::Result<(usize, usize, usize)> {
    let (out, inner) = lw.shape().dims2()?;
    let dims = lx.dims();
    if dims.last() != Some(&inner) {
        candle_core::bail!("{op}: input {dims:?} against a ({out}, {inner}) weight");
    }
    Ok((lx.shape().elem_count() / inner.max(1), inner, out))
}

/// The parallelism of a product as large as candle's matmul would run it.
fn matmul_parallelism() -> gemm::Parallelism {
    let threads = candle_core::utils::get_num_threads();
    if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    }
}

impl CustomOp2 for LinearOp {
    fn name(&self) -> &'static str {
        "fused-linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (rows, inner, out) = linear_dims(op, l1, l2)?;
        let (x, w) = (f32s(op, "input", s1, l1)?, f32s(op, "weight", s2, l2)?);
        let mut dims = l1.dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last = out;
        }
        let y = if (1..=SKINNY_ROWS).contains(&rows) {
            skinny_product(x, w, rows, inner, out)
        } else {
            // SAFETY: `x` is (rows, in) row-major (column stride 1, row stride in); `w` (out, in)
            // read as its transpose (in, out): column stride in, row stride 1.
            unsafe { new_product((rows, out), x, (1, inner), w, (inner, 1), inner) }
        };
        Ok((CpuStorage::F32(y), Shape::from(dims)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let dy = dy.contiguous()?;
        let dx = if x.track_op() {
            Some(dy.apply_op2_no_bwd(w, &LinearInputGrad)?)
        } else {
            None
        };
        let dw = if w.track_op() {
            Some(dy.apply_op2_no_bwd(x, &LinearWeightGrad)?)
        } else {
            None
        };
        Ok((dx, dw))
    }
}

/// `dx = dy · w`: `dy` `(.., out)`, `w` `(out, in)` → `(.., in)`.
struct LinearInputGrad;

impl CustomOp2 for LinearInputGrad {
    fn name(&self) -> &'static str {
        "fused-linear-input-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (out, inner) = l2.shape().dims2()?;
        let dims = l1.dims();
        if dims.last() != Some(&out) {
            candle_core::bail!("{op}: gradient {dims:?} against a ({out}, {inner}) weight");
        }
        let rows = l1.shape().elem_count() / out.max(1);
        let (dy, w) = (f32s(op, "dy", s1, l1)?, f32s(op, "weight", s2, l2)?);
        // SAFETY: `dy` (rows, out) and `w` (out, in) row-major.
        let dx = unsafe { new_product((rows, inner), dy, (1, out), w, (1, inner), out) };
        let mut shape = dims.to_vec();
        if let Some(last) = shape.last_mut() {
            *last = inner;
        }
        Ok((CpuStorage::F32(dx), Shape::from(shape)))
    }
}

/// `dw = dyᵀ · x`: `dy` `(.., out)`, `x` `(.., in)` → `(out, in)`.
struct LinearWeightGrad;

impl CustomOp2 for LinearWeightGrad {
    fn name(&self) -> &'static str {
        "fused-linear-weight-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (out, inner) = match (l1.dims().last(), l2.dims().last()) {
            (Some(&o), Some(&i)) => (o, i),
            _ => candle_core::bail!("{op}: scalar operands"),
        };
        let rows = l1.shape().elem_count() / out.max(1);
        if l2.shape().elem_count() != rows * inner {
            candle_core::bail!(
                "{op}: gradient {:?} against input {:?}",
                l1.dims(),
                l2.dims()
            );
        }
        let (dy, x) = (f32s(op, "dy", s1, l1)?, f32s(op, "input", s2, l2)?);
        // SAFETY: `dy` (rows, out) read as its transpose (out, rows): column stride out, row
        // stride 1; `x` (rows, in) row-major.
        let dw = unsafe { new_product((out, inner), dy, (out, 1), x, (1, inner), rows) };
        Ok((CpuStorage::F32(dw), Shape::from((out, inner))))
    }
}

/// A new row-major `(m, n)` buffer holding `lhs (m, k) · rhs (k, n)`, with `lhs` and `rhs`
/// given by their (column, row) strides, parallel as candle's matmul; never zero-filled first
/// (the product writes every element).
///
/// # Safety
/// `lhs` and `rhs` must hold every element their shapes and strides reach.
unsafe fn new_product(
    (m, n): (usize, usize),
    lhs: &[f32],
    (lhs_cs, lhs_rs): (usize, usize),
    rhs: &[f32],
    (rhs_cs, rhs_rs): (usize, usize),
    k: usize,
) -> Vec<f32> {
    if m == 0 || n == 0 || k == 0 {
        return vec![0f32; m * n];
    }
    let mut dst = Vec::<f32>::with_capacity(m * n);
    // SAFETY: `dst` has room for m · n elements, which the product writes without reading
    // (`accumulate` false) before the length is set; the operands are the caller's guarantee.
    unsafe {
        gemm_raw(
            dst.as_mut_ptr(),
            (m, n),
            false,
            lhs,
            (lhs_cs, lhs_rs),
            rhs,
            (rhs_cs, rhs_rs),
            k,
            1.0,
            matmul_parallelism(),
        );
        dst.set_len(m * n);
    }
    dst
}

/// `dst (m, n) = [dst +] alpha · lhs (m, k) · rhs (k, n)` for row-major `m · n` elements at
/// `dst`, with `lhs` and `rhs` given by their (column, row) strides (the `gemm` crate, which
/// candle's matmul uses), with `parallelism`. `dst` need not be initialised unless `accumulate`
/// (the product writes every element and reads none otherwise).
///
/// # Safety
/// `lhs` and `rhs` must hold every element their shapes and strides reach, and `dst` must be
/// valid for writes of `m · n` elements (and reads, with `accumulate`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn gemm_raw(
    dst: *mut f32,
    (m, n): (usize, usize),
    accumulate: bool,
    lhs: &[f32],
    (lhs_cs, lhs_rs): (usize, usize),
    rhs: &[f32],
    (rhs_cs, rhs_rs): (usize, usize),
    k: usize,
    alpha: f32,
    parallelism: gemm::Parallelism,
) {
    gemm::gemm(
        m,
        n,
        k,
        dst,
        1,
        n as isize,
        accumulate,
        lhs.as_ptr(),
        lhs_cs as isize,
        lhs_rs as isize,
        rhs.as_ptr(),
        rhs_cs as isize,
        rhs_rs as isize,
        1.0,
        alpha,
        false,
        false,
        false,
        parallelism,
    );
}

/// `dst (m, n) = [dst +] alpha · lhs (m, k) · rhs (k, n)` into a slice, on the calling thread
/// (the fused attention's tiles).
///
/// # Safety
/// `lhs` and `rhs` must hold every element their shapes and strides reach, and `dst` `m · n`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) unsafe fn tile_product(
    dst: &mut [f32],
    dims: (usize, usize),
    accumulate: bool,
    lhs: &[f32],
    lhs_strides: (usize, usize),
    rhs: &[f32],
    rhs_strides: (usize, usize),
    k: usize,
    alpha: f32,
) {
    debug_assert!(dst.len() >= dims.0 * dims.1);
    // SAFETY: the caller's guarantees: `dst` holds m · n initialised elements.
    unsafe {
        gemm_raw(
            dst.as_mut_ptr(),
            dims,
            accumulate,
            lhs,
            lhs_strides,
            rhs,
            rhs_strides,
            k,
            alpha,
            gemm::Parallelism::None,
        )
    }
}

/// `dst (m, n) [+]= lhsᵀ · rhs` for f32 CPU tensors `lhs` `(k, m)` and `rhs` `(k, n)` and a
/// row-major `dst`: the LM head weight's gradient summed over row chunks in one buffer, with no
/// `(m, n)` temporary per chunk. `accumulate = false` overwrites `dst`. Parallel over candle's
/// threads (as candle's matmul); the `gemm` crate's reduction order does not depend on them.
pub(crate) fn add_transposed_product(
    dst: &mut [f32],
    lhs: &Tensor,
    rhs: &Tensor,
    accumulate: bool,
) -> candle_core::Result<()> {
    // SAFETY: `dst` is initialised and valid for `dst.len()` elements.
    unsafe { transposed_product_at(dst.as_mut_ptr(), dst.len(), lhs, rhs, accumulate) }
}

/// [`add_transposed_product`] into `len` elements at `dst`.
///
/// # Safety
/// `dst` must be valid for writes of `len` elements, and initialised if `accumulate`.
unsafe fn transposed_product_at(
    dst: *mut f32,
    len: usize,
    lhs: &Tensor,
    rhs: &Tensor,
    accumulate: bool,
) -> candle_core::Result<()> {
    let op = "fused-transposed-product";
    let ((k, m), (k2, n)) = (lhs.dims2()?, rhs.dims2()?);
    if k != k2 || len != m * n {
        candle_core::bail!("{op}: lhs ({k}, {m}), rhs ({k2}, {n}), destination of {len} elements");
    }
    let (lhs, rhs) = (lhs.contiguous()?, rhs.contiguous()?);
    let (ls, ll) = lhs.storage_and_layout();
    let (rs, rl) = rhs.storage_and_layout();
    let (candle_core::Storage::Cpu(lc), candle_core::Storage::Cpu(rc)) = (&*ls, &*rs) else {
        candle_core::bail!("{op}: CPU tensors only")
    };
    let (a, b) = (f32s(op, "lhs", lc, ll)?, f32s(op, "rhs", rc, rl)?);
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        if !accumulate {
            // SAFETY: `dst` is valid for `len` writes (the caller's guarantee).
            unsafe { std::ptr::write_bytes(dst, 0, len) };
        }
        return Ok(());
    }
    let parallelism = matmul_parallelism();
    // SAFETY: `a` holds the (k, m) matrix read as its transpose (column stride m, row stride 1),
    // `b` the (k, n) matrix (column stride 1, row stride n), `dst` m · n elements (checked
    // above; valid and, with `accumulate`, initialised by the caller's guarantee).
    unsafe {
        gemm_raw(
            dst,
            (m, n),
            accumulate,
            a,
            (m, 1),
            b,
            (1, n),
            k,
            1.0,
            parallelism,
        );
    }
    Ok(())
}

/// `dst = lhsᵀ · rhs` for f32 CPU tensors `lhs` `(k, m)` and `rhs` `(k, n)`: `dst` becomes the
/// row-major `(m, n)` product, written into its own allocation (reused when large enough) and
/// never zero-filled first: the first term of [`add_transposed_product`]'s sum.
pub(crate) fn transposed_product(
    dst: &mut Vec<f32>,
    lhs: &Tensor,
    rhs: &Tensor,
) -> candle_core::Result<()> {
    let len = lhs.dim(1)? * rhs.dim(1)?;
    dst.clear();
    dst.reserve_exact(len);
    // SAFETY: `dst` has room for `len` elements, which the product writes without reading
    // (no `accumulate`) before the length is set; on an error the length stays 0.
    unsafe {
        transposed_product_at(dst.as_mut_ptr(), len, lhs, rhs, false)?;
        dst.set_len(len);
    }
    Ok(())
}

/// `dy · w` for f32 CPU tensors `dy` `(.., out)` and `w` `(out, in)`: the input gradient of
/// [`linear`], a new buffer never zero-filled first.
pub(crate) fn linear_input_grad(dy: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
    dy.contiguous()?
        .apply_op2_no_bwd(&w.contiguous()?, &LinearInputGrad)
}

/// Multiplies every element by `s` in place (parallel, fixed tasks).
pub(crate) fn scale_in_place(x: &mut [f32], s: f32) {
    x.par_chunks_mut(TASK)
        .for_each(|c| c.iter_mut().for_each(|v| *v *= s));
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var, D};

    fn randn(shape: &[usize], seed: u64) -> Tensor {
        // A small LCG: the same values on every run and machine.
        let n: usize = shape.iter().product();
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let v: Vec<f32> = (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
        let a: Vec<f32> = a.flatten_all().unwrap().to_vec1().unwrap();
        let b: Vec<f32> = b.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(a.len(), b.len());
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
        a.iter()
            .zip(&b)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs() / scale))
    }

    fn unfused_rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
        let var = x.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
        let normed = x
            .broadcast_div(&(var + eps).unwrap().sqrt().unwrap())
            .unwrap();
        normed.broadcast_mul(w).unwrap()
    }

    /// Values and gradients (through a random upstream gradient) of `f` and `g` on the same
    /// variables.
    fn check2(
        shapes: (&[usize], &[usize]),
        fused: impl Fn(&Tensor, &Tensor) -> Tensor,
        unfused: impl Fn(&Tensor, &Tensor) -> Tensor,
        tol: f32,
    ) {
        let a = Var::from_tensor(&randn(shapes.0, 1)).unwrap();
        let b = Var::from_tensor(&(randn(shapes.1, 2) + 0.5).unwrap()).unwrap();
        let f = fused(a.as_tensor(), b.as_tensor());
        let u = unfused(a.as_tensor(), b.as_tensor());
        assert!(max_rel(&f, &u) < tol, "values differ: {}", max_rel(&f, &u));
        let up = randn(f.dims(), 3);
        let gf = (f * &up).unwrap().sum_all().unwrap().backward().unwrap();
        let gu = (u * &up).unwrap().sum_all().unwrap().backward().unwrap();
        for v in [&a, &b] {
            let (x, y) = (gf.get(v).unwrap(), gu.get(v).unwrap());
            assert_eq!(x.dims(), y.dims());
            assert!(max_rel(x, y) < tol, "gradients differ: {}", max_rel(x, y));
        }
    }

    #[test]
    fn tile_products_follow_their_strides() {
        // dst (m, n) [+]= alpha · A · B with A given as (m, k) rows or as the transpose of a
        // (k, m) buffer, B as (k, n) rows or as the transpose of (n, k), against a naive sum.
        for (m, n, k) in [
            (1usize, 1usize, 1usize),
            (7, 5, 3),
            (64, 128, 128),
            (33, 64, 17),
        ] {
            let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect();
            let at = |r: usize, c: usize| a[r * k + c];
            let bt = |r: usize, c: usize| b[r * n + c];
            let want = |acc: f32, r: usize, c: usize| {
                acc + 0.5 * (0..k).map(|x| at(r, x) * bt(x, c)).sum::<f32>()
            };
            // A as rows, B as rows, accumulating onto 1.0.
            let mut dst = vec![1f32; m * n];
            // SAFETY: `a` (m, k), `b` (k, n), `dst` (m, n).
            unsafe { tile_product(&mut dst, (m, n), true, &a, (1, k), &b, (1, n), k, 0.5) };
            for r in 0..m {
                for c in 0..n {
                    assert!(
                        (dst[r * n + c] - want(1.0, r, c)).abs() < 1e-3,
                        "{m}x{n}x{k}"
                    );
                }
            }
            // The same product from transposed buffers, overwriting.
            let a_t: Vec<f32> = (0..k * m).map(|i| at(i % m, i / m)).collect();
            let b_t: Vec<f32> = (0..n * k).map(|i| bt(i % k, i / k)).collect();
            let mut dst = vec![9f32; m * n];
            // SAFETY: `a_t` (k, m), `b_t` (n, k), `dst` (m, n).
            unsafe { tile_product(&mut dst, (m, n), false, &a_t, (m, 1), &b_t, (k, 1), k, 0.5) };
            for r in 0..m {
                for c in 0..n {
                    assert!(
                        (dst[r * n + c] - want(0.0, r, c)).abs() < 1e-3,
                        "{m}x{n}x{k} (t)"
                    );
                }
            }
        }
    }

    #[test]
    fn rms_norm_matches_unfused() {
        for shape in [
            &[1usize, 1, 8][..],
            &[3, 65, 128],
            &[2, 7, 3, 64],
            &[5000, 16],
        ] {
            let h = shape[shape.len() - 1];
            check2(
                (shape, &[h]),
                |x, w| rms_norm(x, w, 1e-6).unwrap(),
                |x, w| unfused_rms_norm(x, w, 1e-6),
                2e-6,
            );
        }
    }

    /// Elements of the buffer under a CPU f32 tensor (more than its own when it is a view).
    fn storage_len(t: &Tensor) -> usize {
        let (s, _) = t.storage_and_layout();
        match &*s {
            candle_core::Storage::Cpu(CpuStorage::F32(v)) => v.len(),
            _ => panic!("not a CPU f32 tensor"),
        }
    }

    /// The norm weight's gradient owns a buffer of its own size: candle stores a first gradient
    /// as it is, and a parameter's gradient lives until the optimizer runs, so a view of the
    /// `(rows × h)` backward buffer would keep all of it alive.
    #[test]
    fn rms_norm_weight_gradient_is_not_a_view_of_the_input_gradient() {
        let (x, w) = (randn(&[4, 33, 64], 1), randn(&[64], 2));
        let (xv, wv) = (Var::from_tensor(&x).unwrap(), Var::from_tensor(&w).unwrap());
        let grads = rms_norm(xv.as_tensor(), wv.as_tensor(), 1e-6)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let dw = grads.get(wv.as_tensor()).unwrap();
        assert_eq!(storage_len(dw), 64);
        assert_eq!(dw.layout().start_offset(), 0);
        assert_eq!(grads.get(xv.as_tensor()).unwrap().dims(), &[4, 33, 64]);
    }

    #[test]
    fn swiglu_matches_unfused() {
        for shape in [&[1usize][..], &[3, 65, 1024], &[40000]] {
            check2(
                (shape, shape),
                |g, u| swiglu(g, u).unwrap(),
                |g, u| (g.silu().unwrap() * u).unwrap(),
                1e-6,
            );
        }
    }

    #[test]
    fn row_logprobs_and_grad_match_unfused() {
        let (n, vocab) = (37, 1000);
        let z = (randn(&[n, vocab], 4) * 3.0).unwrap();
        let targets: Vec<u32> = (0..n as u32).map(|i| (i * 97 + 5) % vocab as u32).collect();
        let t = Tensor::from_vec(targets.clone(), (n, 1), &Device::Cpu).unwrap();
        let out = row_logprobs(&z, &targets).unwrap();
        let max = z.max_keepdim(D::Minus1).unwrap();
        let shifted = z.broadcast_sub(&max).unwrap();
        let log_sum = shifted
            .exp()
            .unwrap()
            .sum_keepdim(D::Minus1)
            .unwrap()
            .log()
            .unwrap();
        let lp = (shifted.gather(&t, D::Minus1).unwrap() - &log_sum).unwrap();
        let lse = (log_sum + max).unwrap();
        assert!(max_rel(&out.narrow(1, 0, 1).unwrap(), &lp) < 1e-6);
        assert!(max_rel(&out.narrow(1, 1, 1).unwrap(), &lse) < 1e-6);

        // The gradient of Σ g_i lp_i over a slice of columns against autograd on the
        // unfused log-softmax gather.
        let g: Vec<f32> = (0..n).map(|i| i as f32 / 7.0 - 2.0).collect();
        let lse_v: Vec<f32> = lse.flatten_all().unwrap().to_vec1().unwrap();
        let zv = Var::from_tensor(&z).unwrap();
        let lp = candle_nn::ops::log_softmax(zv.as_tensor(), D::Minus1)
            .unwrap()
            .gather(&t, D::Minus1)
            .unwrap()
            .flatten_all()
            .unwrap();
        let gt = Tensor::from_vec(g.clone(), n, &Device::Cpu).unwrap();
        let grads = (lp * gt).unwrap().sum_all().unwrap().backward().unwrap();
        let want = grads.get(&zv).unwrap();
        for (v0, len) in [(0, vocab), (0, 300), (300, 300), (900, 100)] {
            let slice = z.narrow(1, v0, len).unwrap();
            let got = logprob_grad(&slice, v0, &targets, &lse_v, &g).unwrap();
            let exp = want.narrow(1, v0, len).unwrap();
            assert!(
                max_rel(&got, &exp) < 1e-5,
                "columns {v0}+{len}: {}",
                max_rel(&got, &exp)
            );
        }
    }

    #[test]
    fn logprobs_into_grad_match_row_logprobs_and_grad() {
        // Vocabularies below, at and past the reduction lanes, and one wider than a task.
        for (n, vocab) in [(1usize, 1usize), (5, 15), (37, 1000), (3, 24_577)] {
            let z = (randn(&[n, vocab], 8) * 4.0).unwrap();
            let targets: Vec<u32> = (0..n as u32).map(|i| (i * 97 + 5) % vocab as u32).collect();
            let both = row_logprobs(&z, &targets).unwrap();
            let want_lp = both.narrow(1, 0, 1).unwrap().flatten_all().unwrap();
            let lse: Vec<f32> = both
                .narrow(1, 1, 1)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let want_dz = logprob_grad(&z, 0, &targets, &lse, &vec![1f32; n]).unwrap();
            let dz = z.copy().unwrap();
            let lp = logprobs_into_grad(&dz, &targets).unwrap();
            let lp = Tensor::from_vec(lp, n, &Device::Cpu).unwrap();
            assert!(
                max_rel(&lp, &want_lp) < 1e-6,
                "{n}x{vocab}: {}",
                max_rel(&lp, &want_lp)
            );
            assert!(
                max_rel(&dz, &want_dz) < 1e-6,
                "{n}x{vocab}: {}",
                max_rel(&dz, &want_dz)
            );
        }
        // A bad target is an error, not an out-of-bounds write.
        let z = randn(&[2, 8], 1);
        assert!(logprobs_into_grad(&z, &[1, 8])
            .unwrap_err()
            .to_string()
            .contains("target 8"));
    }

    #[test]
    fn linear_matches_unfused() {
        for (x_shape, out) in [
            (&[1usize, 1][..], 1usize),
            // One row (a decode step at batch 1) across several tasks' outputs.
            (&[1, 1, 72][..], 200),
            // Up to SKINNY_ROWS rows: dot products, outputs past a multiple of 4 and of a
            // task, inputs past a multiple of the lanes.
            (&[2, 9, 40][..], 70),
            (&[32, 100][..], 130),
            (&[3, 65, 48][..], 17),
            (&[2, 5, 7, 32][..], 96),
            (&[300, 64][..], 256),
        ] {
            let inner = x_shape[x_shape.len() - 1];
            check2(
                (x_shape, &[out, inner]),
                |x, w| linear(x, w).unwrap(),
                |x, w| {
                    let rows = x.elem_count() / inner;
                    let mut dims = x.dims().to_vec();
                    *dims.last_mut().unwrap() = out;
                    x.reshape((rows, inner))
                        .unwrap()
                        .matmul(&w.t().unwrap())
                        .unwrap()
                        .reshape(dims)
                        .unwrap()
                },
                1e-6,
            );
        }
        // A transposed (strided) input gives the same product as its contiguous copy.
        let x = randn(&[16, 24], 3).t().unwrap();
        let w = randn(&[5, 16], 4);
        let a = linear(&x, &w).unwrap();
        let b = linear(&x.contiguous().unwrap(), &w).unwrap();
        assert_eq!(max_rel(&a, &b), 0.0);
        assert!(linear(&randn(&[4, 8], 1), &randn(&[3, 7], 2)).is_err());
    }

    #[test]
    fn rotary_matches_unfused() {
        use crate::model::layers::{apply_rotary, Rotary};
        let (b, s, h, d) = (2, 65, 3, 16);
        let table = Rotary::new(d, 128, 10000.0, DType::F32, &Device::Cpu).unwrap();
        let pos: Vec<u32> = (0..(b * s) as u32).map(|i| (i * 7) % 128).collect();
        let pos = Tensor::from_vec(pos, (b, s), &Device::Cpu).unwrap();
        let (cos, sin) = table.at(&pos).unwrap();
        let x = Var::from_tensor(&randn(&[b, s, h, d], 8)).unwrap();
        let f = rotary_heads_first(x.as_tensor(), &cos, &sin).unwrap();
        let u = apply_rotary(
            &x.as_tensor().transpose(1, 2).unwrap().contiguous().unwrap(),
            &cos,
            &sin,
        )
        .unwrap();
        assert_eq!(f.dims(), [b, h, s, d]);
        assert!(max_rel(&f, &u) < 1e-6, "values differ: {}", max_rel(&f, &u));
        let up = randn(f.dims(), 9);
        let gf = (f * &up).unwrap().sum_all().unwrap().backward().unwrap();
        let gu = (u * &up).unwrap().sum_all().unwrap().backward().unwrap();
        let (gf, gu) = (gf.get(&x).unwrap(), gu.get(&x).unwrap());
        assert!(
            max_rel(gf, gu) < 1e-6,
            "gradients differ: {}",
            max_rel(gf, gu)
        );
        let bad = randn(&[b, 1, s, d], 1);
        assert!(rotary_heads_first(x.as_tensor(), &bad, &bad).is_err());
    }

    #[test]
    fn same_bits_with_any_thread_count() {
        let x = randn(&[300, 96], 5);
        let w = randn(&[96], 6);
        let dy = randn(&[300, 96], 7);
        let run = || {
            let a = x
                .apply_op3_no_bwd(&w, &dy, &RmsNormBwd { eps: 1e-6 })
                .unwrap();
            a.to_vec1::<f32>().unwrap()
        };
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(run);
        let three = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap()
            .install(run);
        assert_eq!(one, three);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let x = randn(&[4, 8], 1);
        assert!(rms_norm(&x, &randn(&[7], 2), 1e-6).is_err());
        assert!(swiglu(&x, &randn(&[4, 7], 2)).is_err());
        assert!(row_logprobs(&x, &[1, 2, 3]).is_err());
        assert!(row_logprobs(&x, &[1, 2, 3, 8]).is_err());
    }
}
