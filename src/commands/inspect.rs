//! `cascade inspect logprobs|generate`: look at what a model computes.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use candle_core::Tensor;
use cascade_actor::sampler::{sample_cpu, SampleKey, SamplingParams};
use cascade_shared::chat::{Chat, Message};
use cascade_shared::device::parse_device;
use cascade_shared::model::{load_model, CausalLm};
use cascade_shared::tokenizer::Tokenizer;
use cascade_shared::Mode;
use clap::{Args, Subcommand};

/// Inspect subcommands.
#[derive(Subcommand, Debug)]
pub enum InspectCommand {
    /// Per-token log-probs of a text or of token ids under a model.
    Logprobs(LogprobsArgs),
    /// Generate from a prompt (greedy at temperature 0).
    Generate(GenerateArgs),
}

/// Where the model lives and which device runs it.
#[derive(Args, Debug)]
pub struct ModelArgs {
    /// Hugging Face checkpoint directory (config.json, model.safetensors or a sharded index,
    /// tokenizer.json) — e.g. a snapshot directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Device: `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// Arguments of `cascade inspect logprobs`.
#[derive(Args, Debug)]
pub struct LogprobsArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Text to tokenize with the model's tokenizer (no special tokens added).
    #[arg(long, conflicts_with = "ids", required_unless_present = "ids")]
    text: Option<String>,
    /// Comma-separated token ids, e.g. `1,2,3`.
    #[arg(long, value_delimiter = ',')]
    ids: Option<Vec<u32>>,
    /// Print one JSON object `{"ids": [...], "logprobs": [null, lp1, ...]}`.
    #[arg(long)]
    json: bool,
}

/// Arguments of `cascade inspect generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// User message, rendered with the model's chat template and the mode flag.
    #[arg(long, conflicts_with = "ids", required_unless_present = "ids")]
    prompt: Option<String>,
    /// Thinking mode of the chat prompt.
    #[arg(long, default_value = "think", value_parser = ["think", "no_think"])]
    mode: String,
    /// Raw prompt token ids instead of a chat prompt, e.g. `1,2,3`.
    #[arg(long, value_delimiter = ',')]
    ids: Option<Vec<u32>>,
    /// Maximum number of tokens to generate.
    #[arg(long)]
    max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling mass (with temperature > 0).
    #[arg(long)]
    top_p: Option<f32>,
    /// Top-k truncation (with temperature > 0).
    #[arg(long)]
    top_k: Option<usize>,
    /// Seed of the sampler (with temperature > 0).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep generating past `<|im_end|>` / EOS.
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON object `{"generated_ids": [...], "text": "..."}`.
    #[arg(long)]
    json: bool,
}

/// Runs an inspect subcommand.
pub fn run(cmd: InspectCommand) -> anyhow::Result<i32> {
    match cmd {
        InspectCommand::Logprobs(args) => logprobs(args),
        InspectCommand::Generate(args) => generate(args),
    }
}

fn load(args: &ModelArgs) -> anyhow::Result<CausalLm> {
    let device = parse_device(&args.device).map_err(|e| anyhow::anyhow!("--device: {e}"))?;
    Ok(load_model(&args.model, &device)?)
}

fn tokenizer(dir: &Path) -> anyhow::Result<Tokenizer> {
    Tokenizer::from_dir(dir).with_context(|| format!("loading the tokenizer of {}", dir.display()))
}

fn logprobs(args: LogprobsArgs) -> anyhow::Result<i32> {
    let model = load(&args.model)?;
    let tok = match &args.text {
        Some(_) => Some(tokenizer(&args.model.model)?),
        None => None,
    };
    let ids = match (&args.text, &args.ids, &tok) {
        (Some(text), _, Some(tok)) => tok.encode(text)?,
        (_, Some(ids), _) => ids.clone(),
        _ => bail!("give --text or --ids"),
    };
    if ids.is_empty() {
        bail!("nothing to score: the input has no tokens");
    }
    let mut logprobs: Vec<Option<f32>> = vec![None];
    if ids.len() >= 2 {
        let input = Tensor::new(ids.as_slice(), model.device())?.unsqueeze(0)?;
        let lp: Vec<f32> = model.token_logprobs(&input, None)?.squeeze(0)?.to_vec1()?;
        logprobs.extend(lp.into_iter().map(Some));
    }
    if args.json {
        println!(
            "{}",
            serde_json::json!({ "ids": ids, "logprobs": logprobs })
        );
    } else {
        println!("{:>6} {:>8} {:>12}  token", "pos", "id", "logprob");
        for (i, (id, lp)) in ids.iter().zip(&logprobs).enumerate() {
            let piece = match &tok {
                Some(t) => format!("{:?}", t.decode(&[*id], false)?),
                None => String::new(),
            };
            let lp = lp.map(|v| format!("{v:.6}")).unwrap_or_else(|| "-".into());
            println!("{i:>6} {id:>8} {lp:>12}  {piece}");
        }
        let total: f32 = logprobs.iter().flatten().sum();
        println!(
            "sum of log-probs: {total:.6} over {} predicted tokens",
            ids.len() - 1
        );
    }
    Ok(0)
}

fn generate(args: GenerateArgs) -> anyhow::Result<i32> {
    let model = load(&args.model)?;
    let mode = Mode::parse(&args.mode).expect("clap restricts --mode");
    let tok = tokenizer(&args.model.model).ok();
    let prompt_ids = match (&args.prompt, &args.ids) {
        (Some(text), _) => {
            let chat = Chat::from_dir(&args.model.model)?;
            chat.encode_chat(&[Message::user(text.clone())], true, mode)?
        }
        (_, Some(ids)) => ids.clone(),
        _ => bail!("give --prompt or --ids"),
    };
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
    };
    params
        .validate()
        .map_err(|e| anyhow::anyhow!("sampling flags: {e}"))?;
    let mut stop: Vec<u32> = model.config().eos_token_ids();
    if let Some(t) = &tok {
        stop.extend(t.special().stop_ids());
    }
    if args.ignore_eos {
        stop.clear();
    }
    let mut position = 0u64;
    let generated = model.generate_one(&prompt_ids, args.max_new_tokens, &stop, |row| {
        let key = SampleKey {
            seed: args.seed,
            stream: 0,
            position,
        };
        position += 1;
        let s = sample_cpu(row, &params, &key)
            .map_err(|e| cascade_shared::model::ModelError::Config(e.to_string()))?;
        Ok(s.token)
    })?;
    let text = match &tok {
        Some(t) => t.decode(&generated, false)?,
        None => String::new(),
    };
    if args.json {
        println!(
            "{}",
            serde_json::json!({ "generated_ids": generated, "text": text })
        );
    } else {
        println!("{text}");
    }
    Ok(0)
}
