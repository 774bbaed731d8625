//! Packed GRPO micro-batches (issue 16, item 4): samples packed into rows of at most
//! `learner.token_budget` tokens give the same loss, statistics and gradients of every
//! parameter as one padded sample per row, through the real model (`CausalLm`, a tiny Qwen3
//! with GQA, on the fused CPU attention): varied prompt and response lengths, three sampling
//! temperatures, truncated and aborted samples, both aggregations, KL (both estimators, with
//! and without the bound), dual clip and TIS.
//!
//! Also: a measurement of the tokens a step processes, padded against packed, on a realistic
//! length mix (printed with `--nocapture`; the assertions are invariants, not timings).

use std::collections::HashMap;

use anyhow::{Context, Result};
use candle_core::{Device, Tensor};
use cascade_learner::train_step::accumulate_grpo_gradients;
use cascade_learner::{
    AdamW, AdamWConfig, GrpoBatch, GrpoConfig, GrpoStats, KlEstimator, LossAggregation,
};
use cascade_shared::model::{random_weights, trainable_from_tensors, CausalLm, ModelConfig};
use cascade_shared::{
    FinishReason, Mode, RolloutGroup, Sample, SampleTiming, StageKind, VersionSpan,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const VOCAB: u32 = 64;

fn model_cfg() -> ModelConfig {
    ModelConfig::from_json_str(
        r#"{"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 128,
            "tie_word_embeddings": false, "initializer_range": 0.2}"#,
    )
    .unwrap()
}

/// Groups of 4 samples: prompts of 1–9 tokens, responses of 0–20 tokens, temperatures 1.0, 0.6
/// and 0.85 in turn, some truncated (`Length`) and one aborted. Behaviour log-probs are the
/// policy's own at the group's temperature plus noise of ±0.6 nats, so that ratios spread over
/// both clip ranges and the dual clip.
fn groups(policy: &CausalLm) -> Result<Vec<RolloutGroup>> {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let temps = [1.0f32, 0.6, 0.85];
    let mut out = Vec::new();
    for g in 0..9 {
        let prompt_len = rng.random_range(1..10);
        let prompt: Vec<u32> = (0..prompt_len)
            .map(|_| rng.random_range(1..VOCAB))
            .collect();
        let temperature = temps[g % temps.len()];
        let mut samples = Vec::new();
        for s in 0..4 {
            let resp_len = if g == 4 && s == 0 {
                0
            } else {
                rng.random_range(1..21)
            };
            let response: Vec<u32> = (0..resp_len).map(|_| rng.random_range(1..VOCAB)).collect();
            let finish = match (g, s) {
                (_, 3) if g % 2 == 0 => FinishReason::Length,
                (7, 1) => FinishReason::Abort,
                _ => FinishReason::Stop,
            };
            let mut ids = prompt.clone();
            ids.extend(&response);
            let behaviour = if response.is_empty() {
                Vec::new()
            } else {
                let n = ids.len();
                let t = Tensor::from_vec(ids, (1, n), &Device::Cpu)?;
                let lp = policy.token_logprobs_at(&t, None, &[temperature])?;
                lp.squeeze(0)?.to_vec1::<f32>()?[prompt_len - 1..]
                    .iter()
                    .map(|x| x + rng.random_range(-0.6f32..0.6))
                    .collect()
            };
            samples.push(Sample {
                response_ids: response,
                behaviour_logprobs: behaviour,
                policy_versions: vec![VersionSpan {
                    start_token: 0,
                    version: 0,
                }],
                finish_reason: finish,
                reward: rng.random_range(0.0f32..1.0),
                reward_breakdown: vec![],
                timing: SampleTiming::default(),
            });
        }
        out.push(RolloutGroup {
            stage: StageKind::Math,
            stage_index: 0,
            prompt_id: 100 + g as u64,
            mode: Mode::Think,
            actor_id: 0,
            prompt_ids: prompt,
            temperature,
            samples,
        });
    }
    Ok(out)
}

