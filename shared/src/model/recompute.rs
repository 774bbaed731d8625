//! Recomputation in backward: activation checkpointing of decoder layers and the chunked
//! LM head with log-probs.
//!
//! candle keeps every op's inputs alive until the loss is dropped, so memory only falls if the
//! graph is cut. Both tools here compute a value on detached tensors (no graph), then *graft* it
//! into the graph with a custom op whose forward hands back that value and whose backward
//! recomputes what it needs:
//!
//! - [`checkpoint_layer`]: the graph keeps only the layer's input; `bwd` re-runs the layer with
//!   a graph on a fresh variable copy of the input, back-propagates `Σ out ∘ grad_out` through
//!   it and returns the input's gradient. The parameters' gradients reach candle's own
//!   [`candle_core::backprop::GradStore`] through *taps*: one small op per parameter, chained on
//!   a one-element tensor that the grafted op also consumes. The taps therefore sit upstream of
//!   the grafted op, and candle's topological order runs their `bwd` after it, when the
//!   recomputation has filled their gradients. The training code sees ordinary gradients for
//!   every parameter.
//! - [`chunked_logprobs`]: logits, log-sum-exp and the chosen token's log-prob a chunk of
//!   positions at a time; `bwd` recomputes each chunk's softmax and returns the gradients of the
//!   hidden states and of the LM head weight. No `(positions × vocab)` tensor is alive for more
//!   than one chunk.

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Shape, Storage, Tensor, Var, D};

use super::Result;

/// The backward of a grafted value: `(arg1, arg2, grad_out) -> (grad_arg1, grad_arg2)`.
type GraftBwd = dyn Fn(&Tensor, &Tensor, &Tensor) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)>
    + Send
    + Sync;

/// A custom op whose forward returns a value computed beforehand and whose backward is a
/// closure.
struct Graft {
    name: &'static str,
    value: Mutex<Option<Tensor>>,
    bwd: Box<GraftBwd>,
}

impl Graft {
    /// The precomputed value's storage (taken: the op keeps no copy of it).
    fn take_value(&self) -> candle_core::Result<(Tensor, Shape)> {
        let value = self
            .value
            .lock()
            .map_err(|_| candle_core::Error::Msg(format!("{}: poisoned", self.name)))?
            .take()
            .ok_or_else(|| candle_core::Error::Msg(format!("{}: forward run twice", self.name)))?;
        let shape = value.shape().clone();
        Ok((value, shape))
    }
}

impl CustomOp2 for Graft {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (value, shape) = self.take_value()?;
        let (storage, _) = value.storage_and_layout();
        match &*storage {
            Storage::Cpu(s) => Ok((s.clone(), shape)),
            _ => Err(candle_core::Error::Msg(format!(
                "{}: value on another device",
                self.name
            ))),
        }
    }

    // Compiled on every build (candle's dummy CUDA types without the `cuda` feature).
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        let (value, shape) = self.take_value()?;
        let (storage, layout) = value.storage_and_layout();
        match &*storage {
            Storage::Cuda(s) => Ok((s.try_clone(layout)?, shape)),
            _ => Err(candle_core::Error::Msg(format!(
                "{}: value on another device",
                self.name
            ))),
        }
    }

    fn bwd(
        &self,
        arg1: &Tensor,
        arg2: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        (self.bwd)(arg1, arg2, grad_res)
    }
}

/// Puts `value` into the graph as a function of `arg1` and `arg2` whose gradient `bwd`
/// computes. `value` must not carry a graph of its own (compute it on detached tensors).
fn graft(
    name: &'static str,
    value: Tensor,
    arg1: &Tensor,
    arg2: &Tensor,
    bwd: Box<GraftBwd>,
) -> Result<Tensor> {
    // The forward hands over the value's whole storage: it must start at 0, densely
    // (`force_contiguous` copies only the view's elements; `copy` would keep its layout).
    let value = if value.is_contiguous() && value.layout().start_offset() == 0 {
        value
    } else {
        value.force_contiguous()?
    };
    let op = Graft {
        name,
        value: Mutex::new(Some(value)),
        bwd,
    };
    Ok(arg1.apply_op2(arg2, op)?)
}

