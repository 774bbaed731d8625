//! Several processes: 4 writers + 1 reader, writers killed with SIGKILL, a writer hitting a
//! file-size limit. Child processes are this test binary re-run on an ignored entry point.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cascade_replay::{RecordMeta, ReplayError, ReplayWriter, WriterOptions};
use common::*;

const ROLE: &str = "REPLAY_TEST_ROLE";

/// Child entry point: does nothing unless started by one of the tests below.
#[test]
#[ignore = "child process entry point, started by the other tests"]
fn child_entry() {
    let role = std::env::var(ROLE).unwrap_or_default();
    let dir = PathBuf::from(std::env::var("REPLAY_DIR").unwrap());
    let actor: u64 = std::env::var("REPLAY_ACTOR").unwrap().parse().unwrap();
    let count: u64 = std::env::var("REPLAY_COUNT")
        .map(|c| c.parse().unwrap())
        .unwrap_or(u64::MAX);
    let max_len: usize = std::env::var("REPLAY_MAX_LEN").unwrap().parse().unwrap();
    let segment_size: u64 = std::env::var("REPLAY_SEGMENT").unwrap().parse().unwrap();
    let opts = WriterOptions {
        segment_size,
        max_segments: 8,
        backpressure_timeout: Duration::from_secs(120),
        ..Default::default()
    };
    match role.as_str() {
        "writer" | "crash" => {
            let mut w = ReplayWriter::open(&dir, opts).unwrap();
            let start = w.next_seq();
            for seq in start..start.saturating_add(count) {
                let p = payload(actor, seq, payload_len(actor, seq, 16, max_len));
                assert_eq!(
                    w.append(
                        RecordMeta {
                            policy_version: seq,
                            stage: 4,
                            kind: 0
                        },
                        &p
                    )
                    .unwrap(),
                    seq
                );
                if role == "crash" {
                    println!("ACK {seq}");
                }
            }
            w.sync().unwrap();
        }
        "fulldisk" => {
            let mut w = ReplayWriter::open(
                &dir,
                WriterOptions {
                    max_segments: 100,
                    ..opts
                },
            )
            .unwrap();
            // RLIMIT_FSIZE caps each file's size: the open segment exists, the next one cannot
            // be preallocated — the same failure as a full disk, at a known moment.
            // SAFETY: setting a resource limit and ignoring SIGXFSZ in this child process only.
            unsafe {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let lim = libc::rlimit {
                    rlim_cur: segment_size / 2,
                    rlim_max: segment_size / 2,
                };
                assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
            }
            for seq in 0.. {
                let p = payload(actor, seq, payload_len(actor, seq, 16, max_len));
                match w.append(
                    RecordMeta {
                        policy_version: seq,
                        stage: 4,
                        kind: 0,
                    },
                    &p,
                ) {
                    Ok(s) => println!("ACK {s}"),
                    Err(e) => {
                        let preallocate = matches!(e, ReplayError::Preallocate { .. });
                        println!("ERR {preallocate} {e}");
                        break;
                    }
                }
            }
        }
        other => panic!("unknown child role {other:?}"),
    }
}

fn env(
    role: &str,
    dir: &std::path::Path,
    actor: u64,
    count: Option<u64>,
    max_len: usize,
    segment: u64,
) -> Vec<(&'static str, String)> {
    let mut v = vec![
        (ROLE, role.to_string()),
        ("REPLAY_DIR", dir.display().to_string()),
        ("REPLAY_ACTOR", actor.to_string()),
        ("REPLAY_MAX_LEN", max_len.to_string()),
        ("REPLAY_SEGMENT", segment.to_string()),
    ];
    if let Some(c) = count {
        v.push(("REPLAY_COUNT", c.to_string()));
    }
    v
}

/// 4 writer processes × 25 000 records of 16 B – 256 KiB (log-uniform), 1 reader (this
/// process) publishing its consumed position so retention keeps disk use bounded.
#[test]
fn four_writer_processes_one_reader_exactly_once_in_order() {
    let root = tempfile::tempdir().unwrap();
    let per_writer: u64 = std::env::var("REPLAY_MP_RECORDS")
        .map(|v| v.parse().unwrap())
        .unwrap_or(25_000);
    let start = Instant::now();
    let mut children: Vec<_> = (0..4u64)
        .map(|a| {
            spawn_child(
                "child_entry",
                &env(
                    "writer",
                    &root.path().join(format!("actor-{a}")),
                    a,
                    Some(per_writer),
                    256 << 10,
                    8 << 20,
                ),
            )
        })
        .collect();
    let mut reader =
        cascade_replay::ReplayReader::open(root.path(), Default::default(), None).unwrap();
    let mut next: BTreeMap<String, u64> = BTreeMap::new();
    let mut total = 0u64;
    let mut bytes = 0u64;
    let mut last_publish = Instant::now();
    while total < 4 * per_writer {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "stalled at {total} records"
        );
        for r in reader.poll(Duration::from_millis(100)).unwrap() {
            let expect = next.entry(r.actor.to_string()).or_insert(0);
            assert_eq!(r.seq, *expect, "{}: out of order or duplicate", r.actor);
            *expect += 1;
            let a = actor_index(&r.actor);
            assert_eq!(r.payload.len(), payload_len(a, r.seq, 16, 256 << 10));
            check(a, &r);
            assert_eq!(r.meta.policy_version, r.seq);
            bytes += r.payload.len() as u64;
            total += 1;
        }
        if last_publish.elapsed() > Duration::from_millis(20) {
            reader.publish_consumed().unwrap();
            last_publish = Instant::now();
        }
    }
    for c in &mut children {
        assert!(c.wait().unwrap().success());
    }
    assert!(
        reader.poll(Duration::from_millis(20)).unwrap().is_empty(),
        "no extra records"
    );
    assert!(reader.corruptions().is_empty());
    eprintln!(
        "{total} records, {:.2} GB in {:.1?}",
        bytes as f64 / 1e9,
        start.elapsed()
    );
}