/// The objectives checked: every option of the loss in at least one of them.
fn objectives() -> Vec<(&'static str, GrpoConfig)> {
    vec![
        (
            "token_kl_k3is_bounded_dualclip",
            GrpoConfig {
                kl_coef: 0.1,
                kl_estimator: KlEstimator::K3Importance,
                kl_log_ratio_max: Some(0.5),
                dual_clip: Some(1.5),
                ..GrpoConfig::default()
            },
        ),
        (
            "sequence_kl_k3_tis_nostd",
            GrpoConfig {
                scale_by_std: false,
                kl_coef: 0.05,
                tis_cap: Some(1.2),
                aggregation: LossAggregation::Sequence,
                ..GrpoConfig::default()
            },
        ),
        (
            "sequence_truncated_trained_dualclip",
            GrpoConfig {
                mask_truncated: false,
                dual_clip: Some(1.5),
                aggregation: LossAggregation::Sequence,
                kl_coef: 0.2,
                ..GrpoConfig::default()
            },
        ),
    ]
}

/// Loss statistics and the gradient of every parameter after one accumulated step.
fn step(
    policy: &CausalLm,
    params: &cascade_shared::model::Params,
    reference: &CausalLm,
    batch: &GrpoBatch,
    micro_batch: usize,
    cfg: &GrpoConfig,
) -> Result<(GrpoStats, HashMap<String, Tensor>)> {
    let mut opt = AdamW::new(
        params
            .vars
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        AdamWConfig::default(),
    )?;
    let stats = accumulate_grpo_gradients(
        policy,
        Some(reference),
        batch,
        micro_batch,
        cfg,
        &mut opt,
        &Device::Cpu,
    )?;
    let mut grads = HashMap::new();
    for name in params.vars.keys() {
        let g = opt
            .grad(name)
            .with_context(|| format!("no gradient for {name}"))?;
        grads.insert(name.clone(), g.clone());
    }
    Ok((stats, grads))
}

fn close(a: f64, b: f64, what: &str) {
    let tol = 1e-5 * a.abs().max(b.abs()).max(1e-3);
    assert!((a - b).abs() <= tol, "{what}: packed {a} vs padded {b}");
}

#[test]
fn packed_rows_give_the_padded_loss_stats_and_gradients() -> Result<()> {
    let cfg = model_cfg();
    let dev = Device::Cpu;
    let (policy, params) = trainable_from_tensors(&cfg, random_weights(&cfg, 3, &dev)?)?;
    let reference = CausalLm::from_tensors(&cfg, &random_weights(&cfg, 4, &dev)?)?;
    let groups = groups(&policy)?;
    let longest = groups
        .iter()
        .flat_map(|g| {
            g.samples
                .iter()
                .map(|s| g.prompt_ids.len() + s.response_ids.len())
        })
        .max()
        .unwrap();
    let mut checked = 0;
    for (name, objective) in objectives() {
        objective.validate()?;
        let padded = GrpoBatch::from_groups(&groups, &objective)?;
        let (want, want_grads) = step(&policy, &params, &reference, &padded, 5, &objective)?;
        // The objective's options must actually act on this batch, or the test proves little.
        match objective.tis_cap {
            // With TIS the PPO ratio is 1 in value (never clipped); the cap must bind instead.
            Some(cap) => assert!(want.ratio_max > f64::from(cap), "{name}: TIS cap idle"),
            None => assert!(want.clipped_tokens > 0.0, "{name}: no clipped token"),
        }
        if objective.dual_clip.is_some() {
            assert!(want.dual_clipped_tokens > 0.0, "{name}: dual clip idle");
        }
        if objective.kl_log_ratio_max.is_some() {
            assert!(want.kl_bounded_tokens > 0.0, "{name}: KL bound idle");
        }
        // A budget of exactly the longest sample, and a roomier one; 1 and 3 rows per
        // micro-batch.
        for (budget, micro_batch) in [(longest, 1), (48, 3), (48, 1)] {
            let packed = GrpoBatch::from_groups(&groups, &objective)?.with_token_budget(budget)?;
            assert!(packed.rows() < padded.rows(), "{name}: nothing was packed");
            assert!(
                packed.layout().iter().any(|row| row.len() >= 3),
                "{name}: no row holds 3 samples"
            );
            // Never two temperatures in one row.
            for row in packed.layout() {
                let t = groups[row[0].0].temperature;
                assert!(row.iter().all(|&(g, _)| groups[g].temperature == t));
            }
            let (got, got_grads) = step(
                &policy,
                &params,
                &reference,
                &packed,
                micro_batch,
                &objective,
            )?;
            let what = |s: &str| format!("{name}, budget {budget}, micro-batch {micro_batch}: {s}");
            close(got.loss, want.loss, &what("loss"));
            close(got.tokens, want.tokens, &what("tokens"));
            close(got.clipped_tokens, want.clipped_tokens, &what("clipped"));
            close(
                got.dual_clipped_tokens,
                want.dual_clipped_tokens,
                &what("dual clipped"),
            );
            close(got.ratio_sum, want.ratio_sum, &what("ratio_sum"));
            close(got.ratio_max, want.ratio_max, &what("ratio_max"));
            close(got.kl_sum, want.kl_sum, &what("kl_sum"));
            close(got.kl_max, want.kl_max, &what("kl_max"));
            close(
                got.kl_bounded_tokens,
                want.kl_bounded_tokens,
                &what("kl_bounded"),
            );
            close(
                got.ref_log_ratio_max,
                want.ref_log_ratio_max,
                &what("ref_log_ratio_max"),
            );
            assert_eq!(got_grads.len(), want_grads.len());
            for (param, want_g) in &want_grads {
                let got_g = &got_grads[param];
                let scale = want_g.abs()?.max_all()?.to_scalar::<f32>()?;
                let diff = (got_g - want_g)?.abs()?.max_all()?.to_scalar::<f32>()?;
                assert!(scale > 0.0, "{}", what(&format!("{param} has no gradient")));
                assert!(
                    diff <= 1e-5 * scale,
                    "{}",
                    what(&format!("{param}: max |Δ| {diff} vs max |g| {scale}"))
                );
                checked += 1;
            }
        }
    }
    // 2 layers × 11 tensors + embed + norm + lm_head, 3 objectives × 3 layouts.
    assert_eq!(checked, 25 * 3 * 3);
    Ok(())
}

