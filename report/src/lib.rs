//! Run reports: `DIR/metrics.jsonl` (+ `DIR/heldout.json`) → `DIR/report/index.html`
//! with SVG charts beside it.
//!
//! This module documentation is the reference for the metrics schema written
//! by the cascade processes.
//!
//! # `metrics.jsonl`
//!
//! One JSON object per line, appended by several processes (learner, actors,
//! supervisor), so lines are not necessarily ordered by time. Every line has:
//!
//! | field   | type   | meaning |
//! |---------|--------|---------|
//! | `t`     | f64    | unix time in seconds |
//! | `proc`  | string | writing process: `"learner"`, `"actor-0"`, `"supervisor"`, ... |
//! | `event` | string | one of the events below |
//!
//! Readers must ignore unknown events and unknown fields. A line that is not a
//! JSON object with those three fields, or a known event whose fields have the
//! wrong JSON types, is *malformed*: it is skipped and counted, never fatal
//! (the report says "N malformed lines skipped, first at line K"). Every
//! event field below is optional; `null` reads as absent (JSON has no NaN).
//!
//! ## `learner_step` — one RL optimizer step (written by the learner)
//!
//! | field | type | meaning |
//! |-------|------|---------|
//! | `stage` | string | stage name |
//! | `stage_kind` | string | `rlhf` \| `if` \| `math` \| `code` \| `swe` (the stage's domain) |
//! | `stage_index` | u64 | position of the stage in the cascade |
//! | `stage_step`, `stage_steps` | u64 | step within the stage, and the stage's total |
//! | `step` | u64 | global optimizer step (shared with `sft_step`) |
//! | `policy_version` | u64 | version of the policy after this step |
//! | `loss`, `grad_norm`, `lr` | f64 | optimizer statistics |
//! | `train_tokens` | u64 | tokens trained on in this step |
//! | `tokens_per_s` | f64 | learner training throughput |
//! | `step_s` | f64 | wall time of the step, including waiting for rollouts |
//! | `idle_s` | f64 | part of `step_s` spent waiting for rollouts |
//! | `reward_mean` | f64 | mean reward over all trained groups |
//! | `by_mode` | object | `{"think": M, "no_think": M}`, either may be absent, `M = {"groups": u64, "reward_mean": f64, "pass_rate": f64, "response_len": f64}` |
//! | `policy_lag` | [u64] | per trained group: `policy_version` at training − version that generated it |
//! | `groups_kept` | u64 | groups trained on |
//! | `dropped` | object | groups dropped by reason: `{"stale": n, "equal_rewards": n, "bad_input": n}` (other reasons allowed) |
//! | `queue_depth` | u64 | rollout queue depth when the step started |
//! | `clip_fraction` | f64 | trained tokens whose PPO-clipped branch was taken |
//! | `ratio_mean`, `ratio_max` | f64 | π_θ/π_behaviour over the trained tokens |
//! | `dual_clip_fraction` | f64 | trained tokens whose negative-advantage loss the dual clip bounded |
//! | `kl_mean`, `kl_max` | f64 | per-token KL estimate the loss used (0 without a KL term) |
//! | `kl_bounded_fraction` | f64 | trained tokens past `kl_log_ratio_max` (linear part of the estimate) |
//! | `ref_log_ratio_max` | f64 | largest log π_ref − log π_θ of a trained token, in nats |
//! | `skipped` | bool | the step was skipped (no usable groups) |
//!
//! ## `sft_step` — one supervised step (learner)
//!
//! `stage`, `stage_index`, `stage_step`, `stage_steps`, `step`, `loss`, `lr`,
//! `grad_norm`, `train_tokens`, `tokens_per_s`, `step_s`, with the meanings above.
//!
//! ## `rm_step` / `rm_done` — reward-model training
//!
//! `rm_step`: `step`, `steps` (total), `loss`, `accuracy` (pairwise, on the batch).
//! `rm_done`: `heldout_accuracy` (f64), `pairs` (u64, held-out pairs evaluated).
//!
//! ## `actor` — periodic actor report
//!
//! `actor` (id, number or string), `stage`, `policy_version` (the actor's
//! current weights), `groups` (u64), `tokens` (cumulative generated tokens),
//! `tokens_per_s` (generation throughput over the last interval).
//!
//! ## `process` — supervisor lifecycle events
//!
//! `what` (`"start"` \| `"exit"` \| `"restart"` \| `"give_up"`), `name` (`"learner"`,
//! `"actor-1"`), `pid` (u64), `status` (text, e.g. `"killed by signal 9"`),
//! `restarts` (u64, restarts of that process so far).
//!
//! ## `stage_end`, `run_start`, `run_end`
//!
//! `stage_end`: `stage`, `stage_index`, `step`, `policy_version`.
//! `run_start`: `config` (path), `max_staleness` (u64), `actors` (count).
//! `run_end`: `wall_s` (f64), `status` (`"completed"` \| `"stopped"` \| `"failed"`),
//! `max_staleness`.
//!
//! # `heldout.json` (optional)
//!
//! ```json
//! {"domains": ["rlhf", "if", "math", "code", "swe"],
//!  "rows": [{"after_stage": "sft", "scores": {"math": 0.41, "code": 0.2}}, ...],
//!  "gains": [{"stage": "math", "domain": "math", "diff": 0.03, "se": 0.01}, ...]}
//! ```
//!
//! `gains` (optional) is each RL stage's paired change on its own domain; the report prints it
//! beside the ✓/✗ verdict.
//!
//! One row per evaluation, in cascade order. A row's "own domain" is its
//! `after_stage` if that is a domain, else the `stage_kind` that stage has in
//! `metrics.jsonl`; the report highlights that cell and marks ✓ if the score
//! rose against the previous row, ✗ otherwise.
//!
//! # The report
//!
//! [`write_report`] writes `DIR/report/index.html` and `*.svg` beside it
//! (linked with `<img>`): run summary; reward, pass rate and response length
//! per step by mode with stage boundaries; learner and actor tokens/s over
//! time; policy-lag histogram; learner idle fraction overall and per stage;
//! groups dropped per stage by reason; losses; RM training; held-out table;
//! supervisor process events; and, with [`ReportOptions::compare`], an
//! "Async vs on-policy" section comparing wall-clock and reward curves.
//! All strings from the data are HTML-escaped.

mod charts;
mod metrics;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use charts::{color, Line, Marker};
pub use metrics::{
    parse_metrics, read_metrics, ActorEvent, Event, EventKind, LearnerStep, Metrics, ModeStats,
    ProcessEvent, RmDone, RmStep, RunEnd, RunStart, SftStep, StageEnd,
};