/// A writer killed with SIGKILL at random moments, 50 times, restarted each time, while this
/// process reads: no torn or corrupt record, nothing acknowledged is lost, no duplicate.
#[test]
fn writer_killed_fifty_times_loses_nothing_acknowledged() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-5");
    let rounds: u64 = std::env::var("REPLAY_KILL_ROUNDS")
        .map(|v| v.parse().unwrap())
        .unwrap_or(50);
    let mut reader =
        cascade_replay::ReplayReader::open(root.path(), Default::default(), None).unwrap();
    let mut next_expected = 0u64;
    let check_batch = |reader: &mut cascade_replay::ReplayReader, next_expected: &mut u64| {
        for r in reader.poll(Duration::from_millis(1)).unwrap() {
            assert_eq!(r.seq, *next_expected, "duplicate or gap");
            check(5, &r);
            *next_expected += 1;
        }
    };
    let mut acked_total = 0u64;
    for round in 0..rounds {
        let mut child = spawn_child(
            "child_entry",
            &env("crash", &dir, 5, None, 64 << 10, 1 << 20),
        );
        let (acked, pump) = pump_acks(&mut child);
        // Kill at a pseudo-random moment 2–40 ms after start-up finished (first ACK).
        let t0 = Instant::now();
        while acked.load(Ordering::SeqCst) == u64::MAX && t0.elapsed() < Duration::from_secs(30) {
            check_batch(&mut reader, &mut next_expected);
        }
        let delay = Duration::from_micros(2000 + mix(round) % 38_000);
        let t1 = Instant::now();
        while t1.elapsed() < delay {
            check_batch(&mut reader, &mut next_expected);
        }
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
        child.wait().unwrap();
        pump.join().unwrap();
        let last_acked = acked.load(Ordering::SeqCst);
        assert_ne!(
            last_acked,
            u64::MAX,
            "round {round}: the child never appended"
        );
        acked_total = last_acked + 1;
        // Everything acknowledged before the kill must arrive.
        let t2 = Instant::now();
        while next_expected <= last_acked {
            assert!(
                t2.elapsed() < Duration::from_secs(30),
                "round {round}: seq {next_expected} acknowledged but never delivered"
            );
            check_batch(&mut reader, &mut next_expected);
        }
        reader.publish_consumed().unwrap();
    }
    assert!(
        reader.corruptions().is_empty(),
        "{:?}",
        reader.corruptions()
    );
    assert!(next_expected >= acked_total);
    let report = cascade_replay::inspect(root.path()).unwrap();
    assert!(
        !report.has_corruption(),
        "{:?}",
        report.actors[0].corruptions
    );
    eprintln!("{rounds} kills, {next_expected} records delivered");
}

/// A writer whose file-size limit forbids a second segment fails with a clear error when it
/// needs one, and everything it had acknowledged stays readable.
#[test]
fn full_disk_fails_clearly_and_keeps_committed_records() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-2");
    let mut child = spawn_child(
        "child_entry",
        &env("fulldisk", &dir, 2, None, 4096, 1 << 16),
    );
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut last_ack = None;
    let mut err = None;
    for line in out.lines() {
        let line = line.unwrap();
        if let Some(s) = line.strip_prefix("ACK ") {
            last_ack = Some(s.parse::<u64>().unwrap());
        } else if let Some(e) = line.strip_prefix("ERR ") {
            err = Some(e.to_string());
        }
    }
    assert!(child.wait().unwrap().success());
    let err = err.expect("the writer reported an error");
    assert!(err.starts_with("true "), "not a preallocation error: {err}");
    assert!(err.contains("disk full"), "{err}");
    let last_ack = last_ack.expect("some records were written");
    let (reader, got) = drain(root.path(), None);
    assert_eq!(got.len() as u64, last_ack + 1);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.seq, i as u64);
        check(2, r);
    }
    assert!(reader.corruptions().is_empty());
}
