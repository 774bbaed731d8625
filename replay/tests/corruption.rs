//! Damaged logs: bit flips, truncations and arbitrary bytes. Corruption is detected, reported
//! with file and offset, skipped; nothing panics; every delivered record is intact.

mod common;

use std::path::Path;
use std::time::Duration;

use cascade_replay::{inspect, list_segments, RecordMeta, ReplayReader, ReplayWriter};
use common::*;

fn build_log(root: &Path, n: u64) -> std::path::PathBuf {
    let dir = root.join("actor-0");
    let mut w = ReplayWriter::open(&dir, small_writer(16384)).unwrap();
    for seq in 0..n {
        let p = payload(0, seq, payload_len(0, seq, 16, 2000));
        w.append(
            RecordMeta {
                policy_version: seq,
                stage: 3,
                kind: 0,
            },
            &p,
        )
        .unwrap();
    }
    w.sync().unwrap();
    dir
}

/// Reads everything; every delivered record must be intact and in increasing seq order.
fn read_all_checked(root: &Path) -> (Vec<u64>, Vec<cascade_replay::Corruption>) {
    let (reader, got) = drain(root, None);
    let mut seqs = Vec::new();
    for r in &got {
        check(0, r);
        assert_eq!(r.payload.len(), payload_len(0, r.seq, 16, 2000));
        if let Some(&last) = seqs.last() {
            assert!(r.seq > last, "seq {} after {last}", r.seq);
        }
        seqs.push(r.seq);
    }
    (seqs, reader.corruptions().to_vec())
}

#[test]
fn bit_flips_are_detected_reported_and_skipped() {
    for round in 0..40u64 {
        let root = tempfile::tempdir().unwrap();
        let dir = build_log(root.path(), 120);
        let segs = list_segments(&dir).unwrap();
        // Flip bits in a segment that is not the last (so the reader knows the writer moved on).
        let (_, path) = &segs[(mix(round) % (segs.len() as u64 - 1)) as usize];
        let mut bytes = std::fs::read(path).unwrap();
        let flips = 1 + mix(round + 1000) % 3;
        let mut flipped = Vec::new();
        for f in 0..flips {
            let at = 64 + mix(round * 31 + f) as usize % (bytes.len() - 64);
            bytes[at] ^= 1 << (mix(round * 7 + f) % 8);
            flipped.push(at);
        }
        std::fs::write(path, &bytes).unwrap();
        let (seqs, corruptions) = read_all_checked(root.path());
        let report = inspect(root.path()).unwrap();
        if seqs.len() < 120 {
            // Something was lost, so something must have been reported, with this file.
            assert!(
                !corruptions.is_empty(),
                "round {round}: lost records silently"
            );
            assert!(report.has_corruption(), "round {round}: inspect missed it");
            for c in &corruptions {
                assert_eq!(&c.path, path);
                assert!(c.offset >= 64 && c.offset <= *flipped.iter().max().unwrap() as u64);
            }
        }
        // Each corruption is reported once.
        let mut offsets: Vec<u64> = corruptions.iter().map(|c| c.offset).collect();
        offsets.dedup();
        assert_eq!(offsets.len(), corruptions.len());
        // The records after the damaged region are all still delivered.
        assert_eq!(*seqs.last().unwrap(), 119, "round {round}");
    }
}

#[test]
fn payload_flip_loses_exactly_that_record() {
    let root = tempfile::tempdir().unwrap();
    let dir = build_log(root.path(), 60);
    let (_, path) = &list_segments(&dir).unwrap()[0];
    let mut bytes = std::fs::read(path).unwrap();
    // The first record's payload starts at 64 + 32.
    bytes[64 + 32 + 3] ^= 0x10;
    std::fs::write(path, &bytes).unwrap();
    let (seqs, corruptions) = read_all_checked(root.path());
    assert_eq!(seqs, (1..60).collect::<Vec<_>>());
    assert_eq!(corruptions.len(), 1);
    assert_eq!(corruptions[0].offset, 64);
    assert_eq!(corruptions[0].reason, "CRC mismatch");
    let report = inspect(root.path()).unwrap();
    assert_eq!(report.actors[0].corruptions.len(), 1);
    assert_eq!(report.actors[0].corruptions[0].offset, 64);
    assert_eq!(report.actors[0].records, 59);
}

#[test]
fn truncations_never_panic_and_deliver_only_intact_records() {
    for round in 0..30u64 {
        let root = tempfile::tempdir().unwrap();
        let dir = build_log(root.path(), 100);
        let segs = list_segments(&dir).unwrap();
        let (_, path) = &segs[(mix(round) % segs.len() as u64) as usize];
        let len = std::fs::metadata(path).unwrap().len();
        let new_len = mix(round + 77) % len;
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(new_len)
            .unwrap();
        let (seqs, _) = read_all_checked(root.path());
        assert!(seqs.len() <= 100);
        let report = inspect(root.path()).unwrap();
        assert!(
            report.has_corruption(),
            "round {round}: truncation to {new_len} not reported"
        );
    }
}

