//! The held-out table of a run: every RL domain's held-out score after the SFT stages (row
//! `sft`) and after each RL stage, measured on the stage-final snapshots (which retention keeps),
//! written to `RUN_DIR/heldout.json`. The file's format is
//! [`cascade_shared::metrics::HeldoutTable`]. [`Evaluator`] evaluates the rows, while the run
//! trains (each stage-final snapshot as it is published) and at its end; this module computes
//! the paired gains and prints the table.

mod evaluator;

use std::collections::BTreeMap;

use cascade_actor::eval::{mean_and_se, ModeScores};
use cascade_shared::metrics::{EvalScores, HeldoutRow, HeldoutTable, StageGain};

pub use evaluator::{Evaluator, Printer};

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
