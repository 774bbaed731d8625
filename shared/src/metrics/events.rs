//! The events of `metrics.jsonl`, one type each: the fields after the envelope (`t`, `proc`,
//! `event`).
//!
//! Every field is an `Option` and every type is `#[serde(default)]`: a reader accepts a field
//! that is absent or `null` (a writer that omits it, or a NaN written as `null`), and rejects
//! only a field of the wrong JSON type. A field that every writer of an event writes is
//! serialised even when `None` (as `null`, as the writers did with `json!`); a field that some
//! writers leave out is skipped when `None`. Field order follows the writers; `serde_json`
//! sorts object keys anyway.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// An event type of `metrics.jsonl`: its fields serialise to a JSON object, `NAME` is its
/// `event` value.
pub trait MetricsEvent: Serialize + DeserializeOwned {
    /// The `event` field of its lines.
    const NAME: &'static str;
}

macro_rules! event_names {
    ($($ty:ty => $name:literal),* $(,)?) => {
        $(impl MetricsEvent for $ty {
            const NAME: &'static str = $name;
        })*
    };
}

event_names! {
    RunStart => "run_start",
    ProcessEvent => "process",
    Resume => "resume",
    RmStep => "rm_step",
    RmDone => "rm_done",
    SftStep => "sft_step",
    LearnerStep => "learner_step",
    Warning => "warning",
    ReplayErrorEvent => "replay_error",
    ReplaySkip => "replay_skip",
    Snapshot => "snapshot",
    StageEnd => "stage_end",
    LearnerExit => "learner_exit",
    ActorEvent => "actor",
    Eval => "eval",
    RunEnd => "run_end",
}

/// `run_start`: the supervisor started (or resumed) a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunStart {
    /// Path of the run configuration (`RUN_DIR/config.toml`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// The learner's `max_staleness` (0: on-policy).
    pub max_staleness: Option<u64>,
    /// Number of actors (a reader also accepts a list describing them).
    pub actors: Option<serde_json::Value>,
    /// Whether the run continues from a snapshot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume: Option<bool>,
}

/// `process`: a supervised child started, exited, was restarted or was given up.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessEvent {
    /// `"start"`, `"exit"`, `"restart"` or `"give_up"`.
    pub what: Option<String>,
    /// Supervised process name (`"learner"`, `"actor-1"`).
    pub name: Option<String>,
    /// Its pid (`start` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u64>,
    /// Exit status as text (`"exit code 1"`, `"killed by signal 9"`; not on `start`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Peak resident set size of the exited child in MiB (not on `start`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rss_mb: Option<f64>,
    /// Restarts of this process so far.
    pub restarts: Option<u64>,
}

/// `resume`: the learner continues from a snapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Resume {
    /// The snapshot's policy version.
    pub policy_version: Option<u64>,
    /// Its global step.
    pub step: Option<u64>,
    /// Its stage.
    pub stage_index: Option<u64>,
    /// Its step within the stage.
    pub stage_step: Option<u64>,
    /// Seconds from process start to ready.
    pub resume_s: Option<f64>,
}

/// `rm_step`: one reward-model training step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RmStep {
    /// Steps taken, this one included (1-based).
    pub step: Option<u64>,
    /// Total steps of the training.
    pub steps: Option<u64>,
    /// Mean Bradley–Terry loss of the batch.
    pub loss: Option<f64>,
    /// Pairwise accuracy on the batch.
    pub accuracy: Option<f64>,
    /// Mean `s_chosen − s_rejected` of the batch.
    pub margin: Option<f64>,
    /// Learning rate.
    pub lr: Option<f64>,
    /// Gradient norm before clipping (`null`: the step was skipped).
    pub grad_norm: Option<f64>,
}

