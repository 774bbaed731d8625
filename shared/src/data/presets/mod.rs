//! The built-in layouts ("presets"), their detection from a file's columns, and the mapping of
//! a row of each onto our canonical object.
//!
//! Detection looks at the top-level columns and the first non-null value of each in the first
//! rows (a [`Probe`]): every preset whose signature matches scores the number of columns it
//! recognises, and the highest score wins. A tie between presets that map rows differently is
//! an error listing the columns and the candidates (give `--schema`).

mod chat;
mod code;
mod math;
mod swe;

use serde_json::{Map, Value};

use super::reader::Kind;
use super::record::{FieldError, FieldResult};
use crate::StageKind;

pub use chat::{sft_mode_from, strip_empty_think};

/// A built-in layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Preset {
    /// Our SFT JSONL: `messages`, `mode`.
    CascadeSft,
    /// Our RL JSONL: `prompt` or `messages`, `id`, the reference fields of the domain.
    CascadeRl,
    /// Our preference JSONL: string `prompt`, `chosen`, `rejected`.
    CascadePairs,
    /// Nemotron-Cascade SFT: `messages`; the mode from a `<think>` block, a `thinking` /
    /// `reasoning` column or a system prompt.
    NemotronSft,
    /// Nemotron-Cascade RL-RLHF: `prompt` as a message list.
    NemotronRlhf,
    /// Nemotron-Cascade RL-Instruction-Following: `prompt`, `instruction_id_list`, `kwargs`
    /// (unused keys null).
    NemotronIf,
    /// Nemotron-Cascade RL-Math: `problem`, `answer`.
    NemotronMath,
    /// Nemotron-Cascade RL-SWE: `prompt`, `golden_patch`.
    NemotronSwe,
    /// veRL: `prompt` (message list), `reward_model.ground_truth`, `data_source`, `extra_info`.
    Verl,
    /// DAPO-Math-17k (veRL layout, `data_source` math_dapo).
    DapoMath,
    /// TRL prompt/completion SFT (string or conversational).
    TrlSft,
    /// TRL preference (`chosen` / `rejected`, optional `prompt`; string or conversational).
    TrlPairs,
    /// OpenRLHF-style `input` / `label`.
    OpenRlhf,
    /// AIME 2024 (`problem`, `answer`, `url`, `year`) / AIME 2025 (`question`, `answer`).
    Aime,
    /// MATH-500: `problem`, `solution`, `answer`, `subject`, `level`, `unique_id`.
    Math500,
    /// DeepScaleR: `problem`, `answer`, `solution`.
    DeepScaleR,
    /// IFEval `input_data.jsonl`: `key`, `prompt`, `instruction_id_list`, `kwargs`.
    IfEval,
    /// LiveCodeBench code generation.
    LiveCodeBench,
    /// APPS / TACO: `question`, `input_output` (optional `fn_name`), `starter_code`.
    Apps,
    /// CodeContests: `description`, `public_tests` / `private_tests` / `generated_tests`.
    CodeContests,
    /// SWE-bench / SWE-Gym: `problem_statement`, `patch` (gold), `test_patch`, `instance_id`.
    SweBench,
    /// SWE-smith: its `patch` introduces the bug; the gold fix is the reverse.
    SweSmith,
    /// HelpSteer3 preference: `context`, `response1`, `response2`, `overall_preference`.
    HelpSteer3,
    /// Skywork-Reward-Preference: `chosen` / `rejected` conversations, `source`.
    Skywork,
}

/// What mapping one row gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Mapped {
    /// The canonical object of the row.
    Row(Map<String, Value>),
    /// Left out on purpose (a tie, a date outside the asked range), with why.
    Skip(String),
}

/// Options a preset's mapping takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MapOptions {
    /// The RL domain, when the user names it (veRL / OpenRLHF rows need one, unless the
    /// `data_source` tells).
    pub domain: Option<StageKind>,
    /// LiveCodeBench: keep problems with `contest_date` ≥ this (ISO date prefix compare).
    pub since: Option<String>,
    /// LiveCodeBench: keep problems with `contest_date` < this.
    pub until: Option<String>,
}

