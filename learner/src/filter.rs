//! Which rollout groups the learner trains on. Every decision is taken here, once, and counted
//! in [`FilterMetrics`] (published in every snapshot's state).
//!
//! Order of the checks in [`GroupFilter::admit`]: the stage first (groups made for another
//! stage are skipped), then malformed input (so a bad record is always reported as bad,
//! whatever its age), then duplicates (a restarted actor regenerates exactly the groups it
//! wrote before it died: same weights, same keys; they must not count twice), then staleness
//! ([`is_stale`], the only place that decides it), then dynamic filtering (all rewards equal ⇒
//! zero advantage ⇒ no signal).
//!
//! The one exception to dynamic filtering is also decided here: after `no_signal_groups`
//! equal-reward groups in a row, [`GroupFilter::no_signal_due`] says that a step should be
//! completed with such groups (zero advantages, weights unchanged), so that a stage whose task
//! the model always (or never) solves still ends in bounded time.

pub use cascade_shared::snapshot::FilterMetrics;
use std::collections::HashSet;

use cascade_shared::RolloutGroup;
use serde::{Deserialize, Serialize};

use crate::error::{LearnerError, Result};

/// Filtering settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterConfig {
    /// How many policy versions a group may lag behind the learner (0 = strictly on-policy).
    pub max_staleness: u64,
    /// Drop groups whose rewards are all equal (dynamic filtering).
    pub drop_equal_rewards: bool,
    /// The model's vocabulary size: token ids must be below it.
    pub vocab_size: u32,
    /// The stage being trained: groups made for another stage are skipped.
    pub stage_index: u32,
    /// Equal-reward groups in a row after which a no-signal step is due (0 = never).
    pub no_signal_groups: u64,
}

impl FilterConfig {
    /// Checks ranges; call once at start-up.
    pub fn validate(&self) -> Result<()> {
        if self.vocab_size == 0 {
            return Err(LearnerError::InvalidConfig("vocab_size must be > 0".into()));
        }
        Ok(())
    }
}

/// Why a group was not trained on.
#[derive(Debug, Clone, PartialEq)]
pub enum DropReason {
    /// Made for another stage than the one being trained (e.g. in flight at a stage switch).
    OtherStage {
        /// The group's stage index.
        group_stage: u32,
    },
    /// The same content as a group already decided at this version.
    Duplicate,
    /// Produced (in part) by a policy more than `max_staleness` versions old.
    Stale {
        /// Oldest policy version in the group.
        group_version: u64,
        /// The learner's current version.
        current_version: u64,
    },
    /// All rewards equal: every advantage is zero.
    EqualRewards,
    /// The record is malformed.
    BadInput(BadInput),
}

/// A malformed rollout group.
#[derive(Debug, Clone, PartialEq)]
pub enum BadInput {
    /// The group has no samples.
    NoSamples,
    /// A prompt or response token id is not in the vocabulary.
    TokenOutOfVocab {
        /// The offending id.
        token: u32,
        /// The vocabulary size.
        vocab_size: u32,
    },
    /// A sample has a different number of behaviour log-probs than response tokens.
    LogprobCountMismatch {
        /// Index of the sample in the group.
        sample: usize,
        /// Response tokens.
        tokens: usize,
        /// Behaviour log-probs.
        logprobs: usize,
    },
    /// The sampling temperature is not a finite positive number.
    BadTemperature {
        /// The recorded temperature.
        temperature: f32,
    },
    /// A reward is NaN or infinite.
    NonFiniteReward {
        /// Index of the sample in the group.
        sample: usize,
    },
    /// A behaviour log-prob is NaN or positive infinity.
    NonFiniteLogprob {
        /// Index of the sample in the group.
        sample: usize,
    },
    /// A sample claims a policy version newer than the learner's (the actor is ahead of a
    /// resumed learner, or the record is corrupt).
    FutureVersion {
        /// The sample's newest version.
        version: u64,
        /// The learner's current version.
        current_version: u64,
    },
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DropReason::OtherStage { group_stage } => {
                write!(f, "made for stage {group_stage}, not the current one")
            }
            DropReason::Duplicate => f.write_str("duplicate of a group already decided"),
            DropReason::Stale {
                group_version,
                current_version,
            } => write!(
                f,
                "stale: policy version {group_version}, learner at {current_version}"
            ),
            DropReason::EqualRewards => f.write_str("all rewards equal"),
            DropReason::BadInput(b) => match b {
                BadInput::NoSamples => f.write_str("bad input: no samples"),
                BadInput::TokenOutOfVocab { token, vocab_size } => write!(
                    f,
                    "bad input: token id {token} ≥ vocabulary size {vocab_size}"
                ),
                BadInput::LogprobCountMismatch {
                    sample,
                    tokens,
                    logprobs,
                } => write!(
                    f,
                    "bad input: sample {sample} has {logprobs} log-probs for {tokens} tokens"
                ),
                BadInput::BadTemperature { temperature } => {
                    write!(f, "bad input: sampling temperature {temperature} is not > 0")
                }
                BadInput::NonFiniteReward { sample } => {
                    write!(f, "bad input: sample {sample} has a non-finite reward")
                }
                BadInput::NonFiniteLogprob { sample } => {
                    write!(f, "bad input: sample {sample} has a NaN/+inf log-prob")
                }
                BadInput::FutureVersion {
                    version,
                    current_version,
                } => write!(
                    f,
                    "bad input: policy version {version} is newer than the learner's {current_version}"
                ),
            },
        }
    }
}

