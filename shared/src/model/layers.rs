//! Building blocks written with differentiable candle ops.
//!
//! candle's fused `rms_norm`, `rope*`, `softmax_last_dim` and CPU flash attention have no
//! backward pass: a model built from them trains silently with zero gradients. Every op here
//! has a gradient; [`OpsMode::Infer`] switches the norm and softmax to the fused kernels for
//! decoding, where no gradient is needed and speed is.

use candle_core::{DType, Device, Module, Tensor, D};

use super::Result;

/// Which implementation of norm and softmax to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpsMode {
    /// Differentiable primitive ops (the learner).
    Train,
    /// Fused kernels without backward (the actor's decode path).
    Infer,
}

/// A linear layer `x @ w^T + b` with weights in the Hugging Face `(out, in)` layout.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    /// Wraps a weight `(out, in)` and optional bias `(out)`.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Linear {
        Linear { weight, bias }
    }

    /// The same layer with its tensors detached from any graph.
    pub fn detached(&self) -> Linear {
        Linear {
            weight: self.weight.detach(),
            bias: self.bias.as_ref().map(Tensor::detach),
        }
    }

    /// Appends the tensors that track gradients (weight, bias) to `out`.
    pub fn push_params(&self, out: &mut Vec<Tensor>) {
        push_tracked(out, &self.weight);
        if let Some(b) = &self.bias {
            push_tracked(out, b);
        }
    }
}

/// Appends `t` to `out` if it tracks gradients.
fn push_tracked(out: &mut Vec<Tensor>, t: &Tensor) {
    if t.track_op() {
        out.push(t.clone());
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if super::fused::applies(&[x, &self.weight]) {
            let y = super::fused::linear(x, &self.weight)?;
            return match &self.bias {
                Some(b) => y.broadcast_add(b),
                None => Ok(y),
            };
        }
        // (.., in) -> (rows, in) @ (in, out): one GEMM whatever the leading dims.
        let dims = x.dims().to_vec();
        let inner = dims[dims.len() - 1];
        let rows: usize = dims[..dims.len() - 1].iter().product();
        let y = x.reshape((rows, inner))?.matmul(&self.weight.t()?)?;
        let y = match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        let mut out_dims = dims;
        let last = out_dims.len() - 1;
        out_dims[last] = self.weight.dim(0)?;
        y.reshape(out_dims)
    }
}

/// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) * w`, computed in f32 and cast
/// back to the input dtype before the weight is applied (as transformers does).
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// Wraps a norm weight.
    pub fn new(weight: Tensor, eps: f64) -> RmsNorm {
        RmsNorm { weight, eps }
    }

    /// The same norm with its weight detached from any graph.
    pub fn detached(&self) -> RmsNorm {
        RmsNorm {
            weight: self.weight.detach(),
            eps: self.eps,
        }
    }

    /// Appends the weight to `out` if it tracks gradients.
    pub fn push_params(&self, out: &mut Vec<Tensor>) {
        push_tracked(out, &self.weight);
    }

    /// Applies the norm.
    pub fn forward(&self, x: &Tensor, mode: OpsMode) -> Result<Tensor> {
        if mode == OpsMode::Infer {
            let x = x.contiguous()?;
            return Ok(candle_nn::ops::rms_norm(&x, &self.weight, self.eps as f32)?);
        }
        if super::fused::applies(&[x, &self.weight]) {
            return Ok(super::fused::rms_norm(x, &self.weight, self.eps)?);
        }
        let dtype = x.dtype();
        let xf = x.to_dtype(DType::F32)?;
        let var = xf.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = xf.broadcast_div(&(var + self.eps)?.sqrt()?)?;
        Ok(normed.to_dtype(dtype)?.broadcast_mul(&self.weight)?)
    }
}

