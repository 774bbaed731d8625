//! The on-disk layout of `snapshots/`: file names, version directory names, the manifest.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::durable::FileDigest;

/// Model weights, HF tensor names.
pub const MODEL_FILE: &str = "model.safetensors";
/// Optimizer moments and counters.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// [`super::LearnerState`] as JSON.
pub const STATE_FILE: &str = "state.json";
/// The HF model config.
pub const CONFIG_FILE: &str = "config.json";
/// The HF tokenizer.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The chat template and special-token settings kept beside `tokenizer.json`, when the run
/// has them.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// Size and checksum of every file above.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Written last: the snapshot is complete (holds the CRC-32C of the manifest).
pub const COMPLETE_FILE: &str = "COMPLETE";
/// The newest published version.
pub const LATEST_FILE: &str = "LATEST";
/// Directory of actor acknowledgements.
pub const ACKS_DIR: &str = "acks";
/// The files every snapshot's manifest must list. `optimizer.safetensors` is listed by
/// snapshots taken inside a stage (stage step > 0); one at a stage's start carries weights only.
pub const REQUIRED_FILES: [&str; 4] = [MODEL_FILE, STATE_FILE, CONFIG_FILE, TOKENIZER_FILE];

/// Version of the manifest layout.
pub const MANIFEST_FORMAT: u32 = 1;

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

/// `vNNNNNN`: six digits, more when the version needs them.
pub fn version_dir_name(version: u64) -> String {
    format!("v{version:06}")
}

/// Parses a complete snapshot's directory name (`v` + digits, nothing else).
pub fn parse_version_dir(name: &str) -> Option<u64> {
    let digits = name.strip_prefix('v')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The acknowledgement file of actor `actor_id` inside `snapshots/acks/`.
pub fn ack_file_name(actor_id: u32) -> String {
    format!("actor-{actor_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_names_round_trip_and_reject_others() {
        assert_eq!(version_dir_name(42), "v000042");
        assert_eq!(version_dir_name(12_345_678), "v12345678");
        assert_eq!(parse_version_dir("v000042"), Some(42));
        for bad in ["v", "v12a", "v000042.tmp", "x000042", "v000042.del.tmp"] {
            assert_eq!(parse_version_dir(bad), None, "{bad}");
        }
    }
}
