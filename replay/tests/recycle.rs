//! Segment recycling: consumed segments' files are reused for later segments (see the crate
//! docs). Every record arrives exactly once and in order, stale bytes of a file's previous life
//! are never taken for records (by the reader, crash recovery or `inspect`), and a reader that
//! publishes no consumed position and still maps a recycled file notices instead of handing
//! out what the writer put there since.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_replay::{
    inspect, list_segments, ReaderOptions, RecordMeta, ReplayError, ReplayReader, ReplayWriter,
    WriterOptions,
};
use common::*;

const ROLE: &str = "REPLAY_RECYCLE_ROLE";

fn meta(seq: u64) -> RecordMeta {
    RecordMeta {
        policy_version: seq,
        stage: 2,
        kind: 0,
    }
}

fn opts(segment_size: u64, max_segments: usize) -> WriterOptions {
    WriterOptions {
        segment_size,
        max_segments,
        backpressure_timeout: Duration::from_secs(60),
        ..Default::default()
    }
}

fn observer() -> ReaderOptions {
    ReaderOptions {
        consumer: "observer".into(),
        ..Default::default()
    }
}

/// Appends `seqs` of `actor` (sizes 16 B – `max_len`).
fn append(w: &mut ReplayWriter, actor: u64, seqs: std::ops::Range<u64>, max_len: usize) {
    for seq in seqs {
        let p = payload(actor, seq, payload_len(actor, seq, 16, max_len));
        assert_eq!(w.append(meta(seq), &p).unwrap(), seq);
    }
}

/// One writer, one registered reader publishing after every poll: the files of consumed
/// segments come back (same inode, later index), every record arrives once, in order and
/// intact, and the directory never holds more than `max_segments` segment files.
#[test]
fn recycled_files_deliver_every_record_once_in_order() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-1");
    let mut w = ReplayWriter::open(&dir, opts(32 << 10, 4)).unwrap();
    let mut reader = ReplayReader::open(root.path(), ReaderOptions::default(), None).unwrap();
    let mut inodes = Inodes::default();
    let mut next = 0u64;
    let mut max_files = 0;
    let total = 3000u64;
    let mut seq = 0u64;
    while next < total {
        if seq < total {
            let n = 1 + mix(seq) % 12;
            append(&mut w, 1, seq..(seq + n).min(total), 6000);
            seq = (seq + n).min(total);
        }
        for r in reader.poll(Duration::from_millis(1)).unwrap() {
            assert_eq!(r.seq, next, "duplicate, gap or reordering");
            check(1, &r);
            assert!(r.payload.is_intact());
            assert_eq!(r.meta, meta(r.seq));
            next += 1;
        }
        reader.publish_consumed().unwrap();
        inodes.sample(&dir);
        let files = std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_str().unwrap().starts_with("seg-")
            })
            .count();
        max_files = max_files.max(files);
    }
    assert!(
        reader.corruptions().is_empty(),
        "{:?}",
        reader.corruptions()
    );
    assert!(
        inodes.reused() >= 50,
        "files were not recycled: {inodes:?} (max {max_files} files)"
    );
    assert!(max_files <= 4, "{max_files} segment files at once");
    let report = inspect(root.path()).unwrap();
    assert!(
        !report.has_corruption(),
        "{:?}",
        report.actors[0].corruptions
    );
    // A reopened writer (crash recovery on a recycled active segment) continues the sequence,
    // and a reader resuming from the cursors gets exactly the new records.
    let cursors = reader.cursors();
    drop(w);
    let mut w = ReplayWriter::open(&dir, opts(32 << 10, 4)).unwrap();
    assert_eq!(w.next_seq(), total);
    append(&mut w, 1, total..total + 50, 6000);
    let (reader, rest) = drain(root.path(), Some(cursors));
    assert_eq!(
        rest.iter().map(|r| r.seq).collect::<Vec<_>>(),
        (total..total + 50).collect::<Vec<_>>()
    );
    rest.iter().for_each(|r| check(1, r));
    assert!(reader.corruptions().is_empty());
}

