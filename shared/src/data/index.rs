//! One dataset file of either format, behind one indexed interface.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// What reads of one file have done (shared by its clones): how often it was opened, how many
/// bytes were read from it and how many Parquet row groups were decoded. The readers keep a
/// file open from its indexing on, so `opens` stays 1 however rows are asked for.
#[derive(Debug, Default)]
pub struct IoCounts {
    opens: AtomicU64,
    bytes: AtomicU64,
    groups: AtomicU64,
}

impl IoCounts {
    /// Times the file was opened.
    pub fn opens(&self) -> u64 {
        self.opens.load(Ordering::Relaxed)
    }

    /// Bytes read from it (JSONL; Parquet counts the column chunks and footer it read).
    pub fn bytes_read(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Parquet row groups whose decoding started (a sequential pass decodes each once).
    pub fn group_decodes(&self) -> u64 {
        self.groups.load(Ordering::Relaxed)
    }

    pub(crate) fn opened(&self) {
        self.opens.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn read(&self, n: usize) {
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn group_decoded(&self) {
        self.groups.fetch_add(1, Ordering::Relaxed);
    }
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

    /// What reading it has done so far.
    pub fn counts(&self) -> &IoCounts {
        match self {
            RawFile::Jsonl(f) => f.counts(),
            RawFile::Parquet(f) => f.counts(),
        }
    }

    /// Row `row` alone (`None` past the end). A Parquet file decodes the row's group up to it;
    /// [`crate::data::DataReader::get`] keeps recently decoded groups.
    pub fn get(&self, row: u64) -> Result<Option<RawRow>> {
        match self {
            RawFile::Jsonl(f) => f.get(row),
            RawFile::Parquet(f) => f.rows_from(row)?.next().transpose(),
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
