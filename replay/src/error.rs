//! The crate's error type.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong in the replay log.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// An I/O call on a file or directory failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Reserving the blocks of a new segment failed: the disk (or the file-size limit) is full.
    /// Everything appended before stays readable.
    #[error("cannot preallocate segment {path} ({size} bytes): {source} (disk full or file size limit?)")]
    Preallocate {
        /// The segment being created.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The error from `posix_fallocate`.
        #[source]
        source: std::io::Error,
    },
    /// A record does not fit in one segment. Records never span segments: raise
    /// `WriterOptions::segment_size`.
    #[error("record payload of {payload} bytes does not fit in a segment of {segment_size} bytes (max payload {max_payload})")]
    RecordTooLarge {
        /// Payload length asked for.
        payload: usize,
        /// Configured segment size.
        segment_size: u64,
        /// The largest payload that fits.
        max_payload: usize,
    },
    /// A file that should be a segment is not one (bad magic, version or header CRC).
    #[error("{path} is not a valid replay segment: {reason}")]
    BadSegment {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Another process holds this actor directory's writer lock (one writer per directory).
    #[error("another writer holds the lock on {path}")]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// The learner did not consume fast enough within the backpressure timeout.
    #[error("backpressure: waited {waited:?} for the learner (next seq {next_seq}, consumed up to {consumed}, limit {limit})")]
    BackpressureTimeout {
        /// How long the writer waited.
        waited: Duration,
        /// The seq the writer wanted to append.
        next_seq: u64,
        /// The consumers' published position (next seq they will read).
        consumed: u64,
        /// What was exceeded (`max_inflight` records or `max_segments` segments).
        limit: String,
    },
    /// The cancel flag was raised while waiting.
    #[error("cancelled while waiting for the learner to consume")]
    Cancelled,
    /// A saved cursor points at data that retention has already deleted.
    #[error("cursor of actor {actor} wants seq {next_seq} in segment {segment}, but it was deleted (oldest segment starts at seq {oldest_seq})")]
    CursorLost {
        /// Actor directory name.
        actor: String,
        /// Segment of the cursor.
        segment: u64,
        /// Seq the cursor expects next.
        next_seq: u64,
        /// First seq still on disk.
        oldest_seq: u64,
    },
    /// Options that cannot work together.
    #[error("invalid replay options: {0}")]
    InvalidOptions(String),
    /// A consumed-position file does not parse.
    #[error("consumed-position file {path}: {reason}")]
    ConsumedFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// `Result` with [`ReplayError`].
pub type Result<T> = std::result::Result<T, ReplayError>;

/// Attaches a path to an `io::Error`.
pub(crate) trait IoContext<T> {
    /// Converts the error into [`ReplayError::Io`] for `path`.
    fn at(self, path: &std::path::Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: &std::path::Path) -> Result<T> {
        self.map_err(|source| ReplayError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}
