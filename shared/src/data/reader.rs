//! A dataset: one file, a glob or a directory of shards, with a schema, read as canonical rows.
//!
//! Rows are numbered globally in file order (files sorted by name); that number is the row's
//! default RL `id`, a resume position, and what shards split ([`DataReader::shard_range`]).
//! Every row comes out as a [`ReadRow`]: accepted, rejected (a [`RowError`] naming file, row and
//! column), or skipped on purpose (a HelpSteer3 tie, a LiveCodeBench problem outside the asked
//! dates).

use std::collections::VecDeque;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

use super::error::{DataError, Result, RowError};
use super::index::{FileFormat, RawFile, RawRow, RawRows};
use super::parquet::{DecodedGroup, ParquetFile};
use super::presets::{detect, MapOptions, Mapped, Preset, Probe};
use super::record::{self, FieldError, Row};
use super::schema::Schema;
use crate::StageKind;

/// The kind of rows a dataset holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Kind {
    /// SFT conversations.
    Sft,
    /// RL prompts (with the reference fields of their domain).
    Rl,
    /// Preference pairs.
    Pairs,
}

impl Kind {
    /// `sft`, `rl` or `pairs`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Sft => "sft",
            Kind::Rl => "rl",
            Kind::Pairs => "pairs",
        }
    }
}

/// What to read and how.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataSpec {
    /// A file, a glob (`data/train-*.parquet`) or a directory (its `.jsonl` / `.parquet` files).
    pub path: String,
    /// The schema; detected from the columns when `None`.
    pub schema: Option<Schema>,
    /// The kind of rows wanted (narrows detection; checked against the schema).
    pub kind: Option<Kind>,
    /// The RL domain (a stage's kind): rows are checked for the fields its verifier needs.
    pub domain: Option<StageKind>,
    /// LiveCodeBench: keep problems with `contest_date` ≥ this.
    pub since: Option<String>,
    /// LiveCodeBench: keep problems with `contest_date` < this.
    pub until: Option<String>,
}

impl DataSpec {
    /// `path` (a file, glob or directory) read as rows of `kind`, the schema recognised from
    /// the columns.
    pub fn of_kind(path: impl AsRef<Path>, kind: Kind) -> DataSpec {
        DataSpec {
            path: path.as_ref().display().to_string(),
            kind: Some(kind),
            ..DataSpec::default()
        }
    }
}

/// What became of one row.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A canonical row.
    Accepted(Row),
    /// Rejected, with where and why.
    Rejected(RowError),
    /// Left out on purpose, with why.
    Skipped(RowError),
}

/// One row of a dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadRow {
    /// Global 0-based row number.
    pub index: u64,
    /// What became of it.
    pub outcome: Outcome,
    /// Index of its file in [`DataReader::files`].
    pub file: usize,
    /// What messages call it: the 1-based line (JSONL) or row (Parquet) in its file.
    pub row_no: u64,
}

/// Counts of a full pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Rows read.
    pub rows: u64,
    /// Rows accepted.
    pub accepted: u64,
    /// Rows rejected.
    pub rejected: u64,
    /// Rows skipped on purpose.
    pub skipped: u64,
    /// The first rejections (at most [`FIRST_REASONS`]).
    pub first_rejections: Vec<RowError>,
}

/// How many rejections [`ReadStats`] keeps.
pub const FIRST_REASONS: usize = 10;

/// A dataset ready to be read.
#[derive(Debug, Clone)]
pub struct DataReader {
    pattern: String,
    files: Vec<RawFile>,
    /// Global row number of each file's first row, then the total.
    starts: Vec<u64>,
    schema: Schema,
    kind: Kind,
    domain: Option<StageKind>,
    options: MapOptions,
    /// Parquet row groups decoded for [`DataReader::get`] (shared by clones).
    groups: Arc<Mutex<GroupCache>>,
    /// Threads that parse JSONL lines in a sequential pass ([`DataReader::set_parse_threads`]).
    parse_threads: usize,
}