impl Preset {
    /// Every preset.
    pub const ALL: [Preset; 24] = [
        Preset::CascadeSft,
        Preset::CascadeRl,
        Preset::CascadePairs,
        Preset::NemotronSft,
        Preset::NemotronRlhf,
        Preset::NemotronIf,
        Preset::NemotronMath,
        Preset::NemotronSwe,
        Preset::Verl,
        Preset::DapoMath,
        Preset::TrlSft,
        Preset::TrlPairs,
        Preset::OpenRlhf,
        Preset::Aime,
        Preset::Math500,
        Preset::DeepScaleR,
        Preset::IfEval,
        Preset::LiveCodeBench,
        Preset::Apps,
        Preset::CodeContests,
        Preset::SweBench,
        Preset::SweSmith,
        Preset::HelpSteer3,
        Preset::Skywork,
    ];

    /// The name `--schema` takes.
    pub fn name(self) -> &'static str {
        match self {
            Preset::CascadeSft => "cascade-sft",
            Preset::CascadeRl => "cascade-rl",
            Preset::CascadePairs => "cascade-pairs",
            Preset::NemotronSft => "nemotron-sft",
            Preset::NemotronRlhf => "nemotron-rlhf",
            Preset::NemotronIf => "nemotron-if",
            Preset::NemotronMath => "nemotron-math",
            Preset::NemotronSwe => "nemotron-swe",
            Preset::Verl => "verl",
            Preset::DapoMath => "dapo-math",
            Preset::TrlSft => "trl-sft",
            Preset::TrlPairs => "trl-pairs",
            Preset::OpenRlhf => "openrlhf",
            Preset::Aime => "aime",
            Preset::Math500 => "math-500",
            Preset::DeepScaleR => "deepscaler",
            Preset::IfEval => "ifeval",
            Preset::LiveCodeBench => "livecodebench",
            Preset::Apps => "apps",
            Preset::CodeContests => "code-contests",
            Preset::SweBench => "swe-bench",
            Preset::SweSmith => "swe-smith",
            Preset::HelpSteer3 => "helpsteer3",
            Preset::Skywork => "skywork-preference",
        }
    }

    /// The preset called `name` (`taco` and `swe-gym` are aliases).
    pub fn from_name(name: &str) -> Option<Preset> {
        match name {
            "taco" => return Some(Preset::Apps),
            "swe-gym" => return Some(Preset::SweBench),
            _ => {}
        }
        Preset::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The kind of rows it gives.
    pub fn kind(self) -> Kind {
        match self {
            Preset::CascadeSft | Preset::NemotronSft | Preset::TrlSft => Kind::Sft,
            Preset::CascadePairs | Preset::TrlPairs | Preset::HelpSteer3 | Preset::Skywork => {
                Kind::Pairs
            }
            _ => Kind::Rl,
        }
    }

    /// The RL domain its rows belong to, when the layout fixes it.
    pub fn domain(self) -> Option<StageKind> {
        match self {
            Preset::NemotronRlhf => Some(StageKind::Rlhf),
            Preset::NemotronIf | Preset::IfEval => Some(StageKind::If),
            Preset::NemotronMath
            | Preset::DapoMath
            | Preset::Aime
            | Preset::Math500
            | Preset::DeepScaleR => Some(StageKind::Math),
            Preset::LiveCodeBench | Preset::Apps | Preset::CodeContests => Some(StageKind::Code),
            Preset::NemotronSwe | Preset::SweBench | Preset::SweSmith => Some(StageKind::Swe),
            _ => None,
        }
    }

    /// How well the preset fits the probed columns: the number of columns it recognises, or
    /// `None` when its signature does not match.
    pub fn score(self, probe: &Probe) -> Option<usize> {
        let p = probe;
        let all = |cols: &[&str]| cols.iter().all(|c| p.has(c)).then_some(cols.len());
        match self {
            Preset::CascadeSft => (p.has_assistant("messages") && p.is_str("mode")).then_some(2),
            Preset::NemotronSft => {
                if !p.has_assistant("messages") || p.has("mode") {
                    return None;
                }
                Some(1 + usize::from(p.has("thinking") || p.has("reasoning")))
            }
            Preset::CascadeRl => {
                if p.has("chosen")
                    || !(p.is_str("prompt")
                        || (p.is_list("messages") && !p.has_assistant("messages")))
                {
                    return None;
                }
                // Our reference fields, and an integer `id` (the mark of our own files, which
                // public layouts with the same fields lack): a canonical IF file must not read
                // as Nemotron's.
                let fields = CANONICAL_REFERENCE.iter().filter(|c| p.has(c)).count();
                let id = usize::from(p.first.get("id").is_some_and(Value::is_u64));
                Some(1 + fields + 2 * id)
            }
            Preset::CascadePairs => {
                (p.is_str("prompt") && p.is_str("chosen") && p.is_str("rejected")).then_some(4)
            }
            Preset::NemotronRlhf => (p.is_list("prompt") && !p.has("reward_model")).then_some(1),
            Preset::NemotronIf => all(&["prompt", "instruction_id_list", "kwargs"]),
            Preset::IfEval => all(&["key", "prompt", "instruction_id_list", "kwargs"]),
            Preset::NemotronMath => all(&["problem", "answer"]),
            Preset::NemotronSwe => all(&["prompt", "golden_patch"]),
            Preset::Verl => {
                let base = all(&["prompt", "reward_model"])?;
                Some(base + usize::from(p.has("data_source")) + usize::from(p.has("extra_info")))
            }
            Preset::DapoMath => {
                let base = Preset::Verl.score(p)?;
                let src = p
                    .first
                    .get("data_source")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                src.to_ascii_lowercase()
                    .contains("dapo")
                    .then_some(base + 1)
            }
            Preset::TrlSft => all(&["prompt", "completion"]),
            Preset::TrlPairs => {
                let base = all(&["chosen", "rejected"])?;
                Some(base + usize::from(p.has("prompt")))
            }
            Preset::Skywork => {
                (p.is_list("chosen") && p.is_list("rejected") && p.has("source")).then_some(3)
            }
            Preset::OpenRlhf => all(&["input", "label"]),
            Preset::Aime => all(&["question", "answer"]).or_else(|| {
                all(&["problem", "answer", "url"]).map(|n| n + usize::from(p.has("year")))
            }),
            Preset::Math500 => all(&[
                "problem",
                "solution",
                "answer",
                "subject",
                "level",
                "unique_id",
            ]),
            Preset::DeepScaleR => all(&["problem", "answer", "solution"]),
            Preset::LiveCodeBench => all(&["question_content", "public_test_cases"])
                .map(|n| n + usize::from(p.has("private_test_cases"))),
            Preset::Apps => all(&["question", "input_output"]),
            Preset::CodeContests => all(&["description", "public_tests"])
                .map(|n| n + usize::from(p.has("private_tests"))),
            Preset::SweBench => all(&["instance_id", "problem_statement", "patch", "test_patch"]),
            Preset::SweSmith => all(&["instance_id", "problem_statement", "patch", "image_name"]),
            Preset::HelpSteer3 => all(&["context", "response1", "response2", "overall_preference"]),
        }
    }

    /// Maps one row onto our canonical object.
    pub fn map(self, row: Map<String, Value>, opts: &MapOptions) -> FieldResult<Mapped> {
        match self {
            Preset::CascadeSft | Preset::CascadeRl | Preset::CascadePairs => Ok(Mapped::Row(row)),
            Preset::NemotronSft => chat::nemotron_sft(&row),
            Preset::TrlSft => chat::trl_sft(&row),
            Preset::TrlPairs | Preset::Skywork => chat::trl_pairs(&row),
            Preset::HelpSteer3 => chat::helpsteer3(&row),
            Preset::NemotronRlhf => chat::rlhf_prompt(&row),
            Preset::NemotronIf | Preset::IfEval => math::instruction_following(&row),
            Preset::NemotronMath | Preset::Aime | Preset::Math500 | Preset::DeepScaleR => {
                math::problem_answer(&row)
            }
            Preset::Verl => math::verl(row, opts.domain),
            Preset::DapoMath => math::verl(row, Some(StageKind::Math)),
            Preset::OpenRlhf => math::openrlhf(&row, opts.domain),
            Preset::LiveCodeBench => code::livecodebench(&row, opts),
            Preset::Apps => code::apps(&row),
            Preset::CodeContests => code::code_contests(&row),
            Preset::NemotronSwe => swe::nemotron_swe(&row),
            Preset::SweBench => swe::swe_bench(&row),
            Preset::SweSmith => swe::swe_smith(&row),
        }
    }
}

