//! The loss / grad-norm spike at the second step of a KL-penalised RL stage (issue 19).
//!
//! A stage starts with a fresh AdamW, whose first update is `lr·sign(g)` in every weight. The
//! second step trains on rollouts sampled by the stage-start policy, which is also the KL
//! reference. Where that first update made a token the reference sampled (so finds likely)
//! unlikely, TRL's k3 term `exp(r − lp) − (r − lp) − 1` is exponential in the drop, and so is
//! its gradient `1 − exp(r − lp)`: one batch one version old yields a loss and a gradient
//! norm orders of magnitude above the first step's.
//!
//! Setup: a Qwen3-shaped model (the tiny default's dimensions, vocab 256), briefly fine-tuned so
//! that it is peaked; two batches sampled from it at temperature 0.6 with exact behaviour
//! log-probs; step 1 on the first batch with a fresh AdamW (betas (0.9, 0.95), clip 1.0); then
//! the second batch (one version old, behaviour = reference) is evaluated with `kl_coef` 0.05.
//! The first step's learning rate (1e-2) is chosen so that it moves some sampled tokens by
//! several nats, as the runs in issue 19 show at the second step of math, code and SWE.

use std::collections::HashMap;

use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};
use cascade_learner::train_step::accumulate_grpo_gradients;
use cascade_learner::{
    AdamW, AdamWConfig, GrpoBatch, GrpoConfig, GrpoStats, KlEstimator, PolicyModel,
};
use cascade_shared::model::{
    random_weights, trainable_from_tensors, CausalLm, ModelConfig, Params,
};
use cascade_shared::{
    FinishReason, Mode, RolloutGroup, Sample, SampleTiming, StageKind, VersionSpan,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const VOCAB: usize = 256;
const TEMP: f32 = 0.6;
const RESP: usize = 12;

fn model_cfg() -> ModelConfig {
    ModelConfig::from_json_str(&format!(
        r#"{{"model_type":"qwen3","vocab_size":{VOCAB},"hidden_size":128,"intermediate_size":384,
        "num_hidden_layers":4,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":32,
        "max_position_embeddings":256,"tie_word_embeddings":true,"initializer_range":0.02}}"#
    ))
    .unwrap()
}

struct Task {
    prompts: Vec<Vec<u32>>,
    alternatives: Vec<Vec<Vec<u32>>>,
}

fn task(n: usize) -> Task {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let prompts = (0..n)
        .map(|_| (0..4).map(|_| rng.random_range(2..VOCAB as u32)).collect())
        .collect();
    let alternatives = (0..n)
        .map(|_| {
            (0..3)
                .map(|_| {
                    (0..RESP)
                        .map(|_| rng.random_range(2..VOCAB as u32))
                        .collect()
                })
                .collect()
        })
        .collect();
    Task {
        prompts,
        alternatives,
    }
}

fn optimizer(params: &Params) -> AdamW {
    AdamW::new(
        params
            .vars
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.0,
            max_grad_norm: Some(1.0),
            max_consecutive_skips: 3,
            ..AdamWConfig::default()
        },
    )
    .unwrap()
}

/// Supervised fine-tuning on a position-wise mixture of three answers per prompt: a policy that
/// is peaked but not deterministic, so that groups have different rewards.
fn sft(model: &CausalLm, params: &Params, t: &Task, steps: usize) -> Result<f32> {
    let mut opt = optimizer(params);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut last = 0.0;
    for _ in 0..steps {
        let rows: Vec<Vec<u32>> = t
            .prompts
            .iter()
            .zip(&t.alternatives)
            .map(|(p, alts)| {
                // Position-wise mixture of the alternatives: the model cannot be certain.
                let r: Vec<u32> = (0..RESP)
                    .map(|j| alts[rng.random_range(0..alts.len())][j])
                    .collect();
                p.iter().chain(&r).copied().collect()
            })
            .collect();
        let (b, len) = (rows.len(), rows[0].len());
        let ids = Tensor::from_vec(rows.concat(), (b, len), &Device::Cpu)?;
        let mask = Tensor::ones((b, len), DType::U8, &Device::Cpu)?;
        let lp = PolicyModel::token_logprobs(model, &ids, &mask)?.narrow(1, 3, RESP)?;
        let loss = lp.mean_all()?.neg()?;
        last = loss.to_scalar::<f32>()?;
        opt.accumulate(&loss.backward()?)?;
        opt.step(3e-3, last as f64)?;
    }
    Ok(last)
}

