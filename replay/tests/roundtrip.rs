//! Single-process behaviour: round trips, segment rolling, reader restart from cursors,
//! retention, backpressure, error cases.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cascade_replay::{
    list_segments, Cursors, ReaderOptions, RecordMeta, ReplayError, ReplayReader, ReplayWriter,
    WriterOptions,
};
use common::*;
use proptest::prelude::*;

fn meta(seq: u64) -> RecordMeta {
    RecordMeta {
        policy_version: seq / 10,
        stage: 3,
        kind: 0,
    }
}

fn write(dir: &std::path::Path, actor: u64, n: u64, opts: WriterOptions) -> Vec<Vec<u8>> {
    let mut w = ReplayWriter::open(dir, opts).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let seq = w.next_seq();
        let p = payload(actor, seq, payload_len(actor, seq, 1, 3000));
        assert_eq!(w.append(meta(seq), &p).unwrap(), seq);
        out.push(p);
    }
    w.sync().unwrap();
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn payloads_round_trip(payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..5000), 1..40),
                           pv in any::<u64>(), stage in any::<u8>(), kind in any::<u8>()) {
        let root = tempfile::tempdir().unwrap();
        let mut w = ReplayWriter::open(root.path().join("actor-0"), small_writer(8192)).unwrap();
        for p in &payloads {
            w.append(RecordMeta { policy_version: pv, stage, kind }, p).unwrap();
        }
        let (reader, got) = drain(root.path(), None);
        prop_assert_eq!(got.len(), payloads.len());
        for (i, (r, p)) in got.iter().zip(&payloads).enumerate() {
            prop_assert_eq!(r.seq, i as u64);
            prop_assert_eq!(&*r.payload, &p[..]);
            prop_assert_eq!(r.meta, RecordMeta { policy_version: pv, stage, kind });
        }
        prop_assert!(reader.corruptions().is_empty());
    }
}

#[test]
fn records_roll_over_segments_in_order() {
    let root = tempfile::tempdir().unwrap();
    let written = write(&root.path().join("actor-1"), 1, 500, small_writer(16384));
    assert!(list_segments(&root.path().join("actor-1")).unwrap().len() > 10);
    let (reader, got) = drain(root.path(), None);
    assert_eq!(got.len(), 500);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.seq, i as u64);
        assert_eq!(*r.payload, written[i][..]);
        assert_eq!(r.meta, meta(i as u64));
        assert_eq!(&*r.actor, "actor-1");
    }
    assert!(reader.corruptions().is_empty());
}

#[test]
fn reopened_writer_continues_the_sequence() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-0");
    write(&dir, 0, 30, small_writer(8192));
    write(&dir, 0, 30, small_writer(8192));
    let (_, got) = drain(root.path(), None);
    let seqs: Vec<u64> = got.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (0..60).collect::<Vec<_>>());
    got.iter().for_each(|r| check(0, r));
}

#[test]
fn reader_restart_from_cursors_has_no_duplicate_and_no_loss() {
    let root = tempfile::tempdir().unwrap();
    for a in 0..3 {
        write(
            &root.path().join(format!("actor-{a}")),
            a,
            200,
            small_writer(16384),
        );
    }
    let mut reader = ReplayReader::open(
        root.path(),
        ReaderOptions {
            max_batch: 7,
            ..Default::default()
        },
        None,
    )
    .unwrap();
    let mut seen = Vec::new();
    for _ in 0..20 {
        seen.extend(reader.poll(Duration::from_millis(1)).unwrap());
    }
    // The cursors travel through JSON, as they do in a snapshot's state.json.
    let saved: Cursors =
        serde_json::from_str(&serde_json::to_string(&reader.cursors()).unwrap()).unwrap();
    drop(reader);
    // More records arrive while the learner is down, including from a new actor.
    write(&root.path().join("actor-0"), 0, 50, small_writer(16384));
    write(&root.path().join("actor-3"), 3, 40, small_writer(16384));
    let (_, rest) = drain(root.path(), Some(saved));
    seen.extend(rest);
    let mut per_actor = std::collections::BTreeMap::<String, Vec<u64>>::new();
    for r in &seen {
        check(actor_index(&r.actor), r);
        per_actor
            .entry(r.actor.to_string())
            .or_default()
            .push(r.seq);
    }
    assert_eq!(per_actor["actor-0"], (0..250).collect::<Vec<_>>());
    assert_eq!(per_actor["actor-1"], (0..200).collect::<Vec<_>>());
    assert_eq!(per_actor["actor-2"], (0..200).collect::<Vec<_>>());
    assert_eq!(per_actor["actor-3"], (0..40).collect::<Vec<_>>());
}