/// The reference fields of our RL layout (what `cascade score` takes).
const CANONICAL_REFERENCE: [&str; 7] = [
    "answer",
    "instruction_id_list",
    "kwargs",
    "tests",
    "test_code",
    "entry_point",
    "gold_patch",
];

/// What detection looks at: the top-level columns and the first non-null value of each.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Probe {
    /// Column names, in order of first appearance.
    pub columns: Vec<String>,
    /// The first non-null value of each column among the rows probed.
    pub first: Map<String, Value>,
}

impl Probe {
    /// A probe from the file's columns and its first rows.
    pub fn new<'a>(
        columns: &[String],
        rows: impl IntoIterator<Item = &'a Map<String, Value>>,
    ) -> Probe {
        let mut probe = Probe {
            columns: columns.to_vec(),
            first: Map::new(),
        };
        for row in rows {
            for (k, v) in row {
                if !probe.columns.contains(k) {
                    probe.columns.push(k.clone());
                }
                if !v.is_null() && !probe.first.contains_key(k) {
                    probe.first.insert(k.clone(), v.clone());
                }
            }
        }
        probe
    }

    fn has(&self, col: &str) -> bool {
        self.columns.iter().any(|c| c == col)
    }

    fn is_str(&self, col: &str) -> bool {
        matches!(self.first.get(col), Some(Value::String(_)))
    }

    fn is_list(&self, col: &str) -> bool {
        matches!(self.first.get(col), Some(Value::Array(_)))
    }

    /// `col` is a message list with an assistant turn.
    fn has_assistant(&self, col: &str) -> bool {
        let Some(Value::Array(list)) = self.first.get(col) else {
            return false;
        };
        list.iter().any(|m| {
            let role = m
                .get("role")
                .or_else(|| m.get("from"))
                .and_then(Value::as_str);
            matches!(role, Some("assistant" | "gpt"))
        })
    }
}

