//! Seeded synthetic datasets of the embedded tiny default (`cascade data tiny`).
//!
//! The tiny default trains a ~1M-parameter model (a 1024-token byte-level BPE vocabulary that
//! `cascade data tiny` trains on the training files, ChatML template, `/think` and `/no_think`
//! modes) on two CPU cores in minutes: SFT first teaches the formats, then the GRPO stages
//! rlhf → if → math → code → swe must each visibly raise their domain's held-out reward. That
//! budget shapes every choice here:
//!
//! * **Short texts.** The model has a short context and little capacity (and the texts were
//!   first sized for one token per byte), so prompts stay within [`MAX_PROMPT_BYTES`] (76; most
//!   are 20–70 bytes), direct answers around 40 bytes, thinking under 40 bytes, and code or
//!   diff answers about 90 bytes (100 at most). SFT rows fit in 80 bytes of user text and 160
//!   bytes of assistant text (checked by the tests).
//! * **Small templates.** Each domain is a handful of sentence templates over small tables
//!   (topics, names, numbers, function shapes), so the model can learn the structure, and
//!   whatever must be right — a digit, an operator, a keyword, a file name — is readable
//!   from the prompt: `What is 3 + 4?` → `\boxed{7}`; `… returns x plus 3.` → `return x + 3`;
//!   `Use the word lovely.` → `… and lovely.`; the SWE prompt shows the buggy line and the
//!   expression it should return.
//! * **Verifiable gold.** Every RL prompt comes from a generator that also writes its gold
//!   response (a [`Task`]); SFT rows are those gold responses, and the tests score them with the
//!   real verifiers of `cascade-rewards` (1.0), and a deliberately wrong answer (< 1). The
//!   instruction-following generator also runs `cascade-rewards`' IFEval checks on each draw and
//!   redraws a gold answer they reject (see [`instruct`]).
//! * **Only what the tiny model can learn.** No instruction-following prompt asks for capitals
//!   (IFEval's `change_case:english_capital`): this tokenizer writes upper-case words a letter at
//!   a time, RL on that constraint taught letter loops instead of capitals, and without it in RL
//!   the if stage's lowercase training undid what SFT had taught (see [`instruct`]).
//! * **No surface cue that contradicts another domain.** The reward model's chosen answers
//!   include the short sentence that word-limit answers are (see [`chat::concise_answer`]).
//!
//! # Files
//! `sft.jsonl`, `sft-mix.jsonl` (the SFT rows of the verifiable domains, for the RL stages'
//! `sft_mix`; see [`TinyData::sft_mix_rows`]), `prefs.jsonl`, `prefs-heldout.jsonl`, and
//! `{rlhf,if,math,code,swe}.jsonl` with their `-heldout.jsonl` twins, then `MANIFEST.json` (see
//! [`write_tiny`]). Formats are those of the actor's dataset loader and the verifiers: `prompt` plus `answer` (math),
//! `instruction_id_list` + `kwargs` (if, IFEval's JSONL format), `test_code` + `entry_point`
//! (code, HumanEval style), `gold_patch` plus the repository and its test (`files`, `test_code`, `entry_point`; swe),
//! nothing extra (rlhf); every line has an `id`.
//!
//! # Determinism and held-out disjointness
//! Everything is drawn from ChaCha8 streams seeded by the run seed, one stream per (domain,
//! purpose), so the same seed gives byte-identical files and one file's size does not shift the
//! contents of another. Held-out sets are drawn **first**; their prompts (all domains, plus the
//! held-out preference prompts) form one exclusion set, and every training draw — RL prompts,
//! SFT rows, preference pairs — rejects a prompt whose text is in it. Within a file, RL prompts
//! are also unique by text. Duplicates are judged on the exact prompt string, which is what
//! the model sees (the chat template only adds the mode flag).
#![warn(missing_docs)]

pub mod chat;
pub mod code;
pub mod common;
pub mod instruct;
pub mod math;
pub mod swe;

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub use chat::{Flaw, PrefPair};
pub use common::{Domain, Mode, Task, MAX_PROMPT_BYTES};

use common::{draw_excluding, draw_unique, stream, Purpose};

/// Bumped whenever the generated data changes for a given seed and sizes.
pub const GENERATOR_VERSION: u32 = 10;

