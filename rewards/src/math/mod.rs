//! The math verifier: the last `\boxed{...}` of the final answer compared with the gold answer
//! (reference field `answer`) for mathematical equivalence. Reward 1 or 0, minus an optional
//! penalty when the final answer's prose switches writing system (language) midway.

pub mod equiv;
pub mod extract;
pub mod latex;

use serde::Deserialize;
use serde_json::json;

use crate::{Reward, SplitResponse, Verifier, VerifyError};

/// Settings of [`MathVerifier`].
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MathConfig {
    /// Without a `\boxed{}`, accept the last "the answer is X" as the final answer.
    pub answer_is_fallback: bool,
    /// Read `p\%` as both `p` and `p/100` (so 50% = 0.5 = 1/2), as math-verify does; otherwise
    /// (the default) the sign is dropped and `p\%` equals `p` only.
    pub percent_equivalence: bool,
    /// Subtracted from the reward when the final answer's prose mixes writing systems (e.g. Latin
    /// and CJK), so a wrong answer that also switches scores `-penalty`; `None` (the default)
    /// disables the check.
    pub language_switch_penalty: Option<f32>,
}

/// Scores math answers against a gold answer; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct MathVerifier {
    config: MathConfig,
}

impl MathVerifier {
    /// A verifier with the given settings.
    pub fn new(config: MathConfig) -> Self {
        Self { config }
    }

    /// Whether `predicted` (an extracted answer) is equivalent to `gold`.
    pub fn answers_match(&self, gold: &str, predicted: &str) -> bool {
        let pct = self.config.percent_equivalence;
        equiv::equivalent(
            &equiv::parse_answer(gold, pct),
            &equiv::parse_answer(predicted, pct),
        )
    }

    /// The final answer in `answer_text` (last box, or the configured fallback).
    pub fn extract<'a>(&self, answer_text: &'a str) -> Option<&'a str> {
        extract::last_boxed(answer_text).or_else(|| {
            if self.config.answer_is_fallback {
                extract::answer_is(answer_text)
            } else {
                None
            }
        })
    }
}

impl Verifier for MathVerifier {
    fn name(&self) -> &'static str {
        "math"
    }

    fn verify(
        &self,
        reference: &serde_json::Value,
        response: &SplitResponse<'_>,
    ) -> Result<Reward, VerifyError> {
        let gold = match reference.get("answer") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Number(n)) => n.to_string(),
            Some(_) => return Err(bad("must be a string or a number")),
            None => return Err(bad("missing")),
        };
        let gold_inner = extract::last_boxed(&gold)
            .map(str::to_string)
            .unwrap_or(gold.clone());
        let Some(text) = response.answer else {
            return Ok(Reward {
                reward: 0.0,
                details: json!({"extracted": null, "reason": "no final answer"}),
            });
        };
        let extracted = self.extract(text);
        let correct = extracted.is_some_and(|p| self.answers_match(&gold_inner, p));
        let mut reward = if correct { 1.0 } else { 0.0 };
        let switched = self
            .config
            .language_switch_penalty
            .map(|_| switches_script(text));
        if let (Some(penalty), Some(true)) = (self.config.language_switch_penalty, switched) {
            reward -= penalty;
        }
        Ok(Reward {
            reward,
            details: json!({
                "extracted": extracted,
                "gold": gold,
                "correct": correct,
                "language_switch": switched,
            }),
        })
    }
}

fn bad(problem: &str) -> VerifyError {
    VerifyError::BadReference {
        field: "answer".into(),
        problem: problem.into(),
    }
}

/// Writing systems told apart by the language-switch check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Script {
    Latin,
    Cjk,
    Hangul,
    Cyrillic,
    Arabic,
    Other,
}

fn script_of(c: char) -> Option<Script> {
    if !c.is_alphabetic() {
        return None;
    }
    Some(match c as u32 {
        0x41..=0x24F => Script::Latin,
        0x3040..=0x30FF | 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF => Script::Cjk,
        0xAC00..=0xD7AF | 0x1100..=0x11FF => Script::Hangul,
        0x400..=0x4FF => Script::Cyrillic,
        0x600..=0x6FF => Script::Arabic,
        _ => Script::Other,
    })
}

/// True when the prose of `text` (math in `$...$`, `\(...\)`, `\[...\]` and LaTeX commands
/// ignored) uses at least two writing systems with at least 4 letters each.
pub fn switches_script(text: &str) -> bool {
    let mut counts = std::collections::BTreeMap::new();
    let mut in_math = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '$' => in_math = !in_math,
            '\\' => {
                match chars.peek() {
                    Some('(') | Some('[') => in_math = true,
                    Some(')') | Some(']') => in_math = false,
                    _ => {}
                }
                while chars.peek().is_some_and(|n| n.is_ascii_alphabetic()) {
                    chars.next();
                }
            }
            _ if !in_math => {
                if let Some(s) = script_of(c) {
                    *counts.entry(s).or_insert(0usize) += 1;
                }
            }
            _ => {}
        }
    }
    counts.values().filter(|&&n| n >= 4).count() >= 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use cascade_shared::chat::split_response;

    fn score(cfg: MathConfig, answer: &str, response: &str) -> f32 {
        let v = MathVerifier::new(cfg);
        v.verify(&json!({"answer": answer}), &split_response(response))
            .unwrap()
            .reward
    }

    #[test]
    fn boxed_after_think_only() {
        let cfg = MathConfig::default();
        assert_eq!(
            score(cfg.clone(), "4", "<think>\\boxed{4}</think> so \\boxed{5}"),
            0.0
        );
        assert_eq!(
            score(cfg.clone(), "4", "<think>hmm</think> \\boxed{4}"),
            1.0
        );
        assert_eq!(score(cfg.clone(), "4", "<think>\\boxed{4}"), 0.0);
        assert_eq!(score(cfg, "4", "The answer is 4."), 0.0);
    }

    #[test]
    fn percent_only_when_configured() {
        assert_eq!(score(MathConfig::default(), "0.5", "\\boxed{50\\%}"), 0.0);
        assert_eq!(score(MathConfig::default(), "50", "\\boxed{50\\%}"), 1.0);
        let cfg = MathConfig {
            percent_equivalence: true,
            ..MathConfig::default()
        };
        assert_eq!(score(cfg, "0.5", "\\boxed{50\\%}"), 1.0);
    }

    #[test]
    fn answer_is_fallback_when_configured() {
        let cfg = MathConfig {
            answer_is_fallback: true,
            ..MathConfig::default()
        };
        assert_eq!(score(cfg, "4", "The answer is 4."), 1.0);
    }

    #[test]
    fn language_switch_penalty() {
        let cfg = MathConfig {
            language_switch_penalty: Some(0.5),
            ..MathConfig::default()
        };
        assert_eq!(score(cfg.clone(), "4", "So the result is \\boxed{4}"), 1.0);
        assert_eq!(
            score(cfg, "4", "So the result 答案是四个 is \\boxed{4}"),
            0.5
        );
        assert!(!switches_script("The value of $\\alpha$ is \\boxed{4}"));
    }

    #[test]
    fn bad_reference_is_an_error() {
        let v = MathVerifier::default();
        assert!(v.verify(&json!({}), &split_response("\\boxed{1}")).is_err());
        assert!(
            v.verify(&json!({"answer": 12}), &split_response("\\boxed{12}"))
                .unwrap()
                .reward
                == 1.0
        );
    }
}
