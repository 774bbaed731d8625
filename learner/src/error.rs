//! The learner's error type.

use std::path::PathBuf;

/// Everything that can go wrong in the learner library.
#[derive(Debug, thiserror::Error)]
pub enum LearnerError {
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// An I/O operation on a file or directory failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file (state, manifest, config) could not be read or written.
    #[error("{path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// A safetensors file is malformed or does not hold what it must.
    #[error("{path}: {reason}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A snapshot directory is incomplete or fails its checksums.
    #[error("snapshot {path}: {reason}")]
    CorruptSnapshot {
        /// The snapshot directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// No complete snapshot exists under the directory.
    #[error("no complete snapshot under {0}")]
    NoSnapshot(PathBuf),
    /// A batch or micro-batch is empty or inconsistent.
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The loss or the gradient norm was NaN/inf in too many consecutive steps.
    #[error(
        "{consecutive} optimizer steps in a row were skipped because the loss or the gradient \
         norm was not finite (limit {limit}); stopping with the weights of the last good step"
    )]
    TooManyNonFiniteSteps {
        /// Skipped steps in a row.
        consecutive: u32,
        /// The configured limit.
        limit: u32,
    },
    /// A training data file has a malformed line.
    #[error("{path}:{line}: {reason}")]
    Dataset {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The model, tokenizer or chat template failed (from `cascade-shared`).
    #[error("{0}")]
    Model(String),
    /// The rollout transport (replay log) failed.
    #[error("replay: {0}")]
    Transport(String),
    /// The run was asked to stop (SIGTERM/SIGINT) while waiting.
    #[error("stopped by a signal")]
    Stopped,
    /// The optimizer state does not match the parameters it is loaded for.
    #[error("optimizer state does not match the model: {0}")]
    OptimizerMismatch(String),
}

impl LearnerError {
    /// Wraps an I/O error with the path it happened on.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        LearnerError::Io {
            path: path.into(),
            source,
        }
    }

    /// Wraps a JSON error with the path it happened on.
    pub fn json(path: impl Into<PathBuf>, source: serde_json::Error) -> Self {
        LearnerError::Json {
            path: path.into(),
            source,
        }
    }
}

impl From<cascade_shared::model::ModelError> for LearnerError {
    fn from(e: cascade_shared::model::ModelError) -> Self {
        LearnerError::Model(e.to_string())
    }
}

impl From<cascade_shared::chat::ChatError> for LearnerError {
    fn from(e: cascade_shared::chat::ChatError) -> Self {
        LearnerError::Model(e.to_string())
    }
}

impl From<cascade_shared::transport::TransportError> for LearnerError {
    fn from(e: cascade_shared::transport::TransportError) -> Self {
        LearnerError::Transport(e.to_string())
    }
}

/// The learner's result type.
pub type Result<T> = std::result::Result<T, LearnerError>;
