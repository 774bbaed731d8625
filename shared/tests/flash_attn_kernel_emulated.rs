//! The CUDA fused-attention kernels (`src/model/flash_attn/kernels/flash_attn.cu`), compiled
//! unchanged as C++20 and run on the CPU by the project's CUDA emulation (`../tests/cuda_emu/`:
//! every CUDA thread an OS thread, `__syncthreads` a barrier, shared memory poisoned before each
//! block), against the CPU kernel: the forward's `O` and log-sum-exp, and `dQ`, `dK`, `dV`
//! through candle's autograd on the CPU op. Shapes cover GQA, packed segments, left and right
//! padding, a row of padding only, lengths 1, 63, 64, 65 and a few hundred, head dims 64, 128
//! and one below 64, f32 and bf16 (bf16 to 1e-2).
//!
//! The kernels are built with blocks of 32 threads (the same code, more work per thread; fast to
//! emulate) and once with the 128 threads the CUDA launcher uses. What only hardware decides
//! (the NVRTC build, speed) is checked elsewhere: `tests/flash_attn_ptx.rs` compiles the
//! kernels to PTX, `tests/flash_attn_cuda.rs` runs them on a GPU (`scripts/gpu-check.sh`).

#[path = "../../tests/cuda_emu/build.rs"]
mod cuda_emu;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use anyhow::{ensure, Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use cascade_shared::model::flash_attn::kernels::THREADS;
use cascade_shared::model::flash_attn::{flash_attn, flash_attn_lse, Segments};
use half::bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const KERNEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/model/flash_attn/kernels/flash_attn.cu"
);
const MMA_KERNEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/model/flash_attn/kernels/flash_attn_mma.cu"
);
const DRIVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/flash_attn_emu.cpp");

fn runner(threads: u32) -> PathBuf {
    cuda_emu::emulated_binary(
        &format!("flash_attn_{threads}"),
        Path::new(KERNEL),
        Path::new(DRIVER),
        &[
            format!("THREADS={threads}"),
            format!("MMA_SOURCE=\"{MMA_KERNEL}\""),
        ],
        Path::new(env!("CARGO_TARGET_TMPDIR")),
    )
}

struct Case {
    name: &'static str,
    heads: usize,
    kv_heads: usize,
    t: usize,
    d: usize,
    /// Segments of each batch row.
    rows: Vec<Vec<(usize, usize)>>,
}

fn randn(rng: &mut ChaCha8Rng, shape: &[usize], scale: f32) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|_| (0..4).map(|_| rng.random::<f32>() - 0.5).sum::<f32>() * scale)
        .collect();
    Ok(Tensor::from_vec(data, shape, &Device::Cpu)?)
}

/// Little-endian element bytes of a tensor in its dtype (f32 or bf16).
fn bytes(x: &Tensor) -> Result<Vec<u8>> {
    let flat = x.flatten_all()?;
    Ok(match x.dtype() {
        DType::F32 => flat
            .to_vec1::<f32>()?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::BF16 => flat
            .to_vec1::<bf16>()?
            .iter()
            .flat_map(|v| v.to_bits().to_le_bytes())
            .collect(),
        other => anyhow::bail!("dtype {other:?}"),
    })
}

/// Decodes `n` elements of `dtype` from `buf` at `*at` as f32.
fn take(buf: &[u8], at: &mut usize, n: usize, dtype: DType) -> Vec<f32> {
    let out = match dtype {
        DType::F32 => buf[*at..*at + 4 * n]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        _ => buf[*at..*at + 2 * n]
            .chunks_exact(2)
            .map(|c| bf16::from_bits(u16::from_le_bytes(c.try_into().unwrap())).to_f32())
            .collect(),
    };
    *at += n * if dtype == DType::F32 { 4 } else { 2 };
    out
}

/// What the emulated kernels return: O, L, dQ, dK, dV (as f32).
struct Outputs {
    out: Vec<f32>,
    lse: Vec<f32>,
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
}

/// Which kernels run: `fa_*` with blocks of that many threads, or the tensor-core `fam_*`
/// (bf16, blocks of 128 threads whatever `THREADS` is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernels {
    Fma(u32),
    Mma,
}

