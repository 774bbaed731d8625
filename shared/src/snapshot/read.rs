//! Reading `snapshots/`: which version is newest, whether a directory is complete and intact,
//! and its state and weights. Readers never write here (acknowledgements aside, see
//! [`super::acks`]).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use super::durable::digest_file;
use super::error::{Result, SnapshotError};
use super::layout::{
    parse_version_dir, Manifest, ManifestEntry, COMPLETE_FILE, LATEST_FILE, MANIFEST_FILE,
    MANIFEST_FORMAT, MODEL_FILE, REQUIRED_FILES, STATE_FILE,
};
use super::state::{LearnerState, STATE_FORMAT_VERSION};
use super::tensors::read_safetensors;

/// A complete snapshot on disk.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotInfo {
    /// Its policy version.
    pub version: u64,
    /// Its directory.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
}

/// A loaded snapshot's state (weights are read with [`load_model`]).
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedSnapshot {
    /// Where it is and what it holds.
    pub info: SnapshotInfo,
    /// `state.json`.
    pub state: LearnerState,
}

/// The version `LATEST` names, if the file exists and parses.
pub fn read_latest(snapshots_dir: &Path) -> Option<u64> {
    fs::read_to_string(snapshots_dir.join(LATEST_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Checks that `dir` is a complete snapshot: marker, manifest and every file's size and CRC.
pub fn verify(dir: &Path) -> Result<SnapshotInfo> {
    let info = peek_manifest(dir)?;
    for (file, entry) in &info.manifest.files {
        let actual = digest_file(&dir.join(file))?;
        if ManifestEntry::from(actual) != *entry {
            return Err(SnapshotError::corrupt(
                dir,
                format!(
                    "{file}: {} bytes crc32c {:08x}, manifest says {} bytes {:08x}",
                    actual.bytes, actual.crc32c, entry.bytes, entry.crc32c
                ),
            ));
        }
    }
    Ok(info)
}

/// The part of [`verify`] that reads no weights: the marker, the manifest (its checksum, format
/// and version) and the required files' names. Cheap for a poll that only asks what a snapshot
/// is; verify it before using its files.
pub fn peek_manifest(dir: &Path) -> Result<SnapshotInfo> {
    let corrupt = |reason: String| SnapshotError::corrupt(dir, reason);
    let version = dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_version_dir)
        .ok_or_else(|| corrupt("not a vNNNNNN directory".into()))?;
    let marker_path = dir.join(COMPLETE_FILE);
    let marker = fs::read_to_string(&marker_path)
        .map_err(|_| corrupt(format!("no {COMPLETE_FILE} marker")))?;
    let manifest_path = dir.join(MANIFEST_FILE);
    let manifest_bytes =
        fs::read(&manifest_path).map_err(|e| SnapshotError::io(&manifest_path, e))?;
    if format!("{:08x}", crc32c::crc32c(&manifest_bytes)) != marker.trim() {
        return Err(corrupt(format!(
            "{MANIFEST_FILE} does not match {COMPLETE_FILE}"
        )));
    }
    let manifest: Manifest = serde_json::from_slice(&manifest_bytes)
        .map_err(|e| SnapshotError::json(&manifest_path, e))?;
    if manifest.format != MANIFEST_FORMAT || manifest.version != version {
        return Err(corrupt(format!(
            "manifest format {} version {} in directory of version {version}",
            manifest.format, manifest.version
        )));
    }
    for required in REQUIRED_FILES {
        if !manifest.files.contains_key(required) {
            return Err(corrupt(format!("manifest lacks {required}")));
        }
    }
    Ok(SnapshotInfo {
        version,
        dir: dir.to_path_buf(),
        manifest,
    })
}

/// Published version directories (by name; not verified), newest first.
pub fn list_versions(snapshots_dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let entries = match fs::read_dir(snapshots_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(SnapshotError::io(snapshots_dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| SnapshotError::io(snapshots_dir, e))?;
        if let Some(v) = entry.file_name().to_str().and_then(parse_version_dir) {
            if entry.path().is_dir() {
                out.push((v, entry.path()));
            }
        }
    }
    out.sort_by_key(|e| std::cmp::Reverse(e.0));
    Ok(out)
}

/// Parses a `state.json`, refusing another state format.
fn parse_state(dir: &Path, bytes: &[u8]) -> Result<LearnerState> {
    let path = dir.join(STATE_FILE);
    let state: LearnerState =
        serde_json::from_slice(bytes).map_err(|e| SnapshotError::json(&path, e))?;
    if state.format_version != STATE_FORMAT_VERSION {
        return Err(SnapshotError::corrupt(
            dir,
            format!(
                "state format {} (this build reads {STATE_FORMAT_VERSION})",
                state.format_version
            ),
        ));
    }
    Ok(state)
}

/// Verifies and loads `state.json` of the snapshot in `dir`.
pub fn load_snapshot(dir: &Path) -> Result<LoadedSnapshot> {
    let info = verify(dir)?;
    with_state(info)
}

/// [`load_snapshot`] without the files' checksums ([`peek_manifest`]): what a snapshot is and
/// where its stage stands, for a scan over many snapshots. `state.json` is parsed, not checked
/// against the manifest.
pub fn peek_snapshot(dir: &Path) -> Result<LoadedSnapshot> {
    with_state(peek_manifest(dir)?)
}

fn with_state(info: SnapshotInfo) -> Result<LoadedSnapshot> {
    let path = info.dir.join(STATE_FILE);
    let bytes = fs::read(&path).map_err(|e| SnapshotError::io(&path, e))?;
    let state = parse_state(&info.dir, &bytes)?;
    Ok(LoadedSnapshot { info, state })
}

/// The state of the snapshot `LATEST` names, without verifying its checksums (cheap: for a
/// poll that only needs the stage pointer; load the snapshot with [`load_snapshot`] before
/// using its weights). `None` when there is no `LATEST` or its state does not read.
pub fn peek_latest_state(snapshots_dir: &Path) -> Option<(u64, LearnerState)> {
    let version = read_latest(snapshots_dir)?;
    let dir = snapshots_dir.join(super::layout::version_dir_name(version));
    let bytes = fs::read(dir.join(STATE_FILE)).ok()?;
    parse_state(&dir, &bytes).ok().map(|s| (version, s))
}

/// The snapshot's weights, by HF name.
pub fn load_model(dir: &Path, device: &Device) -> Result<BTreeMap<String, Tensor>> {
    read_safetensors(&dir.join(MODEL_FILE), device)
}
