//! The CUDA paged decode attention kernel (`src/model/paged/kernels/paged_attn.cu`), compiled
//! unchanged as C++20 and run on the CPU by the project's CUDA emulation (`../tests/cuda_emu/`:
//! every CUDA thread an OS thread, `__syncthreads` a barrier, shared memory poisoned before each
//! block), against `paged_attention` on the CPU device (the CPU kernel). Shapes cover GQA
//! (16/8, 4/1, groups larger than one block's query heads: 12/1 and 10/2), MHA, head dims 128,
//! 96, 64, 40 and 18 (not a multiple of the 16-byte chunk: element-wise loads), rows of 1, 15,
//! 16, 17, 33, 200 and 300 tokens, cache blocks shuffled over a pool with unused blocks between
//! them, f32 (to 1e-5) and bf16 (to 1e-2).
//!
//! Split-K (flash-decoding: the decode kernel writes each split's partial state to a workspace,
//! the combine kernel merges them) is forced with 2, 3 and 7 splits on rows of 1, 17, 300 and
//! 1000 tokens (short rows leave splits empty; with 7 splits of 9 cache blocks, so do warps),
//! GQA 32/8 d=128 and 4/1 d=64, f32 and bf16, against the CPU kernel and, in f32, against the
//! unsplit kernel (to 1e-5). The workspace and the output start as NaN in the driver, so that a
//! record or element left unwritten fails the test.
//!
//! The kernel is built with blocks of 32 threads (one warp walks every cache block; fast to
//! emulate), with 64 (two warps, combined at the end) and once with the 128 threads the CUDA
//! launcher uses. What only hardware decides (the NVRTC build, speed) is checked elsewhere:
//! `tests/flash_attn_ptx.rs` compiles the kernel to PTX, `tests/paged_attn_cuda.rs` runs it on
//! a GPU (`scripts/gpu-check.sh`).

#[path = "../../tests/cuda_emu/build.rs"]
mod cuda_emu;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use anyhow::{ensure, Context, Result};
use candle_core::{DType, Device, Tensor};
use cascade_shared::model::paged::kernels::{SplitPlan, THREADS};
use cascade_shared::model::paged::{paged_attention, PageTable, BLOCK_TOKENS};
use half::bf16;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const KERNEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/model/paged/kernels/paged_attn.cu"
);
const DRIVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/paged_attn_emu.cpp");

fn runner(threads: u32) -> PathBuf {
    cuda_emu::emulated_binary(
        &format!("paged_attn_{threads}"),
        Path::new(KERNEL),
        Path::new(DRIVER),
        &[format!("THREADS={threads}")],
        Path::new(env!("CARGO_TARGET_TMPDIR")),
    )
}

struct Case {
    name: &'static str,
    heads: usize,
    kv_heads: usize,
    d: usize,
    /// Tokens of each decode row.
    lens: Vec<usize>,
}

fn randn(rng: &mut ChaCha8Rng, shape: &[usize]) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|_| (0..4).map(|_| rng.random::<f32>() - 0.5).sum::<f32>())
        .collect();
    Ok(Tensor::from_vec(data, shape, &Device::Cpu)?)
}

/// A table for `lens` whose blocks are scattered over a pool of `3 + Σ blocks` blocks in a
/// random order (some never used); returns it and the pool's block count.
fn scattered_table(rng: &mut ChaCha8Rng, lens: &[usize]) -> Result<(PageTable, usize)> {
    let needed: usize = lens.iter().map(|l| l.div_ceil(BLOCK_TOKENS)).sum();
    let pool_blocks = needed + 3;
    let mut ids: Vec<u32> = (0..pool_blocks as u32).collect();
    ids.shuffle(rng);
    let mut rows = Vec::new();
    let mut at = 0;
    for &len in lens {
        let n = len.div_ceil(BLOCK_TOKENS);
        rows.push(ids[at..at + n].to_vec());
        at += n;
    }
    let spec: Vec<(&[u32], usize)> = rows
        .iter()
        .zip(lens)
        .map(|(b, &l)| (b.as_slice(), l))
        .collect();
    let table = PageTable::new(&spec).map_err(anyhow::Error::msg)?;
    ensure!(
        table.blocks().windows(2).any(|w| w[1] != w[0] + 1),
        "the blocks should not be contiguous"
    );
    Ok((table, pool_blocks))
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

/// Decodes the elements of `dtype` in `buf` as f32.
fn decode(buf: &[u8], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F32 => buf
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        _ => buf
            .chunks_exact(2)
            .map(|c| bf16::from_bits(u16::from_le_bytes(c.try_into().unwrap())).to_f32())
            .collect(),
    }
}

