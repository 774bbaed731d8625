//! cascade-replay: the memory-mapped, crash-safe rollout log from actors to the learner.
//!
//! Layout: `RUN_DIR/replay/<actor>/seg-NNNNNNNNNN.log`, one directory and one writer process
//! per actor ([`ReplayWriter`]), one reader following all of them ([`ReplayReader`]). Records
//! are published by storing their length last with release ordering; readers validate magic,
//! bounds and CRC32C before handing out a payload. A record never spans segments: a payload
//! larger than [`max_payload_for`] the segment size is refused with
//! [`ReplayError::RecordTooLarge`]. See `header` for the byte layout and `mmap` for the
//! invariants that make the shared mappings sound.
//!
//! # Damage
//!
//! Corrupt records (bad magic, bounds or CRC, a sequence number going backwards) are skipped
//! and reported once each ([`ReplayReader::corruptions`], `cascade replay inspect`). A record
//! whose `len` word was zeroed looks like "not written yet"; the reader tells the two apart
//! with the writer's high-water mark in the segment header (`published_end`, see `header`):
//! below it, a zero length is damage and the reader looks for the next valid record among the
//! published ones, so the records after it are not held back. Two cases still wait:
//! - the damaged record is the last one published: the reader finds the next record as soon
//!   as the writer appends one (nothing is lost, there is nothing to deliver before that);
//! - segments written before `published_end` existed (it reads as zero there): a zeroed length
//!   in the active segment waits until the writer rolls to the next segment, as it always did.
//!
//! A writer resuming after a crash continues after the last valid record of its newest
//! segment; if that segment is truncated (its size differs from its header) or has no room
//! left for an end marker, it starts a new segment instead.
//!
//! # Performance
//!
//! `append` copies the payload once, into the mapped segment, after computing its CRC32C;
//! readers hand out payloads zero-copy from their own mapping after checking the CRC (with
//! AVX-512 + VPCLMULQDQ when the CPU has them, see `crc`). What dominates throughput is not
//! the copy but the kernel's work for fresh page-cache pages: allocating and zeroing them,
//! marking preallocated blocks written, and freeing them when retention deletes a segment.
//! So the writer keeps that work off `append` where it can: a helper thread prepares the next
//! segment (preallocated, fsynced, mapped with huge pages where the filesystem has large
//! folios, prefaulted) once the active one is a quarter full, and unmaps deleted segments.
//! Published bytes are never reused or rewritten, so a new segment always means new pages.
//!
//! `REPLAY_BENCH_MB=512 cargo bench -p cascade-replay --bench replay` on the 2-core AMD EPYC
//! (Zen 5) KVM guest this was developed on, ext4 on virtio, kernel 6.18, another process busy
//! on one core; medians of 5 interleaved runs (GB/s, 64 MiB segments, writer and reader in one
//! thread plus the writer's helper):
//!
//! | record | replay append+read | memcpy, reused buffer | memcpy, fresh anon memory | memcpy, fresh file |
//! |---|---|---|---|---|
//! | 4 KiB | 1.88 | 23.0 (0.08×) | 16.6 (0.11×) | 3.77 (0.50×) |
//! | 256 KiB | 2.23 | 19.5 (0.11×) | 15.9 (0.14×) | 3.55 (0.63×) |
//!
//! The baselines copy the same records from one hot buffer: into one pre-faulted 64 MiB buffer;
//! into a new 64 MiB anonymous huge-page mapping per 64 MiB; into a new fallocated, mapped,
//! then deleted 64 MiB file per 64 MiB (no CRC, no reader). The last is the ceiling of any log
//! that writes every record to new file pages on this machine: a 64 MiB segment costs about
//! 10 ms to fault in (zeroing, ext4 unwritten-extent conversion) and 8 ms to free, against 2 ms
//! for the copy. Half the speed of a plain memcpy is out of reach without reusing pages, which
//! would mean rewriting published (if consumed) records under readers that may still map them.
//! Cross-process latency (append → `poll` returns, doorbell wake-up): median 13.6 µs, p99
//! 1.4 ms with the machine loaded as above.
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod crc;
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
