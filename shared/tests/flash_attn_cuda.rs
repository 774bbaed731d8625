//! The CUDA fused attention against the CPU op on a GPU (built with `--features cuda` by
//! `scripts/build-gpu.sh`, run by `scripts/gpu-check.sh`): the forward's `O` and log-sum-exp
//! and `dQ`/`dK`/`dV` through candle's autograd, on shapes with GQA, packed segments, left and
//! right padding, lengths 1, 63, 64, 65, 1000, head dims 64 and 128, f32 (to 1e-4) and bf16 (to
//! 1e-2; on the tensor-core kernels and on the FMA ones). The ignored `gpu_flash_attn_benchmark`
//! times forward + backward of both bf16 kernels against the H200's bf16 FLOP bound and writes a
//! table to `$FLASH_ATTN_BENCH_OUT` (or stdout).
#![cfg(feature = "cuda")]

use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use cascade_shared::model::flash_attn::cuda::set_tensor_cores;
use cascade_shared::model::flash_attn::{flash_attn, flash_attn_lse, Segments};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn gpu() -> Device {
    Device::new_cuda(0).unwrap_or_else(|e| panic!("no CUDA device 0: {e}"))
}

fn randn(rng: &mut ChaCha8Rng, shape: &[usize]) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|_| (0..4).map(|_| rng.random::<f32>() - 0.5).sum::<f32>())
        .collect();
    Ok(Tensor::from_vec(data, shape, &Device::Cpu)?)
}