fn emulated(
    kernels: Kernels,
    (q, k, v, g): (&Tensor, &Tensor, &Tensor, &Tensor),
    segments: &Segments,
    scale: f32,
) -> Result<Outputs> {
    let (b, heads, t, d) = q.dims4()?;
    let kv_heads = k.dim(1)?;
    let dtype = q.dtype();
    let (seg_off, segs) = segments.device_arrays();
    let mut input = Vec::new();
    let (code, threads): (u32, u32) = match (kernels, dtype) {
        (Kernels::Fma(threads), DType::F32) => (0, threads),
        (Kernels::Fma(threads), _) => (1, threads),
        (Kernels::Mma, DType::BF16) => (2, 32),
        (Kernels::Mma, other) => anyhow::bail!("the tensor-core kernels take bf16, not {other:?}"),
    };
    for x in [
        code,
        b as u32,
        heads as u32,
        kv_heads as u32,
        t as u32,
        d as u32,
    ] {
        input.extend(x.to_le_bytes());
    }
    input.extend(scale.to_le_bytes());
    input.extend(((segs.len() / 2) as u32).to_le_bytes());
    input.extend(seg_off.iter().chain(&segs).flat_map(|x| x.to_le_bytes()));
    for x in [q, k, v, g] {
        input.extend(bytes(x)?);
    }
    let dir = tempfile::tempdir()?;
    let (inp, outp) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::write(&inp, &input)?;
    let run = Command::new(runner(threads))
        .arg(&inp)
        .arg(&outp)
        .output()
        .context("running the emulated kernels")?;
    ensure!(
        run.status.success(),
        "emulated kernels failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let buf = std::fs::read(&outp)?;
    let (nq, nk, rows) = (q.elem_count(), k.elem_count(), b * heads * t);
    let mut at = 0;
    let out = take(&buf, &mut at, nq, dtype);
    let lse = take(&buf, &mut at, rows, DType::F32);
    let dq = take(&buf, &mut at, nq, dtype);
    let dk = take(&buf, &mut at, nk, dtype);
    let dv = take(&buf, &mut at, nk, dtype);
    ensure!(
        at == buf.len(),
        "output has {} bytes, expected {at}",
        buf.len()
    );
    Ok(Outputs {
        out,
        lse,
        dq,
        dk,
        dv,
    })
}

/// Max |a - b| over max |b| (at least 0.01, for gradients that are zero up to rounding, as
/// with a single key); exact match required where `b` is not finite.
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
            ensure!(x == y, "{what}[{i}]: kernel {x}, CPU {y}");
            continue;
        }
        ensure!(x.is_finite(), "{what}[{i}]: kernel {x}, CPU {y}");
        diff = diff.max((x - y).abs());
        scale = scale.max(y.abs());
    }
    Ok(diff / scale.max(0.01))
}

