//! Hyper-parameters of reward-model training, their checks, and the schedule and optimizer
//! settings they imply.

use serde::{Deserialize, Serialize};

use crate::error::{LearnerError, Result};
use crate::optim::AdamWConfig;
use crate::schedule::{LrSchedule, ScheduleKind};

/// Hyper-parameters of reward-model training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RmTrainConfig {
    /// Optimizer steps.
    pub steps: usize,
    /// Pairs per optimizer step.
    pub batch_pairs: usize,
    /// Pairs per forward/backward pass (gradient accumulation); `2 · micro_batch` sequences go
    /// through the model at once. Also the pairs per forward when scoring.
    pub micro_batch: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warm-up steps; a cosine decay to `min_lr_ratio · lr` follows (constant LR when
    /// the warm-up covers every step).
    pub warmup_steps: usize,
    /// Floor of the cosine as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f64,
    /// Global gradient-norm clipping threshold; `None` = no clipping.
    pub grad_clip: Option<f64>,
    /// Seed of the per-epoch shuffling.
    pub seed: u64,
    /// Longest conversation in tokens; a pair with a longer chosen or rejected conversation is
    /// skipped (the model's `max_position_embeddings` caps it too).
    pub max_len: usize,
}

impl Default for RmTrainConfig {
    fn default() -> Self {
        RmTrainConfig {
            steps: 100,
            batch_pairs: 16,
            micro_batch: 4,
            lr: 1e-5,
            warmup_steps: 0,
            min_lr_ratio: 0.0,
            weight_decay: 0.0,
            grad_clip: Some(1.0),
            seed: 0,
            max_len: 1024,
        }
    }
}

impl RmTrainConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(LearnerError::InvalidConfig(format!("reward model: {m}")));
        if self.steps == 0 || self.batch_pairs == 0 || self.micro_batch == 0 {
            return bad(format!(
                "steps {}, batch_pairs {} and micro_batch {} must be ≥ 1",
                self.steps, self.batch_pairs, self.micro_batch
            ));
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return bad(format!("lr {} must be > 0", self.lr));
        }
        if self.max_len < 2 {
            return bad(format!("max_len {} must be ≥ 2", self.max_len));
        }
        self.schedule().validate()?;
        self.adamw().validate()
    }

    /// The learning-rate schedule: warm-up, then cosine over the remaining steps.
    pub fn schedule(&self) -> LrSchedule {
        LrSchedule {
            peak_lr: self.lr,
            warmup_steps: self.warmup_steps as u64,
            total_steps: self.steps as u64,
            kind: if self.steps > self.warmup_steps {
                ScheduleKind::Cosine
            } else {
                ScheduleKind::Constant
            },
            min_lr_ratio: self.min_lr_ratio,
        }
    }

    /// The optimizer settings.
    pub fn adamw(&self) -> AdamWConfig {
        AdamWConfig {
            weight_decay: self.weight_decay,
            max_grad_norm: self.grad_clip,
            ..AdamWConfig::default()
        }
    }
}
