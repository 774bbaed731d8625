//! `cascade data tiny`: writes the seeded synthetic datasets of the embedded tiny default.

use std::path::PathBuf;

use anyhow::Context;
use cascade_datagen::{write_tiny, TinySizes};
use clap::{Args, Subcommand};

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
            let manifest = write_tiny(&args.out, args.seed, &args.sizes())
                .with_context(|| format!("writing the tiny datasets to {}", args.out.display()))?;
            for (file, lines) in &manifest.files {
                println!("{:>6}  {}", lines, args.out.join(file).display());
            }
            Ok(0)
        }
    }
}
