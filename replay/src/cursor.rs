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

#[cfg(test)]
mod tests {
    use super::*;

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
