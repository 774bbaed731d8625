//! The sections of the report page, one file each, in page order. Each writes its HTML (and
//! charts) into the [`Writer`](crate::html::Writer).

mod compare;
mod dropped;
mod heldout;
mod idle;
mod lag;
mod loss;
mod modes;
mod processes;
mod rm;
mod summary;
mod throughput;

pub(crate) use compare::write_compare;
pub(crate) use dropped::write_dropped;
pub(crate) use heldout::write_heldout;
pub(crate) use idle::write_idle;
pub(crate) use lag::write_policy_lag;
pub(crate) use loss::write_loss;
pub(crate) use modes::write_mode_charts;
pub(crate) use processes::write_processes;
pub(crate) use rm::write_rm;
pub(crate) use summary::write_summary;
pub(crate) use throughput::write_throughput;

use crate::analysis::StageSpan;
use crate::charts::Marker;

/// Stage-start markers against the global step.
fn step_markers(spans: &[StageSpan]) -> Vec<Marker> {
    spans
        .iter()
        .filter_map(|s| {
            Some(Marker {
                x: s.first_step? as f64,
                label: s.name.clone(),
            })
        })
        .collect()
}
