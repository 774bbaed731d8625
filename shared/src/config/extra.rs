//! `[reward_model]` (training the RLHF reward model inside the run) and `[eval]` (the held-out
//! evaluation after every stage).

use serde::{Deserialize, Serialize};

use super::dataset::DatasetEntry;
use super::error::{invalid, Result};

/// `[reward_model]`: a Bradley–Terry reward model trained by the learner on preference pairs
/// before the first RL stage that needs it, starting from the policy's weights at that point
/// (the SFT model), and saved to `RUN_DIR/reward_model/`. An `rlhf` stage without an explicit
/// `verifier.reward_model` uses it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardModelTrainConfig {
    /// Preference pairs (`{"prompt", "chosen", "rejected"}` JSONL, or a pairs preset such as
    /// HelpSteer3 / Skywork / TRL), a file, glob or directory relative to the config file.
    pub dataset: DatasetEntry,
    /// Held-out pairs for the pairwise accuracy report.
    #[serde(default)]
    pub heldout: Option<DatasetEntry>,
    /// Optimizer steps.
    #[serde(default = "default_rm_steps")]
    pub steps: usize,
    /// Peak learning rate.
    #[serde(default = "default_rm_lr")]
    pub lr: f64,
    /// Pairs per optimizer step.
    #[serde(default = "default_rm_batch")]
    pub batch_pairs: usize,
    /// Linear warm-up steps.
    #[serde(default)]
    pub warmup_steps: usize,
    /// AdamW decoupled weight decay.
    #[serde(default)]
    pub weight_decay: f64,
    /// Longest (prompt, response) conversation in tokens; longer pairs are skipped.
    #[serde(default = "default_rm_max_len")]
    pub max_len: usize,
}

fn default_rm_steps() -> usize {
    100
}
fn default_rm_lr() -> f64 {
    1e-4
}
fn default_rm_batch() -> usize {
    16
}
fn default_rm_max_len() -> usize {
    1024
}

impl RewardModelTrainConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.steps == 0 {
            return Err(invalid("reward_model.steps", "must be at least 1"));
        }
        self.dataset.validate("reward_model.dataset")?;
        if let Some(h) = &self.heldout {
            h.validate("reward_model.heldout")?;
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return Err(invalid(
                "reward_model.lr",
                format!("must be > 0, got {}", self.lr),
            ));
        }
        if self.batch_pairs == 0 {
            return Err(invalid("reward_model.batch_pairs", "must be at least 1"));
        }
        if self.warmup_steps > self.steps {
            return Err(invalid(
                "reward_model.warmup_steps",
                "exceeds reward_model.steps",
            ));
        }
        if self.max_len < 2 {
            return Err(invalid("reward_model.max_len", "must be at least 2"));
        }
        Ok(())
    }
}

/// `[eval]`: the held-out evaluation of every RL domain (the stages' `heldout` files) after the
/// SFT stages and after each RL stage, written to `RUN_DIR/heldout.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// Run the held-out evaluation during `cascade run` at all.
    pub enabled: bool,
    /// Samples per prompt (the score is the mean reward over them).
    pub samples: usize,
    /// Sampling temperature (0 = greedy; RECIPE.md evaluates at 0.6).
    pub temperature: f32,
    /// Nucleus threshold.
    pub top_p: f32,
    /// Held-out prompts used per domain (the first N of the file; 0 = all).
    pub max_prompts: usize,
    /// Seed of the evaluation samplers (the same for every row of the table).
    pub seed: u64,
    /// Evaluate each stage-final snapshot while the later stages train (in `cascade run`,
    /// beside the learner and the actors), instead of every row after training. Only with a
    /// CPU learner: on a GPU the evaluation would need memory beside the learner's, which the
    /// plan does not count, so its rows wait for the end there.
    pub during_run: bool,
}

impl Default for EvalConfig {
    fn default() -> Self {
        EvalConfig {
            enabled: true,
            samples: 4,
            temperature: 0.6,
            top_p: 0.95,
            max_prompts: 0,
            seed: 1234,
            during_run: true,
        }
    }
}

impl EvalConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.samples == 0 {
            return Err(invalid("eval.samples", "must be at least 1"));
        }
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(invalid("eval.temperature", "must be ≥ 0 (0 = greedy)"));
        }
        super::stage::check_top_p("eval.top_p", self.top_p)
    }
}
