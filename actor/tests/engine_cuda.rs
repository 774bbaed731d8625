//! The engine on a GPU (feature `cuda`): tokens are drawn by the CUDA sampler on the logits in
//! device memory, and they are the tokens the CPU sampler draws from the same logits; plus the
//! GPU decode benchmark (device sampler against host sampling), an ignored test that
//! `scripts/gpu-check.sh` runs.
#![cfg(feature = "cuda")]

mod common;

use std::time::Instant;

use candle_core::{Device, Tensor};
use cascade_actor::engine::{Engine, Finished, GenParams, Job};
use cascade_actor::sampler::SamplingParams;
use cascade_shared::model::{compute_dtype, random_weights, CausalLm, ModelConfig};
use cascade_shared::Mode;

fn gpu() -> Device {
    Device::new_cuda(0).unwrap_or_else(|e| panic!("CUDA device 0 unavailable: {e}"))
}

/// Random weights drawn on the CPU (so they do not depend on the device's RNG), moved to `dev`
/// in the dtype the actor computes in there.
fn model_on(cfg: &ModelConfig, seed: u64, dev: &Device) -> CausalLm {
    let w = random_weights(cfg, seed, &Device::Cpu).expect("weights");
    let w = w
        .into_iter()
        .map(|(k, t)| {
            let t: Tensor = t.to_device(dev)?.to_dtype(compute_dtype(dev))?;
            Ok((k, t))
        })
        .collect::<candle_core::Result<_>>()
        .expect("weights on device");
    CausalLm::from_tensors(cfg, &w).expect("model")
}

fn sampling(i: u64) -> SamplingParams {
    // Three settings in one batch, so the engine samples row subsets too.
    match i % 3 {
        0 => SamplingParams {
            temperature: 1.0,
            top_k: Some(50),
            top_p: Some(0.95),
        },
        1 => SamplingParams {
            temperature: 0.6,
            top_k: None,
            top_p: Some(0.9),
        },
        _ => SamplingParams::plain(),
    }
}

fn run(engine: &mut Engine, vocab: u32) -> Vec<Finished> {
    for p in 0..12u64 {
        let job = Job {
            tag: p,
            prompt_id: p,
            prompt_ids: (0..(4 + 3 * p as u32))
                .map(|i| (i * 7 + p as u32 * 13) % vocab)
                .collect(),
            mode: Mode::Think,
            group_size: 4,
            params: GenParams {
                sampling: sampling(p),
                max_new_tokens: 24 + 4 * p as usize,
                seed: 11,
            },
        };
        assert!(engine.submit(job).unwrap());
    }
    let mut out = engine.run_to_completion().unwrap();
    out.sort_by_key(|f| (f.job.prompt_id, f.sample_index));
    out
}

#[test]
fn device_sampler_draws_the_cpu_samplers_tokens() {
    let dev = gpu();
    let cfg = common::tiny_config(256);
    let model = model_on(&cfg, 3, &dev);
    let stop = vec![3, 5, 11];
    let mut on_device = Engine::new(model.clone(), 0, 16, stop.clone()).unwrap();
    assert!(
        on_device.samples_on_device(),
        "the engine did not load the CUDA sampler (see the log for why)"
    );
    let mut on_host = Engine::new(model, 0, 16, stop).unwrap();
    on_host.use_host_sampler();
    assert!(!on_host.samples_on_device());
    let vocab = cfg.vocab_size as u32;
    let a = run(&mut on_device, vocab);
    let b = run(&mut on_host, vocab);
    assert_eq!(a.len(), 48);
    assert_eq!(b.len(), 48);
    // Same forward passes (same batch layout), so the same logits: every draw should agree.
    // Each sample is compared up to its first differing token (after it the prefixes, and so
    // the logits, differ).
    let (mut draws, mut differ) = (0usize, 0usize);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            (x.job.prompt_id, x.sample_index),
            (y.job.prompt_id, y.sample_index)
        );
        for (i, (tx, ty)) in x.response_ids.iter().zip(&y.response_ids).enumerate() {
            draws += 1;
            if tx != ty {
                differ += 1;
                break;
            }
            let (lx, ly) = (x.logprobs[i], y.logprobs[i]);
            assert!(
                (lx - ly).abs() <= 1e-4,
                "prompt {} sample {} token {i}: log-prob {lx} (GPU) vs {ly} (CPU)",
                x.job.prompt_id,
                x.sample_index
            );
        }
        if x.response_ids == y.response_ids {
            assert_eq!(x.finish_reason, y.finish_reason);
        }
    }
    assert!(draws > 500, "only {draws} draws compared");
    assert!(
        differ * 1000 <= draws,
        "{differ} of {draws} draws differ between the CUDA and the CPU sampler"
    );
}

/// Decode tokens/s on the GPU, sampling on the device against copying the logits to the host
/// and sampling there, for a Qwen3 0.6B-shaped random model (28 layers, vocab 151 936) at
/// batch 1 / 8 / 64. Writes a markdown table to `$ENGINE_BENCH_OUT` when set.
#[test]
#[ignore = "GPU benchmark; run by scripts/gpu-check.sh"]
fn gpu_engine_benchmark() {
    let dev = gpu();
    let cfg = ModelConfig::from_json_str(
        r#"{"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
            "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 4096,
            "initializer_range": 0.02, "eos_token_id": 151645, "tie_word_embeddings": true}"#,
    )
    .expect("config");
    let model = model_on(&cfg, 1, &dev);
    let steps = 64usize;
    let plen = 32usize;
    let mut table = String::from(
        "| batch | device sampler tok/s | host sampler tok/s | ratio |\n|---|---|---|---|\n",
    );
    for batch in [1usize, 8, 64] {
        let mut rate = [0.0f64; 2];
        for (i, host) in [false, true].into_iter().enumerate() {
            let mut engine = Engine::new(model.clone(), 0, batch, vec![]).unwrap();
            if host {
                engine.use_host_sampler();
            }
            for r in 0..batch as u64 {
                engine
                    .submit(Job {
                        tag: r,
                        prompt_id: r,
                        prompt_ids: (0..plen as u32)
                            .map(|i| (r as u32 * 31 + i * 17) % 151_936)
                            .collect(),
                        mode: Mode::NoThink,
                        group_size: 1,
                        params: GenParams {
                            sampling: SamplingParams {
                                temperature: 1.0,
                                top_k: None,
                                top_p: Some(0.95),
                            },
                            max_new_tokens: steps + 1,
                            seed: 0,
                        },
                    })
                    .unwrap();
            }
            engine.step().unwrap(); // prefill + first decode, not timed
            let t = Instant::now();
            for _ in 0..steps - 1 {
                engine.step().unwrap();
            }
            rate[i] = (batch * (steps - 1)) as f64 / t.elapsed().as_secs_f64();
        }
        table += &format!(
            "| {batch} | {:.1} | {:.1} | {:.2} |\n",
            rate[0],
            rate[1],
            rate[0] / rate[1]
        );
    }
    let header = format!(
        "Engine decode on the GPU, Qwen3 0.6B-shaped random model ({:?}), {steps} steps, \
         prompt {plen} tokens, top-p 0.95:\n\n",
        compute_dtype(&dev)
    );
    print!("{header}{table}");
    if let Ok(path) = std::env::var("ENGINE_BENCH_OUT") {
        std::fs::write(path, format!("{header}{table}")).expect("write table");
    }
}
