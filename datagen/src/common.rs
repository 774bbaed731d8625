//! What every domain generator shares: the [`Task`] record, the two chat modes, seeded random
//! streams, unique drawing, and the topic table of the chat and instruction-following domains.

use std::collections::HashSet;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value};

use crate::DatagenError;

/// Longest user prompt a generator may emit, in bytes. Generators resample anything longer, so
/// every prompt fits the tiny model's short context (the SFT test checks ≤ 80).
pub const MAX_PROMPT_BYTES: usize = 76;

/// The five domains of the cascade, in stage order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Domain {
    /// General chat, scored by the reward model (RLHF stage).
    Rlhf,
    /// Instruction following with IFEval-style verifiable constraints.
    If,
    /// Arithmetic word problems with a `\boxed{}` answer.
    Math,
    /// Small Python functions checked by unit tests.
    Code,
    /// One-line bug fixes answered with a unified diff.
    Swe,
}

impl Domain {
    /// All domains, in stage order.
    pub const ALL: [Domain; 5] = [
        Domain::Rlhf,
        Domain::If,
        Domain::Math,
        Domain::Code,
        Domain::Swe,
    ];

    /// The domain's name, also the stem of its file names (`if.jsonl`, `if-heldout.jsonl`).
    pub fn name(self) -> &'static str {
        match self {
            Domain::Rlhf => "rlhf",
            Domain::If => "if",
            Domain::Math => "math",
            Domain::Code => "code",
            Domain::Swe => "swe",
        }
    }

    /// The domain's position in [`Domain::ALL`] (its declaration order).
    pub(crate) fn index(self) -> u64 {
        self as u64
    }

    /// Draws one task of this domain.
    pub fn sample(self, rng: &mut ChaCha8Rng) -> Task {
        match self {
            Domain::Rlhf => crate::chat::sample(rng),
            Domain::If => crate::instruct::sample(rng),
            Domain::Math => crate::math::sample(rng),
            Domain::Code => crate::code::sample(rng),
            Domain::Swe => crate::swe::sample(rng),
        }
    }
}

/// Thinking or direct answer (the rollout schema's own type): the chat template adds the
/// matching `/think` or `/no_think` flag.
pub use cascade_shared::Mode;

/// One generated prompt with its reference data and its gold response.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// The domain it belongs to.
    pub domain: Domain,
    /// The user message (never contains `/think` or `/no_think`).
    pub prompt: String,
    /// The domain's reference fields as the verifier reads them (`answer`; `instruction_id_list`
    /// + `kwargs`; `test_code` + `entry_point`; `gold_patch`; nothing for chat).
    pub reference: Map<String, Value>,
    /// The short reasoning of the thinking-mode gold response.
    pub reasoning: String,
    /// The gold final answer (what a verifier scores 1.0).
    pub answer: String,
}

impl Task {
    /// The gold assistant message in `mode`.
    pub fn response(&self, mode: Mode) -> String {
        match mode {
            Mode::Think => format!("<think>\n{}\n</think>\n\n{}", self.reasoning, self.answer),
            Mode::NoThink => self.answer.clone(),
        }
    }

    /// The RL dataset line: `id`, `prompt` and the reference fields.
    pub fn line(&self, id: u64) -> Value {
        let mut obj = self.reference.clone();
        obj.insert("id".into(), Value::from(id));
        obj.insert("prompt".into(), Value::from(self.prompt.clone()));
        Value::Object(obj)
    }
}

/// What a random stream is used for; with the domain it names one independent ChaCha stream, so
/// changing one file's size never shifts the data of another.
#[derive(Debug, Clone, Copy)]
pub enum Purpose {
    /// Held-out RL prompts.
    Heldout = 0,
    /// Training RL prompts.
    Train = 1,
    /// SFT rows.
    Sft = 2,
    /// Training preference pairs.
    Prefs = 3,
    /// Held-out preference pairs.
    PrefsHeldout = 4,
}

/// The random stream of (`seed`, `domain`, `purpose`).
pub fn stream(seed: u64, domain: Domain, purpose: Purpose) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(domain.index() * 16 + purpose as u64);
    rng
}

/// A uniformly chosen element of a non-empty slice.
pub fn pick<'a, T>(rng: &mut ChaCha8Rng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

/// Draws tasks until `n` distinct prompts not in `exclude` are found, in draw order. Fails when the
/// generator's prompt space is too small for `n` (after a generous number of attempts).
pub fn draw_unique(
    rng: &mut ChaCha8Rng,
    domain: Domain,
    n: usize,
    exclude: &HashSet<String>,
    what: &str,
) -> Result<Vec<Task>, DatagenError> {
    let mut seen: HashSet<String> = HashSet::new();
    let mut out = Vec::with_capacity(n);
    let budget = 200 * n + 1000;
    let mut attempts = 0;
    while out.len() < n {
        if attempts == budget {
            return Err(DatagenError::Exhausted {
                what: what.to_string(),
                wanted: n,
                got: out.len(),
            });
        }
        attempts += 1;
        let task = domain.sample(rng);
        if exclude.contains(&task.prompt) || !seen.insert(task.prompt.clone()) {
            continue;
        }
        out.push(task);
    }
    Ok(out)
}

/// Draws one task whose prompt is not in `exclude`.
pub fn draw_excluding(
    rng: &mut ChaCha8Rng,
    domain: Domain,
    exclude: &HashSet<String>,
    what: &str,
) -> Result<Task, DatagenError> {
    for _ in 0..10_000 {
        let task = domain.sample(rng);
        if !exclude.contains(&task.prompt) {
            return Ok(task);
        }
    }
    Err(DatagenError::Exhausted {
        what: what.to_string(),
        wanted: 1,
        got: 0,
    })
}