/// The emulated kernel's output (as f32), with `splits` forced as the launcher's `Some(splits)`
/// does (1: unsplit).
fn emulated(
    threads: u32,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    table: &PageTable,
    scale: f32,
    splits: usize,
) -> Result<Vec<f32>> {
    let (rows, heads, d) = q.dims3()?;
    let (pool_rows, kv_heads, _) = k.dims3()?;
    let dtype = q.dtype();
    let code: u32 = if dtype == DType::F32 { 0 } else { 1 };
    let mut input = Vec::new();
    for x in [code, rows as u32, heads as u32, kv_heads as u32, d as u32] {
        input.extend(x.to_le_bytes());
    }
    for x in [pool_rows as u32, table.width() as u32] {
        input.extend(x.to_le_bytes());
    }
    input.extend(scale.to_le_bytes());
    let max_len = table.lens().iter().max().map_or(0, |&l| l as usize);
    let plan = SplitPlan::forced(max_len, splits);
    for x in [plan.splits as u32, plan.split_blocks as u32] {
        input.extend(x.to_le_bytes());
    }
    input.extend(
        table
            .blocks()
            .iter()
            .chain(table.lens())
            .flat_map(|x| x.to_le_bytes()),
    );
    for x in [q, k, v] {
        input.extend(bytes(x)?);
    }
    let dir = tempfile::tempdir()?;
    let (inp, outp) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::write(&inp, &input)?;
    let run = Command::new(runner(threads))
        .arg(&inp)
        .arg(&outp)
        .output()
        .context("running the emulated kernel")?;
    ensure!(
        run.status.success(),
        "emulated kernel failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let buf = std::fs::read(&outp)?;
    let size = if dtype == DType::F32 { 4 } else { 2 };
    ensure!(
        buf.len() == q.elem_count() * size,
        "output has {} bytes, expected {}",
        buf.len(),
        q.elem_count() * size
    );
    Ok(decode(&buf, dtype))
}

/// Max |a - b| over max |b| (at least 0.01); every value must be finite.
fn rel_err(a: &[f32], b: &[f32]) -> Result<f32> {
    ensure!(a.len() == b.len(), "{} vs {} values", a.len(), b.len());
    let (mut diff, mut scale) = (0f32, 0f32);
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        ensure!(x.is_finite() && y.is_finite(), "[{i}]: kernel {x}, CPU {y}");
        diff = diff.max((x - y).abs());
        scale = scale.max(y.abs());
    }
    Ok(diff / scale.max(0.01))
}

/// Runs `case` through the CPU op and the emulated kernel; asserts agreement within the
/// dtype's tolerance and returns the relative error.
fn check(case: &Case, dtype: DType, threads: u32, seed: u64) -> Result<f32> {
    check_splits(case, dtype, threads, seed, &[1])
}