/// Rows parsed together in a sequential pass over a JSONL file (fewer when their lines pass
/// [`BATCH_BYTES`]): what a pass holds besides the rows it returns.
const BATCH_ROWS: usize = 1024;

/// Bytes of lines in a batch before it is cut short (a file of 40K-token conversations).
const BATCH_BYTES: usize = 8 << 20;

/// A batch is split across threads only in shares of at least this many rows.
const MIN_ROWS_PER_THREAD: usize = 64;

/// The default of [`DataReader::set_parse_threads`]: the machine's cores, at most 8.
fn default_parse_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

/// Default bound of [`DataReader`]'s cache of decoded Parquet row groups, in (estimated) heap
/// bytes of the decoded rows.
pub const GROUP_CACHE_BYTES: usize = 64 << 20;

/// Recently decoded Parquet row groups, least recently used first, within a byte budget: what
/// reads by row number (a shuffled prompt schedule) keep between draws, so that a draw from a
/// group decoded before costs a copy of its row, not a decode of the group.
///
/// When the groups drawn do not fit (the cache has evicted) and fewer than half the draws
/// since hit it, the cache stops taking groups: a miss then decodes its group only up to the
/// row (half a group on average, where decoding a group to keep it costs a whole one), and the
/// groups already kept still serve their draws.
#[derive(Debug)]
struct GroupCache {
    budget: usize,
    bytes: usize,
    /// `(file, group, rows)`.
    groups: VecDeque<(usize, usize, Arc<DecodedGroup>)>,
    /// Whether a group was evicted yet.
    full: bool,
    /// Hits and misses since the first eviction.
    hits: u64,
    misses: u64,
}

impl GroupCache {
    fn new(budget: usize) -> GroupCache {
        GroupCache {
            budget,
            bytes: 0,
            groups: VecDeque::new(),
            full: false,
            hits: 0,
            misses: 0,
        }
    }

    /// Whether a group decoded for a miss should be kept: not when the cache has been full
    /// for a while and misses more often than it hits.
    fn takes_groups(&self) -> bool {
        !(self.full && self.misses >= 16 && self.hits < self.misses)
    }

    /// Counts a lookup (from the first eviction on).
    fn count(&mut self, hit: bool) {
        if self.full {
            if hit {
                self.hits += 1;
            } else {
                self.misses += 1;
            }
        }
    }

    fn find(&mut self, file: usize, group: usize) -> Option<Arc<DecodedGroup>> {
        let at = self
            .groups
            .iter()
            .position(|(f, g, _)| *f == file && *g == group)?;
        let entry = self.groups.remove(at)?;
        let rows = entry.2.clone();
        self.groups.push_back(entry);
        Some(rows)
    }

    fn insert(&mut self, file: usize, group: usize, rows: Arc<DecodedGroup>) {
        if rows.bytes > self.budget || self.find(file, group).is_some() {
            return;
        }
        self.bytes += rows.bytes;
        self.groups.push_back((file, group, rows));
        while self.bytes > self.budget {
            match self.groups.pop_front() {
                Some((_, _, old)) => {
                    self.bytes -= old.bytes;
                    self.full = true;
                }
                None => break,
            }
        }
    }
}

/// Rows probed for detection.
const PROBE_ROWS: usize = 16;

