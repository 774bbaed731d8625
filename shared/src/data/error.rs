//! Errors of the dataset readers.

use std::fmt;
use std::path::PathBuf;

/// Result of the dataset readers.
pub type Result<T> = std::result::Result<T, DataError>;

/// One rejected row: which file, which row (the 1-based line of a JSONL file, the 1-based row
/// of a Parquet file), which column, and why. Rejections are counted and reported; they never
/// stop a read by themselves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowError {
    /// The file.
    pub path: PathBuf,
    /// 1-based line (JSONL) or row (Parquet).
    pub row: u64,
    /// The column (a path such as `reward_model.ground_truth`), when one is to blame.
    pub column: Option<String>,
    /// Why the row was rejected.
    pub reason: String,
}

impl fmt::Display for RowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: ", self.path.display(), self.row)?;
        if let Some(c) = &self.column {
            write!(f, "column `{c}`: ")?;
        }
        f.write_str(&self.reason)
    }
}

impl std::error::Error for RowError {}

/// Why a dataset cannot be read at all (a rejected row is a [`RowError`] instead).
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// Reading a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A Parquet file is unreadable (truncated, not Parquet, an unsupported codec).
    #[error("{}: not a readable Parquet file: {source}", path.display())]
    Parquet {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: ::parquet::errors::ParquetError,
    },
    /// No file matches the dataset's path, glob or directory.
    #[error("{pattern}: no JSONL or Parquet file matches")]
    NoFiles {
        /// What was asked for.
        pattern: String,
    },
    /// The file's format cannot be told from its name.
    #[error("{}: unknown format (expected .jsonl, .json, .ndjson or .parquet)", path.display())]
    UnknownFormat {
        /// The file.
        path: PathBuf,
    },
    /// The schema cannot be recognised, is ambiguous, or does not fit the kind asked for.
    #[error("{}: {reason}", path.display())]
    Schema {
        /// The (first) file.
        path: PathBuf,
        /// What was found and what could apply.
        reason: String,
    },
    /// An explicit column mapping does not parse.
    #[error("column mapping {spec:?}: {reason}")]
    Mapping {
        /// The mapping as written.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A row asked for by number is out of range or rejected.
    #[error(transparent)]
    Row(#[from] RowError),
    /// Every row of the dataset was rejected.
    #[error("{pattern}: all {rejected} rows rejected; first reasons:\n{first}")]
    AllRejected {
        /// The dataset.
        pattern: String,
        /// How many rows were rejected.
        rejected: u64,
        /// The first few reasons, one a line.
        first: String,
    },
}

impl DataError {
    /// An I/O error about `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.into(),
            source,
        }
    }
}