/// [`check`] with each of `splits` forced (the largest error); with splits > 1 in f32 also
/// against the unsplit kernel (to 1e-5: the same sums, rescaled in two levels).
fn check_splits(
    case: &Case,
    dtype: DType,
    threads: u32,
    seed: u64,
    splits: &[usize],
) -> Result<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (table, pool_blocks) = scattered_table(&mut rng, &case.lens)?;
    let table = Arc::new(table);
    let (rows, h, kvh, d) = (case.lens.len(), case.heads, case.kv_heads, case.d);
    let pool_rows = pool_blocks * BLOCK_TOKENS;
    let q = randn(&mut rng, &[rows, h, d])?.to_dtype(dtype)?;
    let k = randn(&mut rng, &[pool_rows, kvh, d])?.to_dtype(dtype)?;
    let v = randn(&mut rng, &[pool_rows, kvh, d])?.to_dtype(dtype)?;
    let scale = 1.0 / (d as f32).sqrt();

    let cpu = paged_attention(&q, &k, &v, &table, scale)?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let tol = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
    let mut unsplit = None;
    let mut worst = 0f32;
    for &splits in splits {
        let got = emulated(threads, (&q, &k, &v), &table, scale, splits)?;
        let err = rel_err(&got, &cpu)?;
        eprintln!(
            "{} {dtype:?} {threads} threads, {splits} splits: relative error {err:e}",
            case.name
        );
        ensure!(
            err <= tol,
            "{} ({dtype:?}, {threads} threads, {splits} splits): differs from the CPU kernel by \
             {err:e} (tolerance {tol:e})",
            case.name
        );
        worst = worst.max(err);
        if splits > 1 && dtype == DType::F32 {
            if unsplit.is_none() {
                unsplit = Some(emulated(threads, (&q, &k, &v), &table, scale, 1)?);
            }
            let err = rel_err(&got, unsplit.as_ref().unwrap())?;
            eprintln!("  against the unsplit kernel: relative error {err:e}");
            ensure!(
                err <= 1e-5,
                "{} ({threads} threads, {splits} splits): differs from the unsplit kernel by \
                 {err:e}",
                case.name
            );
        }
    }
    Ok(worst)
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "gqa 16/8 d=128",
            heads: 16,
            kv_heads: 8,
            d: 128,
            lens: vec![1, 15, 16, 17, 300],
        },
        Case {
            name: "gqa 4/1 d=64",
            heads: 4,
            kv_heads: 1,
            d: 64,
            lens: vec![300, 17, 1, 16],
        },
        Case {
            name: "mha 4/4 d=40",
            heads: 4,
            kv_heads: 4,
            d: 40,
            lens: vec![16, 15, 300, 1],
        },
        Case {
            name: "gqa 12/1 d=18 (3 query chunks, element-wise loads)",
            heads: 12,
            kv_heads: 1,
            d: 18,
            lens: vec![17, 300, 1],
        },
        Case {
            name: "gqa 10/2 d=96 (query chunks of 4 and 1)",
            heads: 10,
            kv_heads: 2,
            d: 96,
            lens: vec![33, 200],
        },
    ]
}

#[test]
fn kernel_matches_the_cpu_kernel_f32() -> Result<()> {
    for (i, case) in cases().iter().enumerate() {
        check(case, DType::F32, 32, 10 + i as u64)?;
    }
    Ok(())
}

#[test]
fn kernel_matches_the_cpu_kernel_bf16() -> Result<()> {
    for (i, case) in cases().iter().enumerate() {
        check(case, DType::BF16, 32, 20 + i as u64)?;
    }
    Ok(())
}

/// Several warps per block (each its own cache blocks, combined at the end): two warps on
/// every case, and the block size the CUDA launcher uses on two.
#[test]
fn kernel_matches_with_several_warps() -> Result<()> {
    let cases = cases();
    for (i, case) in cases.iter().enumerate() {
        let dtype = if i % 2 == 0 { DType::F32 } else { DType::BF16 };
        check(case, dtype, 64, 30 + i as u64)?;
    }
    check(&cases[0], DType::BF16, THREADS, 40)?;
    check(&cases[2], DType::F32, THREADS, 41)?;
    Ok(())
}

