//! The supervisor's process events (starts, exits, restarts), in time order.

use std::fmt::Write as _;

use crate::analysis::first_t;
use crate::html::{esc, num, Writer};
use crate::{Event, EventKind, Metrics, ProcessEvent};

pub(crate) fn write_processes(w: &mut Writer, m: &Metrics) {
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
