//! Atomic, checksummed snapshots: `snapshots/vNNNNNN/` directories that load in Hugging Face
//! transformers as they are, plus the optimizer and learner state for an exact resume.
//!
//! Publishing ([`publish`]) writes everything into `vNNNNNN.tmp/`, fsyncing each file as it is
//! closed: `model.safetensors`, `optimizer.safetensors`, `state.json`, `config.json`,
//! `tokenizer.json`, then `manifest.json` (size and CRC-32C of each of those files), then the
//! completion marker `COMPLETE` (the CRC-32C of `manifest.json`). The directory is fsynced,
//! renamed to `vNNNNNN/`, the parent fsynced, and `LATEST` (the version in decimal) is replaced
//! by writing `LATEST.tmp` and renaming it. A crash at any point leaves either a `*.tmp` entry,
//! which [`latest_complete`] removes, or a complete snapshot.
//!
//! Retention ([`retain`]) keeps the newest `keep_last` snapshots, every stage-final snapshot,
//! the one `LATEST` names and every version an actor acknowledges in `snapshots/acks/actor-I`
//! (a file holding the version the actor loaded; actors must write it *before* reading the
//! snapshot). A snapshot is deleted by renaming it to `vNNNNNN.del.tmp` first, so a crash
//! mid-delete never leaves a half-deleted directory under a valid name.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use candle_nn::VarMap;
use serde::{Deserialize, Serialize};

use crate::error::{LearnerError, Result};
use crate::optim::AdamW;
use crate::state::{LearnerState, STATE_FORMAT_VERSION};
use crate::tensor_io::{read_safetensors, write_safetensors, DigestWriter, FileDigest};

/// Model weights, HF tensor names.
pub const MODEL_FILE: &str = "model.safetensors";
/// Optimizer moments and counters.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// [`LearnerState`] as JSON.
pub const STATE_FILE: &str = "state.json";
/// The HF model config.
pub const CONFIG_FILE: &str = "config.json";
/// The HF tokenizer.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// Size and checksum of every file above.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Written last: the snapshot is complete.
pub const COMPLETE_FILE: &str = "COMPLETE";
/// The newest published version.
pub const LATEST_FILE: &str = "LATEST";
/// Directory of actor acknowledgements.
pub const ACKS_DIR: &str = "acks";

/// Version of the manifest layout.
const MANIFEST_FORMAT: u32 = 1;

/// Size and checksum of one file of a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Length in bytes.
    pub bytes: u64,
    /// CRC-32C of the contents.
    pub crc32c: u32,
}

impl From<FileDigest> for ManifestEntry {
    fn from(d: FileDigest) -> Self {
        ManifestEntry {
            bytes: d.bytes,
            crc32c: d.crc32c,
        }
    }
}

/// `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Manifest layout version.
    pub format: u32,
    /// The snapshot's policy version.
    pub version: u64,
    /// The last snapshot of a stage (kept by retention).
    pub stage_final: bool,
    /// File name → size and checksum.
    pub files: BTreeMap<String, ManifestEntry>,
}

/// What goes into a snapshot.
pub struct SnapshotInput<'a> {
    /// Weights, named as in the HF checkpoint (any device and dtype).
    pub model: &'a [(String, Tensor)],
    /// The optimizer (its moments and counters are saved).
    pub optimizer: &'a AdamW,
    /// Learner state.
    pub state: &'a LearnerState,
    /// The HF `config.json` bytes.
    pub config_json: &'a [u8],
    /// The HF `tokenizer.json` bytes.
    pub tokenizer_json: &'a [u8],
    /// More files to include (e.g. `tokenizer_config.json` with the chat template), by name;
    /// checksummed in the manifest like the others.
    pub extra_files: &'a [(&'a str, &'a [u8])],
    /// Whether this is the last snapshot of its stage.
    pub stage_final: bool,
}

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

/// A loaded snapshot's state (weights are read with [`load_model`] / [`restore_varmap`]).
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedSnapshot {
    /// Where it is and what it holds.
    pub info: SnapshotInfo,
    /// `state.json`.
    pub state: LearnerState,
}

/// `vNNNNNN`: six digits, more when the version needs them.
pub fn version_dir_name(version: u64) -> String {
    format!("v{version:06}")
}