/// Errors of [`write_report`] and [`read_metrics`].
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// plotters failed to render a chart.
    #[error("chart {name}: {message}")]
    Chart { name: String, message: String },
}

/// Options of [`write_report`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportOptions {
    /// Another run directory (typically the on-policy baseline) to compare
    /// against in an "Async vs on-policy" section.
    pub compare: Option<PathBuf>,
}

/// Policy-lag statistics over every `policy_lag` entry of every `learner_step`.
#[derive(Debug, Clone, PartialEq)]
pub struct LagStats {
    /// Number of trained groups (entries).
    pub count: usize,
    pub mean: f64,
    /// Nearest-rank median.
    pub median: u64,
    /// Nearest-rank 95th percentile.
    pub p95: u64,
    pub max: u64,
    /// Fraction of groups trained with lag 0 (fully on-policy).
    pub on_policy_fraction: f64,
}

/// The comparison numbers of [`ReportOptions::compare`].
#[derive(Debug, Clone, PartialEq)]
pub struct CompareSummary {
    pub other_dir: PathBuf,
    /// Wall-clock of the other run (`run_end.wall_s`, else last t − first t).
    pub other_wall_s: Option<f64>,
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
    pub policy_lag: Option<LagStats>,
    /// Restarts per supervised process.
    pub restarts: BTreeMap<String, u64>,
    pub malformed_lines: usize,
    pub compare: Option<CompareSummary>,
}

// ---------------------------------------------------------------------------
// Analysis
// ---------------------------------------------------------------------------

const UNNAMED: &str = "(unnamed)";

/// One stage as seen through its step events.
#[derive(Debug, Clone, Default)]
struct StageSpan {
    name: String,
    kind: Option<String>,
    index: Option<u64>,
    rl_steps: usize,
    sft_steps: usize,
    skipped: usize,
    first_step: Option<u64>,
    first_t: f64,
    step_s: f64,
    idle_s: f64,
    kept: u64,
    dropped: BTreeMap<String, u64>,
    ended: bool,
}

fn learner_steps(m: &Metrics) -> impl Iterator<Item = (&Event, &LearnerStep)> {
    m.events.iter().filter_map(|e| match &e.kind {
        EventKind::LearnerStep(s) => Some((e, s)),
        _ => None,
    })
}

fn sft_steps(m: &Metrics) -> impl Iterator<Item = (&Event, &SftStep)> {
    m.events.iter().filter_map(|e| match &e.kind {
        EventKind::SftStep(s) => Some((e, s)),
        _ => None,
    })
}

fn first_t(m: &Metrics) -> Option<f64> {
    m.events.iter().map(|e| e.t).min_by(f64::total_cmp)
}

fn last_t(m: &Metrics) -> Option<f64> {
    m.events.iter().map(|e| e.t).max_by(f64::total_cmp)
}

fn run_start(m: &Metrics) -> Option<&RunStart> {
    m.events.iter().find_map(|e| match &e.kind {
        EventKind::RunStart(r) => Some(r),
        _ => None,
    })
}

fn run_end(m: &Metrics) -> Option<&RunEnd> {
    m.events.iter().rev().find_map(|e| match &e.kind {
        EventKind::RunEnd(r) => Some(r),
        _ => None,
    })
}

/// `run_end.wall_s`, else last t − first t.
fn wall_s(m: &Metrics) -> Option<f64> {
    run_end(m)
        .and_then(|r| r.wall_s)
        .filter(|w| w.is_finite())
        .or_else(|| Some(last_t(m)? - first_t(m)?))
}

fn max_staleness(m: &Metrics) -> Option<u64> {
    run_start(m)
        .and_then(|r| r.max_staleness)
        .or_else(|| run_end(m).and_then(|r| r.max_staleness))
}

fn stages(m: &Metrics) -> Vec<StageSpan> {
    fn find(
        spans: &mut Vec<StageSpan>,
        name: &Option<String>,
        index: Option<u64>,
        t: f64,
    ) -> usize {
        let name = name.as_deref().unwrap_or(UNNAMED);
        if let Some(i) = spans
            .iter()
            .position(|s| s.name == name && (s.index == index || index.is_none()))
        {
            if spans[i].index.is_none() {
                spans[i].index = index;
            }
            spans[i].first_t = spans[i].first_t.min(t);
            return i;
        }
        spans.push(StageSpan {
            name: name.to_string(),
            index,
            first_t: t,
            ..Default::default()
        });
        spans.len() - 1
    }
    let mut spans: Vec<StageSpan> = Vec::new();
    let mut ends = Vec::new();
    for e in &m.events {
        match &e.kind {
            EventKind::LearnerStep(s) => {
                let i = find(&mut spans, &s.stage, s.stage_index, e.t);
                let span = &mut spans[i];
                if span.kind.is_none() {
                    span.kind.clone_from(&s.stage_kind);
                }
                span.rl_steps += 1;
                span.skipped += usize::from(s.skipped == Some(true));
                span.first_step = min_opt(span.first_step, s.step);
                span.step_s += s.step_s.filter(|x| x.is_finite()).unwrap_or(0.0);
                span.idle_s += s.idle_s.filter(|x| x.is_finite()).unwrap_or(0.0);
                span.kept += s.groups_kept.unwrap_or(0);
                for (reason, n) in s.dropped.iter().flatten() {
                    *span.dropped.entry(reason.clone()).or_default() += n;
                }
            }
            EventKind::SftStep(s) => {
                let i = find(&mut spans, &s.stage, s.stage_index, e.t);
                let span = &mut spans[i];
                span.sft_steps += 1;
                span.first_step = min_opt(span.first_step, s.step);
            }
            EventKind::StageEnd(s) => ends.push(s),
            _ => {}
        }
    }
    for end in ends {
        let name = end.stage.as_deref().unwrap_or(UNNAMED);
        if let Some(s) = spans
            .iter_mut()
            .find(|s| s.name == name && (end.stage_index.is_none() || s.index == end.stage_index))
        {
            s.ended = true;
        }
    }
    spans.sort_by(|a, b| {
        (
            a.index.is_none(),
            a.index,
            a.first_step.is_none(),
            a.first_step,
        )
            .cmp(&(
                b.index.is_none(),
                b.index,
                b.first_step.is_none(),
                b.first_step,
            ))
            .then(a.first_t.total_cmp(&b.first_t))
    });
    spans
}

fn min_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn idle_fraction(step_s: f64, idle_s: f64) -> Option<f64> {
    (step_s > 0.0).then(|| idle_s / step_s)
}

