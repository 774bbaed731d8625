//! `cascade actor`: one rollout actor — generates groups for the current stage with the newest
//! snapshot's weights, scores them and writes them to its replay log until SIGTERM.

use std::path::PathBuf;

use anyhow::Context;
use cascade_actor::run::{run_actor, ActorOptions, RolloutOverrides};
use cascade_shared::config::{ActorArgs as ActorKnobs, ConfigArgs};
use cascade_shared::device::parse_device;
use clap::Args;

/// Arguments of `cascade actor`.
#[derive(Args, Debug)]
pub struct ActorArgs {
    /// The run directory shared with the learner (`snapshots/`, `replay/`).
    #[arg(long)]
    pub run_dir: PathBuf,
    /// This actor's id (its replay stream is `replay/actor-ID`, its ack `snapshots/acks/actor-ID`).
    #[arg(long, default_value_t = 0)]
    pub actor_id: u32,
    /// Compute device: `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// The run configuration (TOML).
    #[arg(long)]
    pub config: PathBuf,
    /// Override any config key (`--set stages.math.group_size=16`); repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Rows decoded together (continuous batching slots).
    #[arg(long)]
    pub gen_batch: Option<usize>,
    /// Max response tokens (replaces the stage's value and curriculum).
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Samples per prompt G (replaces the stage's value).
    #[arg(long)]
    pub group_size: Option<usize>,
    /// Sampling temperature (replaces the stage's value).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Nucleus threshold, 0 < p ≤ 1 (replaces the stage's value).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Reward worker threads.
    #[arg(long)]
    pub reward_workers: Option<usize>,
    /// Compute threads (0 = the runtime's default).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Base seed of the samplers.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop after this many groups (default: run until SIGTERM).
    #[arg(long)]
    pub max_groups: Option<u64>,
}

/// Runs `cascade actor`.
pub fn run(args: ActorArgs) -> anyhow::Result<i32> {
    let device = parse_device(&args.device).map_err(|e| anyhow::anyhow!("--device: {e}"))?;
    let config_args = ConfigArgs {
        config: Some(args.config.clone()),
        set: args.set.clone(),
        actor: ActorKnobs {
            gen_batch: args.gen_batch,
            max_new_tokens: args.max_new_tokens,
            top_k: args.top_k,
            reward_workers: args.reward_workers,
            threads: args.threads,
            seed: args.seed,
            ..ActorKnobs::default()
        },
        ..ConfigArgs::default()
    };
    let config = config_args
        .load("", std::path::Path::new("."))
        .with_context(|| format!("loading {}", args.config.display()))?;
    std::fs::create_dir_all(&args.run_dir)
        .with_context(|| format!("creating {}", args.run_dir.display()))?;
    let opts = ActorOptions {
        run_dir: args.run_dir,
        actor_id: args.actor_id,
        device,
        config,
        overrides: RolloutOverrides {
            group_size: args.group_size,
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            max_new_tokens: args.max_new_tokens,
        },
        max_groups: args.max_groups,
    };
    let summary = run_actor(opts)?;
    eprintln!(
        "actor: {} groups, {} tokens ({:.1} tok/s), {} prompts skipped, {} snapshots loaded, {} refused",
        summary.groups,
        summary.tokens,
        summary.tokens_per_s,
        summary.skipped_prompts,
        summary.snapshots_loaded,
        summary.snapshots_refused
    );
    if summary.holds > 0 {
        eprintln!(
            "actor: held {} times ({:.1} s) while the learner trained on a decided on-policy batch",
            summary.holds, summary.held_s
        );
    }
    Ok(0)
}