/// Appends `actor`'s records of `size` bytes segment by segment (the reader consuming and
/// publishing after each roll) until the active segment is a recycled file holding at least the
/// records that filled the roll into it.
fn roll_until_the_active_segment_is_recycled(
    w: &mut ReplayWriter,
    reader: &mut ReplayReader,
    inodes: &mut Inodes,
    dir: &Path,
    actor: u64,
    size: usize,
    seq: &mut u64,
) {
    loop {
        let active = w_index(dir);
        while w_index(dir) == active {
            w.append(meta(*seq), &payload(actor, *seq, size)).unwrap();
            *seq += 1;
        }
        for r in reader.poll(Duration::from_millis(1)).unwrap() {
            check(actor, &r);
        }
        reader.publish_consumed().unwrap();
        inodes.sample(dir);
        if inodes.is_recycled(dir, w_index(dir)) {
            break;
        }
        assert!(*seq < 100_000, "no recycled active segment: {inodes:?}");
    }
}

/// A writer that stops in a recycled segment, whose body past the new records still holds the
/// previous life's (CRC-valid) records: crash recovery and `inspect` take none of them, and a
/// fresh reader reads exactly the live records.
#[test]
fn stale_records_of_a_recycled_active_segment_are_never_resurrected() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-3");
    let mut w = ReplayWriter::open(&dir, opts(64 << 10, 3)).unwrap();
    let mut reader = ReplayReader::open(root.path(), ReaderOptions::default(), None).unwrap();
    let mut inodes = Inodes::default();
    let mut seq = 0;
    // Same-size records, so stale record headers sit exactly where new records will go.
    while inodes.reused() < 3 {
        for _ in 0..8 {
            w.append(meta(seq), &payload(3, seq, 4000)).unwrap();
            seq += 1;
        }
        for r in reader.poll(Duration::from_millis(1)).unwrap() {
            check(3, &r);
        }
        reader.publish_consumed().unwrap();
        inodes.sample(&dir);
        assert!(seq < 100_000, "no recycling: {inodes:?}");
    }
    // Start a new segment, which must be a recycled file, and stop after a few records of it.
    roll_until_the_active_segment_is_recycled(
        &mut w,
        &mut reader,
        &mut inodes,
        &dir,
        3,
        4000,
        &mut seq,
    );
    for _ in 0..3 {
        w.append(meta(seq), &payload(3, seq, 4000)).unwrap();
        seq += 1;
    }
    let cursors = reader.cursors();
    drop(reader);
    drop(w);
    let (_, got) = drain(root.path(), Some(cursors.clone()));
    let expect: Vec<u64> = (cursors.actors["actor-3"].next_seq..seq).collect();
    assert_eq!(got.iter().map(|r| r.seq).collect::<Vec<_>>(), expect);
    let report = inspect(root.path()).unwrap();
    assert!(
        !report.has_corruption(),
        "{:?}",
        report.actors[0].corruptions
    );
    assert_eq!(report.actors[0].seq_range.unwrap().1, seq - 1);
    let mut w = ReplayWriter::open(&dir, opts(64 << 10, 3)).unwrap();
    assert_eq!(
        w.next_seq(),
        seq,
        "recovery took a stale record for a live one"
    );
    w.append(meta(seq), &payload(3, seq, 4000)).unwrap();
    let (reader, got) = drain(root.path(), Some(cursors));
    let expect: Vec<u64> = (expect[0]..=seq).collect();
    assert_eq!(got.iter().map(|r| r.seq).collect::<Vec<_>>(), expect);
    got.iter().for_each(|r| check(3, r));
    assert!(reader.corruptions().is_empty());
}

