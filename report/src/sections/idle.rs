//! The learner's idle fraction, overall and per RL stage.

use std::fmt::Write as _;

use crate::analysis::{idle_fraction, StageSpan};
use crate::html::{esc, num, pct, Writer};

pub(crate) fn bar(frac: Option<f64>) -> String {
    match frac.filter(|f| f.is_finite()) {
        Some(f) => format!(
            "<span class=\"bar\" style=\"width:{:.1}px\"></span>",
            (f.clamp(0.0, 1.0) * 200.0)
        ),
        None => String::new(),
    }
}

pub(crate) fn write_idle(w: &mut Writer, spans: &[StageSpan], step_s: f64, idle_s: f64) {
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
