//! The gradient sums of a step (`learner.grad_accum`): each micro-batch's gradients added into
//! a running sum per parameter, and the squared norm of the sum as the update sees it.
//!
//! On the CPU both run over the storage directly: the gradient is added into the sum in place,
//! each element converted on the way (no copy of the gradient in the sum's dtype, no new sum
//! tensor), and the norm reads the sum without a copy. Elsewhere (CUDA) they are tensor
//! operations, whose temporaries are one parameter's size at a time.

use std::ops::AddAssign;

use candle_core::backend::BackendStorage;
use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, DType, Layout, Storage, Tensor, Var};
use half::{bf16, f16};
use rayon::prelude::*;

use crate::error::Result;

/// Elements per parallel piece of an in-place add.
const PIECE: usize = 1 << 15;

/// `sum += gradient` in place, for a contiguous f64 or f32 `sum` on the CPU and a contiguous
/// gradient of the same length in f32, bf16, f16 or the sum's dtype. Each element is converted
/// exactly (every f32, bf16 and f16 value is an f64 and an f32 value too), then added.
struct AddInto;

fn add_slices<A, B>(sum: &mut [A], g: &[B], convert: impl Fn(B) -> A + Sync)
where
    A: AddAssign + Copy + Send,
    B: Copy + Sync,
{
    sum.par_chunks_mut(PIECE)
        .zip(g.par_chunks(PIECE))
        .for_each(|(s, g)| {
            s.iter_mut().zip(g).for_each(|(a, &b)| *a += convert(b));
        });
}

impl candle_core::InplaceOp2 for AddInto {
    fn name(&self) -> &'static str {
        "gradient-add-into"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<()> {
        let (Some((a0, a1)), Some((b0, b1))) = (l1.contiguous_offsets(), l2.contiguous_offsets())
        else {
            candle_core::bail!("gradient-add-into: non-contiguous operands")
        };
        if a1 - a0 != b1 - b0 {
            candle_core::bail!("gradient-add-into: {} elements into {}", b1 - b0, a1 - a0)
        }
        match (s1, s2) {
            (CpuStorage::F64(a), CpuStorage::F32(b)) => {
                add_slices(&mut a[a0..a1], &b[b0..b1], f64::from)
            }
            (CpuStorage::F64(a), CpuStorage::BF16(b)) => {
                add_slices(&mut a[a0..a1], &b[b0..b1], bf16::to_f64)
            }
            (CpuStorage::F64(a), CpuStorage::F16(b)) => {
                add_slices(&mut a[a0..a1], &b[b0..b1], f16::to_f64)
            }
            (CpuStorage::F64(a), CpuStorage::F64(b)) => {
                add_slices(&mut a[a0..a1], &b[b0..b1], |x| x)
            }
            (CpuStorage::F32(a), CpuStorage::F32(b)) => {
                add_slices(&mut a[a0..a1], &b[b0..b1], |x| x)
            }
            (CpuStorage::F32(a), CpuStorage::BF16(b)) => {
                add_slices(&mut a[a0..a1], &b[b0..b1], bf16::to_f32)
            }
            (CpuStorage::F32(a), CpuStorage::F16(b)) => {
                add_slices(&mut a[a0..a1], &b[b0..b1], f16::to_f32)
            }
            (a, b) => candle_core::bail!("gradient-add-into: {:?} into {:?}", b.dtype(), a.dtype()),
        }
        Ok(())
    }
}

/// Adds `var`'s gradient in `grads` (if any) to the running sum in `slot`, kept in `dtype` (f32
/// or f64). The first gradient is copied (never shared with `grads`, which another parameter's
/// gradient or the caller may still use); later ones are added in place on the CPU.
pub(crate) fn add_gradient(
    slot: &mut Option<Tensor>,
    grads: &GradStore,
    var: &Var,
    dtype: DType,
) -> Result<()> {
    let Some(g) = grads.get(var.as_tensor()) else {
        return Ok(());
    };
    *slot = Some(match slot.take() {
        None if g.dtype() == dtype => g.force_contiguous()?,
        None => g.to_dtype(dtype)?,
        Some(sum) if sum.device().is_cpu() && sum.is_contiguous() && g.is_contiguous() => {
            sum.inplace_op2(g, &AddInto)?;
            sum
        }
        Some(sum) => (sum + g.to_dtype(dtype)?)?,
    });
    Ok(())
}