/// A reader keeps its mapping of a segment file and reuses it when the file comes back as a
/// later segment: damage in the new life is still reported under the segment's current file
/// name (not the one the reader first mapped the file under), and skipped.
#[test]
fn damage_in_a_recycled_segment_is_reported_under_its_current_name() {
    use std::os::unix::fs::FileExt;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-6");
    let mut w = ReplayWriter::open(&dir, opts(16 << 10, 3)).unwrap();
    let mut reader = ReplayReader::open(root.path(), ReaderOptions::default(), None).unwrap();
    let mut inodes = Inodes::default();
    let mut seq = 0;
    roll_until_the_active_segment_is_recycled(
        &mut w,
        &mut reader,
        &mut inodes,
        &dir,
        6,
        1000,
        &mut seq,
    );
    // The reader has read into the recycled active segment (through its earlier mapping).
    let mut next = reader.cursors().actors["actor-6"].next_seq;
    while next < seq {
        for r in reader.poll(Duration::from_millis(1)).unwrap() {
            assert_eq!(r.seq, next);
            check(6, &r);
            next += 1;
        }
    }
    let active = w_index(&dir);
    let path = dir.join(cascade_replay::segment_file_name(active));
    let bad = payload(6, seq, 1000);
    w.append(meta(seq), &bad).unwrap();
    w.append(meta(seq + 1), &payload(6, seq + 1, 1000)).unwrap();
    assert_eq!(
        w_index(&dir),
        active,
        "the test needs both records in this segment"
    );
    // Flip a byte of the first one's payload.
    let bytes = std::fs::read(&path).unwrap();
    let at = bytes
        .windows(bad.len())
        .position(|b| b == &bad[..])
        .expect("payload in the file");
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_at(&[bytes[at + 100] ^ 0x10], (at + 100) as u64)
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..100 {
        got.extend(reader.poll(Duration::from_millis(5)).unwrap());
        if !got.is_empty() {
            break;
        }
    }
    assert_eq!(got.iter().map(|r| r.seq).collect::<Vec<_>>(), [seq + 1]);
    check(6, &got[0]);
    let damage = reader.corruptions();
    assert_eq!(damage.len(), 1, "{damage:?}");
    assert_eq!(damage[0].path, path, "{damage:?}");
    assert_eq!(damage[0].reason, "CRC mismatch");
}

fn w_index(dir: &Path) -> u64 {
    list_segments(dir).unwrap().last().unwrap().0
}

/// A reader that publishes no consumed position, parked in segment 0 while the registered
/// reader moves on and the writer recycles that file: a payload it still holds says it is no
/// longer intact, and its next poll yields no stale or foreign record — it reports the lost
/// cursor instead.
#[test]
fn unregistered_reader_on_a_recycled_segment_gets_no_stale_record() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-4");
    let mut w = ReplayWriter::open(&dir, opts(16 << 10, 3)).unwrap();
    append(&mut w, 4, 0..3, 500);
    let mut slow = ReplayReader::open(
        root.path(),
        ReaderOptions {
            max_batch: 2,
            ..observer()
        },
        None,
    )
    .unwrap();
    let held = slow.poll(Duration::from_millis(5)).unwrap();
    assert_eq!(held.iter().map(|r| r.seq).collect::<Vec<_>>(), [0, 1]);
    assert!(held[0].payload.is_intact());
    let mut learner = ReplayReader::open(root.path(), ReaderOptions::default(), None).unwrap();
    let mut inodes = Inodes::default();
    inodes.sample(&dir);
    let mut seq = 3;
    while inodes.reused() == 0 || list_segments(&dir).unwrap()[0].0 == 0 {
        append(&mut w, 4, seq..seq + 4, 3000);
        seq += 4;
        for r in learner.poll(Duration::from_millis(1)).unwrap() {
            check(4, &r);
        }
        learner.publish_consumed().unwrap();
        inodes.sample(&dir);
        assert!(seq < 10_000, "segment 0 was never recycled");
    }
    // Segment 0's file now carries a later segment: what the slow reader held is gone...
    assert!(!held[0].payload.is_intact());
    // ...and it neither hands out the writer's new records as segment 0's nor stale ones.
    match slow.poll(Duration::from_millis(5)) {
        Err(ReplayError::CursorLost {
            segment, next_seq, ..
        }) => {
            assert_eq!((segment, next_seq), (0, 2));
        }
        other => panic!("expected a lost cursor, got {other:?}"),
    }
    assert!(slow.corruptions().is_empty(), "{:?}", slow.corruptions());
}

