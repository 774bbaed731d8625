//! Byte layout of records and segment headers. Everything is little-endian.
//!
//! A segment file is a [`SEGMENT_HEADER_LEN`]-byte header followed by records at 8-byte
//! aligned offsets. A record is a [`RECORD_HEADER_LEN`]-byte header and its payload:
//!
//! ```text
//! 0  magic  u32   RECORD_MAGIC, or SEAL_MAGIC for the end-of-segment marker
//! 4  len    u32   header + payload bytes (never 0); stored last, with release ordering
//! 8  crc32c u32   over bytes 4..8, 12..32 and the payload
//! 12 stage  u8
//! 13 kind   u8
//! 14 (zero) u16
//! 16 seq    u64
//! 24 policy_version u64
//! ```
//!
//! A zero `len` means "nothing published here yet".
//!
//! The segment header:
//!
//! ```text
//! 0  magic          [u8; 8]  SEGMENT_MAGIC
//! 8  version        u32      SEGMENT_FORMAT_VERSION
//! 12 header length  u32      SEGMENT_HEADER_LEN
//! 16 index          u64
//! 24 first_seq      u64
//! 32 size           u64      file size
//! 40 crc32c         u32      over bytes 0..40
//! 44 (zero)         u32
//! 48 published_end  u64      see below; not covered by the CRC
//! 56 (zero)         u64
//! ```
//!
//! `published_end` is the writer's high-water mark: the offset just after the last record (or
//! end marker) it published, stored with release ordering after that record's `len`. A reader
//! that finds a zero `len` at an offset below it knows the length was destroyed (corruption)
//! rather than not written yet, and skips ahead instead of waiting for a segment that will not
//! change. Segments written before this field existed hold zero there: no information.
//!
//! # Recycled files (format version 2)
//!
//! A writer reuses the file of a segment every consumer has finished with for a later segment
//! (see `writer`), without clearing its body: the bytes after `published_end` may be records
//! of the file's previous life. Two rules keep them harmless:
//!
//! - **Sequence floor.** Seqs only grow, so every stale record (and end marker) has a seq below
//!   the new segment's `first_seq`. Readers, crash recovery and `inspect` accept a record or
//!   end marker only when its seq is at least the next one they expect, which starts at
//!   `first_seq`; a stale one is never accepted.
//! - **High-water mark.** A version 2 segment's `published_end` is set to the end of its header
//!   when the segment is created and only grows. Readers of the active segment read nothing at
//!   or past it (so they never look at stale bytes the writer is overwriting), and a scan
//!   beyond it (crash recovery, `inspect`) takes only records that continue the sequence
//!   exactly, then stops without reporting the rest as damage: it is unwritten space.
//!
//! Version 1 segments were never recycled (their unwritten space reads as zeros); this build
//! reads both and writes version 2, so that an older build refuses a segment it would misread.
//! The segment's `index` word is the recycling sign for a process that still maps the file:
//! it changes (to the new index) before any byte of the new life is written.

/// Size of a record header.
pub const RECORD_HEADER_LEN: usize = 32;
/// Size of the segment file header; the first record starts here.
pub const SEGMENT_HEADER_LEN: usize = 64;
/// Magic of a record ("CREC").
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"CREC");
/// Magic of the end-of-segment marker ("CEND").
pub const SEAL_MAGIC: u32 = u32::from_le_bytes(*b"CEND");
/// Magic of a segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"CASCRPL1";
/// Segment format version this build writes (it also reads version 1, see the module docs).
pub const SEGMENT_FORMAT_VERSION: u32 = 2;
/// Oldest segment format version this build reads.
pub const OLDEST_READ_VERSION: u32 = 1;
/// Offset of the `len` word inside a record header.
pub const LEN_OFFSET: usize = 4;
/// Offset of the `published_end` word inside the segment header (8-byte aligned).
pub const PUBLISHED_END_OFFSET: usize = 48;
/// Offset of the `index` word inside the segment header (8-byte aligned).
pub const INDEX_OFFSET: usize = 16;

/// What the caller says about a record; stored in its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct RecordMeta {
    /// Policy (snapshot) version that produced the record.
    pub policy_version: u64,
    /// Stage kind byte (`cascade_shared::StageKind::to_u8`).
    pub stage: u8,
    /// Record kind byte (0 = rollout group; free for the caller).
    pub kind: u8,
}

/// A decoded record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// [`RECORD_MAGIC`] or [`SEAL_MAGIC`].
    pub magic: u32,
    /// Header + payload length in bytes.
    pub len: u32,
    /// Stored CRC.
    pub crc: u32,
    /// Sequence number within the actor's log.
    pub seq: u64,
    /// Caller metadata.
    pub meta: RecordMeta,
}

/// Rounds `n` up to a multiple of 8.
pub const fn align8(n: u64) -> u64 {
    (n + 7) & !7
}

impl RecordHeader {
    /// Builds a header for `payload`, computing its CRC.
    pub fn new(magic: u32, seq: u64, meta: RecordMeta, payload: &[u8]) -> RecordHeader {
        let len = (RECORD_HEADER_LEN + payload.len()) as u32;
        let mut h = RecordHeader {
            magic,
            len,
            crc: 0,
            seq,
            meta,
        };
        h.crc = h.compute_crc(payload);
        h
    }

    /// CRC32C of the covered header bytes and `payload`.
    pub fn compute_crc(&self, payload: &[u8]) -> u32 {
        crate::crc::crc32c_append(self.header_crc(), payload)
    }

