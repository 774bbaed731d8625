//! `cascade learner`: the learner process — SFT, reward-model training and GRPO stage after
//! stage, publishing snapshots to `RUN_DIR/snapshots/`; SIGTERM publishes a final snapshot.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;
use cascade_learner::run::{run_learner_in_group, LearnerExit, LearnerOptions};
use cascade_shared::collective::{GroupFlags, GroupSpec};
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
    /// This process's rank in a learner group (else `RANK` or `SLURM_PROCID`; default 0).
    #[arg(long)]
    pub rank: Option<usize>,
    /// Number of learner processes in the group (else `WORLD_SIZE` or `SLURM_NTASKS`;
    /// default 1).
    #[arg(long)]
    pub world_size: Option<usize>,
    /// `HOST:PORT` where rank 0 listens for the other ranks (else `MASTER_ADDR:MASTER_PORT`).
    #[arg(long, value_name = "HOST:PORT")]
    pub rendezvous: Option<String>,
    /// Seconds a rank waits for another in a collective (and for the group to gather at
    /// start) before it stops with an error naming the rank.
    #[arg(long, default_value_t = 300.0)]
    pub group_timeout: f64,
    /// Collectives of a learner group: `nccl` (the GPU backend; CUDA learners, a binary built
    /// with the `nccl` feature, NCCL's `libnccl.so.2` at run time), `tcp` (the
    /// CPU backend, also for GPU ranks: through host memory), or `auto` (NCCL for a group of
    /// CUDA learners where the binary has it, else TCP).
    #[arg(long, default_value = "auto", value_parser = ["auto", "tcp", "nccl"])]
    pub collectives: String,
}

/// FNV-1a of the config as every rank loaded it: ranks that loaded different configs refuse
/// to form a group.
fn config_hash(config: &cascade_shared::config::RunConfig) -> anyhow::Result<u64> {
    let bytes = serde_json::to_vec(config).context("serialising the config")?;
    Ok(bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    }))
}

/// The group's collectives as `--collectives` asks: the TCP group as joined, or NCCL over it.
fn with_collectives(
    group: Box<dyn cascade_shared::collective::Collective>,
    choice: &str,
    device: &str,
    spec: &GroupSpec,
    timeout_s: f64,
) -> anyhow::Result<Box<dyn cascade_shared::collective::Collective>> {
    let ordinal = device
        .strip_prefix("cuda:")
        .and_then(|n| n.parse::<usize>().ok());
    let nccl = match (choice, ordinal) {
        ("tcp", _) => false,
        ("nccl", None) => {
            anyhow::bail!("--collectives nccl needs a CUDA learner (--device cuda:N)")
        }
        ("nccl", Some(_)) => true,
        _ => ordinal.is_some() && spec.world > 1 && cfg!(feature = "nccl"),
    };
    if !nccl {
        return Ok(group);
    }
    #[cfg(feature = "nccl")]
    {
        let nccl = cascade_shared::nccl::NcclGroup::new(
            group,
            ordinal.unwrap_or(0),
            std::time::Duration::from_secs_f64(timeout_s),
        )
        .with_context(|| format!("rank {} of {}: NCCL on {device}", spec.rank, spec.world))?;
        Ok(Box::new(nccl))
    }
    #[cfg(not(feature = "nccl"))]
    {
        let _ = (group, timeout_s);
        anyhow::bail!("--collectives nccl: this binary was built without the nccl feature")
    }
}

/// Runs `cascade learner`.
pub fn run(args: LearnerCmdArgs) -> anyhow::Result<i32> {
    let spec = GroupSpec::resolve(
        &GroupFlags {
            rank: args.rank,
            world_size: args.world_size,
            rendezvous: args.rendezvous.clone(),
        },
        |k| std::env::var(k).ok(),
    )
    .map_err(|e| anyhow::anyhow!("learner group: {e}"))?;
    if !(args.group_timeout.is_finite() && args.group_timeout > 0.0) {
        anyhow::bail!(
            "--group-timeout {} must be a positive number of seconds",
            args.group_timeout
        );
    }
    // `--device cuda` in a group: the device of this rank on its node.
    let device_name = if args.device == "cuda" {
        format!("cuda:{}", spec.local_rank.unwrap_or(0))
    } else {
        args.device.clone()
    };
    let device = parse_device(&device_name).map_err(|e| anyhow::anyhow!("--device: {e}"))?;
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
    let group = spec
        .join(
            config_hash(&opts.config)?,
            std::time::Duration::from_secs_f64(args.group_timeout),
        )
        .with_context(|| {
            format!(
                "rank {} of {} joining the learner group at {}",
                spec.rank, spec.world, spec.rendezvous
            )
        })?;
    let group = with_collectives(
        group,
        &args.collectives,
        &device_name,
        &spec,
        args.group_timeout,
    )?;
    if spec.world > 1 {
        tracing::info!(
            "learner rank {} of {} (rendezvous {})",
            spec.rank,
            spec.world,
            spec.rendezvous
        );
    }
    let summary = run_learner_in_group(&opts, stop, group)?;
    eprintln!(
        "learner{} {}: {} steps, policy version {}, idle {:.1}s of {:.1}s",
        if spec.world > 1 {
            format!(" rank {} of {}", spec.rank, spec.world)
        } else {
            String::new()
        },
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