fn lag_counts(m: &Metrics) -> BTreeMap<u64, u64> {
    let mut counts = BTreeMap::new();
    for (_, s) in learner_steps(m) {
        for &lag in s.policy_lag.iter().flatten() {
            *counts.entry(lag).or_insert(0) += 1;
        }
    }
    counts
}

fn lag_stats(counts: &BTreeMap<u64, u64>) -> Option<LagStats> {
    let count: u64 = counts.values().sum();
    if count == 0 {
        return None;
    }
    let rank = |q: f64| -> u64 {
        // Nearest rank: the smallest value whose cumulative count reaches ceil(q * n).
        let target = ((q * count as f64).ceil() as u64).max(1);
        let mut cum = 0;
        for (&v, &c) in counts {
            cum += c;
            if cum >= target {
                return v;
            }
        }
        *counts.keys().next_back().unwrap_or(&0)
    };
    let sum: f64 = counts.iter().map(|(&v, &c)| v as f64 * c as f64).sum();
    Some(LagStats {
        count: count as usize,
        mean: sum / count as f64,
        median: rank(0.5),
        p95: rank(0.95),
        max: *counts.keys().next_back().unwrap_or(&0),
        on_policy_fraction: *counts.get(&0).unwrap_or(&0) as f64 / count as f64,
    })
}

/// Per supervised process: starts, exits, restarts, give-ups, last status.
#[derive(Debug, Default)]
struct ProcStats {
    starts: u64,
    exits: u64,
    restart_events: u64,
    restarts_field: u64,
    gave_up: bool,
    last_status: Option<String>,
}

impl ProcStats {
    fn restarts(&self) -> u64 {
        self.restart_events.max(self.restarts_field)
    }
}

fn process_stats(m: &Metrics) -> BTreeMap<String, ProcStats> {
    let mut out: BTreeMap<String, ProcStats> = BTreeMap::new();
    for e in &m.events {
        let EventKind::Process(p) = &e.kind else {
            continue;
        };
        let name = p.name.clone().unwrap_or_else(|| UNNAMED.to_string());
        let s = out.entry(name).or_default();
        match p.what.as_deref() {
            Some("start") => s.starts += 1,
            Some("exit") => s.exits += 1,
            Some("restart") => s.restart_events += 1,
            Some("give_up") => s.gave_up = true,
            _ => {}
        }
        s.restarts_field = s.restarts_field.max(p.restarts.unwrap_or(0));
        if p.status.is_some() {
            s.last_status.clone_from(&p.status);
        }
    }
    out
}

/// Modes seen in `by_mode`, `think` and `no_think` first.
fn modes(m: &Metrics) -> Vec<String> {
    let mut set = BTreeSet::new();
    for (_, s) in learner_steps(m) {
        set.extend(s.by_mode.iter().flat_map(|b| b.keys().cloned()));
    }
    let mut out = Vec::new();
    for known in ["think", "no_think"] {
        if set.remove(known) {
            out.push(known.to_string());
        }
    }
    out.extend(set);
    out
}

/// Held-out evaluation table (`heldout.json`).
#[derive(Debug, Deserialize)]
struct Heldout {
    #[serde(default)]
    domains: Vec<String>,
    #[serde(default)]
    rows: Vec<HeldoutRow>,
    #[serde(default)]
    gains: Vec<HeldoutGain>,
}

/// A stage's paired change on its own domain (`gains` in `heldout.json`).
#[derive(Debug, Deserialize)]
struct HeldoutGain {
    stage: String,
    domain: String,
    diff: f64,
    se: f64,
}

#[derive(Debug, Deserialize)]
struct HeldoutRow {
    after_stage: String,
    #[serde(default)]
    scores: BTreeMap<String, Option<f64>>,
}

// ---------------------------------------------------------------------------
// Formatting
// ---------------------------------------------------------------------------

