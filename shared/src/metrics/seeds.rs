//! `RUN_DIR/seeds.json`: the held-out tables of several runs of one configuration that differ
//! only in their seeds (`cascade run --seeds N`), summarised across seeds.
//!
//! One run is one draw: at the tiny default's size a stage's held-out change scatters from run
//! to run by as much as the effects being measured. The summary gives, for every cell of the
//! held-out table, the mean and spread over seeds, and answers the cascade's two questions with
//! every seed's numbers:
//!
//! - **own gain**: does each RL stage raise its own domain? Per seed, the paired change over the
//!   held-out prompts with its standard error ([`StageGain`]); the goal is `diff > 2·se` in every
//!   seed.
//! - **forgetting**: what does each RL stage do to every *other* domain (its change against the
//!   previous row, per seed: the worst seed counts), and what is left of each domain at the end
//!   against the score it had right after its own stage (mean over seeds)?
//!
//! Tolerances are absolute for domains scored in `[0, 1]` and relative to the SFT row's score
//! for `rlhf`, whose reward-model score has no fixed scale ([`tolerance`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::heldout::nan_for_null;
use super::{HeldoutTable, StageGain};

/// File name of the summary inside the directory of a multi-seed run.
pub const SEEDS_FILE: &str = "seeds.json";

/// The goals the summary checks (issue 19's, for the embedded default).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SeedGoals {
    /// A stage's own gain must exceed this many standard errors, in every seed.
    pub own_gain_se: f64,
    /// At the end, no domain may be more than this below its score right after its own stage
    /// (mean over seeds; `rlhf`: this fraction of its SFT-row score).
    pub final_drop: f64,
    /// No stage may lower another domain by more than this, in any seed (`rlhf`: this fraction
    /// of its SFT-row score).
    pub stage_drop: f64,
    /// Wall-clock budget of one run in seconds (`None`: not checked).
    pub wall_s: Option<f64>,
}

impl Default for SeedGoals {
    fn default() -> Self {
        Self {
            own_gain_se: 2.0,
            final_drop: 0.05,
            stage_drop: 0.10,
            wall_s: None,
        }
    }
}

/// One seed's run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeedRun {
    /// The seed (model initialisation, actor and learner).
    pub seed: u64,
    /// Its run directory.
    pub run_dir: String,
    /// Its wall-clock time, training and held-out evaluation included.
    pub wall_s: Option<f64>,
    /// Its held-out table.
    pub table: HeldoutTable,
}

/// Mean and spread of one number over seeds (NaNs, e.g. a domain a seed did not score, left
/// out; `n` counts the rest).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// Mean over seeds.
    #[serde(deserialize_with = "nan_for_null")]
    pub mean: f64,
    /// Sample standard deviation over seeds (0 for one seed).
    #[serde(deserialize_with = "nan_for_null")]
    pub sd: f64,
    /// Smallest value.
    #[serde(deserialize_with = "nan_for_null")]
    pub min: f64,
    /// Largest value.
    #[serde(deserialize_with = "nan_for_null")]
    pub max: f64,
    /// Seeds counted.
    pub n: usize,
}

impl Spread {
    /// The spread of `xs`, NaNs left out (all-NaN or empty: NaN mean, `n = 0`).
    pub fn of(xs: &[f64]) -> Self {
        let v: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return Self {
                mean: f64::NAN,
                sd: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
                n: 0,
            };
        }
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let sd = if v.len() < 2 {
            0.0
        } else {
            (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0)).sqrt()
        };
        Self {
            mean,
            sd,
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            n: v.len(),
        }
    }
}

/// One row of the table across seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpreadRow {
    /// `sft` or the RL stage's name.
    pub after_stage: String,
    /// Domain → its score across seeds.
    pub scores: BTreeMap<String, Spread>,
}

/// An RL stage's change to its own domain, in every seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OwnGain {
    /// The stage.
    pub stage: String,
    /// Its domain.
    pub domain: String,
    /// Each seed's paired change (in [`SeedsSummary::seeds`] order).
    pub per_seed: Vec<StageGain>,
    /// The change across seeds.
    pub diff: Spread,
    /// Seeds in which the change exceeds `own_gain_se` standard errors.
    pub up_in: usize,
}

/// An RL stage's change to a domain that is not its own, against the previous row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OtherChange {
    /// The stage.
    pub stage: String,
    /// The domain it changed.
    pub domain: String,
    /// The change across seeds (`min` is the worst seed).
    pub diff: Spread,
    /// The largest drop allowed in any seed (positive; [`tolerance`] of `stage_drop`).
    #[serde(deserialize_with = "nan_for_null")]
    pub tolerance: f64,
}