/// Parses a complete snapshot's directory name (`v` + digits, nothing else).
fn parse_version_dir(name: &str) -> Option<u64> {
    let digits = name.strip_prefix('v')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| LearnerError::io(dir, e))
}

/// Writes `bytes` to `path`, fsyncs, and returns size and checksum.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<FileDigest> {
    let io = |e| LearnerError::io(path, e);
    let mut out = DigestWriter::new(File::create(path).map_err(io)?);
    out.write_all(bytes).map_err(io)?;
    let digest = out.digest();
    out.into_inner().sync_all().map_err(io)?;
    Ok(digest)
}

/// Size and CRC-32C of a file on disk, read in 1 MiB chunks.
fn digest_file(path: &Path) -> Result<FileDigest> {
    let io = |e| LearnerError::io(path, e);
    let mut file = File::open(path).map_err(io)?;
    let mut sink = DigestWriter::new(std::io::sink());
    std::io::copy(&mut file, &mut sink).map_err(io)?;
    Ok(sink.digest())
}

/// Publishes snapshot `version` under `snapshots_dir` (created if missing) and points `LATEST`
/// at it. Refuses to overwrite an existing `vNNNNNN/`: a published snapshot is never rewritten.
pub fn publish(snapshots_dir: &Path, version: u64, input: &SnapshotInput) -> Result<SnapshotInfo> {
    fs::create_dir_all(snapshots_dir).map_err(|e| LearnerError::io(snapshots_dir, e))?;
    let name = version_dir_name(version);
    let final_dir = snapshots_dir.join(&name);
    if final_dir.exists() {
        return Err(LearnerError::CorruptSnapshot {
            path: final_dir,
            reason: "already exists; a published snapshot is never rewritten".into(),
        });
    }
    let tmp_dir = snapshots_dir.join(format!("{name}.tmp"));
    if tmp_dir.exists() {
        fs::remove_dir_all(&tmp_dir).map_err(|e| LearnerError::io(&tmp_dir, e))?;
    }
    fs::create_dir(&tmp_dir).map_err(|e| LearnerError::io(&tmp_dir, e))?;

    // 1. The payload files, each fsynced as it is closed.
    let mut files = BTreeMap::new();
    let digest = write_safetensors(&tmp_dir.join(MODEL_FILE), input.model, &BTreeMap::new())?;
    files.insert(MODEL_FILE.to_string(), digest.into());
    let digest = input.optimizer.save(&tmp_dir.join(OPTIMIZER_FILE))?;
    files.insert(OPTIMIZER_FILE.to_string(), digest.into());
    let state_path = tmp_dir.join(STATE_FILE);
    let state_json =
        serde_json::to_vec_pretty(input.state).map_err(|e| LearnerError::json(&state_path, e))?;
    for (file, bytes) in [
        (STATE_FILE, state_json.as_slice()),
        (CONFIG_FILE, input.config_json),
        (TOKENIZER_FILE, input.tokenizer_json),
    ] {
        let digest = write_synced(&tmp_dir.join(file), bytes)?;
        files.insert(file.to_string(), digest.into());
    }
    for (file, bytes) in input.extra_files {
        if file.contains('/') || files.contains_key(*file) || *file == MANIFEST_FILE {
            return Err(LearnerError::InvalidConfig(format!(
                "snapshot extra file name {file:?} is not a fresh plain file name"
            )));
        }
        let digest = write_synced(&tmp_dir.join(file), bytes)?;
        files.insert(file.to_string(), digest.into());
    }

    // 2. Manifest, then the completion marker.
    let manifest = Manifest {
        format: MANIFEST_FORMAT,
        version,
        stage_final: input.stage_final,
        files,
    };
    let manifest_path = tmp_dir.join(MANIFEST_FILE);
    let manifest_json =
        serde_json::to_vec_pretty(&manifest).map_err(|e| LearnerError::json(&manifest_path, e))?;
    let manifest_digest = write_synced(&manifest_path, &manifest_json)?;
    write_synced(
        &tmp_dir.join(COMPLETE_FILE),
        format!("{:08x}\n", manifest_digest.crc32c).as_bytes(),
    )?;
    fsync_dir(&tmp_dir)?;

    // 3. Make it visible, then point LATEST at it.
    fs::rename(&tmp_dir, &final_dir).map_err(|e| LearnerError::io(&final_dir, e))?;
    fsync_dir(snapshots_dir)?;
    write_latest(snapshots_dir, version)?;
    Ok(SnapshotInfo {
        version,
        dir: final_dir,
        manifest,
    })
}

