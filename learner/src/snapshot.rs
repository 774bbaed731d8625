//! The writing side of the snapshot format ([`cascade_shared::snapshot`], which holds the
//! layout, the manifest, verification and everything readers use): publishing, start-up
//! clean-up and retention. The learner is the single writer of `snapshots/`.
//!
//! Publishing ([`publish`]) writes everything into `vNNNNNN.tmp/`, fsyncing each file as it is
//! closed: `model.safetensors`, `optimizer.safetensors` (left out at a stage's step 0, where the
//! next step starts a fresh optimizer), `state.json`, `config.json`,
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

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use candle_core::{Device, Tensor};
use candle_nn::VarMap;
use cascade_shared::snapshot::durable::{fsync_dir, replace_file, AtomicDir, FileDigest};
use cascade_shared::snapshot::layout::MANIFEST_FORMAT;
use cascade_shared::snapshot::tensors::write_safetensors;
use cascade_shared::snapshot::{
    acknowledged_versions, list_versions, load_model, read_latest, verify, version_dir_name,
    LearnerState, Manifest, SnapshotError, SnapshotInfo, COMPLETE_FILE, CONFIG_FILE, LATEST_FILE,
    MANIFEST_FILE, MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, TOKENIZER_FILE,
};

use crate::error::{LearnerError, Result};
use crate::optim::OptimizerState;

/// What goes into a snapshot.
pub struct SnapshotInput<'a> {
    /// Weights, named as in the HF checkpoint (any device and dtype).
    pub model: &'a [(String, Tensor)],
    /// The optimizer state (moments and counters) to save, or `None` for a weights-only
    /// snapshot (allowed where the stage step is 0, a stage starting with a fresh optimizer,
    /// and for a snapshot that is not a checkpoint, `state.checkpoint == false`).
    pub optimizer: Option<&'a dyn OptimizerState>,
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

/// Publishes snapshot `version` under `snapshots_dir` (created if missing) and points `LATEST`
/// at it. Refuses to overwrite an existing `vNNNNNN/`: a published snapshot is never rewritten.
pub fn publish(snapshots_dir: &Path, version: u64, input: &SnapshotInput) -> Result<SnapshotInfo> {
    publish_with(snapshots_dir, version, input, |_| Ok(Vec::new()))
}

/// [`publish`], with more files in the snapshot: `write_more` is called with the temporary
/// directory once it exists (other processes may write into it meanwhile: a learner group's
/// optimizer shards, see [`shard_tmp_dir`]) and returns the names and digests of the files
/// written there, which the manifest then checksums like the others.
pub fn publish_with(
    snapshots_dir: &Path,
    version: u64,
    input: &SnapshotInput,
    write_more: impl FnOnce(&Path) -> Result<Vec<(String, FileDigest)>>,
) -> Result<SnapshotInfo> {
    for file in input.extra_files.iter().map(|(f, _)| *f) {
        let taken = [
            MODEL_FILE,
            OPTIMIZER_FILE,
            STATE_FILE,
            CONFIG_FILE,
            TOKENIZER_FILE,
            MANIFEST_FILE,
            COMPLETE_FILE,
        ];
        let repeated = input.extra_files.iter().filter(|(f, _)| *f == file).count() > 1;
        if file.contains('/') || taken.contains(&file) || repeated {
            return Err(LearnerError::InvalidSnapshotInput(format!(
                "extra file name {file:?} is not a fresh plain file name"
            )));
        }
    }
    let dir = AtomicDir::create(&snapshots_dir.join(version_dir_name(version)))?;

    // 1. The payload files, each fsynced as it is closed.
    let mut files = BTreeMap::new();
    let digest = write_safetensors(&dir.path(MODEL_FILE), input.model, &BTreeMap::new())?;
    files.insert(MODEL_FILE.to_string(), digest.into());
    if let Some(optimizer) = input.optimizer {
        let digest = optimizer.save(&dir.path(OPTIMIZER_FILE))?;
        files.insert(OPTIMIZER_FILE.to_string(), digest.into());
    }
    for (file, digest) in write_more(&dir.path(""))? {
        files.insert(file, digest.into());
    }
    let has_optimizer = files.keys().any(|f| f.starts_with("optimizer."));
    if input.state.checkpoint && input.state.stage_step > 0 && !has_optimizer {
        return Err(LearnerError::InvalidSnapshotInput(format!(
            "checkpoint v{version} is at stage step {} and needs the optimizer state",
            input.state.stage_step
        )));
    }
    if !input.state.checkpoint && has_optimizer {
        return Err(LearnerError::InvalidSnapshotInput(format!(
            "snapshot v{version} is weights only (not a checkpoint) but was given optimizer state"
        )));
    }
    let state_json = serde_json::to_vec_pretty(input.state)
        .map_err(|e| SnapshotError::json(dir.path(STATE_FILE), e))?;
    for (file, bytes) in [
        (STATE_FILE, state_json.as_slice()),
        (CONFIG_FILE, input.config_json),
        (TOKENIZER_FILE, input.tokenizer_json),
    ]
    .into_iter()
    .chain(input.extra_files.iter().copied())
    {
        files.insert(file.to_string(), dir.write(file, bytes)?.into());
    }

    // 2. Manifest, then the completion marker.
    let manifest = Manifest {
        format: MANIFEST_FORMAT,
        version,
        stage_final: input.stage_final,
        files,
    };
    let manifest_json = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| SnapshotError::json(dir.path(MANIFEST_FILE), e))?;
    let manifest_digest = dir.write(MANIFEST_FILE, &manifest_json)?;
    dir.write(
        COMPLETE_FILE,
        format!("{:08x}\n", manifest_digest.crc32c).as_bytes(),
    )?;

    // 3. Make it visible, then point LATEST at it.
    let final_dir = dir.commit()?;
    write_latest(snapshots_dir, version)?;
    Ok(SnapshotInfo {
        version,
        dir: final_dir,
        manifest,
    })
}

