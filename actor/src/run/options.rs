//! What an actor run is given ([`ActorOptions`], [`RolloutOverrides`]) and what it reports
//! ([`RunSummary`]).

use std::path::PathBuf;

use candle_core::Device;
use cascade_shared::config::RunConfig;

use crate::rewards::PipelineStats;

/// Command-line overrides of the stage's rollout settings (`None`: the stage/config decides).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RolloutOverrides {
    /// G.
    pub group_size: Option<usize>,
    /// Temperature.
    pub temperature: Option<f32>,
    /// Top-p.
    pub top_p: Option<f32>,
    /// Top-k (0 = off).
    pub top_k: Option<usize>,
    /// Max response tokens (replaces the stage's curriculum).
    pub max_new_tokens: Option<usize>,
}

/// Everything an actor run needs.
#[derive(Debug, Clone)]
pub struct ActorOptions {
    /// The run directory (`snapshots/`, `replay/` inside).
    pub run_dir: PathBuf,
    /// This actor's id.
    pub actor_id: u32,
    /// Compute device.
    pub device: Device,
    /// The run config, `[actor]` overrides applied.
    pub config: RunConfig,
    /// Per-run overrides of the stage settings.
    pub overrides: RolloutOverrides,
    /// Stop after this many groups were handed to the reward pipeline (`None`: until SIGTERM).
    pub max_groups: Option<u64>,
}

/// What an actor run did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RunSummary {
    /// Groups written to the replay log.
    pub groups: u64,
    /// Tokens generated.
    pub tokens: u64,
    /// Prompts skipped as too long for the context.
    pub skipped_prompts: u64,
    /// Snapshots loaded / refused.
    pub snapshots_loaded: u64,
    /// Snapshots refused.
    pub snapshots_refused: u64,
    /// Times the actor paused because the learner wanted no more groups of its weights'
    /// version ([`cascade_shared::intake`]: strictly on-policy after every step, in any mode
    /// at a stage's end).
    pub holds: u64,
    /// Seconds spent in those holds.
    pub held_s: f64,
    /// Decode throughput, generated tokens per second of the run.
    pub tokens_per_s: f64,
    /// Reward pipeline counters.
    pub pipeline: PipelineStats,
}