/// Name of the manifest, written last.
pub const MANIFEST: &str = "MANIFEST.json";

/// How many lines each file gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TinySizes {
    /// SFT rows (`sft.jsonl`), spread evenly over the five domains.
    pub sft: usize,
    /// Training preference pairs (`prefs.jsonl`).
    pub prefs: usize,
    /// Training RL prompts per domain (`{domain}.jsonl`).
    pub rl: usize,
    /// Held-out prompts of each domain (`{domain}-heldout.jsonl`), in [`Domain::ALL`] order.
    pub heldout: [usize; Domain::ALL.len()],
    /// Held-out preference pairs (`prefs-heldout.jsonl`).
    pub heldout_pairs: usize,
}

impl Default for TinySizes {
    fn default() -> Self {
        TinySizes {
            sft: 2400,
            prefs: 600,
            rl: 400,
            // The RL stages' own gains (+0.03…+0.15 at this size) spread widely over prompts,
            // and 96 held-out prompts left real gains within 2 standard errors (issue 19): every
            // domain has more, math the most (its prompts are plentiful, its gains the
            // smallest). Code and swe have few distinct prompts (~710 and ~560), so their sets
            // stop where 400 training prompts still fit beside them.
            heldout: [192, 192, 480, 192, 150],
            heldout_pairs: 96,
        }
    }
}

impl TinySizes {
    /// Every domain's held-out prompts and the held-out pairs at `n` (`cascade data tiny --heldout`).
    pub fn with_heldout(self, n: usize) -> Self {
        TinySizes {
            heldout: [n; 5],
            heldout_pairs: n,
            ..self
        }
    }

    /// Held-out prompts of domain `d`.
    pub fn heldout_of(&self, d: Domain) -> usize {
        self.heldout[d.index() as usize]
    }

    /// Lines of `sft-mix.jsonl`: the SFT rows (round-robin over [`Domain::ALL`]) whose domain
    /// is not [`Domain::Rlhf`].
    pub fn sft_mix(&self) -> usize {
        (0..self.sft)
            .filter(|i| Domain::ALL[i % Domain::ALL.len()] != Domain::Rlhf)
            .count()
    }

    /// File name → line count of a dataset of these sizes.
    pub fn file_lines(&self) -> BTreeMap<String, usize> {
        let mut files = BTreeMap::new();
        files.insert("sft.jsonl".to_string(), self.sft);
        files.insert("sft-mix.jsonl".to_string(), self.sft_mix());
        files.insert("prefs.jsonl".to_string(), self.prefs);
        files.insert("prefs-heldout.jsonl".to_string(), self.heldout_pairs);
        for d in Domain::ALL {
            files.insert(format!("{}.jsonl", d.name()), self.rl);
            files.insert(format!("{}-heldout.jsonl", d.name()), self.heldout_of(d));
        }
        files
    }
}

/// What `MANIFEST.json` records: the seed, the generator version and each file's line count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TinyManifest {
    /// The run seed.
    pub seed: u64,
    /// [`GENERATOR_VERSION`] at generation time.
    pub generator_version: u32,
    /// File name → number of lines.
    pub files: BTreeMap<String, usize>,
}

