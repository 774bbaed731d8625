//! cascade-replay: the memory-mapped, crash-safe rollout log from actors to the learner.
//!
//! Layout: `RUN_DIR/replay/<actor>/seg-NNNNNNNNNN.log`, one directory and one writer process
//! per actor ([`ReplayWriter`]), one reader following all of them ([`ReplayReader`]). Records
//! are published by storing their length last with release ordering; readers validate magic,
//! bounds and CRC32C before handing out a payload. A record never spans segments: a payload
//! larger than [`max_payload_for`] the segment size is refused with
//! [`ReplayError::RecordTooLarge`]. See `header` for the byte layout and `mmap` for the
//! invariants that make the shared mappings sound.
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod cursor;
mod doorbell;
mod error;
pub mod header;
mod helper;
mod inspect;
mod mmap;
mod reader;
mod segment;
mod writer;

pub use cursor::{
    read_min_consumed, read_min_progress, write_consumed, write_progress, Cursor, Cursors,
    CONSUMED_DIR,
};
pub use doorbell::DOORBELL_FILE;
pub use error::{ReplayError, Result};
pub use header::RecordMeta;
pub use inspect::{dump, inspect, ActorReport, DumpedRecord, Report};
pub use reader::{Payload, ReaderOptions, Record, ReplayReader};
pub use segment::{list_segments, segment_file_name, Corruption};
pub use writer::{ReplayWriter, WriterOptions, LOCK_FILE};

/// The largest payload a writer with this segment size accepts.
pub fn max_payload_for(segment_size: u64) -> usize {
    segment::max_payload(segment_size)
}
