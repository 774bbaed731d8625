//! What [`write_report`](crate::write_report) returns: the numbers behind the report, for the
//! CLI to print.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Policy-lag statistics over every `policy_lag` entry of every `learner_step`.
#[derive(Debug, Clone, PartialEq)]
pub struct LagStats {
    /// Number of trained groups (entries).
    pub count: usize,
    /// Mean lag.
    pub mean: f64,
    /// Nearest-rank median.
    pub median: u64,
    /// Nearest-rank 95th percentile.
    pub p95: u64,
    /// Largest lag.
    pub max: u64,
    /// Fraction of groups trained with lag 0 (fully on-policy).
    pub on_policy_fraction: f64,
}

/// The comparison numbers of [`ReportOptions::compare`](crate::ReportOptions::compare).
#[derive(Debug, Clone, PartialEq)]
pub struct CompareSummary {
    /// The other run's directory.
    pub other_dir: PathBuf,
    /// Wall-clock of the other run (`run_end.wall_s`, else last t − first t).
    pub other_wall_s: Option<f64>,
    /// The other run's `max_staleness`.
    pub other_max_staleness: Option<u64>,
    /// `other_wall_s / wall_s`: how many times longer the other run took
    /// (> 1 means this run was faster).
    pub ratio: Option<f64>,
}

/// The numbers behind the report, for the CLI to print.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportSummary {
    /// `DIR/report/index.html`.
    pub index_html: PathBuf,
    /// Every SVG written (all referenced from `index.html`).
    pub charts: Vec<PathBuf>,
    /// Whether `metrics.jsonl` existed and had at least one valid event.
    pub has_metrics: bool,
    /// `run_end.wall_s`, else last t − first t.
    pub wall_s: Option<f64>,
    /// `run_end.status`.
    pub status: Option<String>,
    /// From `run_start` (else `run_end`).
    pub max_staleness: Option<u64>,
    /// Number of `learner_step` events.
    pub rl_steps: usize,
    /// Number of `sft_step` events.
    pub sft_steps: usize,
    /// Largest global `step` seen in learner/SFT steps.
    pub last_step: Option<u64>,
    /// Stage names in cascade order.
    pub stages: Vec<String>,
    /// Σ `idle_s` / Σ `step_s` over all `learner_step` events.
    pub idle_fraction: Option<f64>,
    /// Policy lag of the trained groups (`None`: no RL step trained a group).
    pub policy_lag: Option<LagStats>,
    /// Restarts per supervised process.
    pub restarts: BTreeMap<String, u64>,
    /// Lines of `metrics.jsonl` skipped as malformed.
    pub malformed_lines: usize,
    /// The comparison with [`ReportOptions::compare`](crate::ReportOptions::compare), when given.
    pub compare: Option<CompareSummary>,
}
