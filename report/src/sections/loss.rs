//! The learner's loss per step (RL and SFT).

use crate::analysis::{learner_steps, sft_steps, StageSpan};
use crate::charts::{self, color, Line};
use crate::html::Writer;
use crate::sections::step_markers;
use crate::{Metrics, ReportError};

pub(crate) fn write_loss(
    w: &mut Writer,
    m: &Metrics,
    spans: &[StageSpan],
) -> Result<(), ReportError> {
    let rl: Vec<(f64, f64)> = learner_steps(m)
        .filter_map(|(_, s)| Some((s.step? as f64, s.loss?)))
        .collect();
    let sft: Vec<(f64, f64)> = sft_steps(m)
        .filter_map(|(_, s)| Some((s.step? as f64, s.loss?)))
        .collect();
    w.section("loss", "Training loss");
    w.chart(
        "loss",
        "Learner loss per step (RL and SFT)",
        charts::line_chart(
            "Learner loss",
            "global step",
            "loss",
            &[
                Line {
                    label: "RL".into(),
                    color: color(0),
                    points: rl,
                },
                Line {
                    label: "SFT".into(),
                    color: color(2),
                    points: sft,
                },
            ],
            &step_markers(spans),
        ),
    )?;
    w.end_section();
    Ok(())
}