/// HTML-escapes text for element content and quoted attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Compact number: up to 4 decimals, trailing zeros trimmed; integers above
/// 1000 without decimals.
fn num(x: f64) -> String {
    if !x.is_finite() {
        return "—".to_string();
    }
    if x.abs() >= 1000.0 {
        return format!("{x:.0}");
    }
    let s = format!("{x:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

fn opt_num(x: Option<f64>) -> String {
    x.map(num).unwrap_or_else(|| "—".to_string())
}

fn pct(x: Option<f64>) -> String {
    x.filter(|x| x.is_finite())
        .map(|x| format!("{:.1}%", x * 100.0))
        .unwrap_or_else(|| "—".to_string())
}

fn duration(s: f64) -> String {
    if !s.is_finite() {
        return "—".to_string();
    }
    let total = s.round().max(0.0) as u64;
    let (h, m, sec) = (total / 3600, (total / 60) % 60, total % 60);
    let hms = if h > 0 {
        format!("{h}h {m:02}m {sec:02}s")
    } else if m > 0 {
        format!("{m}m {sec:02}s")
    } else {
        format!("{sec}s")
    };
    format!("{} s ({hms})", num(s))
}

fn json_value_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(a) => a.len().to_string(),
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------
// Report writer
// ---------------------------------------------------------------------------

const CHART_NAMES: [&str; 9] = [
    "reward",
    "pass_rate",
    "response_len",
    "throughput",
    "policy_lag",
    "loss",
    "rm",
    "compare_reward",
    "actor_tokens",
];

struct Writer {
    out_dir: PathBuf,
    html: String,
    charts: Vec<PathBuf>,
}

impl Writer {
    fn section(&mut self, id: &str, title: &str) {
        let _ = write!(
            self.html,
            "<section id=\"{id}\">\n<h2>{}</h2>\n",
            esc(title)
        );
    }

    fn end_section(&mut self) {
        self.html.push_str("</section>\n");
    }

    fn empty(&mut self, text: &str) {
        let _ = writeln!(self.html, "<p class=\"empty\">{}</p>", esc(text));
    }

    /// Writes `name.svg` and links it, or notes that there was nothing to plot.
    fn chart(
        &mut self,
        name: &str,
        alt: &str,
        svg: Result<Option<String>, String>,
    ) -> Result<(), ReportError> {
        let svg = svg.map_err(|message| ReportError::Chart {
            name: name.to_string(),
            message,
        })?;
        match svg {
            Some(svg) => {
                let file = format!("{name}.svg");
                let path = self.out_dir.join(&file);
                std::fs::write(&path, svg).map_err(|source| ReportError::Io {
                    path: path.clone(),
                    source,
                })?;
                self.charts.push(path);
                let _ = writeln!(
                    self.html,
                    "<figure><img src=\"{file}\" alt=\"{}\"></figure>",
                    esc(alt)
                );
            }
            None => self.empty(&format!("{alt}: no data.")),
        }
        Ok(())
    }
}

const STYLE: &str = "body{font-family:sans-serif;max-width:960px;margin:2em auto;color:#222}\
table{border-collapse:collapse;margin:0.5em 0}\
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\
th{background:#f3f3f3}td.l,th.l{text-align:left}\
td.diag{background:#fff3b0;font-weight:bold}\
.ok{color:#1a7f37}.bad{color:#c62828}.empty{color:#777;font-style:italic}\
.bar{display:inline-block;height:0.8em;background:#1f77b4}\
figure{margin:0.5em 0}img{max-width:100%}section{margin-bottom:2em}";

/// Writes `run_dir/report/index.html` and its SVG charts.
///
/// A missing or empty `metrics.jsonl` gives a report that says there are no
/// metrics; a missing `heldout.json` omits the table (an unparsable one is
/// noted). Fails only on I/O errors (including a `run_dir` that is not a
/// directory) and chart rendering errors.
pub fn write_report(run_dir: &Path, opts: &ReportOptions) -> Result<ReportSummary, ReportError> {
    if !run_dir.is_dir() {
        return Err(ReportError::Io {
            path: run_dir.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "run directory not found"),
        });
    }
    let out_dir = run_dir.join("report");
    std::fs::create_dir_all(&out_dir).map_err(|source| ReportError::Io {
        path: out_dir.clone(),
        source,
    })?;
    for name in CHART_NAMES {
        // Stale charts of an earlier report must not linger; absence is fine.
        let _ = std::fs::remove_file(out_dir.join(format!("{name}.svg")));
    }

    let metrics_path = run_dir.join("metrics.jsonl");
    let (metrics, missing) = if metrics_path.exists() {
        let m = read_metrics(&metrics_path)?;
        let missing = m.events.is_empty().then(|| {
            format!(
                "This run has no metrics: {} has no valid events.",
                metrics_path.display()
            )
        });
        (m, missing)
    } else {
        (
            Metrics::default(),
            Some(format!(
                "This run has no metrics: {} does not exist.",
                metrics_path.display()
            )),
        )
    };

    let mut w = Writer {
        out_dir: out_dir.clone(),
        html: String::new(),
        charts: Vec::new(),
    };
    let title = format!(
        "Cascade run report — {}",
        run_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| run_dir.display().to_string())
    );
    let _ = write!(
        w.html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>{t}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{t}</h1>\n",
        t = esc(&title)
    );

    let spans = stages(&metrics);
    let counts = lag_counts(&metrics);
    let procs = process_stats(&metrics);
    let (step_s, idle_s) = learner_steps(&metrics).fold((0.0, 0.0), |(a, b), (_, s)| {
        (
            a + s.step_s.filter(|x| x.is_finite()).unwrap_or(0.0),
            b + s.idle_s.filter(|x| x.is_finite()).unwrap_or(0.0),
        )
    });
    let mut summary = ReportSummary {
        index_html: out_dir.join("index.html"),
        charts: Vec::new(),
        has_metrics: missing.is_none(),
        wall_s: wall_s(&metrics),
        status: run_end(&metrics).and_then(|r| r.status.clone()),
        max_staleness: max_staleness(&metrics),
        rl_steps: learner_steps(&metrics).count(),
        sft_steps: sft_steps(&metrics).count(),
        last_step: learner_steps(&metrics)
            .filter_map(|(_, s)| s.step)
            .chain(sft_steps(&metrics).filter_map(|(_, s)| s.step))
            .max(),
        stages: spans.iter().map(|s| s.name.clone()).collect(),
        idle_fraction: idle_fraction(step_s, idle_s),
        policy_lag: lag_stats(&counts),
        restarts: procs
            .iter()
            .map(|(k, v)| (k.clone(), v.restarts()))
            .collect(),
        malformed_lines: metrics.malformed,
        compare: None,
    };

    write_summary(
        &mut w,
        run_dir,
        &metrics,
        missing.as_deref(),
        &spans,
        &procs,
        &summary,
    );
    if missing.is_none() {
        write_mode_charts(&mut w, &metrics, &spans)?;
        write_throughput(&mut w, &metrics, &spans)?;
        write_policy_lag(&mut w, &counts, &summary)?;
        write_idle(&mut w, &spans, step_s, idle_s);
        write_dropped(&mut w, &spans);
        write_loss(&mut w, &metrics, &spans)?;
        write_rm(&mut w, &metrics)?;
    }
    write_heldout(&mut w, run_dir, &metrics);
    if missing.is_none() {
        write_processes(&mut w, &metrics);
    }
    if let Some(other) = &opts.compare {
        summary.compare = Some(write_compare(&mut w, run_dir, &metrics, &summary, other)?);
    }
    w.html.push_str("</body>\n</html>\n");

    std::fs::write(&summary.index_html, &w.html).map_err(|source| ReportError::Io {
        path: summary.index_html.clone(),
        source,
    })?;
    summary.charts = w.charts;
    Ok(summary)
}

