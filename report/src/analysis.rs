//! What the report computes from the events before it writes anything: the stages as seen
//! through their step events, policy-lag statistics, idle time and per-process counts.

use std::collections::{BTreeMap, BTreeSet};

use crate::{Event, EventKind, LagStats, LearnerStep, Metrics, RunEnd, RunStart, SftStep};

const UNNAMED: &str = "(unnamed)";

/// One stage as seen through its step events.
#[derive(Debug, Clone, Default)]
pub(crate) struct StageSpan {
    pub(crate) name: String,
    pub(crate) kind: Option<String>,
    pub(crate) index: Option<u64>,
    pub(crate) rl_steps: usize,
    pub(crate) sft_steps: usize,
    pub(crate) skipped: usize,
    pub(crate) first_step: Option<u64>,
    pub(crate) first_t: f64,
    pub(crate) step_s: f64,
    pub(crate) idle_s: f64,
    pub(crate) kept: u64,
    pub(crate) dropped: BTreeMap<String, u64>,
    pub(crate) ended: bool,
}

pub(crate) fn learner_steps(m: &Metrics) -> impl Iterator<Item = (&Event, &LearnerStep)> {
    m.events.iter().filter_map(|e| match &e.kind {
        EventKind::LearnerStep(s) => Some((e, s)),
        _ => None,
    })
}

pub(crate) fn sft_steps(m: &Metrics) -> impl Iterator<Item = (&Event, &SftStep)> {
    m.events.iter().filter_map(|e| match &e.kind {
        EventKind::SftStep(s) => Some((e, s)),
        _ => None,
    })
}

pub(crate) fn first_t(m: &Metrics) -> Option<f64> {
    m.events.iter().map(|e| e.t).min_by(f64::total_cmp)
}

fn last_t(m: &Metrics) -> Option<f64> {
    m.events.iter().map(|e| e.t).max_by(f64::total_cmp)
}

pub(crate) fn run_start(m: &Metrics) -> Option<&RunStart> {
    m.events.iter().find_map(|e| match &e.kind {
        EventKind::RunStart(r) => Some(r),
        _ => None,
    })
}

pub(crate) fn run_end(m: &Metrics) -> Option<&RunEnd> {
    m.events.iter().rev().find_map(|e| match &e.kind {
        EventKind::RunEnd(r) => Some(r),
        _ => None,
    })
}

/// `run_end.wall_s`, else last t − first t.
pub(crate) fn wall_s(m: &Metrics) -> Option<f64> {
    run_end(m)
        .and_then(|r| r.wall_s)
        .filter(|w| w.is_finite())
        .or_else(|| Some(last_t(m)? - first_t(m)?))
}

pub(crate) fn max_staleness(m: &Metrics) -> Option<u64> {
    run_start(m)
        .and_then(|r| r.max_staleness)
        .or_else(|| run_end(m).and_then(|r| r.max_staleness))
}

pub(crate) fn stages(m: &Metrics) -> Vec<StageSpan> {
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

pub(crate) fn idle_fraction(step_s: f64, idle_s: f64) -> Option<f64> {
    (step_s > 0.0).then(|| idle_s / step_s)
}

pub(crate) fn lag_counts(m: &Metrics) -> BTreeMap<u64, u64> {
    let mut counts = BTreeMap::new();
    for (_, s) in learner_steps(m) {
        for &lag in s.policy_lag.iter().flatten() {
            *counts.entry(lag).or_insert(0) += 1;
        }
    }
    counts
}

pub(crate) fn lag_stats(counts: &BTreeMap<u64, u64>) -> Option<LagStats> {
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
pub(crate) struct ProcStats {
    pub(crate) starts: u64,
    pub(crate) exits: u64,
    pub(crate) restart_events: u64,
    pub(crate) restarts_field: u64,
    pub(crate) gave_up: bool,
    pub(crate) last_status: Option<String>,
}

impl ProcStats {
    pub(crate) fn restarts(&self) -> u64 {
        self.restart_events.max(self.restarts_field)
    }
}

pub(crate) fn process_stats(m: &Metrics) -> BTreeMap<String, ProcStats> {
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
pub(crate) fn modes(m: &Metrics) -> Vec<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
