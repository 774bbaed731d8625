//! The learner's SFT step on a GPU (built with `--features cuda` by `scripts/build-gpu.sh`, run
//! by `scripts/gpu-check.sh`): the gradients of every parameter and the loss on CUDA against the
//! CPU, through the whole training path (fused attention, two-block checkpointing, chunked
//! log-probs, packed segments) — f32 to 1e-4, and bf16 measured against f32 gradients of the
//! same bf16-rounded weights, no further from them than the CPU's own bf16 path. The ignored
//! `gpu_learner_step_benchmark` runs one SFT step (forward, backward, AdamW) of the full
//! Qwen3-0.6B shape in bf16 at 8K and 32K tokens with checkpointing and reports the device
//! memory peak (the default memory pool's high-water mark) to `$LEARNER_BENCH_OUT` (or stdout).
#![cfg(feature = "cuda")]

mod cuda_common;

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{ensure, Result};
use candle_core::{DType, Device, Tensor};
use cascade_learner::optim::{AdamW, AdamWConfig};
use cascade_learner::sft::{accumulate_sft_gradients, PackedRow};
use cascade_shared::metrics::{device_memory_mb, device_peak_mb, reset_device_peak_mb};
use cascade_shared::model::{random_weights, trainable_from_tensors, ModelConfig};
use cuda_common::{gpu, rows, small_config};

/// The SFT loss and every parameter's gradient (as f32 on the host) of `tensors` on `device`.
fn sft_gradients(
    cfg: &ModelConfig,
    tensors: &HashMap<String, Tensor>,
    device: &Device,
    dtype: DType,
    checkpoint: usize,
) -> Result<(f64, HashMap<String, Tensor>)> {
    let tensors = tensors
        .iter()
        .map(|(k, t)| Ok((k.clone(), t.to_dtype(dtype)?.to_device(device)?)))
        .collect::<Result<HashMap<_, _>>>()?;
    let (mut model, params) = trainable_from_tensors(cfg, tensors)?;
    model.set_checkpoint_every(checkpoint);
    let mut opt = AdamW::new(
        params.vars.clone().into_iter().collect(),
        AdamWConfig::default(),
    )?;
    let stats =
        accumulate_sft_gradients(&model, &rows(cfg.vocab_size as u32), 1, &mut opt, device)?;
    let mut grads = HashMap::new();
    for name in params.vars.keys() {
        let g = opt
            .grad(name)
            .ok_or_else(|| anyhow::anyhow!("no gradient for {name}"))?;
        grads.insert(
            name.clone(),
            g.to_device(&Device::Cpu)?.to_dtype(DType::F32)?,
        );
    }
    Ok((stats.loss, grads))
}

/// The worst parameter's max |a − b| / max |b| (b's scale at least 1e-6), and its name.
fn worst(a: &HashMap<String, Tensor>, b: &HashMap<String, Tensor>) -> Result<(f32, String)> {
    let mut out = (0f32, String::new());
    for (name, gb) in b {
        let ga = &a[name];
        ensure!(
            ga.dims() == gb.dims(),
            "{name}: {:?} vs {:?}",
            ga.dims(),
            gb.dims()
        );
        let diff = (ga - gb)?
            .abs()?
            .flatten_all()?
            .max(0)?
            .to_scalar::<f32>()?;
        ensure!(diff.is_finite(), "{name}: non-finite gradient");
        let top = gb.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
        let rel = diff / top.max(1e-6);
        if rel > out.0 {
            out = (rel, name.clone());
        }
    }
    Ok(out)
}

#[test]
fn sft_gradients_on_cuda_match_the_cpu_in_f32() -> Result<()> {
    let cfg = small_config()?;
    let tensors = random_weights(&cfg, 5, &Device::Cpu)?;
    let (loss_cpu, cpu) = sft_gradients(&cfg, &tensors, &Device::Cpu, DType::F32, 0)?;
    for checkpoint in [0usize, 1] {
        let (loss_gpu, got) = sft_gradients(&cfg, &tensors, &gpu(), DType::F32, checkpoint)?;
        let (rel, which) = worst(&got, &cpu)?;
        eprintln!("f32 checkpoint {checkpoint}: loss {loss_gpu} vs {loss_cpu}, worst gradient {rel:.2e} ({which})");
        ensure!(
            ((loss_gpu - loss_cpu) / loss_cpu).abs() < 1e-5,
            "loss {loss_gpu} vs {loss_cpu}"
        );
        ensure!(
            rel < 1e-4,
            "checkpoint {checkpoint}: {which} off by {rel:.2e}"
        );
    }
    Ok(())
}

#[test]
fn sft_gradients_on_cuda_in_bf16_are_as_close_to_f32_as_the_cpus() -> Result<()> {
    // Two bf16 runs round differently, so both are measured against the f32 gradients of the
    // same bf16-rounded weights (as shared/tests/recompute.rs does on the CPU).
    let cfg = small_config()?;
    let tensors = random_weights(&cfg, 6, &Device::Cpu)?
        .into_iter()
        .map(|(k, t)| Ok((k, t.to_dtype(DType::BF16)?.to_dtype(DType::F32)?)))
        .collect::<Result<HashMap<_, _>>>()?;
    let (loss32, reference) = sft_gradients(&cfg, &tensors, &Device::Cpu, DType::F32, 0)?;
    let (loss_cpu, cpu) = sft_gradients(&cfg, &tensors, &Device::Cpu, DType::BF16, 0)?;
    let (loss_gpu, gpu_grads) = sft_gradients(&cfg, &tensors, &gpu(), DType::BF16, 1)?;
    let (rel_cpu, which_cpu) = worst(&cpu, &reference)?;
    let (rel_gpu, which_gpu) = worst(&gpu_grads, &reference)?;
    eprintln!(
        "bf16 vs f32: loss GPU {loss_gpu}, CPU {loss_cpu}, f32 {loss32}; worst gradient GPU \
         {rel_gpu:.3} ({which_gpu}), CPU {rel_cpu:.3} ({which_cpu})"
    );
    ensure!(
        ((loss_gpu - loss32) / loss32).abs() < 1e-2,
        "loss {loss_gpu} vs f32 {loss32}"
    );
    ensure!(
        rel_gpu <= rel_cpu * 1.5 + 1e-2 && rel_gpu < 0.25,
        "GPU bf16 gradients {rel_gpu} ({which_gpu}) vs CPU bf16 {rel_cpu} ({which_cpu})"
    );
    Ok(())
}