fn write_summary(
    w: &mut Writer,
    run_dir: &Path,
    m: &Metrics,
    missing: Option<&str>,
    spans: &[StageSpan],
    procs: &BTreeMap<String, ProcStats>,
    summary: &ReportSummary,
) {
    w.section("summary", "Run summary");
    if let Some(text) = missing {
        w.empty(text);
    }
    let mut rows: Vec<(&str, String)> =
        vec![("Run directory", esc(&run_dir.display().to_string()))];
    if missing.is_none() {
        let start = run_start(m);
        rows.push((
            "Status",
            esc(summary.status.as_deref().unwrap_or("unknown (no run_end)")),
        ));
        let wall_src = if run_end(m).and_then(|r| r.wall_s).is_some() {
            "run_end.wall_s"
        } else {
            "last t − first t"
        };
        rows.push((
            "Wall-clock",
            format!(
                "{} <small>({wall_src})</small>",
                summary.wall_s.map(duration).unwrap_or_else(|| "—".into())
            ),
        ));
        if let Some(cfg) = start.and_then(|s| s.config.as_deref()) {
            rows.push(("Config", esc(cfg)));
        }
        if let Some(a) = start.and_then(|s| s.actors.as_ref()) {
            rows.push(("Actors", esc(&json_value_text(a))));
        }
        rows.push((
            "max_staleness",
            summary
                .max_staleness
                .map(|s| s.to_string())
                .unwrap_or_else(|| "—".into()),
        ));
        rows.push(("RL steps (learner_step)", summary.rl_steps.to_string()));
        let skipped = spans.iter().map(|s| s.skipped).sum::<usize>();
        if skipped > 0 {
            rows.push(("Skipped RL steps", skipped.to_string()));
        }
        rows.push(("SFT steps (sft_step)", summary.sft_steps.to_string()));
        rows.push((
            "Last global step",
            summary
                .last_step
                .map(|s| s.to_string())
                .unwrap_or_else(|| "—".into()),
        ));
        if let Some(v) = learner_steps(m).filter_map(|(_, s)| s.policy_version).max() {
            rows.push(("Final policy version", v.to_string()));
        }
        rows.push(("Learner idle fraction", pct(summary.idle_fraction)));
    }
    rows.push((
        "Malformed lines",
        match m.first_malformed_line {
            Some(k) if m.malformed > 0 => format!(
                "{} malformed line{} skipped, first at line {k}",
                m.malformed,
                if m.malformed == 1 { "" } else { "s" }
            ),
            _ => "none".to_string(),
        },
    ));
    w.html.push_str("<table class=\"summary\">\n");
    for (k, v) in rows {
        let _ = writeln!(
            w.html,
            "<tr><th class=\"l\">{k}</th><td class=\"l\">{v}</td></tr>"
        );
    }
    w.html.push_str("</table>\n");

    if !spans.is_empty() {
        w.html.push_str(
            "<h3>Stages</h3>\n<table class=\"stages\">\n<tr><th>#</th><th class=\"l\">stage</th>\
             <th class=\"l\">kind</th><th>first step</th><th>RL steps</th><th>SFT steps</th><th>ended</th></tr>\n",
        );
        for s in spans {
            let _ = writeln!(
                w.html,
                "<tr><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                s.index.map(|i| i.to_string()).unwrap_or_default(),
                esc(&s.name),
                esc(s.kind.as_deref().unwrap_or(if s.sft_steps > 0 { "sft" } else { "" })),
                s.first_step.map(|i| i.to_string()).unwrap_or_default(),
                s.rl_steps,
                s.sft_steps,
                if s.ended { "yes" } else { "no" }
            );
        }
        w.html.push_str("</table>\n");
    }

    if missing.is_none() {
        w.html.push_str("<h3>Restarts per process</h3>\n");
        if procs.is_empty() {
            w.empty("No supervisor process events.");
        } else {
            w.html.push_str(
                "<table class=\"restarts\">\n<tr><th class=\"l\">process</th><th>starts</th><th>exits</th>\
                 <th>restarts</th><th>gave up</th><th class=\"l\">last status</th></tr>\n",
            );
            for (name, p) in procs {
                let _ = writeln!(
                    w.html,
                    "<tr><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
                    esc(name),
                    p.starts,
                    p.exits,
                    p.restarts(),
                    if p.gave_up { "yes" } else { "no" },
                    esc(p.last_status.as_deref().unwrap_or(""))
                );
            }
            w.html.push_str("</table>\n");
        }
    }
    w.end_section();
}

/// Stage-start markers against the global step.
fn step_markers(spans: &[StageSpan]) -> Vec<Marker> {
    spans
        .iter()
        .filter_map(|s| {
            Some(Marker {
                x: s.first_step? as f64,
                label: s.name.clone(),
            })
        })
        .collect()
}

fn write_mode_charts(w: &mut Writer, m: &Metrics, spans: &[StageSpan]) -> Result<(), ReportError> {
    let modes = modes(m);
    let markers = step_markers(spans);
    let steps: Vec<(f64, &LearnerStep)> = learner_steps(m)
        .filter_map(|(_, s)| Some((s.step? as f64, s)))
        .collect();
    let by_mode = |field: fn(&ModeStats) -> Option<f64>| -> Vec<Line> {
        modes
            .iter()
            .enumerate()
            .map(|(i, mode)| Line {
                label: mode.clone(),
                color: color(i),
                points: steps
                    .iter()
                    .filter_map(|(x, s)| Some((*x, field(s.by_mode.as_ref()?.get(mode)?)?)))
                    .collect(),
            })
            .collect()
    };

    w.section("reward", "Reward mean per step");
    let mut lines = by_mode(|s| s.reward_mean);
    lines.push(Line {
        label: "all".into(),
        color: ALL_MODES_GREY,
        points: steps
            .iter()
            .filter_map(|(x, s)| Some((*x, s.reward_mean?)))
            .collect(),
    });
    w.chart(
        "reward",
        "Reward mean per RL step by mode",
        charts::line_chart(
            "Reward mean by mode",
            "global step",
            "reward mean",
            &lines,
            &markers,
        ),
    )?;
    w.end_section();

    w.section("pass-rate", "Pass rate per step");
    w.chart(
        "pass_rate",
        "Pass rate per RL step by mode",
        charts::line_chart(
            "Pass rate by mode",
            "global step",
            "pass rate",
            &by_mode(|s| s.pass_rate),
            &markers,
        ),
    )?;
    w.end_section();

    w.section("response-length", "Response length");
    w.chart(
        "response_len",
        "Mean response length per RL step by mode",
        charts::line_chart(
            "Response length by mode",
            "global step",
            "tokens",
            &by_mode(|s| s.response_len),
            &markers,
        ),
    )?;
    w.end_section();
    Ok(())
}

/// Grey used for the "all modes" reward line.
const ALL_MODES_GREY: plotters::style::RGBColor = plotters::style::RGBColor(150, 150, 150);

fn actor_label(e: &Event, a: &ActorEvent) -> String {
    match &a.actor {
        Some(serde_json::Value::Number(n)) => format!("actor-{n}"),
        Some(serde_json::Value::String(s)) => s.clone(),
        _ => e.proc_name.clone(),
    }
}