/// Σ x² in f64 of the gradient sum `g` rounded to f32 (the values the update uses).
pub(crate) fn squared_norm_as_f32(g: &Tensor) -> Result<f64> {
    if g.device().is_cpu() && g.is_contiguous() {
        let (storage, layout) = g.storage_and_layout();
        if let (Storage::Cpu(cpu), Some((o0, o1))) = (&*storage, layout.contiguous_offsets()) {
            let square = |x: f32| f64::from(x) * f64::from(x);
            match cpu {
                CpuStorage::F64(v) => {
                    return Ok(v[o0..o1].iter().map(|&x| square(x as f32)).sum());
                }
                CpuStorage::F32(v) => return Ok(v[o0..o1].iter().map(|&x| square(x)).sum()),
                _ => {}
            }
        }
    }
    Ok(g.to_dtype(DType::F32)?
        .to_dtype(DType::F64)?
        .sqr()?
        .sum_all()?
        .to_scalar::<f64>()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn store(var: &Var, scale: f64) -> GradStore {
        (var.as_tensor().sqr().unwrap() * scale)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap()
    }

    /// A first gradient that is a view of a larger buffer (backward stores gradients as the ops
    /// return them) starts a sum of its own size, not a copy of the whole buffer.
    #[test]
    fn a_view_gradient_starts_a_compact_sum() {
        let var = Var::from_tensor(&Tensor::zeros(8, DType::F32, &Device::Cpu).unwrap()).unwrap();
        let buffer = Tensor::arange(0f32, 1000f32, &Device::Cpu).unwrap();
        let mut grads = GradStore::default();
        grads.insert(var.as_tensor(), buffer.narrow(0, 500, 8).unwrap());
        let mut slot = None;
        add_gradient(&mut slot, &grads, &var, DType::F32).unwrap();
        let sum = slot.unwrap();
        let (storage, layout) = sum.storage_and_layout();
        let Storage::Cpu(CpuStorage::F32(v)) = &*storage else {
            panic!("not a CPU f32 sum")
        };
        assert_eq!((v.len(), layout.start_offset()), (8, 0));
        assert_eq!(v[..], (500..508).map(|i| i as f32).collect::<Vec<_>>()[..]);
    }

    /// In-place sums on the CPU equal the tensor-op sums, in f32 and f64, from f32 and bf16
    /// gradients, and the first gradient is copied, not shared.
    #[test]
    fn in_place_sums_are_the_tensor_sums_and_never_share_the_gradient() {
        for weights in [DType::F32, DType::BF16] {
            let w = Tensor::arange(0f32, 70_000f32, &Device::Cpu)
                .unwrap()
                .affine(1e-4, -3.0)
                .unwrap()
                .to_dtype(weights)
                .unwrap();
            let var = Var::from_tensor(&w).unwrap();
            let stores: Vec<GradStore> = [1.0, 0.3, -2.5, 1e-6]
                .iter()
                .map(|&s| store(&var, s))
                .collect();
            for dtype in [DType::F32, DType::F64] {
                let mut slot = None;
                let mut want: Option<Tensor> = None;
                for s in &stores {
                    add_gradient(&mut slot, s, &var, dtype).unwrap();
                    let g = s.get(var.as_tensor()).unwrap().to_dtype(dtype).unwrap();
                    want = Some(match want {
                        None => g,
                        Some(w) => (w + g).unwrap(),
                    });
                }
                let (got, want) = (slot.unwrap(), want.unwrap());
                assert_eq!(got.dtype(), dtype);
                let diff = (&got - &want)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_dtype(DType::F64)
                    .unwrap()
                    .to_scalar::<f64>()
                    .unwrap();
                assert_eq!(diff, 0.0, "{weights:?} weights, {dtype:?} sums");
                // The first store's gradient is untouched by the later in-place adds.
                let first = stores[0].get(var.as_tensor()).unwrap();
                let again = store(&var, 1.0);
                let same = (first.to_dtype(DType::F64).unwrap()
                    - again
                        .get(var.as_tensor())
                        .unwrap()
                        .to_dtype(DType::F64)
                        .unwrap())
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f64>()
                .unwrap();
                assert_eq!(same, 0.0);
                let norm = squared_norm_as_f32(&got).unwrap();
                let want_norm = got
                    .to_dtype(DType::F32)
                    .unwrap()
                    .to_dtype(DType::F64)
                    .unwrap()
                    .sqr()
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .to_scalar::<f64>()
                    .unwrap();
                assert!(
                    (norm - want_norm).abs() <= 1e-12 * want_norm,
                    "{norm} {want_norm}"
                );
            }
        }
    }
}
