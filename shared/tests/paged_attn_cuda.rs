//! The CUDA paged decode attention against the CPU op on a GPU (built with `--features cuda` by
//! `scripts/build-gpu.sh`, run by `scripts/gpu-check.sh`): GQA (16/8, 4/1, 32/8, 10/2), MHA,
//! head dims 128, 96, 64 and 40, rows of 1 to 6000 tokens with cache blocks shuffled over the
//! pool, f32 (to 1e-4) and bf16 (to 1e-2); the same op instance applied twice (the page table is
//! uploaded once). Calls of few rows whose longest row has over 496 tokens take the split-K path
//! (the launcher's choice is printed per case); `gpu_split_matches_unsplit` runs the launcher
//! with forced splits (1 and 7) and its own choice on one shape and compares them (f32, to
//! 1e-5). The ignored `gpu_paged_attn_benchmark` times one decode step's attention (Qwen3-8B
//! heads: 32 query heads, 8 kv heads, head dim 128, bf16) against the memory bound of reading K
//! and V once, with the splits the launcher picks per shape, and a chunk of a long prefill
//! (every query a row of one sequence's table) against the H200's bf16 rate, on the tensor-core
//! prefill kernel and on the decode kernel, and writes the tables to `$PAGED_ATTN_BENCH_OUT` (or
//! stdout). `gpu_prefill_chunks_match_cpu_op` checks prefill-shaped bf16 tables (which take the
//! tensor-core prefill kernel on compute capability 8.0+) against the CPU op, on both kernels.
#![cfg(feature = "cuda")]

use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Result};
use candle_core::{DType, Device, Tensor};
use cascade_shared::model::paged::cuda as paged_cuda;
use cascade_shared::model::paged::kernels::{combine_entry, KernelDtype, SplitPlan};
use cascade_shared::model::paged::{paged_attention, PageTable, PagedAttention, BLOCK_TOKENS};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn gpu() -> Device {
    Device::new_cuda(0).unwrap_or_else(|e| panic!("no CUDA device 0: {e}"))
}

/// The split the launcher picks on `dev` for `rows` rows of up to `max_len` tokens.
fn plan_on(dev: &Device, rows: usize, h: usize, kvh: usize, max_len: usize) -> Result<SplitPlan> {
    let stream = dev.as_cuda_device()?.cuda_stream();
    Ok(paged_cuda::split_plan(&stream, rows, h, kvh, max_len)?)
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

/// A table for `lens` with its blocks shuffled over a pool of `spare + Σ blocks` blocks;
/// returns it and the pool's block count.
fn scattered_table(
    rng: &mut ChaCha8Rng,
    lens: &[usize],
    spare: usize,
) -> Result<(PageTable, usize)> {
    let needed: usize = lens.iter().map(|l| l.div_ceil(BLOCK_TOKENS)).sum();
    let pool_blocks = needed + spare;
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
    Ok((
        PageTable::new(&spec).map_err(anyhow::Error::msg)?,
        pool_blocks,
    ))
}

/// Max |a - b| over max |b| (at least 0.01); every value must be finite.
fn rel_err(a: &[f32], b: &[f32]) -> Result<f32> {
    ensure!(a.len() == b.len(), "{} vs {} values", a.len(), b.len());
    let (mut diff, mut scale) = (0f32, 0f32);
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        ensure!(x.is_finite() && y.is_finite(), "[{i}]: GPU {x}, CPU {y}");
        diff = diff.max((x - y).abs());
        scale = scale.max(y.abs());
    }
    Ok(diff / scale.max(0.01))
}

