//! `cascade run`: the whole cascade. Starts the learner and N actors as child processes of this
//! executable, supervises them, shows progress, evaluates every stage on the held-out sets and
//! writes the report.
//!
//! - **Fresh run**: the config (a file, or the embedded tiny default, whose model config and
//!   synthetic data are written into `RUN_DIR/inputs/`) is validated before anything is created,
//!   then saved with absolute paths and every command-line override as `RUN_DIR/config.toml`;
//!   the children read that file.
//! - **Supervision**: an actor that dies is restarted (at most `--max-restarts` times each); the
//!   learner dying stops the run with the command that resumes it; SIGINT/SIGTERM is forwarded
//!   (the learner publishes a final snapshot) and everything stops. Each child logs to
//!   `RUN_DIR/logs/NAME.log`; starts, exits and restarts go to `metrics.jsonl` as `process`
//!   events with the child's peak RSS.
//! - **Resume**: `--resume RUN_DIR` continues from the newest complete snapshot.
//! - **Held-out table**: each stage-final snapshot is evaluated on every held-out set while the
//!   later stages train (`eval.during_run`, CPU learners), the rest after training; the table
//!   (`heldout.json`) is printed at the end.
//! - **End**: the held-out table, a `run_end` event and `report/index.html`.
//!
//! - **Seeds**: `--seeds N` runs the whole thing N times with different seeds and summarises
//!   the held-out table across them (`seeds`).
//!
//! One file per concept: `config` (the run directory and the saved config), `supervisor` (the
//! child processes), `progress` (the live view from `metrics.jsonl`).

mod config;
mod progress;
mod seeds;
mod supervisor;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use cascade_shared::config::ConfigArgs;
use cascade_shared::metrics::{unix_now, MetricsLog, RunEnd, RunStart, HELDOUT_FILE, METRICS_FILE};
use clap::Args;

use crate::heldout;
use config::ConfigProblem;
pub use config::{TINY_MODEL_JSON, TINY_TOML};
use progress::Progress;
use supervisor::{Outcome, Supervisor};

/// Arguments of `cascade run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// The run configuration and overrides (default: the embedded tiny default).
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The run directory (default `runs/tiny` for the embedded default).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Continue the run in this directory from its newest complete snapshot.
    #[arg(long, value_name = "RUN_DIR", conflicts_with = "run_dir")]
    pub resume: Option<PathBuf>,
    /// Number of actor processes (default: `devices.num_actors` or one per actor device).
    #[arg(long)]
    pub actors: Option<usize>,
    /// Learner device(s): `cpu`, `cuda:N`, or one rank per device of a range `cuda:A-B` or a
    /// comma-separated list (`cuda:4,cuda:6`), as `devices.learner`.
    #[arg(long, alias = "learner-devices")]
    pub learner_device: Option<String>,
    /// Learner processes working as one learner (data-parallel, optimizer state sharded;
    /// default `devices.learner_ranks` or 1). On `cuda:N` rank r uses `cuda:N+r`.
    #[arg(long)]
    pub learner_ranks: Option<usize>,
    /// Actor devices: `cpu`, `cuda:N` or a range `cuda:A-B` (actors are assigned round-robin).
    #[arg(long)]
    pub actor_devices: Option<String>,
    /// Restarts allowed per actor before the run gives up on it.
    #[arg(long, default_value_t = 10)]
    pub max_restarts: u32,
    /// Skip the held-out evaluation at the end.
    #[arg(long)]
    pub no_eval: bool,
    /// Start even when the memory plan (`cascade plan`) says a stage does not fit.
    #[arg(long)]
    pub skip_memory_check: bool,
    /// Run the whole thing N times with seeds `--seed-base` … `--seed-base + N − 1` (model
    /// initialisation, actors, learner) in `RUN_DIR/seed-S`, then summarise the held-out table
    /// across seeds (mean ± spread, each stage's own gain per seed, its changes to the other
    /// domains) in `RUN_DIR/seeds.json` and `RUN_DIR/report/`. Running the same command again
    /// continues an interrupted multi-seed run.
    #[arg(long, value_name = "N", conflicts_with = "resume")]
    pub seeds: Option<u32>,
    /// The first seed of `--seeds`.
    #[arg(long, default_value_t = 0, requires = "seeds")]
    pub seed_base: u64,
}

