//! `[actor]`, `[learner]` and `[replay]`: throughput knobs.
//!
//! Each section is declared once, in [`knobs!`], which generates two structs from the same list
//! of fields, defaults and docs:
//! - the section itself (`ActorConfig`, ...), concrete values with defaults, read from the file;
//! - a clap `Args` struct (`ActorArgs`, ...) with the same fields as `Option`s and a `///` on
//!   each (its `--help`), also `Deserialize`, whose [`apply`](ActorArgs::apply) overwrites the
//!   fields given on the command line. One struct cannot be both: with concrete fields clap would
//!   fill in its defaults and a flag left out would silently override the file.

use serde::{Deserialize, Serialize};

use super::error::{invalid, Result};

macro_rules! knobs {
    (
        $(#[doc = $cdoc:literal])* config $Config:ident;
        $(#[doc = $adoc:literal])* args $Args:ident;
        $(
            $(#[doc = $doc:literal])*
            $field:ident : $ty:ty = $default:expr, flag $flag:literal;
        )*
    ) => {
        $(#[doc = $cdoc])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct $Config {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl Default for $Config {
            fn default() -> Self {
                $Config { $( $field: $default, )* }
            }
        }

        $(#[doc = $adoc])*
        #[derive(Debug, Clone, Default, PartialEq, clap::Args, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $Args {
            $(
                $(#[doc = $doc])*
                #[arg(long = $flag, id = $flag)]
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $field: Option<$ty>,
            )*
        }

        impl $Args {
            /// Overwrites the fields of `config` that were given here.
            pub fn apply(&self, config: &mut $Config) {
                $( if let Some(value) = &self.$field { config.$field = value.clone(); } )*
            }

            /// Whether no field was given.
            pub fn is_empty(&self) -> bool {
                true $( && self.$field.is_none() )*
            }
        }
    };
}

/// `learner.grad_accum`: the precision the learner sums gradients in, over a step's
/// micro-batches and, in a learner group, over its ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum GradAccum {
    /// f32: 4 bytes per parameter (per owned parameter in a group); the sum depends on the
    /// order of the additions, so another micro-batch split or rank count changes the last bits.
    F32,
    /// f64: 8 bytes per parameter; f32 gradients added in f64 are exact in practice, so the
    /// step is the same to the last bit however the micro-batches are spread over ranks.
    #[default]
    F64,
}

knobs! {
    /// `[actor]`: generation throughput and sampling defaults of every actor.
    config ActorConfig;
    /// Command-line overrides of `[actor]`.
    args ActorArgs;
    /// Rows (samples) decoded together: the engine's slots. A prompt's `group_size` samples
    /// queue for them and enter as slots free up (continuous batching).
    gen_batch: usize = 8, flag "gen-batch";
    /// Max new tokens when a stage sets no `max_response_tokens`.
    max_new_tokens: usize = 512, flag "max-new-tokens";
    /// Tokens of the KV cache an actor's `gen_batch` rows share (paged, allocated in full when
    /// the actor starts generating). 0 = `gen_batch` × (2048 prompt tokens + the longest
    /// response of any RL stage), capped at the model's context per row. A smaller budget runs
    /// `gen_batch` rows in less memory when most responses are short: a row waits for free
    /// blocks, and when the cache fills mid-decode the newest row is preempted and later
    /// prefilled again (same sample keys). It must hold one row of prompt + max response.
    kv_cache_tokens: usize = 0, flag "kv-cache-tokens";
    /// Sampling temperature outside training stages (evaluation, `inspect`); 0 = greedy.
    temperature: f32 = 1.0, flag "temperature";
    /// Nucleus sampling threshold, 0 < top_p ≤ 1 (1 = off).
    top_p: f32 = 1.0, flag "top-p";
    /// Keep only the k most likely tokens (0 = off).
    top_k: usize = 0, flag "top-k";
    /// Reward worker threads per actor (verifiers run off the decode thread).
    reward_workers: usize = 2, flag "reward-workers";
    /// Compute threads per actor (0 = the runtime's default).
    threads: usize = 0, flag "actor-threads";
    /// Base seed of the actors' samplers (actor i uses a stream derived from it).
    seed: u64 = 0, flag "actor-seed";
}

knobs! {
    /// `[learner]`: training throughput and snapshot policy.
    config LearnerConfig;
    /// Command-line overrides of `[learner]`.
    args LearnerArgs;
    /// Sequences per forward/backward micro-batch (gradients accumulate over a step); with a
    /// `token_budget`, packed rows per micro-batch.
    micro_batch: usize = 8, flag "micro-batch";
    /// RL: pack samples of one temperature into rows of at most this many tokens (first-fit
    /// decreasing) instead of padding each to the longest of its micro-batch; the loss is the
    /// same. Must hold the longest prompt + response. 0 = off (one padded sample per row).
    token_budget: usize = 0, flag "token-budget";
    /// Publish a snapshot every this many optimizer steps.
    publish_every: usize = 1, flag "publish-every";
    /// Which published snapshots inside a stage are checkpoints: one at least this many
    /// optimizer steps after the stage's last one (and always the stage's step 0, its end and
    /// the snapshot of a stop). A checkpoint holds the optimizer state (each learner rank
    /// its shard) and commits the replay position it covers; the snapshots between are
    /// weights only, for the actors. Resume starts from the newest checkpoint (later
    /// snapshots are removed) and reads the rollouts after its replay position again, so at
    /// most this many steps are recomputed and no rollout is lost. 1 = every snapshot.
    checkpoint_every: usize = 1, flag "checkpoint-every";
    /// Drop rollouts more than this many policy versions old (0 = strictly on-policy).
    max_staleness: u64 = 1, flag "max-staleness";
    /// Compute threads of the learner (0 = the runtime's default).
    threads: usize = 0, flag "learner-threads";
    /// Published snapshots kept on disk besides stage-final ones.
    keep_snapshots: usize = 3, flag "keep-snapshots";
    /// Abort after this many consecutive steps with a non-finite loss or gradient.
    max_bad_steps: usize = 3, flag "max-bad-steps";
    /// Seed of the learner's own draws (SFT packing order, prompt retirement, reward-model
    /// training); independent of `actor.seed`.
    seed: u64 = 0, flag "learner-seed";
    /// Activation checkpointing of the policy's decoder layers: every k-th layer keeps only the
    /// inputs of its attention and MLP blocks and is recomputed in backward, a block at a time (0 = off, 1 = every layer, k = layers 0, k, 2k, ...;
    /// at most 1024). Same gradients, less memory, one more forward per checkpointed layer.
    activation_checkpointing: usize = 1, flag "activation-checkpointing";
    /// Precision of the gradient sums: `f64` (the step does not depend on the micro-batch
    /// split or the number of learner ranks; 8 bytes per parameter, or per owned parameter in
    /// a group) or `f32` (4 bytes; the sums' last bits depend on their order).
    grad_accum: GradAccum = GradAccum::F64, flag "grad-accum";
}

knobs! {
    /// `[replay]`: the memory-mapped rollout log.
    config ReplayConfig;
    /// Command-line overrides of `[replay]`.
    args ReplayArgs;
    /// Size of one pre-allocated segment file, in bytes.
    segment_bytes: u64 = 64 << 20, flag "segment-bytes";
    /// Segments kept per actor before the writer waits (bounds disk use).
    max_segments: usize = 8, flag "max-segments";
    /// Groups an actor may be ahead of the learner before it waits (backpressure).
    max_inflight: usize = 16, flag "max-inflight";
}

/// Largest `learner.activation_checkpointing` interval (beyond any model's layer count).
const MAX_CHECKPOINT_INTERVAL: usize = 1024;

/// Smallest segment that holds a header and a useful record.
const MIN_SEGMENT_BYTES: u64 = 4096;

fn at_least(key: &str, value: u64, min: u64) -> Result<()> {
    if value < min {
        return Err(invalid(key, format!("must be at least {min}, got {value}")));
    }
    Ok(())
}

impl ActorConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        at_least("actor.gen_batch", self.gen_batch as u64, 1)?;
        at_least("actor.max_new_tokens", self.max_new_tokens as u64, 1)?;
        at_least("actor.reward_workers", self.reward_workers as u64, 1)?;
        super::stage::check_top_p("actor.top_p", self.top_p)?;
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(invalid(
                "actor.temperature",
                format!("must be ≥ 0 (0 = greedy), got {}", self.temperature),
            ));
        }
        Ok(())
    }
}