/// Arbitrary bytes as a segment (with a valid or random segment header, whole or in pieces):
/// the reader and `inspect` must neither panic nor read out of bounds. This is the CI-sized
/// counterpart of the `replay/fuzz` target, which runs the same function under libFuzzer.
#[test]
fn random_bytes_as_segments_never_panic() {
    for round in 0..400u64 {
        let len = (mix(round) % 9000) as usize;
        let mut bytes: Vec<u8> = (0..len)
            .map(|i| mix(round << 20 | i as u64) as u8)
            .collect();
        if round % 2 == 0 && bytes.len() >= 64 {
            let h = cascade_replay::header::SegmentHeader {
                index: 0,
                first_seq: 0,
                size: bytes.len() as u64,
            };
            bytes[..64].copy_from_slice(&h.to_bytes());
        }
        if round % 4 == 0 {
            // Plant valid-looking records with random lengths among the noise.
            let mut at = 64;
            while at + 40 < bytes.len() {
                let h = cascade_replay::header::RecordHeader::new(
                    cascade_replay::header::RECORD_MAGIC,
                    at as u64,
                    Default::default(),
                    &[],
                );
                bytes[at..at + 32].copy_from_slice(&h.to_bytes());
                bytes[at + 4..at + 8]
                    .copy_from_slice(&(mix(at as u64) as u32 % 4000).to_le_bytes());
                at += 8 * (1 + mix(at as u64 + round) as usize % 40);
            }
        }
        feed(&bytes);
    }
}

/// What the fuzz target runs.
fn feed(bytes: &[u8]) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-0");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("seg-0000000000.log"), bytes).unwrap();
    std::fs::write(dir.join("seg-0000000001.log"), bytes).unwrap();
    let mut reader = ReplayReader::open(root.path(), Default::default(), None).unwrap();
    for _ in 0..4 {
        match reader.poll(Duration::ZERO) {
            Ok(batch) => {
                for r in batch {
                    assert!(r.payload.len() <= bytes.len());
                }
            }
            Err(_) => break,
        }
    }
    let _ = inspect(root.path());
    let _ = cascade_replay::dump(root.path(), 10);
}

/// The active segment (the writer has not moved on) with `n` records, the writer kept open, and
/// the offsets of the records.
fn active_log(root: &Path, n: u64) -> (ReplayWriter, std::path::PathBuf, Vec<u64>) {
    let dir = root.join("actor-0");
    let mut w = ReplayWriter::open(&dir, small_writer(1 << 20)).unwrap();
    for seq in 0..n {
        w.append(
            RecordMeta::default(),
            &payload(0, seq, payload_len(0, seq, 16, 2000)),
        )
        .unwrap();
    }
    let segs = list_segments(&dir).unwrap();
    assert_eq!(segs.len(), 1, "everything in the active segment");
    let offsets = cascade_replay::dump(root, usize::MAX)
        .unwrap()
        .iter()
        .map(|r| r.offset)
        .collect();
    (w, segs[0].1.clone(), offsets)
}

fn zero_len(path: &Path, record_offset: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&[0u8; 4], record_offset + 4).unwrap();
}

fn append(w: &mut ReplayWriter, seqs: std::ops::Range<u64>) {
    for seq in seqs {
        let s = w
            .append(
                RecordMeta::default(),
                &payload(0, seq, payload_len(0, seq, 16, 2000)),
            )
            .unwrap();
        assert_eq!(s, seq);
    }
}

fn poll_all(reader: &mut ReplayReader) -> Vec<u64> {
    let mut seqs = Vec::new();
    loop {
        let batch = reader.poll(Duration::from_millis(1)).unwrap();
        if batch.is_empty() {
            return seqs;
        }
        for r in &batch {
            check(0, r);
            seqs.push(r.seq);
        }
    }
}

/// A zeroed length in the middle of the active segment: the records after it are delivered
/// at once (the writer's published end shows they exist), the damage is reported once, and
/// later appends keep flowing.
#[test]
fn zeroed_length_in_the_active_segment_does_not_stall_the_reader() {
    let root = tempfile::tempdir().unwrap();
    let (mut w, path, offsets) = active_log(root.path(), 20);
    zero_len(&path, offsets[5]);
    let mut reader = ReplayReader::open(root.path(), Default::default(), None).unwrap();
    let seqs = poll_all(&mut reader);
    let expected: Vec<u64> = (0..20).filter(|&s| s != 5).collect();
    assert_eq!(seqs, expected);
    assert_eq!(reader.corruptions().len(), 1);
    assert_eq!(reader.corruptions()[0].offset, offsets[5]);
    assert_eq!(reader.corruptions()[0].path, path);
    assert_eq!(
        reader.corruptions()[0].reason,
        "zeroed record length before published records"
    );
    append(&mut w, 20..25);
    assert_eq!(poll_all(&mut reader), (20..25).collect::<Vec<_>>());
    assert_eq!(reader.corruptions().len(), 1, "reported once");
}

/// The last published record's length zeroed: nothing after it yet, so the reader waits
/// (quietly, without searching the same bytes on every poll); the next append is delivered.
#[test]
fn zeroed_length_of_the_last_record_waits_for_the_next_one() {
    let root = tempfile::tempdir().unwrap();
    let (mut w, path, offsets) = active_log(root.path(), 10);
    zero_len(&path, offsets[9]);
    let mut reader = ReplayReader::open(root.path(), Default::default(), None).unwrap();
    assert_eq!(poll_all(&mut reader), (0..9).collect::<Vec<_>>());
    assert!(poll_all(&mut reader).is_empty());
    assert!(reader.corruptions().is_empty());
    append(&mut w, 10..12);
    assert_eq!(poll_all(&mut reader), vec![10, 11]);
    assert_eq!(reader.corruptions().len(), 1);
    assert_eq!(reader.corruptions()[0].offset, offsets[9]);
}

/// A reader at the real end of the data of a live writer never mistakes it for damage.
#[test]
fn end_of_data_of_a_live_writer_is_not_corruption() {
    let root = tempfile::tempdir().unwrap();
    let (mut w, _, _) = active_log(root.path(), 3);
    let mut reader = ReplayReader::open(root.path(), Default::default(), None).unwrap();
    let mut got = poll_all(&mut reader);
    for seq in 3..200 {
        append(&mut w, seq..seq + 1);
        got.extend(poll_all(&mut reader));
    }
    assert_eq!(got, (0..200).collect::<Vec<_>>());
    assert!(reader.corruptions().is_empty());
}
