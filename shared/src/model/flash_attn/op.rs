//! The candle custom ops: [`FlashAttn`] (forward, with backward through autograd) and the
//! backward kernel it calls from `bwd`.

use std::sync::{Arc, OnceLock};

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};

use super::cpu::{self, Dims, Elem};
use super::Segments;

/// Fused causal attention over `(q, k, v)`, applied with [`Tensor::apply_op3`] (see
/// [`super::flash_attn`], which validates the inputs first).
///
/// One instance serves one forward call: `cpu_fwd` stores the log-sum-exp of every query row
/// in the instance, where `bwd` (called by autograd with the same instance) finds it.
#[derive(Debug)]
pub struct FlashAttn {
    segments: Arc<Segments>,
    scale: f32,
    /// `(b, heads, t)` log-sum-exp of the forward, set once by `cpu_fwd`.
    lse: OnceLock<Vec<f32>>,
}

impl FlashAttn {
    /// An op for inputs described by `segments`, with scores multiplied by `scale`.
    pub fn new(segments: Arc<Segments>, scale: f32) -> FlashAttn {
        FlashAttn {
            segments,
            scale,
            lse: OnceLock::new(),
        }
    }
}

/// The shapes of `(q, k, v)` layouts, checked against each other and the segments.
fn dims_of(segments: &Segments, q: &Layout, k: &Layout, v: &Layout) -> candle_core::Result<Dims> {
    let (b, heads, t, d) = q.shape().dims4()?;
    let (bk, kv_heads, tk, dk) = k.shape().dims4()?;
    if (bk, tk, dk) != (b, t, d) || v.dims() != k.dims() || kv_heads == 0 || heads % kv_heads != 0 {
        candle_core::bail!(
            "flash-attn: q {:?}, k {:?}, v {:?} do not fit (b, heads, t, d) / (b, kv_heads, t, d)",
            q.dims(),
            k.dims(),
            v.dims()
        );
    }
    segments
        .check_shape(b, t)
        .map_err(candle_core::Error::wrap)?;
    Ok(Dims {
        b,
        heads,
        kv_heads,
        t,
        d,
    })
}

/// The elements of a contiguous tensor's storage.
fn contiguous<'a, T>(data: &'a [T], layout: &Layout, what: &str) -> candle_core::Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => candle_core::bail!("flash-attn: {what} is not contiguous"),
    }
}

impl FlashAttn {
    fn forward<T: Elem>(
        &self,
        (q, k, v): (&[T], &[T], &[T]),
        (lq, lk, lv): (&Layout, &Layout, &Layout),
        wrap: fn(Vec<T>) -> CpuStorage,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let dims = dims_of(&self.segments, lq, lk, lv)?;
        let (q, k, v) = (
            contiguous(q, lq, "q")?,
            contiguous(k, lk, "k")?,
            contiguous(v, lv, "v")?,
        );
        let mut out = vec![T::from_f32(0.0); q.len()];
        let mut lse = vec![0f32; dims.b * dims.heads * dims.t];
        let table = self.segments.position_table();
        cpu::forward(q, k, v, dims, &table, self.scale, &mut out, &mut lse);
        if self.lse.set(lse).is_err() {
            candle_core::bail!("flash-attn: one op instance ran its forward twice");
        }
        Ok((wrap(out), lq.shape().clone()))
    }
}