/// The preset that fits `probe` (of the kind asked for, if any); otherwise an error message
/// listing the columns found and the candidates.
pub fn detect(probe: &Probe, kind: Option<Kind>) -> Result<Preset, String> {
    let mut scored: Vec<(Preset, usize)> = Preset::ALL
        .into_iter()
        .filter(|p| kind.is_none_or(|k| p.kind() == k))
        .filter_map(|p| p.score(probe).map(|s| (p, s)))
        .collect();
    scored.sort_by_key(|s| std::cmp::Reverse(s.1));
    let columns = probe.columns.join(", ");
    let kind_note = kind
        .map(|k| format!(" for {} data", k.as_str()))
        .unwrap_or_default();
    match scored.as_slice() {
        [] => Err(format!(
            "no built-in schema{kind_note} fits the columns [{columns}]; give --schema with a \
             preset or a FIELD=PATH mapping (presets: {})",
            Preset::ALL.map(Preset::name).join(", ")
        )),
        [(p, _)] => Ok(*p),
        [(p, a), (_, b), ..] if a > b => Ok(*p),
        // Our own layout loses a tie with exactly one public layout whose columns are ours too:
        // that one maps the same fields, plus what its convention adds (null kwargs dropped).
        [(p, a), (q, b), ..]
            if a == b
                && scored.iter().filter(|(_, s)| s == a).count() == 2
                && (*p == Preset::CascadeRl || *q == Preset::CascadeRl) =>
        {
            Ok(if *p == Preset::CascadeRl { *q } else { *p })
        }
        [(_, top), ..] => {
            let tied: Vec<&str> = scored
                .iter()
                .filter(|(_, s)| s == top)
                .map(|(p, _)| p.name())
                .collect();
            Err(format!(
                "ambiguous schema{kind_note}: the columns [{columns}] fit the presets {}; give \
                 --schema with one of them (or --kind)",
                tied.join(", ")
            ))
        }
    }
}

// ---- helpers shared by the mapping files ----

/// A required string column.
fn req_str(row: &Map<String, Value>, col: &str) -> FieldResult<String> {
    match row.get(col) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
        Some(Value::String(_)) => Err(FieldError::col(col, "empty")),
        None | Some(Value::Null) => Err(FieldError::col(col, "missing")),
        Some(v) => Err(FieldError::col(
            col,
            format!("must be a string, got {}", super::record::kind_of(v)),
        )),
    }
}

