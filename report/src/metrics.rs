//! Reading `metrics.jsonl` from a file. The events and the line parser are the schema's, in
//! [`cascade_shared::metrics`].

use std::path::Path;

use cascade_shared::metrics::{parse_metrics, Metrics};

use crate::ReportError;

/// Reads and parses a `metrics.jsonl` file. Fails only if the file cannot be read (including
/// when it does not exist); content problems are counted in [`Metrics::malformed`], not
/// returned as errors.
pub fn read_metrics(path: impl AsRef<Path>) -> Result<Metrics, ReportError> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(parse_metrics(&bytes))
}