/// G samples per prompt from `model` at temperature TEMP, with exact behaviour log-probs.
fn rollouts(
    model: &CausalLm,
    t: &Task,
    g: usize,
    version: u64,
    seed: u64,
) -> Result<Vec<RolloutGroup>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rows: Vec<Vec<u32>> = t.prompts.iter().flat_map(|p| vec![p.clone(); g]).collect();
    for _ in 0..RESP {
        let (b, len) = (rows.len(), rows[0].len());
        let ids = Tensor::from_vec(rows.concat(), (b, len), &Device::Cpu)?;
        let logits = model
            .forward_logits(&ids, None)?
            .narrow(1, len - 1, 1)?
            .squeeze(1)?;
        let probs = candle_nn::ops::softmax(
            (logits / TEMP as f64)?.to_dtype(DType::F32)?.as_ref(),
            D::Minus1,
        )?
        .to_vec2::<f32>()?;
        for (row, p) in rows.iter_mut().zip(probs) {
            let u: f32 = rng.random();
            let mut acc = 0.0;
            let mut tok = (VOCAB - 1) as u32;
            for (i, q) in p.iter().enumerate() {
                acc += q;
                if u < acc {
                    tok = i as u32;
                    break;
                }
            }
            row.push(tok);
        }
    }
    let (b, len) = (rows.len(), rows[0].len());
    let ids = Tensor::from_vec(rows.concat(), (b, len), &Device::Cpu)?;
    let mask = Tensor::ones((b, len), DType::U8, &Device::Cpu)?;
    let lps = model
        .token_logprobs_at(&ids, Some(&mask), &vec![TEMP; b])?
        .narrow(1, 3, RESP)?
        .to_vec2::<f32>()?;
    let mut groups = Vec::new();
    for (i, p) in t.prompts.iter().enumerate() {
        let samples = (0..g)
            .map(|j| {
                let r = i * g + j;
                let resp = rows[r][4..].to_vec();
                let reward = resp
                    .iter()
                    .zip(&t.alternatives[i][0])
                    .filter(|(a, b)| a == b)
                    .count() as f32
                    / RESP as f32;
                Sample {
                    response_ids: resp,
                    behaviour_logprobs: lps[r].clone(),
                    policy_versions: vec![VersionSpan {
                        start_token: 0,
                        version,
                    }],
                    finish_reason: FinishReason::Stop,
                    reward,
                    reward_breakdown: vec![],
                    timing: SampleTiming::default(),
                }
            })
            .collect();
        groups.push(RolloutGroup {
            stage: StageKind::Math,
            stage_index: 0,
            prompt_id: i as u64,
            mode: Mode::NoThink,
            actor_id: 0,
            prompt_ids: p.clone(),
            temperature: TEMP,
            samples,
        });
    }
    Ok(groups)
}

/// max and mean |·| over response tokens of (reference − policy) log-prob.
fn max_drop(
    policy: &CausalLm,
    reference: &CausalLm,
    groups: &[RolloutGroup],
) -> Result<(f32, f32)> {
    let rows: Vec<Vec<u32>> = groups
        .iter()
        .flat_map(|g| {
            g.samples.iter().map(|s| {
                g.prompt_ids
                    .iter()
                    .chain(&s.response_ids)
                    .copied()
                    .collect::<Vec<u32>>()
            })
        })
        .collect();
    let (b, len) = (rows.len(), rows[0].len());
    let ids = Tensor::from_vec(rows.concat(), (b, len), &Device::Cpu)?;
    let mask = Tensor::ones((b, len), DType::U8, &Device::Cpu)?;
    let lp = policy
        .token_logprobs_at(&ids, Some(&mask), &vec![TEMP; b])?
        .narrow(1, 3, RESP)?;
    let r = reference
        .token_logprobs_at(&ids, Some(&mask), &vec![TEMP; b])?
        .narrow(1, 3, RESP)?;
    let d = (r - lp)?;
    Ok((
        d.flatten_all()?.max(0)?.to_scalar::<f32>()?,
        d.abs()?.mean_all()?.to_scalar::<f32>()?,
    ))
}

