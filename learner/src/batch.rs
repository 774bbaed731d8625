//! Turning [`RolloutGroup`]s into training tensors, padded or packed.
//!
//! Each sample is the token sequence `prompt_ids ++ response_ids`. A training row holds one
//! sample (the default: rows right-padded with id 0 to the longest row of their micro-batch) or,
//! with a token budget ([`GrpoBatch::with_token_budget`]), several samples packed one after the
//! other as segments of at most `budget` tokens in all: the attention mask then numbers the
//! segments 1, 2, 3, ... (0 = padding), so that each sample attends only within itself and its
//! positions restart at 0 (`CausalLm::forward_hidden`), exactly as if it were alone.
//!
//! Targets are shifted by one: the log-prob at column `i` is the model's probability of token
//! `i + 1`, so response token `j` of a sample whose prompt has `p` tokens and which starts at
//! column `o` of its row sits at column `o + p + j - 1`. Only those columns carry loss (the
//! column that predicts the next segment's first token never does).
//!
//! Advantages are computed here, per group, over all of the group's samples (truncated ones
//! included: the reward is what the actor observed); overlong masking then zeroes the loss weight
//! of truncated samples without changing the other samples' advantages (as DAPO and TRL's
//! `mask_truncated_completions` do). Each target column carries its sample's advantage and its
//! sample's trained-token count, so the loss is the same whichever samples share a row.
//!
//! Packing is first-fit decreasing, per sampling temperature (the policy's log-probs are
//! computed at one temperature per row): the samples of one temperature, longest first (ties in
//! batch order), each go into the first row of that temperature with room for them, or open a
//! new one. Rows are ordered by temperature (in order of first appearance in the batch), then by
//! opening. The layout is a pure function of the samples' lengths, temperatures and order.

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

/// One sample, ready to be laid out in a row.
#[derive(Debug, Clone, PartialEq)]
struct PreparedRow {
    /// Index of its group in the batch.
    group: usize,
    /// Index of the sample in its group.
    sample: usize,
    /// The group's prompt id.
    prompt_id: u64,
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

/// The tensors of one micro-batch: `b` training rows of `t` columns.
#[derive(Debug, Clone)]
pub struct MicroBatch {
    /// `(b, t)` u32, right-padded with 0.
    pub input_ids: Tensor,
    /// `(b, t)`: 0 on padding, else the (1-based) number of the sample within its row. A batch
    /// without a token budget has one sample per row and a u8 mask of 0/1; a packed batch has a
    /// u32 mask (a row may hold more than 255 samples).
    pub attention_mask: Tensor,
    /// `(b, t - 1)` f32, 1 where the target is a trained response token.
    pub loss_mask: Tensor,
    /// `(b, t - 1)` f32, the behaviour log-prob of each target (0 where `loss_mask` is 0).
    pub behaviour_logprobs: Tensor,
    /// `(b, t - 1)` f32, the advantage of the sample each response target belongs to (0 on
    /// other columns).
    pub advantages: Tensor,
    /// `(b, t - 1)` f32, the number of trained tokens of the sample each response target
    /// belongs to (0 on other columns): the per-sequence denominator of sequence-level
    /// aggregation.
    pub sample_tokens: Tensor,
    /// The sampling temperature of each row (every sample of a row has it): the policy's
    /// log-probs are computed at it.
    pub temperatures: Vec<f32>,
    /// `(n)` u32: the positions of the flattened `(b, t - 1)` grid where `loss_mask` is 1, in
    /// order: the only ones the LM head needs to run on.
    pub selected: Tensor,
}

/// A GRPO batch: every sample of the given groups with its advantage, and how the samples are
/// laid out in training rows.
#[derive(Debug, Clone)]
pub struct GrpoBatch {
    samples: Vec<PreparedRow>,
    /// Each training row: the indices (into `samples`) of the samples it holds, in order.
    layout: Vec<Vec<usize>>,
    /// The budget the layout was packed to; 0 = one sample per row.
    token_budget: usize,
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
    /// Builds the batch, one sample per row (see [`GrpoBatch::with_token_budget`] for packed
    /// rows). The groups must already have passed [`crate::filter::GroupFilter`] (consistent
    /// lengths are re-checked here because a mismatch would misalign targets).
    pub fn from_groups(groups: &[RolloutGroup], cfg: impl Into<BatchConfig>) -> Result<Self> {
        let cfg: BatchConfig = cfg.into();
        let mut samples = Vec::new();
        for (group_index, group) in groups.iter().enumerate() {
            let rewards: Vec<f32> = group.samples.iter().map(|s| s.reward).collect();
            let advantages = group_advantages(&rewards, cfg.scale_by_std, cfg.advantage_eps);
            for (sample_index, (sample, advantage)) in
                group.samples.iter().zip(advantages).enumerate()
            {
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
                samples.push(PreparedRow {
                    group: group_index,
                    sample: sample_index,
                    prompt_id: group.prompt_id,
                    ids,
                    prompt_len: group.prompt_ids.len(),
                    behaviour_logprobs: sample.behaviour_logprobs.clone(),
                    advantage,
                    temperature: group.temperature,
                    trained,
                });
            }
        }
        if samples.is_empty() {
            return Err(LearnerError::InvalidBatch("no samples".into()));
        }
        let normaliser = match cfg.aggregation {
            LossAggregation::Token => {
                let tokens: usize = samples
                    .iter()
                    .filter(|r| r.trained)
                    .map(|r| r.behaviour_logprobs.len())
                    .sum();
                LossNormaliser::Tokens(tokens.max(1) as f32)
            }
            LossAggregation::Sequence => LossNormaliser::Sequences(samples.len() as f32),
        };
        let layout = (0..samples.len()).map(|i| vec![i]).collect();
        Ok(GrpoBatch {
            samples,
            layout,
            token_budget: 0,
            normaliser,
        })
    }