/// One standard normal draw (Box–Muller).
fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// Groups with the length mix of a math RL stage: prompts of 50–400 tokens, responses
/// log-normal around `median` tokens (σ = 0.8), cut at `max_response` (those are truncated).
fn length_mix(
    prompts: usize,
    group_size: usize,
    median: f64,
    max_response: usize,
) -> Vec<RolloutGroup> {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    (0..prompts)
        .map(|p| {
            let prompt_len = rng.random_range(50..=400);
            let samples = (0..group_size)
                .map(|i| {
                    let len = (median * (0.8 * normal(&mut rng)).exp()).round().max(1.0) as usize;
                    let (len, finish) = if len >= max_response {
                        (max_response, FinishReason::Length)
                    } else {
                        (len, FinishReason::Stop)
                    };
                    Sample {
                        response_ids: vec![1; len],
                        behaviour_logprobs: vec![-1.0; len],
                        policy_versions: vec![VersionSpan {
                            start_token: 0,
                            version: 0,
                        }],
                        finish_reason: finish,
                        reward: i as f32,
                        reward_breakdown: vec![],
                        timing: SampleTiming::default(),
                    }
                })
                .collect();
            RolloutGroup {
                stage: StageKind::Math,
                stage_index: 0,
                prompt_id: p as u64,
                mode: Mode::Think,
                actor_id: 0,
                prompt_ids: vec![1; prompt_len],
                temperature: 1.0,
                samples,
            }
        })
        .collect()
}

/// Tokens processed per step, padded against packed (issue 16's measurement; run with
/// `--nocapture` to see the table). The layout arithmetic only: no model runs.
#[test]
fn padding_fraction_of_a_realistic_length_mix() -> Result<()> {
    let groups = length_mix(64, 8, 1500.0, 8192);
    let cfg = GrpoConfig::default();
    let padded = GrpoBatch::from_groups(&groups, &cfg)?;
    let real = padded.total_tokens();
    println!(
        "{} samples, {} real tokens (prompt 50–400, response log-normal median 1500, σ 0.8, \
         max 8192)",
        padded.len(),
        real
    );
    println!(
        "{:<34} {:>8} {:>12} {:>9}",
        "layout", "forwards", "tokens", "padding"
    );
    let row = |name: String, forwards: usize, tokens: usize| {
        let pad = 1.0 - real as f64 / tokens as f64;
        println!(
            "{name:<34} {forwards:>8} {tokens:>12} {:>8.1}%",
            100.0 * pad
        );
        pad
    };
    let mut padded_fraction = 0.0;
    for micro_batch in [1, 4, 8] {
        let f = row(
            format!("padded, micro_batch {micro_batch}"),
            padded.micro_batch_ranges(micro_batch).len(),
            padded.padded_tokens(micro_batch),
        );
        if micro_batch == 8 {
            padded_fraction = f;
        }
    }
    for (budget, micro_batch) in [(8192 + 400, 1), (16384, 1), (32768, 1), (16384, 4)] {
        let packed = GrpoBatch::from_groups(&groups, &cfg)?.with_token_budget(budget)?;
        let tokens = packed.padded_tokens(micro_batch);
        let f = row(
            format!("packed, budget {budget}, micro_batch {micro_batch}"),
            packed.micro_batch_ranges(micro_batch).len(),
            tokens,
        );
        // Invariants: every sample once, no row over the budget, no more work than padding.
        assert_eq!(packed.total_tokens(), real);
        assert_eq!(
            packed.layout().iter().map(Vec::len).sum::<usize>(),
            padded.len()
        );
        assert!(tokens <= packed.rows() * budget);
        assert!(f < padded_fraction, "packing padded more than padding");
    }
    Ok(())
}

