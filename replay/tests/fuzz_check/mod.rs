//! The checks of the `segment_bytes` fuzz target, shared by the target
//! (`replay/fuzz/fuzz_targets/segment_bytes.rs`) and the replay of its crash inputs
//! (`replay/tests/fuzz_regressions.rs`). See the target for what the option byte selects.

use std::time::Duration;

use cascade_replay::header::SegmentHeader;
use cascade_replay::{RecordMeta, ReplayReader, ReplayWriter, WriterOptions};

/// One fuzz input: an option byte, then the segment's bytes.
pub fn run(input: &[u8]) {
    let Some((&flags, bytes)) = input.split_first() else {
        return;
    };
    let mut bytes = bytes.to_vec();
    if flags & 1 != 0 && bytes.len() >= 64 {
        let h = SegmentHeader {
            index: 0,
            first_seq: 0,
            size: bytes.len() as u64,
        };
        bytes[..64].copy_from_slice(&h.to_bytes());
    }
    read_only(&bytes);
    if flags & 2 != 0 {
        resume_writer(&bytes);
    }
}

/// The bytes as the first and a later segment: the reader treats the first as finished.
fn read_only(bytes: &[u8]) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-0");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(cascade_replay::segment_file_name(0)), bytes).unwrap();
    std::fs::write(dir.join(cascade_replay::segment_file_name(1)), bytes).unwrap();
    if let Ok(mut reader) = ReplayReader::open(root.path(), Default::default(), None) {
        for _ in 0..4 {
            match reader.poll(Duration::ZERO) {
                Ok(batch) => batch
                    .iter()
                    .for_each(|r| assert!(r.payload.len() <= bytes.len())),
                Err(_) => break,
            }
        }
    }
    let _ = cascade_replay::inspect(root.path());
    let _ = cascade_replay::dump(root.path(), 16);
}

/// The bytes as the only (so the active) segment of a crashed writer: a new writer either
/// refuses it with an error or resumes, and what it then appends is delivered intact.
fn resume_writer(bytes: &[u8]) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-0");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(cascade_replay::segment_file_name(0)), bytes).unwrap();
    let opts = WriterOptions {
        segment_size: 4096,
        doorbell: false,
        ..Default::default()
    };
    let Ok(mut writer) = ReplayWriter::open(&dir, opts) else {
        return;
    };
    let payload = b"appended after recovery";
    let meta = RecordMeta {
        policy_version: 7,
        stage: 1,
        kind: 2,
    };
    let Ok(seq) = writer.append(meta, payload) else {
        return;
    };
    drop(writer);
    let mut reader = ReplayReader::open(root.path(), Default::default(), None).unwrap();
    let mut found = false;
    for _ in 0..8 {
        let Ok(batch) = reader.poll(Duration::ZERO) else {
            break;
        };
        for r in &batch {
            if r.seq == seq && r.meta == meta && *r.payload == payload[..] {
                found = true;
            }
        }
        if found || batch.is_empty() {
            break;
        }
    }
    assert!(
        found,
        "record {seq} appended after recovery was not delivered"
    );
}