fn write_throughput(w: &mut Writer, m: &Metrics, spans: &[StageSpan]) -> Result<(), ReportError> {
    let t0 = first_t(m).unwrap_or(0.0);
    let markers: Vec<Marker> = spans
        .iter()
        .map(|s| Marker {
            x: s.first_t - t0,
            label: s.name.clone(),
        })
        .collect();
    let mut lines = vec![Line {
        label: "learner (train)".into(),
        color: color(0),
        points: m
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::LearnerStep(s) => Some((e.t - t0, s.tokens_per_s?)),
                EventKind::SftStep(s) => Some((e.t - t0, s.tokens_per_s?)),
                _ => None,
            })
            .collect(),
    }];
    #[derive(Default)]
    struct ActorAgg {
        points: Vec<(f64, f64)>,
        reports: usize,
        tokens: Option<u64>,
        groups: Option<u64>,
        last_version: Option<u64>,
    }
    let mut actors: BTreeMap<String, ActorAgg> = BTreeMap::new();
    for e in &m.events {
        if let EventKind::Actor(a) = &e.kind {
            let agg = actors.entry(actor_label(e, a)).or_default();
            agg.reports += 1;
            if let Some(tps) = a.tokens_per_s {
                agg.points.push((e.t - t0, tps));
            }
            agg.tokens = agg.tokens.max(a.tokens);
            agg.groups = agg.groups.max(a.groups);
            agg.last_version = agg.last_version.max(a.policy_version);
        }
    }
    for (i, (name, agg)) in actors.iter().enumerate() {
        lines.push(Line {
            label: name.clone(),
            color: color(i + 1),
            points: agg.points.clone(),
        });
    }
    w.section("throughput", "Throughput (tokens/s)");
    w.chart(
        "throughput",
        "Learner and actor tokens/s over wall-clock",
        charts::line_chart(
            "Tokens/s: learner (RL + SFT steps) and actors",
            "seconds since run start",
            "tokens/s",
            &lines,
            &markers,
        ),
    )?;
    if !actors.is_empty() {
        w.html.push_str(
            "<table class=\"actors\">\n<tr><th class=\"l\">actor</th><th>reports</th><th>tokens (cumulative)</th>\
             <th>groups</th><th>mean tokens/s</th><th>latest policy version</th></tr>\n",
        );
        for (name, a) in &actors {
            let mean = (!a.points.is_empty())
                .then(|| a.points.iter().map(|p| p.1).sum::<f64>() / a.points.len() as f64);
            let _ = writeln!(
                w.html,
                "<tr><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(name),
                a.reports,
                a.tokens.map(|t| t.to_string()).unwrap_or_default(),
                a.groups.map(|t| t.to_string()).unwrap_or_default(),
                opt_num(mean),
                a.last_version.map(|t| t.to_string()).unwrap_or_default(),
            );
        }
        w.html.push_str("</table>\n");
    }
    w.end_section();
    Ok(())
}

fn write_policy_lag(
    w: &mut Writer,
    counts: &BTreeMap<u64, u64>,
    summary: &ReportSummary,
) -> Result<(), ReportError> {
    w.section("policy-lag", "Policy lag");
    w.chart(
        "policy_lag",
        "Histogram of policy lag per trained group",
        charts::histogram(
            "Policy lag of trained groups",
            "policy lag (versions)",
            "groups",
            counts,
        ),
    )?;
    if let Some(s) = &summary.policy_lag {
        let _ = writeln!(
            w.html,
            "<table class=\"lag\">\n<tr><th>groups</th><th>mean</th><th>median</th><th>p95</th><th>max</th>\
             <th>lag 0</th><th>max_staleness</th></tr>\n\
             <tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n</table>",
            s.count,
            num(s.mean),
            s.median,
            s.p95,
            s.max,
            pct(Some(s.on_policy_fraction)),
            summary.max_staleness.map(|v| v.to_string()).unwrap_or_else(|| "—".into())
        );
    }
    w.end_section();
    Ok(())
}

fn bar(frac: Option<f64>) -> String {
    match frac.filter(|f| f.is_finite()) {
        Some(f) => format!(
            "<span class=\"bar\" style=\"width:{:.1}px\"></span>",
            (f.clamp(0.0, 1.0) * 200.0)
        ),
        None => String::new(),
    }
}

fn write_idle(w: &mut Writer, spans: &[StageSpan], step_s: f64, idle_s: f64) {
    w.section("idle", "Learner idle fraction");
    let rl: Vec<&StageSpan> = spans.iter().filter(|s| s.rl_steps > 0).collect();
    if rl.is_empty() {
        w.empty("No RL steps: no idle time to report.");
        w.end_section();
        return;
    }
    w.html.push_str(
        "<p>Σ idle_s / Σ step_s over <code>learner_step</code> events: the share of the \
         learner's wall time spent waiting for rollouts.</p>\n<table class=\"idle\">\n\
         <tr><th class=\"l\">stage</th><th>RL steps</th><th>Σ step_s</th><th>Σ idle_s</th>\
         <th>idle fraction</th><th class=\"l\"></th></tr>\n",
    );
    for s in &rl {
        let f = idle_fraction(s.step_s, s.idle_s);
        let _ = writeln!(
            w.html,
            "<tr><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
            esc(&s.name),
            s.rl_steps,
            num(s.step_s),
            num(s.idle_s),
            pct(f),
            bar(f)
        );
    }
    let f = idle_fraction(step_s, idle_s);
    let _ = writeln!(
        w.html,
        "<tr class=\"total\"><th class=\"l\">overall</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th><td class=\"l\">{}</td></tr>\n</table>",
        rl.iter().map(|s| s.rl_steps).sum::<usize>(),
        num(step_s),
        num(idle_s),
        pct(f),
        bar(f)
    );
    w.end_section();
}

