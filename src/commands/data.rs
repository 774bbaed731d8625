//! `cascade data tiny`: writes the seeded synthetic datasets of the embedded tiny default.
//! `cascade data inspect`: how the trainer would read a dataset file (schema, rows, rejections).
//! `cascade data convert`: any supported dataset file to our canonical JSONL.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use cascade_datagen::{write_tiny, Domain, TinyManifest, TinySizes};
use cascade_shared::chat::ChatTemplate;
use cascade_shared::data::{DataReader, DataSpec, Kind, Outcome, Row, Schema};
use cascade_shared::{Mode, StageKind};
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
    /// Show how the trainer reads a dataset: the detected schema, the row count, the first rows
    /// as the trainer sees them (rendered prompt, reference fields) and every rejected row with
    /// its reason. Exit status 1 when no row is usable.
    Inspect(InspectArgs),
    /// Write our canonical JSONL from any supported dataset (JSONL or Parquet, any preset or
    /// mapping), in the input's row order; rejected rows are left out and reported on stderr.
    Convert(ConvertArgs),
}

/// Which dataset and how to read it (shared by `inspect` and `convert`).
#[derive(Args, Debug, Clone)]
pub struct DatasetArgs {
    /// A JSONL or Parquet file, a glob of shards (quote it) or a directory of shards.
    pub file: String,
    /// A preset name (see `cascade data inspect --help`) or a mapping
    /// `FIELD=PATH,...` (`prompt=question,answer=reward_model.ground_truth`, `json:` decodes a
    /// JSON-encoded string column). Detected from the columns when not given. Presets:
    /// cascade-sft, cascade-rl, cascade-pairs, nemotron-sft, nemotron-rlhf, nemotron-if,
    /// nemotron-math, nemotron-swe, verl, dapo-math, trl-sft, trl-pairs, openrlhf, aime, math-500,
    /// deepscaler, ifeval, livecodebench, apps (taco), code-contests, swe-bench (swe-gym),
    /// swe-smith, helpsteer3, skywork-preference.
    #[arg(long, value_parser = super::eval::parse_schema)]
    pub schema: Option<Schema>,
    /// The kind of rows wanted.
    #[arg(long, value_enum)]
    pub kind: Option<Kind>,
    /// The RL domain (rlhf, if, math, code, swe): rows are checked for the fields its verifier
    /// needs; veRL / OpenRLHF rows take their domain from it.
    #[arg(long, value_parser = parse_domain)]
    pub domain: Option<StageKind>,
    /// LiveCodeBench: keep problems with `contest_date` on or after this date (YYYY-MM-DD).
    #[arg(long)]
    pub since: Option<String>,
    /// LiveCodeBench: keep problems with `contest_date` before this date (YYYY-MM-DD).
    #[arg(long)]
    pub until: Option<String>,
    /// Threads that parse and map JSONL rows (0 = the machine's cores, at most 8); the rows
    /// and their order are the same for any count.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

fn parse_domain(s: &str) -> Result<StageKind, String> {
    StageKind::parse(s)
        .filter(|k| *k != StageKind::Sft)
        .ok_or_else(|| format!("{s:?} is not an RL domain (rlhf, if, math, code, swe)"))
}

impl DatasetArgs {
    /// The reader's spec.
    pub fn spec(&self) -> anyhow::Result<DataSpec> {
        Ok(DataSpec {
            path: self.file.clone(),
            schema: self.schema.clone(),
            kind: self.kind,
            domain: self.domain,
            since: self.since.clone(),
            until: self.until.clone(),
        })
    }

    /// The dataset, opened and indexed, with `--threads`.
    pub fn open(&self) -> anyhow::Result<DataReader> {
        let mut reader = DataReader::open(&self.spec()?)?;
        reader.set_parse_threads(self.threads);
        Ok(reader)
    }
}

/// Arguments of `cascade data inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    #[command(flatten)]
    pub data: DatasetArgs,
    /// How many accepted rows to show.
    #[arg(long, default_value_t = 3)]
    pub show: usize,
}

/// Arguments of `cascade data convert`.
#[derive(Args, Debug)]
pub struct ConvertArgs {
    #[command(flatten)]
    pub data: DatasetArgs,
    /// The canonical JSONL to write (written as OUT.tmp, then renamed).
    #[arg(long)]
    pub out: PathBuf,
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
    /// Held-out prompts of every domain and held-out preference pairs (default: 192 rlhf, if and
    /// code prompts, 480 math, 150 swe, 96 pairs).
    #[arg(long)]
    pub heldout: Option<usize>,
}