/// Gradients computed by a recomputation for the parameters its taps stand for.
type Slot = Arc<Mutex<Vec<Option<Tensor>>>>;

/// One parameter's tap: forward `(token, param) -> token'` (a one-element zero); backward
/// hands the parameter the gradient the recomputation left in `slot[index]`.
struct Tap {
    slot: Slot,
    index: usize,
}

impl CustomOp2 for Tap {
    fn name(&self) -> &'static str {
        "checkpoint-tap"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        Ok((CpuStorage::F32(vec![0.0]), Shape::from(1)))
    }

    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::{BackendDevice, BackendStorage};
        let shape = Shape::from(1);
        Ok((s1.device().zeros_impl(&shape, DType::F32)?, shape))
    }

    fn bwd(
        &self,
        token: &Tensor,
        _param: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = self
            .slot
            .lock()
            .map_err(|_| candle_core::Error::Msg("checkpoint-tap: poisoned".into()))?
            .get_mut(self.index)
            .and_then(Option::take);
        let token_grad = token
            .track_op()
            .then(|| grad_res.zeros_like())
            .transpose()?;
        Ok((token_grad, grad))
    }
}

/// A layer function for [`checkpoint_layer`]: maps the layer input to its output, with the
/// given parameters (detached for the forward, the live variables for the recomputation).
pub(crate) trait Recomputable: Send + Sync + 'static {
    /// The layer's output for `x` using the parameters as they are in `self`.
    fn run(&self, x: &Tensor) -> Result<Tensor>;
    /// A copy whose parameters are detached (no graph).
    fn detached(&self) -> Self;
    /// The trained parameters (those that track gradients).
    fn params(&self) -> Vec<Tensor>;
}

/// Runs `layer` on `x` keeping only `x` for backward: the output is computed without a graph,
/// and backward recomputes the layer to get the gradients of `x` and of every parameter.
/// Without a graph to build (`x` and the parameters track nothing) it is the plain forward.
pub(crate) fn checkpoint_layer<L: Recomputable>(layer: L, x: &Tensor) -> Result<Tensor> {
    let params: Vec<Tensor> = layer.params();
    if !x.track_op() && params.is_empty() {
        return layer.run(x);
    }
    let value = layer.detached().run(&x.detach())?;
    let slot: Slot = Arc::new(Mutex::new(vec![None; params.len()]));
    // The taps: token_{i+1} = tap_i(token_i, param_i).
    let mut token = Tensor::zeros(1, DType::F32, x.device())?;
    for (index, p) in params.iter().enumerate() {
        let tap = Tap {
            slot: slot.clone(),
            index,
        };
        token = token.apply_op2(p, tap)?;
    }
    let bwd = move |x: &Tensor,
                    token: &Tensor,
                    grad: &Tensor|
          -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let xv = Var::from_tensor(&x.detach())?;
        let out = layer
            .run(xv.as_tensor())
            .map_err(candle_core::Error::wrap)?;
        let mut grads = out.mul(&grad.detach())?.sum_all()?.backward()?;
        let gx = if x.track_op() {
            Some(match grads.remove(xv.as_tensor()) {
                Some(g) => g,
                None => x.zeros_like()?,
            })
        } else {
            None
        };
        {
            let mut slot = slot
                .lock()
                .map_err(|_| candle_core::Error::Msg("checkpoint: poisoned".into()))?;
            for (s, p) in slot.iter_mut().zip(&params) {
                *s = grads.remove(p);
            }
        }
        let gt = token.track_op().then(|| token.zeros_like()).transpose()?;
        Ok((gx, gt))
    };
    graft("checkpoint", value, x, &token, Box::new(bwd))
}

/// Elements of one chunk of logits (`rows × vocab`, f32): 64 MiB.
const LOGITS_CHUNK_ELEMS: usize = 1 << 24;

/// Rows of one chunk of logits for a vocabulary of `vocab`.
pub(crate) fn logits_chunk_rows(vocab: usize) -> usize {
    (LOGITS_CHUNK_ELEMS / vocab.max(1)).max(1)
}