/// A present, non-null column.
fn req<'a>(row: &'a Map<String, Value>, col: &str) -> FieldResult<&'a Value> {
    match row.get(col) {
        None | Some(Value::Null) => Err(FieldError::col(col, "missing")),
        Some(v) => Ok(v),
    }
}

/// An answer column as a string (numbers written out, as math verifiers compare text).
fn answer_text(row: &Map<String, Value>, col: &str) -> FieldResult<String> {
    match req(row, col)? {
        Value::String(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
        Value::String(_) => Err(FieldError::col(col, "empty answer")),
        Value::Number(n) => Ok(n.to_string()),
        v => Err(FieldError::col(
            col,
            format!(
                "must be a string or a number, got {}",
                super::record::kind_of(v)
            ),
        )),
    }
}

/// Sets the canonical prompt from a string (`prompt`) or a message list (`messages`).
fn put_prompt(out: &mut Map<String, Value>, col: &str, v: &Value) -> FieldResult<()> {
    put_prompt_owned(out, col, v.clone())
}

/// [`put_prompt`] of a value the caller gives away (moved into `out`, not copied).
fn put_prompt_owned(out: &mut Map<String, Value>, col: &str, v: Value) -> FieldResult<()> {
    match v {
        Value::String(s) if !s.trim().is_empty() => {
            out.insert("prompt".into(), Value::String(s));
        }
        Value::String(_) => return Err(FieldError::col(col, "empty prompt")),
        Value::Array(ref list) => {
            // Already `{role, content}` strings (the usual case): kept as they are.
            let plain = list.iter().all(|m| {
                m.get("role").is_some_and(Value::is_string)
                    && m.get("content").is_some_and(Value::is_string)
            });
            let messages = if plain {
                v
            } else {
                let msgs = super::record::parse_messages(col, &v)?;
                serde_json::to_value(msgs).unwrap_or_default()
            };
            let last = messages.as_array().and_then(|l| l.last());
            if last.and_then(|m| m.get("role")).and_then(Value::as_str) != Some("user") {
                return Err(FieldError::col(col, "the prompt must end with a user turn"));
            }
            out.insert("messages".into(), messages);
        }
        other => {
            return Err(FieldError::col(
                col,
                format!(
                    "must be a string or a message list, got {}",
                    super::record::kind_of(&other)
                ),
            ))
        }
    }
    Ok(())
}

/// Keeps `cols` of `row` (when present and not null) in `out` under the same names.
fn keep(out: &mut Map<String, Value>, row: &Map<String, Value>, cols: &[&str]) {
    for c in cols {
        if let Some(v) = row.get(*c).filter(|v| !v.is_null()) {
            out.insert((*c).to_string(), v.clone());
        }
    }
}

/// Marks the canonical object with its domain.
fn with_domain(mut out: Map<String, Value>, domain: StageKind) -> Map<String, Value> {
    out.insert("domain".into(), Value::String(domain.as_str().into()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn detect_row(row: Value) -> Result<Preset, String> {
        let row = row.as_object().unwrap().clone();
        let cols: Vec<String> = row.keys().cloned().collect();
        detect(&Probe::new(&cols, [&row]), None)
    }

    #[test]
    fn our_layout_and_the_public_ones_are_told_apart() {
        let if_row = json!({"prompt": "p", "instruction_id_list": ["a"], "kwargs": [{}]});
        assert_eq!(detect_row(if_row.clone()), Ok(Preset::NemotronIf));
        let mut ours = if_row;
        ours["id"] = json!(3);
        assert_eq!(detect_row(ours), Ok(Preset::CascadeRl));
        assert_eq!(
            detect_row(json!({"id": 0, "prompt": "p", "answer": "1"})),
            Ok(Preset::CascadeRl)
        );
        assert_eq!(
            detect_row(json!({"problem": "p", "answer": "1"})),
            Ok(Preset::NemotronMath)
        );
        assert_eq!(
            detect_row(json!({"prompt": "p", "chosen": "a", "rejected": "b"})),
            Ok(Preset::CascadePairs)
        );
        let e = detect_row(json!({"foo": 1})).unwrap_err();
        assert!(e.contains("[foo]") && e.contains("--schema"), "{e}");
    }
}
