//! The saved reward model: a Hugging Face directory that the actor's `RewardModel::load`
//! reads, written atomically, with a completion marker written last.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::DType;

use super::trainer::RmTrainer;
use crate::error::{LearnerError, Result};
use crate::tensor_io::write_safetensors;

/// The completion marker written last into a saved reward model.
pub const COMPLETE_FILE: &str = "COMPLETE";

impl RmTrainer {
    /// Writes the reward model into `dir` (which must not exist yet) atomically: `config.json`,
    /// `model.safetensors` (all tensors in the model's dtype), `tokenizer.json`, the optional
    /// `tokenizer_config.json` (give it whenever the chat template is not the built-in ChatML,
    /// or the loaded model will render conversations differently), then `COMPLETE`.
    pub fn save(
        &self,
        dir: &Path,
        tokenizer_json: &[u8],
        tokenizer_config_json: Option<&[u8]>,
    ) -> Result<()> {
        if dir.exists() {
            return Err(LearnerError::io(
                dir,
                std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "a reward model is never overwritten; remove it first",
                ),
            ));
        }
        write_dir_atomically(dir, |tmp| {
            let torch_dtype = match self.model().dtype() {
                DType::BF16 => "bfloat16",
                DType::F16 => "float16",
                _ => "float32",
            };
            let config_path = tmp.join("config.json");
            let config = serde_json::to_vec_pretty(&self.model().config().to_hf_json(torch_dtype))
                .map_err(|e| LearnerError::json(&config_path, e))?;
            write_synced(&config_path, &config)?;
            let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
            let digest = write_safetensors(&tmp.join("model.safetensors"), &self.tensors(), &meta)?;
            write_synced(&tmp.join("tokenizer.json"), tokenizer_json)?;
            if let Some(bytes) = tokenizer_config_json {
                write_synced(&tmp.join("tokenizer_config.json"), bytes)?;
            }
            write_synced(
                &tmp.join(COMPLETE_FILE),
                format!("{:08x}\n", digest.crc32c).as_bytes(),
            )?;
            Ok(())
        })
    }
}

/// Creates the new directory `dir` atomically: `fill` writes its files (each fsynced) into
/// `DIR.tmp` (a leftover of an interrupted write is removed first), which is then fsynced,
/// renamed to `dir`, and the parent fsynced. A crash leaves either no `dir` or a complete one.
fn write_dir_atomically(dir: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let name = dir
        .file_name()
        .ok_or_else(|| {
            LearnerError::InvalidConfig(format!("{}: not a directory name", dir.display()))
        })?
        .to_string_lossy()
        .into_owned();
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).map_err(|e| LearnerError::io(&parent, e))?;
    let tmp = parent.join(format!("{name}.tmp"));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| LearnerError::io(&tmp, e))?;
    }
    fs::create_dir(&tmp).map_err(|e| LearnerError::io(&tmp, e))?;
    fill(&tmp)?;
    fsync_dir(&tmp)?;
    fs::rename(&tmp, dir).map_err(|e| LearnerError::io(dir, e))?;
    fsync_dir(&parent)
}

fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| LearnerError::io(dir, e))
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |e| LearnerError::io(path, e);
    let mut file = File::create(path).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)
}

/// Whether `dir` holds a completely saved reward model (its `COMPLETE` marker exists).
pub fn is_complete(dir: &Path) -> bool {
    dir.join(COMPLETE_FILE).is_file()
}
