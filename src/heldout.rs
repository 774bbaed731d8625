//! The held-out table of a run: every RL domain's held-out score after the SFT stages (row
//! `sft`) and after each RL stage, measured on the stage-final snapshots (which retention keeps).
//! Written to `RUN_DIR/heldout.json` as `{"domains": [...], "rows": [{"after_stage": ...,
//! "scores": {...}}]}`; the score of a domain is the mean reward of `[eval] samples` sampled
//! responses per held-out prompt, with the domain's training verifier.
//!
//! Each row also keeps every prompt's mean reward (`prompt_scores`) and the standard error of
//! each score over prompts (`stderr`). Rows are evaluated on the same prompts with the same
//! sampler seeds, so the change a stage makes to its own domain is measured as a paired
//! difference over prompts (`gains`: mean difference and its standard error), which is much
//! less noisy than the difference of two means.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use cascade_actor::dataset::Dataset;
use cascade_actor::eval::{evaluate, mean_and_se, EvalOptions};
use cascade_actor::verifiers::verifier_for;
use cascade_rewards::Verifier;
use cascade_shared::chat::Chat;
use cascade_shared::config::RunConfig;
use cascade_shared::metrics::MetricsLog;
use cascade_shared::model::load_model;
use cascade_shared::snapshot;
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
    /// Domain → standard error of the score over prompts.
    #[serde(default)]
    pub stderr: BTreeMap<String, f64>,
    /// Domain → prompt id → that prompt's mean reward.
    #[serde(default)]
    pub prompt_scores: BTreeMap<String, BTreeMap<u64, f64>>,
}

/// What an RL stage did to its own domain: the paired difference against the previous row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageGain {
    /// The RL stage (its row's `after_stage`).
    pub stage: String,
    /// Its domain.
    pub domain: String,
    /// The previous row's score.
    pub before: f64,
    /// This row's score.
    pub after: f64,
    /// Mean over the prompts scored in both rows of (after − before).
    pub diff: f64,
    /// Standard error of `diff` (paired over prompts).
    pub se: f64,
    /// Prompts in the comparison.
    pub prompts: usize,
}

/// The whole table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldoutTable {
    /// The RL domains with a held-out set, in cascade order.
    pub domains: Vec<String>,
    /// Rows in cascade order.
    pub rows: Vec<HeldoutRow>,
    /// Each RL stage's change to its own domain's score (see [`stage_gains`]).
    #[serde(default)]
    pub gains: Vec<StageGain>,
}

