//! `cascade learner`: the learner process — SFT, reward-model training and GRPO stage after
//! stage, publishing snapshots to `RUN_DIR/snapshots/`; SIGTERM publishes a final snapshot.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;
use cascade_learner::run::{run_learner, LearnerExit, LearnerOptions};
use cascade_shared::config::{ConfigArgs, LearnerArgs as LearnerKnobs};
use cascade_shared::device::parse_device;
use clap::Args;

/// Arguments of `cascade learner`.
#[derive(Args, Debug)]
pub struct LearnerCmdArgs {
    /// The run directory shared with the actors.
    #[arg(long)]
    pub run_dir: PathBuf,
    /// The run configuration (TOML).
    #[arg(long)]
    pub config: PathBuf,
    /// Compute device: `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Continue from the newest complete snapshot of the run directory.
    #[arg(long)]
    pub resume: bool,
    /// Override any config key (`--set stages.math.lr=1e-6`); repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Learner knobs (override `[learner]`).
    #[command(flatten)]
    pub knobs: LearnerKnobs,
    /// Stop (publishing a snapshot) after this many optimizer steps.
    #[arg(long)]
    pub max_steps: Option<u64>,
}

/// Runs `cascade learner`.
pub fn run(args: LearnerCmdArgs) -> anyhow::Result<i32> {
    let device = parse_device(&args.device).map_err(|e| anyhow::anyhow!("--device: {e}"))?;
    let config = ConfigArgs {
        config: Some(args.config.clone()),
        set: args.set.clone(),
        learner: args.knobs.clone(),
        ..ConfigArgs::default()
    }
    .load("", std::path::Path::new("."))
    .with_context(|| format!("loading {}", args.config.display()))?;
    config.check_files()?;
    if config.learner.threads > 0 {
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(config.learner.threads)
            .build_global();
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing a signal handler")?;
    }
    let opts = LearnerOptions {
        run_dir: args.run_dir,
        device,
        config,
        resume: args.resume,
        max_steps: args.max_steps,
    };
    let summary = run_learner(&opts, stop)?;
    eprintln!(
        "learner {}: {} steps, policy version {}, idle {:.1}s of {:.1}s",
        match summary.exit {
            LearnerExit::Completed => "completed",
            LearnerExit::Stopped => "stopped",
        },
        summary.steps,
        summary.policy_version,
        summary.idle_s,
        summary.wall_s
    );
    Ok(0)
}
