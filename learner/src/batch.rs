//! Turning [`RolloutGroup`]s into padded training tensors.
//!
//! Each sample becomes one row `prompt_ids ++ response_ids`, right-padded with id 0 to the
//! longest row of its micro-batch. Targets are shifted by one: the log-prob at column `i` is the
//! model's probability of token `i + 1`, so response token `j` of a sample whose prompt has `p`
//! tokens sits at column `p + j - 1`. Only those columns carry loss.
//!
//! Advantages are computed here, per group, over all of the group's samples (truncated ones
//! included: the reward is what the actor observed); overlong masking then zeroes the loss weight
//! of truncated samples without changing the other samples' advantages (as DAPO and TRL's
//! `mask_truncated_completions` do).

use std::ops::Range;

use candle_core::{Device, Tensor};
use cascade_shared::{FinishReason, RolloutGroup};
use serde::{Deserialize, Serialize};

use crate::error::{LearnerError, Result};

/// How per-token losses are reduced to one number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LossAggregation {
    /// Sum over all response tokens of the batch / their count (the paper's default).
    #[default]
    Token,
    /// Mean per sequence, then mean over sequences.
    Sequence,
}

/// What building a batch needs of the objective's settings (from
/// [`crate::grpo::GrpoConfig`], which converts into it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchConfig {
    /// Divide centred rewards by the group's std (`false`: centre only).
    pub scale_by_std: bool,
    /// Added to the std before dividing.
    pub advantage_eps: f32,
    /// Give samples that hit the length limit zero loss weight.
    pub mask_truncated: bool,
    /// Token- or sequence-level aggregation (decides the loss denominator).
    pub aggregation: LossAggregation,
}

/// One sample, ready to be padded.
#[derive(Debug, Clone, PartialEq)]
struct PreparedRow {
    /// `prompt_ids ++ response_ids`.
    ids: Vec<u32>,
    /// Number of prompt tokens.
    prompt_len: usize,
    /// Behaviour log-prob of each response token.
    behaviour_logprobs: Vec<f32>,
    /// Group-normalised advantage.
    advantage: f32,
    /// Temperature of the behaviour log-probs.
    temperature: f32,
    /// False when the sample carries no loss (overlong masking, aborted generation).
    trained: bool,
}

/// The denominator of the loss, fixed for the whole (accumulated) batch so that summing the
/// gradients of micro-batches gives exactly the full-batch gradient.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossNormaliser {
    /// Token-level: divide the sum over response tokens by this many tokens.
    Tokens(f32),
    /// Sequence-level: per-sequence token means are summed and divided by this many sequences.
    Sequences(f32),
}

/// Padded tensors for one micro-batch.
#[derive(Debug, Clone)]
pub struct MicroBatch {
    /// `(b, t)` u32, right-padded with 0.
    pub input_ids: Tensor,
    /// `(b, t)` u8, 1 on real tokens.
    pub attention_mask: Tensor,
    /// `(b, t - 1)` f32, 1 where the target is a trained response token.
    pub loss_mask: Tensor,
    /// `(b, t - 1)` f32, the behaviour log-prob of each target (0 where `loss_mask` is 0).
    pub behaviour_logprobs: Tensor,
    /// `(b,)` f32, the advantage of each row.
    pub advantages: Tensor,
    /// The sampling temperature of each row: the policy's log-probs are computed at it.
    pub temperatures: Vec<f32>,
}

/// A GRPO batch: every sample of the given groups with its advantage.
#[derive(Debug, Clone)]
pub struct GrpoBatch {
    rows: Vec<PreparedRow>,
    normaliser: LossNormaliser,
}

/// Group-normalised advantages: `(r - mean) / (std + eps)` or, without std scaling,
/// `r - mean`. `std` is the unbiased (n - 1) standard deviation, as `torch.std` in TRL; a group
/// of one sample has std 0.
pub fn group_advantages(rewards: &[f32], scale_by_std: bool, eps: f32) -> Vec<f32> {
    let n = rewards.len();
    if n == 0 {
        return Vec::new();
    }
    let mean = rewards.iter().map(|&r| r as f64).sum::<f64>() / n as f64;
    let std = if n > 1 {
        let var = rewards
            .iter()
            .map(|&r| (r as f64 - mean).powi(2))
            .sum::<f64>()
            / (n - 1) as f64;
        var.sqrt()
    } else {
        0.0
    };
    rewards
        .iter()
        .map(|&r| {
            let centred = r as f64 - mean;
            if scale_by_std {
                (centred / (std + eps as f64)) as f32
            } else {
                centred as f32
            }
        })
        .collect()
}

