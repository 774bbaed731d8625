//! Learner and actor tokens/s over wall-clock, and the per-actor table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::analysis::{first_t, StageSpan};
use crate::charts::{self, color, Line, Marker};
use crate::html::{esc, opt_num, Writer};
use crate::{ActorEvent, Event, EventKind, Metrics, ReportError};

pub(crate) fn actor_label(e: &Event, a: &ActorEvent) -> String {
    match &a.actor {
        Some(serde_json::Value::Number(n)) => format!("actor-{n}"),
        Some(serde_json::Value::String(s)) => s.clone(),
        _ => e.proc_name.clone(),
    }
}

pub(crate) fn write_throughput(
    w: &mut Writer,
    m: &Metrics,
    spans: &[StageSpan],
) -> Result<(), ReportError> {
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
