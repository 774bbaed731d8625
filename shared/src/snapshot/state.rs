//! `state.json`: everything besides weights and optimizer moments that a resumed learner
//! needs, and that actors read to follow the learner (the stage pointer, prompt outcomes).

use serde::{Deserialize, Serialize};

use crate::outcomes::TrackerState;

/// Version of the `state.json` layout. Bump on any incompatible change.
pub const STATE_FORMAT_VERSION: u32 = 1;

/// The learner's resumable state, published in every snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearnerState {
    /// [`STATE_FORMAT_VERSION`] of the writer.
    pub format_version: u32,
    /// Optimizer steps applied since the start of the run.
    pub step: u64,
    /// The policy version these weights are (= the snapshot version).
    pub policy_version: u64,
    /// Index of the current stage in the run's cascade.
    pub stage_index: u32,
    /// Optimizer steps applied within the current stage.
    pub stage_step: u64,
    /// The transport's read position covering every group decided before this snapshot
    /// (opaque here: the rollout source's own serialised position).
    pub replay_cursors: serde_json::Value,
    /// Where the current stage stands (its KL reference, the no-signal counter). Written as
    /// `curriculum` by earlier builds.
    #[serde(alias = "curriculum", default)]
    pub stage_progress: StageProgress,
    /// Admission counters (every decision of the group filter).
    pub filter_metrics: FilterMetrics,
    /// Per-prompt outcome tracking of the current RL stage, when one runs.
    pub prompt_tracker: Option<TrackerState>,
    /// Whether the snapshot is a checkpoint a learner resumes from (`learner.checkpoint_every`):
    /// it holds the optimizer state of a stage under way and its replay position is committed.
    /// `false`: weights for the actors only. Snapshots of earlier builds are checkpoints.
    #[serde(default = "is_checkpoint_by_default")]
    pub checkpoint: bool,
}

fn is_checkpoint_by_default() -> bool {
    true
}

impl LearnerState {
    /// The state of a run that has not trained yet.
    pub fn initial(replay_cursors: serde_json::Value) -> Self {
        LearnerState {
            format_version: STATE_FORMAT_VERSION,
            step: 0,
            policy_version: 0,
            stage_index: 0,
            stage_step: 0,
            replay_cursors,
            stage_progress: StageProgress::default(),
            filter_metrics: FilterMetrics::default(),
            prompt_tracker: None,
            checkpoint: true,
        }
    }
}

/// Per-stage progress that is not a step count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StageProgress {
    /// The policy version the stage started from: the frozen reference of its KL term.
    pub reference_version: Option<u64>,
    /// Groups in a row with all-equal rewards (decides when a no-signal step happens).
    pub equal_in_a_row: u64,
    /// Groups of the stage the learner has decided on as samples of an accepted version (kept,
    /// or dropped for equal rewards or bad input). Strictly on-policy, where the actors' next
    /// version draws from in the stage's shared prompt order. 0 in states of earlier builds.
    #[serde(default)]
    pub groups_decided: u64,
}

/// Counters of every admission decision, serialised into the snapshot's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterMetrics {
    /// Groups seen.
    pub seen: u64,
    /// Groups kept for training.
    pub kept: u64,
    /// Dropped as stale.
    pub stale: u64,
    /// Dropped by dynamic filtering.
    pub equal_rewards: u64,
    /// Rejected: no samples.
    pub bad_no_samples: u64,
    /// Rejected: token id outside the vocabulary.
    pub bad_token: u64,
    /// Rejected: log-prob count ≠ token count.
    pub bad_logprob_count: u64,
    /// Rejected: NaN/inf reward.
    pub bad_reward: u64,
    /// Rejected: NaN/+inf behaviour log-prob.
    pub bad_logprob: u64,
    /// Rejected: version newer than the learner's.
    pub bad_future_version: u64,
    /// Rejected: sampling temperature not a finite positive number.
    #[serde(default)]
    pub bad_temperature: u64,
    /// Skipped: produced for another stage than the learner's current one.
    #[serde(default)]
    pub other_stage: u64,
    /// Skipped: the same content as a group already decided at this version (an actor that
    /// restarted regenerates the groups it wrote before it died).
    #[serde(default)]
    pub duplicate: u64,
    /// Equal-reward groups admitted anyway to complete a no-signal step (see the filter).
    #[serde(default)]
    pub no_signal_admitted: u64,
}

impl FilterMetrics {
    /// All rejected-as-malformed groups.
    pub fn bad_input(&self) -> u64 {
        self.bad_no_samples
            + self.bad_token
            + self.bad_logprob_count
            + self.bad_reward
            + self.bad_logprob
            + self.bad_future_version
            + self.bad_temperature
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_state_of_earlier_builds() {
        // An earlier build wrote `rng` (never read) and an untyped `curriculum`.
        let old = serde_json::json!({
            "format_version": 1, "step": 4, "policy_version": 4, "stage_index": 1,
            "stage_step": 2,
            "rng": {"seed_hex": "00", "stream": 0, "word_pos": "0"},
            "replay_cursors": {"actors": {}},
            "curriculum": {"reference_version": 2, "equal_in_a_row": 3},
            "filter_metrics": {"seen": 1, "kept": 1, "stale": 0, "equal_rewards": 0,
                "bad_no_samples": 0, "bad_token": 0, "bad_logprob_count": 0, "bad_reward": 0,
                "bad_logprob": 0, "bad_future_version": 0},
            "prompt_tracker": null
        });
        let s: LearnerState = serde_json::from_value(old).unwrap();
        assert_eq!(
            s.stage_progress,
            StageProgress {
                reference_version: Some(2),
                equal_in_a_row: 3,
                groups_decided: 0,
            }
        );
        assert_eq!(s.filter_metrics.kept, 1);
        let fresh: LearnerState = serde_json::from_value(serde_json::json!({
            "format_version": 1, "step": 0, "policy_version": 0, "stage_index": 0,
            "stage_step": 0, "replay_cursors": {}, "curriculum": {},
            "filter_metrics": FilterMetrics::default(), "prompt_tracker": null
        }))
        .unwrap();
        assert_eq!(fresh.stage_progress, StageProgress::default());
    }
}
