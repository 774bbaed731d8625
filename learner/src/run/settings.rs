//! A stage of the run config translated into the learner's own settings: GRPO objective,
//! learning-rate schedule, optimizer, admission.

use cascade_shared::config::KlEstimator as KlChoice;
use cascade_shared::config::{GradAccum, LossAgg, RunConfig, Schedule, StageConfig};

use crate::filter::FilterConfig;
use crate::grpo::{GrpoConfig, KlEstimator, LossAggregation};
use crate::optim::AdamWConfig;
use crate::schedule::{LrSchedule, ScheduleKind};

/// After this many × `batch_prompts` groups in a row with all-equal rewards, an RL step is
/// completed with such groups (zero advantages, weights unchanged) so that a stage whose task
/// the model cannot (or always) solve still ends.
const NO_SIGNAL_BATCHES: u64 = 8;

/// The GRPO objective of an RL stage.
pub(super) fn grpo_config(stage: &StageConfig) -> GrpoConfig {
    GrpoConfig {
        scale_by_std: stage.std_normalize,
        advantage_eps: 1e-4,
        clip_eps_low: stage.eps_low as f32,
        clip_eps_high: stage.eps_high as f32,
        tis_cap: stage.tis_cap.map(|c| c as f32),
        // Issue 19: dual clip, KL estimator and its bound; 0 in the config = off.
        dual_clip: (stage.dual_clip > 0.0).then_some(stage.dual_clip as f32),
        kl_coef: stage.kl_coef as f32,
        kl_estimator: match stage.kl_estimator {
            KlChoice::K3 => KlEstimator::K3,
            KlChoice::K3Is => KlEstimator::K3Importance,
        },
        kl_log_ratio_max: (stage.kl_log_ratio_max > 0.0).then_some(stage.kl_log_ratio_max as f32),
        aggregation: match stage.loss_agg {
            LossAgg::Token => LossAggregation::Token,
            LossAgg::Sequence => LossAggregation::Sequence,
        },
        mask_truncated: stage.overlong_mask,
    }
}

/// The learning-rate schedule of a stage.
pub(super) fn lr_schedule(stage: &StageConfig) -> LrSchedule {
    LrSchedule {
        peak_lr: stage.lr,
        warmup_steps: stage.warmup_steps as u64,
        total_steps: stage.steps as u64,
        kind: match stage.schedule {
            Schedule::Constant => ScheduleKind::Constant,
            Schedule::Cosine => ScheduleKind::Cosine,
        },
        min_lr_ratio: 0.0,
    }
}

/// The optimizer of a stage (a fresh one per stage: its own betas, weight decay, clip).
pub(super) fn adamw_config(
    stage: &StageConfig,
    max_bad_steps: usize,
    grad_accum: GradAccum,
) -> AdamWConfig {
    AdamWConfig {
        beta1: stage.betas[0],
        beta2: stage.betas[1],
        eps: 1e-8,
        weight_decay: stage.weight_decay,
        max_grad_norm: Some(stage.grad_clip),
        max_consecutive_skips: max_bad_steps.max(1) as u32,
        grad_accum,
    }
}

/// Admission of the RL stage `index` for a model with `vocab_size` tokens.
pub(super) fn filter_config(
    config: &RunConfig,
    index: usize,
    stage: &StageConfig,
    vocab_size: usize,
) -> FilterConfig {
    FilterConfig {
        max_staleness: stage.max_staleness_or(config.learner.max_staleness),
        drop_equal_rewards: true,
        vocab_size: vocab_size as u32,
        stage_index: index as u32,
        no_signal_groups: NO_SIGNAL_BATCHES * stage.batch_prompts as u64,
    }
}
