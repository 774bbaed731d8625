//! The candle custom ops: [`FlashAttn`] (forward, with backward through autograd) and the
//! backward kernel it calls from `bwd`. CPU kernels always; the CUDA kernels
//! ([`super::cuda`]) with the `cuda` feature.

use std::sync::{Arc, OnceLock};

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};

use super::cpu::{self, Dims, Elem};
#[cfg(feature = "cuda")]
use super::kernels::KernelDtype;
use super::Segments;

/// Fused causal attention over `(q, k, v)`, applied with [`Tensor::apply_op3`] (see
/// [`super::flash_attn`], which validates the inputs first).
///
/// One instance serves one forward call: `cpu_fwd`/`cuda_fwd` stores the log-sum-exp of every
/// query row in the instance (on the device of the inputs), where `bwd` (called by autograd
/// with the same instance) finds it.
#[derive(Debug)]
pub struct FlashAttn {
    segments: Arc<Segments>,
    scale: f32,
    /// `(b, heads, t)` log-sum-exp of the forward, set once by the forward.
    lse: Arc<OnceLock<SavedLse>>,
}

/// The forward's log-sum-exp, where the forward ran.
pub(crate) enum SavedLse {
    /// From `cpu_fwd`.
    Cpu(Vec<f32>),
    /// From `cuda_fwd`: f32 on the device.
    #[cfg(feature = "cuda")]
    Cuda {
        lse: cudarc::driver::CudaSlice<f32>,
        device: candle_core::CudaDevice,
    },
}

impl std::fmt::Debug for SavedLse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SavedLse::Cpu(v) => write!(f, "SavedLse::Cpu({} rows)", v.len()),
            #[cfg(feature = "cuda")]
            SavedLse::Cuda { lse, device } => {
                write!(f, "SavedLse::Cuda({} rows on {device:?})", lse.len())
            }
        }
    }
}

impl SavedLse {
    /// A host copy.
    pub(crate) fn to_host(&self) -> candle_core::Result<Vec<f32>> {
        match self {
            SavedLse::Cpu(v) => Ok(v.clone()),
            #[cfg(feature = "cuda")]
            SavedLse::Cuda { lse, device } => device.clone_dtoh(lse),
        }
    }
}

impl FlashAttn {
    /// An op for inputs described by `segments`, with scores multiplied by `scale`.
    pub fn new(segments: Arc<Segments>, scale: f32) -> FlashAttn {
        FlashAttn {
            segments,
            scale,
            lse: Arc::new(OnceLock::new()),
        }
    }