    /// Lays the samples out in rows of at most `token_budget` tokens, packed first-fit
    /// decreasing per temperature (see the module docs); 0 = one sample per row, padded (the
    /// layout of [`GrpoBatch::from_groups`]). The loss, its statistics and its gradients do not
    /// depend on the layout; only the tokens a forward pass processes do.
    ///
    /// A sample longer than the budget is an error naming it (group and sample index, prompt
    /// id, its length) and the budget: it is never truncated or split.
    pub fn with_token_budget(mut self, token_budget: usize) -> Result<Self> {
        if token_budget == 0 {
            self.layout = (0..self.samples.len()).map(|i| vec![i]).collect();
            self.token_budget = 0;
            return Ok(self);
        }
        if let Some(s) = self.samples.iter().find(|s| s.ids.len() > token_budget) {
            return Err(LearnerError::InvalidBatch(format!(
                "group {} (prompt {}) sample {}: {} tokens ({} prompt + {} response) do not fit \
                 in the token budget of {token_budget} (learner.token_budget); raise it to at \
                 least the longest prompt + response",
                s.group,
                s.prompt_id,
                s.sample,
                s.ids.len(),
                s.prompt_len,
                s.ids.len() - s.prompt_len,
            )));
        }
        self.layout = first_fit_decreasing(&self.samples, token_budget);
        self.token_budget = token_budget;
        Ok(self)
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether the batch has no samples (never true for a batch from
    /// [`GrpoBatch::from_groups`]).
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Number of training rows: [`GrpoBatch::len`] without a token budget, fewer when packed.
    pub fn rows(&self) -> usize {
        self.layout.len()
    }

    /// The token budget of the layout (0 = one sample per row).
    pub fn token_budget(&self) -> usize {
        self.token_budget
    }

    /// The samples of each training row, as `(group index, sample index)`, in row order.
    pub fn layout(&self) -> Vec<Vec<(usize, usize)>> {
        self.layout
            .iter()
            .map(|row| {
                row.iter()
                    .map(|&i| (self.samples[i].group, self.samples[i].sample))
                    .collect()
            })
            .collect()
    }

    /// The loss denominator of the full batch.
    pub fn normaliser(&self) -> LossNormaliser {
        self.normaliser
    }

    /// Number of response tokens that carry loss.
    pub fn trained_tokens(&self) -> usize {
        self.samples
            .iter()
            .filter(|r| r.trained)
            .map(|r| r.behaviour_logprobs.len())
            .sum()
    }

    /// Total tokens (prompt + response) of all samples, without padding.
    pub fn total_tokens(&self) -> usize {
        self.samples.iter().map(|r| r.ids.len()).sum()
    }

    /// Tokens the forward passes process with micro-batches of at most `micro_batch` rows:
    /// each micro-batch is `rows × width`, its width the longest row in it (at least 2).
    /// `padded_tokens(m) - total_tokens()` is padding.
    pub fn padded_tokens(&self, micro_batch: usize) -> usize {
        self.micro_batch_ranges(micro_batch)
            .into_iter()
            .map(|r| {
                let width = self.layout[r.clone()]
                    .iter()
                    .map(|row| self.row_len(row))
                    .max()
                    .unwrap_or(0)
                    .max(2);
                r.len() * width
            })
            .sum()
    }

    fn row_len(&self, row: &[usize]) -> usize {
        row.iter().map(|&i| self.samples[i].ids.len()).sum()
    }

    /// Row ranges of at most `micro_batch` training rows each, covering the batch in order.
    pub fn micro_batch_ranges(&self, micro_batch: usize) -> Vec<Range<usize>> {
        let size = micro_batch.max(1);
        (0..self.layout.len())
            .step_by(size)
            .map(|start| start..(start + size).min(self.layout.len()))
            .collect()
    }

    /// The tensors of training rows `range` on `device`, right-padded to the longest of them.
    /// Built on demand so that only one micro-batch of tensors is alive at a time.
    pub fn micro_batch(&self, range: Range<usize>, device: &Device) -> Result<MicroBatch> {
        let rows = self.layout.get(range.clone()).ok_or_else(|| {
            LearnerError::InvalidBatch(format!("rows {range:?} of {}", self.layout.len()))
        })?;
        if rows.is_empty() {
            return Err(LearnerError::InvalidBatch("empty micro-batch".into()));
        }
        let b = rows.len();
        let t = rows
            .iter()
            .map(|r| self.row_len(r))
            .max()
            .unwrap_or(0)
            .max(2);
        let mut ids = vec![0u32; b * t];
        let mut segments = vec![0u32; b * t];
        let mut loss_mask = vec![0f32; b * (t - 1)];
        let mut behaviour = vec![0f32; b * (t - 1)];
        let mut advantages = vec![0f32; b * (t - 1)];
        let mut sample_tokens = vec![0f32; b * (t - 1)];
        let mut temperatures = Vec::with_capacity(b);
        for (r, row) in rows.iter().enumerate() {
            let mut offset = 0;
            for (k, &i) in row.iter().enumerate() {
                let s = &self.samples[i];
                let start = r * t + offset;
                ids[start..start + s.ids.len()].copy_from_slice(&s.ids);
                segments[start..start + s.ids.len()].fill(k as u32 + 1);
                let trained_tokens = if s.trained {
                    s.behaviour_logprobs.len() as f32
                } else {
                    0.0
                };
                for (j, &lp) in s.behaviour_logprobs.iter().enumerate() {
                    // Response token j is ids[offset + prompt_len + j], predicted at column
                    // offset + prompt_len + j - 1.
                    let col = r * (t - 1) + offset + s.prompt_len + j - 1;
                    behaviour[col] = lp;
                    advantages[col] = s.advantage;
                    sample_tokens[col] = trained_tokens;
                    if s.trained {
                        loss_mask[col] = 1.0;
                    }
                }
                offset += s.ids.len();
            }
            temperatures.push(self.samples[row[0]].temperature);
        }
        let attention_mask = if self.token_budget == 0 {
            let flags: Vec<u8> = segments.into_iter().map(|s| u8::from(s != 0)).collect();
            Tensor::from_vec(flags, (b, t), device)?
        } else {
            Tensor::from_vec(segments, (b, t), device)?
        };
        let selected: Vec<u32> = loss_mask
            .iter()
            .enumerate()
            .filter(|(_, &m)| m != 0.0)
            .map(|(i, _)| i as u32)
            .collect();
        let n = selected.len();
        Ok(MicroBatch {
            selected: Tensor::from_vec(selected, n, device)?,
            input_ids: Tensor::from_vec(ids, (b, t), device)?,
            attention_mask,
            loss_mask: Tensor::from_vec(loss_mask, (b, t - 1), device)?,
            behaviour_logprobs: Tensor::from_vec(behaviour, (b, t - 1), device)?,
            advantages: Tensor::from_vec(advantages, (b, t - 1), device)?,
            sample_tokens: Tensor::from_vec(sample_tokens, (b, t - 1), device)?,
            temperatures,
        })
    }
}

/// First-fit decreasing per temperature (see the module docs): rows of sample indices, each
/// row's samples of one temperature and at most `budget` tokens in all. Every sample must fit
/// the budget on its own.
fn first_fit_decreasing(samples: &[PreparedRow], budget: usize) -> Vec<Vec<usize>> {
    // Temperature classes in order of first appearance (compared bit for bit: the same
    // temperature is the same f32 the group carried).
    let mut classes: Vec<(u32, Vec<usize>)> = Vec::new();
    for (i, s) in samples.iter().enumerate() {
        let bits = s.temperature.to_bits();
        match classes.iter_mut().find(|(b, _)| *b == bits) {
            Some((_, members)) => members.push(i),
            None => classes.push((bits, vec![i])),
        }
    }
    let mut rows = Vec::new();
    for (_, mut members) in classes {
        // Stable: equal lengths keep batch order.
        members.sort_by_key(|&i| std::cmp::Reverse(samples[i].ids.len()));
        let mut open: Vec<(usize, Vec<usize>)> = Vec::new();
        for i in members {
            let len = samples[i].ids.len();
            match open.iter_mut().find(|(used, _)| used + len <= budget) {
                Some((used, row)) => {
                    *used += len;
                    row.push(i);
                }
                None => open.push((len, vec![i])),
            }
        }
        rows.extend(open.into_iter().map(|(_, row)| row));
    }
    rows
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

    /// A group of samples with the given response lengths (ids 1, 2, ...), prompt `[5; prompt]`.
    fn sized_group(prompt_id: u64, prompt: usize, temp: f32, lens: &[usize]) -> RolloutGroup {
        let samples = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let ids: Vec<u32> = (1..=n as u32).collect();
                sample(&ids, i as f32, FinishReason::Stop)
            })
            .collect();
        RolloutGroup {
            prompt_id,
            prompt_ids: vec![5; prompt],
            temperature: temp,
            ..group(samples)
        }
    }