/// An unregistered reader polling in a thread while the writer recycles under it: whatever it
/// gets, in increasing seq order, is intact (checked, then confirmed by `is_intact`), or it
/// loses its cursor and starts over; it never reports recycling as corruption and never panics.
#[test]
fn unregistered_reader_racing_recycling_never_yields_stale_records() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-6");
    let mut w = ReplayWriter::open(&dir, opts(16 << 10, 3)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let root2 = root.path().to_path_buf();
    let watcher = std::thread::spawn(move || {
        let (mut got, mut lost, mut torn) = (0u64, 0u64, 0u64);
        let slow = || ReaderOptions {
            max_batch: 4,
            ..observer()
        };
        let mut reader = ReplayReader::open(&root2, slow(), None).unwrap();
        let mut last: Option<u64> = None;
        let mut polls = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            match reader.poll(Duration::from_millis(1)) {
                Ok(batch) => {
                    for r in batch {
                        assert!(last.is_none_or(|l| r.seq > l), "seq went backwards");
                        last = Some(r.seq);
                        let expected = payload(6, r.seq, r.payload.len());
                        let same = *r.payload == expected[..];
                        // Checked first, then confirmed: a payload that differs is only allowed
                        // when its file was recycled meanwhile.
                        if !r.payload.is_intact() {
                            torn += 1;
                        } else {
                            assert!(same, "seq {} is stale or torn but intact", r.seq);
                            got += 1;
                        }
                    }
                }
                Err(ReplayError::CursorLost { .. }) => {
                    lost += 1;
                    assert!(
                        reader.corruptions().is_empty(),
                        "{:?}",
                        reader.corruptions()
                    );
                    reader = ReplayReader::open(&root2, slow(), None).unwrap();
                    last = None;
                }
                Err(e) => panic!("{e}"),
            }
            // Slow now and then: it falls behind and is overtaken by recycling.
            polls += 1;
            let pause = if polls.is_multiple_of(64) {
                30_000
            } else {
                300
            };
            std::thread::sleep(Duration::from_micros(pause));
        }
        assert!(
            reader.corruptions().is_empty(),
            "{:?}",
            reader.corruptions()
        );
        (got, lost, torn)
    });
    let mut learner = ReplayReader::open(root.path(), ReaderOptions::default(), None).unwrap();
    let mut inodes = Inodes::default();
    let start = Instant::now();
    let mut seq = 0;
    while start.elapsed() < Duration::from_secs(2) {
        append(&mut w, 6, seq..seq + 8, 2000);
        seq += 8;
        for r in learner.poll(Duration::from_millis(1)).unwrap() {
            check(6, &r);
        }
        learner.publish_consumed().unwrap();
        inodes.sample(&dir);
    }
    stop.store(true, Ordering::Relaxed);
    let (got, lost, torn) = watcher.join().unwrap();
    eprintln!(
        "{seq} records written, {} files reused; the unregistered reader got {got} intact, \
         lost its cursor {lost} times, saw {torn} payloads recycled after hand-out",
        inodes.reused()
    );
    assert!(inodes.reused() > 0);
    assert!(got > 0);
    assert!(
        lost > 0,
        "the slow reader was never overtaken: nothing was tested"
    );
}