/// Runs `cascade run`.
pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    if let Some(n) = args.seeds {
        return seeds::run(args, n);
    }
    let started = Instant::now();
    // 1. The config, validated before anything is created.
    let (run_dir, resuming) = match config::run_dir(&args) {
        Ok(d) => d,
        Err(ConfigProblem(msg)) => {
            eprintln!("error: {msg}");
            return Ok(2);
        }
    };
    let (config, config_path) = match config::prepare(&args, &run_dir, resuming)? {
        Ok(c) => c,
        Err(ConfigProblem(msg)) => {
            eprintln!("error: {msg}");
            return Ok(2);
        }
    };

    let metrics = Arc::new(MetricsLog::open(run_dir.join(METRICS_FILE), "supervisor")?);
    let actors = config.devices.actor_assignment();
    let max_staleness = config.learner.max_staleness;
    metrics.record(&RunStart {
        config: Some(config_path.display().to_string()),
        max_staleness: Some(max_staleness),
        actors: Some(actors.len().into()),
        resume: Some(resuming),
    });
    let learner_devices = config.devices.learner_devices();
    eprintln!(
        "cascade run: {} stages, learner on {}, {} actor(s), run directory {}",
        config.stages.len(),
        if learner_devices.len() == 1 {
            config.devices.learner.to_string()
        } else {
            format!(
                "{} ranks ({})",
                learner_devices.len(),
                learner_devices
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
        actors.len(),
        run_dir.display()
    );
    let run_end = |status: &str| RunEnd {
        wall_s: Some(started.elapsed().as_secs_f64()),
        status: Some(status.into()),
        max_staleness: Some(max_staleness),
        ..RunEnd::default()
    };

    // 2. The children.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing a signal handler")?;
    }
    let mut children =
        Supervisor::start(&config, &config_path, &run_dir, &metrics, args.max_restarts)?;
    let mut progress = Progress::new(&run_dir);
    let mut evaluator = if config.eval.enabled && !args.no_eval {
        heldout::Evaluator::new(&config, &run_dir, metrics.clone(), progress.printer())?
    } else {
        None
    };
    if let Some(e) = &mut evaluator {
        if config.eval.during_run
            && learner_devices
                .iter()
                .all(|d| *d == cascade_shared::config::Device::Cpu)
        {
            e.start()?;
        }
    }

    // 3. Supervise.
    let learner_result = match children.supervise(&stop, &mut progress)? {
        Outcome::Interrupted => {
            metrics.record(&run_end("stopped"));
            eprintln!(
                "stopped. Resume with: cascade run --resume {}",
                run_dir.display()
            );
            return Ok(130);
        }
        Outcome::LearnerExited(result) => result,
    };
    progress.update();
    progress.finish();
    children.stop_actors(Duration::from_secs(30));
    if let Err(status) = learner_result {
        metrics.record(&run_end("failed"));
        eprintln!(
            "error: the learner stopped ({status}); see {}. Resume with: cascade run --resume {}",
            run_dir.join("logs").join("learner*.log").display(),
            run_dir.display()
        );
        return Ok(1);
    }
    let train_s = started.elapsed().as_secs_f64();
    eprintln!("training done in {train_s:.1} s");

    // 4. Held-out table, run_end, report.
    if let Some(evaluator) = evaluator {
        let t0 = Instant::now();
        let table = evaluator.finish()?;
        eprintln!("{}", heldout::format_table(&table));
        eprintln!(
            "held-out evaluation: {:.1} s after training; written to {}",
            t0.elapsed().as_secs_f64(),
            run_dir.join(HELDOUT_FILE).display()
        );
    }
    metrics.record(&RunEnd {
        train_s: Some(train_s),
        t_end: Some(unix_now()),
        ..run_end("completed")
    });
    match cascade_report::write_report(&run_dir, &cascade_report::ReportOptions { compare: None }) {
        Ok(s) => eprintln!("report: {}", s.index_html.display()),
        Err(e) => eprintln!("warning: the report could not be written: {e}"),
    }
    eprintln!(
        "run completed in {:.1} s ({})",
        started.elapsed().as_secs_f64(),
        run_dir.display()
    );
    Ok(0)
}