fn write_dropped(w: &mut Writer, spans: &[StageSpan]) {
    w.section("dropped", "Groups dropped by reason");
    let rl: Vec<&StageSpan> = spans.iter().filter(|s| s.rl_steps > 0).collect();
    if rl.is_empty() {
        w.empty("No RL steps.");
        w.end_section();
        return;
    }
    let mut reasons: Vec<String> = ["stale", "equal_rewards", "bad_input"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for s in &rl {
        for r in s.dropped.keys() {
            if !reasons.contains(r) {
                reasons.push(r.clone());
            }
        }
    }
    w.html
        .push_str("<table class=\"dropped\">\n<tr><th class=\"l\">stage</th><th>kept</th>");
    for r in &reasons {
        let _ = write!(w.html, "<th>{}</th>", esc(r));
    }
    w.html.push_str("<th>dropped</th><th>dropped %</th></tr>\n");
    let mut totals = vec![0u64; reasons.len()];
    let mut kept_total = 0;
    for s in &rl {
        let _ = write!(
            w.html,
            "<tr><td class=\"l\">{}</td><td>{}</td>",
            esc(&s.name),
            s.kept
        );
        kept_total += s.kept;
        let mut dropped = 0;
        for (i, r) in reasons.iter().enumerate() {
            let n = s.dropped.get(r).copied().unwrap_or(0);
            totals[i] += n;
            dropped += n;
            let _ = write!(w.html, "<td>{n}</td>");
        }
        let total = dropped + s.kept;
        let _ = writeln!(
            w.html,
            "<td>{dropped}</td><td>{}</td></tr>",
            pct((total > 0).then(|| dropped as f64 / total as f64))
        );
    }
    let _ = write!(
        w.html,
        "<tr class=\"total\"><th class=\"l\">all</th><th>{kept_total}</th>"
    );
    for n in &totals {
        let _ = write!(w.html, "<th>{n}</th>");
    }
    let dropped: u64 = totals.iter().sum();
    let total = dropped + kept_total;
    let _ = writeln!(
        w.html,
        "<th>{dropped}</th><th>{}</th></tr>\n</table>",
        pct((total > 0).then(|| dropped as f64 / total as f64))
    );
    w.end_section();
}

fn write_loss(w: &mut Writer, m: &Metrics, spans: &[StageSpan]) -> Result<(), ReportError> {
    let rl: Vec<(f64, f64)> = learner_steps(m)
        .filter_map(|(_, s)| Some((s.step? as f64, s.loss?)))
        .collect();
    let sft: Vec<(f64, f64)> = sft_steps(m)
        .filter_map(|(_, s)| Some((s.step? as f64, s.loss?)))
        .collect();
    w.section("loss", "Training loss");
    w.chart(
        "loss",
        "Learner loss per step (RL and SFT)",
        charts::line_chart(
            "Learner loss",
            "global step",
            "loss",
            &[
                Line {
                    label: "RL".into(),
                    color: color(0),
                    points: rl,
                },
                Line {
                    label: "SFT".into(),
                    color: color(2),
                    points: sft,
                },
            ],
            &step_markers(spans),
        ),
    )?;
    w.end_section();
    Ok(())
}

fn write_rm(w: &mut Writer, m: &Metrics) -> Result<(), ReportError> {
    let mut loss = Vec::new();
    let mut acc = Vec::new();
    let mut total = None;
    let mut done = None;
    for e in &m.events {
        match &e.kind {
            EventKind::RmStep(s) => {
                if let Some(step) = s.step {
                    if let Some(l) = s.loss {
                        loss.push((step as f64, l));
                    }
                    if let Some(a) = s.accuracy {
                        acc.push((step as f64, a));
                    }
                }
                total = total.max(s.steps);
            }
            EventKind::RmDone(d) => done = Some(d),
            _ => {}
        }
    }
    if loss.is_empty() && acc.is_empty() && done.is_none() {
        return Ok(());
    }
    w.section("rm", "Reward-model training");
    w.chart(
        "rm",
        "Reward-model loss and accuracy per step",
        charts::line_chart(
            "Reward model",
            "RM step",
            "loss / accuracy",
            &[
                Line {
                    label: "loss".into(),
                    color: color(0),
                    points: loss,
                },
                Line {
                    label: "accuracy".into(),
                    color: color(2),
                    points: acc,
                },
            ],
            &[],
        ),
    )?;
    let _ = writeln!(
        w.html,
        "<table class=\"rm\">\n<tr><th>steps</th><th>held-out accuracy</th><th>held-out pairs</th></tr>\n\
         <tr><td>{}</td><td>{}</td><td>{}</td></tr>\n</table>",
        total.map(|t| t.to_string()).unwrap_or_else(|| "—".into()),
        pct(done.and_then(|d| d.heldout_accuracy)),
        done.and_then(|d| d.pairs).map(|p| p.to_string()).unwrap_or_else(|| "—".into()),
    );
    w.end_section();
    Ok(())
}

fn write_heldout(w: &mut Writer, run_dir: &Path, m: &Metrics) {
    let path = run_dir.join("heldout.json");
    w.section("heldout", "Held-out evaluation");
    let heldout: Heldout = match std::fs::read(&path) {
        Err(_) => {
            w.empty("No heldout.json in this run.");
            w.end_section();
            return;
        }
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(h) => h,
            Err(e) => {
                w.empty(&format!("heldout.json could not be parsed: {e}"));
                w.end_section();
                return;
            }
        },
    };
    let mut domains = heldout.domains.clone();
    if domains.is_empty() {
        for row in &heldout.rows {
            for d in row.scores.keys() {
                if !domains.contains(d) {
                    domains.push(d.clone());
                }
            }
        }
    }
    if heldout.rows.is_empty() {
        w.empty("heldout.json has no rows.");
        w.end_section();
        return;
    }
    // Stage name -> stage kind, from the metrics.
    let mut kinds: BTreeMap<&str, &str> = BTreeMap::new();
    for (_, s) in learner_steps(m) {
        if let (Some(name), Some(kind)) = (&s.stage, &s.stage_kind) {
            kinds.entry(name).or_insert(kind);
        }
    }
    let own_domain = |stage: &str| -> Option<String> {
        if domains.iter().any(|d| d == stage) {
            return Some(stage.to_string());
        }
        let kind = kinds.get(stage)?;
        domains.iter().any(|d| d == kind).then(|| kind.to_string())
    };
    w.html.push_str(
        "<p>Rows: evaluation after each stage; highlighted: the domain of the stage just trained; \
         ✓/✗: whether that domain's score rose against the previous row.</p>\n\
         <table class=\"heldout\">\n<tr><th class=\"l\">after stage</th>",
    );
    for d in &domains {
        let _ = write!(w.html, "<th>{}</th>", esc(d));
    }
    w.html.push_str("<th>own domain</th></tr>\n");
    for (i, row) in heldout.rows.iter().enumerate() {
        let own = own_domain(&row.after_stage);
        let _ = write!(w.html, "<tr><td class=\"l\">{}</td>", esc(&row.after_stage));
        for d in &domains {
            let score = row.scores.get(d).copied().flatten();
            let class = if own.as_deref() == Some(d.as_str()) {
                " class=\"diag\""
            } else {
                ""
            };
            let _ = write!(
                w.html,
                "<td{class} data-domain=\"{}\">{}</td>",
                esc(d),
                opt_num(score)
            );
        }
        let verdict = match &own {
            Some(d) => {
                let cur = row.scores.get(d).copied().flatten();
                let prev = i
                    .checked_sub(1)
                    .and_then(|p| heldout.rows[p].scores.get(d).copied().flatten());
                let paired = heldout
                    .gains
                    .iter()
                    .find(|g| g.stage == row.after_stage && &g.domain == d)
                    .map(|g| format!(" (paired: {:+.3} ± {:.3} s.e.)", g.diff, g.se))
                    .unwrap_or_default();
                match (prev, cur) {
                    (Some(p), Some(c)) if c > p => {
                        format!(
                            "<span class=\"ok\">✓</span> {} +{}{paired}",
                            esc(d),
                            num(c - p)
                        )
                    }
                    (Some(p), Some(c)) => {
                        format!(
                            "<span class=\"bad\">✗</span> {} {}{paired}",
                            esc(d),
                            num(c - p)
                        )
                    }
                    _ => format!("{} (no previous score)", esc(d)),
                }
            }
            None => String::new(),
        };
        let _ = writeln!(w.html, "<td class=\"l verdict\">{verdict}</td></tr>");
    }
    w.html.push_str("</table>\n");
    w.end_section();
}

