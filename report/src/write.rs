//! [`write_report`]: the page, section by section.

use std::fmt::Write as _;
use std::path::Path;

use cascade_shared::metrics::METRICS_FILE;

use crate::analysis::{
    idle_fraction, lag_counts, lag_stats, learner_steps, max_staleness, process_stats, run_end,
    sft_steps, stages, wall_s,
};
use crate::html::{esc, Writer, CHART_NAMES, STYLE};
use crate::{read_metrics, sections, Metrics, ReportError, ReportOptions, ReportSummary};

/// Writes `run_dir/report/index.html` and its SVG charts.
///
/// A missing or empty `metrics.jsonl` gives a report that says there are no
/// metrics; a missing `heldout.json` omits the table (an unparsable one is
/// noted). Fails only on I/O errors (including a `run_dir` that is not a
/// directory) and chart rendering errors.
pub fn write_report(run_dir: &Path, opts: &ReportOptions) -> Result<ReportSummary, ReportError> {
    if !run_dir.is_dir() {
        return Err(ReportError::Io {
            path: run_dir.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "run directory not found"),
        });
    }
    let out_dir = run_dir.join("report");
    std::fs::create_dir_all(&out_dir).map_err(|source| ReportError::Io {
        path: out_dir.clone(),
        source,
    })?;
    for name in CHART_NAMES {
        // Stale charts of an earlier report must not linger; absence is fine.
        let _ = std::fs::remove_file(out_dir.join(format!("{name}.svg")));
    }

    let metrics_path = run_dir.join(METRICS_FILE);
    let (metrics, missing) = if metrics_path.exists() {
        let m = read_metrics(&metrics_path)?;
        let missing = m.events.is_empty().then(|| {
            format!(
                "This run has no metrics: {} has no valid events.",
                metrics_path.display()
            )
        });
        (m, missing)
    } else {
        (
            Metrics::default(),
            Some(format!(
                "This run has no metrics: {} does not exist.",
                metrics_path.display()
            )),
        )
    };

    let mut w = Writer {
        out_dir: out_dir.clone(),
        html: String::new(),
        charts: Vec::new(),
    };
    let title = format!(
        "Cascade run report — {}",
        run_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| run_dir.display().to_string())
    );
    let _ = write!(
        w.html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>{t}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{t}</h1>\n",
        t = esc(&title)
    );

    let spans = stages(&metrics);
    let counts = lag_counts(&metrics);
    let procs = process_stats(&metrics);
    let (step_s, idle_s) = learner_steps(&metrics).fold((0.0, 0.0), |(a, b), (_, s)| {
        (
            a + s.step_s.filter(|x| x.is_finite()).unwrap_or(0.0),
            b + s.idle_s.filter(|x| x.is_finite()).unwrap_or(0.0),
        )
    });
    let mut summary = ReportSummary {
        index_html: out_dir.join("index.html"),
        charts: Vec::new(),
        has_metrics: missing.is_none(),
        wall_s: wall_s(&metrics),
        status: run_end(&metrics).and_then(|r| r.status.clone()),
        max_staleness: max_staleness(&metrics),
        rl_steps: learner_steps(&metrics).count(),
        sft_steps: sft_steps(&metrics).count(),
        last_step: learner_steps(&metrics)
            .filter_map(|(_, s)| s.step)
            .chain(sft_steps(&metrics).filter_map(|(_, s)| s.step))
            .max(),
        stages: spans.iter().map(|s| s.name.clone()).collect(),
        idle_fraction: idle_fraction(step_s, idle_s),
        policy_lag: lag_stats(&counts),
        restarts: procs
            .iter()
            .map(|(k, v)| (k.clone(), v.restarts()))
            .collect(),
        malformed_lines: metrics.malformed,
        compare: None,
    };

    sections::write_summary(
        &mut w,
        run_dir,
        &metrics,
        missing.as_deref(),
        &spans,
        &procs,
        &summary,
    );
    if missing.is_none() {
        sections::write_mode_charts(&mut w, &metrics, &spans)?;
        sections::write_throughput(&mut w, &metrics, &spans)?;
        sections::write_policy_lag(&mut w, &counts, &summary)?;
        sections::write_idle(&mut w, &spans, step_s, idle_s);
        sections::write_dropped(&mut w, &spans);
        sections::write_loss(&mut w, &metrics, &spans)?;
        sections::write_rm(&mut w, &metrics)?;
    }
    sections::write_heldout(&mut w, run_dir, &metrics);
    if missing.is_none() {
        sections::write_processes(&mut w, &metrics);
    }
    if let Some(other) = &opts.compare {
        summary.compare = Some(sections::write_compare(
            &mut w, run_dir, &metrics, &summary, other,
        )?);
    }
    w.html.push_str("</body>\n</html>\n");

    std::fs::write(&summary.index_html, &w.html).map_err(|source| ReportError::Io {
        path: summary.index_html.clone(),
        source,
    })?;
    summary.charts = w.charts;
    Ok(summary)
}
