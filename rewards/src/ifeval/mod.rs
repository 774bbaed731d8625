//! The instruction-following verifier: IFEval's 25 instruction types (ids and kwargs exactly as in
//! IFEval's JSONL: `instruction_id_list`, `kwargs`, optional `prompt`), checked in strict or loose
//! mode as lm-eval does. The reward is the fraction of instructions followed, or 1/0 when
//! `all_or_nothing` is set.
//!
//! **Reward-model combination (thinking mode).** With `rm_weights = Some((w_rule, w_rm))` the
//! reward is `w_rule × rule + w_rm × rm`, where `rm` is the number in the reference field
//! `rm_score`: whoever scores with the reward model (a combinator in the pipeline) writes it into
//! the reference before calling this verifier; a missing `rm_score` is then a reference error, so
//! that a forgotten RM pass is loud instead of silently rule-only. [`IfEvalVerifier::combine`] does
//! the same arithmetic for callers holding both numbers.

pub mod instruction;
pub mod punkt;
pub mod text;

use serde::Deserialize;
use serde_json::{json, Value};

pub use instruction::{Instruction, INSTRUCTION_IDS};

use crate::{Reward, SplitResponse, Verifier, VerifyError};

/// lm-eval's two evaluation modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum IfEvalMode {
    /// The response as is.
    #[default]
    Strict,
    /// Also try the response without its first and/or last line and without `*`: followed when
    /// any variant follows.
    Loose,
}

/// Settings of [`IfEvalVerifier`].
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct IfEvalConfig {
    /// Strict or loose checking.
    pub mode: IfEvalMode,
    /// Reward 1 only when every instruction is followed (else the fraction followed).
    pub all_or_nothing: bool,
    /// `(w_rule, w_rm)`: combine with the reference's `rm_score` (see the module docs).
    pub rm_weights: Option<(f32, f32)>,
}

/// Scores instruction following; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct IfEvalVerifier {
    config: IfEvalConfig,
}

impl IfEvalVerifier {
    /// A verifier with the given settings.
    pub fn new(config: IfEvalConfig) -> Self {
        Self { config }
    }

    /// `w_rule × rule + w_rm × rm` with the configured weights (`rule` alone without weights).
    pub fn combine(&self, rule: f32, rm: f32) -> f32 {
        match self.config.rm_weights {
            Some((w_rule, w_rm)) => w_rule * rule + w_rm * rm,
            None => rule,
        }
    }

    /// Per-instruction verdicts for `response` under `mode`.
    pub fn follow_list(
        instructions: &[Instruction],
        response: &str,
        mode: IfEvalMode,
    ) -> Vec<bool> {
        let variants = match mode {
            IfEvalMode::Strict => vec![response.to_string()],
            IfEvalMode::Loose => loose_variants(response),
        };
        instructions
            .iter()
            .map(|ins| {
                variants
                    .iter()
                    .any(|v| !v.trim().is_empty() && ins.check(v))
            })
            .collect()
    }

    /// Parses the reference's instructions.
    pub fn instructions(reference: &Value) -> Result<Vec<Instruction>, VerifyError> {
        let ids = reference
            .get("instruction_id_list")
            .and_then(Value::as_array)
            .ok_or_else(|| bad_ref("instruction_id_list", "missing or not a list"))?;
        let kwargs = reference
            .get("kwargs")
            .and_then(Value::as_array)
            .ok_or_else(|| bad_ref("kwargs", "missing or not a list"))?;
        if ids.len() != kwargs.len() {
            return Err(bad_ref(
                "kwargs",
                &format!("{} entries for {} instruction ids", kwargs.len(), ids.len()),
            ));
        }
        let prompt = reference.get("prompt").and_then(Value::as_str);
        ids.iter()
            .zip(kwargs)
            .map(|(id, kw)| {
                let id = id
                    .as_str()
                    .ok_or_else(|| bad_ref("instruction_id_list", "non-string id"))?;
                Instruction::from_kwargs(id, kw, prompt)
            })
            .collect()
    }
}

