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
//! # Recycling
//!
//! Retention retires a segment once every registered consumer (one with a consumed-position
//! file, see [`write_consumed`]) has published a position past all its records. Instead of
//! deleting it, the writer keeps retired segments (under their names, still mapped) as long as
//! they, the live segments and the spare fit within `max_segments` (only beyond that are retired
//! segments deleted, so the directory stays at its high-water mark), and reuses their
//! files for later segments, with their page-cache pages: the helper thread renames
//! `seg-<old>.log` to `seg-<new>.log.tmp`, fsyncs the directory, stores the new index in the
//! header's index word (the first byte of the file to change) and re-faults any page written
//! back since; when the writer rolls, it writes the final header and renames the file into
//! place. A file is never truncated or shrunk, so no mapping of it can fault.
//!
//! The body is **not cleared**. Clearing would cost a 64 MiB memset per segment, as much memory
//! bandwidth as the records themselves; instead three rules keep the previous life's bytes from
//! ever being taken for records (details in `header`, "Recycled files"):
//! - every stale record or end marker has a seq below the segment's `first_seq` (seqs only
//!   grow), and readers, crash recovery and `inspect` accept a record only at or above the next
//!   seq they expect, which starts at `first_seq`;
//! - the new header resets the writer's high-water mark `published_end`, and readers of the
//!   active segment read nothing at or past it (so never the stale bytes being overwritten);
//! - past the mark, crash recovery and `inspect` take only records continuing the sequence
//!   exactly, then stop without calling the rest damage.
//!
//! A reader that still maps a recycled file notices: after reading a record and before handing
//! it out, it checks the header's index word (and before reporting damage). A registered
//! consumer never sees this for a record it still needs (the file is only recycled once it
//! published a position past it), and must not use a [`Payload`] after publishing a position
//! past it. A reader that publishes no position (an observer, `cascade replay inspect`) and is
//! overtaken gets [`ReplayError::CursorLost`], as when retention deletes a segment under it;
//! `inspect`/`dump` leave such a segment out; [`Payload::is_intact`] tells whether a payload
//! handed out earlier is still the record's. The learner (through `RolloutSource`) decodes each
//! payload at once and publishes positions after its snapshots, so it holds neither.
//!
//! Crash safety. A writer killed at any moment: before the rename to `.tmp`, the segment is
//! still a retired one; between it and the rename into place, the file is a `.tmp`, removed
//! when a writer next opens the directory; after the rename into place, the file has its full
//! new header (written before the rename), `published_end` says nothing is published, and
//! recovery resumes after the last record of the new life, zeroing the rest. Rolling to a new
//! segment no longer msyncs its header and fsyncs the directory on `append`; [`ReplayWriter::sync`]
//! does both before it returns, and a writer opening the directory first makes every existing
//! header durable. So after a power loss, a segment whose header or name did not reach the disk
//! (its previous life's header, the recycling placeholder, or zeros for the newest) holds no
//! synced record: the opening writer removes it and every later one and continues after the
//! previous segment.
//!
//! # Performance
//!
//! `append` copies the payload once, into the mapped segment, computing its CRC32C on the way
//! (one pass over the payload with AVX-512 + VPCLMULQDQ when the CPU has them, see `crc`);
//! readers hand out payloads zero-copy from their own mapping after checking the CRC. On a
//! fresh log, what dominates is
//! not the copy but the kernel's work for new page-cache pages (allocating and zeroing them,
//! marking preallocated blocks written, freeing them when retention deletes a segment): about
//! 18 ms per 64 MiB segment against 2 ms for the copy. A running log recycles its segment
//! files, so after its first few segments it touches no new page. The helper thread prepares
//! the next segment (recycled, or preallocated, fsynced, mapped with huge pages where the
//! filesystem has large folios, prefaulted) once the active one is a quarter full, and unmaps
//! deleted segments; a roll then costs about 30 µs (rename, header) plus 80 µs of retention
//! (reading the consumed-position files).
//!
//! `REPLAY_BENCH_MB=512 cargo bench -p cascade-replay --bench replay` on the 2-core AMD EPYC
//! (Zen 5) KVM guest this was developed on, ext4 on virtio, kernel 6.18, with another agent's
//! builds and tests on the machine (load average 3.3–3.7); each bench run prints medians of 5
//! interleaved runs, and the table gives the median over 4 such runs (GB/s, 64 MiB segments,
//! writer and reader in one thread plus the writer's helper; the reader publishes its consumed
//! position every 64 MiB; ratios to memcpy into a reused buffer, of the medians):
//!
//! | record | running log | ratio | same, without publishing | ratio | fresh log | memcpy reused | memcpy fresh anon | memcpy fresh file |
//! |---|---|---|---|---|---|---|---|---|
//! | 4 KiB | 6.70 | 0.29× | 7.48 | 0.33× | 2.9 | 22.3 | 14.6 | 3.61 |
//! | 256 KiB | 9.60 | 0.36× | 11.3 | 0.43× | 3.1 | 27.8 | 16.8 | 3.82 |
//!
//! Before recycling (the commit before this one), the same bench, run alternately with this one
//! while the machine was quieter (load average about 2), gave 1.72 and 2.72 GB/s at 4 KiB
//! (0.07×, 0.12×) and 3.27 and 2.72 GB/s at 256 KiB (0.18× both); this crate's earlier table
//! said 1.88 and 2.23 GB/s. Recycling alone (CRC and copy still two passes), in that quieter
//! hour: 10.35 GB/s at 256 KiB, 0.44× (0.51× without publishing), and 6.96 GB/s at 4 KiB,
//! 0.28×. The one-pass CRC + copy then added 10–25 % in runs alternating with that version
//! under equal load (256 KiB without publishing: 11.3, 13.2, 14.2 against 9.1, 8.8, 12.3). With
//! the machine loaded (load average 4–8) every figure halves and scatters, memcpy's included,
//! and publishing the consumed position (two fsyncs, 2–15 ms each then) takes half the time.
//!
//! "Running log": the same writer and reader, warmed up through 16 segments, so every segment
//! is a recycled file (the steady state of an actor). "Without publishing": the same runs less
//! the time the reader spent publishing its consumed position (a learner publishes once per
//! snapshot, not every 64 MiB). "Fresh log": a new directory per run, whose first segments are
//! new files (after its first few segments it recycles too; this column scatters most). The
//! baselines copy the same records from one hot buffer: into one pre-faulted 64 MiB buffer;
//! into a new 64 MiB anonymous huge-page mapping per 64 MiB; into a new fallocated, mapped,
//! then deleted 64 MiB file per 64 MiB (no CRC, no reader): the ceiling of any log that writes
//! every record to new file pages, which the running log now exceeds 2.5×.
//!
//! One run of the bench with the machine otherwise idle (same commit as the table): 256 KiB
//! 7.69 GB/s running log (0.27×), 9.46 without publishing (0.33×), memcpy reused 29.0; 4 KiB
//! 5.87 (0.27×), 6.75 (0.32×), memcpy 21.4; latency median 16.2 µs, p99 73 µs. A quiet machine
//! speeds memcpy up more than the log.
//!
//! The goal, half of a plain memcpy at 256 KiB, is not reached as measured here: 0.27–
//! 0.44× with the bench's publishing, 0.33–0.51× without, depending mostly on how fast memcpy
//! happens to run (22–33 GB/s on this guest). What is left after recycling is the work the log
//! must do per byte: `append` folds the CRC over the payload while copying it into the mapped
//! segment, and the reader computes the CRC again over the record as it comes back from
//! memory (about 25 GB/s), so every byte is read twice and written once where memcpy reads and
//! writes it once. Rolling costs about 0.1 ms per segment, retention's reading of the consumed
//! files included, and the consumer's publishing what it chooses. The rest is the machine:
//! appends of a few ms when the thread is preempted (5–15 % of the time on this 2-core guest
//! when it is loaded). At 4 KiB, per-record work (two header CRCs, the publication stores, the
//! reader's bookkeeping: about 250 ns a record) also counts.
//! Cross-process latency (append → `poll` returns, doorbell wake-up): median 12.0 µs, p99
//! 0.4–1.5 ms with the machine loaded as above (11.1 µs and 54 µs when quieter).
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

/// The CRC32C kernels, exposed for `benches/replay.rs` (raw kernel throughput against memcpy in
/// the same run). Not part of the API.
#[doc(hidden)]
pub mod bench_internals {
    /// CRC32C of `data` appended to `crc`, as readers check records.
    pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
        crate::crc::crc32c_append(crc, data)
    }

    /// Copies `src` to the start of `dst` and returns its CRC32C, as `append` does; `stream`
    /// selects the non-temporal stores used for large records.
    pub fn crc32c_copy(crc: u32, src: &[u8], dst: &mut [u8], stream: bool) -> u32 {
        assert!(dst.len() >= src.len());
        // SAFETY: `dst` has room for `src.len()` bytes (checked) and, being a `&mut`, does not
        // overlap `src`.
        unsafe {
            if stream {
                crate::crc::crc32c_append_copy_nt(crc, src, dst.as_mut_ptr())
            } else {
                crate::crc::crc32c_append_copy(crc, src, dst.as_mut_ptr())
            }
        }
    }
}

/// The largest payload a writer with this segment size accepts.
pub fn max_payload_for(segment_size: u64) -> usize {
    segment::max_payload(segment_size)
}
