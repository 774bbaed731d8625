//! Parquet files through the `parquet` crate's record API, row groups as the index.
//!
//! Opening a file reads its footer: the row count of each row group is the index. The file
//! stays open from then on and is read by position (`pread`), so that sequential passes and
//! single rows (from any thread) never open it again. A read from row `n` starts at the row
//! group holding `n` and skips within that group; rows are decoded one at a time, so memory
//! follows one row group's pages, never the file. [`ParquetFile::decode_group`] decodes one
//! whole group, for [`crate::data::DataReader`]'s cache of recently drawn groups. Nested
//! columns (structs, lists, maps, lists of message structs) come out as JSON objects and arrays;
//! a binary column holding UTF-8 comes out as a string (base64 otherwise). A truncated or
//! corrupt file is a [`DataError::Parquet`] naming it, at open or at the row where decoding
//! fails; the record reader's panics on corrupt pages are caught and reported the same way.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::reader::{ChunkReader, FileReader, Length, RowGroupReader};
use parquet::file::serialized_reader::SerializedFileReader;
use parquet::record::reader::RowIter;
use parquet::record::{Field, Row};
use parquet::schema::types::Type as SchemaType;
use serde_json::{Map, Value};

use super::error::{DataError, Result};
use super::index::{IoCounts, RawRow};

/// The open file, read by position: any number of readers (and threads) share it without a
/// shared seek position.
struct Pread {
    file: Arc<File>,
    len: u64,
    counts: Arc<IoCounts>,
}

impl Length for Pread {
    fn len(&self) -> u64 {
        self.len
    }
}

/// A [`Read`] from an offset of a [`Pread`].
struct PreadFrom {
    file: Arc<File>,
    pos: u64,
    counts: Arc<IoCounts>,
}

impl Read for PreadFrom {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        self.counts.read(n);
        Ok(n)
    }
}

impl ChunkReader for Pread {
    type T = std::io::BufReader<PreadFrom>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(std::io::BufReader::new(PreadFrom {
            file: self.file.clone(),
            pos: start,
            counts: self.counts.clone(),
        }))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let mut buf = vec![0u8; length];
        self.file.read_exact_at(&mut buf, start).map_err(|e| {
            ParquetError::EOF(format!(
                "expected {length} bytes at offset {start} of a {}-byte file: {e}",
                self.len
            ))
        })?;
        self.counts.read(length);
        Ok(Bytes::from(buf))
    }
}

type Reader = SerializedFileReader<Pread>;

/// The row groups `first..end` of a file, as a file of their own (what [`RowIter`] iterates).
struct Groups {
    inner: Arc<Reader>,
    first: usize,
    end: usize,
    counts: Arc<IoCounts>,
}

impl FileReader for Groups {
    fn metadata(&self) -> &ParquetMetaData {
        self.inner.metadata()
    }

    fn num_row_groups(&self) -> usize {
        self.end - self.first
    }

    fn get_row_group(&self, i: usize) -> parquet::errors::Result<Box<dyn RowGroupReader + '_>> {
        self.counts.group_decoded();
        self.inner.get_row_group(self.first + i)
    }

    fn get_row_iter(&self, projection: Option<SchemaType>) -> parquet::errors::Result<RowIter<'_>> {
        RowIter::from_file(projection, self)
    }
}

/// An indexed Parquet file.
#[derive(Clone)]
pub struct ParquetFile {
    path: PathBuf,
    /// The open file with its footer.
    reader: Arc<Reader>,
    /// First row (0-based) of each row group, then the total.
    group_starts: Vec<u64>,
    columns: Vec<String>,
    counts: Arc<IoCounts>,
}

impl fmt::Debug for ParquetFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParquetFile")
            .field("path", &self.path)
            .field("group_starts", &self.group_starts)
            .field("columns", &self.columns)
            .finish_non_exhaustive()
    }
}

/// One row group decoded whole (see [`ParquetFile::decode_group`]).
#[derive(Debug)]
pub struct DecodedGroup {
    /// Its first row (0-based, in the file).
    pub first: u64,
    /// Its rows, in order, up to the first that failed to decode.
    pub rows: Vec<Map<String, Value>>,
    /// Why decoding stopped before the group's end, if it did.
    pub failure: Option<String>,
    /// An estimate of the heap bytes the rows hold.
    pub bytes: usize,
}

