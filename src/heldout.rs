//! The held-out table of a run: every RL domain's held-out score after the SFT stages (row
//! `sft`) and after each RL stage, measured on the stage-final snapshots (which retention keeps).
//! Written to `RUN_DIR/heldout.json` as `{"domains": [...], "rows": [{"after_stage": ...,
//! "scores": {...}}]}`; the score of a domain is the mean reward of `[eval] samples` sampled
//! responses per held-out prompt, with the domain's training verifier.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use cascade_actor::dataset::Dataset;
use cascade_actor::eval::{evaluate, EvalOptions};
use cascade_actor::run::verifier_for;
use cascade_learner::snapshot;
use cascade_rewards::Verifier;
use cascade_shared::chat::Chat;
use cascade_shared::config::RunConfig;
use cascade_shared::metrics::MetricsLog;
use cascade_shared::model::load_model;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// One row: the scores after a stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldoutRow {
    /// `sft` or the RL stage's name.
    pub after_stage: String,
    /// Domain → score.
    pub scores: BTreeMap<String, f64>,
    /// The snapshot evaluated.
    pub policy_version: u64,
}

/// The whole table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldoutTable {
    /// The RL domains with a held-out set, in cascade order.
    pub domains: Vec<String>,
    /// Rows in cascade order.
    pub rows: Vec<HeldoutRow>,
}

struct Domain {
    name: String,
    stage: usize,
    dataset: Dataset,
    verifier: Arc<dyn Verifier>,
}

/// Stage-final snapshots by the stage index they point at (the stage after the one they end).
fn stage_final_snapshots(run_dir: &Path) -> anyhow::Result<BTreeMap<u32, (u64, PathBuf)>> {
    let dir = run_dir.join("snapshots");
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !name.starts_with('v') || name.contains('.') {
            continue;
        }
        let loaded = match snapshot::load_snapshot(&path) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("held-out table: skipping {}: {e}", path.display());
                continue;
            }
        };
        if loaded.info.manifest.stage_final {
            // The newest snapshot that points at a stage wins (a resumed run may repeat one).
            let e = out
                .entry(loaded.state.stage_index)
                .or_insert((loaded.info.version, path.clone()));
            if loaded.info.version > e.0 {
                *e = (loaded.info.version, path);
            }
        }
    }
    Ok(out)
}

