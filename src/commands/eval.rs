//! `cascade eval`: pass@1 / pass@k and mean reward of a model (a snapshot or any Hugging Face
//! checkpoint directory) on a JSONL prompt file, with the training verifiers.

use std::path::PathBuf;

use anyhow::{bail, Context};
use cascade_actor::dataset::Dataset;
use cascade_actor::eval::{evaluate, EvalOptions};
use cascade_actor::verifiers::verifier_for;
use cascade_shared::chat::Chat;
use cascade_shared::config::VerifierConfig;
use cascade_shared::device::parse_device;
use cascade_shared::model::load_model;
use cascade_shared::{Mode, StageKind};
use clap::Args;

/// Arguments of `cascade eval`.
#[derive(Args, Debug)]
pub struct EvalArgs {
    /// Model directory: a snapshot `RUN_DIR/snapshots/vNNNNNN` or a Hugging Face checkpoint.
    #[arg(long)]
    pub model: PathBuf,
    /// Prompts (JSONL with the domain's reference fields, as in training).
    #[arg(long)]
    pub data: PathBuf,
    /// Domain: math | if | code | swe | rlhf (default: inferred from the first line's fields).
    #[arg(long)]
    pub kind: Option<String>,
    /// Reward model directory (rlhf).
    #[arg(long)]
    pub reward_model: Option<PathBuf>,
    /// Judge model directory for the SWE semantic score (else the lexical ratio).
    #[arg(long)]
    pub judge: Option<PathBuf>,
    /// Mode: think | no_think (default: half and half, drawn per prompt).
    #[arg(long)]
    pub mode: Option<String>,
    /// Samples per prompt (pass@k is reported with k = samples).
    #[arg(long, default_value_t = 1)]
    pub samples: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.6)]
    pub temperature: f32,
    /// Nucleus threshold.
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Max response tokens.
    #[arg(long, default_value_t = 512)]
    pub max_new_tokens: usize,
    /// Rows decoded together.
    #[arg(long, default_value_t = 16)]
    pub gen_batch: usize,
    /// Use only the first N prompts (0 = all).
    #[arg(long, default_value_t = 0)]
    pub max_prompts: usize,
    /// Seed of the samplers.
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,
    /// Compute device.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Also write every sample as a JSON line (prompt_id, mode, response, reward, tokens).
    #[arg(long, value_name = "FILE")]
    pub dump: Option<PathBuf>,
}

/// The domain of a prompt file from the reference fields of its first line.
pub fn infer_kind(path: &std::path::Path) -> anyhow::Result<StageKind> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let first = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .with_context(|| format!("{} is empty", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(first)
        .with_context(|| format!("{}:1: not valid JSON", path.display()))?;
    Ok(if v.get("answer").is_some() {
        StageKind::Math
    } else if v.get("instruction_id_list").is_some() {
        StageKind::If
    } else if v.get("tests").is_some()
        || v.get("call_tests").is_some()
        || v.get("test_code").is_some()
    {
        StageKind::Code
    } else if v.get("gold_patch").is_some() {
        StageKind::Swe
    } else {
        StageKind::Rlhf
    })
}

/// Runs `cascade eval`.
pub fn run(args: EvalArgs) -> anyhow::Result<i32> {
    let device = parse_device(&args.device).map_err(|e| anyhow::anyhow!("--device: {e}"))?;
    let kind = match &args.kind {
        Some(k) => match StageKind::parse(k) {
            Some(StageKind::Sft) | None => {
                bail!("--kind {k:?}: expected math, if, code, swe or rlhf")
            }
            Some(k) => k,
        },
        None => infer_kind(&args.data)?,
    };
    let mode = match args.mode.as_deref() {
        None => None,
        Some(m) => Some(
            Mode::parse(m).with_context(|| format!("--mode {m:?}: expected think or no_think"))?,
        ),
    };
    if kind == StageKind::Rlhf && args.reward_model.is_none() {
        bail!("--reward-model is needed to score rlhf prompts (or pass --kind)");
    }
    let model = load_model(&args.model, &device)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let chat = Chat::from_dir(&args.model)?;
    let dataset = Dataset::load(&args.data, kind)?;
    let verifier = verifier_for(
        kind,
        &VerifierConfig::default(),
        args.reward_model.as_deref(),
        args.judge.as_deref(),
        &device,
    )?;
    let result = evaluate(
        model,
        &chat,
        &dataset,
        verifier,
        &EvalOptions {
            samples: args.samples,
            temperature: args.temperature,
            top_p: args.top_p,
            max_new_tokens: args.max_new_tokens,
            mode,
            mode_mix: 0.5,
            seed: args.seed,
            gen_batch: args.gen_batch,
            max_prompts: args.max_prompts,
        },
    )?;
    if let Some(path) = &args.dump {
        let mut text = String::new();
        for sample in &result.responses {
            text.push_str(&serde_json::to_string(sample)?);
            text.push('\n');
        }
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!(
            "{} prompts × {} samples ({kind}): mean reward {:.4} ± {:.4} (s.e. over prompts), pass@1 {:.4}, pass@{} {:.4}",
            result.all.prompts,
            result.samples,
            result.all.mean_reward,
            result.all.mean_reward_se,
            result.all.pass_at_1,
            result.samples,
            result.all.pass_at_k
        );
        for (mode, s) in &result.by_mode {
            println!(
                "  {mode:>8}: {} prompts, mean reward {:.4} ± {:.4}, pass@1 {:.4}, mean length {:.1} tokens",
                s.prompts, s.mean_reward, s.mean_reward_se, s.pass_at_1, s.response_len
            );
        }
    }
    Ok(0)
}
