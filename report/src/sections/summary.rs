//! "Run summary": status, wall-clock, step counts, the stages and the restarts per process.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::analysis::{learner_steps, run_end, run_start, ProcStats, StageSpan};
use crate::html::{duration, esc, json_value_text, pct, Writer};
use crate::{Metrics, ReportSummary};

pub(crate) fn write_summary(
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