/// The temporary directory snapshot `version` is written in, before it is published: where the
/// ranks of a learner group write their optimizer shards during [`publish_with`].
pub fn shard_tmp_dir(snapshots_dir: &Path, version: u64) -> std::path::PathBuf {
    AtomicDir::tmp_path(&snapshots_dir.join(version_dir_name(version)))
        .expect("a version directory name is a plain file name")
}

/// Replaces `LATEST` atomically.
fn write_latest(snapshots_dir: &Path, version: u64) -> Result<()> {
    Ok(replace_file(
        &snapshots_dir.join(LATEST_FILE),
        format!("{version}\n").as_bytes(),
    )?)
}

/// Removes every `*.tmp` entry (interrupted publishes and deletions, a stale `LATEST.tmp`).
/// Only the learner — the single writer of `snapshots/` — may call this.
fn clean_tmp(snapshots_dir: &Path) -> Result<()> {
    let entries = match fs::read_dir(snapshots_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(SnapshotError::io(snapshots_dir, e).into()),
    };
    for entry in entries {
        let entry = entry.map_err(|e| SnapshotError::io(snapshots_dir, e))?;
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) == Some("tmp") {
            tracing::info!(path = %path.display(), "removing interrupted snapshot write");
            let removed = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            removed.map_err(|e| SnapshotError::io(&path, e))?;
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

/// Whether the snapshot in `dir` is a checkpoint a learner can resume from, from its
/// `state.json` alone (no checksums): its state says so (snapshots of earlier builds are), or
/// it is at a stage's step 0, where the stage starts a fresh optimizer anyway.
fn is_checkpoint_dir(dir: &Path) -> Result<bool> {
    let path = dir.join(STATE_FILE);
    let bytes = fs::read(&path).map_err(|e| SnapshotError::io(&path, e))?;
    let state: LearnerState =
        serde_json::from_slice(&bytes).map_err(|e| SnapshotError::json(&path, e))?;
    Ok(state.checkpoint || state.stage_step == 0)
}

/// Deletes the snapshot directory `dir` of `version`: renamed aside first, so that a crash
/// half-way leaves a `*.tmp` entry that the next start removes, never a partial `vNNNNNN`.
fn remove_version(snapshots_dir: &Path, version: u64, dir: &Path) -> Result<()> {
    let doomed = snapshots_dir.join(format!("{}.del.tmp", version_dir_name(version)));
    fs::rename(dir, &doomed).map_err(|e| SnapshotError::io(dir, e))?;
    fs::remove_dir_all(&doomed).map_err(|e| SnapshotError::io(&doomed, e))?;
    Ok(())
}

/// Removes every snapshot newer than `version` and points `LATEST` at it; the removed versions.
fn roll_back_to(snapshots_dir: &Path, version: u64) -> Result<Vec<u64>> {
    let mut removed = Vec::new();
    for (v, dir) in list_versions(snapshots_dir)? {
        if v > version {
            remove_version(snapshots_dir, v, &dir)?;
            removed.push(v);
        }
    }
    write_latest(snapshots_dir, version)?;
    fsync_dir(snapshots_dir)?;
    tracing::info!(
        "resuming from checkpoint v{version}: removed the weights-only snapshots after it {removed:?}"
    );
    Ok(removed)
}

/// The newest complete snapshot that is a checkpoint (`learner.checkpoint_every`). When newer
/// complete snapshots are weights only, every snapshot newer than the checkpoint is removed and
/// `LATEST` names the checkpoint: those snapshots belong to steps that a resumed learner
/// recomputes under the same version numbers, and an actor must not take their weights for the
/// new ones. Corrupt snapshots are skipped as [`latest_complete`] skips them.
pub fn latest_checkpoint(snapshots_dir: &Path) -> Result<Option<SnapshotInfo>> {
    let Some(newest) = latest_complete(snapshots_dir)? else {
        return Ok(None);
    };
    if is_checkpoint_dir(&newest.dir)? {
        return Ok(Some(newest));
    }
    for (version, dir) in list_versions(snapshots_dir)? {
        if version >= newest.version {
            continue;
        }
        match verify(&dir) {
            Ok(info) if is_checkpoint_dir(&info.dir)? => {
                roll_back_to(snapshots_dir, version)?;
                return Ok(Some(info));
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("skipping snapshot {}: {e}", dir.display()),
        }
    }
    Err(LearnerError::State(format!(
        "{}: no checkpoint to resume from (the newest complete snapshot v{} is weights only \
         and no earlier one is a checkpoint)",
        snapshots_dir.display(),
        newest.version
    )))
}

/// [`latest_checkpoint`]'s removal of the weights-only snapshots after the newest checkpoint,
/// judged from the completion markers and `state.json` alone (no checksums): for `cascade run`,
/// which does it before any actor reads `LATEST`, leaving the verification to the learner.
/// The removed versions.
pub fn drop_after_newest_checkpoint(snapshots_dir: &Path) -> Result<Vec<u64>> {
    let complete: Vec<(u64, std::path::PathBuf)> = list_versions(snapshots_dir)?
        .into_iter()
        .filter(|(_, dir)| dir.join(COMPLETE_FILE).exists())
        .collect();
    let checkpoint = complete
        .iter()
        .position(|(_, dir)| is_checkpoint_dir(dir).unwrap_or(false));
    match checkpoint {
        Some(i) if i > 0 => roll_back_to(snapshots_dir, complete[i].0),
        _ => Ok(Vec::new()),
    }
}

/// Copies the snapshot's weights into every variable of `varmap` (cast to the variable's dtype).
/// Every variable must be present in the file with its shape.
pub fn restore_varmap(varmap: &VarMap, dir: &Path) -> Result<()> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| LearnerError::Poisoned("the model's variables"))?;
    let device = data
        .values()
        .next()
        .map(|v| v.device().clone())
        .unwrap_or(Device::Cpu);
    let tensors = load_model(dir, &device)?;
    for (name, var) in data.iter() {
        let t = tensors.get(name).ok_or_else(|| {
            SnapshotError::corrupt(dir.join(MODEL_FILE), format!("no tensor {name}"))
        })?;
        if t.dims() != var.dims() {
            return Err(SnapshotError::corrupt(
                dir.join(MODEL_FILE),
                format!("{name} is {:?}, the model wants {:?}", t.dims(), var.dims()),
            )
            .into());
        }
        var.set(&t.to_dtype(var.dtype())?)?;
    }
    Ok(())
}

/// Deletes old snapshots: keeps the newest `keep_last` (at least 1), every stage-final one, the
/// one `LATEST` names, every actor-acknowledged one and the newest checkpoint. Returns the
/// deleted versions.
pub fn retain(snapshots_dir: &Path, keep_last: usize) -> Result<Vec<u64>> {
    let versions = list_versions(snapshots_dir)?;
    let acked = acknowledged_versions(snapshots_dir)?;
    let latest = read_latest(snapshots_dir);
    let mut deleted = Vec::new();
    // The newest checkpoint is what a resumed learner starts from: kept whatever its age.
    let mut checkpoint_kept = false;
    for (rank, (version, dir)) in versions.into_iter().enumerate() {
        let newest_checkpoint = !checkpoint_kept && is_checkpoint_dir(&dir).unwrap_or(false);
        checkpoint_kept |= newest_checkpoint;
        if rank < keep_last.max(1)
            || acked.contains(&version)
            || latest == Some(version)
            || newest_checkpoint
        {
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
        remove_version(snapshots_dir, version, &dir)?;
        deleted.push(version);
    }
    if !deleted.is_empty() {
        fsync_dir(snapshots_dir)?;
    }
    Ok(deleted)
}