impl LearnerConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        at_least("learner.micro_batch", self.micro_batch as u64, 1)?;
        at_least("learner.publish_every", self.publish_every as u64, 1)?;
        at_least("learner.checkpoint_every", self.checkpoint_every as u64, 1)?;
        at_least("learner.keep_snapshots", self.keep_snapshots as u64, 1)?;
        at_least("learner.max_bad_steps", self.max_bad_steps as u64, 1)?;
        if self.activation_checkpointing > MAX_CHECKPOINT_INTERVAL {
            return Err(invalid(
                "learner.activation_checkpointing",
                format!(
                    "must be 0 (off), 1 (every layer) or k ≤ {MAX_CHECKPOINT_INTERVAL} (every \
                     k-th layer), got {}",
                    self.activation_checkpointing
                ),
            ));
        }
        Ok(())
    }
}

impl ReplayConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        at_least(
            "replay.segment_bytes",
            self.segment_bytes,
            MIN_SEGMENT_BYTES,
        )?;
        at_least("replay.max_segments", self.max_segments as u64, 2)?;
        at_least("replay.max_inflight", self.max_inflight as u64, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        actor: ActorArgs,
        #[command(flatten)]
        learner: LearnerArgs,
        #[command(flatten)]
        replay: ReplayArgs,
    }

    #[test]
    fn flags_override_only_what_was_given() {
        let cli = Cli::parse_from(["x", "--gen-batch", "32", "--learner-threads", "4"]);
        let mut actor = ActorConfig {
            top_k: 50,
            ..ActorConfig::default()
        };
        cli.actor.apply(&mut actor);
        assert_eq!(actor.gen_batch, 32);
        assert_eq!(actor.top_k, 50, "a flag left out keeps the file's value");
        let mut learner = LearnerConfig::default();
        cli.learner.apply(&mut learner);
        assert_eq!(learner.threads, 4);
        assert!(cli.replay.is_empty());
    }

    #[test]
    fn every_flag_has_help() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        for arg in cmd.get_arguments() {
            if arg.get_id() == "help" {
                continue;
            }
            assert!(arg.get_help().is_some(), "--{} has no help", arg.get_id());
        }
    }
}