/// `Σᵢ log softmax(hidden_i · weightᵀ)[targets_i]`: the sum of [`chunked_logprobs`] (temperature
/// 1), as a scalar (the SFT loss is its negative over a count). Its backward receives one scalar, so
/// every position's log-prob gets the same gradient; the fused CPU path (f32) therefore computes
/// the gradients of `hidden` and `weight` in the forward's own pass over each chunk of logits,
/// for a unit gradient, and backward only scales them: each chunk's logits are computed once,
/// never recomputed (what a fused linear cross-entropy does). It holds those gradients from
/// forward to backward: the weight's `(vocab, h)` f32, which backward would allocate anyway, and
/// the hidden states' `(n, h)`. Elsewhere (bf16, CUDA), and when nothing needs a gradient, it is
/// `chunked_logprobs(..).sum_all()`. Backward runs once: the gradients move into the caller's
/// gradient store (a second `backward` of the same graph is an error).
pub(crate) fn chunked_logprob_sum(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    rows: usize,
) -> Result<Tensor> {
    let (n, h) = hidden.dims2()?;
    let (track_h, track_w) = (hidden.track_op(), weight.track_op());
    if n == 0 || !(track_h || track_w) || !super::fused::applies(&[hidden, weight]) {
        return Ok(chunked_logprobs(hidden, weight, targets, None, rows)?.sum_all()?);
    }
    let vocab = weight.dim(0)?;
    let rows = rows.max(1);
    let host_targets: Vec<u32> = targets.to_dtype(DType::U32)?.flatten_all()?.to_vec1()?;
    let (hd, wd) = (hidden.detach(), weight.detach());
    // The weight's gradient: the first chunk's product, later chunks added into it (allocated
    // before the first chunk's logits, so that those are recycled for the later chunks).
    let mut dw: Vec<f32> = Vec::with_capacity(if track_w { vocab * h } else { 0 });
    let mut lps = Vec::with_capacity(n);
    let mut dh = Vec::with_capacity(n.div_ceil(rows));
    for start in (0..n).step_by(rows) {
        let len = rows.min(n - start);
        let h_c = hd.narrow(0, start, len)?;
        // The chunk's logits become d lp_i / d z_ij = 1[j = target_i] − p_ij (a unit gradient)
        // in place: the matmul's fresh output, shared with no other tensor.
        let dz = chunk_logits(&h_c, &wd, None)?;
        let chunk_lps = super::fused::logprobs_into_grad(&dz, &host_targets[start..start + len])?;
        lps.extend(chunk_lps);
        if track_h {
            dh.push(super::fused::linear_input_grad(&dz, &wd)?);
        }
        if track_w {
            if start == 0 {
                super::fused::transposed_product(&mut dw, &dz, &h_c)?;
            } else {
                super::fused::add_transposed_product(&mut dw, &dz, &h_c, true)?;
            }
        }
    }
    let value = Tensor::from_vec(lps, n, hidden.device())?.sum_all()?;
    let dh = if track_h {
        Some(Tensor::cat(&dh, 0)?)
    } else {
        None
    };
    let unit = Mutex::new(Some((dh, dw)));
    let bwd = move |_: &Tensor,
                    weight: &Tensor,
                    grad: &Tensor|
          -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let s = grad.to_dtype(DType::F32)?.to_scalar::<f32>()?;
        let (dh, mut dw) = unit
            .lock()
            .map_err(|_| candle_core::Error::Msg("chunked-logprob-sum: poisoned".into()))?
            .take()
            .ok_or_else(|| {
                candle_core::Error::Msg("chunked-logprob-sum: backward ran twice".into())
            })?;
        let dh = match dh {
            Some(dh) if s == 1.0 => Some(dh),
            Some(dh) => Some(dh.affine(f64::from(s), 0.0)?),
            None => None,
        };
        let dw = if track_w {
            if s != 1.0 {
                super::fused::scale_in_place(&mut dw, s);
            }
            Some(Tensor::from_vec(dw, (vocab, h), weight.device())?)
        } else {
            None
        };
        Ok((dh, dw))
    };
    graft("chunked-logprob-sum", value, hidden, weight, Box::new(bwd))
}

