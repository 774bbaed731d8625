//! Inputs found by the `replay/fuzz` target (`segment_bytes`), replayed through the same checks
//! (`fuzz_check`, the target's own code) so that they stay fixed; each test is one input.

mod fuzz_check;

use cascade_replay::header::SegmentHeader;
use cascade_replay::{RecordMeta, ReplayWriter, WriterOptions};
use fuzz_check::run;

/// Every crash input the fuzzer found (`tests/fuzz_inputs/`, file names as libFuzzer wrote
/// them). The first, `crash-c433ec2d…`: a resumed writer on a segment too short for an end
/// marker (67 bytes, and its header says so) panicked with "write past the end" when sealing
/// it; it now moves on to a new segment.
#[test]
fn fuzz_crash_inputs_stay_fixed() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_inputs");
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty());
    for path in inputs {
        eprintln!("{}", path.display());
        run(&std::fs::read(&path).unwrap());
    }
}

/// The first crash, spelled out: a valid header claiming 67 bytes, a 67-byte file.
#[test]
fn writer_resuming_on_a_segment_without_room_for_an_end_marker() {
    let mut input = vec![0x0b, 0, 0, 0, 0];
    input.extend([0xc5; 58]);
    input.extend([0, 0, 0, 0x0a, 0x7e]);
    assert_eq!(input.len(), 68);
    run(&input);
}

/// A segment of hand-made records with the given seqs (valid CRCs), header first_seq 0.
fn segment_with_seqs(seqs: &[u64]) -> Vec<u8> {
    use cascade_replay::header::{RecordHeader, RECORD_MAGIC};
    let mut bytes = vec![0u8; 4096];
    let mut at = 64;
    for &seq in seqs {
        let payload = seq.to_le_bytes();
        let h = RecordHeader::new(RECORD_MAGIC, seq, RecordMeta::default(), &payload);
        bytes[at..at + 32].copy_from_slice(&h.to_bytes());
        bytes[at + 32..at + 40].copy_from_slice(&payload);
        at += h.padded_len() as usize;
    }
    let h = SegmentHeader {
        index: 0,
        first_seq: 0,
        size: bytes.len() as u64,
    };
    bytes[..64].copy_from_slice(&h.to_bytes());
    bytes
}

/// Valid records whose seqs go backwards (10, then 5): the reader skips the second as damage,
/// so a writer resuming there must continue after 10, not after 5, or the reader would skip
/// what it appends too.
#[test]
fn writer_resuming_after_a_seq_going_backwards_continues_after_the_largest() {
    let mut input = vec![0x02];
    input.extend(segment_with_seqs(&[10, 5]));
    run(&input);
    let report = {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("actor-0");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(cascade_replay::segment_file_name(0)), &input[1..]).unwrap();
        cascade_replay::inspect(root.path()).unwrap()
    };
    assert_eq!(report.actors[0].records, 1);
    assert_eq!(
        report.actors[0].corruptions[0].reason,
        "sequence number goes backwards"
    );
}

/// The largest seq: never written by a writer, rejected (so `seq + 1` never overflows), and a
/// writer resuming right below it refuses to append rather than wrap around.
#[test]
fn seq_at_the_top_of_the_range_neither_overflows_nor_wraps() {
    let mut input = vec![0x02];
    input.extend(segment_with_seqs(&[u64::MAX]));
    run(&input);
    let mut input = vec![0x02];
    input.extend(segment_with_seqs(&[u64::MAX - 1]));
    run(&input);
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-0");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(cascade_replay::segment_file_name(0)), &input[1..]).unwrap();
    let mut w = ReplayWriter::open(
        &dir,
        WriterOptions {
            segment_size: 4096,
            doorbell: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(w.next_seq(), u64::MAX);
    assert!(w.append(RecordMeta::default(), b"x").is_err());
}