/// The staleness rule, and the only place it is decided: a group whose oldest token was
/// produced by version `group_version` is too old for a learner at `current_version` when it
/// lags by more than `max_staleness` versions. With `max_staleness = 0` only groups of exactly
/// the current version pass.
pub fn is_stale(group_version: u64, current_version: u64, max_staleness: u64) -> bool {
    current_version.saturating_sub(group_version) > max_staleness
}

/// Checks a group for malformed content (see [`BadInput`]).
pub fn check_input(
    group: &RolloutGroup,
    vocab_size: u32,
    current_version: u64,
) -> std::result::Result<(), BadInput> {
    if group.samples.is_empty() {
        return Err(BadInput::NoSamples);
    }
    if !(group.temperature > 0.0 && group.temperature.is_finite()) {
        return Err(BadInput::BadTemperature {
            temperature: group.temperature,
        });
    }
    let out_of_vocab = |ids: &[u32]| ids.iter().copied().find(|&t| t >= vocab_size);
    if let Some(token) = out_of_vocab(&group.prompt_ids) {
        return Err(BadInput::TokenOutOfVocab { token, vocab_size });
    }
    for (i, s) in group.samples.iter().enumerate() {
        if let Some(token) = out_of_vocab(&s.response_ids) {
            return Err(BadInput::TokenOutOfVocab { token, vocab_size });
        }
        if s.behaviour_logprobs.len() != s.response_ids.len() {
            return Err(BadInput::LogprobCountMismatch {
                sample: i,
                tokens: s.response_ids.len(),
                logprobs: s.behaviour_logprobs.len(),
            });
        }
        if !s.reward.is_finite() {
            return Err(BadInput::NonFiniteReward { sample: i });
        }
        // −inf is a legitimate (if extreme) log-prob of a token outside top-k; NaN and +inf are not.
        if s.behaviour_logprobs
            .iter()
            .any(|lp| lp.is_nan() || *lp == f32::INFINITY)
        {
            return Err(BadInput::NonFiniteLogprob { sample: i });
        }
        if let Some(version) = s.policy_versions.iter().map(|v| v.version).max() {
            if version > current_version {
                return Err(BadInput::FutureVersion {
                    version,
                    current_version,
                });
            }
        }
    }
    Ok(())
}

/// A hash of what a group contains (prompt, responses, versions, rewards): equal for a group an
/// actor regenerated after a restart.
pub fn content_hash(g: &RolloutGroup) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (g.stage_index, g.prompt_id, g.actor_id, &g.prompt_ids).hash(&mut h);
    for s in &g.samples {
        (&s.response_ids, s.reward.to_bits()).hash(&mut h);
        for v in &s.policy_versions {
            (v.start_token, v.version).hash(&mut h);
        }
    }
    h.finish()
}