/// The dataset files `path` names: itself, the files of a glob, or the dataset files of a
/// directory, sorted by name.
pub fn resolve_files(path: &str) -> Result<Vec<PathBuf>> {
    let p = Path::new(path);
    let mut files: Vec<PathBuf> = if p.is_dir() {
        std::fs::read_dir(p)
            .map_err(|e| DataError::io(p, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|f| f.is_file() && FileFormat::of(f).is_some())
            .collect()
    } else if path.contains(['*', '?', '[']) {
        let paths = glob::glob(path).map_err(|e| DataError::Mapping {
            spec: path.to_string(),
            reason: format!("not a valid glob: {e}"),
        })?;
        paths
            .filter_map(|r| r.ok())
            .filter(|f| f.is_file())
            .collect()
    } else {
        if !p.exists() {
            return Err(DataError::io(
                p,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
            ));
        }
        vec![p.to_path_buf()]
    };
    files.sort();
    if files.is_empty() {
        return Err(DataError::NoFiles {
            pattern: path.to_string(),
        });
    }
    Ok(files)
}

/// The kind a canonical object is, when no preset says: pairs with `chosen`/`rejected`, SFT
/// with `mode` or an assistant turn, RL otherwise.
fn infer_kind(obj: &Map<String, Value>) -> Kind {
    if obj.contains_key("chosen") && obj.contains_key("rejected") {
        return Kind::Pairs;
    }
    let has_assistant = obj
        .get("messages")
        .and_then(Value::as_array)
        .is_some_and(|l| {
            l.iter()
                .any(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
        });
    if obj.contains_key("mode") || has_assistant {
        Kind::Sft
    } else {
        Kind::Rl
    }
}

impl DataReader {
    /// Opens every file of `spec.path`, indexes them, and settles the schema (given, or
    /// detected from the first file's columns and first rows).
    pub fn open(spec: &DataSpec) -> Result<DataReader> {
        let paths = resolve_files(&spec.path)?;
        let mut files = Vec::with_capacity(paths.len());
        let mut starts = Vec::with_capacity(paths.len() + 1);
        let mut total = 0u64;
        for p in &paths {
            let f = RawFile::open(p)?;
            starts.push(total);
            total += f.rows();
            files.push(f);
        }
        starts.push(total);
        let first = &files[0];
        let schema_err = |reason: String| DataError::Schema {
            path: first.path().to_path_buf(),
            reason,
        };
        let probe_rows: Vec<Map<String, Value>> = first
            .rows_from(0)?
            .take(PROBE_ROWS)
            .filter_map(|r| r.ok().and_then(|r| r.fields.ok()))
            .collect();
        let (schema, kind) = match &spec.schema {
            Some(Schema::Preset(p)) => (Schema::Preset(*p), p.kind()),
            Some(Schema::Mapping(m)) => {
                let kind = spec.kind.unwrap_or_else(|| {
                    probe_rows
                        .first()
                        .and_then(|r| m.apply(r).ok())
                        .map(|o| infer_kind(&o))
                        .unwrap_or(Kind::Rl)
                });
                (Schema::Mapping(m.clone()), kind)
            }
            None => {
                let probe = Probe::new(first.columns(), probe_rows.iter());
                let preset = detect(&probe, spec.kind).map_err(schema_err)?;
                (Schema::Preset(preset), preset.kind())
            }
        };
        if let Some(k) = spec.kind.filter(|k| *k != kind) {
            return Err(schema_err(format!(
                "the schema {} gives {} rows, not {}",
                schema.describe(),
                kind.as_str(),
                k.as_str()
            )));
        }
        let preset_domain = match &schema {
            Schema::Preset(p) => p.domain(),
            Schema::Mapping(_) => None,
        };
        if let (Some(want), Some(has)) = (spec.domain, preset_domain) {
            if want != has && want != StageKind::Rlhf {
                return Err(schema_err(format!(
                    "the schema {} gives {has} prompts, not {want}",
                    schema.describe()
                )));
            }
        }
        if spec.domain.is_some() && kind != Kind::Rl {
            return Err(schema_err(format!(
                "--domain applies to RL prompts, and these are {} rows",
                kind.as_str()
            )));
        }
        Ok(DataReader {
            pattern: spec.path.clone(),
            files,
            starts,
            schema,
            kind,
            domain: spec.domain.or(preset_domain),
            options: MapOptions {
                domain: spec.domain,
                since: spec.since.clone(),
                until: spec.until.clone(),
            },
            groups: Arc::new(Mutex::new(GroupCache::new(GROUP_CACHE_BYTES))),
            parse_threads: default_parse_threads(),
        })
    }

    /// Sets how many threads parse and map JSONL rows in a sequential pass
    /// ([`DataReader::rows_in`]); 0 = the default, the machine's cores (at most 8). Rows
    /// come out in file order whatever the count; 1 parses on the caller's thread alone.
    pub fn set_parse_threads(&mut self, threads: usize) {
        self.parse_threads = if threads == 0 {
            default_parse_threads()
        } else {
            threads
        };
    }

    /// Bounds the cache of decoded Parquet row groups that [`DataReader::get`] keeps to
    /// `bytes` (estimated heap bytes of the rows; default [`GROUP_CACHE_BYTES`]); 0 keeps none.
    /// A group larger than the bound is decoded up to the row asked for, per draw.
    pub fn set_group_cache_bytes(&mut self, bytes: usize) {
        self.groups = Arc::new(Mutex::new(GroupCache::new(bytes)));
    }

    /// The (estimated) heap bytes and the number of the row groups cached now.
    pub fn cached_groups(&self) -> (usize, usize) {
        let cache = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        (cache.bytes, cache.groups.len())
    }

    /// Row `row` of Parquet file `file` (its index), through the cache of decoded groups.
    fn parquet_row(&self, file: usize, p: &ParquetFile, row: u64) -> Result<Option<RawRow>> {
        let group = p.group_of(row);
        let keep = {
            let mut cache = self.groups.lock().unwrap_or_else(|e| e.into_inner());
            let found = cache.find(file, group);
            cache.count(found.is_some());
            if let Some(rows) = found {
                return p.row_in(&rows, row).transpose();
            }
            cache.takes_groups() && p.group_size(group) <= cache.budget as u64
        };
        if !keep {
            // Not to be kept (too large, or the cache does not pay): decode up to the row.
            return p.rows_from(row)?.next().transpose();
        }
        let rows = Arc::new(p.decode_group(group));
        let out = p.row_in(&rows, row).transpose();
        self.groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(file, group, rows);
        out
    }

    /// The files, in read order.
    pub fn files(&self) -> &[RawFile] {
        &self.files
    }

    /// The schema in use.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The kind of rows.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The RL domain rows are checked against, when known for the whole dataset.
    pub fn domain(&self) -> Option<StageKind> {
        self.domain
    }

    /// Number of rows (before any is rejected).
    pub fn len(&self) -> u64 {
        *self.starts.last().unwrap_or(&0)
    }

    /// Whether the dataset has no row at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rows shard `shard` of `shards` reads: a contiguous range, the shards together
    /// covering every row once.
    pub fn shard_range(&self, shard: usize, shards: usize) -> Range<u64> {
        let n = self.len() as u128;
        let shards = shards.max(1) as u128;
        let s = (shard as u128).min(shards);
        ((n * s / shards) as u64)..((n * (s + 1).min(shards) / shards) as u64)
    }

    /// Rows from global row `start` on, in order.
    pub fn rows_from(&self, start: u64) -> Result<Rows<'_>> {
        self.rows_in(start..self.len())
    }

    /// The rows of `range` (global row numbers), in order.
    pub fn rows_in(&self, range: Range<u64>) -> Result<Rows<'_>> {
        let end = range.end.min(self.len());
        let start = range.start.min(end);
        let file = self.file_of(start);
        let current = self.files[file].rows_from(start - self.starts[file])?;
        Ok(Rows {
            reader: self,
            file,
            current: Some(current),
            next: start,
            end,
            ready: VecDeque::new(),
            failed: None,
        })
    }

    /// Row `index`, or an error when it is out of range or not accepted. The row is read
    /// through its file's open handle: a JSONL file from the index checkpoint before it, a
    /// Parquet file from its row group, kept decoded in a bounded cache
    /// ([`DataReader::set_group_cache_bytes`]) so that rows drawn in any order do not decode a
    /// group per draw.
    pub fn get(&self, index: u64) -> Result<Row> {
        let out_of_range = || DataError::Schema {
            path: PathBuf::from(&self.pattern),
            reason: format!("row {index} is out of range ({} rows)", self.len()),
        };
        if index >= self.len() {
            return Err(out_of_range());
        }
        let file = self.file_of(index);
        let local = index - self.starts[file];
        let raw = match &self.files[file] {
            RawFile::Parquet(p) => self.parquet_row(file, p, local)?,
            f => f.get(local)?,
        };
        match raw.map(|raw| self.outcome(file, raw).outcome) {
            Some(Outcome::Accepted(row)) => Ok(row),
            Some(Outcome::Rejected(e) | Outcome::Skipped(e)) => Err(e.into()),
            None => Err(out_of_range()),
        }
    }

    /// The file holding global row `index` (`index < len`).
    fn file_of(&self, index: u64) -> usize {
        self.starts
            .partition_point(|&s| s <= index)
            .saturating_sub(1)
            .min(self.files.len() - 1)
    }

    /// Reads every row once and counts; an error when no row is accepted (with the first
    /// reasons), so that a run stops at start on a dataset it cannot use.
    pub fn validate(&self) -> Result<ReadStats> {
        let mut stats = ReadStats::default();
        for r in self.rows_from(0)? {
            let r = r?;
            stats.rows += 1;
            match r.outcome {
                Outcome::Accepted(_) => stats.accepted += 1,
                Outcome::Skipped(_) => stats.skipped += 1,
                Outcome::Rejected(e) => {
                    stats.rejected += 1;
                    if stats.first_rejections.len() < FIRST_REASONS {
                        stats.first_rejections.push(e);
                    }
                }
            }
        }
        if stats.accepted == 0 {
            return Err(DataError::AllRejected {
                pattern: self.pattern.clone(),
                rejected: stats.rejected + stats.skipped,
                first: stats
                    .first_rejections
                    .iter()
                    .map(|e| format!("  {e}"))
                    .collect::<Vec<_>>()
                    .join("\n"),
            });
        }
        Ok(stats)
    }

    /// Maps one row's columns onto a canonical row.
    fn map_row(&self, index: u64, fields: Map<String, Value>) -> std::result::Result<Row, NotRead> {
        let obj = match &self.schema {
            Schema::Preset(p) => match p.map(fields, &self.options) {
                Ok(Mapped::Row(o)) => o,
                Ok(Mapped::Skip(why)) => return Err(NotRead::Skipped(FieldError::row(why))),
                Err(e) => return Err(NotRead::Rejected(e)),
            },
            Schema::Mapping(m) => m.apply(&fields)?,
        };
        Ok(match self.kind {
            Kind::Sft => Row::Sft(record::sft_from_canonical(&obj)?),
            Kind::Pairs => Row::Pair(record::pair_from_canonical(&obj)?),
            Kind::Rl => {
                let domain = self.domain.or_else(|| {
                    obj.get("domain")
                        .and_then(Value::as_str)
                        .and_then(StageKind::parse)
                });
                Row::Rl(record::rl_from_canonical(obj, index, domain)?)
            }
        })
    }

    fn outcome(&self, file: usize, raw: super::index::RawRow) -> ReadRow {
        let index = self.starts[file] + raw.index;
        let err = |e: FieldError| RowError {
            path: self.files[file].path().to_path_buf(),
            row: raw.row_no,
            column: e.column,
            reason: e.reason,
        };
        let outcome = match raw.fields {
            Err(e) => Outcome::Rejected(err(e)),
            Ok(fields) => match self.map_row(index, fields) {
                Ok(row) => Outcome::Accepted(row),
                Err(NotRead::Skipped(e)) => Outcome::Skipped(err(e)),
                Err(NotRead::Rejected(e)) => Outcome::Rejected(err(e)),
            },
        };
        ReadRow {
            index,
            outcome,
            file,
            row_no: raw.row_no,
        }
    }

    /// A rejection of the row at `row_no` of file `file` (a [`ReadRow`]'s) for `e`: for a
    /// consumer that refuses a row the mapping accepted (a conversation the chat template
    /// cannot render).
    pub fn reject(&self, file: usize, row_no: u64, e: FieldError) -> RowError {
        RowError {
            path: self.files[file].path().to_path_buf(),
            row: row_no,
            column: e.column,
            reason: e.reason,
        }
    }

    /// The dataset as given (a file, glob or directory), for messages.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }
}

