//! `cascade run --seeds N`: the same run N times, differing only in its seeds, then the held-out
//! table across seeds (`RUN_DIR/seeds.json`, printed, and `RUN_DIR/report/index.html`).
//!
//! Seed `s` (from `--seed-base`, default 0, to `--seed-base + N − 1`) runs in `RUN_DIR/seed-s`
//! with `model.init.seed` (when the model is initialised, not loaded), `actor.seed` and
//! `learner.seed` set to `s`; the data and the held-out evaluation's sampler seed stay as
//! configured, so every seed is scored on the same prompts with the same draws. Seeds run one
//! after the other (each uses the whole machine). Running the same command again continues: a
//! seed whose run completed is read back, an interrupted one is resumed from its snapshots, the
//! rest start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use cascade_shared::config::RunConfig;
use cascade_shared::metrics::{
    parse_metrics, EventKind, HeldoutTable, SeedGoals, SeedRun, SeedsSummary, HELDOUT_FILE,
    METRICS_FILE, SEEDS_FILE,
};

use super::RunArgs;

/// The embedded default's wall-clock budget for one whole run (issue 19: 15 minutes on 2 cores).
const TINY_BUDGET_S: f64 = 900.0;

/// Runs `cascade run --seeds N`.
pub(super) fn run(args: RunArgs, n: u32) -> anyhow::Result<i32> {
    if n == 0 {
        eprintln!("error: --seeds: must be at least 1");
        return Ok(2);
    }
    if args.resume.is_some() {
        eprintln!(
            "error: --seeds: continue a multi-seed run with the same `cascade run --seeds N --run-dir DIR` (it resumes each seed)"
        );
        return Ok(2);
    }
    if args.no_eval {
        eprintln!("error: --seeds: the seeds are compared on the held-out table; drop --no-eval");
        return Ok(2);
    }
    let embedded = args.config.config.is_none();
    let dir = match (&args.run_dir, embedded) {
        (Some(d), _) => d.clone(),
        (None, true) => PathBuf::from("runs/tiny-seeds"),
        (None, false) => {
            eprintln!("error: --run-dir: a run with --config needs a run directory");
            return Ok(2);
        }
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;

    let mut runs = Vec::new();
    let mut own: BTreeMap<String, String> = BTreeMap::new();
    for seed in args.seed_base..args.seed_base + u64::from(n) {
        let seed_dir = dir.join(format!("seed-{seed}"));
        if !completed(&seed_dir) {
            let mut one = args.clone();
            one.seeds = None;
            if seed_dir.join("config.toml").exists() {
                eprintln!(
                    "cascade run --seeds: resuming seed {seed} ({})",
                    seed_dir.display()
                );
                one.resume = Some(seed_dir.clone());
                one.run_dir = None;
            } else {
                eprintln!("cascade run --seeds: seed {seed} ({})", seed_dir.display());
                one.run_dir = Some(seed_dir.clone());
            }
            one.config.set.extend(seed_overrides(&args, seed)?);
            let code = super::run(one)?;
            if code != 0 {
                eprintln!(
                    "cascade run --seeds: seed {seed} stopped (exit code {code}); run the same command again to continue"
                );
                return Ok(code);
            }
        } else {
            eprintln!(
                "cascade run --seeds: seed {seed} already completed ({})",
                seed_dir.display()
            );
        }
        let config = RunConfig::load(seed_dir.join("config.toml"), &[])
            .with_context(|| format!("reading {}", seed_dir.join("config.toml").display()))?;
        own.extend(
            config
                .stages
                .iter()
                .filter(|s| s.is_rl())
                .map(|s| (s.name.clone(), s.kind.as_str().to_string())),
        );
        runs.push(read_seed(&seed_dir, seed)?);
    }

    let goals = SeedGoals {
        wall_s: embedded.then_some(TINY_BUDGET_S),
        ..SeedGoals::default()
    };
    let summary = SeedsSummary::new(runs, &own, goals);
    let path = dir.join(SEEDS_FILE);
    let tmp = dir.join(format!("{SEEDS_FILE}.tmp"));
    std::fs::write(&tmp, serde_json::to_string_pretty(&summary)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("\n{}", summary.format());
    eprintln!("written to {}", path.display());
    match cascade_report::write_seeds_report(&dir, &summary) {
        Ok(p) => eprintln!("report: {}", p.display()),
        Err(e) => eprintln!("warning: the report could not be written: {e}"),
    }
    Ok(0)
}

/// The `--set` overrides that make seed `seed`'s run: the model's initialisation (only when
/// the config initialises one), the actors' and the learner's seeds.
fn seed_overrides(args: &RunArgs, seed: u64) -> anyhow::Result<Vec<String>> {
    let initialised = match &args.config.config {
        None => true,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let value: toml::Value =
                toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
            value.get("model").and_then(|m| m.get("init")).is_some()
        }
    };
    let mut out = vec![format!("actor.seed={seed}"), format!("learner.seed={seed}")];
    if initialised {
        out.push(format!("model.init.seed={seed}"));
    }
    Ok(out)
}

/// Whether the run in `dir` completed: its last `run_end` says so and its held-out table exists.
fn completed(dir: &Path) -> bool {
    dir.join(HELDOUT_FILE).exists()
        && last_run_end(dir).is_some_and(|(status, _)| status == "completed")
}

/// The status and wall-clock seconds of the run's last `run_end` event.
fn last_run_end(dir: &Path) -> Option<(String, Option<f64>)> {
    let bytes = std::fs::read(dir.join(METRICS_FILE)).ok()?;
    parse_metrics(&bytes)
        .events
        .into_iter()
        .rev()
        .find_map(|e| match e.kind {
            EventKind::RunEnd(r) => Some((r.status.clone().unwrap_or_default(), r.wall_s)),
            _ => None,
        })
}

fn read_seed(dir: &Path, seed: u64) -> anyhow::Result<SeedRun> {
    let path = dir.join(HELDOUT_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let table: HeldoutTable =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    Ok(SeedRun {
        seed,
        run_dir: dir.display().to_string(),
        wall_s: last_run_end(dir).and_then(|(_, w)| w),
        table,
    })
}
