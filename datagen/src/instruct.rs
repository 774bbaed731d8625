//! Instruction following: a short request about a topic plus one or two IFEval constraints stated
//! in plain words ("Describe cats. Use only lowercase."), with `instruction_id_list` and `kwargs`
//! exactly in IFEval's JSONL format.
//!
//! The unconstrained answer ("Cats are soft, calm and curious.") breaks every constraint used
//! here (it has capitals, a comma, no quotes, no title, none of the keywords, no end phrase, six
//! words), so each constraint changes the gold answer in a way the prompt tells. No prompt asks
//! for capitals (the note on `Kind` says why).
//!
//! **Self-check.** Every draw's gold answer is run through `cascade-rewards`' IFEval checks
//! (strict mode) and redrawn unless it follows all its instructions. This matters for the case
//! constraints: IFEval also requires the text to be detected as English, and the statistical
//! detector misreads about one in seven of these short sentences ("cheese is rich." reads as
//! German), so those (topic, shape, case) combinations are simply never asked for.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Map, Value};

use cascade_rewards::ifeval::{IfEvalMode, IfEvalVerifier};

use crate::common::{capitalise, count_words, pick, Domain, Task, MAX_PROMPT_BYTES, TOPICS};

const REQUESTS: [&str; 5] = [
    "Describe {}.",
    "Write about {}.",
    "Tell me about {}.",
    "Talk about {}.",
    "Say a line on {}.",
];

/// Words for `keywords:existence`; none is (part of) a topic adjective.
const KEYWORDS: [&str; 8] = [
    "happy",
    "lovely",
    "great",
    "nice",
    "cool",
    "special",
    "pleasant",
    "wonderful",
];

/// Phrases for `startend:end_checker` (no commas, so they combine with `punctuation:no_comma`).
const END_PHRASES: [&str; 4] = ["That is all.", "The end.", "Thank you.", "Bye for now."];

/// The constraint kinds used by the tiny dataset.
///
/// Not `change_case:english_capital` (generator version 10, issue 19). The tiny tokenizer,
/// trained on this data, has merges for almost no upper-case word, so the model writes capitals
/// a letter at a time. RL on "Use only capitals." did not teach capitals: it paid for any
/// upper-case string ("OOOOS ARE SOOOOL.") and taught letter loops that leaked into chat
/// answers. With capitals in SFT and the held-out set but not in RL, the if stage's lowercase
/// training undid them and hid its gain on everything else. The measurements are in
/// `configs/tiny.toml` (the note above its rlhf stage).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Lowercase,
    NoComma,
    Quotation,
    Title,
    Keyword,
    End,
    Words,
}

const KINDS: [Kind; 7] = [
    Kind::Lowercase,
    Kind::NoComma,
    Kind::Quotation,
    Kind::Title,
    Kind::Keyword,
    Kind::End,
    Kind::Words,
];

impl Kind {
    fn id(self) -> &'static str {
        match self {
            Kind::Lowercase => "change_case:english_lowercase",
            Kind::NoComma => "punctuation:no_comma",
            Kind::Quotation => "startend:quotation",
            Kind::Title => "detectable_format:title",
            Kind::Keyword => "keywords:existence",
            Kind::End => "startend:end_checker",
            Kind::Words => "length_constraints:number_words",
        }
    }
}

/// Draws one instruction-following task (short prompt, gold answer that follows every
/// instruction).
pub fn sample(rng: &mut ChaCha8Rng) -> Task {
    loop {
        let task = sample_any(rng);
        if task.prompt.len() <= MAX_PROMPT_BYTES && gold_follows(&task) {
            return task;
        }
    }
}

/// Whether the gold answer follows all of the task's instructions under the IFEval checks.
pub fn gold_follows(task: &Task) -> bool {
    // The ids and kwargs come from the fixed table above; a rejection is a bug here.
    let list = IfEvalVerifier::instructions(&task.line(0))
        .unwrap_or_else(|e| panic!("generated IFEval reference is malformed: {e}"));
    IfEvalVerifier::follow_list(&list, &task.answer, IfEvalMode::Strict)
        .iter()
        .all(|&f| f)
}

fn sample_any(rng: &mut ChaCha8Rng) -> Task {
    let topic = pick(rng, &TOPICS);
    let first = *pick(rng, &KINDS);
    let mut kinds = vec![first];
    if rng.random_bool(0.5) {
        let second = loop {
            let k = *pick(rng, &KINDS);
            if k != first {
                break k;
            }
        };
        kinds.push(second);
    }
    let has = |k: Kind| kinds.contains(&k);
    let keyword = *pick(rng, &KEYWORDS);
    let end = *pick(rng, &END_PHRASES);

    // The body: the sentence, shortened for a word limit, with the keyword as last adjective.
    let [a1, a2, a3] = topic.adjectives;
    let last = if has(Kind::Keyword) { keyword } else { a3 };
    let (s, v) = (topic.subject(), topic.verb());
    let mut text = if has(Kind::Words) {
        let adj = if has(Kind::Keyword) { keyword } else { a1 };
        format!("{s} {v} {adj}.")
    } else if has(Kind::NoComma) {
        format!("{s} {v} {a1} and {last}.")
    } else {
        format!("{s} {v} {a1}, {a2} and {last}.")
    };
    if has(Kind::End) {
        text = format!("{text} {end}");
    }
    if has(Kind::Title) {
        text = format!("<<{}>>\n{text}", capitalise(topic.name));
    }
    if has(Kind::Lowercase) {
        text = text.to_lowercase();
    }
    if has(Kind::Quotation) {
        text = format!("\"{text}\"");
    }
    let num_words = count_words(&text) + 1 + rng.random_range(0..3);

    let mut phrases = Vec::new();
    let mut notes = Vec::new();
    let mut kwargs = Vec::new();
    for &k in &kinds {
        let (phrase, note, kw) = match k {
            Kind::Lowercase => (
                "Use only lowercase.".into(),
                "all lowercase".into(),
                json!({}),
            ),
            Kind::NoComma => ("No commas.".into(), "no commas".into(), json!({})),
            Kind::Quotation => ("Wrap it in quotes.".into(), "in quotes".into(), json!({})),
            Kind::Title => ("Add a <<title>>.".into(), "title first".into(), json!({})),
            Kind::Keyword => (
                format!("Use the word {keyword}."),
                format!("use {keyword}"),
                json!({"keywords": [keyword]}),
            ),
            Kind::End => (
                format!("End with: {end}"),
                format!("end: {end}"),
                json!({"end_phrase": end}),
            ),
            Kind::Words => (
                format!("Use under {num_words} words."),
                format!("under {num_words} words"),
                json!({"relation": "less than", "num_words": num_words}),
            ),
        };
        phrases.push(phrase);
        notes.push(note);
        kwargs.push(kw);
    }
    let request = pick(rng, &REQUESTS).replace("{}", topic.name);
    let mut reference = Map::new();
    reference.insert(
        "instruction_id_list".into(),
        Value::from(kinds.iter().map(|k| k.id()).collect::<Vec<_>>()),
    );
    reference.insert("kwargs".into(), Value::from(kwargs));
    Task {
        domain: Domain::If,
        prompt: format!("{request} {}", phrases.join(" ")),
        reference,
        reasoning: notes.join("; "),
        answer: text,
    }
}