fn host(x: &Tensor) -> Result<Vec<f32>> {
    Ok(x.to_device(&Device::Cpu)?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

/// Max |a - b| over max |b| (at least 0.01, for gradients that are zero up to rounding);
/// non-finite values must match exactly.
fn rel_err(a: &[f32], b: &[f32], what: &str) -> Result<f32> {
    ensure!(
        a.len() == b.len(),
        "{what}: {} vs {} values",
        a.len(),
        b.len()
    );
    let (mut diff, mut scale) = (0f32, 0f32);
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        if !y.is_finite() {
            ensure!(x == y, "{what}[{i}]: GPU {x}, CPU {y}");
            continue;
        }
        ensure!(x.is_finite(), "{what}[{i}]: GPU {x}, CPU {y}");
        diff = diff.max((x - y).abs());
        scale = scale.max(y.abs());
    }
    Ok(diff / scale.max(0.01))
}

/// O, L and the gradients of `sum(O * g)` on `device`.
fn run(
    device: &Device,
    (q, k, v, g): (&Tensor, &Tensor, &Tensor, &Tensor),
    segments: &Arc<Segments>,
) -> Result<[Vec<f32>; 5]> {
    let (q, k, v, g) = (
        q.to_device(device)?,
        k.to_device(device)?,
        v.to_device(device)?,
        g.to_device(device)?,
    );
    let (out, lse) = flash_attn_lse(&q, &k, &v, segments, None)?;
    let (qv, kv, vv) = (
        Var::from_tensor(&q)?,
        Var::from_tensor(&k)?,
        Var::from_tensor(&v)?,
    );
    let o = flash_attn(
        qv.as_tensor(),
        kv.as_tensor(),
        vv.as_tensor(),
        segments,
        None,
    )?;
    let grads = (o.to_dtype(DType::F32)? * g.to_dtype(DType::F32)?)?
        .sum_all()?
        .backward()?;
    let grad = |x: &Var| -> Result<Vec<f32>> { host(grads.get(x.as_tensor()).context("no grad")?) };
    Ok([host(&out)?, lse, grad(&qv)?, grad(&kv)?, grad(&vv)?])
}

#[test]
fn gpu_matches_cpu_op() -> Result<()> {
    let dev = gpu();
    // (name, heads, kv heads, t, d, segments per row)
    type Rows = Vec<Vec<(usize, usize)>>;
    let cases: Vec<(&str, usize, usize, usize, usize, Rows)> = vec![
        ("t=1", 2, 1, 1, 64, vec![vec![(0, 1)]]),
        ("t=63 gqa", 4, 2, 63, 64, vec![vec![(0, 63)]]),
        (
            "t=64 d=128 left pad",
            2,
            2,
            64,
            128,
            vec![vec![(0, 64)], vec![(9, 64)]],
        ),
        (
            "t=65 d=40 packed",
            3,
            1,
            65,
            40,
            vec![vec![(0, 20), (20, 21), (21, 65)]],
        ),
        (
            "t=1000 d=128 packed/left/right/empty",
            16,
            8,
            1000,
            128,
            vec![
                vec![(0, 300), (300, 777), (777, 1000)],
                vec![(123, 1000)],
                vec![(0, 640)],
                vec![],
            ],
        ),
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for (name, h, kvh, t, d, rows) in cases {
        let b = rows.len();
        let segments = Arc::new(Segments::new(t, rows)?);
        let q = randn(&mut rng, &[b, h, t, d])?;
        let k = randn(&mut rng, &[b, kvh, t, d])?;
        let v = randn(&mut rng, &[b, kvh, t, d])?;
        let g = randn(&mut rng, &[b, h, t, d])?;
        // bf16 twice: on the tensor-core kernels (compute capability 8.0+) and the FMA ones.
        for (dtype, tol, tensor_cores) in [
            (DType::F32, 1e-4f32, false),
            (DType::BF16, 1e-2, true),
            (DType::BF16, 1e-2, false),
        ] {
            let inputs = [&q, &k, &v, &g].map(|x| x.to_dtype(dtype).unwrap());
            let args = (&inputs[0], &inputs[1], &inputs[2], &inputs[3]);
            let cpu = run(&Device::Cpu, args, &segments)?;
            set_tensor_cores(tensor_cores);
            let gpu = run(&dev, args, &segments);
            set_tensor_cores(true);
            let gpu = gpu?;
            let mut errs = Vec::new();
            for (what, (a, b)) in ["O", "L", "dQ", "dK", "dV"]
                .iter()
                .zip(gpu.iter().zip(&cpu))
            {
                errs.push((*what, rel_err(a, b, what)?));
            }
            let kernels = if tensor_cores { "tensor cores" } else { "FMA" };
            eprintln!("{name} {dtype:?} {kernels}: relative errors {errs:?}");
            for (what, err) in errs {
                ensure!(
                    err <= tol,
                    "{name} {dtype:?} {kernels}: {what} off by {err:e} (tol {tol:e})"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn unsupported_head_dim_is_an_error() -> Result<()> {
    let dev = gpu();
    let x = Tensor::zeros((1, 1, 4, 256), DType::F32, &dev)?;
    let err = flash_attn(&x, &x, &x, &Arc::new(Segments::causal(1, 4)), None).unwrap_err();
    assert!(err.to_string().contains("head dim 256"), "{err}");
    Ok(())
}

/// Forward and forward + backward of the Qwen3-0.6B attention shape (16 heads, 8 kv heads,
/// head dim 128), bf16, causal, against the H200's nominal dense bf16 rate (989 TFLOP/s), on the
/// tensor-core kernels and on the FMA ones (same inputs, same run). FLOPs counted as
/// FlashAttention-2 does for causal attention: forward 2 b h t² d, backward 2.5 × that.
#[test]
#[ignore]
fn gpu_flash_attn_benchmark() -> Result<()> {
    const PEAK: f64 = 989e12;
    let dev = gpu();
    let mut table = String::from(
        "## Fused attention on the GPU (bf16, causal, 16 heads / 8 kv heads, d 128)\n\n\
         | b x t | kernels | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | of 989 TFLOP/s |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for (b, t) in [(4usize, 1024usize), (1, 4096), (1, 16384)] {
        let (h, kvh, d) = (16, 8, 128);
        let segments = Arc::new(Segments::causal(b, t));
        let mk = |rng: &mut ChaCha8Rng, heads| -> Result<Tensor> {
            Ok(randn(rng, &[b, heads, t, d])?
                .to_dtype(DType::BF16)?
                .to_device(&dev)?)
        };
        let (q, k, v, g) = (
            mk(&mut rng, h)?,
            mk(&mut rng, kvh)?,
            mk(&mut rng, kvh)?,
            mk(&mut rng, h)?,
        );
        let (qv, kv, vv) = (
            Var::from_tensor(&q)?,
            Var::from_tensor(&k)?,
            Var::from_tensor(&v)?,
        );
        let fwd = || flash_attn(&q, &k, &v, &segments, None);
        let fwd_bwd = || -> Result<()> {
            let o = flash_attn(
                qv.as_tensor(),
                kv.as_tensor(),
                vv.as_tensor(),
                &segments,
                None,
            )?;
            let grads = (o * &g)?.sum_all()?.backward()?;
            ensure!(grads.get(qv.as_tensor()).is_some(), "no gradient");
            Ok(())
        };
        for tensor_cores in [true, false] {
            set_tensor_cores(tensor_cores);
            // Warm-up (NVRTC compile, module load).
            fwd()?;
            fwd_bwd()?;
            dev.synchronize()?;
            let reps = if t >= 16384 { 3 } else { 10 };
            let t0 = Instant::now();
            for _ in 0..reps {
                fwd()?;
            }
            dev.synchronize()?;
            let fwd_s = t0.elapsed().as_secs_f64() / reps as f64;
            let t0 = Instant::now();
            for _ in 0..reps {
                fwd_bwd()?;
            }
            dev.synchronize()?;
            let all_s = t0.elapsed().as_secs_f64() / reps as f64;
            let flops_fwd = 2.0 * (b * h) as f64 * (t * t) as f64 * d as f64;
            let flops_all = 3.5 * flops_fwd;
            let kernels = if tensor_cores { "tensor cores" } else { "FMA" };
            table.push_str(&format!(
                "| {b} x {t} | {kernels} | {:.2} | {:.1} | {:.2} | {:.1} | {:.1}% |\n",
                fwd_s * 1e3,
                flops_fwd / fwd_s / 1e12,
                all_s * 1e3,
                flops_all / all_s / 1e12,
                100.0 * flops_all / all_s / PEAK
            ));
        }
        set_tensor_cores(true);
    }
    match std::env::var("FLASH_ATTN_BENCH_OUT") {
        Ok(path) => std::fs::write(&path, &table)?,
        Err(_) => println!("{table}"),
    }
    println!("{table}");
    Ok(())
}