/// Why a row gave no canonical row.
enum NotRead {
    /// Left out on purpose.
    Skipped(FieldError),
    /// Unusable.
    Rejected(FieldError),
}

impl From<FieldError> for NotRead {
    fn from(e: FieldError) -> Self {
        NotRead::Rejected(e)
    }
}

/// Rows of a [`DataReader`], read across its files as they are asked for. JSONL lines are
/// taken a batch at a time ([`BATCH_ROWS`], at most [`BATCH_BYTES`] of lines) and parsed and
/// mapped by the reader's parse threads, each a contiguous share, returned in file order.
pub struct Rows<'a> {
    reader: &'a DataReader,
    file: usize,
    current: Option<RawRows>,
    next: u64,
    end: u64,
    /// Rows of the last batch not returned yet.
    ready: VecDeque<ReadRow>,
    /// The read error that cut the last batch short, returned after its rows.
    failed: Option<DataError>,
}

impl Rows<'_> {
    /// Reads the next batch of JSONL lines of the current file and parses them into `ready`;
    /// false when the current file is not JSONL or has no more lines.
    fn fill_batch(&mut self) -> bool {
        let Some(RawRows::Jsonl(rows)) = self.current.as_mut() else {
            return false;
        };
        let want = (self.end - self.next).min(BATCH_ROWS as u64) as usize;
        let mut arena = Vec::new();
        let mut lines = Vec::with_capacity(want);
        while lines.len() < want && arena.len() < BATCH_BYTES {
            match rows.next_raw() {
                Some(Ok((index, row_no, bytes))) => {
                    let at = arena.len();
                    arena.extend_from_slice(bytes);
                    lines.push((index, row_no, at..arena.len()));
                }
                Some(Err(e)) => {
                    self.failed = Some(e);
                    self.current = None;
                    break;
                }
                None => break,
            }
        }
        if lines.is_empty() {
            return false;
        }
        self.next += lines.len() as u64;
        let (reader, file) = (self.reader, self.file);
        let parse = |part: &[(u64, u64, Range<usize>)]| -> Vec<ReadRow> {
            part.iter()
                .map(|(index, row_no, range)| {
                    let fields = super::jsonl::parse_line(&arena[range.clone()]);
                    reader.outcome(
                        file,
                        RawRow {
                            index: *index,
                            row_no: *row_no,
                            fields,
                        },
                    )
                })
                .collect()
        };
        let threads = reader
            .parse_threads
            .min(lines.len() / MIN_ROWS_PER_THREAD)
            .max(1);
        if threads == 1 {
            self.ready.extend(parse(&lines));
            return true;
        }
        let share = lines.len().div_ceil(threads);
        let ready = &mut self.ready;
        std::thread::scope(|scope| {
            let others: Vec<_> = lines[share..]
                .chunks(share)
                .map(|part| scope.spawn(move || parse(part)))
                .collect();
            ready.extend(parse(&lines[..share]));
            for h in others {
                match h.join() {
                    Ok(rows) => ready.extend(rows),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
        });
        true
    }
}

impl Iterator for Rows<'_> {
    type Item = Result<ReadRow>;

    fn next(&mut self) -> Option<Result<ReadRow>> {
        loop {
            if let Some(row) = self.ready.pop_front() {
                return Some(Ok(row));
            }
            if let Some(e) = self.failed.take() {
                return Some(Err(e));
            }
            if self.next >= self.end {
                return None;
            }
            if self.fill_batch() {
                continue;
            }
            let current = self.current.as_mut()?;
            match current.next() {
                Some(Ok(raw)) => {
                    self.next += 1;
                    return Some(Ok(self.reader.outcome(self.file, raw)));
                }
                Some(Err(e)) => {
                    self.current = None;
                    return Some(Err(e));
                }
                None => {
                    self.file += 1;
                    if self.file >= self.reader.files.len() {
                        return None;
                    }
                    match self.reader.files[self.file].rows_from(0) {
                        Ok(r) => self.current = Some(r),
                        Err(e) => {
                            self.current = None;
                            return Some(Err(e));
                        }
                    }
                }
            }
        }
    }
}

/// The preset names, for help texts.
pub fn preset_names() -> Vec<&'static str> {
    Preset::ALL.iter().map(|p| p.name()).collect()
}