#[test]
fn retention_deletes_consumed_segments_and_restart_still_works() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-0");
    let opts = WriterOptions {
        segment_size: 8192,
        max_segments: 3,
        backpressure_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    let mut w = ReplayWriter::open(&dir, opts).unwrap();
    let mut reader = ReplayReader::open(root.path(), ReaderOptions::default(), None).unwrap();
    let mut got = Vec::new();
    let mut max_live = 0;
    for seq in 0..400u64 {
        let p = payload(0, seq, 1000);
        w.append(meta(seq), &p).unwrap();
        max_live = max_live.max(list_segments(&dir).unwrap().len());
        if seq % 5 == 4 {
            // Payloads are checked before the consumed position moves past them: after that,
            // the writer may recycle their segment's file.
            let batch = reader.poll(Duration::from_millis(10)).unwrap();
            batch.iter().for_each(|r| check(0, r));
            got.extend(batch.iter().map(|r| r.seq));
            reader.publish_consumed().unwrap();
        }
    }
    assert!(max_live <= 3, "{max_live} segments live");
    let first_left = list_segments(&dir).unwrap()[0].0;
    assert!(
        first_left > 10,
        "old segments were deleted (oldest left: {first_left})"
    );
    let saved = reader.cursors();
    drop(reader);
    let (_, rest) = drain(root.path(), Some(saved));
    rest.iter().for_each(|r| check(0, r));
    got.extend(rest.iter().map(|r| r.seq));
    assert_eq!(got, (0..400).collect::<Vec<_>>());
}

#[test]
fn cursor_behind_retention_is_an_error_not_a_silent_loss() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-0");
    let mut w = ReplayWriter::open(
        &dir,
        WriterOptions {
            segment_size: 4096,
            max_segments: 3,
            ..Default::default()
        },
    )
    .unwrap();
    let mut reader = ReplayReader::open(root.path(), ReaderOptions::default(), None).unwrap();
    w.append(meta(0), &[1; 100]).unwrap();
    reader.poll(Duration::from_millis(5)).unwrap();
    let stale = reader.cursors();
    for seq in 1..200 {
        w.append(meta(seq), &[2; 1000]).unwrap();
        reader.poll(Duration::ZERO).unwrap();
        reader.publish_consumed().unwrap();
    }
    let mut again = ReplayReader::open(root.path(), ReaderOptions::default(), Some(stale)).unwrap();
    assert!(matches!(
        again.poll(Duration::ZERO),
        Err(ReplayError::CursorLost { .. })
    ));
}

#[test]
fn backpressure_times_out_then_resumes_when_consumed() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-0");
    let opts = WriterOptions {
        max_inflight: Some(10),
        backpressure_timeout: Duration::from_millis(50),
        ..small_writer(65536)
    };
    let mut w = ReplayWriter::open(&dir, opts).unwrap();
    for seq in 0..10 {
        w.append(meta(seq), b"x").unwrap();
    }
    let err = w.append(meta(10), b"x").unwrap_err();
    assert!(
        matches!(
            err,
            ReplayError::BackpressureTimeout {
                next_seq: 10,
                consumed: 0,
                ..
            }
        ),
        "{err}"
    );
    let mut reader = ReplayReader::open(root.path(), ReaderOptions::default(), None).unwrap();
    assert_eq!(reader.poll(Duration::from_millis(5)).unwrap().len(), 10);
    reader.publish_consumed().unwrap();
    assert_eq!(w.append(meta(10), b"x").unwrap(), 10);
}

#[test]
fn backpressure_wait_is_cancellable() {
    let root = tempfile::tempdir().unwrap();
    let cancel = Arc::new(AtomicBool::new(false));
    let opts = WriterOptions {
        max_inflight: Some(1),
        backpressure_timeout: Duration::from_secs(60),
        cancel: Some(cancel.clone()),
        ..small_writer(65536)
    };
    let mut w = ReplayWriter::open(root.path().join("actor-0"), opts).unwrap();
    w.append(meta(0), b"x").unwrap();
    let flag = cancel.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        flag.store(true, Ordering::Relaxed);
    });
    let start = std::time::Instant::now();
    assert!(matches!(
        w.append(meta(1), b"x"),
        Err(ReplayError::Cancelled)
    ));
    assert!(start.elapsed() < Duration::from_secs(10));
    t.join().unwrap();
}

#[test]
fn oversized_record_is_refused_clearly() {
    let root = tempfile::tempdir().unwrap();
    let mut w = ReplayWriter::open(root.path().join("actor-0"), small_writer(4096)).unwrap();
    let max = cascade_replay::max_payload_for(4096);
    w.append(meta(0), &vec![7; max]).unwrap();
    let err = w.append(meta(1), &vec![7; max + 1]).unwrap_err();
    assert!(
        err.to_string().contains("does not fit in a segment"),
        "{err}"
    );
    assert_eq!(w.append(meta(1), b"ok").unwrap(), 1);
    let (_, got) = drain(root.path(), None);
    assert_eq!(got.len(), 2);
}

#[test]
fn second_writer_on_a_directory_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let _w = ReplayWriter::open(root.path().join("actor-0"), small_writer(4096)).unwrap();
    let err = ReplayWriter::open(root.path().join("actor-0"), small_writer(4096)).unwrap_err();
    assert!(matches!(err, ReplayError::Locked { .. }), "{err}");
}

#[test]
fn reader_follows_actors_that_appear_later_and_wakes_on_append() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path()).unwrap();
    let mut reader = ReplayReader::open(
        root.path(),
        ReaderOptions {
            rescan_interval: Duration::from_millis(5),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    assert!(reader.poll(Duration::from_millis(2)).unwrap().is_empty());
    let path = root.path().join("actor-9");
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        let mut w = ReplayWriter::open(path, small_writer(8192)).unwrap();
        w.append(meta(0), &payload(9, 0, 77)).unwrap();
        w
    });
    let got = reader.poll(Duration::from_secs(10)).unwrap();
    assert_eq!(got.len(), 1);
    check(9, &got[0]);
    t.join().unwrap();
}
