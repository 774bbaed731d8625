//! The held-out table of a run: every RL domain's held-out score after the SFT stages (row
//! `sft`) and after each RL stage, measured on the stage-final snapshots (which retention keeps),
//! written to `RUN_DIR/heldout.json`. The file's format is
//! [`cascade_shared::metrics::HeldoutTable`]; this module evaluates the rows, computes the
//! paired gains and prints the table.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use cascade_actor::dataset::Dataset;
use cascade_actor::eval::{evaluate, mean_and_se, EvalOptions, ModeScores};
use cascade_actor::verifiers::verifier_for;
use cascade_rewards::Verifier;
use cascade_shared::chat::Chat;
use cascade_shared::config::{RunConfig, VerifierConfig};
use cascade_shared::data::Kind;
use cascade_shared::metrics::{
    Eval, EvalScores, HeldoutRow, HeldoutTable, MetricsLog, StageGain, HELDOUT_FILE,
};
use cascade_shared::model::load_model;
use cascade_shared::snapshot;

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
        // Each column is its domain's own score: a stage that blends the reward model into its
        // reward (`rm_weight`) is still reported by its rule verifier (the RM score has its own
        // column, rlhf's).
        let own = VerifierConfig {
            rm_weight: 0.0,
            ..stage.verifier.clone()
        };
        let verifier = verifier_for(
            stage.kind,
            &own,
            rm_dir.as_deref(),
            judge.as_deref(),
            &device,
        )
        .with_context(|| format!("the verifier of stage {}", stage.name))?;
        domains.push(Domain {
            name: stage.kind.as_str().to_string(),
            stage: i,
            dataset: Dataset::open(&config.data_spec(heldout, Kind::Rl, Some(stage.kind))?)?,
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
    let path = run_dir.join(HELDOUT_FILE);
    let tmp = path.with_extension("json.tmp");
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
        metrics.record(&Eval {
            after_stage: Some(after_stage.to_string()),
            domain: Some(d.name.clone()),
            policy_version: Some(version),
            score: Some(result.all.mean_reward),
            score_se: Some(result.all.mean_reward_se),
            pass_at_1: Some(result.all.pass_at_1),
            prompts: Some(result.all.prompts as u64),
            by_mode: Some(
                result
                    .by_mode
                    .iter()
                    .map(|(mode, s)| (mode.clone(), eval_scores(s)))
                    .collect(),
            ),
        });
        scores.insert(d.name.clone(), result.all.mean_reward);
        stderr.insert(d.name.clone(), result.all.mean_reward_se);
        prompt_scores.insert(d.name.clone(), result.prompt_scores);
    }
    Ok(HeldoutRow {
        after_stage: after_stage.to_string(),
        scores,
        policy_version: Some(version),
        stderr,
        prompt_scores,
    })
}

/// The `eval` event's form of an evaluation's scores.
fn eval_scores(s: &ModeScores) -> EvalScores {
    EvalScores {
        prompts: Some(s.prompts as u64),
        mean_reward: Some(s.mean_reward),
        mean_reward_se: Some(s.mean_reward_se),
        pass_at_1: Some(s.pass_at_1),
        pass_at_k: Some(s.pass_at_k),
        response_len: Some(s.response_len),
    }
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
            policy_version: Some(0),
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
}
