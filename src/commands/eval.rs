//! `cascade eval`: pass@1 / pass@k and mean reward of a model (a snapshot or any Hugging Face
//! checkpoint directory) on a prompt dataset (JSONL or Parquet, a file, glob or directory of
//! shards, in our layout or a public one), with the training verifiers.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use cascade_actor::dataset::Dataset;
use cascade_actor::eval::{evaluate, EvalOptions};
use cascade_actor::verifiers::verifier_for;
use cascade_shared::chat::Chat;
use cascade_shared::config::VerifierConfig;
use cascade_shared::data::{DataReader, DataSpec, Kind, Outcome, Row, Schema};
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
    /// Prompts: a JSONL or Parquet file, a glob or a directory of shards, read as in training.
    #[arg(long)]
    pub data: PathBuf,
    /// The dataset's layout: a preset name or a `FIELD=PATH,...` column mapping, as a config's
    /// `schema` and `cascade data inspect --schema` take it (default: recognised from the
    /// columns).
    #[arg(long, value_parser = parse_schema)]
    pub schema: Option<Schema>,
    /// Domain: math | if | code | swe | rlhf (default: the schema's, else inferred from the
    /// reference fields of the first usable row).
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

/// `--schema`, parsed as a config's `schema` is.
pub(crate) fn parse_schema(text: &str) -> Result<Schema, String> {
    Schema::parse(text).map_err(|e| e.to_string())
}

/// The domain of a canonical RL object: its `domain`, else the reference fields it has.
fn domain_of(reference: &serde_json::Value) -> StageKind {
    let has = |k: &str| reference.get(k).is_some();
    if let Some(d) = reference
        .get("domain")
        .and_then(serde_json::Value::as_str)
        .and_then(StageKind::parse)
        .filter(|d| *d != StageKind::Sft)
    {
        d
    } else if has("answer") {
        StageKind::Math
    } else if has("instruction_id_list") {
        StageKind::If
    } else if has("gold_patch") {
        // Before the code fields: an SWE row may carry its repository's test (`test_code`).
        StageKind::Swe
    } else if has("tests") || has("call_tests") || has("test_code") {
        StageKind::Code
    } else {
        StageKind::Rlhf
    }
}

/// The domain of a prompt dataset read with `schema` (detected when `None`): the one the
/// schema fixes, else the one of its first usable row (its `domain`, else its reference
/// fields).
pub fn infer_kind(data: &Path, schema: Option<&Schema>) -> anyhow::Result<StageKind> {
    let reader = DataReader::open(&DataSpec {
        path: data.display().to_string(),
        schema: schema.cloned(),
        kind: Some(Kind::Rl),
        ..DataSpec::default()
    })?;
    if let Some(d) = reader.domain() {
        return Ok(d);
    }
    for r in reader.rows_from(0)? {
        if let Outcome::Accepted(Row::Rl(row)) = r?.outcome {
            return Ok(domain_of(&row.reference));
        }
    }
    bail!(
        "{}: no usable prompt (see `cascade data inspect`)",
        data.display()
    )
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
        None => infer_kind(&args.data, args.schema.as_ref())?,
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
    let dataset = Dataset::open(&DataSpec {
        path: args.data.display().to_string(),
        schema: args.schema.clone(),
        kind: Some(Kind::Rl),
        domain: Some(kind),
        ..DataSpec::default()
    })?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn domains_are_inferred_from_reference_fields() {
        let swe = json!({"gold_patch": "--- a/f.py\n", "files": {"f.py": ""},
                         "test_code": "def check(c): pass", "entry_point": "f"});
        assert_eq!(
            domain_of(&swe),
            StageKind::Swe,
            "a patch row with its test is SWE"
        );
        let code = json!({"test_code": "def check(c): pass", "entry_point": "f"});
        assert_eq!(domain_of(&code), StageKind::Code);
        assert_eq!(domain_of(&json!({"answer": "4"})), StageKind::Math);
        assert_eq!(
            domain_of(&json!({"domain": "code", "answer": "4"})),
            StageKind::Code
        );
        assert_eq!(domain_of(&json!({})), StageKind::Rlhf);
    }
}