impl ParquetFile {
    /// Opens `path` and reads its footer. The file stays open for the reads.
    pub fn open(path: &Path) -> Result<ParquetFile> {
        let file = File::open(path).map_err(|e| DataError::io(path, e))?;
        let len = file.metadata().map_err(|e| DataError::io(path, e))?.len();
        let counts = Arc::new(IoCounts::default());
        counts.opened();
        let pread = Pread {
            file: Arc::new(file),
            len,
            counts: counts.clone(),
        };
        let reader = SerializedFileReader::new(pread).map_err(|e| parquet_err(path, e))?;
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
            reader: Arc::new(reader),
            group_starts,
            columns,
            counts,
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

    /// What reading the file has done so far (opens, bytes, row groups decoded).
    pub fn counts(&self) -> &IoCounts {
        &self.counts
    }

    /// The row group holding row `row` (`row < rows`).
    pub fn group_of(&self, row: u64) -> usize {
        self.group_starts.partition_point(|&s| s <= row) - 1
    }

    /// Row group `group`'s uncompressed size, as its metadata gives it.
    pub fn group_size(&self, group: usize) -> u64 {
        self.reader
            .metadata()
            .row_group(group)
            .total_byte_size()
            .max(0) as u64
    }

    fn rows_of_groups(&self, first: usize, end: usize) -> ParquetRows {
        let groups = Groups {
            inner: self.reader.clone(),
            first,
            end,
            counts: self.counts.clone(),
        };
        ParquetRows {
            path: self.path.clone(),
            iter: Some(RowIter::from_file_into(Box::new(groups))),
            next_row: self.group_starts[first],
            end: self.group_starts[end],
        }
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
        let mut rows = self.rows_of_groups(self.group_of(start), self.row_groups());
        while rows.next_row < start {
            match rows.next_raw() {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => break,
            }
        }
        Ok(rows)
    }

    /// Decodes row group `group` whole; a row that fails to decode ends it (the rows before
    /// it are kept, with the reason).
    pub fn decode_group(&self, group: usize) -> DecodedGroup {
        let mut out = DecodedGroup {
            first: self.group_starts[group],
            rows: Vec::new(),
            failure: None,
            bytes: 0,
        };
        for r in self.rows_of_groups(group, group + 1) {
            match r {
                Ok(raw) => {
                    let fields = raw.fields.unwrap_or_default();
                    out.bytes += map_bytes(&fields);
                    out.rows.push(fields);
                }
                Err(e) => {
                    out.failure = Some(match e {
                        DataError::Parquet {
                            source: ParquetError::General(m),
                            ..
                        } => m,
                        DataError::Parquet { source, .. } => source.to_string(),
                        other => other.to_string(),
                    });
                    break;
                }
            }
        }
        out
    }

    /// Row `row` of a group [`ParquetFile::decode_group`] gave (`None` outside it).
    pub fn row_in(&self, group: &DecodedGroup, row: u64) -> Option<Result<RawRow>> {
        let k = row.checked_sub(group.first)? as usize;
        let end = self.group_starts[self.group_of(group.first) + 1];
        if row >= end {
            return None;
        }
        Some(match group.rows.get(k) {
            Some(fields) => Ok(RawRow {
                index: row,
                row_no: row + 1,
                fields: Ok(fields.clone()),
            }),
            None => {
                Err(parquet_err(
                    &self.path,
                    ParquetError::General(group.failure.clone().unwrap_or_else(|| {
                        format!("the data ended at row {} (truncated?)", row + 1)
                    })),
                ))
            }
        })
    }
}

/// An estimate of the heap bytes a value holds (strings, vectors, map entries).
fn value_bytes(v: &Value) -> usize {
    match v {
        Value::String(s) => s.capacity(),
        Value::Array(a) => {
            a.capacity() * std::mem::size_of::<Value>() + a.iter().map(value_bytes).sum::<usize>()
        }
        Value::Object(o) => map_bytes(o),
        _ => 0,
    }
}

/// Bytes of one `BTreeMap<String, Value>` leaf node: 11 keys and values, parent, lengths.
const BTREE_NODE: usize = 11 * (std::mem::size_of::<String>() + std::mem::size_of::<Value>()) + 16;

/// [`value_bytes`] of a map: its tree's nodes, and each key's and value's own heap bytes.
fn map_bytes(m: &Map<String, Value>) -> usize {
    m.len().div_ceil(11) * BTREE_NODE
        + m.iter()
            .map(|(k, v)| k.capacity() + value_bytes(v))
            .sum::<usize>()
}

fn parquet_err(path: &Path, source: ParquetError) -> DataError {
    DataError::Parquet {
        path: path.to_path_buf(),
        source,
    }
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