    #[test]
    fn packing_is_first_fit_decreasing_per_temperature() {
        // Lengths (prompt 2 + response): group 0 at T=1: 5, 3, 7; group 1 at T=0.6: 4, 6;
        // group 2 at T=1: 2+4=6, 2+2=4.
        let groups = [
            sized_group(10, 2, 1.0, &[3, 1, 5]),
            sized_group(11, 2, 0.6, &[2, 4]),
            sized_group(12, 2, 1.0, &[4, 2]),
        ];
        let batch = GrpoBatch::from_groups(&groups, &GrpoConfig::default()).unwrap();
        assert_eq!(batch.rows(), 7);
        let packed = batch.with_token_budget(10).unwrap();
        // T=1, longest first: 7 (0,2) opens row A; 6 (2,0) does not fit A, opens B; 5 (0,0)
        // fits neither, opens C; 4 (2,1) fills B to 10; 3 (0,1) fills A to 10.
        // T=0.6: 6 (1,1) opens D, 4 (1,0) fills it.
        assert_eq!(
            packed.layout(),
            vec![
                vec![(0, 2), (0, 1)],
                vec![(2, 0), (2, 1)],
                vec![(0, 0)],
                vec![(1, 1), (1, 0)],
            ]
        );
        assert_eq!(packed.len(), 7);
        assert_eq!(packed.token_budget(), 10);
        // Tokens processed with 2 rows per micro-batch. Padded rows 5, 3 | 7, 4 | 6, 6 | 4;
        // packed rows 10, 10 | 5, 10.
        let unpacked = GrpoBatch::from_groups(&groups, &GrpoConfig::default()).unwrap();
        assert_eq!(unpacked.total_tokens(), 35);
        assert_eq!(packed.total_tokens(), 35);
        assert_eq!(unpacked.padded_tokens(2), 2 * 5 + 2 * 7 + 2 * 6 + 4);
        assert_eq!(packed.padded_tokens(2), 2 * 10 + 2 * 10);
        assert_eq!(packed.padded_tokens(1), 35);
        // Budget 0 restores one sample per row.
        let back = packed.with_token_budget(0).unwrap();
        assert_eq!(back.rows(), 7);
        assert_eq!(back.layout()[2], vec![(0, 2)]);
    }