/// Applies the checks and keeps the counts.
#[derive(Debug, Clone)]
pub struct GroupFilter {
    cfg: FilterConfig,
    metrics: FilterMetrics,
    /// Content hashes of the groups decided at version `decided_at`.
    hashes: HashSet<u64>,
    decided_at: Option<u64>,
    /// Equal-reward groups since the last admitted one.
    equal_in_a_row: u64,
    /// Groups of this stage decided as their own version's (see [`GroupFilter::decided`]).
    decided: u64,
}

impl GroupFilter {
    /// A filter with zeroed metrics.
    pub fn new(cfg: FilterConfig) -> Result<Self> {
        Self::resume(cfg, FilterMetrics::default(), 0, 0)
    }

    /// A filter continuing from saved metrics, equal-reward run length and decided-group count
    /// (resume).
    pub fn resume(
        cfg: FilterConfig,
        metrics: FilterMetrics,
        equal_in_a_row: u64,
        decided: u64,
    ) -> Result<Self> {
        cfg.validate()?;
        Ok(GroupFilter {
            cfg,
            metrics,
            hashes: HashSet::new(),
            decided_at: None,
            equal_in_a_row,
            decided,
        })
    }

    /// Groups of the stage decided as samples of a version the learner accepts: kept, or
    /// dropped for equal rewards or as bad input; not the stale ones, a second delivery of one
    /// already decided, nor another stage's (part of the resumable state). Strictly on-policy,
    /// every actor's draws of the next version start after these in the stage's shared prompt
    /// order, so no prompt the learner has trained on or filtered out at one version is drawn
    /// again at the next.
    pub fn decided(&self) -> u64 {
        self.decided
    }

    /// Equal-reward groups since the last admitted one (part of the resumable state).
    pub fn equal_in_a_row(&self) -> u64 {
        self.equal_in_a_row
    }

    /// Whether the step being filled should be completed with held equal-reward groups:
    /// `no_signal_groups` of them came in a row and `available` (admitted + held) fill a
    /// batch of `batch`.
    pub fn no_signal_due(&self, available: usize, batch: usize) -> bool {
        self.cfg.no_signal_groups > 0
            && self.equal_in_a_row >= self.cfg.no_signal_groups
            && available >= batch
    }

    /// Records that `n` held equal-reward groups were admitted to complete a no-signal step.
    pub fn admit_no_signal(&mut self, n: usize) {
        self.metrics.no_signal_admitted += n as u64;
        self.equal_in_a_row = 0;
    }

    /// The settings.
    pub fn config(&self) -> &FilterConfig {
        &self.cfg
    }

    /// The counts so far.
    pub fn metrics(&self) -> &FilterMetrics {
        &self.metrics
    }

    /// Decides whether `group` is trained on by a learner at `current_version`; counts and logs
    /// every drop.
    pub fn admit(
        &mut self,
        group: &RolloutGroup,
        current_version: u64,
    ) -> std::result::Result<(), DropReason> {
        self.metrics.seen += 1;
        if self.decided_at != Some(current_version) {
            self.hashes.clear();
            self.decided_at = Some(current_version);
        }
        let verdict = self.decide(group, current_version);
        if !matches!(
            verdict,
            Err(DropReason::Stale { .. } | DropReason::Duplicate | DropReason::OtherStage { .. })
        ) {
            self.decided += 1;
        }
        match &verdict {
            Ok(()) => {
                self.metrics.kept += 1;
                self.equal_in_a_row = 0;
            }
            Err(reason) => {
                let m = &mut self.metrics;
                match reason {
                    DropReason::OtherStage { .. } => m.other_stage += 1,
                    DropReason::Duplicate => m.duplicate += 1,
                    DropReason::Stale { .. } => m.stale += 1,
                    DropReason::EqualRewards => {
                        m.equal_rewards += 1;
                        self.equal_in_a_row += 1;
                    }
                    DropReason::BadInput(b) => {
                        match b {
                            BadInput::NoSamples => m.bad_no_samples += 1,
                            BadInput::TokenOutOfVocab { .. } => m.bad_token += 1,
                            BadInput::LogprobCountMismatch { .. } => m.bad_logprob_count += 1,
                            BadInput::NonFiniteReward { .. } => m.bad_reward += 1,
                            BadInput::NonFiniteLogprob { .. } => m.bad_logprob += 1,
                            BadInput::FutureVersion { .. } => m.bad_future_version += 1,
                            BadInput::BadTemperature { .. } => m.bad_temperature += 1,
                        }
                        tracing::warn!(
                            prompt_id = group.prompt_id,
                            actor_id = group.actor_id,
                            "rollout group rejected: {reason}"
                        );
                    }
                }
                if !matches!(reason, DropReason::BadInput(_)) {
                    tracing::debug!(
                        prompt_id = group.prompt_id,
                        "rollout group dropped: {reason}"
                    );
                }
            }
        }
        verdict
    }