#[test]
fn gpu_matches_cpu_op() -> Result<()> {
    let dev = gpu();
    // (name, heads, kv heads, d, row lengths)
    let cases: Vec<(&str, usize, usize, usize, Vec<usize>)> = vec![
        ("gqa 16/8 d=128", 16, 8, 128, vec![1, 15, 16, 17, 300]),
        ("gqa 4/1 d=64", 4, 1, 64, vec![300, 17, 1, 16]),
        ("mha 4/4 d=40", 4, 4, 40, vec![16, 15, 300, 1]),
        ("gqa 10/2 d=96 (query chunks 4+1)", 10, 2, 96, vec![33, 200]),
        ("qwen3-8b 32/8 d=128", 32, 8, 128, vec![1000, 1, 517, 64]),
        ("long rows 32/8 d=128", 32, 8, 128, vec![6000, 2500, 17]),
        ("long rows 4/1 d=64", 4, 1, 64, vec![700, 4100]),
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for (name, h, kvh, d, lens) in cases {
        let (table, pool_blocks) = scattered_table(&mut rng, &lens, 5)?;
        let table = Arc::new(table);
        let pool_rows = pool_blocks * BLOCK_TOKENS;
        let q = randn(&mut rng, &[lens.len(), h, d])?;
        let k = randn(&mut rng, &[pool_rows, kvh, d])?;
        let v = randn(&mut rng, &[pool_rows, kvh, d])?;
        let scale = 1.0 / (d as f32).sqrt();
        let max_len = lens.iter().copied().max().unwrap_or(0);
        let plan = plan_on(&dev, lens.len(), h, kvh, max_len)?;
        eprintln!("{name}: {plan:?}");
        for (dtype, tol) in [(DType::F32, 1e-4f32), (DType::BF16, 1e-2)] {
            let [q, k, v] = [&q, &k, &v].map(|x| x.to_dtype(dtype).unwrap());
            let cpu = host(&paged_attention(&q, &k, &v, &table, scale)?)?;
            let (qg, kg, vg) = (q.to_device(&dev)?, k.to_device(&dev)?, v.to_device(&dev)?);
            let gpu_out = host(&paged_attention(&qg, &kg, &vg, &table, scale)?)?;
            let err = rel_err(&gpu_out, &cpu)?;
            // One op instance for two calls (as for the layers of a decode step): the table is
            // uploaded by the first.
            let op = PagedAttention::new(table.clone(), scale);
            let first = host(&qg.apply_op3_no_bwd(&kg, &vg, &op)?)?;
            let second = host(&qg.apply_op3_no_bwd(&kg, &vg, &op)?)?;
            eprintln!("{name} {dtype:?}: relative error {err:e}");
            ensure!(err <= tol, "{name} {dtype:?}: off by {err:e} (tol {tol:e})");
            ensure!(
                first == gpu_out && second == gpu_out,
                "{name} {dtype:?}: a reused op instance gives other values"
            );
        }
    }
    Ok(())
}

/// Prefill-shaped tables (queries of one sequence sharing its block list, in runs of up to 64
/// rows), bf16: the tensor-core prefill kernel and the decode kernel against the CPU op.
#[test]
fn gpu_prefill_chunks_match_cpu_op() -> Result<()> {
    use cascade_shared::model::flash_attn::cuda::set_tensor_cores;
    let dev = gpu();
    // (name, heads, kv heads, d, (sequence length, first query position) per sequence)
    type Seqs = Vec<(usize, usize)>;
    let cases: Vec<(&str, usize, usize, usize, Seqs)> = vec![
        (
            "16/8 d=128, 3 sequences",
            16,
            8,
            128,
            vec![(1000, 700), (40, 0), (17, 16)],
        ),
        ("4/1 d=64, a whole prompt", 4, 1, 64, vec![(513, 0)]),
        ("6/2 d=40, a late chunk", 6, 2, 40, vec![(3000, 2900)]),
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    for (name, h, kvh, d, seqs) in cases {
        let lens: Vec<usize> = seqs.iter().map(|s| s.0).collect();
        let (by_seq, pool_blocks) = scattered_table(&mut rng, &lens, 5)?;
        let w = by_seq.width();
        let lists: Vec<Vec<u32>> = (0..seqs.len())
            .map(|i| by_seq.blocks()[i * w..(i + 1) * w].to_vec())
            .collect();
        let mut spec: Vec<(&[u32], usize)> = Vec::new();
        for (list, &(len, first)) in lists.iter().zip(&seqs) {
            spec.extend((first + 1..=len).map(|l| (list.as_slice(), l)));
        }
        let table = Arc::new(PageTable::new(&spec).map_err(anyhow::Error::msg)?);
        let pool_rows = pool_blocks * BLOCK_TOKENS;
        let bf = |x: Tensor| x.to_dtype(DType::BF16);
        let q = bf(randn(&mut rng, &[table.rows(), h, d])?)?;
        let k = bf(randn(&mut rng, &[pool_rows, kvh, d])?)?;
        let v = bf(randn(&mut rng, &[pool_rows, kvh, d])?)?;
        let scale = 1.0 / (d as f32).sqrt();
        let cpu = host(&paged_attention(&q, &k, &v, &table, scale)?)?;
        let (qg, kg, vg) = (q.to_device(&dev)?, k.to_device(&dev)?, v.to_device(&dev)?);
        for tensor_cores in [true, false] {
            set_tensor_cores(tensor_cores);
            let got = paged_attention(&qg, &kg, &vg, &table, scale);
            set_tensor_cores(true);
            let err = rel_err(&host(&got?)?, &cpu)?;
            let kernel = if tensor_cores {
                "prefill (tensor cores)"
            } else {
                "decode"
            };
            eprintln!(
                "{name} {kernel}: {} rows, relative error {err:e}",
                table.rows()
            );
            ensure!(err <= 1e-2, "{name} {kernel}: off by {err:e}");
        }
    }
    Ok(())
}

/// The launcher on one shape with forced splits (1: the unsplit path, 7) and its own choice
/// (more than one split): f32, the split results against the unsplit one to 1e-5, and every
/// result against the CPU op to 1e-4.
#[test]
fn gpu_split_matches_unsplit() -> Result<()> {
    use candle_core::Storage;
    let dev = gpu();
    let cuda = dev.as_cuda_device()?;
    let stream = cuda.cuda_stream();
    let (h, kvh, d) = (32usize, 8usize, 128usize);
    let lens = vec![8000usize, 3000, 17, 1];
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (table, pool_blocks) = scattered_table(&mut rng, &lens, 3)?;
    let pool_rows = pool_blocks * BLOCK_TOKENS;
    let q = randn(&mut rng, &[lens.len(), h, d])?;
    let k = randn(&mut rng, &[pool_rows, kvh, d])?;
    let v = randn(&mut rng, &[pool_rows, kvh, d])?;
    let scale = 1.0 / (d as f32).sqrt();
    let cpu = host(&paged_attention(
        &q,
        &k,
        &v,
        &Arc::new(table.clone()),
        scale,
    )?)?;
    let (qg, kg, vg) = (q.to_device(&dev)?, k.to_device(&dev)?, v.to_device(&dev)?);
    let device_table = paged_cuda::DeviceTable::upload(cuda, &table)?;
    let dims = paged_cuda::CallDims {
        rows: lens.len(),
        heads: h,
        kv_heads: kvh,
        d,
        pool_rows,
        scale,
    };
    let ptx = paged_cuda::ptx()?;
    let decode = cuda.get_or_load_custom_func(
        paged_cuda::entry(KernelDtype::F32, d)?,
        "cascade_paged_attn",
        ptx,
    )?;
    let combine =
        cuda.get_or_load_custom_func(combine_entry(KernelDtype::F32), "cascade_paged_attn", ptx)?;
    let (qs, _) = qg.storage_and_layout();
    let (ks, _) = kg.storage_and_layout();
    let (vs, _) = vg.storage_and_layout();
    let (Storage::Cuda(qs), Storage::Cuda(ks), Storage::Cuda(vs)) = (&*qs, &*ks, &*vs) else {
        anyhow::bail!("tensors not on the GPU");
    };
    let (qs, ks, vs) = (
        qs.as_cuda_slice::<f32>()?,
        ks.as_cuda_slice::<f32>()?,
        vs.as_cuda_slice::<f32>()?,
    );
    let run = |splits: Option<usize>| -> Result<(SplitPlan, Vec<f32>)> {
        let mut out = stream.alloc_zeros::<f32>(dims.rows * h * d)?;
        let plan = paged_cuda::launch(
            &stream,
            paged_cuda::Funcs {
                decode: &decode,
                combine: &combine,
            },
            &dims,
            (&qs.as_view(), &ks.as_view(), &vs.as_view()),
            &device_table,
            &mut out.as_view_mut(),
            splits,
        )?;
        Ok((plan, stream.clone_dtoh(&out)?))
    };
    let (one, unsplit) = run(Some(1))?;
    ensure!(one.splits == 1, "{one:?}");
    ensure!(rel_err(&unsplit, &cpu)? <= 1e-4, "unsplit vs CPU");
    for splits in [Some(7), None] {
        let (plan, got) = run(splits)?;
        let err = rel_err(&got, &unsplit)?;
        let err_cpu = rel_err(&got, &cpu)?;
        eprintln!("{splits:?} -> {plan:?}: vs unsplit {err:e}, vs CPU {err_cpu:e}");
        ensure!(plan.splits > 1, "{splits:?}: {plan:?} does not split");
        ensure!(err <= 1e-5, "{plan:?}: off the unsplit result by {err:e}");
        ensure!(err_cpu <= 1e-4, "{plan:?}: off the CPU op by {err_cpu:e}");
    }
    Ok(())
}

/// One decode step's attention of the Qwen3-8B shape (32 query heads, 8 kv heads, head dim 128,
/// bf16), one op instance per step as for the layers of a step (the table uploaded once),
/// against the time to read every row's keys and values once at the H200's ~4.8 TB/s and the
/// H100's ~3.35 TB/s (nominal HBM bandwidths).
#[test]
#[ignore]
fn gpu_paged_attn_benchmark() -> Result<()> {
    const H200_BW: f64 = 4.8e12;
    const H100_BW: f64 = 3.35e12;
    let dev = gpu();
    let (h, kvh, d) = (32usize, 8usize, 128usize);
    let mut table_md = String::from(
        "## Paged decode attention on the GPU (bf16, 32 heads / 8 kv heads, d 128, shuffled \
         blocks)\n\n\
         | rows x tokens | splits (x cache blocks) | grid | K+V MB | us | GB/s | of 4.8 TB/s (H200) \
         | of 3.35 TB/s (H100) |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let sms = paged_cuda::sm_count(&dev.as_cuda_device()?.cuda_stream())?;
    println!("{sms} SMs");
    for (rows, len) in [(64usize, 4096usize), (256, 1024), (8, 16384), (16, 40960)] {
        let plan = plan_on(&dev, rows, h, kvh, len)?;
        let grid = plan.grid(rows, h, kvh);
        println!("{rows} x {len}: {plan:?}, grid {grid}");
        let lens = vec![len; rows];
        let (table, pool_blocks) = scattered_table(&mut rng, &lens, 0)?;
        let table = Arc::new(table);
        let pool_rows = pool_blocks * BLOCK_TOKENS;
        let mk = |shape: &[usize]| -> Result<Tensor> {
            Ok(Tensor::randn(0f32, 1f32, shape, &dev)?.to_dtype(DType::BF16)?)
        };
        let q = mk(&[rows, h, d])?;
        let k = mk(&[pool_rows, kvh, d])?;
        let v = mk(&[pool_rows, kvh, d])?;
        let scale = 1.0 / (d as f32).sqrt();
        let op = PagedAttention::new(table.clone(), scale);
        // Warm-up (NVRTC compile, module load, table upload).
        q.apply_op3_no_bwd(&k, &v, &op)?;
        dev.synchronize()?;
        let reps = 20;
        let t0 = Instant::now();
        for _ in 0..reps {
            q.apply_op3_no_bwd(&k, &v, &op)?;
        }
        dev.synchronize()?;
        let secs = t0.elapsed().as_secs_f64() / reps as f64;
        // Every row's keys and values, once per kv head (bf16).
        let bytes = (rows * len * kvh * d * 2 * 2) as f64;
        let rate = bytes / secs;
        table_md.push_str(&format!(
            "| {rows} x {len} | {} (x {}) | {grid} | {:.0} | {:.1} | {:.0} | {:.1}% | {:.1}% |\n",
            plan.splits,
            plan.split_blocks,
            bytes / 1e6,
            secs * 1e6,
            rate / 1e9,
            100.0 * rate / H200_BW,
            100.0 * rate / H100_BW
        ));
    }
    // A chunk of a long prefill (`CausalLm::extend`): the chunk's queries are rows of one
    // sequence's table, each reading its keys up to itself. Against the H200's dense bf16 rate.
    const H200_BF16_FLOPS: f64 = 989e12;
    table_md.push_str(
        "\n## A prefill chunk through the paged attention (one row per query, one sequence)\n\n\
         | queries | context before | kernel | us | TFLOP/s | of 989 (H200 bf16 dense) |\n\
         |---|---|---|---|---|---|\n",
    );
    for (queries, before) in [(2048usize, 14336usize), (8192, 32768)] {
        let total = before + queries;
        let (one, pool_blocks) = scattered_table(&mut rng, &[total], 0)?;
        let blocks = one.blocks()[..one.width()].to_vec();
        let spec: Vec<(&[u32], usize)> = (0..queries)
            .map(|i| (blocks.as_slice(), before + i + 1))
            .collect();
        let table = Arc::new(PageTable::new(&spec).map_err(anyhow::Error::msg)?);
        let pool_rows = pool_blocks * BLOCK_TOKENS;
        let mk = |shape: &[usize]| -> Result<Tensor> {
            Ok(Tensor::randn(0f32, 1f32, shape, &dev)?.to_dtype(DType::BF16)?)
        };
        let (q, k, v) = (
            mk(&[queries, h, d])?,
            mk(&[pool_rows, kvh, d])?,
            mk(&[pool_rows, kvh, d])?,
        );
        let op = PagedAttention::new(table, 1.0 / (d as f32).sqrt());
        for tensor_cores in [true, false] {
            cascade_shared::model::flash_attn::cuda::set_tensor_cores(tensor_cores);
            q.apply_op3_no_bwd(&k, &v, &op)?;
            dev.synchronize()?;
            let reps = 5;
            let t0 = Instant::now();
            for _ in 0..reps {
                q.apply_op3_no_bwd(&k, &v, &op)?;
            }
            dev.synchronize()?;
            let secs = t0.elapsed().as_secs_f64() / reps as f64;
            // QKᵀ and PV: 4 flops per (query, key, head, dim).
            let pairs = (queries * before + queries * (queries + 1) / 2) as f64;
            let flops = pairs * (h * d * 4) as f64;
            let kernel = if tensor_cores {
                "prefill (tensor cores)"
            } else {
                "decode"
            };
            table_md.push_str(&format!(
                "| {queries} | {before} | {kernel} | {:.0} | {:.1} | {:.1}% |\n",
                secs * 1e6,
                flops / secs / 1e12,
                100.0 * flops / secs / H200_BF16_FLOPS
            ));
        }
        cascade_shared::model::flash_attn::cuda::set_tensor_cores(true);
    }
    match std::env::var("PAGED_ATTN_BENCH_OUT") {
        Ok(path) => std::fs::write(&path, &table_md)?,
        Err(_) => println!("{table_md}"),
    }
    println!("{table_md}");
    Ok(())
}