/// Evaluates the run's stage-final snapshots on every held-out set; `None` when no RL stage has
/// a held-out set.
pub fn evaluate_run(
    config: &RunConfig,
    run_dir: &Path,
    metrics: &MetricsLog,
) -> anyhow::Result<Option<HeldoutTable>> {
    let device = cascade_shared::device::parse_device(&config.devices.learner.to_string())
        .map_err(|e| anyhow::anyhow!(e))?;
    let mut domains = Vec::new();
    for (i, stage) in config.stages.iter().enumerate() {
        let Some(heldout) = &stage.heldout else {
            continue;
        };
        if !stage.is_rl()
            || domains
                .iter()
                .any(|d: &Domain| d.name == stage.kind.as_str())
        {
            continue;
        }
        let rm_dir = config.reward_model_dir(i, run_dir);
        let judge = stage.verifier.swe_judge.as_ref().map(|p| config.resolve(p));
        let verifier = verifier_for(
            stage.kind,
            &stage.verifier,
            rm_dir.as_deref(),
            judge.as_deref(),
            &device,
        )
        .with_context(|| format!("the verifier of stage {}", stage.name))?;
        domains.push(Domain {
            name: stage.kind.as_str().to_string(),
            stage: i,
            dataset: Dataset::load(config.resolve(heldout), stage.kind)?,
            verifier,
        });
    }
    if domains.is_empty() {
        return Ok(None);
    }
    let finals = stage_final_snapshots(run_dir)?;
    let first_rl = config.stages.iter().position(|s| s.is_rl()).unwrap_or(0) as u32;
    let mut wanted: Vec<(String, u32)> = vec![("sft".to_string(), first_rl)];
    for (i, s) in config.stages.iter().enumerate() {
        if s.is_rl() {
            wanted.push((s.name.clone(), i as u32 + 1));
        }
    }
    // Rows are independent: each worker loads one stage-final snapshot at a time and runs every
    // domain on it. Decoding a small model is mostly per-op overhead, so two rows side by side
    // use two cores where one row would leave the second idle.
    let jobs: Vec<(String, u64, PathBuf)> = wanted
        .into_iter()
        .filter_map(|(after_stage, index)| match finals.get(&index) {
            Some((version, dir)) => Some((after_stage, *version, dir.clone())),
            None => {
                tracing::warn!("held-out table: no stage-final snapshot after {after_stage}");
                None
            }
        })
        .collect();
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 4)
        .min(jobs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<anyhow::Result<HeldoutRow>>>> =
        jobs.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((after_stage, version, dir)) = jobs.get(i) else {
                    break;
                };
                let row = evaluate_row(
                    config,
                    &domains,
                    after_stage,
                    *version,
                    dir,
                    &device,
                    metrics,
                );
                *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(row);
            });
        }
    });
    let mut rows = Vec::new();
    for r in results {
        if let Some(row) = r.into_inner().unwrap_or_else(|e| e.into_inner()) {
            rows.push(row?);
        }
    }
    let table = HeldoutTable {
        domains: domains.into_iter().map(|d| d.name).collect(),
        rows,
    };
    let path = run_dir.join("heldout.json");
    let tmp = run_dir.join("heldout.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&table)?)?;
    std::fs::rename(&tmp, &path)?;
    Ok(Some(table))
}

/// Scores one stage-final snapshot on every domain's held-out set.
fn evaluate_row(
    config: &RunConfig,
    domains: &[Domain],
    after_stage: &str,
    version: u64,
    dir: &Path,
    device: &candle_core::Device,
    metrics: &MetricsLog,
) -> anyhow::Result<HeldoutRow> {
    let model = load_model(dir, device).with_context(|| format!("loading {}", dir.display()))?;
    let chat = Chat::from_dir(dir)?;
    let mut scores = BTreeMap::new();
    for d in domains {
        let stage = &config.stages[d.stage];
        let result = evaluate(
            model.clone(),
            &chat,
            &d.dataset,
            d.verifier.clone(),
            &EvalOptions {
                samples: config.eval.samples,
                temperature: config.eval.temperature,
                top_p: config.eval.top_p,
                max_new_tokens: stage
                    .max_response_tokens_at(stage.steps, config.actor.max_new_tokens),
                mode: None,
                mode_mix: stage.mode_mix,
                seed: config.eval.seed,
                gen_batch: (config.actor.gen_batch * stage.group_size).clamp(1, 64),
                max_prompts: config.eval.max_prompts,
            },
        )?;
        metrics.emit(
            "eval",
            json!({
                "after_stage": after_stage,
                "domain": d.name,
                "policy_version": version,
                "score": result.all.mean_reward,
                "pass_at_1": result.all.pass_at_1,
                "prompts": result.all.prompts,
                "by_mode": result.by_mode,
            }),
        );
        scores.insert(d.name.clone(), result.all.mean_reward);
    }
    Ok(HeldoutRow {
        after_stage: after_stage.to_string(),
        scores,
        policy_version: version,
    })
}

/// The table as aligned text.
pub fn format_table(table: &HeldoutTable) -> String {
    let mut out = format!("{:<12}", "after stage");
    for d in &table.domains {
        out.push_str(&format!("{d:>9}"));
    }
    out.push('\n');
    for row in &table.rows {
        out.push_str(&format!("{:<12}", row.after_stage));
        for d in &table.domains {
            match row.scores.get(d) {
                Some(s) => out.push_str(&format!("{s:>9.3}")),
                None => out.push_str(&format!("{:>9}", "-")),
            }
        }
        out.push('\n');
    }
    out
}