/// lm-eval's eight loose-mode variants of a response.
fn loose_variants(response: &str) -> Vec<String> {
    let lines: Vec<&str> = response.split('\n').collect();
    let join = |s: &[&str]| s.join("\n").trim().to_string();
    let remove_first = join(lines.get(1..).unwrap_or(&[]));
    let remove_last = join(&lines[..lines.len().saturating_sub(1)]);
    let remove_both = if lines.len() >= 2 {
        join(&lines[1..lines.len() - 1])
    } else {
        String::new()
    };
    let no_star = |s: &str| s.replace('*', "");
    vec![
        response.to_string(),
        no_star(response),
        remove_first.clone(),
        remove_last.clone(),
        remove_both.clone(),
        no_star(&remove_first),
        no_star(&remove_last),
        no_star(&remove_both),
    ]
}

fn bad_ref(field: &str, problem: &str) -> VerifyError {
    VerifyError::BadReference {
        field: field.into(),
        problem: problem.into(),
    }
}

impl Verifier for IfEvalVerifier {
    fn name(&self) -> &'static str {
        "if"
    }

    fn verify(
        &self,
        reference: &Value,
        response: &SplitResponse<'_>,
    ) -> Result<Reward, VerifyError> {
        let instructions = Self::instructions(reference)?;
        let follows = match response.answer {
            Some(a) => Self::follow_list(&instructions, a, self.config.mode),
            None => vec![false; instructions.len()],
        };
        let followed = follows.iter().filter(|&&f| f).count();
        let rule = if instructions.is_empty() {
            1.0
        } else if self.config.all_or_nothing {
            if followed == instructions.len() {
                1.0
            } else {
                0.0
            }
        } else {
            followed as f32 / instructions.len() as f32
        };
        let rm = match self.config.rm_weights {
            Some(_) => Some(
                reference
                    .get("rm_score")
                    .and_then(Value::as_f64)
                    .ok_or_else(|| bad_ref("rm_score", "required when rm_weights are configured"))?
                    as f32,
            ),
            None => None,
        };
        let reward = self.combine(rule, rm.unwrap_or(0.0));
        Ok(Reward {
            reward,
            details: json!({ "follow": follows, "rule": rule, "rm": rm }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cascade_shared::chat::split_response;

    fn reference() -> Value {
        json!({"instruction_id_list": ["punctuation:no_comma", "startend:quotation"], "kwargs": [{}, {}]})
    }

    #[test]
    fn fraction_and_all_or_nothing() {
        let v = IfEvalVerifier::default();
        assert_eq!(
            v.verify(&reference(), &split_response("\"a, b\""))
                .unwrap()
                .reward,
            0.5
        );
        let all = IfEvalVerifier::new(IfEvalConfig {
            all_or_nothing: true,
            ..Default::default()
        });
        assert_eq!(
            all.verify(&reference(), &split_response("\"a, b\""))
                .unwrap()
                .reward,
            0.0
        );
        assert_eq!(
            all.verify(&reference(), &split_response("<think>x</think>\"a b\""))
                .unwrap()
                .reward,
            1.0
        );
        assert_eq!(
            v.verify(&reference(), &split_response("<think>\"a b\""))
                .unwrap()
                .reward,
            0.0
        );
    }

    #[test]
    fn rm_combination_needs_a_score() {
        let v = IfEvalVerifier::new(IfEvalConfig {
            rm_weights: Some((0.5, 0.5)),
            ..Default::default()
        });
        assert!(v.verify(&reference(), &split_response("\"a b\"")).is_err());
        let mut r = reference();
        r["rm_score"] = json!(0.2);
        assert!((v.verify(&r, &split_response("\"a b\"")).unwrap().reward - 0.6).abs() < 1e-6);
    }
}
