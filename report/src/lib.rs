//! Run reports: `DIR/metrics.jsonl` (+ `DIR/heldout.json`) → `DIR/report/index.html` with SVG
//! charts beside it.
//!
//! The files it reads are defined in [`cascade_shared::metrics`], which documents every event
//! of `metrics.jsonl` and the held-out table; the report reads them through those types (the
//! event types are re-exported here). A malformed line of `metrics.jsonl` is skipped and
//! counted, never fatal: the report says "N malformed lines skipped, first at line K".
//!
//! # The report
//!
//! [`write_report`] writes `DIR/report/index.html` and `*.svg` beside it (linked with
//! `<img>`): run summary; reward, pass rate and response length per step by mode with stage
//! boundaries; learner and actor tokens/s over time; policy-lag histogram; learner idle
//! fraction overall and per stage; groups dropped per stage by reason; losses; RM training;
//! held-out table; supervisor process events; and, with [`ReportOptions::compare`], an "Async
//! vs on-policy" section comparing wall-clock and reward curves. All strings from the data are
//! HTML-escaped.
//!
//! In the held-out table, a row's "own domain" is its `after_stage` if that is a domain, else
//! the `stage_kind` that stage has in `metrics.jsonl`; the report highlights that cell and
//! marks ✓ if the score rose against the previous row, ✗ otherwise, beside the stage's paired
//! change (`gains`) when the table has it.
//!
//! A multi-seed run (`cascade run --seeds N`) gets its own page, [`write_seeds_report`]: the
//! held-out table as mean ± spread over seeds, each stage's own gain per seed, its changes to the
//! other domains, and the goals met or not.
//!
//! # Layout
//!
//! `analysis` (stages, lag, idle time, process counts from the events), `html` (escaping,
//! number formatting, the page writer), `charts` (SVG line charts and histograms), `sections/`
//! (one file per section of the page) and `write` ([`write_report`], the page in order).
#![warn(missing_docs)]

mod analysis;
mod charts;
mod html;
mod metrics;
mod sections;
mod seeds;
mod summary;
mod write;

use std::path::PathBuf;

pub use cascade_shared::metrics::{
    parse_metrics, ActorEvent, Event, EventKind, LearnerStep, Metrics, ModeStats, ProcessEvent,
    RmDone, RmStep, RunEnd, RunStart, SftStep, StageEnd,
};
pub use metrics::read_metrics;
pub use seeds::write_seeds_report;
pub use summary::{CompareSummary, LagStats, ReportSummary};
pub use write::write_report;

/// Errors of [`write_report`] and [`read_metrics`].
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// plotters failed to render a chart.
    #[error("chart {name}: {message}")]
    Chart {
        /// The chart's file stem.
        name: String,
        /// plotters' message.
        message: String,
    },
}

/// Options of [`write_report`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportOptions {
    /// Another run directory (typically the on-policy baseline) to compare
    /// against in an "Async vs on-policy" section.
    pub compare: Option<PathBuf>,
}
