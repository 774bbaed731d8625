//! `cascade score`: score JSONL responses with the verifiers, one JSON line out per line in.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;

use anyhow::Context;
use cascade_actor::judge::JudgeScorer;
use cascade_actor::reward_model::RewardModel;
use cascade_rewards::code::{CodeConfig, SandboxConfig};
use cascade_rewards::swe::{LexicalFallback, SemanticScorer, TestScorer};
use cascade_rewards::{CodeVerifier, Scorer, SweVerifier};
use cascade_shared::device::parse_device;
use clap::Args;

/// Arguments of `cascade score`.
///
/// Input lines: `{"domain": "math|if|code|swe|rm", "response": "...", ...reference fields}`.
/// Output lines, in input order: `{"line": n, "domain": d, "reward": r, "details": {...}}`, or
/// `{"line": n, ..., "reward": null, "error": "..."}` for a line that could not be scored.
/// Exit code 0 when every line was scored, 2 when some lines were reported as errors.
/// `swe` lines that carry their repository and a test (`files`, `test_code`, `entry_point`) get
/// their semantic score by running it on the patched file; others from `--judge DIR` (else the
/// lexical fallback); `rm`
/// lines need `--reward-model DIR` (else each is an error line).
#[derive(Args, Debug)]
pub struct ScoreArgs {
    /// JSONL file to score (`-` for stdin).
    #[arg(long)]
    pub input: PathBuf,
    /// Where to write the scored lines (default: stdout).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Verifications running at once (code runs one sandboxed interpreter per verification).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Python interpreter for the code sandbox (default: /usr/bin/python3, else python3 on PATH).
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Wall-clock limit per code test run for lines without `timeout_s`, in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub code_timeout_s: f64,
    /// Judge model directory (config, safetensors, tokenizer, chat template) for the semantic
    /// score of `swe` lines: P("YES") / (P("YES") + P("NO")) for "do the two patches fix the
    /// same issue?". Without it the semantic score falls back to the lexical ratio (and the
    /// line's details say so).
    #[arg(long, value_name = "DIR")]
    pub judge: Option<PathBuf>,
    /// Reward-model directory (our RM save, or a transformers `*ForSequenceClassification`
    /// checkpoint with `num_labels = 1`) for `rm` lines: reward = the model's score of
    /// (`prompt`, final answer of `response`).
    #[arg(long, value_name = "DIR")]
    pub reward_model: Option<PathBuf>,
    /// Device of the judge and reward models: `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// Builds the domain → verifier map. Domains whose verifier cannot run here are registered as
/// unavailable, so their lines get a per-line error and the rest is still scored. A judge or
/// reward model that was asked for but does not load is an error of the whole command.
fn build_scorer(args: &ScoreArgs) -> anyhow::Result<Scorer> {
    let mut scorer = Scorer::new();
    scorer.register("math", Box::new(cascade_rewards::MathVerifier::default()));
    scorer.register("if", Box::new(cascade_rewards::IfEvalVerifier::default()));
    let device = if args.judge.is_some() || args.reward_model.is_some() {
        Some(parse_device(&args.device).map_err(|e| anyhow::anyhow!("--device: {e}"))?)
    } else {
        None
    };
    let code = CodeConfig {
        sandbox: SandboxConfig {
            python: args.python.clone(),
            ..SandboxConfig::default()
        },
        default_timeout_s: args.code_timeout_s,
    };
    let semantic: Box<dyn SemanticScorer> = match (&args.judge, &device) {
        (Some(dir), Some(device)) => Box::new(
            JudgeScorer::load(dir, device)
                .with_context(|| format!("loading the judge model {}", dir.display()))?,
        ),
        _ => Box::new(LexicalFallback),
    };
    // Rows that carry their repository and a test are scored by running it (see
    // `cascade_rewards::swe::execute`); the sandbox is probed only when one does.
    scorer.register(
        "swe",
        Box::new(SweVerifier::new(Box::new(TestScorer::new(
            code.clone(),
            semantic,
        )))),
    );
    // Probing the sandbox prints one line saying what is isolated on this machine.
    match CodeVerifier::new(code) {
        Ok(v) => scorer.register("code", Box::new(v)),
        Err(e) => {
            eprintln!("warning: code verifier unavailable: {e}");
            scorer.mark_unavailable("code", format!("code sandbox unavailable: {e}"));
        }
    }
    match (&args.reward_model, &device) {
        (Some(dir), Some(device)) => {
            let rm = RewardModel::load(dir, device)
                .with_context(|| format!("loading the reward model {}", dir.display()))?;
            scorer.register("rm", Box::new(rm));
        }
        _ => scorer.mark_unavailable("rm", "domain rm needs --reward-model DIR"),
    }
    Ok(scorer)
}

/// Runs `cascade score`.
pub fn run(args: ScoreArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.workers >= 1, "--workers must be at least 1");
    let input: Box<dyn BufRead> = if args.input.as_os_str() == "-" {
        Box::new(BufReader::new(std::io::stdin()))
    } else {
        let file = std::fs::File::open(&args.input)
            .with_context(|| format!("opening {}", args.input.display()))?;
        Box::new(BufReader::new(file))
    };
    // Models load before the output file is created, so a bad --judge leaves no empty output.
    let scorer = build_scorer(&args)?;
    let output: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(BufWriter::new(std::io::stdout().lock())),
    };
    let summary = scorer
        .score_stream(input, output, args.workers)
        .with_context(|| format!("scoring {}", args.input.display()))?;
    eprintln!("scored {} lines, {} errors", summary.scored, summary.errors);
    Ok(if summary.errors == 0 { 0 } else { 2 })
}
