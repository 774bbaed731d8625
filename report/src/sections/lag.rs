//! The policy-lag histogram and its statistics.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::charts;
use crate::html::{num, opt_text, pct, Writer};
use crate::{ReportError, ReportSummary};

pub(crate) fn write_policy_lag(
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
            opt_text(summary.max_staleness)
        );
    }
    w.end_section();
    Ok(())
}