/// `rm_done`: reward-model training finished.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RmDone {
    /// Pairwise accuracy on the held-out pairs after training (`null`: no held-out set).
    pub heldout_accuracy: Option<f64>,
    /// The same before training.
    pub heldout_accuracy_before: Option<f64>,
    /// How often a held-out chosen answer scores higher under its own prompt than under
    /// another pair's (0.5: the scores ignore the prompt).
    pub heldout_prompt_match: Option<f64>,
    /// Training pairs.
    pub pairs: Option<u64>,
    /// Held-out pairs evaluated.
    pub heldout_pairs: Option<u64>,
    /// Loss of the first step.
    pub first_loss: Option<f64>,
    /// Loss of the last step.
    pub final_loss: Option<f64>,
    /// Directory of the trained reward model.
    pub dir: Option<String>,
}

/// `sft_step`: one supervised fine-tuning step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SftStep {
    /// Stage name.
    pub stage: Option<String>,
    /// Position of the stage in the cascade.
    pub stage_index: Option<u64>,
    /// Step within the stage (1-based).
    pub stage_step: Option<u64>,
    /// The stage's total steps.
    pub stage_steps: Option<u64>,
    /// Global optimizer step (shared with `learner_step`).
    pub step: Option<u64>,
    /// Policy version after this step.
    pub policy_version: Option<u64>,
    /// Loss of the step.
    pub loss: Option<f64>,
    /// Learning rate.
    pub lr: Option<f64>,
    /// Gradient norm before clipping (`null`: the step was skipped).
    pub grad_norm: Option<f64>,
    /// Tokens in the batch.
    pub train_tokens: Option<u64>,
    /// Tokens with a loss (the responses).
    pub trained_tokens: Option<u64>,
    /// Training throughput.
    pub tokens_per_s: Option<f64>,
    /// Wall time of the step.
    pub step_s: Option<f64>,
    /// The optimizer skipped the update (non-finite gradients).
    pub skipped: Option<bool>,
    /// Peak host RSS during the step, MiB ([`super::StepMemory`]; `train_tokens` is the step's
    /// tokens).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rss_mb: Option<f64>,
    /// Peak bytes held by the process's heap during the step, MiB: the RSS less what the
    /// allocator keeps after frees (the figure `cascade plan` models for a CPU learner).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_heap_mb: Option<f64>,
    /// Device memory in use at the end of the step, MiB (CUDA only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_memory_mb: Option<f64>,
    /// Peak device memory of this process's allocations during the step, MiB (CUDA only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_peak_mb: Option<f64>,
}

/// Per-mode statistics of a `learner_step` (`by_mode.think`, `by_mode.no_think`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModeStats {
    /// Groups of this mode trained on.
    pub groups: Option<u64>,
    /// Mean reward of their samples.
    pub reward_mean: Option<f64>,
    /// Fraction of their samples with reward ≥ 1.
    pub pass_rate: Option<f64>,
    /// Mean response length in tokens.
    pub response_len: Option<f64>,
}

