//! `state.json`: everything besides weights and optimizer moments that a resumed learner needs.

use serde::{Deserialize, Serialize};

use crate::filter::FilterMetrics;
use crate::outcomes::TrackerState;
use crate::rng::RngState;

/// Version of the `state.json` layout. Bump on any incompatible change.
pub const STATE_FORMAT_VERSION: u32 = 1;

/// The learner's resumable state.
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
    /// The learner's RNG position.
    pub rng: RngState,
    /// Replay read cursors (owned by the replay crate; opaque here).
    pub replay_cursors: serde_json::Value,
    /// Curriculum state (e.g. the length-curriculum position; opaque here).
    pub curriculum: serde_json::Value,
    /// Filtering counters.
    pub filter_metrics: FilterMetrics,
    /// Per-prompt outcome tracking, when enabled.
    pub prompt_tracker: Option<TrackerState>,
}