/// What is left of a domain at the end against its score right after its own stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Retention {
    /// The domain.
    pub domain: String,
    /// The stage that trains it.
    pub stage: String,
    /// Its score right after that stage.
    pub after_own: Spread,
    /// Its score after the last stage.
    pub last: Spread,
    /// `last − after_own` across seeds.
    pub change: Spread,
    /// The largest mean drop allowed (positive; [`tolerance`] of `final_drop`).
    #[serde(deserialize_with = "nan_for_null")]
    pub tolerance: f64,
}

/// One goal and whether the seeds meet it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoalCheck {
    /// What is checked.
    pub goal: String,
    /// Whether it holds.
    pub passed: bool,
    /// The cases that fail it (empty when it holds).
    pub failures: Vec<String>,
}

/// The whole summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeedsSummary {
    /// The runs, in seed order.
    pub seeds: Vec<SeedRun>,
    /// Domains, in cascade order.
    pub domains: Vec<String>,
    /// The table across seeds (rows common to every seed, in cascade order).
    pub rows: Vec<SpreadRow>,
    /// Each RL stage's own gain.
    pub own_gains: Vec<OwnGain>,
    /// Each RL stage's change to every other domain.
    pub other_changes: Vec<OtherChange>,
    /// Each trained domain at the end against right after its own stage.
    pub retention: Vec<Retention>,
    /// Wall-clock time of one run across seeds.
    pub wall_s: Spread,
    /// The goals used.
    pub goals: SeedGoals,
    /// Every goal and whether it holds.
    pub checks: Vec<GoalCheck>,
}

/// The largest drop allowed for `domain`: `fraction` for domains scored in `[0, 1]`,
/// `fraction × |sft_score|` for `rlhf` (a reward-model score with no fixed scale).
pub fn tolerance(domain: &str, fraction: f64, sft_score: f64) -> f64 {
    if domain == "rlhf" {
        fraction * sft_score.abs()
    } else {
        fraction
    }
}

fn score(table: &HeldoutTable, row: &str, domain: &str) -> f64 {
    table
        .rows
        .iter()
        .find(|r| r.after_stage == row)
        .and_then(|r| r.scores.get(domain).copied())
        .unwrap_or(f64::NAN)
}