/// For every row after an RL stage whose kind has a held-out domain: the paired difference of
/// that domain's prompt scores against the previous row. `stage_kinds` maps stage names to
/// their kinds (the domain names).
pub fn stage_gains(rows: &[HeldoutRow], stage_kinds: &BTreeMap<String, String>) -> Vec<StageGain> {
    let mut out = Vec::new();
    for pair in rows.windows(2) {
        let (prev, row) = (&pair[0], &pair[1]);
        let Some(domain) = stage_kinds.get(&row.after_stage) else {
            continue;
        };
        let (Some(before), Some(after)) = (prev.scores.get(domain), row.scores.get(domain)) else {
            continue;
        };
        let (Some(a), Some(b)) = (
            prev.prompt_scores.get(domain),
            row.prompt_scores.get(domain),
        ) else {
            continue;
        };
        let diffs: Vec<f64> = b
            .iter()
            .filter_map(|(id, after)| a.get(id).map(|before| after - before))
            .collect();
        let (diff, se) = mean_and_se(&diffs);
        out.push(StageGain {
            stage: row.after_stage.clone(),
            domain: domain.clone(),
            before: *before,
            after: *after,
            diff,
            se,
            prompts: diffs.len(),
        });
    }
    out
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
    let kinds: BTreeMap<String, String> = config
        .stages
        .iter()
        .filter(|s| s.is_rl())
        .map(|s| (s.name.clone(), s.kind.as_str().to_string()))
        .collect();
    let table = HeldoutTable {
        domains: domains.into_iter().map(|d| d.name).collect(),
        gains: stage_gains(&rows, &kinds),
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
    let mut stderr = BTreeMap::new();
    let mut prompt_scores = BTreeMap::new();
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
                "score_se": result.all.mean_reward_se,
                "pass_at_1": result.all.pass_at_1,
                "prompts": result.all.prompts,
                "by_mode": result.by_mode,
            }),
        );
        scores.insert(d.name.clone(), result.all.mean_reward);
        stderr.insert(d.name.clone(), result.all.mean_reward_se);
        prompt_scores.insert(d.name.clone(), result.prompt_scores);
    }
    Ok(HeldoutRow {
        after_stage: after_stage.to_string(),
        scores,
        policy_version: version,
        stderr,
        prompt_scores,
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
    if !table.gains.is_empty() {
        out.push_str(
            "\neach RL stage on its own domain (paired over the same prompts, ± 1 s.e.):\n",
        );
        for g in &table.gains {
            let verdict = if g.diff > 2.0 * g.se {
                "up"
            } else if g.diff < -2.0 * g.se {
                "DOWN"
            } else {
                "within 2 s.e."
            };
            out.push_str(&format!(
                "  {:<10} {:<6} {:>8.3} → {:>7.3}   {:+.3} ± {:.3}   {verdict}\n",
                g.stage, g.domain, g.before, g.after, g.diff, g.se
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(stage: &str, domain: &str, scores: &[(u64, f64)]) -> HeldoutRow {
        let per: BTreeMap<u64, f64> = scores.iter().copied().collect();
        let (mean, se) = mean_and_se(&per.values().copied().collect::<Vec<_>>());
        HeldoutRow {
            after_stage: stage.into(),
            scores: [(domain.to_string(), mean)].into(),
            policy_version: 0,
            stderr: [(domain.to_string(), se)].into(),
            prompt_scores: [(domain.to_string(), per)].into(),
        }
    }

    #[test]
    fn gains_are_paired_over_the_common_prompts() {
        let rows = vec![
            row("sft", "math", &[(1, 0.0), (2, 0.5), (3, 1.0), (4, 0.25)]),
            // Prompt 4 is missing after the stage (skipped): it leaves the comparison.
            row("m", "math", &[(1, 0.25), (2, 0.75), (3, 1.125)]),
            row("c", "math", &[(1, 0.0), (2, 0.5), (3, 1.0)]),
        ];
        let kinds: BTreeMap<String, String> = [("m".to_string(), "math".to_string())].into();
        let gains = stage_gains(&rows, &kinds);
        assert_eq!(
            gains.len(),
            1,
            "only the math stage has math as its own domain"
        );
        let g = &gains[0];
        assert_eq!(
            (g.stage.as_str(), g.domain.as_str(), g.prompts),
            ("m", "math", 3)
        );
        // Differences 0.25, 0.25, 0.125: mean 5/24, sd √(1/192), se √(1/576) = 1/24.
        assert!((g.diff - 5.0 / 24.0).abs() < 1e-12);
        assert!((g.se - 1.0 / 24.0).abs() < 1e-12);
        assert!((g.before - 0.4375).abs() < 1e-12 && (g.after - 2.125 / 3.0).abs() < 1e-12);
        let text = format_table(&HeldoutTable {
            domains: vec!["math".into()],
            rows,
            gains,
        });
        assert!(text.contains("+0.208 ± 0.042"), "{text}");
        assert!(text.contains("up"), "{text}");
    }

    #[test]
    fn tables_written_before_gains_existed_still_parse() {
        let old = r#"{"domains":["math"],"rows":[{"after_stage":"sft","scores":{"math":0.5},"policy_version":3}]}"#;
        let t: HeldoutTable = serde_json::from_str(old).unwrap();
        assert!(t.gains.is_empty() && t.rows[0].prompt_scores.is_empty());
    }
}