    fn decide(
        &mut self,
        group: &RolloutGroup,
        current_version: u64,
    ) -> std::result::Result<(), DropReason> {
        if group.stage_index != self.cfg.stage_index {
            return Err(DropReason::OtherStage {
                group_stage: group.stage_index,
            });
        }
        check_input(group, self.cfg.vocab_size, current_version).map_err(DropReason::BadInput)?;
        if !self.hashes.insert(content_hash(group)) {
            return Err(DropReason::Duplicate);
        }
        let group_version = group.min_policy_version();
        if is_stale(group_version, current_version, self.cfg.max_staleness) {
            return Err(DropReason::Stale {
                group_version,
                current_version,
            });
        }
        if self.cfg.drop_equal_rewards {
            let first = group.samples[0].reward;
            if group.samples.iter().all(|s| s.reward == first) {
                return Err(DropReason::EqualRewards);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cascade_shared::{FinishReason, Mode, Sample, SampleTiming, StageKind, VersionSpan};

    fn sample(reward: f32, version: u64) -> Sample {
        Sample {
            response_ids: vec![1, 2],
            behaviour_logprobs: vec![-0.1, -0.2],
            policy_versions: vec![VersionSpan {
                start_token: 0,
                version,
            }],
            finish_reason: FinishReason::Stop,
            reward,
            reward_breakdown: vec![],
            timing: SampleTiming::default(),
        }
    }

    fn group(rewards: &[f32], version: u64) -> RolloutGroup {
        RolloutGroup {
            stage: StageKind::Math,
            stage_index: 0,
            prompt_id: 9,
            mode: Mode::Think,
            actor_id: 0,
            prompt_ids: vec![3, 4],
            temperature: 1.0,
            samples: rewards.iter().map(|&r| sample(r, version)).collect(),
        }
    }

    fn filter(max_staleness: u64) -> GroupFilter {
        GroupFilter::new(FilterConfig {
            max_staleness,
            drop_equal_rewards: true,
            vocab_size: 10,
            stage_index: 0,
            no_signal_groups: 3,
        })
        .unwrap()
    }

    #[test]
    fn staleness_rule() {
        assert!(!is_stale(5, 5, 0));
        assert!(is_stale(4, 5, 0));
        assert!(!is_stale(3, 5, 2));
        assert!(is_stale(2, 5, 2));
        // A group from a newer version is never "stale" (it is rejected as bad input instead).
        assert!(!is_stale(6, 5, 0));
    }

    #[test]
    fn on_policy_drops_older_versions_and_counts() {
        let mut f = filter(0);
        assert_eq!(f.admit(&group(&[0.0, 1.0], 7), 7), Ok(()));
        assert!(matches!(
            f.admit(&group(&[0.0, 1.0], 6), 7),
            Err(DropReason::Stale {
                group_version: 6,
                current_version: 7
            })
        ));
        // A sample that mixes versions is as old as its oldest token.
        let mut g = group(&[0.0, 1.0], 7);
        g.samples[1].policy_versions.insert(
            0,
            VersionSpan {
                start_token: 0,
                version: 6,
            },
        );
        assert!(matches!(f.admit(&g, 7), Err(DropReason::Stale { .. })));
        assert_eq!(
            f.admit(&group(&[1.0, 1.0], 7), 7),
            Err(DropReason::EqualRewards)
        );
        let m = f.metrics();
        assert_eq!((m.seen, m.kept, m.stale, m.equal_rewards), (4, 1, 2, 1));
        // Decided at their own version: the kept group and the equal-reward one.
        assert_eq!(f.decided(), 2);
    }

    #[test]
    fn bad_inputs_are_rejected_with_reasons() {
        let mut f = filter(3);
        let mut g = group(&[0.0, 1.0], 1);
        g.samples[0].response_ids[1] = 10;
        assert_eq!(
            f.admit(&g, 1),
            Err(DropReason::BadInput(BadInput::TokenOutOfVocab {
                token: 10,
                vocab_size: 10
            }))
        );
        let mut g = group(&[0.0, 1.0], 1);
        g.prompt_ids.push(99);
        assert!(f.admit(&g, 1).is_err());
        let mut g = group(&[0.0, 1.0], 1);
        g.samples[1].behaviour_logprobs.push(-1.0);
        assert!(matches!(
            f.admit(&g, 1),
            Err(DropReason::BadInput(BadInput::LogprobCountMismatch {
                sample: 1,
                tokens: 2,
                logprobs: 3
            }))
        ));
        let g = group(&[f32::NAN, 1.0], 1);
        assert!(matches!(
            f.admit(&g, 1),
            Err(DropReason::BadInput(BadInput::NonFiniteReward {
                sample: 0
            }))
        ));
        let mut g = group(&[0.0, 1.0], 1);
        g.samples[0].behaviour_logprobs[0] = f32::NAN;
        assert!(f.admit(&g, 1).is_err());
        assert!(matches!(
            f.admit(&group(&[0.0, 1.0], 2), 1),
            Err(DropReason::BadInput(BadInput::FutureVersion { .. }))
        ));
        assert!(f.admit(&group(&[], 1), 1).is_err());
        let m = f.metrics().clone();
        assert_eq!(m.bad_token, 2);
        assert_eq!(m.bad_logprob_count, 1);
        assert_eq!(m.bad_reward, 1);
        assert_eq!(m.bad_logprob, 1);
        assert_eq!(m.bad_future_version, 1);
        assert_eq!(m.bad_no_samples, 1);
        assert_eq!(m.bad_input(), 7);
        assert_eq!(m.kept, 0);
        // A bad record is reported as bad even when it is also stale.
        let mut g = group(&[0.0, 1.0], 0);
        g.samples[0].reward = f32::INFINITY;
        assert!(matches!(f.admit(&g, 10), Err(DropReason::BadInput(_))));
    }

    #[test]
    fn other_stages_and_duplicates_are_counted_once_per_version() {
        let mut f = filter(1);
        let mut other = group(&[0.0, 1.0], 4);
        other.stage_index = 2;
        assert_eq!(
            f.admit(&other, 4),
            Err(DropReason::OtherStage { group_stage: 2 })
        );
        assert_eq!(f.admit(&group(&[0.0, 1.0], 4), 4), Ok(()));
        assert_eq!(
            f.admit(&group(&[0.0, 1.0], 4), 4),
            Err(DropReason::Duplicate)
        );
        // At the next version the same content is a new decision (here: one version old).
        assert_eq!(f.admit(&group(&[0.0, 1.0], 4), 5), Ok(()));
        let m = f.metrics();
        assert_eq!((m.seen, m.kept, m.other_stage, m.duplicate), (4, 2, 1, 1));
    }

    #[test]
    fn no_signal_step_is_due_after_a_run_of_equal_rewards() {
        let mut f = filter(0);
        let equal = |f: &mut GroupFilter, id: u64| {
            let mut g = group(&[1.0, 1.0], 3);
            g.prompt_id = id;
            assert_eq!(f.admit(&g, 3), Err(DropReason::EqualRewards));
        };
        equal(&mut f, 1);
        equal(&mut f, 2);
        assert!(!f.no_signal_due(2, 2), "two in a row, three needed");
        equal(&mut f, 3);
        assert!(
            !f.no_signal_due(1, 2),
            "not enough groups to fill the batch"
        );
        assert!(f.no_signal_due(2, 2));
        f.admit_no_signal(2);
        assert!(!f.no_signal_due(2, 2));
        assert_eq!(f.metrics().no_signal_admitted, 2);
        // An admitted group also breaks the run.
        equal(&mut f, 4);
        equal(&mut f, 5);
        assert_eq!(f.admit(&group(&[0.0, 1.0], 3), 3), Ok(()));
        assert_eq!(f.equal_in_a_row(), 0);
    }
}