/// `learner_step`: one RL optimizer step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LearnerStep {
    /// Stage name.
    pub stage: Option<String>,
    /// `rlhf` | `if` | `math` | `code` | `swe` (the stage's domain).
    pub stage_kind: Option<String>,
    /// Position of the stage in the cascade.
    pub stage_index: Option<u64>,
    /// Step within the stage (1-based).
    pub stage_step: Option<u64>,
    /// The stage's total steps.
    pub stage_steps: Option<u64>,
    /// Global optimizer step (shared with `sft_step`).
    pub step: Option<u64>,
    /// Version of the policy after this step.
    pub policy_version: Option<u64>,
    /// GRPO loss.
    pub loss: Option<f64>,
    /// Mean NLL per trained token of the stage's `sft_mix` rows (weighted by its `coef` in
    /// the step's loss; absent without `sft_mix`).
    pub sft_mix_loss: Option<f64>,
    /// Gradient norm before clipping (`null`: the step was skipped).
    pub grad_norm: Option<f64>,
    /// Learning rate.
    pub lr: Option<f64>,
    /// Tokens in the batch.
    pub train_tokens: Option<u64>,
    /// Tokens with a loss (the responses).
    pub trained_tokens: Option<u64>,
    /// Learner training throughput (over the step's compute time).
    pub tokens_per_s: Option<f64>,
    /// Wall time of the step, including waiting for rollouts.
    pub step_s: Option<f64>,
    /// Part of `step_s` spent waiting for rollouts.
    pub idle_s: Option<f64>,
    /// Mean reward over all groups seen (`null`: none).
    pub reward_mean: Option<f64>,
    /// `{"think": M, "no_think": M}`, either may be absent.
    pub by_mode: Option<BTreeMap<String, ModeStats>>,
    /// Per trained group: `policy_version` at training − the version that generated it.
    pub policy_lag: Option<Vec<u64>>,
    /// Groups trained on.
    pub groups_kept: Option<u64>,
    /// The trained groups' replay records, `[actor, seq]` each.
    pub rollouts: Option<Vec<(String, u64)>>,
    /// Groups dropped by reason: `stale`, `equal_rewards`, `bad_input`, `other_stage`,
    /// `duplicate` (a reader accepts other reasons).
    pub dropped: Option<BTreeMap<String, u64>>,
    /// Groups received and not yet used when the step ended.
    pub queue_depth: Option<u64>,
    /// Fraction of response tokens whose ratio was clipped.
    pub clip_fraction: Option<f64>,
    /// Mean π_θ/π_behaviour over the trained tokens.
    pub ratio_mean: Option<f64>,
    /// Largest π_θ/π_behaviour of a trained token.
    pub ratio_max: Option<f64>,
    /// Trained tokens whose negative-advantage loss the dual clip bounded.
    pub dual_clip_fraction: Option<f64>,
    /// Mean per-token KL estimate the loss used (0 without a KL term).
    pub kl_mean: Option<f64>,
    /// Largest per-token KL estimate.
    pub kl_max: Option<f64>,
    /// Trained tokens past `kl_log_ratio_max` (the linear part of the estimate).
    pub kl_bounded_fraction: Option<f64>,
    /// Largest log π_ref − log π_θ of a trained token, in nats.
    pub ref_log_ratio_max: Option<f64>,
    /// Every kept group had equal rewards: the step applied no update.
    pub no_signal: Option<bool>,
    /// The optimizer skipped the update (non-finite gradients).
    pub skipped: Option<bool>,
    /// Peak host RSS during the step, MiB ([`super::StepMemory`]; `train_tokens` is the step's
    /// tokens).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rss_mb: Option<f64>,
    /// Peak bytes held by the process's heap during the step, MiB: the RSS less what the
    /// allocator keeps after frees (the figure `cascade plan` models for a CPU learner).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_heap_mb: Option<f64>,
    /// Device memory in use at the end of the step, MiB (CUDA only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_memory_mb: Option<f64>,
    /// Peak device memory of this process's allocations during the step, MiB (CUDA only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_peak_mb: Option<f64>,
}

/// `warning`: the last `equal_reward_groups_in_a_row` groups of a stage all had equal rewards.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Warning {
    /// Stage name.
    pub stage: Option<String>,
    /// Groups in a row with equal rewards.
    pub equal_reward_groups_in_a_row: Option<u64>,
}

/// `replay_error`: a replay record that could not be decoded was skipped.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReplayErrorEvent {
    /// The decode error.
    pub error: Option<String>,
}

/// `replay_skip`: records dropped before a restart and deleted since; reading went on at the
/// oldest record on disk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReplaySkip {
    /// Actor directory name.
    pub actor: Option<String>,
    /// First record lost.
    pub from_seq: Option<u64>,
    /// First record read instead.
    pub to_seq: Option<u64>,
}

/// `snapshot`: the learner published a snapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Snapshot {
    /// Its policy version.
    pub policy_version: Option<u64>,
    /// The stage it points at.
    pub stage_index: Option<u64>,
    /// It ends a stage (kept by retention).
    pub stage_final: Option<bool>,
    /// It is a checkpoint (optimizer state, committed replay position) rather than weights
    /// only (`learner.checkpoint_every`).
    pub checkpoint: Option<bool>,
    /// Seconds to write and publish it.
    pub publish_s: Option<f64>,
    /// Versions deleted by retention afterwards.
    pub deleted: Option<Vec<u64>>,
}

