//! Groups dropped per RL stage, by reason.

use std::fmt::Write as _;

use crate::analysis::StageSpan;
use crate::html::{esc, pct, Writer};

pub(crate) fn write_dropped(w: &mut Writer, spans: &[StageSpan]) {
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