    /// CRC32C of the covered header bytes alone (the payload's is appended to it).
    pub(crate) fn header_crc(&self) -> u32 {
        let bytes = self.to_bytes();
        let crc = crate::crc::crc32c(&bytes[4..8]);
        crate::crc::crc32c_append(crc, &bytes[12..RECORD_HEADER_LEN])
    }

    /// Encodes the header.
    pub fn to_bytes(&self) -> [u8; RECORD_HEADER_LEN] {
        let mut b = [0u8; RECORD_HEADER_LEN];
        b[0..4].copy_from_slice(&self.magic.to_le_bytes());
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..12].copy_from_slice(&self.crc.to_le_bytes());
        b[12] = self.meta.stage;
        b[13] = self.meta.kind;
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.meta.policy_version.to_le_bytes());
        b
    }

    /// Decodes a header; `None` when the reserved bytes are not zero.
    pub fn from_bytes(b: &[u8; RECORD_HEADER_LEN]) -> Option<RecordHeader> {
        if b[14] != 0 || b[15] != 0 {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        Some(RecordHeader {
            magic: u32_at(0),
            len: u32_at(4),
            crc: u32_at(8),
            seq: u64_at(16),
            meta: RecordMeta {
                policy_version: u64_at(24),
                stage: b[12],
                kind: b[13],
            },
        })
    }

    /// Bytes the record occupies in the segment, padding included.
    pub fn padded_len(&self) -> u64 {
        align8(self.len as u64)
    }
}

/// The header at the start of every segment file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Position of the segment in the actor's sequence (0, 1, 2, ...).
    pub index: u64,
    /// Seq of the first record written to this segment.
    pub first_seq: u64,
    /// File size in bytes.
    pub size: u64,
}

impl SegmentHeader {
    /// Encodes the header (magic, version, fields, CRC of the first 40 bytes).
    pub fn to_bytes(&self) -> [u8; SEGMENT_HEADER_LEN] {
        let mut b = [0u8; SEGMENT_HEADER_LEN];
        b[0..8].copy_from_slice(&SEGMENT_MAGIC);
        b[8..12].copy_from_slice(&SEGMENT_FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(SEGMENT_HEADER_LEN as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.index.to_le_bytes());
        b[24..32].copy_from_slice(&self.first_seq.to_le_bytes());
        b[32..40].copy_from_slice(&self.size.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..40]);
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a segment header; the error says what is wrong.
    pub fn from_bytes(b: &[u8]) -> Result<SegmentHeader, String> {
        if b.len() < SEGMENT_HEADER_LEN {
            return Err(format!(
                "file is {} bytes, shorter than the segment header",
                b.len()
            ));
        }
        if b[0..8] != SEGMENT_MAGIC {
            return Err("bad segment magic".into());
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let crc = crc32c::crc32c(&b[0..40]);
        if crc != u32_at(40) {
            return Err("segment header CRC mismatch".into());
        }
        let version = u32_at(8);
        if !(OLDEST_READ_VERSION..=SEGMENT_FORMAT_VERSION).contains(&version) {
            return Err(format!(
                "segment format version {version} is not supported (this build reads \
                 {OLDEST_READ_VERSION} to {SEGMENT_FORMAT_VERSION})"
            ));
        }
        if u32_at(12) as usize != SEGMENT_HEADER_LEN {
            return Err("unexpected segment header length".into());
        }
        Ok(SegmentHeader {
            index: u64_at(16),
            first_seq: u64_at(24),
            size: u64_at(32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn record_header_round_trip(seq: u64, pv: u64, stage: u8, kind: u8,
                                    payload in proptest::collection::vec(any::<u8>(), 0..512)) {
            let meta = RecordMeta { policy_version: pv, stage, kind };
            let h = RecordHeader::new(RECORD_MAGIC, seq, meta, &payload);
            let back = RecordHeader::from_bytes(&h.to_bytes()).unwrap();
            prop_assert_eq!(back, h);
            prop_assert_eq!(back.compute_crc(&payload), h.crc);
            prop_assert_eq!(h.len as usize, RECORD_HEADER_LEN + payload.len());
            prop_assert_eq!(h.padded_len() % 8, 0);
        }

        #[test]
        fn any_single_bit_flip_changes_the_crc(seq: u64, pv: u64,
                                               payload in proptest::collection::vec(any::<u8>(), 1..256),
                                               bit in 0usize..2048) {
            let meta = RecordMeta { policy_version: pv, stage: 3, kind: 0 };
            let h = RecordHeader::new(RECORD_MAGIC, seq, meta, &payload);
            let mut p = payload.clone();
            let bit = bit % (p.len() * 8);
            p[bit / 8] ^= 1 << (bit % 8);
            prop_assert_ne!(h.compute_crc(&p), h.crc);
        }

        #[test]
        fn segment_header_round_trip(index: u64, first_seq: u64, size: u64) {
            let h = SegmentHeader { index, first_seq, size };
            prop_assert_eq!(SegmentHeader::from_bytes(&h.to_bytes()).unwrap(), h);
        }
    }

    #[test]
    fn damaged_segment_header_is_refused() {
        let h = SegmentHeader {
            index: 1,
            first_seq: 2,
            size: 4096,
        };
        let mut b = h.to_bytes();
        b[20] ^= 1;
        assert!(SegmentHeader::from_bytes(&b).unwrap_err().contains("CRC"));
        let mut b = h.to_bytes();
        b[8] = 9;
        assert!(SegmentHeader::from_bytes(&b).is_err());
        assert!(SegmentHeader::from_bytes(&b[..10]).is_err());
    }
}
