//! JSONL files through a sparse byte-offset index.
//!
//! Opening a file scans it once and keeps the byte offset (and line number) of every
//! [`STRIDE`]-th row, so the index costs 16 bytes per `STRIDE` rows whatever the rows hold; a
//! row is then reached by reading from the nearest checkpoint before it and skipping at most
//! `STRIDE - 1` lines. The file is opened once, at [`JsonlFile::open`], and read through that
//! handle by position (`pread`) from then on: sequential passes and single rows alike, from any
//! number of threads, without opening it again. Rows are read into a buffer that grows to the
//! longest line: memory follows the longest line, never the file (no memory map, so reading
//! leaves no file pages counted against the process, and a file that shrinks under the reader
//! is an error rather than a `SIGBUS`). Blank lines are not rows (as in the current readers),
//! but rows are reported by their 1-based line number.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value};

use super::error::{DataError, Result};
use super::index::{IoCounts, RawRow};
use super::record::FieldError;

/// Rows between two index checkpoints.
pub const STRIDE: u64 = 256;

/// Bytes read at a time by a sequential pass.
const READ_BUFFER: usize = 1 << 20;

/// Bytes read at a time when one row is asked for (a draw reads on average half a stride).
const ROW_BUFFER: usize = 64 << 10;

/// An indexed JSONL file.
#[derive(Debug, Clone)]
pub struct JsonlFile {
    path: PathBuf,
    /// The file, open from [`JsonlFile::open`] on.
    file: Arc<File>,
    rows: u64,
    /// `(byte offset, 1-based line)` of rows 0, STRIDE, 2·STRIDE, ...
    checkpoints: Vec<(u64, u64)>,
    /// Top-level keys of the first rows that parse, in order of first appearance.
    columns: Vec<String>,
    counts: Arc<IoCounts>,
}

fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

/// Rows whose keys are collected for detection.
const PROBE_ROWS: usize = 16;

/// Reads at `offset` until `buf` is full or the file ends; the number of bytes read.
fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// What the opening scan learns of a file.
#[derive(Default)]
struct Scan {
    rows: u64,
    checkpoints: Vec<(u64, u64)>,
    columns: Vec<String>,
    /// 1-based number of the line being scanned.
    line: u64,
    /// Offset of its first byte.
    line_start: u64,
    /// Whether it has a byte that is not whitespace so far.
    nonblank: bool,
    /// Its bytes so far, while rows are probed for their keys.
    probe: Vec<u8>,
}

impl Scan {
    fn part(&mut self, bytes: &[u8]) {
        self.nonblank = self.nonblank || !is_blank(bytes);
        if (self.rows as usize) < PROBE_ROWS {
            self.probe.extend_from_slice(bytes);
        }
    }

    /// The line ends; the next one starts at `next_start`.
    fn end_line(&mut self, next_start: u64) {
        self.line += 1;
        if self.nonblank {
            // Row `rows` is the next checkpoint's (`is_multiple_of` is newer than our MSRV).
            if self.checkpoints.len() as u64 * STRIDE == self.rows {
                self.checkpoints.push((self.line_start, self.line));
            }
            if (self.rows as usize) < PROBE_ROWS {
                if let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(&self.probe) {
                    for k in o.keys() {
                        if !self.columns.contains(k) {
                            self.columns.push(k.clone());
                        }
                    }
                }
            }
            self.rows += 1;
        }
        self.probe.clear();
        self.nonblank = false;
        self.line_start = next_start;
    }
}

impl JsonlFile {
    /// Opens `path`, scans it and builds its index. The file stays open for the reads.
    pub fn open(path: &Path) -> Result<JsonlFile> {
        JsonlFile::open_with(path, READ_BUFFER)
    }

