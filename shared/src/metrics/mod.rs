//! The run's metric files, defined once: `RUN_DIR/metrics.jsonl` (events appended by every
//! process) and `RUN_DIR/heldout.json` (the held-out table written at the end of a run).
//!
//! Writers and readers use the same types: a writer appends a typed event with
//! [`MetricsLog::record`] (or, until every writer has moved over, an untyped
//! [`MetricsLog::emit`] with the same event name and fields); readers parse lines with
//! [`parse_metrics`] / [`Event::parse_line`] into [`EventKind`]. The held-out table is
//! [`HeldoutTable`].
//!
//! # `metrics.jsonl`
//!
//! One JSON object per line, appended by several processes (learner, actors, supervisor), so
//! lines are not necessarily ordered by time. Lines are written with one `write` call on a file
//! opened with `O_APPEND`, so lines of concurrent processes never interleave. A metrics write
//! that fails is logged and dropped: metrics never stop training. Every line has:
//!
//! | field   | type   | meaning |
//! |---------|--------|---------|
//! | `t`     | f64    | unix time in seconds |
//! | `proc`  | string | writing process: `"learner"`, `"actor-0"`, `"supervisor"`, ... |
//! | `event` | string | one of the events below |
//!
//! and the event's fields at the same level. Readers must ignore unknown events and unknown
//! fields. A line that is not a JSON object with those three fields, or a known event whose
//! fields have the wrong JSON types, is *malformed*: it is skipped and counted, never fatal.
//! Every event field is optional: `null` reads as absent (JSON has no NaN, and `serde_json`
//! writes a non-finite float as `null`).
//!
//! | `event` | type | written by |
//! |---------|------|------------|
//! | `run_start` | [`RunStart`] | supervisor (`cascade run`), once per start or resume |
//! | `process` | [`ProcessEvent`] | supervisor: a child started, exited, was restarted or given up |
//! | `resume` | [`Resume`] | learner, when it continues from a snapshot |
//! | `rm_step`, `rm_done` | [`RmStep`], [`RmDone`] | learner, while training the `[reward_model]` |
//! | `sft_step` | [`SftStep`] | learner: one supervised step |
//! | `learner_step` | [`LearnerStep`] | learner: one RL step (GRPO) |
//! | `warning` | [`Warning`] | learner: a run of groups with nothing to learn from |
//! | `replay_error`, `replay_skip` | [`ReplayErrorEvent`], [`ReplaySkip`] | learner: a replay record skipped, records lost before a restart |
//! | `snapshot` | [`Snapshot`] | learner: a snapshot published |
//! | `stage_end` | [`StageEnd`] | learner: a stage finished |
//! | `learner_exit` | [`LearnerExit`] | learner, when it stops |
//! | `actor` | [`ActorEvent`] | each actor, every 2 s: generation throughput |
//! | `eval` | [`Eval`] | supervisor: one held-out score (a row's domain) |
//! | `run_end` | [`RunEnd`] | supervisor, when the run completes, stops or fails |
//!
//! The fields of each event are the documented fields of its type (same names, same JSON
//! shapes; `Option` fields are the optional ones above).
//!
//! # `heldout.json`
//!
//! [`HeldoutTable`]: every RL domain's held-out score after the SFT stages (row `sft`) and
//! after each RL stage, and each RL stage's paired change on its own domain:
//!
//! ```json
//! {"domains": ["rlhf", "if", "math", "code", "swe"],
//!  "rows": [{"after_stage": "sft", "scores": {"math": 0.41, "code": 0.2}, "policy_version": 3,
//!            "stderr": {"math": 0.02, "code": 0.03}, "prompt_scores": {"math": {"17": 0.5}}},
//!           ...],
//!  "gains": [{"stage": "math", "domain": "math", "before": 0.41, "after": 0.47,
//!             "diff": 0.03, "se": 0.01, "prompts": 96}, ...]}
//! ```
//!
//! # `seeds.json`
//!
//! [`SeedsSummary`], written by `cascade run --seeds N` into the directory that holds the
//! `seed-S/` runs: each seed's held-out table, the table's mean ± spread across seeds
//! ([`Spread`]), each RL stage's own gain per seed ([`OwnGain`]), its change to every other
//! domain ([`OtherChange`]), what each domain kept after the last stage ([`Retention`]), and the
//! goals checked against them ([`SeedGoals`], [`GoalCheck`]).

mod events;
mod heap;
mod heldout;
mod log;
mod memory;
mod read;
mod seeds;

pub use events::{
    ActorEvent, Eval, EvalScores, LearnerExit, LearnerStep, MetricsEvent, ModeStats, ProcessEvent,
    ReplayErrorEvent, ReplaySkip, Resume, RmDone, RmStep, RunEnd, RunStart, SftStep, Snapshot,
    StageEnd, Warning,
};
pub use heap::{heap_peak_mb, reset_heap_peak, CountingAlloc};
pub use heldout::{HeldoutRow, HeldoutTable, StageGain, HELDOUT_FILE};
pub use log::{read_events, unix_now, MetricsLog, METRICS_FILE};
pub use memory::{
    device_memory_mb, device_peak_mb, peak_rss_mb, reset_device_peak_mb, rss_mb, MemoryReading,
    StepMemory,
};
pub use read::{parse_metrics, Event, EventKind, Metrics};
pub use seeds::{
    tolerance, GoalCheck, OtherChange, OwnGain, Retention, SeedGoals, SeedRun, SeedsSummary,
    Spread, SEEDS_FILE,
};