/// Replaces `LATEST` atomically (tmp + fsync + rename + fsync of the directory).
fn write_latest(snapshots_dir: &Path, version: u64) -> Result<()> {
    let tmp = snapshots_dir.join(format!("{LATEST_FILE}.tmp"));
    write_synced(&tmp, format!("{version}\n").as_bytes())?;
    let latest = snapshots_dir.join(LATEST_FILE);
    fs::rename(&tmp, &latest).map_err(|e| LearnerError::io(&latest, e))?;
    fsync_dir(snapshots_dir)
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
    let corrupt = |reason: String| LearnerError::CorruptSnapshot {
        path: dir.to_path_buf(),
        reason,
    };
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
        fs::read(&manifest_path).map_err(|e| LearnerError::io(&manifest_path, e))?;
    if format!("{:08x}", crc32c::crc32c(&manifest_bytes)) != marker.trim() {
        return Err(corrupt(format!(
            "{MANIFEST_FILE} does not match {COMPLETE_FILE}"
        )));
    }
    let manifest: Manifest = serde_json::from_slice(&manifest_bytes)
        .map_err(|e| LearnerError::json(&manifest_path, e))?;
    if manifest.format != MANIFEST_FORMAT || manifest.version != version {
        return Err(corrupt(format!(
            "manifest format {} version {} in directory of version {version}",
            manifest.format, manifest.version
        )));
    }
    for required in [
        MODEL_FILE,
        OPTIMIZER_FILE,
        STATE_FILE,
        CONFIG_FILE,
        TOKENIZER_FILE,
    ] {
        if !manifest.files.contains_key(required) {
            return Err(corrupt(format!("manifest lacks {required}")));
        }
    }
    for (file, entry) in &manifest.files {
        let actual = digest_file(&dir.join(file))?;
        if ManifestEntry::from(actual) != *entry {
            return Err(corrupt(format!(
                "{file}: {} bytes crc32c {:08x}, manifest says {} bytes {:08x}",
                actual.bytes, actual.crc32c, entry.bytes, entry.crc32c
            )));
        }
    }
    Ok(SnapshotInfo {
        version,
        dir: dir.to_path_buf(),
        manifest,
    })
}

