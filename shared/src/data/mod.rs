//! Datasets as users have them: JSONL and Parquet files in our canonical layout or a public one
//! (the paper's released data, veRL / TRL / OpenRLHF conventions, the standard benchmarks),
//! read through an index and mapped row by row onto the rows the trainer takes.
//!
//! The layers, bottom up:
//! - [`jsonl`] and [`parquet`]: one file each, indexed (sparse byte offsets for JSONL, row
//!   groups for Parquet) so that a file is never held whole; a row comes out as a JSON object of
//!   its columns.
//! - [`schema`]: column paths (`reward_model.ground_truth`, JSON-encoded string columns) and the
//!   explicit mappings a user writes (`prompt=question,answer=json:meta.answer`).
//! - [`presets`]: the built-in layouts, and their detection from a file's columns.
//! - [`record`]: the canonical rows ([`SftRow`], [`RlRow`], [`PairRow`]) and their parsing from
//!   our own JSONL layout, identical to what the actor's and learner's readers accept.
//! - [`reader`]: a dataset (one file, a glob or a directory of shards) with a schema, read
//!   sequentially, by row number, or as one actor's shard; every rejected row is a
//!   [`RowError`] naming file, row and column.
//! - [`checked`]: how the trainer opens a dataset ([`scan`] for one pass, [`Indexed`] for
//!   access by position): every rejection counted and logged, a dataset with no usable row an
//!   error at start.

pub mod checked;
pub mod codec;
pub mod index;
pub mod jsonl;
pub mod parquet;
pub mod presets;
pub mod reader;
pub mod record;
pub mod schema;

mod error;

pub use checked::{open_and_scan, scan, Indexed};
pub use error::{DataError, Result, RowError};
pub use index::{FileFormat, IoCounts, RawFile};
pub use presets::{detect, MapOptions, Preset, Probe};
pub use reader::{DataReader, DataSpec, Kind, Outcome, ReadRow, ReadStats};
pub use record::{PairRow, RlRow, Row, SftRow};
pub use schema::{ColumnPath, Mapping, Schema};