/// One SFT step of the Qwen3-0.6B shape (28 layers, hidden 1024, 16/8 heads, head dim 128,
/// vocab 151 936, tied), bf16 weights with f32 AdamW state, every layer checkpointed, on one
/// conversation of N tokens: wall time and the device peak above the state held before it.
#[test]
#[ignore]
fn gpu_learner_step_benchmark() -> Result<()> {
    let dev = gpu();
    let layers: usize = std::env::var("LEARNER_BENCH_LAYERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(28);
    let vocab = 151_936usize;
    let cfg = ModelConfig::from_json_str(&format!(
        r#"{{"model_type": "qwen3", "vocab_size": {vocab}, "hidden_size": 1024,
            "intermediate_size": 3072, "num_hidden_layers": {layers},
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
            "max_position_embeddings": 40960, "rope_theta": 1000000.0,
            "tie_word_embeddings": true, "initializer_range": 0.02}}"#
    ))?;
    let tensors = random_weights(&cfg, 0, &dev)?
        .into_iter()
        .map(|(k, t)| Ok((k, t.to_dtype(DType::BF16)?)))
        .collect::<Result<HashMap<_, _>>>()?;
    let params: usize = tensors.values().map(|t| t.elem_count()).sum();
    let (mut model, vars) = trainable_from_tensors(&cfg, tensors)?;
    model.set_checkpoint_every(1);
    let mut opt = AdamW::new(
        vars.vars.clone().into_iter().collect(),
        AdamWConfig::default(),
    )?;
    let row = |tokens: usize| {
        let ids: Vec<u32> = (0..tokens as u64)
            .map(|i| ((i * 2_654_435_761) % vocab as u64) as u32)
            .collect();
        let prompt = tokens / 10;
        PackedRow {
            weights: (0..tokens - 1).map(|i| i + 1 >= prompt).collect(),
            segments: vec![1; tokens],
            ids,
        }
    };
    let mut table = format!(
        "## Learner SFT step on the GPU (Qwen3-0.6B shape, {layers} layers, {:.0}M parameters, \
         bf16 weights, f32 AdamW, checkpoint every layer)\n\n",
        params as f64 / 1e6
    );
    let write = |table: &str| -> Result<()> {
        if let Ok(path) = std::env::var("LEARNER_BENCH_OUT") {
            std::fs::write(&path, table)?;
        }
        Ok(())
    };
    // Warm-up: kernels compiled, AdamW moments allocated.
    let stats = accumulate_sft_gradients(&model, &[row(256)], 1, &mut opt, &dev)?;
    opt.step(1e-5, stats.loss)?;
    dev.synchronize()?;
    // What the process holds on the device beyond its tensors: the CUDA context, cuBLAS
    // workspaces, loaded modules (total − free, less what the memory pool has handed out).
    let in_use = device_memory_mb(&dev).unwrap_or(f64::NAN);
    reset_device_peak_mb(&dev);
    let held = device_peak_mb(&dev).unwrap_or(f64::NAN);
    table.push_str(&format!(
        "After the warm-up step: device memory in use (total − free) {in_use:.0} MiB, of which \
         the memory pool hands out {held:.0} MiB; the rest, {:.0} MiB, is the CUDA context, \
         cuBLAS and the pool's reserve.\n\n",
        in_use - held
    ));
    table.push_str(
        "| tokens | state MiB | peak MiB | activations MiB | KB/token | fwd+bwd s | optimizer s | tokens/s |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for tokens in [8192usize, 32768] {
        ensure!(
            reset_device_peak_mb(&dev),
            "the device's memory pool has no high-water mark"
        );
        let state = device_peak_mb(&dev).unwrap_or(f64::NAN);
        let t0 = Instant::now();
        let stats = accumulate_sft_gradients(&model, &[row(tokens)], 1, &mut opt, &dev)?;
        dev.synchronize()?;
        let fwd_bwd_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        opt.step(1e-5, stats.loss)?;
        dev.synchronize()?;
        let opt_s = t1.elapsed().as_secs_f64();
        let peak = device_peak_mb(&dev).unwrap_or(f64::NAN);
        ensure!(stats.loss.is_finite(), "loss {}", stats.loss);
        let act = peak - state;
        table.push_str(&format!(
            "| {tokens} | {state:.0} | {peak:.0} | {act:.0} | {:.1} | {fwd_bwd_s:.2} | {opt_s:.3} | {:.0} |\n",
            act * 1024.0 / tokens as f64,
            tokens as f64 / (fwd_bwd_s + opt_s)
        ));
        write(&table)?;
        println!("{table}");
    }
    Ok(())
}