/// Resamples `f` until its prompt fits [`MAX_PROMPT_BYTES`].
pub fn short_prompt(rng: &mut ChaCha8Rng, f: impl Fn(&mut ChaCha8Rng) -> Task) -> Task {
    loop {
        let t = f(rng);
        if t.prompt.len() <= MAX_PROMPT_BYTES {
            return t;
        }
    }
}

/// A chat topic: its name, whether it takes "are", and three on-topic adjectives.
#[derive(Debug, Clone, Copy)]
pub struct Topic {
    /// As written mid-sentence: `cats`, `the sea`.
    pub name: &'static str,
    /// Plural ("are") or singular ("is").
    pub plural: bool,
    /// Three adjectives that describe it (no commas, none of the IF keywords).
    pub adjectives: [&'static str; 3],
}

impl Topic {
    /// The name capitalised for the start of a sentence: `Cats`, `The sea`.
    pub fn subject(&self) -> String {
        capitalise(self.name)
    }

    /// `are` or `is`.
    pub fn verb(&self) -> &'static str {
        if self.plural {
            "are"
        } else {
            "is"
        }
    }

    /// `They` or `It`.
    pub fn pronoun(&self) -> &'static str {
        if self.plural {
            "They"
        } else {
            "It"
        }
    }
}

/// `s` with its first letter upper-cased.
pub fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

const fn t(name: &'static str, plural: bool, adjectives: [&'static str; 3]) -> Topic {
    Topic {
        name,
        plural,
        adjectives,
    }
}

/// The topics of the chat (RLHF) and instruction-following prompts.
pub const TOPICS: [Topic; 56] = [
    t("cats", true, ["soft", "calm", "curious"]),
    t("dogs", true, ["loyal", "playful", "friendly"]),
    t("the sea", false, ["vast", "deep", "blue"]),
    t("rain", false, ["wet", "cold", "fresh"]),
    t("music", false, ["loud", "lively", "moving"]),
    t("bread", false, ["warm", "soft", "tasty"]),
    t("the moon", false, ["bright", "round", "distant"]),
    t("trees", true, ["tall", "green", "old"]),
    t("books", true, ["wise", "long", "useful"]),
    t("coffee", false, ["hot", "bitter", "strong"]),
    t("snow", false, ["white", "cold", "quiet"]),
    t("bikes", true, ["fast", "light", "useful"]),
    t("birds", true, ["small", "quick", "noisy"]),
    t("tea", false, ["hot", "calm", "mild"]),
    t("the sun", false, ["hot", "bright", "huge"]),
    t("winter", false, ["cold", "dark", "long"]),
    t("summer", false, ["warm", "sunny", "long"]),
    t("apples", true, ["sweet", "crisp", "red"]),
    t("rivers", true, ["long", "wide", "fast"]),
    t("stars", true, ["far", "bright", "old"]),
    t("chess", false, ["hard", "slow", "deep"]),
    t("soup", false, ["hot", "thick", "tasty"]),
    t("boats", true, ["slow", "sturdy", "wet"]),
    t("trains", true, ["fast", "long", "loud"]),
    t("clocks", true, ["exact", "round", "busy"]),
    t("owls", true, ["wise", "quiet", "round"]),
    t("bees", true, ["busy", "small", "useful"]),
    t("frogs", true, ["green", "wet", "loud"]),
    t("cheese", false, ["rich", "soft", "salty"]),
    t("milk", false, ["white", "cold", "fresh"]),
    t("gardens", true, ["green", "calm", "pretty"]),
    t("cities", true, ["busy", "loud", "big"]),
    t("maps", true, ["flat", "useful", "old"]),
    t("kites", true, ["light", "high", "bright"]),
    t("shoes", true, ["warm", "tough", "comfy"]),
    t("lamps", true, ["bright", "warm", "small"]),
    t("songs", true, ["short", "catchy", "sweet"]),
    t("games", true, ["lively", "long", "tricky"]),
    t("horses", true, ["strong", "fast", "tall"]),
    t("fish", true, ["wet", "quick", "silent"]),
    t("wolves", true, ["wild", "smart", "fast"]),
    t("ducks", true, ["small", "loud", "round"]),
    t("the wind", false, ["cold", "strong", "wild"]),
    t("clouds", true, ["white", "soft", "high"]),
    t("sand", false, ["dry", "warm", "gritty"]),
    t("honey", false, ["sweet", "thick", "golden"]),
    t("rice", false, ["white", "soft", "plain"]),
    t("pizza", false, ["hot", "cheesy", "tasty"]),
    t("mountains", true, ["tall", "cold", "steep"]),
    t("forests", true, ["green", "dark", "quiet"]),
    t("bridges", true, ["long", "strong", "old"]),
    t("robots", true, ["smart", "exact", "fast"]),
    t("candles", true, ["warm", "small", "bright"]),
    t("oranges", true, ["sweet", "round", "juicy"]),
    t("gold", false, ["rare", "heavy", "shiny"]),
    t("spring", false, ["mild", "green", "fresh"]),
];

/// IFEval's word count (`\w+` runs), for ASCII text.
pub fn count_words(s: &str) -> usize {
    let mut n = 0;
    let mut in_word = false;
    for c in s.chars() {
        let w = c.is_alphanumeric() || c == '_';
        if w && !in_word {
            n += 1;
        }
        in_word = w;
    }
    n
}
