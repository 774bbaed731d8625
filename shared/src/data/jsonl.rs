//! JSONL files through a sparse byte-offset index.
//!
//! Opening a file scans it once and keeps the byte offset (and line number) of every
//! [`STRIDE`]-th row, so the index costs 16 bytes per `STRIDE` rows whatever the rows hold; a
//! row is then reached by seeking to the nearest checkpoint before it and skipping at most
//! `STRIDE - 1` lines. Rows are read one line at a time into a reused buffer: memory follows the
//! longest line, never the file. Blank lines are not rows (as in the current readers), but rows
//! are reported by their 1-based line number.

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::error::{DataError, Result};
use super::index::RawRow;
use super::record::FieldError;

/// Rows between two index checkpoints.
pub const STRIDE: u64 = 256;

const READ_BUFFER: usize = 1 << 20;

/// An indexed JSONL file.
#[derive(Debug, Clone)]
pub struct JsonlFile {
    path: PathBuf,
    rows: u64,
    /// `(byte offset, 1-based line)` of rows 0, STRIDE, 2·STRIDE, ...
    checkpoints: Vec<(u64, u64)>,
    /// Top-level keys of the first rows that parse, in order of first appearance.
    columns: Vec<String>,
}

fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

/// Rows whose keys are collected for detection.
const PROBE_ROWS: usize = 16;

impl JsonlFile {
    /// Scans `path` and builds its index.
    pub fn open(path: &Path) -> Result<JsonlFile> {
        let file = File::open(path).map_err(|e| DataError::io(path, e))?;
        let mut reader = BufReader::with_capacity(READ_BUFFER, file);
        let mut buf = Vec::new();
        let (mut offset, mut line, mut rows) = (0u64, 0u64, 0u64);
        let mut checkpoints = Vec::new();
        let mut columns: Vec<String> = Vec::new();
        loop {
            buf.clear();
            let n = reader
                .read_until(b'\n', &mut buf)
                .map_err(|e| DataError::io(path, e))?;
            if n == 0 {
                break;
            }
            line += 1;
            if !is_blank(&buf) {
                if rows % STRIDE == 0 {
                    checkpoints.push((offset, line));
                }
                if (rows as usize) < PROBE_ROWS {
                    if let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(&buf) {
                        for k in o.keys() {
                            if !columns.contains(k) {
                                columns.push(k.clone());
                            }
                        }
                    }
                }
                rows += 1;
            }
            offset += n as u64;
        }
        Ok(JsonlFile {
            path: path.to_path_buf(),
            rows,
            checkpoints,
            columns,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of rows (non-blank lines).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The top-level keys seen in the first rows.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// Rows from the 0-based row `start` on, in file order.
    pub fn rows_from(&self, start: u64) -> Result<JsonlRows> {
        let mut rows = JsonlRows {
            path: self.path.clone(),
            reader: None,
            buf: Vec::new(),
            next_row: start.min(self.rows),
            line: 0,
            end: self.rows,
        };
        if start >= self.rows {
            return Ok(rows);
        }
        let (offset, line) = self.checkpoints[(start / STRIDE) as usize];
        let mut file = File::open(&self.path).map_err(|e| DataError::io(&self.path, e))?;
        file.seek(SeekFrom::Start(offset))
            .map_err(|e| DataError::io(&self.path, e))?;
        rows.reader = Some(BufReader::with_capacity(READ_BUFFER, file));
        rows.line = line - 1;
        rows.next_row = start - start % STRIDE;
        for _ in 0..start % STRIDE {
            rows.next_line()?;
        }
        Ok(rows)
    }
}

/// Rows of a [`JsonlFile`], read as they are asked for.
pub struct JsonlRows {
    path: PathBuf,
    reader: Option<BufReader<File>>,
    buf: Vec<u8>,
    next_row: u64,
    /// 1-based line of the last line read.
    line: u64,
    end: u64,
}

impl JsonlRows {
    /// Reads the next non-blank line into `buf`; `false` at the end.
    fn next_line(&mut self) -> Result<bool> {
        let Some(reader) = self.reader.as_mut() else {
            return Ok(false);
        };
        loop {
            self.buf.clear();
            let n = reader
                .read_until(b'\n', &mut self.buf)
                .map_err(|e| DataError::io(&self.path, e))?;
            if n == 0 {
                // The file shrank since it was indexed.
                return Err(DataError::io(
                    &self.path,
                    std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("file ended at line {} while the index has {} rows; it changed after it was opened", self.line, self.end),
                    ),
                ));
            }
            self.line += 1;
            if !is_blank(&self.buf) {
                self.next_row += 1;
                return Ok(true);
            }
        }
    }
}

impl Iterator for JsonlRows {
    type Item = Result<RawRow>;

    fn next(&mut self) -> Option<Result<RawRow>> {
        if self.next_row >= self.end {
            return None;
        }
        let index = self.next_row;
        match self.next_line() {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => {
                self.end = 0;
                return Some(Err(e));
            }
        }
        let fields = match serde_json::from_slice::<Value>(&self.buf) {
            Ok(Value::Object(o)) => Ok(o),
            Ok(_) => Err(FieldError::row("expected a JSON object")),
            Err(e) => Err(FieldError::row(format!("not valid JSON: {e}"))),
        };
        Some(Ok(RawRow {
            index,
            row_no: self.line,
            fields,
        }))
    }
}

/// Parses one JSONL line on its own (for tests and tools).
pub fn parse_object(text: &str) -> std::result::Result<Map<String, Value>, FieldError> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(FieldError::row("expected a JSON object")),
        Err(e) => Err(FieldError::row(format!("not valid JSON: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_reaches_every_row_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.jsonl");
        let mut text = String::new();
        for i in 0..1000 {
            if i % 7 == 0 {
                text.push_str("\n  \n");
            }
            text.push_str(&format!("{{\"i\": {i}}}\n"));
        }
        text.push_str("[1]\n{\"i\": 1000}");
        std::fs::write(&path, &text).unwrap();
        let f = JsonlFile::open(&path).unwrap();
        assert_eq!(f.rows(), 1002);
        assert_eq!(f.columns(), ["i"]);
        let lines: Vec<&str> = text.lines().collect();
        for start in [0u64, 1, 255, 256, 257, 700, 999, 1000, 1001] {
            let row = f.rows_from(start).unwrap().next().unwrap().unwrap();
            assert_eq!(row.index, start);
            let line = lines[row.row_no as usize - 1];
            match &row.fields {
                Ok(o) => assert_eq!(o["i"], if start == 1001 { 1000 } else { start }),
                Err(e) => {
                    assert_eq!(line, "[1]");
                    assert!(e.reason.contains("object"));
                }
            }
        }
        let all: Vec<_> = f.rows_from(0).unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(all.len(), 1002);
        assert!(f.rows_from(1002).unwrap().next().is_none());
    }
}