impl SeedsSummary {
    /// Summarises `runs` (at least one). `own` maps every RL stage to its domain (its kind);
    /// stages without a held-out domain are absent.
    pub fn new(runs: Vec<SeedRun>, own: &BTreeMap<String, String>, goals: SeedGoals) -> Self {
        let domains = runs
            .first()
            .map(|r| r.table.domains.clone())
            .unwrap_or_default();
        // Rows every seed has, in the first seed's order.
        let row_names: Vec<String> = runs
            .first()
            .map(|r| {
                r.table
                    .rows
                    .iter()
                    .map(|row| row.after_stage.clone())
                    .filter(|name| {
                        runs.iter()
                            .all(|o| o.table.rows.iter().any(|x| &x.after_stage == name))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let across = |row: &str, domain: &str| -> Vec<f64> {
            runs.iter().map(|r| score(&r.table, row, domain)).collect()
        };
        let rows: Vec<SpreadRow> = row_names
            .iter()
            .map(|name| SpreadRow {
                after_stage: name.clone(),
                scores: domains
                    .iter()
                    .map(|d| (d.clone(), Spread::of(&across(name, d))))
                    .collect(),
            })
            .collect();
        let first_row = row_names.first().cloned().unwrap_or_default();
        let sft = |d: &str| Spread::of(&across(&first_row, d)).mean;

        let mut own_gains = Vec::new();
        let mut other_changes = Vec::new();
        for pair in row_names.windows(2) {
            let (prev, stage) = (&pair[0], &pair[1]);
            let own_domain = own.get(stage);
            if let Some(domain) = own_domain {
                let per_seed: Vec<StageGain> = runs
                    .iter()
                    .map(|r| {
                        r.table
                            .gains
                            .iter()
                            .find(|g| &g.stage == stage && &g.domain == domain)
                            .cloned()
                            .unwrap_or_else(|| {
                                // A table without paired gains: the difference of the means.
                                let (b, a) = (
                                    score(&r.table, prev, domain),
                                    score(&r.table, stage, domain),
                                );
                                StageGain {
                                    stage: stage.clone(),
                                    domain: domain.clone(),
                                    before: b,
                                    after: a,
                                    diff: a - b,
                                    se: f64::NAN,
                                    prompts: 0,
                                }
                            })
                    })
                    .collect();
                let diffs: Vec<f64> = per_seed.iter().map(|g| g.diff).collect();
                let up_in = per_seed
                    .iter()
                    .filter(|g| g.se.is_finite() && g.diff > goals.own_gain_se * g.se)
                    .count();
                own_gains.push(OwnGain {
                    stage: stage.clone(),
                    domain: domain.clone(),
                    per_seed,
                    diff: Spread::of(&diffs),
                    up_in,
                });
            }
            for d in domains.iter().filter(|d| Some(*d) != own_domain) {
                let diffs: Vec<f64> = runs
                    .iter()
                    .map(|r| score(&r.table, stage, d) - score(&r.table, prev, d))
                    .collect();
                other_changes.push(OtherChange {
                    stage: stage.clone(),
                    domain: d.clone(),
                    diff: Spread::of(&diffs),
                    tolerance: tolerance(d, goals.stage_drop, sft(d)),
                });
            }
        }

        let last_row = row_names.last().cloned().unwrap_or_default();
        let retention: Vec<Retention> = domains
            .iter()
            .filter_map(|d| {
                let stage = row_names.iter().find(|s| own.get(*s) == Some(d))?;
                let after: Vec<f64> = across(stage, d);
                let last: Vec<f64> = across(&last_row, d);
                let change: Vec<f64> = after.iter().zip(&last).map(|(a, l)| l - a).collect();
                Some(Retention {
                    domain: d.clone(),
                    stage: stage.clone(),
                    after_own: Spread::of(&after),
                    last: Spread::of(&last),
                    change: Spread::of(&change),
                    tolerance: tolerance(d, goals.final_drop, sft(d)),
                })
            })
            .collect();

        let wall_s = Spread::of(
            &runs
                .iter()
                .map(|r| r.wall_s.unwrap_or(f64::NAN))
                .collect::<Vec<_>>(),
        );
        let mut summary = Self {
            seeds: runs,
            domains,
            rows,
            own_gains,
            other_changes,
            retention,
            wall_s,
            goals,
            checks: Vec::new(),
        };
        summary.checks = summary.check();
        summary
    }

    fn check(&self) -> Vec<GoalCheck> {
        let g = &self.goals;
        let n = self.seeds.len();
        let mut checks = Vec::new();
        let fails: Vec<String> = self
            .own_gains
            .iter()
            .filter(|o| o.up_in < n)
            .map(|o| {
                let per: Vec<String> = o
                    .per_seed
                    .iter()
                    .map(|s| format!("{:+.3} ± {:.3}", s.diff, s.se))
                    .collect();
                format!(
                    "{} ({}): up in {}/{n} seeds [{}]",
                    o.stage,
                    o.domain,
                    o.up_in,
                    per.join(", ")
                )
            })
            .collect();
        checks.push(GoalCheck {
            goal: format!(
                "every RL stage raises its own domain by more than {} s.e. in every seed",
                g.own_gain_se
            ),
            passed: fails.is_empty() && !self.own_gains.is_empty(),
            failures: fails,
        });
        let fails: Vec<String> = self
            .retention
            .iter()
            .filter(|r| r.change.mean.is_nan() || r.change.mean < -r.tolerance)
            .map(|r| {
                format!(
                    "{}: {:.3} after {}, {:.3} at the end ({:+.3}, allowed −{:.3})",
                    r.domain, r.after_own.mean, r.stage, r.last.mean, r.change.mean, r.tolerance
                )
            })
            .collect();
        checks.push(GoalCheck {
            goal: format!(
                "after the last stage, no domain is more than {} below its score right after its own stage (mean over seeds; rlhf: × its SFT score)",
                g.final_drop
            ),
            passed: fails.is_empty(),
            failures: fails,
        });
        let fails: Vec<String> = self
            .other_changes
            .iter()
            .filter(|c| c.diff.n > 0 && c.diff.min < -c.tolerance)
            .map(|c| {
                format!(
                    "{} lowers {} by {:.3} in its worst seed (allowed {:.3})",
                    c.stage, c.domain, -c.diff.min, c.tolerance
                )
            })
            .collect();
        checks.push(GoalCheck {
            goal: format!(
                "no stage lowers another domain by more than {} in any seed (rlhf: × its SFT score)",
                g.stage_drop
            ),
            passed: fails.is_empty(),
            failures: fails,
        });
        if let Some(budget) = g.wall_s {
            let fails: Vec<String> = self
                .seeds
                .iter()
                .filter(|s| s.wall_s.is_none_or(|w| w > budget))
                .map(|s| match s.wall_s {
                    Some(w) => format!("seed {}: {w:.0} s", s.seed),
                    None => format!("seed {}: no wall-clock time recorded", s.seed),
                })
                .collect();
            checks.push(GoalCheck {
                goal: format!("every run finishes within {budget:.0} s"),
                passed: fails.is_empty(),
                failures: fails,
            });
        }
        checks
    }

    /// Whether every goal holds.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }

    /// The summary as aligned text: the table (mean ± sd over seeds), own gains, the changes to
    /// other domains, retention and the goals.
    pub fn format(&self) -> String {
        let n = self.seeds.len();
        let seeds: Vec<String> = self.seeds.iter().map(|s| s.seed.to_string()).collect();
        let mut out = format!(
            "held-out scores over {n} seed(s) ({}): mean ± sd\n{:<12}",
            seeds.join(", "),
            "after stage"
        );
        for d in &self.domains {
            out.push_str(&format!("{d:>16}"));
        }
        out.push('\n');
        for row in &self.rows {
            out.push_str(&format!("{:<12}", row.after_stage));
            for d in &self.domains {
                match row.scores.get(d).filter(|s| s.n > 0) {
                    Some(s) => {
                        out.push_str(&format!("{:>16}", format!("{:.3} ± {:.3}", s.mean, s.sd)))
                    }
                    None => out.push_str(&format!("{:>16}", "-")),
                }
            }
            out.push('\n');
        }
        if !self.own_gains.is_empty() {
            out.push_str("\neach RL stage on its own domain (per seed: paired change ± 1 s.e.):\n");
            for o in &self.own_gains {
                let per: Vec<String> = o
                    .per_seed
                    .iter()
                    .map(|s| format!("{:+.3} ± {:.3}", s.diff, s.se))
                    .collect();
                out.push_str(&format!(
                    "  {:<10} {:<6} mean {:+.3}  up in {}/{n}   [{}]\n",
                    o.stage,
                    o.domain,
                    o.diff.mean,
                    o.up_in,
                    per.join(", ")
                ));
            }
        }
        if !self.other_changes.is_empty() {
            out.push_str("\neach RL stage on the other domains (change vs the previous row: mean, worst seed):\n");
            out.push_str(&format!("{:<12}", "stage"));
            for d in &self.domains {
                out.push_str(&format!("{d:>18}"));
            }
            out.push('\n');
            for stage in self.rows.iter().skip(1).map(|r| &r.after_stage) {
                out.push_str(&format!("{stage:<12}"));
                for d in &self.domains {
                    let cell = match self
                        .other_changes
                        .iter()
                        .find(|c| &c.stage == stage && &c.domain == d)
                    {
                        Some(c) if c.diff.n > 0 => {
                            let flag = if c.diff.min < -c.tolerance { " !" } else { "" };
                            format!("{:+.3} ({:+.3}){flag}", c.diff.mean, c.diff.min)
                        }
                        Some(_) => "-".to_string(),
                        None => "(own)".to_string(),
                    };
                    out.push_str(&format!("{cell:>18}"));
                }
                out.push('\n');
            }
        }
        if !self.retention.is_empty() {
            out.push_str(
                "\neach domain at the end against right after its own stage (mean over seeds):\n",
            );
            for r in &self.retention {
                out.push_str(&format!(
                    "  {:<6} after {:<8} {:.3} → {:.3} at the end   {:+.3} (allowed −{:.3})\n",
                    r.domain, r.stage, r.after_own.mean, r.last.mean, r.change.mean, r.tolerance
                ));
            }
        }
        if self.wall_s.n > 0 {
            out.push_str(&format!(
                "\nwall clock per run: {:.0} ± {:.0} s (min {:.0}, max {:.0})\n",
                self.wall_s.mean, self.wall_s.sd, self.wall_s.min, self.wall_s.max
            ));
        }
        out.push_str("\ngoals:\n");
        for c in &self.checks {
            out.push_str(&format!(
                "  [{}] {}\n",
                if c.passed { "met" } else { "NOT MET" },
                c.goal
            ));
            for f in &c.failures {
                out.push_str(&format!("        {f}\n"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::HeldoutRow;

    fn table(rows: &[(&str, &[(&str, f64)])], gains: &[(&str, &str, f64, f64)]) -> HeldoutTable {
        HeldoutTable {
            domains: vec!["rlhf".into(), "math".into()],
            rows: rows
                .iter()
                .map(|(stage, scores)| HeldoutRow {
                    after_stage: stage.to_string(),
                    scores: scores.iter().map(|(d, s)| (d.to_string(), *s)).collect(),
                    policy_version: None,
                    stderr: BTreeMap::new(),
                    prompt_scores: BTreeMap::new(),
                })
                .collect(),
            gains: gains
                .iter()
                .map(|(stage, domain, diff, se)| StageGain {
                    stage: stage.to_string(),
                    domain: domain.to_string(),
                    before: f64::NAN,
                    after: f64::NAN,
                    diff: *diff,
                    se: *se,
                    prompts: 10,
                })
                .collect(),
        }
    }

    fn own() -> BTreeMap<String, String> {
        [
            ("rl".to_string(), "rlhf".to_string()),
            ("m".to_string(), "math".to_string()),
        ]
        .into()
    }

    fn run(seed: u64, t: HeldoutTable) -> SeedRun {
        SeedRun {
            seed,
            run_dir: format!("seed-{seed}"),
            wall_s: Some(100.0 + seed as f64),
            table: t,
        }
    }

    #[test]
    fn spread_leaves_out_nans() {
        let s = Spread::of(&[1.0, f64::NAN, 3.0]);
        assert_eq!((s.mean, s.min, s.max, s.n), (2.0, 1.0, 3.0, 2));
        assert!((s.sd - 2f64.sqrt()).abs() < 1e-12);
        assert_eq!(Spread::of(&[f64::NAN]).n, 0);
        assert_eq!(Spread::of(&[5.0]).sd, 0.0);
    }

    #[test]
    fn goals_met_and_missed_with_every_seed_counted() {
        // Seed 0: fine. Seed 1: the math stage lowers rlhf by 0.5 (10 % of |−4| = 0.4 allowed)
        // and its own gain is within 2 s.e.
        let t0 = table(
            &[
                ("sft", &[("rlhf", -4.0), ("math", 0.10)]),
                ("rl", &[("rlhf", -3.0), ("math", 0.09)]),
                ("m", &[("rlhf", -3.1), ("math", 0.30)]),
            ],
            &[("rl", "rlhf", 1.0, 0.1), ("m", "math", 0.21, 0.05)],
        );
        let t1 = table(
            &[
                ("sft", &[("rlhf", -4.0), ("math", 0.10)]),
                ("rl", &[("rlhf", -3.0), ("math", 0.12)]),
                ("m", &[("rlhf", -3.5), ("math", 0.15)]),
            ],
            &[("rl", "rlhf", 1.0, 0.1), ("m", "math", 0.03, 0.02)],
        );
        let s = SeedsSummary::new(
            vec![run(0, t0.clone()), run(1, t1)],
            &own(),
            SeedGoals {
                wall_s: Some(100.5),
                ..SeedGoals::default()
            },
        );
        assert_eq!(s.rows.len(), 3);
        assert!((s.rows[2].scores["rlhf"].mean + 3.3).abs() < 1e-12);
        let m = s.own_gains.iter().find(|o| o.stage == "m").unwrap();
        assert_eq!(m.up_in, 1);
        let c = s
            .other_changes
            .iter()
            .find(|c| c.stage == "m" && c.domain == "rlhf")
            .unwrap();
        assert!((c.diff.min + 0.5).abs() < 1e-12 && (c.tolerance - 0.4).abs() < 1e-12);
        // rlhf at the end: −3.3 against −3.0 after its stage: −0.3, allowed 0.2 (5 % of 4).
        let r = s.retention.iter().find(|r| r.domain == "rlhf").unwrap();
        assert!((r.change.mean + 0.3).abs() < 1e-12 && (r.tolerance - 0.2).abs() < 1e-12);
        let passed: Vec<bool> = s.checks.iter().map(|c| c.passed).collect();
        assert_eq!(passed, [false, false, false, false], "{}", s.format());
        assert!(
            s.checks[3].failures[0].contains("seed 1"),
            "{:?}",
            s.checks[3]
        );
        let text = s.format();
        assert!(text.contains("up in 1/2"), "{text}");
        assert!(text.contains("NOT MET"), "{text}");

        // The good seed alone meets every goal.
        let s = SeedsSummary::new(vec![run(0, t0)], &own(), SeedGoals::default());
        assert!(s.passed(), "{}", s.format());
        let back: SeedsSummary = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back.checks, s.checks);
    }
}