/// `stage_end`: a cascade stage finished.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StageEnd {
    /// Stage name.
    pub stage: Option<String>,
    /// Position of the stage in the cascade.
    pub stage_index: Option<u64>,
    /// Global step at its end.
    pub step: Option<u64>,
    /// Policy version at its end.
    pub policy_version: Option<u64>,
}

/// `learner_exit`: the learner stops.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LearnerExit {
    /// `"completed"` or `"stopped"`.
    pub status: Option<String>,
    /// Steps taken by this process.
    pub steps: Option<u64>,
    /// Policy version at exit.
    pub policy_version: Option<u64>,
    /// Seconds spent waiting for rollouts.
    pub idle_s: Option<f64>,
    /// Wall time of the process.
    pub wall_s: Option<f64>,
    /// Peak resident set size in MiB (`null`: unknown).
    pub peak_rss_mb: Option<f64>,
}

/// `actor`: periodic actor report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ActorEvent {
    /// Actor id (written as a number; a reader also accepts a string).
    pub actor: Option<serde_json::Value>,
    /// Stage name.
    pub stage: Option<String>,
    /// Version of the actor's current weights.
    pub policy_version: Option<u64>,
    /// Groups submitted so far.
    pub groups: Option<u64>,
    /// Cumulative generated tokens.
    pub tokens: Option<u64>,
    /// Generation throughput over the last reporting interval.
    pub tokens_per_s: Option<f64>,
    /// Peak host RSS of the actor process so far, MiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rss_mb: Option<f64>,
    /// Peak bytes its heap has held so far, MiB ([`super::CountingAlloc`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_heap_mb: Option<f64>,
    /// Times so far the actor paused because the learner wanted no more groups of its
    /// weights' version ([`crate::intake`]: strictly on-policy after every step, in any mode at
    /// a stage's end).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<u64>,
    /// Seconds so far spent waiting in those holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_s: Option<f64>,
    /// Rows preempted so far because the KV cache (`actor.kv_cache_tokens`) was full; each was
    /// prefilled again later.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_preemptions: Option<u64>,
    /// Tokens run through prefills so far (prompts, and the responses of preempted rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_tokens: Option<u64>,
    /// Samples so far that started from a sibling's prompt cache instead of a prefill.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_prompts: Option<u64>,
}

/// Scores of one mode in an [`Eval`] (`by_mode.think`, `by_mode.no_think`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EvalScores {
    /// Prompts evaluated in this mode.
    pub prompts: Option<u64>,
    /// Mean over prompts of the mean reward of their samples.
    pub mean_reward: Option<f64>,
    /// Standard error of `mean_reward` over prompts.
    pub mean_reward_se: Option<f64>,
    /// Mean fraction of samples with reward ≥ 1.
    pub pass_at_1: Option<f64>,
    /// Unbiased pass@k with k = samples.
    pub pass_at_k: Option<f64>,
    /// Mean response length in tokens.
    pub response_len: Option<f64>,
}

/// `eval`: one domain's held-out score of one row of `heldout.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Eval {
    /// The row (`sft` or an RL stage's name).
    pub after_stage: Option<String>,
    /// The domain.
    pub domain: Option<String>,
    /// The snapshot evaluated.
    pub policy_version: Option<u64>,
    /// Mean reward over prompts.
    pub score: Option<f64>,
    /// Its standard error over prompts.
    pub score_se: Option<f64>,
    /// Mean fraction of samples with reward ≥ 1.
    pub pass_at_1: Option<f64>,
    /// Prompts evaluated.
    pub prompts: Option<u64>,
    /// The same per mode.
    pub by_mode: Option<BTreeMap<String, EvalScores>>,
}

/// `run_end`: the run completed, was stopped or failed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunEnd {
    /// Wall time of the supervisor.
    pub wall_s: Option<f64>,
    /// Wall time until training ended (`completed` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_s: Option<f64>,
    /// `"completed"`, `"stopped"` or `"failed"`.
    pub status: Option<String>,
    /// The learner's `max_staleness`.
    pub max_staleness: Option<u64>,
    /// Unix time of the end (`completed` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_end: Option<f64>,
}
