//! Reward-model training: loss and accuracy per step, held-out accuracy.

use std::fmt::Write as _;

use crate::charts::{self, color, Line};
use crate::html::{opt_text, pct, Writer};
use crate::{EventKind, Metrics, ReportError};

pub(crate) fn write_rm(w: &mut Writer, m: &Metrics) -> Result<(), ReportError> {
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
        "<table class=\"rm\">\n<tr><th>steps</th><th>held-out accuracy</th>\
         <th title=\"how often a held-out chosen answer scores higher under its own prompt than \
         under another pair's; 50 % = the scores ignore the prompt\">prompt match</th>\
         <th>training pairs</th><th>held-out pairs</th></tr>\n\
         <tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n</table>",
        opt_text(total),
        pct(done.and_then(|d| d.heldout_accuracy)),
        pct(done.and_then(|d| d.heldout_prompt_match)),
        opt_text(done.and_then(|d| d.pairs)),
        opt_text(done.and_then(|d| d.heldout_pairs)),
    );
    w.end_section();
    Ok(())
}