/// Errors of dataset generation.
#[derive(Debug, thiserror::Error)]
pub enum DatagenError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// JSON serialisation failed.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// A generator has fewer distinct prompts than asked for.
    #[error("{what}: asked for {wanted} distinct prompts, found only {got}; use smaller sizes")]
    Exhausted {
        /// Which draw.
        what: String,
        /// How many were asked for.
        wanted: usize,
        /// How many distinct ones were found.
        got: usize,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DatagenError + '_ {
    move |source| DatagenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One SFT row: a gold task and the mode its response is written in.
#[derive(Debug, Clone, PartialEq)]
pub struct SftRow {
    /// The task (prompt, reference, gold).
    pub task: Task,
    /// The mode of the assistant message.
    pub mode: Mode,
}

impl SftRow {
    /// The `sft.jsonl` line.
    pub fn line(&self, id: u64) -> Value {
        json!({
            "id": id,
            "messages": [
                {"role": "user", "content": self.task.prompt},
                {"role": "assistant", "content": self.task.response(self.mode)},
            ],
            "mode": self.mode.as_str(),
        })
    }
}

/// The whole tiny dataset in memory, with the gold response of every prompt.
#[derive(Debug, Clone)]
pub struct TinyData {
    /// The seed it was drawn from.
    pub seed: u64,
    /// Held-out RL prompts per domain.
    pub heldout: BTreeMap<Domain, Vec<Task>>,
    /// Training RL prompts per domain.
    pub train: BTreeMap<Domain, Vec<Task>>,
    /// SFT rows (domains round-robin, modes alternating).
    pub sft: Vec<SftRow>,
    /// Training preference pairs.
    pub prefs: Vec<PrefPair>,
    /// Held-out preference pairs.
    pub prefs_heldout: Vec<PrefPair>,
}

/// Draws the dataset of `seed` and `sizes` (what [`write_tiny`] writes).
pub fn generate(seed: u64, sizes: &TinySizes) -> Result<TinyData, DatagenError> {
    let none = HashSet::new();
    let mut heldout = BTreeMap::new();
    let mut exclude: HashSet<String> = HashSet::new();
    for d in Domain::ALL {
        let mut rng = stream(seed, d, Purpose::Heldout);
        let tasks = draw_unique(
            &mut rng,
            d,
            sizes.heldout_of(d),
            &none,
            &format!("{}-heldout", d.name()),
        )?;
        exclude.extend(tasks.iter().map(|t| t.prompt.clone()));
        heldout.insert(d, tasks);
    }
    let mut rng = stream(seed, Domain::Rlhf, Purpose::PrefsHeldout);
    let mut prefs_heldout = Vec::with_capacity(sizes.heldout_pairs);
    let mut seen = HashSet::new();
    for _ in 0..(200 * sizes.heldout_pairs + 1000) {
        if prefs_heldout.len() == sizes.heldout_pairs {
            break;
        }
        let p = chat::sample_pair(&mut rng);
        if seen.insert(p.prompt.clone()) {
            prefs_heldout.push(p);
        }
    }
    if prefs_heldout.len() < sizes.heldout_pairs {
        return Err(DatagenError::Exhausted {
            what: "prefs-heldout".into(),
            wanted: sizes.heldout_pairs,
            got: prefs_heldout.len(),
        });
    }
    exclude.extend(prefs_heldout.iter().map(|p| p.prompt.clone()));

    let mut train = BTreeMap::new();
    for d in Domain::ALL {
        let mut rng = stream(seed, d, Purpose::Train);
        let tasks = draw_unique(&mut rng, d, sizes.rl, &exclude, d.name())?;
        train.insert(d, tasks);
    }

    let mut rng = stream(seed, Domain::Rlhf, Purpose::Prefs);
    let mut prefs = Vec::with_capacity(sizes.prefs);
    let mut attempts = 0;
    while prefs.len() < sizes.prefs {
        attempts += 1;
        if attempts > 200 * sizes.prefs + 1000 {
            return Err(DatagenError::Exhausted {
                what: "prefs".into(),
                wanted: sizes.prefs,
                got: prefs.len(),
            });
        }
        let p = chat::sample_pair(&mut rng);
        if !exclude.contains(&p.prompt) {
            prefs.push(p);
        }
    }

    let mut sft_rngs: Vec<_> = Domain::ALL
        .iter()
        .map(|&d| stream(seed, d, Purpose::Sft))
        .collect();
    let mut sft = Vec::with_capacity(sizes.sft);
    for i in 0..sizes.sft {
        let k = i % Domain::ALL.len();
        let d = Domain::ALL[k];
        let task = draw_excluding(&mut sft_rngs[k], d, &exclude, "sft")?;
        let mode = if i % 2 == 0 {
            Mode::Think
        } else {
            Mode::NoThink
        };
        sft.push(SftRow { task, mode });
    }

    Ok(TinyData {
        seed,
        heldout,
        train,
        sft,
        prefs,
        prefs_heldout,
    })
}

fn jsonl(lines: impl Iterator<Item = Value>) -> String {
    let mut s = String::new();
    for l in lines {
        s.push_str(&l.to_string());
        s.push('\n');
    }
    s
}

impl TinyData {
    /// The rows of `sft-mix.jsonl`, with their `sft.jsonl` ids: every SFT row except the chat
    /// (rlhf) domain's. The RL stages after SFT mix these supervised rows into their steps
    /// (`sft_mix`, PPO-ptx) to hold the verifiable domains, whose gold answers their rewards
    /// also score 1. The chat rows are left out because the rlhf stage teaches answers that
    /// the reward model ranks above the SFT ones: at each later stage, those SFT rows pulled
    /// the chat answers back to what the reward model scores lower (issue 19).
    pub fn sft_mix_rows(&self) -> impl Iterator<Item = (u64, &SftRow)> {
        (0..)
            .zip(&self.sft)
            .filter(|(_, r)| r.task.domain != Domain::Rlhf)
    }

    /// Every file as (name, contents), in writing order.
    pub fn files(&self) -> Vec<(String, String)> {
        let mut out = vec![
            (
                "sft.jsonl".to_string(),
                jsonl(self.sft.iter().zip(0..).map(|(r, i)| r.line(i))),
            ),
            (
                "sft-mix.jsonl".to_string(),
                jsonl(self.sft_mix_rows().map(|(i, r)| r.line(i))),
            ),
            (
                "prefs.jsonl".to_string(),
                jsonl(self.prefs.iter().zip(0..).map(|(p, i)| p.line(i))),
            ),
            (
                "prefs-heldout.jsonl".to_string(),
                jsonl(self.prefs_heldout.iter().zip(0..).map(|(p, i)| p.line(i))),
            ),
        ];
        for d in Domain::ALL {
            for (suffix, set) in [("", &self.train), ("-heldout", &self.heldout)] {
                let tasks = &set[&d];
                out.push((
                    format!("{}{suffix}.jsonl", d.name()),
                    jsonl(tasks.iter().zip(0..).map(|(t, i)| t.line(i))),
                ));
            }
        }
        out
    }
}

/// Writes `contents` to `path` through `path.tmp` and a rename, so `path` is either absent,
/// the old file, or the complete new one.
fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), DatagenError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp).map_err(io_err(&tmp))?;
    f.write_all(contents).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

