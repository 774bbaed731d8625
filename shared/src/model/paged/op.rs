//! [`PagedAttention`]: the candle custom op of [`super::paged_attention`] (no backward: decode
//! only). CPU kernel always; the CUDA kernel ([`super::cuda`]) with the `cuda` feature.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, Layout, Shape};

use super::cpu::{self, Dims};
use super::PageTable;
use crate::model::flash_attn::Elem;

/// One decode step's paged attention over `(q, k_pool, v_pool)` (see
/// [`super::paged_attention`], which validates the shapes first). One instance can serve every
/// layer of a step: the table is the same, and on a GPU it is uploaded once, on first use.
#[derive(Debug)]
pub struct PagedAttention {
    table: Arc<PageTable>,
    scale: f32,
    #[cfg(feature = "cuda")]
    device_table: std::sync::OnceLock<super::cuda::DeviceTable>,
}

impl PagedAttention {
    /// An op reading the pool rows of `table`, scores multiplied by `scale`.
    pub fn new(table: Arc<PageTable>, scale: f32) -> PagedAttention {
        PagedAttention {
            table,
            scale,
            #[cfg(feature = "cuda")]
            device_table: std::sync::OnceLock::new(),
        }
    }

    /// The rows it reads.
    pub fn table(&self) -> &PageTable {
        &self.table
    }

    /// The scores' multiplier.
    pub fn scale(&self) -> f32 {
        self.scale
    }
}

/// `(heads, kv_heads, d)` of contiguous `q` `(rows, heads, d)` and pools `(n, kv_heads, d)`.
fn dims_of(q: &Layout, k: &Layout, v: &Layout) -> candle_core::Result<Dims> {
    let (_, heads, d) = q.shape().dims3()?;
    let (_, kv_heads, dk) = k.shape().dims3()?;
    if dk != d || v.dims() != k.dims() || kv_heads == 0 || heads % kv_heads != 0 {
        candle_core::bail!(
            "paged attention: q {:?}, k {:?}, v {:?} do not fit",
            q.dims(),
            k.dims(),
            v.dims()
        );
    }
    Ok(Dims { heads, kv_heads, d })
}

fn contiguous<'a, T>(data: &'a [T], layout: &Layout, what: &str) -> candle_core::Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => candle_core::bail!("paged attention: {what} is not contiguous"),
    }
}

impl PagedAttention {
    fn forward<T: Elem>(
        &self,
        (q, k, v): (&[T], &[T], &[T]),
        (lq, lk, lv): (&Layout, &Layout, &Layout),
        wrap: fn(Vec<T>) -> CpuStorage,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let dims = dims_of(lq, lk, lv)?;
        let (q, k, v) = (
            contiguous(q, lq, "q")?,
            contiguous(k, lk, "k pool")?,
            contiguous(v, lv, "v pool")?,
        );
        let mut out = vec![T::from_f32(0.0); q.len()];
        cpu::decode(q, k, v, dims, &self.table, self.scale, &mut out);
        Ok((wrap(out), lq.shape().clone()))
    }
}

impl CustomOp3 for PagedAttention {
    fn name(&self) -> &'static str {
        "paged-attention"
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
                "paged attention: q and the pools must share one dtype of f32, bf16, f16 (got \
                 {:?}, {:?}, {:?})",
                s1.dtype(),
                s2.dtype(),
                s3.dtype()
            ),
        }
    }

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
        candle_core::bail!("paged attention: built without the `cuda` feature; no CUDA kernel")
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
        use super::kernels::KernelDtype;
        use candle_core::cuda_backend::CudaStorageSlice as S;
        let dims = dims_of(l1, l2, l3)?;
        let device = &s1.device;
        let table = match self.device_table.get() {
            Some(t) => t,
            None => {
                let t = super::cuda::DeviceTable::upload(device, &self.table)?;
                self.device_table.get_or_init(|| t)
            }
        };
        let layouts = (l1, l2, l3);
        match (&s1.slice, &s2.slice, &s3.slice) {
            (S::F32(q), S::F32(k), S::F32(v)) => super::cuda::forward(
                device,
                (q, k, v),
                layouts,
                dims,
                table,
                self.scale,
                KernelDtype::F32,
            ),
            (S::BF16(q), S::BF16(k), S::BF16(v)) => super::cuda::forward(
                device,
                (q, k, v),
                layouts,
                dims,
                table,
                self.scale,
                KernelDtype::Bf16,
            ),
            _ => candle_core::bail!(
                "paged attention: the CUDA kernel takes q and pools of one dtype, f32 or bf16 \
                 (got {:?}, {:?}, {:?})",
                s1.dtype(),
                s2.dtype(),
                s3.dtype()
            ),
        }
    }
}