impl GrpoBatch {
    /// Builds the batch. The groups must already have passed [`crate::filter::GroupFilter`]
    /// (consistent lengths are re-checked here because a mismatch would misalign targets).
    pub fn from_groups(groups: &[RolloutGroup], cfg: impl Into<BatchConfig>) -> Result<Self> {
        let cfg: BatchConfig = cfg.into();
        let mut rows = Vec::new();
        for group in groups {
            let rewards: Vec<f32> = group.samples.iter().map(|s| s.reward).collect();
            let advantages = group_advantages(&rewards, cfg.scale_by_std, cfg.advantage_eps);
            for (sample, advantage) in group.samples.iter().zip(advantages) {
                if sample.behaviour_logprobs.len() != sample.response_ids.len() {
                    return Err(LearnerError::InvalidBatch(format!(
                        "prompt {}: {} behaviour log-probs for {} response tokens",
                        group.prompt_id,
                        sample.behaviour_logprobs.len(),
                        sample.response_ids.len()
                    )));
                }
                if group.prompt_ids.is_empty() {
                    return Err(LearnerError::InvalidBatch(format!(
                        "prompt {} has no prompt tokens (the first response token needs a context)",
                        group.prompt_id
                    )));
                }
                let trained = match sample.finish_reason {
                    FinishReason::Stop => true,
                    FinishReason::Length => !cfg.mask_truncated,
                    // An interrupted generation is not a sample of the policy's behaviour.
                    FinishReason::Abort => false,
                } && !sample.response_ids.is_empty();
                let mut ids = group.prompt_ids.clone();
                ids.extend_from_slice(&sample.response_ids);
                rows.push(PreparedRow {
                    ids,
                    prompt_len: group.prompt_ids.len(),
                    behaviour_logprobs: sample.behaviour_logprobs.clone(),
                    advantage,
                    temperature: group.temperature,
                    trained,
                });
            }
        }
        if rows.is_empty() {
            return Err(LearnerError::InvalidBatch("no samples".into()));
        }
        let normaliser = match cfg.aggregation {
            LossAggregation::Token => {
                let tokens: usize = rows
                    .iter()
                    .filter(|r| r.trained)
                    .map(|r| r.behaviour_logprobs.len())
                    .sum();
                LossNormaliser::Tokens(tokens.max(1) as f32)
            }
            LossAggregation::Sequence => LossNormaliser::Sequences(rows.len() as f32),
        };
        Ok(GrpoBatch { rows, normaliser })
    }

    /// Number of rows (samples).
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the batch has no rows (never true for a batch from [`GrpoBatch::from_groups`]).
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The loss denominator of the full batch.
    pub fn normaliser(&self) -> LossNormaliser {
        self.normaliser
    }

