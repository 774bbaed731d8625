//! The error type of everything that reads or writes published files.

use std::path::PathBuf;

/// Reading or writing a snapshot, a safetensors file or an atomically published directory.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// An I/O operation on a file or directory failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file (state, manifest) could not be read or written.
    #[error("{}: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// A safetensors file is malformed or does not hold what it must.
    #[error("{}: {reason}", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A snapshot directory is incomplete, fails its checksums, or may not be written.
    #[error("snapshot {}: {reason}", path.display())]
    Corrupt {
        /// The snapshot directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A tensor operation failed (reading tensors back to the host).
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

impl SnapshotError {
    /// Wraps an I/O error with the path it happened on.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SnapshotError::Io {
            path: path.into(),
            source,
        }
    }

    /// Wraps a JSON error with the path it happened on.
    pub fn json(path: impl Into<PathBuf>, source: serde_json::Error) -> Self {
        SnapshotError::Json {
            path: path.into(),
            source,
        }
    }

    /// A snapshot directory that is not what it must be.
    pub fn corrupt(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        SnapshotError::Corrupt {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

/// Result of the snapshot module.
pub type Result<T> = std::result::Result<T, SnapshotError>;