/// The budget error reaches the caller of a real step, naming the sample.
#[test]
fn a_budget_below_the_longest_sample_is_an_error() -> Result<()> {
    let groups = length_mix(4, 4, 100.0, 300);
    let longest = groups
        .iter()
        .enumerate()
        .flat_map(|(gi, g)| {
            g.samples
                .iter()
                .enumerate()
                .map(move |(si, s)| (g.prompt_ids.len() + s.response_ids.len(), gi, si))
        })
        .max_by_key(|&(len, gi, si)| (len, std::cmp::Reverse((gi, si))))
        .unwrap();
    let (len, gi, si) = longest;
    let err = GrpoBatch::from_groups(&groups, &GrpoConfig::default())?
        .with_token_budget(len - 1)
        .unwrap_err()
        .to_string();
    for part in [
        format!("group {gi} "),
        format!("sample {si}:"),
        format!("{len} tokens"),
        format!("token budget of {}", len - 1),
    ] {
        assert!(err.contains(&part), "{err:?} lacks {part:?}");
    }
    Ok(())
}

/// At config validation: a budget that cannot hold a stage's longest response plus one prompt
/// token is refused, naming the key, the stage and the numbers (from the file or the flag).
#[test]
fn config_validation_refuses_a_budget_below_a_stage_s_longest_response() {
    use cascade_shared::config::{ConfigArgs, LearnerArgs, RunConfig};
    let text = |budget: usize, extra: &str| {
        format!(
            r#"
[model]
path = "ckpt"
[actor]
max_new_tokens = 300
[learner]
token_budget = {budget}
[[stages]]
name = "sft"
kind = "sft"
dataset = "sft.jsonl"
steps = 10
lr = 1e-6
token_budget = 64
[[stages]]
name = "math"
kind = "math"
dataset = "math.jsonl"
steps = 10
lr = 1e-6
{extra}
"#
        )
    };
    let parse = |t: &str| RunConfig::parse(t, "test.toml", std::path::Path::new("/b"), &[]);
    // actor.max_new_tokens (300) is the stage's longest response: 300 leaves no prompt token.
    let e = parse(&text(300, "")).unwrap_err().to_string();
    for part in [
        "learner.token_budget",
        "stages[1]",
        "\"math\"",
        "300 tokens",
        "300 response",
    ] {
        assert!(e.contains(part), "{e:?} lacks {part:?}");
    }
    assert_eq!(parse(&text(301, "")).unwrap().learner.token_budget, 301);
    assert_eq!(parse(&text(0, "")).unwrap().learner.token_budget, 0);
    // A curriculum: its longest length counts.
    let curriculum = "max_response_tokens = [100, 500]\ncurriculum_steps = [5]";
    let e = parse(&text(400, curriculum)).unwrap_err().to_string();
    assert!(e.contains("500 response"), "{e}");
    assert!(parse(&text(501, curriculum)).is_ok());

    // The flag (`--token-budget`) is checked the same way.
    let flag = |budget: usize| ConfigArgs {
        learner: LearnerArgs {
            token_budget: Some(budget),
            ..LearnerArgs::default()
        },
        ..ConfigArgs::default()
    };
    let e = flag(200)
        .load(&text(0, ""), std::path::Path::new("/b"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("learner.token_budget") && e.contains("200 tokens"),
        "{e}"
    );
    let config = flag(4096)
        .load(&text(0, ""), std::path::Path::new("/b"))
        .unwrap();
    assert_eq!(config.learner.token_budget, 4096);
}
