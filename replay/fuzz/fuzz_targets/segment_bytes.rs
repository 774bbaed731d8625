//! Arbitrary bytes as a segment file: the reader, `inspect` and `dump` must not panic or read
//! out of bounds, and a writer resuming on such a segment must not panic either and must keep
//! what it appends readable.
//!
//! The first input byte selects options; the rest is the segment:
//! - bit 0: replace the first 64 bytes by a valid segment header (so the fuzzer spends its time
//!   on records rather than on the header CRC);
//! - bit 1: also open a writer on the segment (crash recovery), append one record, and check
//!   that a fresh reader delivers it intact.
//!
//! Run: `cd replay/fuzz && cargo +nightly fuzz run segment_bytes -- -max_total_time=900`.
//!
//! Last run (segment format v2, with the reader's mapping reuse and the streaming-store
//! writer, 2026-12-03, empty starting corpus, nightly + cargo-fuzz 0.13.2, machine shared with
//! another build): 901 s, 618 605 executions (686/s on average), no crash, no panic; the
//! corpus grew to 141 inputs (24 KB), coverage 1558 edges. Then, with the reader's prefetch
//! past small records, 301 s more from that corpus: 189 546 executions, no crash, coverage
//! 1580 edges, corpus 133 inputs (24 KB).
#![no_main]

#[path = "../../tests/fuzz_check/mod.rs"]
mod fuzz_check;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| fuzz_check::run(input));