fn split_cases() -> Vec<Case> {
    vec![
        Case {
            name: "split gqa 32/8 d=128",
            heads: 32,
            kv_heads: 8,
            d: 128,
            lens: vec![1, 17, 300, 1000],
        },
        Case {
            name: "split gqa 4/1 d=64",
            heads: 4,
            kv_heads: 1,
            d: 64,
            lens: vec![1000, 300, 17, 1],
        },
    ]
}

/// Split-K forced: 2, 3 and 7 splits (of 32, 21 and 9 cache blocks of the 1000-token row; the
/// shorter rows leave splits empty), one warp per block.
fn split_kernel_matches(dtype: DType, seed: u64) -> Result<()> {
    for (i, case) in split_cases().iter().enumerate() {
        check_splits(case, dtype, 32, seed + i as u64, &[2, 3, 7])?;
    }
    Ok(())
}

#[test]
fn split_kernel_matches_the_cpu_kernel_f32() -> Result<()> {
    split_kernel_matches(DType::F32, 50)
}

#[test]
fn split_kernel_matches_the_cpu_kernel_bf16() -> Result<()> {
    split_kernel_matches(DType::BF16, 60)
}

/// Split-K with the launcher's block size (four warps over a split's cache blocks, some warps
/// without any), and more splits than the longest row has cache blocks (empty for every row).
#[test]
fn split_kernel_matches_with_several_warps() -> Result<()> {
    let cases = split_cases();
    check_splits(&cases[0], DType::BF16, THREADS, 70, &[7])?;
    check_splits(&cases[1], DType::F32, THREADS, 71, &[3])?;
    check_splits(&cases[1], DType::F32, 64, 72, &[2])?;
    let short = Case {
        name: "split mha 2/2 d=40, 80 splits of one cache block",
        heads: 2,
        kv_heads: 2,
        d: 40,
        lens: vec![1000, 5],
    };
    check_splits(&short, DType::F32, 32, 73, &[80])?;
    check_splits(&short, DType::BF16, 64, 74, &[80])?;
    Ok(())
}

// ------------------------------------------------------------------------------------------
// The tensor-core prefill kernel (`fam_paged_bf16_d*` of `flash_attn_mma.cu`), which the CUDA
// op runs for prefill-shaped bf16 tables (runs of queries of one sequence with one block list).

const MMA_KERNEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/model/flash_attn/kernels/flash_attn_mma.cu"
);
const FLASH_KERNEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/model/flash_attn/kernels/flash_attn.cu"
);
const CHUNK_DRIVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/paged_chunk_emu.cpp");

/// A prefill-shaped table: for each `(sequence length, first position)`, the queries at
/// positions `first..len` of a sequence whose blocks are scattered over the pool (row lengths
/// `first + 1 ..= len`, one block list per sequence). Returns it and the pool's block count.
fn chunk_table(rng: &mut ChaCha8Rng, seqs: &[(usize, usize)]) -> Result<(PageTable, usize)> {
    let needed: usize = seqs.iter().map(|(l, _)| l.div_ceil(BLOCK_TOKENS)).sum();
    let pool_blocks = needed + 3;
    let mut ids: Vec<u32> = (0..pool_blocks as u32).collect();
    ids.shuffle(rng);
    let mut lists = Vec::new();
    let mut at = 0;
    for &(len, _) in seqs {
        let n = len.div_ceil(BLOCK_TOKENS);
        lists.push(ids[at..at + n].to_vec());
        at += n;
    }
    let mut spec: Vec<(&[u32], usize)> = Vec::new();
    for (list, &(len, first)) in lists.iter().zip(seqs) {
        spec.extend((first + 1..=len).map(|l| (list.as_slice(), l)));
    }
    Ok((
        PageTable::new(&spec).map_err(anyhow::Error::msg)?,
        pool_blocks,
    ))
}