    /// Where the forward stores its log-sum-exp (readable after `apply_op3`).
    pub(crate) fn lse_slot(&self) -> Arc<OnceLock<SavedLse>> {
        self.lse.clone()
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
        if self.lse.set(SavedLse::Cpu(lse)).is_err() {
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

    // Without `cuda`, candle's stand-in `CudaStorage` can never be built: the override only
    // documents that there is no kernel in this build.
    #[cfg(not(feature = "cuda"))]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        candle_core::bail!("flash-attn: built without the `cuda` feature; no CUDA kernel")
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::CudaStorageSlice as S;
        let layouts = (l1, l2, l3);
        match (&s1.slice, &s2.slice, &s3.slice) {
            (S::F32(q), S::F32(k), S::F32(v)) => {
                self.cuda_forward((q, k, v), layouts, &s1.device, KernelDtype::F32)
            }
            (S::BF16(q), S::BF16(k), S::BF16(v)) => {
                self.cuda_forward((q, k, v), layouts, &s1.device, KernelDtype::Bf16)
            }
            _ => candle_core::bail!(
                "flash-attn: the CUDA kernels take q, k, v of one dtype, f32 or bf16 (got {:?}, \
                 {:?}, {:?})",
                s1.dtype(),
                s2.dtype(),
                s3.dtype()
            ),
        }
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        grad_out: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        if self.lse.get().is_none() {
            candle_core::bail!("flash-attn: backward before the forward stored its log-sum-exp");
        }
        // The backward kernel needs five tensors; a custom op takes three. q, O and dO share a
        // shape and dtype, so they travel stacked: (3, b, heads, t, d). O(t) extra memory.
        let grad_out = grad_out.to_dtype(q.dtype())?;
        let qog = Tensor::stack(&[&q.detach(), &out.detach(), &grad_out.detach()], 0)?;
        let op = FlashAttnBwd {
            segments: self.segments.clone(),
            scale: self.scale,
            lse: self.lse.clone(),
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
    /// Set by the forward (checked by `bwd` before this op is built).
    lse: Arc<OnceLock<SavedLse>>,
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
        let lse = match self.lse.get() {
            Some(SavedLse::Cpu(lse)) => lse,
            _ => candle_core::bail!("flash-attn backward: no CPU log-sum-exp from the forward"),
        };
        if lse.len() != dims.b * dims.heads * dims.t {
            candle_core::bail!("flash-attn backward: log-sum-exp of another shape");
        }
        let mut grads = vec![T::from_f32(0.0); n + 2 * k.len()];
        let (dq, rest) = grads.split_at_mut(n);
        let (dk, dv) = rest.split_at_mut(k.len());
        let table = self.segments.position_table();
        cpu::backward(q, k, v, o, d_o, lse, dims, &table, self.scale, dq, dk, dv);
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

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::CudaStorageSlice as S;
        let layouts = (l1, l2, l3);
        match (&s1.slice, &s2.slice, &s3.slice) {
            (S::F32(a), S::F32(k), S::F32(v)) => {
                self.cuda_backward((a, k, v), layouts, &s1.device, KernelDtype::F32)
            }
            (S::BF16(a), S::BF16(k), S::BF16(v)) => {
                self.cuda_backward((a, k, v), layouts, &s1.device, KernelDtype::Bf16)
            }
            _ => candle_core::bail!("flash-attn backward: the CUDA kernels take f32 or bf16"),
        }
    }
}

/// The CUDA side of both ops: candle's device buffers in, [`super::cuda`]'s launches on
/// candle's stream.
#[cfg(feature = "cuda")]
mod on_cuda {
    use candle_core::cuda_backend::{CudaDType, CudaDevice};
    use candle_core::{CudaStorage, Layout, Shape};
    use cudarc::driver::{CudaSlice, CudaView, DeviceRepr, ValidAsZeroBits};

    use super::super::cuda::{self as kernels, CallDims, DeviceSegments};
    use super::super::kernels::{Kernel, KernelDtype, Tiles};
    use super::super::Segments;
    use super::{dims_of, FlashAttn, FlashAttnBwd, SavedLse};

    /// candle's cache keys for the loaded `flash_attn.cu` module and the tensor-core one.
    const MODULE: &str = "cascade_flash_attn";
    const MMA_MODULE: &str = kernels::MMA_MODULE;

    /// The kernel variant of a call of `dtype` on `device`, and the module and PTX holding it.
    fn variant(
        device: &CudaDevice,
        dims: &CallDims,
        dtype: KernelDtype,
    ) -> candle_core::Result<(Tiles, &'static str, &'static str)> {
        let (major, _) = device
            .cuda_stream()
            .context()
            .compute_capability()
            .map_err(candle_core::Error::wrap)?;
        if kernels::uses_tensor_cores(dtype, major) {
            Ok((dims.tiles_of(true)?, MMA_MODULE, kernels::mma_ptx()?))
        } else {
            Ok((dims.tiles()?, MODULE, kernels::ptx()?))
        }
    }

    /// The elements of a contiguous tensor's device buffer.
    fn view<'a, T>(
        slice: &'a CudaSlice<T>,
        layout: &Layout,
        what: &str,
    ) -> candle_core::Result<CudaView<'a, T>> {
        match layout.contiguous_offsets() {
            Some((start, end)) => Ok(slice.slice(start..end)),
            None => candle_core::bail!("flash-attn: {what} is not contiguous"),
        }
    }

    /// `(seg_off, segs)` on the device.
    fn upload(
        device: &CudaDevice,
        segments: &Segments,
    ) -> candle_core::Result<(CudaSlice<u32>, CudaSlice<u32>)> {
        let (seg_off, segs) = segments.device_arrays();
        Ok((device.clone_htod(&seg_off)?, device.clone_htod(&segs)?))
    }

    fn call_dims(
        segments: &Segments,
        scale: f32,
        layouts: (&Layout, &Layout, &Layout),
    ) -> candle_core::Result<CallDims> {
        let d = dims_of(segments, layouts.0, layouts.1, layouts.2)?;
        Ok(CallDims {
            b: d.b,
            heads: d.heads,
            kv_heads: d.kv_heads,
            t: d.t,
            d: d.d,
            scale,
        })
    }