/// The tempered f32 logits of rows `hidden` `(c, h)`: `(hidden @ weightᵀ) · inv` where `inv`
/// is `(c, 1)` or absent (temperature 1).
fn chunk_logits(hidden: &Tensor, weight: &Tensor, inv: Option<&Tensor>) -> Result<Tensor> {
    // f32 on the CPU: the fused linear's product (read in place, never zero-filled first).
    let z = if super::fused::applies(&[hidden, weight]) {
        super::fused::linear(&hidden.detach(), &weight.detach())?
    } else {
        hidden.matmul(&weight.t()?)?.to_dtype(DType::F32)?
    };
    Ok(match inv {
        Some(inv) => z.broadcast_mul(inv)?,
        None => z,
    })
}

/// `log softmax(hidden @ weightᵀ · inv)[target]` for every row, `rows` rows at a time, never
/// holding more than one chunk of logits; differentiable with respect to `hidden` and
/// `weight` (the LM head; the embedding when tied), recomputing each chunk in backward.
///
/// Forward runs `rows` positions at a time; backward all positions against a slice of the
/// vocabulary at a time (`rows × vocab` logits either way), so the weight's gradient is written
/// once into its own buffer instead of being summed over chunks.
///
/// * `hidden`: `(n, h)` in the model dtype; `weight`: `(vocab, h)`.
/// * `targets`: `(n)` u32.
/// * `inv_temperature`: `(n)` f32, `1 / T` of each row, or `None` for `T = 1`.
///
/// Returns `(n)` f32. The same values (and gradients) as [`super::layers::gather_logprobs`] of
/// the full logits.
pub(crate) fn chunked_logprobs(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    inv_temperature: Option<&Tensor>,
    rows: usize,
) -> Result<Tensor> {
    let (n, _) = hidden.dims2()?;
    if n == 0 {
        return Ok(Tensor::zeros(0, DType::F32, hidden.device())?);
    }
    let rows = rows.max(1);
    let targets = targets.to_dtype(DType::U32)?.reshape((n, 1))?;
    let inv = match inv_temperature {
        Some(t) => Some(t.to_dtype(DType::F32)?.reshape((n, 1))?.detach()),
        None => None,
    };
    let (hd, wd) = (hidden.detach(), weight.detach());
    // The fused CPU kernels (f32 weights: the logits' gradient is not cast) need the targets
    // on the host.
    let fused = super::fused::applies(&[&wd]);
    let host_targets: Vec<u32> = if fused {
        targets.flatten_all()?.to_vec1()?
    } else {
        Vec::new()
    };
    let mut lps = Vec::with_capacity(n.div_ceil(rows));
    let mut lses = Vec::with_capacity(n.div_ceil(rows));
    // When every position fits in one chunk, backward's one vocabulary slice is this chunk's
    // logits: they are kept (at most one chunk) instead of recomputed.
    let mut kept_z = None;
    let keep = rows >= n && (hidden.track_op() || weight.track_op());
    for start in (0..n).step_by(rows) {
        let len = rows.min(n - start);
        let inv_c = inv.as_ref().map(|i| i.narrow(0, start, len)).transpose()?;
        let z = chunk_logits(&hd.narrow(0, start, len)?, &wd, inv_c.as_ref())?;
        if keep {
            kept_z = Some(z.clone());
        }
        if fused {
            let both = super::fused::row_logprobs(&z, &host_targets[start..start + len])?;
            lps.push(both.narrow(1, 0, 1)?);
            lses.push(both.narrow(1, 1, 1)?);
            continue;
        }
        let max = z.max_keepdim(D::Minus1)?;
        let shifted = z.broadcast_sub(&max)?;
        drop(z);
        let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
        let picked = shifted.gather(&targets.narrow(0, start, len)?.contiguous()?, D::Minus1)?;
        lps.push((picked - &lse)?);
        lses.push((lse + max)?);
    }
    let value = Tensor::cat(&lps, 0)?.reshape(n)?;
    // Log-sum-exp of every row (the softmax's normaliser in backward): (n, 1).
    let lse = Tensor::cat(&lses, 0)?;
    if !hidden.track_op() && !weight.track_op() {
        return Ok(value);
    }
    let kept = Mutex::new(kept_z);
    let bwd = move |hidden: &Tensor,
                    weight: &Tensor,
                    grad: &Tensor|
          -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let (hd, wd) = (hidden.detach(), weight.detach());
        let (vocab, h) = wd.dims2()?;
        let (track_h, track_w) = (hidden.track_op(), weight.track_op());
        // d lp_i / d z_ij = inv_i · (1[j = target_i] − p_ij): g_i = grad_i · inv_i.
        let grad = grad.detach().to_dtype(DType::F32)?.reshape((n, 1))?;
        let g = match &inv {
            Some(inv) => grad.mul(inv)?,
            None => grad,
        };
        // Backward walks the vocabulary a slice at a time (all n positions, `cols` logits
        // each): the weight's gradient is then written slice by slice into one buffer, and
        // the hidden states' gradient (n × h) is summed over the slices.
        // The same number of logits per step as the forward's chunks.
        let cols = (rows * vocab / n.max(1)).clamp(1, vocab.max(1));
        let host = if fused {
            let g: Vec<f32> = g.flatten_all()?.to_vec1()?;
            let lse: Vec<f32> = lse.flatten_all()?.to_vec1()?;
            Some((g, lse))
        } else {
            None
        };
        let mut dh: Option<Tensor> = None;
        // One slice covers the whole vocabulary: its product is the weight's gradient as it
        // is. Otherwise each slice's product is written into its rows of one buffer.
        let whole = cols >= vocab;
        let mut dw = if track_w && !whole {
            Some(Tensor::zeros((vocab, h), wd.dtype(), wd.device())?)
        } else {
            None
        };
        for v0 in (0..vocab).step_by(cols) {
            let len = cols.min(vocab - v0);
            let w_c = wd.narrow(0, v0, len)?;
            let kept = kept
                .lock()
                .map_err(|_| candle_core::Error::Msg("chunked-logprobs: poisoned".into()))?
                .take()
                .filter(|_| len == vocab);
            let z = match kept {
                Some(z) => z,
                None => chunk_logits(&hd, &w_c, inv.as_ref()).map_err(candle_core::Error::wrap)?,
            };
            let dz = match &host {
                Some((g, lse)) => super::fused::logprob_grad(&z, v0, &host_targets, lse, g)?,
                None => {
                    let p = z.broadcast_sub(&lse)?.exp()?;
                    drop(z);
                    let ids = Tensor::arange(v0 as u32, (v0 + len) as u32, wd.device())?
                        .reshape((1, len))?;
                    let onehot = targets.broadcast_eq(&ids)?.to_dtype(DType::F32)?;
                    (onehot - p)?.broadcast_mul(&g)?.to_dtype(wd.dtype())?
                }
            };
            if track_h {
                let part = if fused {
                    super::fused::linear_input_grad(&dz, &w_c)?
                } else {
                    dz.matmul(&w_c)?.to_dtype(DType::F32)?
                };
                dh = Some(match dh.take() {
                    None => part,
                    Some(sum) => (sum + part)?,
                });
            }
            if track_w {
                let part = if fused {
                    let mut part = Vec::new();
                    super::fused::transposed_product(&mut part, &dz, &hd)?;
                    Tensor::from_vec(part, (len, h), wd.device())?
                } else {
                    dz.t()?.matmul(&hd)?
                };
                match &dw {
                    Some(dw) => dw.slice_set(&part, 0, v0)?,
                    None => dw = Some(part),
                }
            }
        }
        let dh = match dh {
            Some(dh) if track_h => Some(dh.to_dtype(hd.dtype())?),
            _ => None,
        };
        Ok((dh, dw))
    };
    graft("chunked-logprobs", value, hidden, weight, Box::new(bwd))
}
