//! Reader positions and the consumed-position files the learner publishes for the writers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{IoContext, ReplayError, Result};
use crate::segment::write_atomically;

/// Where a reader is in one actor's log: the next record it will read is at `offset` of
/// segment `segment` and has seq `next_seq` (or a larger one if something was skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// Segment index.
    pub segment: u64,
    /// Byte offset in the segment file.
    pub offset: u64,
    /// Seq of the next record.
    pub next_seq: u64,
}

/// Cursors of every actor, keyed by actor directory name. The learner stores this value in
/// its snapshots and reopens the reader with it: no duplicate and no loss.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursors {
    /// Actor directory name → position.
    pub actors: BTreeMap<String, Cursor>,
}

/// Directory, inside an actor directory, holding one consumed-position file per consumer.
pub const CONSUMED_DIR: &str = "consumed";

fn consumed_path(actor_dir: &Path, consumer: &str) -> PathBuf {
    actor_dir
        .join(CONSUMED_DIR)
        .join(format!("{consumer}.json"))
}

/// Atomically replaces `consumer`'s consumed position in `actor_dir` (tmp + fsync + rename).
pub fn write_consumed(actor_dir: &Path, consumer: &str, cursor: &Cursor) -> Result<()> {
    let dir = actor_dir.join(CONSUMED_DIR);
    std::fs::create_dir_all(&dir).at(&dir)?;
    let json = serde_json::to_vec(cursor).expect("a cursor serialises");
    write_atomically(&consumed_path(actor_dir, consumer), &json)
}

/// The smallest `next_seq` over all consumers of `actor_dir`, or `None` when no consumer has
/// published yet. Retention and backpressure both follow the slowest consumer.
pub fn read_min_consumed(actor_dir: &Path) -> Result<Option<u64>> {
    let dir = actor_dir.join(CONSUMED_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).at(&dir),
    };
    let mut min: Option<u64> = None;
    for entry in entries {
        let path = entry.at(&dir)?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            // Replaced between readdir and open: the new file is seen next time.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).at(&path),
        };
        let cursor: Cursor =
            serde_json::from_slice(&bytes).map_err(|e| ReplayError::ConsumedFile {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        min = Some(min.map_or(cursor.next_seq, |m| m.min(cursor.next_seq)));
    }
    Ok(min)
}

/// Extension of a consumer's progress file (`consumed/<consumer>.progress`).
pub const PROGRESS_EXT: &str = "progress";

/// Atomically replaces `consumer`'s *progress* in `actor_dir`: how far it has read and decided,
/// possibly past what it may lose in a crash (its consumed position). Backpressure follows
/// progress; retention follows the consumed position only, so a consumer that buffers records
/// it has not made durable yet (the learner between snapshots) neither blocks the writers nor
/// lets retention delete what it would re-read after a crash.
pub fn write_progress(actor_dir: &Path, consumer: &str, cursor: &Cursor) -> Result<()> {
    let dir = actor_dir.join(CONSUMED_DIR);
    std::fs::create_dir_all(&dir).at(&dir)?;
    let json = serde_json::to_vec(cursor).expect("a cursor serialises");
    write_atomically(&dir.join(format!("{consumer}.{PROGRESS_EXT}")), &json)
}

/// The position backpressure waits for: over all consumers (with a consumed file, a progress
/// file or both), the smallest of `max(consumed, progress)`. `None` when no consumer has
/// published yet.
pub fn read_min_progress(actor_dir: &Path) -> Result<Option<u64>> {
    let dir = actor_dir.join(CONSUMED_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).at(&dir),
    };
    let read = |path: &Path| -> Result<Option<u64>> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice::<Cursor>(&bytes)
                .map(|c| Some(c.next_seq))
                .map_err(|e| ReplayError::ConsumedFile {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).at(path),
        }
    };
    // Every consumer with a consumed file, a progress file, or both.
    let mut consumers = std::collections::BTreeSet::new();
    for entry in entries {
        let path = entry.at(&dir)?.path();
        let ext = path.extension().and_then(|e| e.to_str());
        if ext == Some("json") || ext == Some(PROGRESS_EXT) {
            consumers.insert(path.with_extension(""));
        }
    }
    let mut min: Option<u64> = None;
    for base in consumers {
        let consumed = read(&base.with_extension("json"))?;
        let progress = read(&base.with_extension(PROGRESS_EXT))?;
        let Some(pos) = consumed.max(progress) else {
            continue;
        };
        min = Some(min.map_or(pos, |m| m.min(pos)));
    }
    Ok(min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_moves_backpressure_but_not_retention() {
        let dir = tempfile::tempdir().unwrap();
        let at = |n| Cursor {
            segment: 0,
            offset: 64,
            next_seq: n,
        };
        // Progress alone (nothing committed yet) counts.
        write_progress(dir.path(), "learner", &at(3)).unwrap();
        assert_eq!(read_min_progress(dir.path()).unwrap(), Some(3));
        assert_eq!(read_min_consumed(dir.path()).unwrap(), None);
        write_consumed(dir.path(), "learner", &at(5)).unwrap();
        assert_eq!(read_min_progress(dir.path()).unwrap(), Some(5));
        write_progress(dir.path(), "learner", &at(9)).unwrap();
        assert_eq!(read_min_consumed(dir.path()).unwrap(), Some(5));
        assert_eq!(read_min_progress(dir.path()).unwrap(), Some(9));
        // A newer consumed position wins over an older progress.
        write_consumed(dir.path(), "learner", &at(12)).unwrap();
        assert_eq!(read_min_progress(dir.path()).unwrap(), Some(12));
        // The slowest consumer decides.
        write_consumed(dir.path(), "eval", &at(7)).unwrap();
        assert_eq!(read_min_progress(dir.path()).unwrap(), Some(7));
    }

    #[test]
    fn consumed_is_the_minimum_over_consumers() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_min_consumed(dir.path()).unwrap(), None);
        write_consumed(
            dir.path(),
            "learner",
            &Cursor {
                segment: 1,
                offset: 64,
                next_seq: 10,
            },
        )
        .unwrap();
        write_consumed(
            dir.path(),
            "eval",
            &Cursor {
                segment: 0,
                offset: 64,
                next_seq: 4,
            },
        )
        .unwrap();
        assert_eq!(read_min_consumed(dir.path()).unwrap(), Some(4));
        write_consumed(
            dir.path(),
            "eval",
            &Cursor {
                segment: 2,
                offset: 64,
                next_seq: 12,
            },
        )
        .unwrap();
        assert_eq!(read_min_consumed(dir.path()).unwrap(), Some(10));
    }

    #[test]
    fn cursors_serialise() {
        let mut c = Cursors::default();
        c.actors.insert(
            "actor-0".into(),
            Cursor {
                segment: 3,
                offset: 128,
                next_seq: 77,
            },
        );
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<Cursors>(&json).unwrap(), c);
    }
}
