//! The held-out table (`heldout.json`, [`HeldoutTable`]) with each stage's own domain
//! highlighted.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use cascade_shared::metrics::{HeldoutTable, HELDOUT_FILE};

use crate::analysis::learner_steps;
use crate::html::{esc, num, opt_num, Writer};
use crate::Metrics;

/// The held-out table, or a note that the run has none (or an unreadable one).
pub(crate) fn write_heldout(w: &mut Writer, run_dir: &Path, m: &Metrics) {
    let path = run_dir.join(HELDOUT_FILE);
    w.section("heldout", "Held-out evaluation");
    let heldout: HeldoutTable = match std::fs::read(&path) {
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
    // A score that was not a number (written as null) shows as missing, like an absent one.
    let score = |row: usize, domain: &str| -> Option<f64> {
        heldout.rows[row]
            .scores
            .get(domain)
            .copied()
            .filter(|s| !s.is_nan())
    };
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
            let value = score(i, d);
            let class = if own.as_deref() == Some(d.as_str()) {
                " class=\"diag\""
            } else {
                ""
            };
            let _ = write!(
                w.html,
                "<td{class} data-domain=\"{}\">{}</td>",
                esc(d),
                opt_num(value)
            );
        }
        let verdict = match &own {
            Some(d) => {
                let cur = score(i, d);
                let prev = i.checked_sub(1).and_then(|p| score(p, d));
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
