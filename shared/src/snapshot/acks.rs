//! Actor acknowledgements: `snapshots/acks/actor-I` holds the version actor I uses (written
//! *before* the actor reads the snapshot), so the learner's retention never deletes a snapshot
//! an actor may have mapped.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use super::durable::replace_file;
use super::error::{Result, SnapshotError};
use super::layout::{ack_file_name, ACKS_DIR};

fn ack_path(snapshots_dir: &Path, actor_id: u32) -> PathBuf {
    snapshots_dir.join(ACKS_DIR).join(ack_file_name(actor_id))
}

/// Writes `acks/actor-I` atomically (tmp file + rename).
pub fn write_ack(snapshots_dir: &Path, actor_id: u32, version: u64) -> Result<()> {
    let dir = snapshots_dir.join(ACKS_DIR);
    fs::create_dir_all(&dir).map_err(|e| SnapshotError::io(&dir, e))?;
    replace_file(
        &ack_path(snapshots_dir, actor_id),
        format!("{version}\n").as_bytes(),
    )
}

/// Removes actor I's acknowledgement (it uses no snapshot).
pub fn remove_ack(snapshots_dir: &Path, actor_id: u32) -> Result<()> {
    let path = ack_path(snapshots_dir, actor_id);
    match fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(SnapshotError::io(&path, e)),
        _ => Ok(()),
    }
}

/// Versions acknowledged by actors (`acks/actor-*` files holding a version); unreadable files
/// are logged and ignored.
pub fn acknowledged_versions(snapshots_dir: &Path) -> Result<BTreeSet<u64>> {
    let dir = snapshots_dir.join(ACKS_DIR);
    let mut out = BTreeSet::new();
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(SnapshotError::io(&dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| SnapshotError::io(&dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with("actor-") || name.ends_with(".tmp") {
            continue;
        }
        match fs::read_to_string(entry.path()).map(|s| s.trim().parse::<u64>()) {
            Ok(Ok(v)) => {
                out.insert(v);
            }
            _ => tracing::warn!(path = %entry.path().display(), "unreadable actor ack ignored"),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_are_written_read_and_removed() {
        let root = tempfile::tempdir().unwrap();
        write_ack(root.path(), 0, 3).unwrap();
        write_ack(root.path(), 1, 5).unwrap();
        write_ack(root.path(), 1, 6).unwrap();
        fs::write(root.path().join(ACKS_DIR).join("actor-9"), "garbage").unwrap();
        assert_eq!(
            acknowledged_versions(root.path()).unwrap(),
            BTreeSet::from([3, 6])
        );
        remove_ack(root.path(), 0).unwrap();
        remove_ack(root.path(), 0).unwrap();
        assert_eq!(
            acknowledged_versions(root.path()).unwrap(),
            BTreeSet::from([6])
        );
    }
}
