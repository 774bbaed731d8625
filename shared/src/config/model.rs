//! `[model]`: the starting checkpoint, or a random initialisation.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::error::{invalid, Result};

/// Data type of the weights in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DtypeChoice {
    /// f32 on CPU, bf16 on GPU.
    #[default]
    Auto,
    /// 32-bit float.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
}

/// `init = { config = "...", seed = ... }`: a random initialisation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitConfig {
    /// A Hugging Face `config.json` describing the architecture.
    pub config: PathBuf,
    /// Seed of the weight initialisation.
    #[serde(default)]
    pub seed: u64,
    /// `tokenizer.json` to save with the weights; default the built-in tiny tokenizer.
    #[serde(default)]
    pub tokenizer: Option<PathBuf>,
}

/// `[model]`: exactly one of `path` and `init`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// A Hugging Face checkpoint directory (`config.json`, `tokenizer.json`, safetensors).
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// A random initialisation instead of a checkpoint.
    #[serde(default)]
    pub init: Option<InitConfig>,
    /// In-memory dtype.
    #[serde(default)]
    pub dtype: DtypeChoice,
}

impl ModelConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        match (&self.path, &self.init) {
            (Some(_), Some(_)) => Err(invalid(
                "model",
                "give either `path` (a checkpoint directory) or `init` (a random init), not both",
            )),
            (None, None) => Err(invalid(
                "model",
                "give `path` (a checkpoint directory) or `init = { config = ..., seed = ... }`",
            )),
            _ => Ok(()),
        }
    }
}
