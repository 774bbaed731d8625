//! Engine decode throughput (continuous batching + CPU sampler at T = 1) on a checkpoint, at
//! batch 1 / 8 / 64, printed as JSON lines for `scripts/bench-engine.sh`.
//! Usage: `cargo bench -p cascade-actor --bench engine -- MODEL_DIR [steps]`.

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
                    .submit(Job {
                        tag: r,
                        prompt_id: r,
                        prompt_ids: (0..plen as u32)
                            .map(|i| (r as u32 * 31 + i * 17) % vocab)
                            .collect(),
                        mode: Mode::NoThink,
                        group_size: 1,
                        params: GenParams {
                            sampling: SamplingParams::plain(),
                            max_new_tokens: steps + 1,
                            seed: 0,
                        },
                    })
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
