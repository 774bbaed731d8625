//! The saved reward model: a Hugging Face directory that the actor's `RewardModel::load`
//! reads, written atomically, with a completion marker written last.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::DType;
use cascade_shared::snapshot::durable::AtomicDir;
use cascade_shared::snapshot::tensors::write_safetensors;
use cascade_shared::snapshot::SnapshotError;

use super::trainer::RmTrainer;
use crate::error::{LearnerError, Result};

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
        // Refuses an existing `dir`: a reward model is never overwritten (remove it first).
        let out = AtomicDir::create(dir)?;
        let torch_dtype = match self.model().dtype() {
            DType::BF16 => "bfloat16",
            DType::F16 => "float16",
            _ => "float32",
        };
        let config = serde_json::to_vec_pretty(&self.model().config().to_hf_json(torch_dtype))
            .map_err(|e| SnapshotError::json(out.path("config.json"), e))?;
        out.write("config.json", &config)?;
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        let digest = write_safetensors(&out.path("model.safetensors"), &self.tensors(), &meta)?;
        out.write("tokenizer.json", tokenizer_json)?;
        if let Some(bytes) = tokenizer_config_json {
            out.write("tokenizer_config.json", bytes)?;
        }
        out.write(COMPLETE_FILE, format!("{:08x}\n", digest.crc32c).as_bytes())?;
        out.commit().map(|_| ()).map_err(LearnerError::from)
    }
}

/// Whether `dir` holds a completely saved reward model (its `COMPLETE` marker exists).
pub fn is_complete(dir: &Path) -> bool {
    dir.join(COMPLETE_FILE).is_file()
}
