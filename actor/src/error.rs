//! Errors of the actor crate (the samplers keep their own [`crate::sampler::SamplerError`]).

use std::path::PathBuf;

/// What can go wrong in the actor.
#[derive(Debug, thiserror::Error)]
pub enum ActorError {
    /// The model failed (forward pass, loading, a prompt longer than the cache allows).
    #[error(transparent)]
    Model(#[from] cascade_shared::model::ModelError),
    /// The run's initial model could not be built.
    #[error(transparent)]
    InitialModel(#[from] cascade_shared::model::InitialModelError),
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// Sampling failed.
    #[error(transparent)]
    Sampler(#[from] crate::sampler::SamplerError),
    /// The chat template or tokenizer failed.
    #[error(transparent)]
    Chat(#[from] cascade_shared::chat::ChatError),
    /// Writing to the replay log failed.
    #[error(transparent)]
    Transport(#[from] cascade_shared::transport::TransportError),
    /// Reading or writing the snapshot directory failed (e.g. the acknowledgement file).
    #[error(transparent)]
    SnapshotFiles(#[from] cascade_shared::snapshot::SnapshotError),
    /// The reward model could not score (empty or too long sequence, bad head).
    #[error(transparent)]
    RewardHead(#[from] cascade_shared::reward_head::RewardHeadError),
    /// A snapshot could not be used (the reason is in the message).
    #[error("snapshot {path}: {reason}")]
    Snapshot {
        /// The snapshot directory.
        path: PathBuf,
        /// Why it was refused.
        reason: String,
    },
    /// A dataset line is malformed.
    #[error("{path}:{line}: {reason}")]
    Dataset {
        /// The dataset file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// An invalid setting or an inconsistent call.
    #[error("{0}")]
    Invalid(String),
    /// The reward pipeline stopped (a worker thread died or a channel closed).
    #[error("reward pipeline: {0}")]
    Pipeline(String),
}

/// Result alias of the actor crate.
pub type Result<T> = std::result::Result<T, ActorError>;

impl ActorError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ActorError::Io {
            path: path.into(),
            source,
        }
    }
}
