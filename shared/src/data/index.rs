//! One dataset file of either format, behind one indexed interface.

use std::path::Path;

use serde_json::{Map, Value};

use super::error::{DataError, Result};
use super::jsonl::{JsonlFile, JsonlRows};
use super::parquet::{ParquetFile, ParquetRows};
use super::record::FieldError;

/// One row as read from a file, before mapping.
#[derive(Debug, Clone, PartialEq)]
pub struct RawRow {
    /// 0-based index of the row in its file (blank JSONL lines are not rows).
    pub index: u64,
    /// What messages call the row: the 1-based line (JSONL) or row (Parquet).
    pub row_no: u64,
    /// The row's columns, or why it could not be read as an object.
    pub fields: std::result::Result<Map<String, Value>, FieldError>,
}

/// A file's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// One JSON object a line.
    Jsonl,
    /// Apache Parquet.
    Parquet,
}

impl FileFormat {
    /// The format of `path` from its extension, if it is a dataset file.
    pub fn of(path: &Path) -> Option<FileFormat> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "jsonl" | "json" | "ndjson" => Some(FileFormat::Jsonl),
            "parquet" | "pq" => Some(FileFormat::Parquet),
            _ => None,
        }
    }
}

/// An indexed file of either format.
#[derive(Debug, Clone)]
pub enum RawFile {
    /// JSONL.
    Jsonl(JsonlFile),
    /// Parquet.
    Parquet(ParquetFile),
}

/// Rows of a [`RawFile`].
pub enum RawRows {
    /// From a JSONL file.
    Jsonl(JsonlRows),
    /// From a Parquet file.
    Parquet(ParquetRows),
}

impl Iterator for RawRows {
    type Item = Result<RawRow>;

    fn next(&mut self) -> Option<Result<RawRow>> {
        match self {
            RawRows::Jsonl(r) => r.next(),
            RawRows::Parquet(r) => r.next(),
        }
    }
}

impl RawFile {
    /// Opens and indexes `path` (format from its extension).
    pub fn open(path: &Path) -> Result<RawFile> {
        match FileFormat::of(path) {
            Some(FileFormat::Jsonl) => JsonlFile::open(path).map(RawFile::Jsonl),
            Some(FileFormat::Parquet) => ParquetFile::open(path).map(RawFile::Parquet),
            None => Err(DataError::UnknownFormat {
                path: path.to_path_buf(),
            }),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        match self {
            RawFile::Jsonl(f) => f.path(),
            RawFile::Parquet(f) => f.path(),
        }
    }

    /// Its format.
    pub fn format(&self) -> FileFormat {
        match self {
            RawFile::Jsonl(_) => FileFormat::Jsonl,
            RawFile::Parquet(_) => FileFormat::Parquet,
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> u64 {
        match self {
            RawFile::Jsonl(f) => f.rows(),
            RawFile::Parquet(f) => f.rows(),
        }
    }

    /// Top-level column names (Parquet: the schema's; JSONL: the keys of the first rows).
    pub fn columns(&self) -> &[String] {
        match self {
            RawFile::Jsonl(f) => f.columns(),
            RawFile::Parquet(f) => f.columns(),
        }
    }

    /// Rows from the 0-based row `start` on.
    pub fn rows_from(&self, start: u64) -> Result<RawRows> {
        Ok(match self {
            RawFile::Jsonl(f) => RawRows::Jsonl(f.rows_from(start)?),
            RawFile::Parquet(f) => RawRows::Parquet(f.rows_from(start)?),
        })
    }
}