/// Published version directories, newest first.
fn list_versions(snapshots_dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let entries = match fs::read_dir(snapshots_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(LearnerError::io(snapshots_dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| LearnerError::io(snapshots_dir, e))?;
        if let Some(v) = entry.file_name().to_str().and_then(parse_version_dir) {
            if entry.path().is_dir() {
                out.push((v, entry.path()));
            }
        }
    }
    out.sort_by_key(|e| std::cmp::Reverse(e.0));
    Ok(out)
}

/// Removes every `*.tmp` entry (interrupted publishes and deletions, a stale `LATEST.tmp`).
/// Only the learner — the single writer of `snapshots/` — may call this.
fn clean_tmp(snapshots_dir: &Path) -> Result<()> {
    let entries = match fs::read_dir(snapshots_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(LearnerError::io(snapshots_dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| LearnerError::io(snapshots_dir, e))?;
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) == Some("tmp") {
            tracing::info!(path = %path.display(), "removing interrupted snapshot write");
            let removed = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            removed.map_err(|e| LearnerError::io(&path, e))?;
        }
    }
    Ok(())
}

/// The newest complete, checksum-valid snapshot under `snapshots_dir`, for a resuming learner:
/// removes `*.tmp` leftovers, skips (and logs) corrupt snapshots, and repoints `LATEST` at the
/// result if a crash left it behind. `Ok(None)` when there is none.
pub fn latest_complete(snapshots_dir: &Path) -> Result<Option<SnapshotInfo>> {
    clean_tmp(snapshots_dir)?;
    for (version, dir) in list_versions(snapshots_dir)? {
        match verify(&dir) {
            Ok(info) => {
                if read_latest(snapshots_dir) != Some(version) {
                    write_latest(snapshots_dir, version)?;
                }
                return Ok(Some(info));
            }
            Err(e) => tracing::warn!("skipping snapshot {}: {e}", dir.display()),
        }
    }
    Ok(None)
}

/// Verifies and loads `state.json` of the snapshot in `dir`.
pub fn load_snapshot(dir: &Path) -> Result<LoadedSnapshot> {
    let info = verify(dir)?;
    let path = dir.join(STATE_FILE);
    let bytes = fs::read(&path).map_err(|e| LearnerError::io(&path, e))?;
    let state: LearnerState =
        serde_json::from_slice(&bytes).map_err(|e| LearnerError::json(&path, e))?;
    if state.format_version != STATE_FORMAT_VERSION {
        return Err(LearnerError::CorruptSnapshot {
            path: dir.to_path_buf(),
            reason: format!(
                "state format {} (this build reads {STATE_FORMAT_VERSION})",
                state.format_version
            ),
        });
    }
    Ok(LoadedSnapshot { info, state })
}

/// The snapshot's weights, by HF name.
pub fn load_model(dir: &Path, device: &Device) -> Result<BTreeMap<String, Tensor>> {
    read_safetensors(&dir.join(MODEL_FILE), device)
}

/// Copies the snapshot's weights into every variable of `varmap` (cast to the variable's dtype).
/// Every variable must be present in the file with its shape.
pub fn restore_varmap(varmap: &VarMap, dir: &Path) -> Result<()> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| LearnerError::InvalidConfig("VarMap lock poisoned".into()))?;
    let device = data
        .values()
        .next()
        .map(|v| v.device().clone())
        .unwrap_or(Device::Cpu);
    let tensors = load_model(dir, &device)?;
    for (name, var) in data.iter() {
        let t = tensors
            .get(name)
            .ok_or_else(|| LearnerError::CorruptSnapshot {
                path: dir.join(MODEL_FILE),
                reason: format!("no tensor {name}"),
            })?;
        if t.dims() != var.dims() {
            return Err(LearnerError::CorruptSnapshot {
                path: dir.join(MODEL_FILE),
                reason: format!("{name} is {:?}, the model wants {:?}", t.dims(), var.dims()),
            });
        }
        var.set(&t.to_dtype(var.dtype())?)?;
    }
    Ok(())
}

/// Versions acknowledged by actors (`acks/actor-*` files holding a version); unreadable files
/// are logged and ignored.
pub fn acknowledged_versions(snapshots_dir: &Path) -> Result<BTreeSet<u64>> {
    let dir = snapshots_dir.join(ACKS_DIR);
    let mut out = BTreeSet::new();
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(LearnerError::io(&dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| LearnerError::io(&dir, e))?;
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

/// Deletes old snapshots: keeps the newest `keep_last` (at least 1), every stage-final one, the
/// one `LATEST` names and every actor-acknowledged one. Returns the deleted versions.
pub fn retain(snapshots_dir: &Path, keep_last: usize) -> Result<Vec<u64>> {
    let versions = list_versions(snapshots_dir)?;
    let acked = acknowledged_versions(snapshots_dir)?;
    let latest = read_latest(snapshots_dir);
    let mut deleted = Vec::new();
    for (rank, (version, dir)) in versions.into_iter().enumerate() {
        if rank < keep_last.max(1) || acked.contains(&version) || latest == Some(version) {
            continue;
        }
        let manifest_path = dir.join(MANIFEST_FILE);
        let stage_final = fs::read(&manifest_path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Manifest>(&b).ok())
            .is_some_and(|m| m.stage_final);
        if stage_final {
            continue;
        }
        let doomed = snapshots_dir.join(format!("{}.del.tmp", version_dir_name(version)));
        fs::rename(&dir, &doomed).map_err(|e| LearnerError::io(&dir, e))?;
        fs::remove_dir_all(&doomed).map_err(|e| LearnerError::io(&doomed, e))?;
        deleted.push(version);
    }
    if !deleted.is_empty() {
        fsync_dir(snapshots_dir)?;
    }
    Ok(deleted)
}
