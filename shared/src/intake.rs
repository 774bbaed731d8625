//! The learner's "batch full" signal to the actors.
//!
//! Strictly on-policy (staleness bound 0), the learner trains version `v`'s step on the first
//! groups of version `v` it admits; every group of `v` that reaches it later is dropped as
//! stale, because by then it trains `v + 1`. Without a signal the actors go on generating (and
//! scoring: sandboxed code runs, reward-model passes) `v`'s prompts for the whole of the
//! learner's step and its publication. The tiny default's on-policy run generated 3 006 such
//! groups against 2 688 trained (configs/tiny.toml), and on a shared machine the work
//! competed with the step itself.
//!
//! Rank 0 of the learner writes `RUN_DIR/replay/closed` (the version, as text) once a batch
//! is decided after which it wants no group of that version or an older one: strictly
//! on-policy every step's, in any mode a stage's last (the groups of a finished stage are
//! dropped as another stage's; the tiny default's async runs dropped about 110 a run). An actor
//! whose weights are that version or older pauses (no decode step, no new prompt) until the
//! next snapshot. Before it waits for the groups of a version, the learner removes a marker
//! that would stop them (a resumed learner, a skipped step, a crash between the two). The file
//! is advisory: a missing or unreadable marker only means the actors keep generating groups the
//! learner drops, as they did before it existed.

use std::io;
use std::path::{Path, PathBuf};

use crate::snapshot::durable::replace_file;

/// Name of the marker in the replay root.
pub const CLOSED_FILE: &str = "closed";

fn path(replay_dir: &Path) -> PathBuf {
    replay_dir.join(CLOSED_FILE)
}

/// The version whose batch the learner has closed, if the marker is up (`None` when absent or
/// not a number).
pub fn closed(replay_dir: &Path) -> Option<u64> {
    std::fs::read_to_string(path(replay_dir))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Says that the batch of `version` is decided: the learner needs no more of its groups.
/// Written atomically, like the actors' snapshot acknowledgements.
pub fn close(replay_dir: &Path, version: u64) -> crate::snapshot::Result<()> {
    std::fs::create_dir_all(replay_dir)
        .map_err(|e| crate::snapshot::SnapshotError::io(replay_dir, e))?;
    replace_file(&path(replay_dir), format!("{version}\n").as_bytes())
}

/// Before waiting for groups of `version`: removes a marker that closes it (one of `version`
/// or later, or one that cannot be read). Returns whether one was removed.
pub fn reopen(replay_dir: &Path, version: u64) -> io::Result<bool> {
    let p = path(replay_dir);
    match std::fs::read_to_string(&p) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Ok(text) if text.trim().parse::<u64>().is_ok_and(|c| c < version) => return Ok(false),
        _ => {}
    }
    match std::fs::remove_file(&p) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether an actor running weights of `version` should pause: the marker closes that version
/// (or a later one).
pub fn stops(replay_dir: &Path, version: u64) -> bool {
    closed(replay_dir).is_some_and(|c| c >= version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_stops_that_version_and_older_and_reopen_clears_it() {
        let dir = tempfile::tempdir().unwrap();
        let replay = dir.path().join("replay");
        assert_eq!(closed(&replay), None);
        assert!(!stops(&replay, 0));
        close(&replay, 7).unwrap();
        assert_eq!(closed(&replay), Some(7));
        assert!(stops(&replay, 7) && stops(&replay, 6));
        assert!(!stops(&replay, 8), "the next version's groups are wanted");
        // Waiting for version 8's groups: a marker of 7 stops nobody who matters, it stays.
        assert!(!reopen(&replay, 8).unwrap());
        assert_eq!(closed(&replay), Some(7));
        // A resumed learner waiting for version 5's groups again: the marker goes.
        assert!(reopen(&replay, 5).unwrap());
        assert_eq!(closed(&replay), None);
        assert!(!reopen(&replay, 5).unwrap());
        // No temporary file is left behind.
        let left: Vec<_> = std::fs::read_dir(&replay).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn an_unreadable_marker_stops_nobody_and_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CLOSED_FILE), "not a version").unwrap();
        assert_eq!(closed(dir.path()), None);
        assert!(!stops(dir.path(), 0));
        assert!(reopen(dir.path(), 3).unwrap());
        assert!(!dir.path().join(CLOSED_FILE).exists());
    }
}