/// The emulated prefill kernel's output (as f32) for bf16 inputs, over `table.runs(64)`.
fn emulated_chunk(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    table: &PageTable,
    scale: f32,
) -> Result<Vec<f32>> {
    let (rows, heads, d) = q.dims3()?;
    let (pool_rows, kv_heads, _) = k.dims3()?;
    let runs = table.runs(64);
    let mut input = Vec::new();
    for x in [rows, heads, kv_heads, d, pool_rows, table.width()] {
        input.extend((x as u32).to_le_bytes());
    }
    input.extend(scale.to_le_bytes());
    input.extend((runs.len() as u32).to_le_bytes());
    for (first, n) in &runs {
        input.extend((*first as u32).to_le_bytes());
        input.extend((*n as u32).to_le_bytes());
    }
    input.extend(
        table
            .blocks()
            .iter()
            .chain(table.lens())
            .flat_map(|x| x.to_le_bytes()),
    );
    for x in [q, k, v] {
        input.extend(bytes(x)?);
    }
    let runner = cuda_emu::emulated_binary(
        "paged_chunk",
        Path::new(FLASH_KERNEL),
        Path::new(CHUNK_DRIVER),
        &[format!("MMA_SOURCE=\"{MMA_KERNEL}\"")],
        Path::new(env!("CARGO_TARGET_TMPDIR")),
    );
    let dir = tempfile::tempdir()?;
    let (inp, outp) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::write(&inp, &input)?;
    let run = Command::new(runner)
        .arg(&inp)
        .arg(&outp)
        .output()
        .context("running the emulated kernel")?;
    ensure!(
        run.status.success(),
        "emulated kernel failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let buf = std::fs::read(&outp)?;
    ensure!(
        buf.len() == q.elem_count() * 2,
        "output has {} bytes",
        buf.len()
    );
    Ok(decode(&buf, DType::BF16))
}

/// Chunks of 100 queries late in a 300-token sequence (runs of 64 and 36 rows), a whole
/// 40-token prompt (rows shorter than a cache block), and one decode-like row; a full 129-token
/// prefill with d 64 and 4/1 heads; d 40 (element-wise loads) with 6/2 heads. bf16 against the
/// CPU kernel on the same bf16 inputs, to 1e-2.
#[test]
fn tensor_core_prefill_kernel_matches_the_cpu_kernel() -> Result<()> {
    // (name, (heads, kv heads, d), (sequence length, first query position) per sequence)
    type Seqs = Vec<(usize, usize)>;
    let cases: [(&str, (usize, usize, usize), Seqs); 3] = [
        (
            "gqa 16/8 d=128, chunks of 3 sequences",
            (16, 8, 128),
            vec![(300, 200), (40, 0), (17, 16)],
        ),
        ("gqa 4/1 d=64, one whole prompt", (4, 1, 64), vec![(129, 0)]),
        ("gqa 6/2 d=40, a late chunk", (6, 2, 40), vec![(77, 50)]),
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(80);
    for (name, (heads, kv_heads, d), seqs) in cases {
        let (table, pool_blocks) = chunk_table(&mut rng, &seqs)?;
        let pool_rows = pool_blocks * BLOCK_TOKENS;
        let cast = |t: Tensor| t.to_dtype(DType::BF16);
        let q = cast(randn(&mut rng, &[table.rows(), heads, d])?)?;
        let k = cast(randn(&mut rng, &[pool_rows, kv_heads, d])?)?;
        let v = cast(randn(&mut rng, &[pool_rows, kv_heads, d])?)?;
        let scale = 1.0 / (d as f32).sqrt();
        let table = Arc::new(table);
        let cpu = paged_attention(&q, &k, &v, &table, scale)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let got = emulated_chunk((&q, &k, &v), &table, scale)?;
        let err = rel_err(&got, &cpu)?;
        eprintln!(
            "{name}: {} runs, relative error {err:e}",
            table.runs(64).len()
        );
        ensure!(err <= 1e-2, "{name}: the prefill kernel is off by {err:e}");
    }
    Ok(())
}