/// Child entry point: a writer appending until killed, printing each acknowledged seq.
#[test]
#[ignore = "child process entry point, started by the other tests"]
fn recycle_child_entry() {
    if std::env::var(ROLE).as_deref() != Ok("writer") {
        return;
    }
    let dir = PathBuf::from(std::env::var("REPLAY_DIR").unwrap());
    let mut w = ReplayWriter::open(&dir, opts(128 << 10, 4)).unwrap();
    let start = w.next_seq();
    for seq in start.. {
        let p = payload(7, seq, payload_len(7, seq, 16, 12 << 10));
        assert_eq!(w.append(meta(seq), &p).unwrap(), seq);
        println!("ACK {seq}");
    }
}

/// A writer killed with SIGKILL at random moments, many times, while the reader publishes its
/// consumed position after every poll so that files are recycled all the time (kills land
/// before, during and after recycling, in the writer and its helper thread): no stale record
/// comes back, nothing acknowledged is lost, nothing is delivered twice, and neither the
/// reader nor `inspect` finds anything corrupt.
#[test]
fn writer_killed_while_recycling_never_resurrects_stale_records() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-7");
    let rounds: u64 = std::env::var("REPLAY_KILL_ROUNDS")
        .map(|v| v.parse().unwrap())
        .unwrap_or(50);
    let mut reader = ReplayReader::open(root.path(), ReaderOptions::default(), None).unwrap();
    let mut next = 0u64;
    let mut inodes = Inodes::default();
    let poll = |reader: &mut ReplayReader, next: &mut u64, inodes: &mut Inodes| {
        for r in reader.poll(Duration::from_millis(1)).unwrap() {
            assert_eq!(r.seq, *next, "duplicate, gap or stale record");
            check(7, &r);
            assert_eq!(r.meta, meta(r.seq));
            *next += 1;
        }
        reader.publish_consumed().unwrap();
        inodes.sample(&dir);
    };
    for round in 0..rounds {
        let mut child = spawn_child(
            "recycle_child_entry",
            &[
                (ROLE, "writer".to_string()),
                ("REPLAY_DIR", dir.display().to_string()),
            ],
        );
        let (acked, pump) = pump_acks(&mut child);
        let t0 = Instant::now();
        while acked.load(Ordering::SeqCst) == u64::MAX && t0.elapsed() < Duration::from_secs(30) {
            poll(&mut reader, &mut next, &mut inodes);
        }
        let delay = Duration::from_micros(1000 + mix(round ^ 0xabc) % 30_000);
        let t1 = Instant::now();
        while t1.elapsed() < delay {
            poll(&mut reader, &mut next, &mut inodes);
        }
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
        child.wait().unwrap();
        pump.join().unwrap();
        let last = acked.load(Ordering::SeqCst);
        assert_ne!(last, u64::MAX, "round {round}: the child never appended");
        let t2 = Instant::now();
        while next <= last {
            assert!(
                t2.elapsed() < Duration::from_secs(30),
                "round {round}: seq {next} acknowledged but never delivered"
            );
            poll(&mut reader, &mut next, &mut inodes);
        }
        let report = inspect(root.path()).unwrap();
        assert!(
            !report.has_corruption(),
            "round {round}: {:?}",
            report.actors[0].corruptions
        );
        let leftover = std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_str().unwrap().starts_with("seg-")
            })
            .count();
        assert!(leftover <= 4 + 1, "round {round}: {leftover} segment files");
    }
    assert!(
        reader.corruptions().is_empty(),
        "{:?}",
        reader.corruptions()
    );
    assert!(
        inodes.reused() >= rounds as usize / 2,
        "too little recycling to mean anything: {inodes:?}"
    );
    // A last recovery with nobody killing it: it continues exactly after what was delivered
    // or acknowledged, never behind (a stale record taken for live) or past a gap.
    let w = ReplayWriter::open(&dir, opts(128 << 10, 4)).unwrap();
    assert!(w.next_seq() >= next);
    drop(w);
    while reader
        .poll(Duration::from_millis(5))
        .unwrap()
        .iter()
        .any(|r| {
            assert_eq!(r.seq, next);
            check(7, r);
            next += 1;
            true
        })
    {}
    eprintln!(
        "{rounds} kills, {next} records delivered, {} files recycled",
        inodes.reused()
    );
}

