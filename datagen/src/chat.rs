//! General chat (the RLHF stage) and the preference pairs of its reward model.
//!
//! Prompts are `template × topic` ("Tell me about cats."). The gold answer is one short on-topic
//! sentence built from the topic's adjectives ("Cats are soft and calm."). A preference pair
//! prefers that concise answer to a rejected one that is, as the paper says RLHF mostly fixes,
//! repetitive or verbose, or else off-topic or (nearly) empty: differences a small
//! Bradley–Terry model can read from the surface.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Map, Value};

use crate::common::{pick, Domain, Task, Topic, TOPICS};

/// Prompt templates; `{}` is the topic as written mid-sentence.
const TEMPLATES: [&str; 16] = [
    "Tell me about {}.",
    "What do you think of {}?",
    "Describe {} briefly.",
    "Say something about {}.",
    "Why do people like {}?",
    "Give me one fact about {}.",
    "Write one line about {}.",
    "Can you describe {}?",
    "I want to hear about {}.",
    "Talk about {}.",
    "Share a thought on {}.",
    "What is nice about {}?",
    "Explain {} in a few words.",
    "Are you fond of {}?",
    "Quick question: what about {}?",
    "Sum up {} for me.",
];

/// A concise on-topic answer about `topic`, in one of four shapes.
///
/// The shortest, "Cats are soft.", is also the gold answer of an instruction-following prompt
/// with a word limit (`instruct`) and the sentence that [`Flaw::RepeatedPhrase`] repeats. Why it
/// is a chosen answer too (issue 19, generator version 10): without it the reward model saw that
/// sentence only in rejected answers and learned "three words = bad" instead of "repeated =
/// bad", so the if stage, which teaches short answers for word limits, lowered the chat RM score
/// when they leaked into chat answers. The figures are in `configs/tiny.toml` (the note above
/// its rlhf stage).
pub fn concise_answer(rng: &mut ChaCha8Rng, topic: &Topic) -> String {
    let [a1, a2, a3] = topic.adjectives;
    let (s, v) = (topic.subject(), topic.verb());
    match rng.random_range(0..4) {
        0 => format!("{s} {v} {a1} and {a2}."),
        1 => format!("{s} {v} {a1}, {a2} and {a3}."),
        2 => format!("{s} {v} {a1}."),
        _ => format!("I like {}. {} {v} {a1}.", topic.name, topic.pronoun()),
    }
}

/// Draws one chat task.
pub fn sample(rng: &mut ChaCha8Rng) -> Task {
    let topic = pick(rng, &TOPICS);
    let template = pick(rng, &TEMPLATES);
    let answer = concise_answer(rng, topic);
    Task {
        domain: Domain::Rlhf,
        prompt: template.replace("{}", topic.name),
        reference: Map::new(),
        reasoning: format!("About {}. Keep it short.", topic.name),
        answer,
    }
}

/// How a rejected answer is bad.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flaw {
    /// One word said over and over.
    RepeatedWord,
    /// One sentence said over and over.
    RepeatedPhrase,
    /// Filler words and hedges around the content.
    Verbose,
    /// A concise answer about another topic.
    OffTopic,
    /// Nothing, or a token reply.
    Empty,
}

/// A rejected answer to a prompt about `topic`, with its flaw.
pub fn rejected_answer(rng: &mut ChaCha8Rng, topic: &Topic) -> (Flaw, String) {
    let [a1, a2, _] = topic.adjectives;
    let (s, v) = (topic.subject(), topic.verb());
    let roll = rng.random_range(0..100);
    if roll < 25 {
        let n = rng.random_range(5..9);
        let words = vec![a1; n].join(" ");
        (Flaw::RepeatedWord, format!("{s} {v} {words}."))
    } else if roll < 45 {
        let n = rng.random_range(3..6);
        let sentence = format!("{s} {v} {a1}.");
        (Flaw::RepeatedPhrase, vec![sentence; n].join(" "))
    } else if roll < 70 {
        let text = match rng.random_range(0..3) {
            0 => format!(
                "Well, um, so, {}, you know, {} really really very {a1}, I mean very very {a1}.",
                topic.name, v
            ),
            1 => format!(
                "Okay so basically {} {v} like {a1} and also {a2} and also {a1} and so on and so on.",
                topic.name
            ),
            _ => format!("Hmm, let me think, well, I guess, maybe, {s} {v} sort of {a1}, kind of, I think, maybe."),
        };
        (Flaw::Verbose, text)
    } else if roll < 88 {
        let other = loop {
            let o = pick(rng, &TOPICS);
            if o.name != topic.name {
                break o;
            }
        };
        (Flaw::OffTopic, concise_answer(rng, other))
    } else {
        let text = *pick(rng, &["", "Hmm.", "Ok.", "...", "I do not know."]);
        (Flaw::Empty, text.to_string())
    }
}

/// One Bradley–Terry training pair.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefPair {
    /// The user prompt.
    pub prompt: String,
    /// The concise, on-topic answer.
    pub chosen: String,
    /// The flawed answer.
    pub rejected: String,
    /// How `rejected` is flawed (not written to the file).
    pub flaw: Flaw,
}

impl PrefPair {
    /// The `prefs.jsonl` line.
    pub fn line(&self, id: u64) -> Value {
        json!({"id": id, "prompt": self.prompt, "chosen": self.chosen, "rejected": self.rejected})
    }
}

/// Draws one preference pair.
pub fn sample_pair(rng: &mut ChaCha8Rng) -> PrefPair {
    let topic = pick(rng, &TOPICS);
    let template = pick(rng, &TEMPLATES);
    let chosen = concise_answer(rng, topic);
    let (flaw, rejected) = rejected_answer(rng, topic);
    PrefPair {
        prompt: template.replace("{}", topic.name),
        chosen,
        rejected,
        flaw,
    }
}