/// Softmax over the last dimension, in f32.
pub fn softmax_last(x: &Tensor, mode: OpsMode) -> Result<Tensor> {
    match mode {
        OpsMode::Infer => Ok(candle_nn::ops::softmax_last_dim(&x.contiguous()?)?),
        OpsMode::Train => {
            // The max is a constant shift: detaching it keeps the graph small and exact.
            let max = x.max_keepdim(D::Minus1)?.detach();
            let e = x.broadcast_sub(&max)?.exp()?;
            Ok(e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?)
        }
    }
}

/// `log_softmax(logits)[target]` for every position, without materialising the full
/// log-softmax: `logit[target] - logsumexp(logits)`. `logits` is `(.., vocab)`, `targets` has
/// the leading dims and dtype u32. Differentiable.
pub fn gather_logprobs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let logits = logits.to_dtype(DType::F32)?;
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let picked = shifted.gather(&targets.unsqueeze(D::Minus1)?.contiguous()?, D::Minus1)?;
    Ok((picked - lse)?.squeeze(D::Minus1)?)
}

/// Precomputed rotary tables: `cos`, `sin` of shape `(max_positions, head_dim / 2)`.
#[derive(Debug, Clone)]
pub struct Rotary {
    cos: Tensor,
    sin: Tensor,
}

impl Rotary {
    /// Tables for positions `0..max_positions` with base `theta`, in f32 then cast to `dtype`.
    pub fn new(
        head_dim: usize,
        max_positions: usize,
        theta: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Rotary> {
        let half = head_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64) as f32)
            .collect();
        let inv_freq = Tensor::from_vec(inv_freq, (1, half), device)?;
        let pos = Tensor::arange(0u32, max_positions as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((max_positions, 1))?;
        let freqs = pos.broadcast_mul(&inv_freq)?;
        Ok(Rotary {
            cos: freqs.cos()?.to_dtype(dtype)?,
            sin: freqs.sin()?.to_dtype(dtype)?,
        })
    }

    /// Gathers `(cos, sin)` for `positions` `(b, s)` u32: each `(b, 1, s, head_dim / 2)`.
    pub fn at(&self, positions: &Tensor) -> Result<(Tensor, Tensor)> {
        let (b, s) = positions.dims2()?;
        let flat = positions.flatten_all()?;
        let half = self.cos.dim(1)?;
        let cos = self.cos.index_select(&flat, 0)?.reshape((b, 1, s, half))?;
        let sin = self.sin.index_select(&flat, 0)?.reshape((b, 1, s, half))?;
        Ok((cos, sin))
    }
}

/// Applies rotary embeddings (the "rotate half" convention of transformers) to `x`
/// `(b, heads, s, head_dim)` with `cos`/`sin` `(b, 1, s, head_dim / 2)`.
pub fn apply_rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let out1 = (x1.broadcast_mul(cos)? - x2.broadcast_mul(sin)?)?;
    let out2 = (x2.broadcast_mul(cos)? + x1.broadcast_mul(sin)?)?;
    Ok(Tensor::cat(&[out1, out2], D::Minus1)?)
}

/// SwiGLU MLP: `down(silu(gate(x)) * up(x))`.
#[derive(Debug, Clone)]
pub struct Mlp {
    /// Gate projection.
    pub gate: Linear,
    /// Up projection.
    pub up: Linear,
    /// Down projection.
    pub down: Linear,
}

impl Mlp {
    /// The same MLP with its tensors detached from any graph.
    pub fn detached(&self) -> Mlp {
        Mlp {
            gate: self.gate.detached(),
            up: self.up.detached(),
            down: self.down.detached(),
        }
    }

    /// Appends the tensors that track gradients to `out`.
    pub fn push_params(&self, out: &mut Vec<Tensor>) {
        self.gate.push_params(out);
        self.up.push_params(out);
        self.down.push_params(out);
    }

    /// Applies the MLP.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (g, u) = (self.gate.forward(x)?, self.up.forward(x)?);
        let h = if super::fused::applies(&[&g, &u]) {
            super::fused::swiglu(&g, &u)?
        } else {
            (g.silu()? * u)?
        };
        Ok(self.down.forward(&h)?)
    }
}
