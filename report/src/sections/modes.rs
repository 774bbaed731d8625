//! Reward, pass rate and response length per RL step, by mode.

use crate::analysis::{learner_steps, modes, StageSpan};
use crate::charts::{self, color, Line};
use crate::html::Writer;
use crate::sections::step_markers;
use crate::{LearnerStep, Metrics, ModeStats, ReportError};

pub(crate) fn write_mode_charts(
    w: &mut Writer,
    m: &Metrics,
    spans: &[StageSpan],
) -> Result<(), ReportError> {
    let modes = modes(m);
    let markers = step_markers(spans);
    let steps: Vec<(f64, &LearnerStep)> = learner_steps(m)
        .filter_map(|(_, s)| Some((s.step? as f64, s)))
        .collect();
    let by_mode = |field: fn(&ModeStats) -> Option<f64>| -> Vec<Line> {
        modes
            .iter()
            .enumerate()
            .map(|(i, mode)| Line {
                label: mode.clone(),
                color: color(i),
                points: steps
                    .iter()
                    .filter_map(|(x, s)| Some((*x, field(s.by_mode.as_ref()?.get(mode)?)?)))
                    .collect(),
            })
            .collect()
    };

    w.section("reward", "Reward mean per step");
    let mut lines = by_mode(|s| s.reward_mean);
    lines.push(Line {
        label: "all".into(),
        color: ALL_MODES_GREY,
        points: steps
            .iter()
            .filter_map(|(x, s)| Some((*x, s.reward_mean?)))
            .collect(),
    });
    w.chart(
        "reward",
        "Reward mean per RL step by mode",
        charts::line_chart(
            "Reward mean by mode",
            "global step",
            "reward mean",
            &lines,
            &markers,
        ),
    )?;
    w.end_section();

    w.section("pass-rate", "Pass rate per step");
    w.chart(
        "pass_rate",
        "Pass rate per RL step by mode",
        charts::line_chart(
            "Pass rate by mode",
            "global step",
            "pass rate",
            &by_mode(|s| s.pass_rate),
            &markers,
        ),
    )?;
    w.end_section();

    w.section("response-length", "Response length");
    w.chart(
        "response_len",
        "Mean response length per RL step by mode",
        charts::line_chart(
            "Response length by mode",
            "global step",
            "tokens",
            &by_mode(|s| s.response_len),
            &markers,
        ),
    )?;
    w.end_section();
    Ok(())
}

/// Grey used for the "all modes" reward line.
const ALL_MODES_GREY: plotters::style::RGBColor = plotters::style::RGBColor(150, 150, 150);
