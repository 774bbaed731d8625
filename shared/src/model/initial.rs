//! The run's initial model, the one place that reads `[model]`: a checkpoint directory
//! (`path`), or a seeded random init of a `config.json` with a given or the built-in tiny
//! tokenizer. The learner trains from it (and publishes it as snapshot `v000000`); an actor
//! that starts before any snapshot exists generates with the very same weights.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::{load_tensors, random_weights, ModelConfig, ModelError};
use crate::config::RunConfig;
use crate::tokenizer::{write_tiny_tokenizer, TokenizerError};

/// The tokenizer's chat template and special-token settings, kept beside `tokenizer.json`.
const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// Why the initial model could not be built.
#[derive(Debug, thiserror::Error)]
pub enum InitialModelError {
    /// Loading the checkpoint or building the random weights failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Writing the built-in tiny tokenizer failed.
    #[error("writing the tiny tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    /// Copying the tokenizer files failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// The initial weights and where their tokenizer files are.
#[derive(Debug)]
pub struct InitialModel {
    /// The architecture.
    pub cfg: ModelConfig,
    /// Every parameter by HF name, in the requested dtype.
    pub tensors: HashMap<String, Tensor>,
    /// A directory holding `tokenizer.json` (and `tokenizer_config.json` when the run has one).
    pub tokenizer_dir: PathBuf,
}

/// Builds the initial model of `config` in `dtype` on `device`. For a random init, the
/// tokenizer files are materialised in `scratch_tokenizer_dir` (created if missing): the given
/// `tokenizer.json` with the `tokenizer_config.json` beside it, or the built-in tiny tokenizer.
/// Each process passes its own directory, so none writes another's files.
pub fn initial_model(
    config: &RunConfig,
    dtype: DType,
    device: &Device,
    scratch_tokenizer_dir: &Path,
) -> Result<InitialModel, InitialModelError> {
    if let Some(path) = &config.model.path {
        let dir = config.resolve(path);
        let (cfg, tensors) = load_tensors(&dir, dtype, device)?;
        return Ok(InitialModel {
            cfg,
            tensors,
            tokenizer_dir: dir,
        });
    }
    let Some(init) = config.model.init.as_ref() else {
        // `RunConfig::validate` requires one of the two.
        return Err(ModelError::Config("[model] has neither path nor init".into()).into());
    };
    let cfg = ModelConfig::from_file(&config.resolve(&init.config))?;
    let dir = scratch_tokenizer_dir;
    match &init.tokenizer {
        Some(t) => {
            let io = |path: &Path, source| InitialModelError::Io {
                path: path.to_path_buf(),
                source,
            };
            std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
            let src = config.resolve(t);
            std::fs::copy(&src, dir.join("tokenizer.json")).map_err(|e| io(&src, e))?;
            let src_config = src.with_file_name(TOKENIZER_CONFIG_FILE);
            if src_config.is_file() {
                std::fs::copy(&src_config, dir.join(TOKENIZER_CONFIG_FILE))
                    .map_err(|e| io(&src_config, e))?;
            }
        }
        None => write_tiny_tokenizer(dir)?,
    }
    let tensors = random_weights(&cfg, init.seed, device)?
        .into_iter()
        .map(|(k, t)| Ok((k, t.to_dtype(dtype)?)))
        .collect::<Result<HashMap<_, _>, ModelError>>()?;
    Ok(InitialModel {
        cfg,
        tensors,
        tokenizer_dir: dir.to_path_buf(),
    })
}
