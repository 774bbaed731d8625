//! The snapshot format: the contract between the learner, which publishes
//! `RUN_DIR/snapshots/vNNNNNN/`, and the actors, evaluation and resume, which read them.
//!
//! A snapshot directory loads in Hugging Face transformers as it is (`model.safetensors`,
//! `config.json`, `tokenizer.json`, optionally `tokenizer_config.json`) and also holds
//! `optimizer.safetensors` and `state.json` ([`LearnerState`]) for an exact resume. It is
//! written as `vNNNNNN.tmp/`, every file fsynced as it is closed, then `manifest.json` (size and
//! CRC-32C of each file, [`Manifest`]), then the completion marker `COMPLETE` (the CRC-32C of
//! the manifest); the directory is renamed to `vNNNNNN/` and `LATEST` (the version in decimal)
//! replaced by tmp + rename ([`durable`]). A published snapshot is never rewritten: readers may
//! have it mapped. Readers check everything with [`verify`] before use.
//!
//! Actors acknowledge the version they load in `snapshots/acks/actor-I` ([`acks`]) *before*
//! reading it, so that retention keeps it. The writing side (publish, retention, start-up
//! clean-up) belongs to the learner.

pub mod acks;
pub mod durable;
mod error;
pub mod layout;
mod read;
mod state;
pub mod tensors;

pub use acks::{acknowledged_versions, remove_ack, write_ack};
pub use error::{Result, SnapshotError};
pub use layout::{
    version_dir_name, Manifest, ManifestEntry, ACKS_DIR, COMPLETE_FILE, CONFIG_FILE, LATEST_FILE,
    MANIFEST_FILE, MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE,
};
pub use read::{
    list_versions, load_model, load_snapshot, peek_latest_state, peek_manifest, peek_snapshot,
    read_latest, verify, LoadedSnapshot, SnapshotInfo,
};
pub use state::{FilterMetrics, LearnerState, StageProgress, STATE_FORMAT_VERSION};
