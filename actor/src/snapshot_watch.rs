//! Snapshot hot-reload: the actor's read side of `RUN_DIR/snapshots/`.
//!
//! Between decode steps the actor calls [`SnapshotWatch::poll`]. When `LATEST` names a version
//! newer than the weights in use, the actor acknowledges it (`acks/actor-I`, written *before*
//! reading so the learner's retention keeps it), verifies the directory with the snapshot
//! format's own checker ([`cascade_shared::snapshot::load_snapshot`]: completion marker,
//! manifest, size and CRC-32C of every file, `state.json` format) and loads the weights shape-checked against the running model. A snapshot that
//! fails any check is refused with a logged reason, the acknowledgement goes back to the
//! version in use, and generation goes on with the current weights. A refused version is not
//! retried until `LATEST` changes.

use std::path::{Path, PathBuf};

use candle_core::Device;
use cascade_shared::model::{compute_dtype, parameter_shapes, CausalLm, Checkpoint, ModelConfig};
use cascade_shared::snapshot::{self, LearnerState};

use crate::error::{ActorError, Result};

/// A verified, loaded snapshot.
#[derive(Debug)]
pub struct LoadedWeights {
    /// Its policy version.
    pub version: u64,
    /// Its directory.
    pub dir: PathBuf,
    /// The model built from its weights.
    pub model: CausalLm,
    /// Its `state.json` (stage index, stage step...).
    pub state: LearnerState,
}

/// Watches `snapshots/LATEST` for one actor.
#[derive(Debug)]
pub struct SnapshotWatch {
    snapshots_dir: PathBuf,
    actor_id: u32,
    device: Device,
    current: Option<u64>,
    last_latest: Option<u64>,
    refused: u64,
}

impl SnapshotWatch {
    /// Watches `snapshots_dir` for actor `actor_id`, loading weights onto `device`.
    pub fn new(snapshots_dir: impl Into<PathBuf>, actor_id: u32, device: Device) -> Self {
        SnapshotWatch {
            snapshots_dir: snapshots_dir.into(),
            actor_id,
            device,
            current: None,
            last_latest: None,
            refused: 0,
        }
    }

    /// The version of the weights in use, once one was loaded or set.
    pub fn current(&self) -> Option<u64> {
        self.current
    }

    /// Snapshots refused so far.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Records that the actor runs weights of `version` obtained otherwise (e.g. the initial
    /// checkpoint), and acknowledges it.
    pub fn set_current(&mut self, version: u64) -> Result<()> {
        self.current = Some(version);
        self.write_ack(version)
    }

    /// Checks `LATEST`; returns newly loaded weights when it names a newer, valid snapshot.
    /// `running` is the config of the model in use (new weights must fit it), `None` at start.
    /// A bad snapshot is logged and refused (`Ok(None)`).
    pub fn poll(&mut self, running: Option<&ModelConfig>) -> Result<Option<LoadedWeights>> {
        let Some(latest) = snapshot::read_latest(&self.snapshots_dir) else {
            return Ok(None);
        };
        // An older LATEST than the weights in use is a learner resumed from its last checkpoint:
        // it removed the weights-only snapshots after it (ours among them) and will publish
        // other weights under those versions, so the actor goes back with it.
        let rolled_back = self.current.is_some_and(|c| {
            latest < c
                && !self
                    .snapshots_dir
                    .join(snapshot::version_dir_name(c))
                    .exists()
        });
        if self.last_latest == Some(latest)
            || (self.current.is_some_and(|c| latest <= c) && !rolled_back)
        {
            return Ok(None);
        }
        if rolled_back {
            tracing::info!(
                "actor {}: snapshot v{} was removed and LATEST is v{latest} (the learner resumed                  from its last checkpoint); following it back",
                self.actor_id,
                self.current.unwrap_or_default()
            );
        }
        self.last_latest = Some(latest);
        self.write_ack(latest)?;
        let dir = self.snapshots_dir.join(snapshot::version_dir_name(latest));
        match load_weights(&dir, running, &self.device) {
            Ok(loaded) => {
                tracing::info!(
                    version = latest,
                    "actor {} loaded snapshot {}",
                    self.actor_id,
                    dir.display()
                );
                self.current = Some(latest);
                Ok(Some(loaded))
            }
            Err(e) => {
                self.refused += 1;
                tracing::warn!(
                    "actor {} refuses snapshot {}: {e}; keeping the current weights",
                    self.actor_id,
                    dir.display()
                );
                eprintln!(
                    "warning: refusing snapshot {}: {e}; keeping the current weights",
                    dir.display()
                );
                match self.current {
                    Some(c) => self.write_ack(c)?,
                    None => self.remove_ack()?,
                }
                Ok(None)
            }
        }
    }

    /// Writes `acks/actor-I` atomically.
    fn write_ack(&self, version: u64) -> Result<()> {
        Ok(snapshot::write_ack(
            &self.snapshots_dir,
            self.actor_id,
            version,
        )?)
    }

    fn remove_ack(&self) -> Result<()> {
        Ok(snapshot::remove_ack(&self.snapshots_dir, self.actor_id)?)
    }
}

/// Verifies the snapshot in `dir` and loads its weights (a deep copy out of the mapping),
/// shape-checked against `running` (or the snapshot's own `config.json` when `None`).
pub fn load_weights(
    dir: &Path,
    running: Option<&ModelConfig>,
    device: &Device,
) -> Result<LoadedWeights> {
    let refuse = |reason: String| ActorError::Snapshot {
        path: dir.to_path_buf(),
        reason,
    };
    let loaded = snapshot::load_snapshot(dir).map_err(|e| refuse(e.to_string()))?;
    let own = ModelConfig::from_file(&dir.join(snapshot::CONFIG_FILE))
        .map_err(|e| refuse(e.to_string()))?;
    if let Some(running) = running {
        // Same tensor names and shapes is not enough (extra layers would be silently ignored):
        // the snapshot must describe the very architecture the actor is running.
        if parameter_shapes(running) != parameter_shapes(&own)
            || running.model_type != own.model_type
        {
            return Err(refuse(format!(
                "its config.json describes another architecture ({:?}, {} layers, hidden {}) than the running model ({:?}, {} layers, hidden {})",
                own.model_type,
                own.num_hidden_layers,
                own.hidden_size,
                running.model_type,
                running.num_hidden_layers,
                running.hidden_size
            )));
        }
    }
    let cfg = running.unwrap_or(&own);
    let tensors = Checkpoint::open_published(dir)
        .and_then(|c| c.load_all(cfg, compute_dtype(device), device))
        .map_err(|e| refuse(e.to_string()))?;
    let model = CausalLm::from_tensors(cfg, &tensors).map_err(|e| refuse(e.to_string()))?;
    Ok(LoadedWeights {
        version: loaded.info.version,
        dir: dir.to_path_buf(),
        model,
        state: loaded.state,
    })
}