/// Step 1 (fresh AdamW, on-policy batch), then the statistics and gradient norm of the
/// one-version-old batch under `objective`.
fn second_step(objective: &GrpoConfig) -> Result<(GrpoStats, f64, GrpoStats, f64, f32)> {
    let cfg = model_cfg();
    let t = task(16);
    let (policy, params) = trainable_from_tensors(&cfg, random_weights(&cfg, 0, &Device::Cpu)?)?;
    sft(&policy, &params, &t, 20)?;
    let copies: HashMap<String, Tensor> = params
        .vars
        .iter()
        .map(|(k, v)| Ok((k.clone(), v.as_tensor().copy()?)))
        .collect::<Result<_>>()?;
    let reference = CausalLm::from_tensors(&cfg, &copies)?;
    let first = rollouts(&policy, &t, 4, 0, 1)?;
    let second = rollouts(&policy, &t, 4, 0, 2)?;

    let mut opt = optimizer(&params);
    let batch = GrpoBatch::from_groups(&first, objective)?;
    let step1 = accumulate_grpo_gradients(
        &policy,
        Some(&reference),
        &batch,
        64,
        objective,
        &mut opt,
        &Device::Cpu,
    )?;
    let norm1 = opt.grad_norm()?;
    opt.step(1e-2, step1.loss)?;

    let (drop, _) = max_drop(&policy, &reference, &second)?;
    let batch = GrpoBatch::from_groups(&second, objective)?;
    let step2 = accumulate_grpo_gradients(
        &policy,
        Some(&reference),
        &batch,
        64,
        objective,
        &mut opt,
        &Device::Cpu,
    )?;
    let norm2 = opt.grad_norm()?;
    Ok((step1, norm1, step2, norm2, drop))
}

#[test]
fn k3_on_a_batch_one_version_old_spikes() -> Result<()> {
    // TRL's objective, as the tiny default used it: unweighted k3, no dual clip.
    let trl = GrpoConfig {
        kl_coef: 0.05,
        clip_eps_high: 0.2,
        ..GrpoConfig::default()
    };
    let (s1, n1, s2, n2, drop) = second_step(&trl)?;
    eprintln!(
        "k3: step 1 loss {:.4} grad_norm {n1:.3}; step 2 loss {:.4} grad_norm {n2:.3} \
         kl_mean {:.3} max(r − lp) {drop:.2}",
        s1.loss,
        s2.loss,
        s2.kl_sum / s2.tokens
    );
    // On-policy, the reference is the policy: no KL at step 1.
    assert!(s1.kl_sum.abs() < 1e-3, "{s1:?}");
    // One version later the first update moved some sampled tokens by several nats...
    assert!(drop > 5.0, "max(r − lp) {drop}");
    // ... and the unweighted k3 turns that into a spike of two orders of magnitude.
    assert!(n2 > 50.0 * n1, "grad norm {n2} vs {n1} at step 1");
    assert!(s2.loss > 1.0 && s2.kl_sum / s2.tokens > 20.0, "{s2:?}");
    Ok(())
}

#[test]
fn importance_weighted_bounded_kl_and_dual_clip_keep_the_second_step_bounded() -> Result<()> {
    // The stage defaults (shared::config::StageConfig): k3 weighted by π_θ/π_behaviour with
    // its log-ratio bounded at 2, dual clip 3.
    let guarded = GrpoConfig {
        kl_coef: 0.05,
        clip_eps_high: 0.2,
        kl_estimator: KlEstimator::K3Importance,
        kl_log_ratio_max: Some(2.0),
        dual_clip: Some(3.0),
        ..GrpoConfig::default()
    };
    let (s1, n1, s2, n2, drop) = second_step(&guarded)?;
    eprintln!(
        "k3_is: step 1 loss {:.4} grad_norm {n1:.3}; step 2 loss {:.4} grad_norm {n2:.3} \
         kl_mean {:.4} kl_max {:.4} bounded {} max(r − lp) {drop:.2} ratio_max {:.3}",
        s1.loss,
        s2.loss,
        s2.kl_sum / s2.tokens,
        s2.kl_max,
        s2.kl_bounded_tokens,
        s2.ratio_max
    );
    assert!(s1.kl_sum.abs() < 1e-3, "{s1:?}");
    // The same first step moved sampled tokens as far ...
    assert!(drop > 5.0, "max(r − lp) {drop}");
    assert!((s2.ref_log_ratio_max - drop as f64).abs() < 1e-3);
    // ... but the second step stays at the first step's scale.
    assert!(n2 < 5.0 * n1, "grad norm {n2} vs {n1} at step 1");
    assert!(s2.loss.abs() < 0.5 && s2.kl_sum / s2.tokens < 1.0, "{s2:?}");
    Ok(())
}
