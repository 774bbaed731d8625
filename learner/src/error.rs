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
    /// A snapshot, a safetensors file or a published directory could not be read or written.
    #[error(transparent)]
    Snapshot(#[from] cascade_shared::snapshot::SnapshotError),
    /// A safetensors file is malformed or does not hold what it must (optimizer state).
    #[error("{path}: {reason}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// What the learner was given to publish is not publishable (e.g. a clashing file name).
    #[error("invalid snapshot input: {0}")]
    InvalidSnapshotInput(String),
    /// A run directory holds a run the options do not allow to touch (e.g. snapshots exist
    /// but `resume` was not asked for).
    #[error("{0}")]
    RunDir(String),
    /// A batch or micro-batch is empty or inconsistent.
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// A library function was called with arguments that cannot work together (a bug in the
    /// caller, not in the user's configuration).
    #[error("invalid call: {0}")]
    InvalidCall(String),
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
    /// A dataset cannot be read, or none of its rows is usable (from `cascade_shared::data`).
    #[error(transparent)]
    Data(#[from] cascade_shared::data::DataError),
    /// The model failed to load or run (from `cascade-shared`).
    #[error(transparent)]
    Model(#[from] cascade_shared::model::ModelError),
    /// The run's initial model could not be built.
    #[error(transparent)]
    InitialModel(#[from] cascade_shared::model::InitialModelError),
    /// The reward head could not score (empty or too long sequence, bad head shape).
    #[error(transparent)]
    RewardHead(#[from] cascade_shared::reward_head::RewardHeadError),
    /// The tokenizer or chat template failed (from `cascade-shared`).
    #[error(transparent)]
    Chat(#[from] cascade_shared::chat::ChatError),
    /// The rollout transport (replay log) failed.
    #[error("replay: {0}")]
    Transport(#[from] cascade_shared::transport::TransportError),
    /// A saved state (RNG position, replay cursors) does not parse.
    #[error("snapshot state: {0}")]
    State(String),
    /// A lock was poisoned by a panic in another thread.
    #[error("{0}: lock poisoned by a panicked thread")]
    Poisoned(&'static str),
    /// The run was asked to stop (SIGTERM/SIGINT) while waiting.
    #[error("stopped by a signal")]
    Stopped,
    /// The optimizer state does not match the parameters it is loaded for.
    #[error("optimizer state does not match the model: {0}")]
    OptimizerMismatch(String),
    /// A collective of the learner group failed (a rank died, timed out or disagreed).
    #[error("learner group: {0}")]
    Collective(#[from] cascade_shared::collective::CollectiveError),
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

impl From<cascade_shared::rng::BadRngState> for LearnerError {
    fn from(e: cascade_shared::rng::BadRngState) -> Self {
        LearnerError::State(e.to_string())
    }
}

/// The learner's result type.
pub type Result<T> = std::result::Result<T, LearnerError>;