impl CustomOp3 for FlashAttn {
    fn name(&self) -> &'static str {
        "flash-attn"
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
        let layouts = (l1, l2, l3);
        match (s1, s2, s3) {
            (CpuStorage::F32(q), CpuStorage::F32(k), CpuStorage::F32(v)) => {
                self.forward((q, k, v), layouts, CpuStorage::F32)
            }
            (CpuStorage::BF16(q), CpuStorage::BF16(k), CpuStorage::BF16(v)) => {
                self.forward((q, k, v), layouts, CpuStorage::BF16)
            }
            (CpuStorage::F16(q), CpuStorage::F16(k), CpuStorage::F16(v)) => {
                self.forward((q, k, v), layouts, CpuStorage::F16)
            }
            _ => candle_core::bail!(
                "flash-attn: q, k, v must share one dtype of f32, bf16, f16 (got {:?}, {:?}, {:?})",
                s1.dtype(),
                s2.dtype(),
                s3.dtype()
            ),
        }
    }

    // Not behind `feature = "cuda"`: the signature is the same with candle's stand-in
    // `CudaStorage`, so the CPU-only build type-checks this override too.
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        candle_core::bail!(
            "flash-attn: no CUDA kernel yet; the model uses its unfused attention on a GPU"
        )
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        grad_out: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let Some(lse) = self.lse.get() else {
            candle_core::bail!("flash-attn: backward before the forward stored its log-sum-exp");
        };
        // The backward kernel needs five tensors; a custom op takes three. q, O and dO share a
        // shape and dtype, so they travel stacked: (3, b, heads, t, d). O(t) extra memory.
        let grad_out = grad_out.to_dtype(q.dtype())?;
        let qog = Tensor::stack(&[&q.detach(), &out.detach(), &grad_out.detach()], 0)?;
        let op = FlashAttnBwd {
            segments: self.segments.clone(),
            scale: self.scale,
            lse: lse.clone(),
        };
        let packed = qog.apply_op3_no_bwd(&k.detach(), &v.detach(), &op)?;
        // packed: dq, dk, dv flattened and concatenated.
        let (nq, nk) = (q.elem_count(), k.elem_count());
        let dq = packed.narrow(0, 0, nq)?.reshape(q.shape())?;
        let dk = packed.narrow(0, nq, nk)?.reshape(k.shape())?;
        let dv = packed.narrow(0, nq + nk, nk)?.reshape(v.shape())?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

/// The backward kernel as an op without backward: inputs `(stack(q, O, dO), k, v)`, output
/// `dq`, `dk`, `dv` flattened into one vector.
struct FlashAttnBwd {
    segments: Arc<Segments>,
    scale: f32,
    lse: Vec<f32>,
}

impl FlashAttnBwd {
    fn backward<T: Elem>(
        &self,
        (qog, k, v): (&[T], &[T], &[T]),
        (lqog, lk, lv): (&Layout, &Layout, &Layout),
        wrap: fn(Vec<T>) -> CpuStorage,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let dims5 = lqog.dims();
        if dims5.len() != 5 || dims5[0] != 3 {
            candle_core::bail!("flash-attn backward: packed q/O/dO has shape {dims5:?}");
        }
        let lq = Layout::contiguous(&dims5[1..]);
        let dims = dims_of(&self.segments, &lq, lk, lv)?;
        let (qog, k, v) = (
            contiguous(qog, lqog, "q/O/dO")?,
            contiguous(k, lk, "k")?,
            contiguous(v, lv, "v")?,
        );
        let n = qog.len() / 3;
        let (q, rest) = qog.split_at(n);
        let (o, d_o) = rest.split_at(n);
        if self.lse.len() != dims.b * dims.heads * dims.t {
            candle_core::bail!("flash-attn backward: log-sum-exp of another shape");
        }
        let mut grads = vec![T::from_f32(0.0); n + 2 * k.len()];
        let (dq, rest) = grads.split_at_mut(n);
        let (dk, dv) = rest.split_at_mut(k.len());
        let table = self.segments.position_table();
        cpu::backward(
            q, k, v, o, d_o, &self.lse, dims, &table, self.scale, dq, dk, dv,
        );
        let len = grads.len();
        Ok((wrap(grads), Shape::from(len)))
    }
}

impl CustomOp3 for FlashAttnBwd {
    fn name(&self) -> &'static str {
        "flash-attn-bwd"
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
        let layouts = (l1, l2, l3);
        match (s1, s2, s3) {
            (CpuStorage::F32(a), CpuStorage::F32(k), CpuStorage::F32(v)) => {
                self.backward((a, k, v), layouts, CpuStorage::F32)
            }
            (CpuStorage::BF16(a), CpuStorage::BF16(k), CpuStorage::BF16(v)) => {
                self.backward((a, k, v), layouts, CpuStorage::BF16)
            }
            (CpuStorage::F16(a), CpuStorage::F16(k), CpuStorage::F16(v)) => {
                self.backward((a, k, v), layouts, CpuStorage::F16)
            }
            _ => candle_core::bail!("flash-attn backward: mixed dtypes"),
        }
    }
}