    #[test]
    fn packed_rows_number_their_samples_and_align_targets() {
        let mut g = group(vec![
            sample(&[7, 8, 9], 1.0, FinishReason::Stop),
            sample(&[3], 0.0, FinishReason::Length),
        ]);
        g.prompt_ids = vec![5, 6];
        let batch = GrpoBatch::from_groups(&[g], &GrpoConfig::default())
            .unwrap()
            .with_token_budget(8)
            .unwrap();
        assert_eq!(batch.rows(), 1);
        let mb = batch.micro_batch(0..1, &Device::Cpu).unwrap();
        assert_eq!(
            mb.input_ids.to_vec2::<u32>().unwrap(),
            vec![vec![5, 6, 7, 8, 9, 5, 6, 3]]
        );
        assert_eq!(mb.attention_mask.dtype(), candle_core::DType::U32);
        assert_eq!(
            mb.attention_mask.to_vec2::<u32>().unwrap(),
            vec![vec![1, 1, 1, 1, 1, 2, 2, 2]]
        );
        // Column 4 predicts the second sample's first token: never trained. The truncated
        // sample is masked but keeps its behaviour log-prob and advantage.
        assert_eq!(
            mb.loss_mask.to_vec2::<f32>().unwrap(),
            vec![vec![0., 1., 1., 1., 0., 0., 0.]]
        );
        assert_eq!(
            mb.behaviour_logprobs.to_vec2::<f32>().unwrap(),
            vec![vec![0., -0.7, -0.8, -0.9, 0., 0., -0.3]]
        );
        let a = group_advantages(&[1.0, 0.0], true, 1e-4);
        assert_eq!(
            mb.advantages.to_vec2::<f32>().unwrap(),
            vec![vec![0., a[0], a[0], a[0], 0., 0., a[1]]]
        );
        assert_eq!(
            mb.sample_tokens.to_vec2::<f32>().unwrap(),
            vec![vec![0., 3., 3., 3., 0., 0., 0.]]
        );
        assert_eq!(mb.temperatures, vec![1.0]);
    }

    #[test]
    fn a_sample_longer_than_the_budget_is_refused_by_name() {
        let groups = [
            sized_group(10, 2, 1.0, &[3, 1]),
            sized_group(11, 4, 1.0, &[2, 9]),
        ];
        let batch = GrpoBatch::from_groups(&groups, &GrpoConfig::default()).unwrap();
        let err = batch.with_token_budget(12).unwrap_err().to_string();
        for part in [
            "group 1",
            "prompt 11",
            "sample 1",
            "13 tokens",
            "4 prompt + 9 response",
            "token budget of 12",
        ] {
            assert!(err.contains(part), "{err:?} lacks {part:?}");
        }
        let batch = GrpoBatch::from_groups(&groups, &GrpoConfig::default()).unwrap();
        assert_eq!(batch.with_token_budget(13).unwrap().rows(), 3);
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