    /// [`JsonlFile::open`], reading `chunk` bytes at a time.
    fn open_with(path: &Path, chunk: usize) -> Result<JsonlFile> {
        let file = File::open(path).map_err(|e| DataError::io(path, e))?;
        let counts = Arc::new(IoCounts::default());
        counts.opened();
        let mut buf = vec![0u8; chunk];
        let mut scan = Scan::default();
        let mut pos = 0u64;
        loop {
            let n = read_full_at(&file, &mut buf, pos).map_err(|e| DataError::io(path, e))?;
            if n == 0 {
                break;
            }
            counts.read(n);
            let chunk = &buf[..n];
            let mut i = 0;
            for nl in memchr::memchr_iter(b'\n', chunk) {
                scan.part(&chunk[i..nl]);
                scan.end_line(pos + nl as u64 + 1);
                i = nl + 1;
            }
            scan.part(&chunk[i..]);
            pos += n as u64;
        }
        if scan.line_start < pos {
            // A last line without a newline.
            scan.end_line(pos);
        }
        Ok(JsonlFile {
            path: path.to_path_buf(),
            file: Arc::new(file),
            rows: scan.rows,
            checkpoints: scan.checkpoints,
            columns: scan.columns,
            counts,
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

    /// What reading the file has done so far (opens, bytes read).
    pub fn counts(&self) -> &IoCounts {
        &self.counts
    }

    /// Rows from the 0-based row `start` on, in file order.
    pub fn rows_from(&self, start: u64) -> Result<JsonlRows> {
        self.rows_with(start, READ_BUFFER)
    }

    /// Row `row` alone (reads only around it).
    pub fn get(&self, row: u64) -> Result<Option<RawRow>> {
        self.rows_with(row, ROW_BUFFER)?.next().transpose()
    }

    fn rows_with(&self, start: u64, chunk: usize) -> Result<JsonlRows> {
        let mut rows = JsonlRows {
            path: self.path.clone(),
            file: None,
            counts: self.counts.clone(),
            buf: Vec::new(),
            chunk,
            offset: 0,
            begin: 0,
            filled: 0,
            eof: false,
            current: (0, 0),
            next_row: start.min(self.rows),
            line: 0,
            end: self.rows,
        };
        if start >= self.rows {
            return Ok(rows);
        }
        let (offset, line) = self.checkpoints[(start / STRIDE) as usize];
        rows.file = Some(self.file.clone());
        rows.offset = offset;
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
    file: Option<Arc<File>>,
    counts: Arc<IoCounts>,
    /// `buf[..filled]` holds the file's bytes from `offset` on; `buf[begin..filled]` is not
    /// consumed yet.
    buf: Vec<u8>,
    /// Bytes to read at a time.
    chunk: usize,
    offset: u64,
    begin: usize,
    filled: usize,
    /// The file has no bytes after `buf[..filled]`.
    eof: bool,
    /// The last line read: `buf[current.0..current.1]`, with its newline.
    current: (usize, usize),
    next_row: u64,
    /// 1-based line of the last line read.
    line: u64,
    end: u64,
}

impl JsonlRows {
    /// Reads more of the file after `buf[..filled]`, keeping `buf[begin..filled]` (moved to
    /// the front); `false` when the file has no more bytes.
    fn fill(&mut self, file: &File) -> Result<bool> {
        if self.eof {
            return Ok(false);
        }
        if self.begin > 0 {
            self.buf.copy_within(self.begin..self.filled, 0);
            self.offset += self.begin as u64;
            self.filled -= self.begin;
            self.begin = 0;
        }
        if self.buf.len() - self.filled < self.chunk {
            self.buf.resize(self.filled + self.chunk, 0);
        }
        let at = self.offset + self.filled as u64;
        let n = read_full_at(file, &mut self.buf[self.filled..], at)
            .map_err(|e| DataError::io(&self.path, e))?;
        self.counts.read(n);
        self.filled += n;
        if n == 0 {
            self.eof = true;
        }
        Ok(n > 0)
    }

    /// Reads the next non-blank line into `current`; `false` at the end.
    fn next_line(&mut self) -> Result<bool> {
        let Some(file) = self.file.clone() else {
            return Ok(false);
        };
        loop {
            let mut searched = self.begin;
            let newline = loop {
                if let Some(i) = memchr::memchr(b'\n', &self.buf[searched..self.filled]) {
                    break Some(searched + i);
                }
                let kept = self.filled - self.begin;
                if !self.fill(&file)? {
                    break None;
                }
                searched = self.begin + kept;
            };
            let (start, next) = match newline {
                Some(i) => (self.begin, i + 1),
                // A last line without a newline.
                None if self.begin < self.filled => (self.begin, self.filled),
                None => {
                    // The file shrank since it was indexed.
                    return Err(DataError::io(
                        &self.path,
                        std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            format!("file ended at line {} while the index has {} rows; it changed after it was opened", self.line, self.end),
                        ),
                    ));
                }
            };
            // The line with its newline, as the readers before this one parsed it (serde's
            // positions in a message are the same).
            self.current = (start, next);
            self.begin = next;
            self.line += 1;
            if !is_blank(&self.buf[start..next]) {
                self.next_row += 1;
                return Ok(true);
            }
        }
    }
}

impl JsonlRows {
    /// The next row's line, unparsed: `(row index in the file, 1-based line, its bytes with
    /// the newline)`; `None` at the end. For callers that parse lines elsewhere (in parallel,
    /// [`parse_line`]); an error ends the rows.
    pub fn next_raw(&mut self) -> Option<Result<(u64, u64, &[u8])>> {
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
        let (start, end) = self.current;
        Some(Ok((index, self.line, &self.buf[start..end])))
    }
}

impl Iterator for JsonlRows {
    type Item = Result<RawRow>;

    fn next(&mut self) -> Option<Result<RawRow>> {
        Some(self.next_raw()?.map(|(index, row_no, line)| RawRow {
            index,
            row_no,
            fields: parse_line(line),
        }))
    }
}

/// A row's line as the JSON object of its columns. A line that is UTF-8 (checked once, not
/// string by string) is parsed as text; any other goes through the byte parser, for its error
/// message.
pub fn parse_line(line: &[u8]) -> std::result::Result<Map<String, Value>, FieldError> {
    let parsed = match std::str::from_utf8(line) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(line),
    };
    match parsed {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(FieldError::row("expected a JSON object")),
        Err(e) => Err(FieldError::row(format!("not valid JSON: {e}"))),
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

    /// Lines longer than a read, lines split across reads, CRLF endings, blank lines of
    /// spaces, and a last line without a newline: whatever the read size, the index and the
    /// rows are those of `str::lines`.
    #[test]
    fn reads_of_any_size_give_the_same_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.jsonl");
        let mut text = String::from("   \n\n");
        for i in 0..700u64 {
            let pad = "x".repeat((i as usize * 37) % 300);
            let end = if i % 5 == 0 { "\r\n" } else { "\n" };
            text.push_str(&format!("{{\"i\": {i}, \"pad\": \"{pad}\"}}{end}"));
            if i % 11 == 0 {
                text.push_str(" \t \n");
            }
        }
        text.push_str("{\"i\": 700}");
        std::fs::write(&path, &text).unwrap();
        let lines: Vec<(usize, &str)> = text
            .split('\n')
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .collect();
        assert_eq!(lines.len(), 701);
        for chunk in [1usize, 7, 64, 301, 4096, READ_BUFFER] {
            let f = JsonlFile::open_with(&path, chunk).unwrap();
            assert_eq!(f.rows(), 701, "chunk {chunk}");
            assert_eq!(f.columns(), ["i", "pad"]);
            for start in [0u64, 1, 255, 256, 511, 512, 699, 700] {
                let rows: Vec<RawRow> = f
                    .rows_with(start, chunk)
                    .unwrap()
                    .map(|r| r.unwrap())
                    .collect();
                assert_eq!(rows.len() as u64, 701 - start);
                for r in rows {
                    let (line, _) = lines[r.index as usize];
                    assert_eq!(r.row_no, line as u64 + 1, "chunk {chunk}");
                    assert_eq!(r.fields.unwrap()["i"], r.index);
                }
            }
        }
        // One file handle serves every read: the file can go away once it is open.
        let f = JsonlFile::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        for row in [699u64, 3, 256, 700, 0] {
            assert_eq!(f.get(row).unwrap().unwrap().fields.unwrap()["i"], row);
        }
        assert_eq!(f.counts().opens(), 1);
        assert!(f.get(701).unwrap().is_none());
    }
}
