//! Training the run's `[reward_model]` from the policy's current weights (with
//! [`crate::reward_train`]), as the learner does before the first stage that needs it.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;
use cascade_shared::chat::Chat;
use cascade_shared::config::{RewardModelTrainConfig, RunConfig};
use cascade_shared::data::Kind;
use cascade_shared::metrics::{MetricsLog, RmDone, RmStep};
use cascade_shared::model::{trainable_from_tensors, ModelConfig};

use crate::error::Result;
use crate::reward_train::{train_reward_model, HeadInit, RmInputs, RmTrainConfig};

/// Below this held-out prompt match the learner warns that the reward model ignores prompts.
const PROMPT_MATCH_WARN: f64 = 0.6;

/// What the run's reward-model training starts from.
pub struct RunRmInputs<'a> {
    /// The policy's architecture.
    pub cfg: &'a ModelConfig,
    /// The policy's current weights (copied: the policy is not touched).
    pub weights: &'a [(String, Tensor)],
    /// Directory with `tokenizer.json` (and `tokenizer_config.json`).
    pub tokenizer_dir: &'a Path,
    /// `tokenizer.json` bytes.
    pub tokenizer_json: &'a [u8],
    /// `tokenizer_config.json` bytes, if any.
    pub tokenizer_config_json: Option<&'a [u8]>,
}

/// Trains the reward model of `[reward_model]` from `inputs` and saves it (atomically, with a
/// `COMPLETE` marker) in `out`. Steps and the result go to `metrics` (`rm_step`, `rm_done`).
pub fn train_for_run(
    inputs: RunRmInputs<'_>,
    rm: &RewardModelTrainConfig,
    config: &RunConfig,
    out: &Path,
    micro_batch: usize,
    seed: u64,
    metrics: &MetricsLog,
) -> Result<()> {
    let copies = inputs
        .weights
        .iter()
        .map(|(k, t)| Ok((k.clone(), t.copy()?)))
        .collect::<Result<HashMap<_, _>>>()?;
    let (model, params) = trainable_from_tensors(inputs.cfg, copies)?;
    let chat = Chat::from_dir(inputs.tokenizer_dir)?;
    let cfg = RmTrainConfig {
        steps: rm.steps,
        batch_pairs: rm.batch_pairs,
        micro_batch: micro_batch.max(1),
        lr: rm.lr,
        warmup_steps: rm.warmup_steps,
        weight_decay: rm.weight_decay,
        seed,
        max_len: rm.max_len,
        ..RmTrainConfig::default()
    };
    let steps = rm.steps;
    let report = train_reward_model(
        RmInputs {
            model,
            params,
            head: HeadInit::Normal {
                std: inputs.cfg.initializer_range,
                seed,
            },
            chat,
            tokenizer_json: inputs.tokenizer_json.to_vec(),
            tokenizer_config_json: inputs.tokenizer_config_json.map(<[u8]>::to_vec),
        },
        &config.data_spec(&rm.dataset, Kind::Pairs, None)?,
        rm.heldout
            .as_ref()
            .map(|h| config.data_spec(h, Kind::Pairs, None))
            .transpose()?
            .as_ref(),
        out,
        &cfg,
        |s| {
            metrics.record(&RmStep {
                step: Some(s.step),
                steps: Some(steps as u64),
                loss: Some(s.loss),
                accuracy: Some(s.accuracy),
                margin: Some(s.margin),
                lr: Some(s.lr),
                grad_norm: s.grad_norm,
            });
        },
    )?;
    tracing::info!(
        "reward model trained: loss {:.4} → {:.4}, held-out accuracy {:?} → {:?}, prompt match {:?}",
        report.first_loss,
        report.final_loss,
        report.heldout_accuracy_before,
        report.heldout_accuracy,
        report.heldout_prompt_match
    );
    if let Some(m) = report
        .heldout_prompt_match
        .filter(|&m| m < PROMPT_MATCH_WARN)
    {
        tracing::warn!(
            "reward model: its scores barely depend on the prompt (held-out prompt match {m:.2}, \
             0.5 = ignored): an RLHF stage can be paid for one answer to every prompt; \
             give it preference pairs whose rejected answer is good but off-topic"
        );
    }
    metrics.record(&RmDone {
        heldout_accuracy: report.heldout_accuracy,
        heldout_accuracy_before: report.heldout_accuracy_before,
        heldout_prompt_match: report.heldout_prompt_match,
        pairs: Some(report.train_pairs as u64),
        heldout_pairs: Some(report.heldout_pairs as u64),
        first_loss: Some(report.first_loss),
        final_loss: Some(report.final_loss),
        dir: Some(out.display().to_string()),
    });
    Ok(())
}
