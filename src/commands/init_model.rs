//! `cascade init-model`: a seeded random checkpoint in the Hugging Face layout.

use std::path::PathBuf;

use anyhow::{bail, Context};
use candle_core::{DType, Device};
use cascade_shared::model::{random_weights, save_checkpoint, ModelConfig};
use cascade_shared::tokenizer::{write_tiny_tokenizer, Tokenizer};
use clap::Args;

/// Arguments of `cascade init-model`.
#[derive(Args, Debug)]
pub struct InitModelArgs {
    /// Model config in the Hugging Face `config.json` format (`model_type` qwen3, qwen2 or llama).
    #[arg(long)]
    pub config: PathBuf,
    /// Seed of the random weights (the same seed gives the same bytes).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output directory (created; must be empty or absent).
    #[arg(long)]
    pub out: PathBuf,
    /// Directory holding the `tokenizer.json` (and `tokenizer_config.json`) to ship with the
    /// model; default: the project's tiny byte-level tokenizer.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Dtype of `model.safetensors`.
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16", "f16"])]
    pub dtype: String,
}

/// Runs `cascade init-model`.
pub fn run(args: InitModelArgs) -> anyhow::Result<i32> {
    let cfg = ModelConfig::from_file(&args.config)?;
    if args.out.exists() && std::fs::read_dir(&args.out)?.next().is_some() {
        bail!("--out {}: directory is not empty", args.out.display());
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    match &args.tokenizer {
        Some(dir) => {
            for f in ["tokenizer.json", "tokenizer_config.json"] {
                let src = dir.join(f);
                if src.exists() {
                    std::fs::copy(&src, args.out.join(f))
                        .with_context(|| format!("copying {}", src.display()))?;
                } else if f == "tokenizer.json" {
                    bail!("--tokenizer {}: no tokenizer.json there", dir.display());
                }
            }
        }
        None => write_tiny_tokenizer(&args.out)?,
    }
    let tok = Tokenizer::from_dir(&args.out)?;
    if tok.vocab_size() > cfg.vocab_size {
        bail!(
            "--config {}: vocab_size {} is smaller than the tokenizer's {} tokens",
            args.config.display(),
            cfg.vocab_size,
            tok.vocab_size()
        );
    }
    let dtype = match args.dtype.as_str() {
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        _ => DType::F32,
    };
    let weights = random_weights(&cfg, args.seed, &Device::Cpu)?;
    save_checkpoint(&args.out, &cfg, &weights, dtype)?;
    println!(
        "wrote {} ({} parameters, {:?}, seed {})",
        args.out.display(),
        cfg.num_parameters(),
        dtype,
        args.seed
    );
    Ok(0)
}
