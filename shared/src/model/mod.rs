//! Qwen3-family causal language models (Qwen3, Qwen2, Llama) in candle.
//!
//! - [`ModelConfig`] mirrors a Hugging Face `config.json`; `model_type` picks the architecture.
//! - [`CausalLm`] has a differentiable full-sequence path (`forward_logprobs`,
//!   `token_logprobs`) for the learner and a batched KV-cache decode path ([`DecodeBatch`],
//!   `prefill`, `decode_step`) for the actors, over the same weights.
//! - [`Checkpoint`] loads single or sharded safetensors; [`random_weights`] makes a seeded
//!   random model; [`save_checkpoint`] writes the Hugging Face layout.

mod causal_lm;
mod config;
mod decode;
pub mod flash_attn;
mod fused;
mod initial;
mod layers;
pub mod paged;
mod recompute;
mod simd;
mod weights;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var};

pub use causal_lm::{compute_dtype, AttentionImpl, CausalLm};
pub use config::{parameter_shapes, ModelConfig, ModelType};
pub use decode::{argmax, DecodeBatch, PREFILL_TOKENS};
pub use initial::{initial_model, InitialModel, InitialModelError};
pub use layers::{gather_logprobs, OpsMode};
pub use weights::{check_tensors, random_weights, save_safetensors, Checkpoint};

/// Errors of the model module. Errors about a file carry its path; errors about a tensor its name.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Reading a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// `config.json` is invalid.
    #[error("model config: {0}")]
    Config(String),
    /// `config.json` is invalid (with the file name).
    #[error("{}: {message}", path.display())]
    ConfigFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A safetensors file is corrupt or truncated.
    #[error("{}: {message}", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A parameter is missing from the checkpoint.
    #[error("{}: missing tensor `{name}`", path.display())]
    MissingTensor {
        /// The file(s) searched.
        path: PathBuf,
        /// The tensor name.
        name: String,
    },
    /// A parameter has the wrong shape.
    #[error("{}: tensor `{name}` has shape {found:?}, expected {expected:?}", path.display())]
    WrongShape {
        /// The file.
        path: PathBuf,
        /// The tensor name.
        name: String,
        /// Shape the config implies.
        expected: Vec<usize>,
        /// Shape in the file.
        found: Vec<usize>,
    },
    /// A parameter could not be fetched through a `VarBuilder`.
    #[error("parameter `{name}`: {message}")]
    Load {
        /// The tensor name.
        name: String,
        /// The cause.
        message: String,
    },
    /// A sequence longer than the model's context.
    #[error(
        "sequence of {len} tokens exceeds the model's context of {max} (max_position_embeddings)"
    )]
    TooLong {
        /// Requested length.
        len: usize,
        /// The context size.
        max: usize,
    },
    /// A decode batch's KV-cache budget cannot hold what was asked of it.
    #[error(
        "the KV cache is full: {needed} more tokens needed, {free} free of a budget of {budget} \
         tokens"
    )]
    KvFull {
        /// Tokens the call needed.
        needed: usize,
        /// Tokens free (in whole blocks).
        free: usize,
        /// The batch's budget in tokens.
        budget: usize,
    },
    /// A sequence of a full-sequence (training) batch longer than the model's context.
    #[error(
        "row {row}, sequence {segment} of the attention mask: {len} tokens exceed the model's \
         context of {max} (max_position_embeddings)"
    )]
    RowTooLong {
        /// Batch row.
        row: usize,
        /// Its segment id in the attention mask (1 for an unpacked row).
        segment: u32,
        /// The sequence's length in tokens.
        len: usize,
        /// The context size.
        max: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadTokenId {
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

impl ModelError {
    /// Attaches a file name to a config error.
    pub(crate) fn in_file(self, path: &Path) -> ModelError {
        match self {
            ModelError::Config(message) => ModelError::ConfigFile {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        }
    }
}

/// Result alias of the model module.
pub type Result<T> = std::result::Result<T, ModelError>;

/// Loads `config.json` and the safetensors of a checkpoint directory into a model for inference
/// on `device`, in the device's compute dtype (f32 on CPU, bf16 on GPU).
pub fn load_model(dir: &Path, device: &Device) -> Result<CausalLm> {
    let (cfg, tensors) = load_tensors(dir, compute_dtype(device), device)?;
    CausalLm::from_tensors(&cfg, &tensors)
}

/// Loads the config and every parameter of a checkpoint directory.
pub fn load_tensors(
    dir: &Path,
    dtype: DType,
    device: &Device,
) -> Result<(ModelConfig, HashMap<String, Tensor>)> {
    let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
    let tensors = Checkpoint::open_dir(dir)?.load_all(&cfg, dtype, device)?;
    Ok((cfg, tensors))
}

/// The trainable parameters of a model: one [`Var`] per checkpoint tensor, by name.
#[derive(Debug, Clone, Default)]
pub struct Params {
    /// Variables by Hugging Face name (sorted, so iteration order is stable).
    pub vars: std::collections::BTreeMap<String, Var>,
}

impl Params {
    /// Turns tensors into variables.
    pub fn from_tensors(tensors: HashMap<String, Tensor>) -> Result<Params> {
        let vars = tensors
            .into_iter()
            .map(|(k, t)| Ok((k, Var::from_tensor(&t)?)))
            .collect::<Result<_>>()?;
        Ok(Params { vars })
    }

    /// The current values as plain tensors (sharing storage with the variables).
    pub fn tensors(&self) -> HashMap<String, Tensor> {
        self.vars
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
            .collect()
    }

    /// A `VarMap` holding the same variables (for candle-nn optimisers and `VarBuilder`s).
    pub fn to_varmap(&self) -> candle_nn::VarMap {
        let map = candle_nn::VarMap::new();
        {
            let mut data = map.data().lock().expect("fresh VarMap lock");
            for (k, v) in &self.vars {
                data.insert(k.clone(), v.clone());
            }
        }
        map
    }
}

/// Loads a checkpoint for training: a model whose every parameter is a [`Var`], plus the
/// variables. Gradients of the model's full-sequence outputs reach every variable.
pub fn load_trainable(dir: &Path, dtype: DType, device: &Device) -> Result<(CausalLm, Params)> {
    let (cfg, tensors) = load_tensors(dir, dtype, device)?;
    trainable_from_tensors(&cfg, tensors)
}

/// Like [`load_trainable`] from in-memory tensors.
pub fn trainable_from_tensors(
    cfg: &ModelConfig,
    tensors: HashMap<String, Tensor>,
) -> Result<(CausalLm, Params)> {
    let params = Params::from_tensors(tensors)?;
    let model = CausalLm::from_tensors(cfg, &params.tensors())?;
    Ok((model, params))
}

/// Writes `config.json` and `model.safetensors` (in `dtype`) into `dir` in the Hugging Face
/// layout. The caller adds the tokenizer files.
pub fn save_checkpoint(
    dir: &Path,
    cfg: &ModelConfig,
    tensors: &HashMap<String, Tensor>,
    dtype: DType,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::Io {
        path: dir.to_path_buf(),
        source: e,
    })?;
    let torch_dtype = match dtype {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    };
    let cfg_path = dir.join("config.json");
    let json =
        serde_json::to_string_pretty(&cfg.to_hf_json(torch_dtype)).expect("config serialises");
    std::fs::write(&cfg_path, json).map_err(|e| ModelError::Io {
        path: cfg_path,
        source: e,
    })?;
    check_tensors(cfg, tensors)?;
    save_safetensors(tensors, dtype, &dir.join("model.safetensors"))
}