impl TinyArgs {
    /// The sizes asked for (defaults where not given).
    pub fn sizes(&self) -> TinySizes {
        let d = TinySizes::default();
        let sizes = TinySizes {
            sft: self.sft.unwrap_or(d.sft),
            prefs: self.prefs.unwrap_or(d.prefs),
            rl: self.rl.unwrap_or(d.rl),
            ..d
        };
        match self.heldout {
            Some(n) => sizes.with_heldout(n),
            None => sizes,
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
        DataCommand::Inspect(args) => inspect(&args, &mut std::io::stdout().lock()),
        DataCommand::Convert(args) => convert(&args),
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("      {l}\n")).collect()
}

/// How the trainer sees a row: the rendered conversation and the reference fields.
fn describe_row(template: &ChatTemplate, row: &Row) -> String {
    match row {
        Row::Rl(r) => {
            let rendered = template
                .render(&r.messages, true, Mode::Think)
                .unwrap_or_else(|e| format!("(cannot render: {e})"));
            let mut reference = r.reference.clone();
            if let Some(o) = reference.as_object_mut() {
                o.remove("prompt");
                o.remove("messages");
            }
            format!(
                "    id {}\n    prompt (rendered, think mode):\n{}    reference: {}\n",
                r.id,
                indent(&rendered),
                serde_json::to_string(&reference).unwrap_or_default()
            )
        }
        Row::Sft(s) => {
            let rendered = template
                .render(&s.messages, false, s.mode)
                .unwrap_or_else(|e| format!("(cannot render: {e})"));
            format!(
                "    mode {}\n    conversation (rendered):\n{}",
                s.mode.as_str(),
                indent(&rendered)
            )
        }
        Row::Pair(p) => format!(
            "    prompt:\n{}    chosen:\n{}    rejected:\n{}",
            indent(&p.prompt),
            indent(&p.chosen),
            indent(&p.rejected)
        ),
    }
}

/// Runs `cascade data inspect`, writing the report to `out`.
pub fn inspect(args: &InspectArgs, out: &mut dyn Write) -> anyhow::Result<i32> {
    let spec = args.data.spec()?;
    let reader = args.data.open()?;
    for f in reader.files() {
        let extra = match f {
            cascade_shared::data::RawFile::Parquet(p) => format!(", {} row groups", p.row_groups()),
            cascade_shared::data::RawFile::Jsonl(_) => String::new(),
        };
        writeln!(
            out,
            "file: {} ({:?}, {} rows{extra})",
            f.path().display(),
            f.format(),
            f.rows()
        )?;
    }
    writeln!(
        out,
        "schema: {} ({})",
        reader.schema().describe(),
        if spec.schema.is_some() {
            "given"
        } else {
            "detected"
        }
    )?;
    writeln!(out, "columns: {}", reader.files()[0].columns().join(", "))?;
    let domain = reader.domain().map(|d| d.as_str()).unwrap_or("per row");
    match reader.kind() {
        Kind::Rl => writeln!(out, "kind: rl (domain: {domain})")?,
        k => writeln!(out, "kind: {}", k.as_str())?,
    }
    writeln!(out, "rows: {}", reader.len())?;
    let template = ChatTemplate::chatml();
    let (mut accepted, mut rejected, mut skipped) = (0u64, Vec::new(), Vec::new());
    let mut shown = String::new();
    for r in reader.rows_from(0)? {
        let r = r?;
        match r.outcome {
            Outcome::Accepted(row) => {
                if (accepted as usize) < args.show {
                    shown.push_str(&format!(
                        "  row {}:\n{}",
                        r.index,
                        describe_row(&template, &row)
                    ));
                }
                accepted += 1;
            }
            Outcome::Rejected(e) => rejected.push(e),
            Outcome::Skipped(e) => skipped.push(e),
        }
    }
    writeln!(
        out,
        "accepted: {accepted}, rejected: {}, skipped: {}",
        rejected.len(),
        skipped.len()
    )?;
    if !shown.is_empty() {
        writeln!(out, "first rows as the trainer sees them:")?;
        out.write_all(shown.as_bytes())?;
    }
    if !rejected.is_empty() {
        writeln!(out, "rejected rows:")?;
        for e in &rejected {
            writeln!(out, "  {e}")?;
        }
    }
    if !skipped.is_empty() {
        writeln!(out, "skipped rows:")?;
        for e in &skipped {
            writeln!(out, "  {e}")?;
        }
    }
    Ok(if accepted == 0 { 1 } else { 0 })
}

/// Runs `cascade data convert`.
pub fn convert(args: &ConvertArgs) -> anyhow::Result<i32> {
    let reader = args.data.open()?;
    let tmp = args.out.with_extension("jsonl.tmp");
    let file =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut w = std::io::BufWriter::new(file);
    let (mut accepted, mut rejected, mut skipped) = (0u64, 0u64, 0u64);
    for r in reader.rows_from(0)? {
        match r?.outcome {
            Outcome::Accepted(row) => {
                serde_json::to_writer(&mut w, &row.to_canonical())?;
                w.write_all(b"\n")?;
                accepted += 1;
            }
            Outcome::Rejected(e) => {
                eprintln!("rejected: {e}");
                rejected += 1;
            }
            Outcome::Skipped(e) => {
                eprintln!("skipped: {e}");
                skipped += 1;
            }
        }
    }
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    drop(file);
    if accepted == 0 {
        std::fs::remove_file(&tmp).ok();
        anyhow::bail!(
            "{}: no row accepted ({rejected} rejected, {skipped} skipped); nothing written",
            args.data.file
        );
    }
    std::fs::rename(&tmp, &args.out)
        .with_context(|| format!("renaming {} to {}", tmp.display(), args.out.display()))?;
    eprintln!(
        "{}: {accepted} rows written ({} schema), {rejected} rejected, {skipped} skipped",
        args.out.display(),
        reader.schema().describe()
    );
    Ok(0)
}