/// The manifest in `dir`, if it exists, parses and matches `seed`, this generator version and
/// `sizes`, and every file it lists exists.
fn current_manifest(dir: &Path, seed: u64, sizes: &TinySizes) -> Option<TinyManifest> {
    let text = std::fs::read_to_string(dir.join(MANIFEST)).ok()?;
    let m: TinyManifest = serde_json::from_str(&text).ok()?;
    let fresh = m.seed == seed
        && m.generator_version == GENERATOR_VERSION
        && m.files == sizes.file_lines()
        && m.files.keys().all(|f| dir.join(f).is_file());
    fresh.then_some(m)
}

/// Writes the tiny dataset of `seed` and `sizes` into `dir` (created if needed) and returns its
/// manifest.
///
/// Each file goes to `name.tmp` first and is renamed into place, so a crash never leaves a half
/// file under its real name; `MANIFEST.json` is removed before and written after all the data,
/// so its presence means the set is complete. When `dir` already holds a manifest with the same
/// seed, generator version and sizes (and its files), nothing is rewritten and that manifest is
/// returned.
pub fn write_tiny(dir: &Path, seed: u64, sizes: &TinySizes) -> Result<TinyManifest, DatagenError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    if let Some(m) = current_manifest(dir, seed, sizes) {
        return Ok(m);
    }
    let manifest_path = dir.join(MANIFEST);
    match std::fs::remove_file(&manifest_path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(&manifest_path)(e)),
    }
    let data = generate(seed, sizes)?;
    let mut files = BTreeMap::new();
    for (name, contents) in data.files() {
        write_atomic(&dir.join(&name), contents.as_bytes())?;
        files.insert(name, contents.lines().count());
    }
    let manifest = TinyManifest {
        seed,
        generator_version: GENERATOR_VERSION,
        files,
    };
    let mut text = serde_json::to_string_pretty(&manifest)?;
    text.push('\n');
    write_atomic(&manifest_path, text.as_bytes())?;
    // Make the renames durable; a directory that cannot be synced (some filesystems) is no error.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(manifest)
}
