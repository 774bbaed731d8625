//! The GRPO step with the LM head at the trained positions only (issue 16) against the full
//! (b, t − 1) grid, on the same model, batch and process: forward + backward time (median of
//! `--repeats`), and the largest relative difference of any parameter's gradient.
//!
//! ```text
//! cargo run --release -p cascade-learner --example grpo_head -- \
//!     [--prompt 768] [--response 64] [--vocab 151936] [--repeats 3]
//! ```
//!
//! Model: hidden 256, 2 layers, untied LM head, f32, CPU; 4 groups of 2 samples at temperature
//! 0.8, one sample per row, micro-batch 2. The full grid is the [`PolicyModel`] default
//! (every position's log-probs, then gathered); the selected path is `CausalLm`'s.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use cascade_learner::grpo::GrpoConfig;
use cascade_learner::optim::{AdamW, AdamWConfig};
use cascade_learner::train_step::accumulate_grpo_gradients;
use cascade_learner::{GrpoBatch, PolicyModel};
use cascade_shared::model::{random_weights, trainable_from_tensors, CausalLm, ModelConfig};
use cascade_shared::rollout::{FinishReason, Sample, SampleTiming, VersionSpan};
use cascade_shared::{Mode, RolloutGroup, StageKind};

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The model through the trait's default: full grid, then gathered.
struct FullGrid<'a>(&'a CausalLm);

impl PolicyModel for FullGrid<'_> {
    fn token_logprobs(&self, ids: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        PolicyModel::token_logprobs(self.0, ids, mask)
    }
    fn token_logprobs_at(
        &self,
        ids: &Tensor,
        mask: &Tensor,
        temperatures: &[f32],
    ) -> candle_core::Result<Tensor> {
        PolicyModel::token_logprobs_at(self.0, ids, mask, temperatures)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let prompt = arg(&args, "--prompt", 768);
    let response = arg(&args, "--response", 64);
    let vocab = arg(&args, "--vocab", 151_936);
    let repeats = arg(&args, "--repeats", 3).max(1);
    let cfg = ModelConfig::from_json_str(&format!(
        r#"{{"model_type": "qwen3", "vocab_size": {vocab}, "hidden_size": 256,
            "intermediate_size": 768, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
            "max_position_embeddings": 40960, "rope_theta": 1000000.0,
            "tie_word_embeddings": false, "initializer_range": 0.02}}"#
    ))?;
    let dev = Device::Cpu;
    let (model, vars) = trainable_from_tensors(&cfg, random_weights(&cfg, 0, &dev)?)?;
    let mut x = 7u64;
    let mut next = || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        ((x >> 33) % vocab as u64) as u32
    };
    let groups: Vec<RolloutGroup> = (0..4)
        .map(|g| RolloutGroup {
            stage: StageKind::Math,
            stage_index: 0,
            prompt_id: g,
            mode: Mode::Think,
            actor_id: 0,
            prompt_ids: (0..prompt).map(|_| next()).collect(),
            temperature: 0.8,
            samples: (0..2)
                .map(|s| Sample {
                    response_ids: (0..response).map(|_| next()).collect(),
                    behaviour_logprobs: vec![-12.0; response],
                    policy_versions: vec![VersionSpan {
                        start_token: 0,
                        version: 0,
                    }],
                    finish_reason: FinishReason::Stop,
                    reward: s as f32,
                    reward_breakdown: Vec::new(),
                    timing: SampleTiming::default(),
                })
                .collect(),
        })
        .collect();
    let grpo = GrpoConfig::default();
    let batch = GrpoBatch::from_groups(&groups, &grpo)?;
    let run = |policy: &dyn PolicyModel| -> Result<(f64, AdamW), Box<dyn std::error::Error>> {
        let mut times = Vec::new();
        let mut last = None;
        for _ in 0..repeats {
            let mut opt = AdamW::new(
                vars.vars.clone().into_iter().collect(),
                AdamWConfig::default(),
            )?;
            let t0 = Instant::now();
            accumulate_grpo_gradients::<dyn PolicyModel, dyn PolicyModel>(
                policy, None, &batch, 2, &grpo, &mut opt, &dev,
            )?;
            times.push(t0.elapsed().as_secs_f64());
            last = Some(opt);
        }
        times.sort_by(f64::total_cmp);
        Ok((times[times.len() / 2], last.expect("repeats ≥ 1")))
    };
    let (full_s, full) = run(&FullGrid(&model))?;
    let (sel_s, sel) = run(&model)?;
    let mut worst = 0f64;
    for name in full.names() {
        let (a, b) = (full.grad(name).unwrap(), sel.grad(name).unwrap());
        let diff = (&a - &b)?
            .abs()?
            .max_all()?
            .to_dtype(DType::F64)?
            .to_scalar::<f64>()?;
        let scale = a
            .abs()?
            .max_all()?
            .to_dtype(DType::F64)?
            .to_scalar::<f64>()?;
        worst = worst.max(diff / scale.max(1e-30));
    }
    println!(
        "{:>7} {:>9} {:>7} {:>12} {:>12} {:>8} {:>14}",
        "prompt", "response", "vocab", "full grid s", "selected s", "ratio", "max grad diff"
    );
    println!(
        "{prompt:>7} {response:>9} {vocab:>7} {full_s:>12.3} {sel_s:>12.3} {:>8.2} {worst:>14.2e}",
        sel_s / full_s
    );
    Ok(())
}
