//! Errors of the run configuration.

use std::path::PathBuf;

/// A configuration that cannot be used. Every variant names the key (a dotted path such as
/// `stages[2].lr`) or the file it is about.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{source_name}: invalid TOML: {message}")]
    Syntax {
        /// The file (or a description of the text).
        source_name: String,
        /// The TOML parser's message, with line and column.
        message: String,
    },
    /// A key is unknown, or a value has the wrong type or is not one of the allowed values.
    #[error("{source_name}: {key}: {message}")]
    Schema {
        /// The file (or a description of the text).
        source_name: String,
        /// The dotted key path.
        key: String,
        /// serde's message: the allowed keys/values or the expected type.
        message: String,
    },
    /// A `--set KEY=VALUE` override could not be applied.
    #[error("--set {spec}: {message}")]
    Override {
        /// The override as given.
        spec: String,
        /// What was wrong.
        message: String,
    },
    /// A value is well-typed but not allowed (a cross-field check of `validate`).
    #[error("{key}: {message}")]
    Invalid {
        /// The dotted key path.
        key: String,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// A file the config names does not exist.
    #[error("{key}: file {path} does not exist")]
    MissingFile {
        /// The dotted key path.
        key: String,
        /// The resolved path.
        path: PathBuf,
    },
}

/// Result alias of the config module.
pub type Result<T> = std::result::Result<T, ConfigError>;

/// Shorthand for [`ConfigError::Invalid`].
pub(crate) fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}
