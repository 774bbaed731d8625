//! Parquet files through the `parquet` crate's record API, row groups as the index.
//!
//! Opening a file reads only its footer: the row count of each row group is the index. A read
//! from row `n` opens the file again with a predicate that skips the row groups before the one
//! holding `n`, then skips within that group; rows are decoded one at a time, so memory follows
//! one row group's pages, never the file. Nested columns (structs, lists, maps, lists of
//! message structs) come out as JSON objects and arrays; a binary column holding UTF-8 comes out
//! as a string (base64 otherwise). A truncated or corrupt file is a [`DataError::Parquet`] naming
//! it, at open or at the row where decoding fails; the record reader's panics on corrupt pages
//! are caught and reported the same way.

use std::fs::File;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use base64::Engine;
use parquet::errors::ParquetError;
use parquet::file::reader::FileReader;
use parquet::file::serialized_reader::{ReadOptionsBuilder, SerializedFileReader};
use parquet::record::reader::RowIter;
use parquet::record::{Field, Row};
use serde_json::{Map, Value};

use super::error::{DataError, Result};
use super::index::RawRow;

/// An indexed Parquet file.
#[derive(Debug, Clone)]
pub struct ParquetFile {
    path: PathBuf,
    /// First row (0-based) of each row group, then the total.
    group_starts: Vec<u64>,
    columns: Vec<String>,
}

impl ParquetFile {
    /// Reads the footer of `path`.
    pub fn open(path: &Path) -> Result<ParquetFile> {
        let reader = open_reader(path, 0)?;
        let meta = reader.metadata();
        let mut group_starts = Vec::with_capacity(meta.num_row_groups() + 1);
        let mut total = 0u64;
        for g in meta.row_groups() {
            group_starts.push(total);
            total += g.num_rows().max(0) as u64;
        }
        group_starts.push(total);
        let columns = meta
            .file_metadata()
            .schema_descr()
            .root_schema()
            .get_fields()
            .iter()
            .map(|f| f.name().to_string())
            .collect();
        Ok(ParquetFile {
            path: path.to_path_buf(),
            group_starts,
            columns,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of rows.
    pub fn rows(&self) -> u64 {
        *self.group_starts.last().unwrap_or(&0)
    }

    /// Number of row groups.
    pub fn row_groups(&self) -> usize {
        self.group_starts.len().saturating_sub(1)
    }

    /// The top-level columns of the schema.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// Rows from the 0-based row `start` on, in file order.
    pub fn rows_from(&self, start: u64) -> Result<ParquetRows> {
        let total = self.rows();
        if start >= total {
            return Ok(ParquetRows {
                path: self.path.clone(),
                iter: None,
                next_row: total,
                end: total,
            });
        }
        // The last group starting at or before `start`.
        let group = self.group_starts.partition_point(|&s| s <= start) - 1;
        let reader = open_reader(&self.path, group)?;
        let mut rows = ParquetRows {
            path: self.path.clone(),
            iter: Some(RowIter::from_file_into(Box::new(reader))),
            next_row: self.group_starts[group],
            end: total,
        };
        while rows.next_row < start {
            match rows.next_raw() {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => break,
            }
        }
        Ok(rows)
    }
}

fn parquet_err(path: &Path, source: ParquetError) -> DataError {
    DataError::Parquet {
        path: path.to_path_buf(),
        source,
    }
}

/// Opens `path` keeping the row groups from `first_group` on.
fn open_reader(path: &Path, first_group: usize) -> Result<SerializedFileReader<File>> {
    let file = File::open(path).map_err(|e| DataError::io(path, e))?;
    let options = ReadOptionsBuilder::new()
        .with_predicate(Box::new(move |_, i| i >= first_group))
        .build();
    SerializedFileReader::new_with_options(file, options).map_err(|e| parquet_err(path, e))
}

/// Rows of a [`ParquetFile`], decoded as they are asked for.
pub struct ParquetRows {
    path: PathBuf,
    iter: Option<RowIter<'static>>,
    next_row: u64,
    end: u64,
}

impl ParquetRows {
    fn next_raw(&mut self) -> Option<Result<Row>> {
        if self.next_row >= self.end {
            return None;
        }
        let iter = self.iter.as_mut()?;
        let next = catch_unwind(AssertUnwindSafe(|| iter.next()));
        let item = match next {
            Ok(Some(Ok(row))) => Ok(row),
            Ok(Some(Err(e))) => Err(parquet_err(&self.path, e)),
            Ok(None) => Err(parquet_err(
                &self.path,
                ParquetError::General(format!(
                    "the data ended at row {} of {} (truncated?)",
                    self.next_row + 1,
                    self.end
                )),
            )),
            Err(_) => Err(parquet_err(
                &self.path,
                ParquetError::General(format!(
                    "corrupt data at row {} (the decoder failed)",
                    self.next_row + 1
                )),
            )),
        };
        if item.is_err() {
            // Nothing after a failed page can be trusted.
            self.iter = None;
            self.end = self.next_row;
        }
        self.next_row += 1;
        Some(item)
    }
}

impl Iterator for ParquetRows {
    type Item = Result<RawRow>;

    fn next(&mut self) -> Option<Result<RawRow>> {
        let index = self.next_row;
        let row = self.next_raw()?;
        Some(row.map(|row| RawRow {
            index,
            row_no: index + 1,
            fields: Ok(row_to_json(&row)),
        }))
    }
}

/// A Parquet row as a JSON object of its columns.
pub fn row_to_json(row: &Row) -> Map<String, Value> {
    row.get_column_iter()
        .map(|(name, field)| (name.clone(), field_to_json(field)))
        .collect()
}

fn number(n: f64) -> Value {
    serde_json::Number::from_f64(n)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

/// A Parquet value as JSON. Binary that is valid UTF-8 becomes a string (Parquet writers often
/// leave the UTF-8 annotation off string columns), other binary is base64.
pub fn field_to_json(field: &Field) -> Value {
    match field {
        Field::Null => Value::Null,
        Field::Bool(b) => Value::Bool(*b),
        Field::Byte(n) => Value::from(*n),
        Field::Short(n) => Value::from(*n),
        Field::Int(n) => Value::from(*n),
        Field::Long(n) => Value::from(*n),
        Field::UByte(n) => Value::from(*n),
        Field::UShort(n) => Value::from(*n),
        Field::UInt(n) => Value::from(*n),
        Field::ULong(n) => Value::from(*n),
        Field::Float16(n) => number(f64::from(*n)),
        Field::Float(n) => number(f64::from(*n)),
        Field::Double(n) => number(*n),
        Field::Str(s) => Value::String(s.clone()),
        Field::Bytes(b) => match std::str::from_utf8(b.data()) {
            Ok(s) => Value::String(s.to_string()),
            Err(_) => Value::String(base64::engine::general_purpose::STANDARD.encode(b.data())),
        },
        Field::Group(row) => Value::Object(row_to_json(row)),
        Field::ListInternal(list) => {
            Value::Array(list.elements().iter().map(field_to_json).collect())
        }
        Field::MapInternal(map) => Value::Object(
            map.entries()
                .iter()
                .map(|(k, v)| {
                    let key = match field_to_json(k) {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (key, field_to_json(v))
                })
                .collect(),
        ),
        // Decimals, dates and times: their display form (ISO dates, decimal digits).
        other => Value::String(other.to_string().trim_matches('"').to_string()),
    }
}