/// What a power loss can leave of a segment whose header never became durable (rolling defers
/// the header's msync and the directory's fsync to `sync`): the file's previous header (a
/// recycled file), zeros (a new file), or the recycling placeholder. A writer reopening finds
/// it, removes it (no synced record can be in it) and continues right after the previous
/// segment; the stale records in the file never come back. When no other segment is left, it
/// starts over at that index after the consumed position.
#[test]
fn segments_whose_creation_never_became_durable_are_dropped_not_resurrected() {
    use cascade_replay::header::SegmentHeader;
    use std::os::unix::fs::FileExt;
    for variant in [
        "previous header",
        "zeros",
        "placeholder",
        "nothing else left",
    ] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("actor-8");
        let mut w = ReplayWriter::open(&dir, opts(32 << 10, 3)).unwrap();
        let mut reader = ReplayReader::open(root.path(), ReaderOptions::default(), None).unwrap();
        let mut inodes = Inodes::default();
        let mut seq = 0;
        // Until the active segment is a recycled file holding a few records.
        roll_until_the_active_segment_is_recycled(
            &mut w,
            &mut reader,
            &mut inodes,
            &dir,
            8,
            3000,
            &mut seq,
        );
        let newest = w_index(&dir);
        // The records appended to the newest segment are not synced: a power loss may take
        // them; everything before was synced (and the headers and names with it).
        w.sync().unwrap();
        let first_lost = seq - 1;
        for _ in 0..3 {
            w.append(meta(seq), &payload(8, seq, 3000)).unwrap();
            seq += 1;
        }
        drop(w);
        drop(reader);
        let path = dir.join(cascade_replay::segment_file_name(newest));
        let size = std::fs::metadata(&path).unwrap().len();
        let header = match variant {
            "zeros" => [0u8; 64],
            "placeholder" => SegmentHeader {
                index: newest,
                first_seq: u64::MAX,
                size,
            }
            .to_bytes(),
            _ => SegmentHeader {
                index: newest - 3,
                first_seq: 0,
                size,
            }
            .to_bytes(),
        };
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .write_all_at(&header, 0)
            .unwrap();
        let consumed = cascade_replay::read_min_consumed(&dir).unwrap().unwrap();
        if variant == "nothing else left" {
            for (i, p) in list_segments(&dir).unwrap() {
                if i != newest {
                    std::fs::remove_file(p).unwrap();
                }
            }
        }
        let mut w = ReplayWriter::open(&dir, opts(32 << 10, 3)).unwrap();
        let resumed = w.next_seq();
        if variant == "nothing else left" {
            assert_eq!(resumed, consumed, "{variant}");
            assert_eq!(list_segments(&dir).unwrap()[0].0, newest, "{variant}");
        } else {
            // The newest segment began with `first_lost` (the append that rolled to it); the
            // segment before ends with its end marker there.
            assert_eq!(resumed, first_lost, "{variant}");
        }
        for s in resumed..resumed + 20 {
            w.append(meta(s), &payload(8, s, 3000)).unwrap();
        }
        let (reader, got) = drain(root.path(), None);
        let seqs: Vec<u64> = got.iter().map(|r| r.seq).collect();
        let from = seqs[0];
        assert_eq!(
            seqs,
            (from..resumed + 20).collect::<Vec<_>>(),
            "{variant}: not one contiguous run"
        );
        got.iter().for_each(|r| check(8, r));
        assert!(
            reader.corruptions().is_empty(),
            "{variant}: {:?}",
            reader.corruptions()
        );
        assert!(!inspect(root.path()).unwrap().has_corruption(), "{variant}");
    }
}
