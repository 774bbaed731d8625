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
//! (one pass with AVX-512 + VPCLMULQDQ when the CPU has them, see `crc`); payloads of 32 KiB or
//! more are copied with streaming stores, which write the destination's cache lines without
//! reading them first. Readers hand out payloads zero-copy from their mapping after checking
//! the CRC (the same fold, prefetching 8 KiB ahead, inside large records and past small
//! ones). A running log touches no new page: every consumed segment file is recycled (within
//! `max_segments`), the helper thread prepares the next segment from one as soon as one is
//! available (rename, directory fsync, re-fault of pages written back: the re-fault takes
//! about 0.3 ms), and readers keep their mapping of each file (by inode) and reuse it when
//! the file comes back as a later segment. A new file costs 10-30 ms of
//! kernel work per 64 MiB on a quiet machine (allocating and zeroing page-cache pages over
//! ext4's unwritten extents), 0.5 s with two processes streaming through memory beside it:
//! a fresh log pays that for its first segments, a running one only until its directory
//! reaches its high-water mark.
//!
//! Where the time goes (perf, 256 KiB records, running log, steady state): the writer's
//! copy + CRC and the reader's CRC check are nearly all of the log's CPU time; page faults,
//! the helper, retention and publishing are a few percent of CPU, though publishing the
//! consumed position (two fsyncs) waits 5-300 ms per 512 MiB depending on the machine's other
//! I/O. At 4 KiB, per-record work (header CRCs, the doorbell's locked increment, which waits
//! for the payload's stores to drain, the reader's bookkeeping) adds 50-100 ns a record on
//! each side. The kernels alone (bench case `kernels`, one thread, same run as a memcpy of
//! the same records at 38 GB/s; 256 KiB): CRC of a hot record 64 GB/s, of records coming from
//! memory 42 (34 before the prefetch), copy + CRC into a 64 MiB buffer 27.5 with normal stores,
//! 41 with streaming stores. At 4 KiB (memcpy 26): 23, 24.5 and 17 (hence normal stores there).
//!
//! `REPLAY_BENCH_MB=512 cargo bench -p cascade-replay --bench replay` (cases `serial,fresh,
//! pipelined,latency`) on the 2-core AMD EPYC (Zen 5) KVM guest this was developed on, ext4 on
//! virtio, kernel 6.18, 64 MiB segments, another agent's work on the machine (load average
//! 1.1-1.3 throughout). Three runs of this code alternating with three of the code before the
//! streaming stores, prefetches, full recycling and mapping reuse (commit ddcf3b5); per cell
//! the median of the three runs' figures (each the median of 5 interleaved runs), GB/s, and
//! the three runs' ratios to memcpy into a reused buffer in the same run:
//!
//! | record | serial, running log | without publishing | fresh log | two processes |
//! |---|---|---|---|---|
//! | 4 KiB, before | 8.13 (0.29-0.32×) | 8.84 (0.31-0.35×) | 5.53 | 3.64 (0.10-0.25×) |
//! | 4 KiB, now | 8.97 (0.33-0.35×) | 9.85 (0.37-0.38×) | 5.38 | 14.50 (0.49-0.57×) |
//! | 256 KiB, before | 12.55 (0.35-0.41×) | 14.59 (0.40-0.47×) | 6.18 | 8.11 (0.13-0.25×) |
//! | 256 KiB, now | 16.17 (0.41-0.51×) | 18.28 (0.47-0.57×) | 8.38 | 18.82 (0.49-0.87×) |
//!
//! memcpy into the reused buffer in those runs: 4 KiB 23-27 GB/s, 256 KiB 30-41 (21 in the run
//! whose two-process ratio is 0.87). Cross-process latency (append → `poll` returns, doorbell
//! wake-up): median 9.7 µs, p99 37 µs now (9.6-9.9 and 31-38 over the three runs); before:
//! median 10.1 µs, p99 31 µs (9.5-13.9 and 29-65). Earlier the same day, with the load average
//! rising to 2-2.7, both versions scattered widely (two processes, 256 KiB: 2.8-4.3 GB/s
//! before, 3.7-6.1 now; latency p99 up to 1-2 ms): on two cores a third busy process takes a
//! core from the writer, its helper or the reader.
//!
//! How to read the columns. "Serial": writer and reader in one thread, appending 8 MiB then
//! polling it, so its time is the sum of the two passes; each pass alone runs at about
//! memcpy speed (256 KiB: append 37-38 GB/s, poll 36-37, `REPLAY_BENCH_VERBOSE`; memcpy into
//! the reused buffer scatters from 22 to 40 GB/s between runs), so this setup cannot go much
//! past 0.5×. "Without publishing": the same less the time the reader spent publishing its
//! consumed position every 64 MiB (a learner publishes after its snapshots). "Two
//! processes": how actors and the learner run, a writer process and a reader process
//! concurrently, from the first `append` to the last record returned by `poll` and
//! CRC-checked, publishing included; on this 2-core guest the writer, its helper and the
//! reader share two cores. "Fresh log": a new directory per run, mostly new files.
//! The goal, 0.5× memcpy at 256 KiB: the two-process figure reaches it (0.49-0.87×)
//! at this load, the serial one without publishing in two runs of three (0.47-0.57×), the
//! serial one with publishing every 64 MiB not quite (0.41-0.51×); none does on a busier
//! machine. The median latency is well under its 50 µs.
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

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