    impl FlashAttn {
        pub(super) fn cuda_forward<T: DeviceRepr + ValidAsZeroBits + CudaDType>(
            &self,
            (q, k, v): (&CudaSlice<T>, &CudaSlice<T>, &CudaSlice<T>),
            (lq, lk, lv): (&Layout, &Layout, &Layout),
            device: &CudaDevice,
            dtype: KernelDtype,
        ) -> candle_core::Result<(CudaStorage, Shape)> {
            let dims = call_dims(&self.segments, self.scale, (lq, lk, lv))?;
            let (tiles, module, ptx) = variant(device, &dims, dtype)?;
            let func = device.get_or_load_custom_func(
                &tiles.entry(Kernel::Forward, dtype),
                module,
                ptx,
            )?;
            let (seg_off, segs) = upload(device, &self.segments)?;
            let segments = DeviceSegments {
                seg_off: seg_off.as_view(),
                segs: segs.as_view(),
            };
            let mut out = device.alloc_zeros::<T>(lq.shape().elem_count())?;
            let mut lse = device.alloc_zeros::<f32>(dims.b * dims.heads * dims.t)?;
            kernels::launch_forward(
                &device.cuda_stream(),
                (&func, tiles),
                &dims,
                (&view(q, lq, "q")?, &view(k, lk, "k")?, &view(v, lv, "v")?),
                &segments,
                &mut out.as_view_mut(),
                &mut lse.as_view_mut(),
            )?;
            let saved = SavedLse::Cuda {
                lse,
                device: device.clone(),
            };
            if self.lse.set(saved).is_err() {
                candle_core::bail!("flash-attn: one op instance ran its forward twice");
            }
            Ok((
                CudaStorage::wrap_cuda_slice(out, device.clone()),
                lq.shape().clone(),
            ))
        }
    }

    impl FlashAttnBwd {
        pub(super) fn cuda_backward<T: DeviceRepr + ValidAsZeroBits + CudaDType>(
            &self,
            (qog, k, v): (&CudaSlice<T>, &CudaSlice<T>, &CudaSlice<T>),
            (lqog, lk, lv): (&Layout, &Layout, &Layout),
            device: &CudaDevice,
            dtype: KernelDtype,
        ) -> candle_core::Result<(CudaStorage, Shape)> {
            let dims5 = lqog.dims();
            if dims5.len() != 5 || dims5[0] != 3 {
                candle_core::bail!("flash-attn backward: packed q/O/dO has shape {dims5:?}");
            }
            let lq = Layout::contiguous(&dims5[1..]);
            let dims = call_dims(&self.segments, self.scale, (&lq, lk, lv))?;
            let (tiles, module, ptx) = variant(device, &dims, dtype)?;
            let lse = match self.lse.get() {
                Some(SavedLse::Cuda { lse, .. }) => lse,
                _ => {
                    candle_core::bail!("flash-attn backward: no CUDA log-sum-exp from the forward")
                }
            };
            let dq_func =
                device.get_or_load_custom_func(&tiles.entry(Kernel::Dq, dtype), module, ptx)?;
            let dkdv_func =
                device.get_or_load_custom_func(&tiles.entry(Kernel::DkDv, dtype), module, ptx)?;
            let (seg_off, segs) = upload(device, &self.segments)?;
            let segments = DeviceSegments {
                seg_off: seg_off.as_view(),
                segs: segs.as_view(),
            };
            let qog = view(qog, lqog, "q/O/dO")?;
            let n = qog.len() / 3;
            let (q, o, d_o) = (
                qog.slice(0..n),
                qog.slice(n..2 * n),
                qog.slice(2 * n..3 * n),
            );
            let (k, v) = (view(k, lk, "k")?, view(v, lv, "v")?);
            let nk = k.len();
            let mut grads = device.alloc_zeros::<T>(n + 2 * nk)?;
            let mut delta = device.alloc_zeros::<f32>(dims.b * dims.heads * dims.t)?;
            {
                let (mut dq, mut rest) = grads.split_at_mut(n);
                let (mut dk, mut dv) = rest.split_at_mut(nk);
                kernels::launch_backward(
                    &device.cuda_stream(),
                    (&dq_func, &dkdv_func, tiles),
                    &dims,
                    (&q, &o, &d_o),
                    (&k, &v),
                    &lse.as_view(),
                    &segments,
                    (&mut dq, &mut dk, &mut dv),
                    &mut delta.as_view_mut(),
                )?;
            }
            let len = grads.len();
            Ok((
                CudaStorage::wrap_cuda_slice(grads, device.clone()),
                Shape::from(len),
            ))
        }
    }
}