fn to_f32_vec(x: &Tensor) -> Result<Vec<f32>> {
    Ok(x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
}

/// Runs `case` through the CPU op and the emulated kernels; asserts agreement within `tol`.
fn check(case: &Case, dtype: DType, kernels: Kernels, seed: u64) -> Result<()> {
    let b = case.rows.len();
    let segments = Arc::new(Segments::new(case.t, case.rows.clone())?);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (h, kvh, t, d) = (case.heads, case.kv_heads, case.t, case.d);
    let q = randn(&mut rng, &[b, h, t, d], 1.0)?.to_dtype(dtype)?;
    let k = randn(&mut rng, &[b, kvh, t, d], 1.0)?.to_dtype(dtype)?;
    let v = randn(&mut rng, &[b, kvh, t, d], 1.0)?.to_dtype(dtype)?;
    // dO, representable in the dtype (the op casts the incoming gradient to it).
    let g = randn(&mut rng, &[b, h, t, d], 1.0)?.to_dtype(dtype)?;
    let scale = 1.0 / (d as f32).sqrt();

    // CPU: O and L from the forward, gradients through autograd with dO = g.
    let (out_cpu, lse_cpu) = flash_attn_lse(&q, &k, &v, &segments, Some(scale))?;
    let (qv, kv, vv) = (
        Var::from_tensor(&q)?,
        Var::from_tensor(&k)?,
        Var::from_tensor(&v)?,
    );
    let out = flash_attn(
        qv.as_tensor(),
        kv.as_tensor(),
        vv.as_tensor(),
        &segments,
        Some(scale),
    )?;
    let loss = (out.to_dtype(DType::F32)? * g.to_dtype(DType::F32)?)?.sum_all()?;
    let grads = loss.backward()?;
    let grad = |x: &Var| -> Result<Vec<f32>> {
        to_f32_vec(grads.get(x.as_tensor()).context("no gradient")?)
    };

    let got = emulated(kernels, (&q, &k, &v, &g), &segments, scale)?;
    let tol = if dtype == DType::F32 { 2e-5 } else { 1e-2 };
    let errs = [
        ("O", rel_err(&got.out, &to_f32_vec(&out_cpu)?, "O")?),
        ("L", rel_err(&got.lse, &lse_cpu, "L")?),
        ("dQ", rel_err(&got.dq, &grad(&qv)?, "dQ")?),
        ("dK", rel_err(&got.dk, &grad(&kv)?, "dK")?),
        ("dV", rel_err(&got.dv, &grad(&vv)?, "dV")?),
    ];
    eprintln!(
        "{} {dtype:?} {kernels:?}: relative errors {errs:?}",
        case.name
    );
    for (what, err) in errs {
        ensure!(
            err <= tol,
            "{} ({dtype:?}, {kernels:?}): {what} differs from the CPU kernel by {err:e} \
             (tolerance {tol:e})",
            case.name
        );
    }
    Ok(())
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "t=1",
            heads: 2,
            kv_heads: 1,
            t: 1,
            d: 64,
            rows: vec![vec![(0, 1)]],
        },
        Case {
            name: "t=63 gqa 4/2",
            heads: 4,
            kv_heads: 2,
            t: 63,
            d: 64,
            rows: vec![vec![(0, 63)]],
        },
        Case {
            name: "t=64 d=128 left pad",
            heads: 2,
            kv_heads: 2,
            t: 64,
            d: 128,
            rows: vec![vec![(0, 64)], vec![(9, 64)]],
        },
        Case {
            name: "t=65 d=40 packed",
            heads: 3,
            kv_heads: 1,
            t: 65,
            d: 40,
            rows: vec![vec![(0, 20), (20, 21), (21, 65)]],
        },
        Case {
            name: "t=300 d=128 packed/left/right/empty",
            heads: 4,
            kv_heads: 2,
            t: 300,
            d: 128,
            rows: vec![
                vec![(0, 100), (100, 237), (237, 300)],
                vec![(45, 300)],
                vec![(0, 180)],
                vec![],
            ],
        },
        Case {
            name: "t=257 d=64 packed with gaps",
            heads: 2,
            kv_heads: 1,
            t: 257,
            d: 64,
            rows: vec![vec![(3, 70), (70, 150), (160, 257)]],
        },
    ]
}

#[test]
fn kernels_match_the_cpu_kernel_f32() -> Result<()> {
    for (i, case) in cases().iter().enumerate() {
        check(case, DType::F32, Kernels::Fma(32), 10 + i as u64)?;
    }
    Ok(())
}

#[test]
fn kernels_match_the_cpu_kernel_bf16() -> Result<()> {
    for (i, case) in cases().iter().enumerate() {
        check(case, DType::BF16, Kernels::Fma(32), 20 + i as u64)?;
    }
    Ok(())
}

/// The block size the CUDA launcher uses, on two shapes (one per head-dim variant).
#[test]
fn kernels_match_at_the_launch_block_size() -> Result<()> {
    let cases = cases();
    check(&cases[3], DType::F32, Kernels::Fma(THREADS), 30)?;
    check(&cases[2], DType::BF16, Kernels::Fma(THREADS), 31)?;
    Ok(())
}

/// The tensor-core kernels (`flash_attn_mma.cu`, bf16): every case, with the mma computed
/// from the warp's fragments as the PTX ISA lays them out.
#[test]
fn tensor_core_kernels_match_the_cpu_kernel() -> Result<()> {
    for (i, case) in cases().iter().enumerate() {
        check(case, DType::BF16, Kernels::Mma, 40 + i as u64)?;
    }
    Ok(())
}
