//! Engine decode throughput (continuous batching + CPU sampler at T = 1) on a checkpoint, at
//! batch 1 / 8 / 64, printed as JSON lines for `scripts/bench-engine.sh`.
//! Usage: `cargo bench -p cascade-actor --bench engine -- MODEL_DIR [steps]`.
//! With `--groups`: whole generations of GRPO groups (4 prompts × 8 samples through 16 slots,
//! prompts of 256 and 1024 tokens, 16 new tokens) with the samples of a prompt sharing its
//! cache and with every sample prefilled on its own, in the same run.

use std::time::Instant;

use candle_core::Device;
use cascade_actor::engine::{Engine, GenParams, Job};
use cascade_actor::sampler::SamplingParams;
use cascade_shared::Mode;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let Some(dir) = args.first() else {
        eprintln!("usage: engine MODEL_DIR [steps]");
        return;
    };
    let steps: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(64);
    if std::env::args().any(|a| a == "--groups") {
        groups(std::path::Path::new(dir));
        return;
    }
    let plen = 16;
    for batch in [1usize, 8, 64] {
        let mut best = f64::MAX;
        for _ in 0..2 {
            let model = cascade_shared::model::load_model(std::path::Path::new(dir), &Device::Cpu)
                .expect("model");
            let vocab = model.config().vocab_size as u32;
            let mut engine = Engine::new(model, 0, batch, vec![]).expect("engine");
            for r in 0..batch as u64 {
                engine
                    .submit(job(r, plen, vocab, 1, steps + 1))
                    .expect("submit");
            }
            engine.step().expect("prefill step"); // prefill + first decode, not timed
            let t = Instant::now();
            for _ in 0..steps - 1 {
                engine.step().expect("step");
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{}",
            serde_json::json!({"bench": "engine_decode", "batch": batch, "steps": steps - 1,
                               "tokens_per_s": (batch * (steps - 1)) as f64 / best})
        );
    }
}

/// Seconds (best of 2) for whole generations of groups, with and without shared prompt caches.
fn groups(dir: &std::path::Path) {
    let (prompts, group, slots, new_tokens) = (4u64, 8usize, 16usize, 16usize);
    let context = cascade_shared::model::load_model(dir, &Device::Cpu)
        .expect("model")
        .config()
        .max_position_embeddings;
    for plen in [256usize, 1024] {
        if plen + new_tokens > context {
            continue;
        }
        let mut best = [f64::MAX; 2];
        let mut prefill = [0u64; 2];
        for _ in 0..2 {
            for (i, share) in [true, false].into_iter().enumerate() {
                let model = cascade_shared::model::load_model(dir, &Device::Cpu).expect("model");
                let vocab = model.config().vocab_size as u32;
                let mut engine = Engine::new(model, 0, slots, vec![]).expect("engine");
                engine.set_prompt_sharing(share);
                for p in 0..prompts {
                    engine
                        .submit(job(p, plen, vocab, group, new_tokens))
                        .expect("submit");
                }
                let t = Instant::now();
                let out = engine.run_to_completion().expect("generate");
                best[i] = best[i].min(t.elapsed().as_secs_f64());
                assert_eq!(out.len(), prompts as usize * group);
                prefill[i] = engine.stats().prefill_tokens;
            }
        }
        println!(
            "{}",
            serde_json::json!({"bench": "engine_groups", "prompt": plen, "group": group,
                               "prompts": prompts, "slots": slots, "new_tokens": new_tokens,
                               "shared_s": best[0], "alone_s": best[1],
                               "shared_prefill_tokens": prefill[0],
                               "alone_prefill_tokens": prefill[1]})
        );
    }
}

/// Prompt `id`: `len` tokens, `group` samples of up to `max_new_tokens`, plain sampling.
fn job(id: u64, len: usize, vocab: u32, group: usize, max_new_tokens: usize) -> Job {
    Job {
        tag: id,
        prompt_id: id,
        prompt_ids: (0..len as u32)
            .map(|i| (id as u32 * 31 + i * 17) % vocab)
            .collect(),
        mode: Mode::NoThink,
        group_size: group,
        params: GenParams {
            sampling: SamplingParams::plain(),
            max_new_tokens,
            seed: 0,
        },
    }
}