    /// Number of response tokens that carry loss.
    pub fn trained_tokens(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| r.trained)
            .map(|r| r.behaviour_logprobs.len())
            .sum()
    }

    /// Total tokens (prompt + response) of all rows, what a forward pass processes.
    pub fn total_tokens(&self) -> usize {
        self.rows.iter().map(|r| r.ids.len()).sum()
    }

    /// Row ranges of at most `micro_batch` rows each, covering the batch in order.
    pub fn micro_batch_ranges(&self, micro_batch: usize) -> Vec<Range<usize>> {
        let size = micro_batch.max(1);
        (0..self.rows.len())
            .step_by(size)
            .map(|start| start..(start + size).min(self.rows.len()))
            .collect()
    }

    /// Pads rows `range` into tensors on `device`. Built on demand so that only one micro-batch
    /// of padded tensors is alive at a time.
    pub fn micro_batch(&self, range: Range<usize>, device: &Device) -> Result<MicroBatch> {
        let rows = self.rows.get(range.clone()).ok_or_else(|| {
            LearnerError::InvalidBatch(format!("rows {range:?} of {}", self.rows.len()))
        })?;
        if rows.is_empty() {
            return Err(LearnerError::InvalidBatch("empty micro-batch".into()));
        }
        let b = rows.len();
        let t = rows.iter().map(|r| r.ids.len()).max().unwrap_or(0).max(2);
        let mut ids = vec![0u32; b * t];
        let mut attention = vec![0u8; b * t];
        let mut loss_mask = vec![0f32; b * (t - 1)];
        let mut behaviour = vec![0f32; b * (t - 1)];
        let mut advantages = Vec::with_capacity(b);
        for (i, row) in rows.iter().enumerate() {
            ids[i * t..i * t + row.ids.len()].copy_from_slice(&row.ids);
            attention[i * t..i * t + row.ids.len()].fill(1);
            for (j, &lp) in row.behaviour_logprobs.iter().enumerate() {
                // Response token j is ids[prompt_len + j], predicted at column prompt_len + j - 1.
                let col = row.prompt_len + j - 1;
                behaviour[i * (t - 1) + col] = lp;
                if row.trained {
                    loss_mask[i * (t - 1) + col] = 1.0;
                }
            }
            advantages.push(row.advantage);
        }
        Ok(MicroBatch {
            input_ids: Tensor::from_vec(ids, (b, t), device)?,
            attention_mask: Tensor::from_vec(attention, (b, t), device)?,
            loss_mask: Tensor::from_vec(loss_mask, (b, t - 1), device)?,
            behaviour_logprobs: Tensor::from_vec(behaviour, (b, t - 1), device)?,
            advantages: Tensor::from_vec(advantages, b, device)?,
            temperatures: rows.iter().map(|r| r.temperature).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    // Test-only: batches built from the objective's default settings.
    use crate::grpo::GrpoConfig;
    use cascade_shared::{Mode, Sample, SampleTiming, StageKind, VersionSpan};

    fn sample(ids: &[u32], reward: f32, finish: FinishReason) -> Sample {
        Sample {
            response_ids: ids.to_vec(),
            behaviour_logprobs: ids.iter().map(|&i| -(i as f32) / 10.0).collect(),
            policy_versions: vec![VersionSpan {
                start_token: 0,
                version: 0,
            }],
            finish_reason: finish,
            reward,
            reward_breakdown: vec![],
            timing: SampleTiming::default(),
        }
    }

    fn group(samples: Vec<Sample>) -> RolloutGroup {
        RolloutGroup {
            stage: StageKind::Math,
            stage_index: 0,
            prompt_id: 1,
            mode: Mode::Think,
            actor_id: 0,
            prompt_ids: vec![5, 6],
            temperature: 1.0,
            samples,
        }
    }

    #[test]
    fn advantages_match_hand_computation() {
        // mean 0.5, unbiased std of [0, 1, 1, 0] = sqrt(1/3).
        let a = group_advantages(&[0.0, 1.0, 1.0, 0.0], true, 0.0);
        let s = (1.0f32 / 3.0).sqrt();
        for (x, want) in a.iter().zip([-0.5 / s, 0.5 / s, 0.5 / s, -0.5 / s]) {
            assert!((x - want).abs() < 1e-6, "{x} vs {want}");
        }
        assert_eq!(group_advantages(&[2.0, 4.0], false, 1e-4), vec![-1.0, 1.0]);
        assert_eq!(group_advantages(&[3.0], true, 1e-4), vec![0.0]);
    }

    #[test]
    fn targets_are_aligned_and_truncated_samples_masked() {
        let g = group(vec![
            sample(&[7, 8, 9], 1.0, FinishReason::Stop),
            sample(&[3], 0.0, FinishReason::Length),
        ]);
        let cfg = GrpoConfig::default();
        let batch = GrpoBatch::from_groups(&[g], &cfg).unwrap();
        assert_eq!(batch.normaliser(), LossNormaliser::Tokens(3.0));
        let mb = batch.micro_batch(0..2, &Device::Cpu).unwrap();
        assert_eq!(
            mb.input_ids.to_vec2::<u32>().unwrap(),
            vec![vec![5, 6, 7, 8, 9], vec![5, 6, 3, 0, 0]]
        );
        assert_eq!(
            mb.attention_mask.to_vec2::<u8>().unwrap(),
            vec![vec![1, 1, 1, 1, 1], vec![1, 1, 1, 0, 0]]
        );
        assert_eq!(
            mb.loss_mask.to_vec2::<f32>().unwrap(),
            vec![vec![0., 1., 1., 1.], vec![0., 0., 0., 0.]]
        );
        assert_eq!(
            mb.behaviour_logprobs.to_vec2::<f32>().unwrap(),
            vec![vec![0., -0.7, -0.8, -0.9], vec![0., -0.3, 0., 0.]]
        );

        let unmasked = GrpoConfig {
            mask_truncated: false,
            ..GrpoConfig::default()
        };
        let g = group(vec![
            sample(&[7, 8, 9], 1.0, FinishReason::Stop),
            sample(&[3], 0.0, FinishReason::Length),
        ]);
        let batch = GrpoBatch::from_groups(&[g], &unmasked).unwrap();
        assert_eq!(batch.normaliser(), LossNormaliser::Tokens(4.0));
    }

    #[test]
    fn mismatched_logprobs_are_refused() {
        let mut s = sample(&[7, 8], 1.0, FinishReason::Stop);
        s.behaviour_logprobs.pop();
        let err = GrpoBatch::from_groups(&[group(vec![s])], &GrpoConfig::default());
        assert!(matches!(err, Err(LearnerError::InvalidBatch(_))));
    }

    #[test]
    fn micro_batch_ranges_cover_the_batch() {
        let g = group(
            (0..5)
                .map(|i| sample(&[1], i as f32, FinishReason::Stop))
                .collect(),
        );
        let batch = GrpoBatch::from_groups(&[g], &GrpoConfig::default()).unwrap();
        assert_eq!(batch.micro_batch_ranges(2), vec![0..2, 2..4, 4..5]);
    }
}
