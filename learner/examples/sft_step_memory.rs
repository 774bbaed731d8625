//! One SFT step (forward, backward, AdamW) of a random-weight model on one conversation of
//! `--tokens` tokens, reporting the process's memory as one JSON line. Used by
//! `scripts/bench-learner-memory.sh`, one process per measurement so that each peak is its own.
//!
//! ```text
//! cargo run --release -p cascade-learner --example sft_step_memory -- \
//!     --tokens 4096 --checkpoint 1 [--layers 2] [--vocab 151936]
//! ```
//!
//! The model is shaped like Qwen3-0.6B (hidden 1024, 16 heads, 8 kv heads, head_dim 128,
//! intermediate 3072, tied embeddings, context 40 960) with `--layers` layers, in f32 on the
//! CPU. Reported: `base_rss_mb` (the process before the model), `fixed_mb` (weights, gradients
//! and the two AdamW moments: 16 bytes per parameter, an f32 model needing no master copy),
//! `peak_fwd_bwd_mb` (peak RSS of the forward + backward), `peak_step_mb` (of the optimizer
//! update), both since a reset of the kernel's high-water mark, `live_before_mb` and
//! `live_peak_fwd_bwd_mb` (bytes allocated and not yet freed before the step and at their peak
//! during its forward + backward, counted by this example's allocator: what the tensors need,
//! whatever the allocator keeps besides), and the wall times. A 16-token
//! warm-up step runs first, so that the measured step starts from the steady state (weights and
//! AdamW moments resident, no gradients). The gradients are summed in f32
//! (`learner.grad_accum = "f32"`): the first micro-batch's sum is then the gradients themselves,
//! so the fixed state is exactly 16 bytes per parameter and the rest of the peak is activations.
//! (The learner's default f64 sum adds 8 bytes per parameter once backward has finished and the
//! activations are gone; `cascade plan` counts it.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use candle_core::{DType, Device};
use cascade_learner::optim::{AdamW, AdamWConfig};
use cascade_learner::sft::{accumulate_sft_gradients, PackedRow};
use cascade_shared::config::GradAccum;
use cascade_shared::metrics::{rss_mb, StepMemory};
use cascade_shared::model::{random_weights, trainable_from_tensors, ModelConfig};

/// The system allocator, counting the bytes allocated and not yet freed and their peak: the
/// memory the step's tensors need, whatever the allocator keeps besides (RSS also counts pages
/// an allocator holds after a free and the fragmentation of its heap).
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's guarantees for `layout` carry over.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (that is, `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `dealloc` and `alloc`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Restarts the peak of live bytes from the current count.
fn reset_live_peak() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

fn live_peak_mb() -> f64 {
    PEAK.load(Ordering::Relaxed) as f64 / (1024.0 * 1024.0)
}

fn arg(args: &[String], name: &str, default: usize) -> usize {
    match args.iter().position(|a| a == name) {
        Some(i) => match args.get(i + 1).and_then(|v| v.parse().ok()) {
            Some(v) => v,
            None => {
                eprintln!("{name} needs a number");
                std::process::exit(2);
            }
        },
        None => default,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let tokens = arg(&args, "--tokens", 1024);
    let checkpoint = arg(&args, "--checkpoint", 1);
    let layers = arg(&args, "--layers", 2);
    let vocab = arg(&args, "--vocab", 151_936);
    if tokens < 2 {
        return Err("--tokens must be at least 2".into());
    }
    let base_rss_mb = rss_mb().unwrap_or(f64::NAN);
    let cfg = ModelConfig::from_json_str(&format!(
        r#"{{"model_type": "qwen3", "vocab_size": {vocab}, "hidden_size": 1024,
            "intermediate_size": 3072, "num_hidden_layers": {layers},
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
            "max_position_embeddings": 40960, "rope_theta": 1000000.0,
            "tie_word_embeddings": true, "initializer_range": 0.02}}"#
    ))?;
    let dev = Device::Cpu;
    let tensors = random_weights(&cfg, 0, &dev)?;
    let params: usize = tensors.values().map(|t| t.elem_count()).sum();
    let (mut model, vars) = trainable_from_tensors(&cfg, tensors)?;
    model.set_checkpoint_every(checkpoint);
    assert_eq!(model.dtype(), DType::F32);
    let mut opt = AdamW::new(
        vars.vars.clone().into_iter().collect(),
        AdamWConfig {
            grad_accum: GradAccum::F32,
            ..AdamWConfig::default()
        },
    )?;
    // One conversation: a 10% prompt, the rest trained.
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
    // A short warm-up step first: the AdamW moments are lazily zeroed pages until an update
    // writes them, and a steady-state step has them resident.
    let stats = accumulate_sft_gradients(&model, &[row(16)], 1, &mut opt, &dev)?;
    opt.step(1e-5, stats.loss)?;
    let row = row(tokens);
    let memory = StepMemory::start();
    let live_before_mb = LIVE.load(Ordering::Relaxed) as f64 / (1024.0 * 1024.0);
    reset_live_peak();
    let t0 = Instant::now();
    let stats = accumulate_sft_gradients(&model, &[row], 1, &mut opt, &dev)?;
    let fwd_bwd_s = t0.elapsed().as_secs_f64();
    let peak_fwd_bwd_mb = memory.finish(&dev).peak_rss_mb;
    let live_peak_fwd_bwd_mb = live_peak_mb();
    let memory = StepMemory::start();
    reset_live_peak();
    let t1 = Instant::now();
    opt.step(1e-5, stats.loss)?;
    let step_s = t1.elapsed().as_secs_f64();
    let peak_step_mb = memory.finish(&dev).peak_rss_mb;
    let fixed_mb = (params * 16) as f64 / (1024.0 * 1024.0);
    println!(
        "{}",
        serde_json::json!({
            "tokens": tokens,
            "checkpoint": checkpoint,
            "layers": layers,
            "params": params,
            "base_rss_mb": base_rss_mb,
            "fixed_mb": fixed_mb,
            "peak_fwd_bwd_mb": peak_fwd_bwd_mb,
            "peak_step_mb": peak_step_mb,
            "live_before_mb": live_before_mb,
            "live_peak_fwd_bwd_mb": live_peak_fwd_bwd_mb,
            "exact_peak": memory.exact(),
            "loss": stats.loss,
            "fwd_bwd_s": fwd_bwd_s,
            "optimizer_s": step_s,
        })
    );
    Ok(())
}
