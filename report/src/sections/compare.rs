//! "Async vs on-policy": wall-clock and reward against wall-clock beside another run.

use std::fmt::Write as _;
use std::path::Path;

use cascade_shared::metrics::METRICS_FILE;

use crate::analysis::{first_t, learner_steps, max_staleness, wall_s};
use crate::charts::{self, color, Line};
use crate::html::{duration, esc, opt_text, Writer};
use crate::{read_metrics, CompareSummary, Metrics, ReportError, ReportSummary};

pub(crate) fn reward_vs_wall(m: &Metrics) -> Vec<(f64, f64)> {
    let t0 = first_t(m).unwrap_or(0.0);
    learner_steps(m)
        .filter_map(|(e, s)| Some((e.t - t0, s.reward_mean?)))
        .collect()
}

pub(crate) fn write_compare(
    w: &mut Writer,
    run_dir: &Path,
    this: &Metrics,
    summary: &ReportSummary,
    other_dir: &Path,
) -> Result<CompareSummary, ReportError> {
    w.section("compare", "Async vs on-policy");
    let other_path = other_dir.join(METRICS_FILE);
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
    let wall = |s: Option<f64>| s.map(duration).unwrap_or_else(|| "—".into());
    let _ = writeln!(
        w.html,
        "<table class=\"compare\">\n<tr><th class=\"l\">run</th><th class=\"l\">directory</th><th>max_staleness</th><th>wall-clock</th></tr>\n\
         <tr><td class=\"l\">this</td><td class=\"l\">{}</td><td>{}</td><td>{}</td></tr>\n\
         <tr><td class=\"l\">other</td><td class=\"l\">{}</td><td>{}</td><td>{}</td></tr>\n</table>\n\
         <p>Wall-clock ratio (other / this): <b class=\"ratio\">{}</b>{}</p>",
        esc(&run_dir.display().to_string()),
        opt_text(summary.max_staleness),
        wall(summary.wall_s),
        esc(&other_dir.display().to_string()),
        opt_text(other_stale),
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
                opt_text(summary.max_staleness)
            ),
            color: color(0),
            points: reward_vs_wall(this),
        },
        Line {
            label: format!(
                "other: {} (max_staleness {})",
                name(other_dir),
                opt_text(other_stale)
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
