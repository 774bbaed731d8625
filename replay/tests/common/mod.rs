//! Shared helpers for the replay integration tests: deterministic payloads that a reader in
//! another process can check byte for byte, and re-running this test binary as a child process.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use cascade_replay::{ReaderOptions, Record, ReplayReader, WriterOptions};

/// splitmix64.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Payload size for (actor, seq): log-uniform between `min` and `max` bytes.
pub fn payload_len(actor: u64, seq: u64, min: usize, max: usize) -> usize {
    let u = (mix(actor.wrapping_mul(1_000_003) ^ seq) >> 11) as f64 / (1u64 << 53) as f64;
    let (lo, hi) = ((min as f64).ln(), (max as f64).ln());
    ((lo + u * (hi - lo)).exp() as usize).clamp(min, max)
}

/// The payload of record `seq` of `actor`: unique per (actor, seq, len), cheap to regenerate.
pub fn payload(actor: u64, seq: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut word = mix(actor << 48 ^ seq);
    while out.len() < len {
        out.extend_from_slice(&word.to_le_bytes());
        word = word
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
    }
    out.truncate(len);
    out
}

/// Checks a delivered record against the generator (the payload's own length is trusted only
/// through the CRC the reader checked; the content must match exactly).
pub fn check(actor: u64, r: &Record) {
    let expected = payload(actor, r.seq, r.payload.len());
    assert!(
        *r.payload == expected[..],
        "actor {actor} seq {} payload differs",
        r.seq
    );
}

/// Actor index from a directory name `actor-N`.
pub fn actor_index(name: &str) -> u64 {
    name.strip_prefix("actor-")
        .and_then(|n| n.parse().ok())
        .expect("actor-N directory")
}

/// Small segments so tests roll, seal and delete often.
pub fn small_writer(segment_size: u64) -> WriterOptions {
    WriterOptions {
        segment_size,
        max_segments: 1 << 20,
        ..Default::default()
    }
}

/// Reads everything currently in `root` (stops after `idle` empty polls of 1 ms).
pub fn drain(root: &Path, cursors: Option<cascade_replay::Cursors>) -> (ReplayReader, Vec<Record>) {
    let mut reader = ReplayReader::open(root, ReaderOptions::default(), cursors).unwrap();
    let mut all = Vec::new();
    loop {
        let batch = reader.poll(std::time::Duration::from_millis(1)).unwrap();
        if batch.is_empty() {
            break;
        }
        all.extend(batch);
    }
    (reader, all)
}

/// Starts this test binary again, running only the ignored test `entry`, with `env` set.
pub fn spawn_child(entry: &str, env: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--ignored",
        "--exact",
        entry,
        "--nocapture",
        "--test-threads=1",
    ]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child test process")
}

/// Which segment indexes each segment file (inode) of an actor directory has carried, sampled
/// from time to time: an inode seen under two indexes is a recycled file.
#[derive(Debug, Default)]
pub struct Inodes {
    seen: std::collections::BTreeMap<u64, std::collections::BTreeSet<u64>>,
}

impl Inodes {
    /// Records the inode of every segment file now in `dir`.
    pub fn sample(&mut self, dir: &Path) {
        use std::os::unix::fs::MetadataExt;
        for (index, path) in cascade_replay::list_segments(dir).unwrap_or_default() {
            // A file may be recycled between listing and stat; then it is seen next time.
            if let Ok(meta) = std::fs::metadata(&path) {
                self.seen.entry(meta.ino()).or_default().insert(index);
            }
        }
    }

    /// Whether segment `index` of `dir` is a file seen before under an earlier index.
    pub fn is_recycled(&self, dir: &Path, index: u64) -> bool {
        use std::os::unix::fs::MetadataExt;
        let path = dir.join(cascade_replay::segment_file_name(index));
        std::fs::metadata(path).is_ok_and(|m| {
            self.seen
                .get(&m.ino())
                .is_some_and(|s| s.iter().any(|&i| i < index))
        })
    }

    /// Reuses seen: over all files, the segment indexes each carried beyond its first.
    pub fn reused(&self) -> usize {
        self.seen.values().map(|s| s.len() - 1).sum()
    }
}

/// Reads a writer child's stdout on a thread: the latest `ACK <seq>` line's seq (the last
/// record whose `append` returned), `u64::MAX` until the first one.
pub fn pump_acks(child: &mut Child) -> (Arc<AtomicU64>, JoinHandle<()>) {
    let acked = Arc::new(AtomicU64::new(u64::MAX));
    let stdout = child.stdout.take().expect("child stdout is piped");
    let acked2 = acked.clone();
    let pump = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(seq) = line.strip_prefix("ACK ") {
                acked2.store(seq.parse().unwrap(), Ordering::SeqCst);
            }
        }
    });
    (acked, pump)
}