fn write_processes(w: &mut Writer, m: &Metrics) {
    const MAX_ROWS: usize = 200;
    let t0 = first_t(m).unwrap_or(0.0);
    let mut events: Vec<(&Event, &ProcessEvent)> = m
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Process(p) => Some((e, p)),
            _ => None,
        })
        .collect();
    if events.is_empty() {
        return;
    }
    events.sort_by(|a, b| a.0.t.total_cmp(&b.0.t));
    w.section("processes", "Process events");
    w.html.push_str(
        "<table class=\"processes\">\n<tr><th>t (s)</th><th class=\"l\">process</th><th class=\"l\">what</th>\
         <th>pid</th><th class=\"l\">status</th><th>restarts</th></tr>\n",
    );
    for (e, p) in events.iter().take(MAX_ROWS) {
        let _ = writeln!(
            w.html,
            "<tr><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td class=\"l\">{}</td><td>{}</td></tr>",
            num(e.t - t0),
            esc(p.name.as_deref().unwrap_or("")),
            esc(p.what.as_deref().unwrap_or("")),
            p.pid.map(|x| x.to_string()).unwrap_or_default(),
            esc(p.status.as_deref().unwrap_or("")),
            p.restarts.map(|x| x.to_string()).unwrap_or_default(),
        );
    }
    w.html.push_str("</table>\n");
    if events.len() > MAX_ROWS {
        w.empty(&format!(
            "… {} more process events not shown.",
            events.len() - MAX_ROWS
        ));
    }
    w.end_section();
}

fn reward_vs_wall(m: &Metrics) -> Vec<(f64, f64)> {
    let t0 = first_t(m).unwrap_or(0.0);
    learner_steps(m)
        .filter_map(|(e, s)| Some((e.t - t0, s.reward_mean?)))
        .collect()
}

fn write_compare(
    w: &mut Writer,
    run_dir: &Path,
    this: &Metrics,
    summary: &ReportSummary,
    other_dir: &Path,
) -> Result<CompareSummary, ReportError> {
    w.section("compare", "Async vs on-policy");
    let other_path = other_dir.join("metrics.jsonl");
    let other = if other_path.exists() {
        Some(read_metrics(&other_path)?).filter(|m| !m.events.is_empty())
    } else {
        None
    };
    let other_wall = other.as_ref().and_then(wall_s);
    let other_stale = other.as_ref().and_then(max_staleness);
    let ratio = match (summary.wall_s, other_wall) {
        (Some(a), Some(b)) if a > 0.0 => Some(b / a),
        _ => None,
    };
    if other.is_none() {
        w.empty(&format!(
            "The comparison run has no metrics: {} is missing or has no valid events.",
            other_path.display()
        ));
    }
    let name = |d: &Path| {
        d.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| d.display().to_string())
    };
    let stale = |s: Option<u64>| s.map(|v| v.to_string()).unwrap_or_else(|| "—".into());
    let wall = |s: Option<f64>| s.map(duration).unwrap_or_else(|| "—".into());
    let _ = writeln!(
        w.html,
        "<table class=\"compare\">\n<tr><th class=\"l\">run</th><th class=\"l\">directory</th><th>max_staleness</th><th>wall-clock</th></tr>\n\
         <tr><td class=\"l\">this</td><td class=\"l\">{}</td><td>{}</td><td>{}</td></tr>\n\
         <tr><td class=\"l\">other</td><td class=\"l\">{}</td><td>{}</td><td>{}</td></tr>\n</table>\n\
         <p>Wall-clock ratio (other / this): <b class=\"ratio\">{}</b>{}</p>",
        esc(&run_dir.display().to_string()),
        stale(summary.max_staleness),
        wall(summary.wall_s),
        esc(&other_dir.display().to_string()),
        stale(other_stale),
        wall(other_wall),
        ratio.map(|r| format!("{r:.3}×")).unwrap_or_else(|| "—".into()),
        match ratio {
            Some(r) if r > 1.0 => " — this run finished faster.",
            Some(r) if r < 1.0 => " — the other run finished faster.",
            _ => "",
        }
    );
    let lines = [
        Line {
            label: format!(
                "this: {} (max_staleness {})",
                name(run_dir),
                stale(summary.max_staleness)
            ),
            color: color(0),
            points: reward_vs_wall(this),
        },
        Line {
            label: format!(
                "other: {} (max_staleness {})",
                name(other_dir),
                stale(other_stale)
            ),
            color: color(1),
            points: other.as_ref().map(reward_vs_wall).unwrap_or_default(),
        },
    ];
    w.chart(
        "compare_reward",
        "Reward mean against wall-clock for both runs",
        charts::line_chart(
            "Reward mean vs wall-clock",
            "seconds since run start",
            "reward mean",
            &lines,
            &[],
        ),
    )?;
    w.end_section();
    Ok(CompareSummary {
        other_dir: other_dir.to_path_buf(),
        other_wall_s: other_wall,
        other_max_staleness: other_stale,
        ratio,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_and_numbers() {
        assert_eq!(esc("<b>&\"'"), "&lt;b&gt;&amp;&quot;&#39;");
        assert_eq!(num(0.41), "0.41");
        assert_eq!(num(2.0), "2");
        assert_eq!(num(-0.00001), "0");
        assert_eq!(num(12345.6), "12346");
        assert_eq!(duration(3725.0), "3725 s (1h 02m 05s)");
    }

    #[test]
    fn lag_percentiles() {
        let counts: BTreeMap<u64, u64> = [(0, 5), (1, 3), (2, 1), (7, 1)].into_iter().collect();
        let s = lag_stats(&counts).unwrap();
        assert_eq!(s.count, 10);
        assert!((s.mean - 1.2).abs() < 1e-12);
        assert_eq!(s.median, 0);
        assert_eq!(s.p95, 7);
        assert_eq!(s.max, 7);
        assert!((s.on_policy_fraction - 0.5).abs() < 1e-12);
        assert!(lag_stats(&BTreeMap::new()).is_none());
    }
}
