//! `cascade data tiny`: writes the seeded synthetic datasets of the embedded tiny default.

use std::path::{Path, PathBuf};

use anyhow::Context;
use cascade_datagen::{write_tiny, Domain, TinyManifest, TinySizes};
use clap::{Args, Subcommand};

/// Size of the tokenizer trained on the tiny data (bytes, 5 added tokens, merges).
pub const TINY_BPE_VOCAB: usize = 1024;

/// Where the trained tokenizer goes inside the data directory (with its `tokenizer_config.json`).
pub const TINY_TOKENIZER: &str = "tokenizer/tokenizer.json";

/// Writes the tiny datasets into `dir` (see [`write_tiny`]) and a byte-level BPE tokenizer
/// trained on their training files (never the held-out ones) into `dir/tokenizer/`: the tiny
/// byte tokenizer's layout plus [`TINY_BPE_VOCAB`] − 261 merges, about 2.7 bytes per token on
/// this data instead of 1. Deterministic; rewritten only when its contents change.
pub fn write_tiny_data(dir: &Path, seed: u64, sizes: &TinySizes) -> anyhow::Result<TinyManifest> {
    let manifest = write_tiny(dir, seed, sizes)
        .with_context(|| format!("writing the tiny datasets to {}", dir.display()))?;
    let mut texts = Vec::new();
    let mut files = vec!["sft.jsonl".to_string(), "prefs.jsonl".to_string()];
    files.extend(Domain::ALL.iter().map(|d| format!("{}.jsonl", d.name())));
    for name in files {
        let path = dir.join(&name);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        for (i, line) in text.lines().enumerate() {
            let v: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))?;
            string_leaves(&v, &mut texts);
        }
    }
    let tokenizer = cascade_shared::tokenizer::train_tiny_bpe(
        texts.iter().map(String::as_str),
        TINY_BPE_VOCAB,
    )?;
    let tok_dir = dir
        .join(TINY_TOKENIZER)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let tmp = dir.join("tokenizer.tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    cascade_shared::tokenizer::write_tokenizer_with_tiny_config(&tmp, &tokenizer)?;
    let same = ["tokenizer.json", "tokenizer_config.json"]
        .iter()
        .all(|f| std::fs::read(tmp.join(f)).ok() == std::fs::read(tok_dir.join(f)).ok());
    if same {
        std::fs::remove_dir_all(&tmp).ok();
    } else {
        let _ = std::fs::remove_dir_all(&tok_dir);
        std::fs::rename(&tmp, &tok_dir)
            .with_context(|| format!("moving the tokenizer into {}", tok_dir.display()))?;
    }
    Ok(manifest)
}

fn string_leaves(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(a) => a.iter().for_each(|x| string_leaves(x, out)),
        serde_json::Value::Object(o) => o.values().for_each(|x| string_leaves(x, out)),
        _ => {}
    }
}

/// Dataset tools.
#[derive(Subcommand, Debug)]
pub enum DataCommand {
    /// Write the tiny default's JSONL files (SFT conversations in both modes, preference pairs,
    /// rlhf / if / math / code / swe prompts and their held-out splits). Idempotent.
    Tiny(TinyArgs),
}

/// Arguments of `cascade data tiny`.
#[derive(Args, Debug)]
pub struct TinyArgs {
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of the generators.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// SFT conversations.
    #[arg(long)]
    pub sft: Option<usize>,
    /// Preference pairs.
    #[arg(long)]
    pub prefs: Option<usize>,
    /// RL prompts per domain.
    #[arg(long)]
    pub rl: Option<usize>,
    /// Held-out prompts per domain.
    #[arg(long)]
    pub heldout: Option<usize>,
}

impl TinyArgs {
    /// The sizes asked for (defaults where not given).
    pub fn sizes(&self) -> TinySizes {
        let d = TinySizes::default();
        TinySizes {
            sft: self.sft.unwrap_or(d.sft),
            prefs: self.prefs.unwrap_or(d.prefs),
            rl: self.rl.unwrap_or(d.rl),
            heldout: self.heldout.unwrap_or(d.heldout),
        }
    }
}

/// Runs `cascade data ...`.
pub fn run(cmd: DataCommand) -> anyhow::Result<i32> {
    match cmd {
        DataCommand::Tiny(args) => {
            let manifest = write_tiny_data(&args.out, args.seed, &args.sizes())?;
            for (file, lines) in &manifest.files {
                println!("{:>6}  {}", lines, args.out.join(file).display());
            }
            println!("        {}", args.out.join(TINY_TOKENIZER).display());
            Ok(0)
        }
    }
}
