//! The SWE [`Verifier`]: empty patch → 0, unparsable → −1, lexically identical → 1, otherwise
//! the [`SemanticScorer`]'s score.

use serde_json::{json, Value};

use super::diff::{parse, Patch};
use super::scorer::{LexicalFallback, PatchPair, SemanticScorer};
use super::similarity::str_ratio;
use crate::{Reward, SplitResponse, Verifier, VerifyError};

/// The patch in a final answer: the last fenced block tagged `diff`/`patch`, else the last
/// fenced block that looks like a diff, else the whole answer when it has no fence.
pub fn extract_patch(answer: &str) -> &str {
    let blocks = crate::response::fenced_blocks(answer);
    if let Some((_, p)) = blocks
        .iter()
        .rev()
        .find(|(lang, _)| matches!(*lang, "diff" | "patch"))
    {
        return p;
    }
    let looks_like_diff =
        |t: &str| t.contains("\n@@") || t.starts_with("--- ") || t.starts_with("diff ");
    if let Some((_, p)) = blocks.iter().rev().find(|(_, t)| looks_like_diff(t)) {
        return p;
    }
    answer
}

/// SWE-RL's lexical similarity: for every file in either patch, the difflib ratio of the two
/// normalised changes (0 when one side does not touch the file), averaged over files.
pub fn lexical_similarity(predicted: &Patch, gold: &Patch) -> (f64, Value) {
    let pred = predicted.normalised_changes();
    let gold = gold.normalised_changes();
    let mut paths: Vec<&str> = gold.iter().map(|(p, _)| p.as_str()).collect();
    for (p, _) in &pred {
        if !paths.contains(&p.as_str()) {
            paths.push(p);
        }
    }
    let get = |side: &[(String, String)], path: &str| {
        side.iter()
            .find(|(p, _)| p == path)
            .map(|(_, c)| c.clone())
            .unwrap_or_default()
    };
    let mut per_file = Vec::new();
    let mut sum = 0.0;
    for path in &paths {
        let (a, b) = (get(&pred, path), get(&gold, path));
        let sim = if a.is_empty() || b.is_empty() {
            0.0
        } else {
            str_ratio(&a, &b)
        };
        sum += sim;
        per_file.push(json!({"path": path, "similarity": sim}));
    }
    let mean = if paths.is_empty() {
        0.0
    } else {
        sum / paths.len() as f64
    };
    (mean, Value::Array(per_file))
}

/// Scores patches against `gold_patch`.
pub struct SweVerifier {
    scorer: Box<dyn SemanticScorer>,
}

impl std::fmt::Debug for SweVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SweVerifier")
            .field("scorer", &self.scorer.name())
            .finish()
    }
}

impl Default for SweVerifier {
    fn default() -> Self {
        Self::new(Box::new(LexicalFallback))
    }
}

impl SweVerifier {
    /// A verifier with the given semantic scorer.
    pub fn new(scorer: Box<dyn SemanticScorer>) -> Self {
        Self { scorer }
    }
}

impl Verifier for SweVerifier {
    fn name(&self) -> &'static str {
        "swe"
    }

    fn verify(
        &self,
        reference: &Value,
        response: &SplitResponse<'_>,
    ) -> Result<Reward, VerifyError> {
        let gold_text = reference
            .get("gold_patch")
            .and_then(Value::as_str)
            .ok_or_else(|| VerifyError::BadReference {
                field: "gold_patch".into(),
                problem: "missing or not a string".into(),
            })?;
        let gold = parse(gold_text).map_err(|e| VerifyError::BadReference {
            field: "gold_patch".into(),
            problem: format!("unparsable diff: {e}"),
        })?;
        if gold.is_empty() {
            return Err(VerifyError::BadReference {
                field: "gold_patch".into(),
                problem: "empty patch".into(),
            });
        }
        let Some(answer) = response.answer else {
            return Ok(Reward {
                reward: 0.0,
                details: json!({"outcome": "empty", "note": "no final answer"}),
            });
        };
        let text = extract_patch(answer);
        if text.trim().is_empty() {
            return Ok(Reward {
                reward: 0.0,
                details: json!({"outcome": "empty"}),
            });
        }
        let predicted = match parse(text) {
            Ok(p) => p,
            Err(e) => {
                return Ok(Reward {
                    reward: -1.0,
                    details: json!({"outcome": "unparsable", "error": e.to_string()}),
                })
            }
        };
        if predicted.is_empty() {
            return Ok(Reward {
                reward: 0.0,
                details: json!({"outcome": "empty"}),
            });
        }
        let (lexical, files) = lexical_similarity(&predicted, &gold);
        if lexical == 1.0 {
            return Ok(Reward {
                reward: 1.0,
                details: json!({"outcome": "identical", "lexical": lexical, "files": files}),
            });
        }
        let semantic = self.scorer.score(&PatchPair {
            predicted: text,
            gold: gold_text,
            lexical,
            reference,
        })?;
        Ok(Reward {
            reward: semantic.score.clamp(0.0, 1.0) as f32,
            details: json!({
                "outcome": "semantic",
                "lexical": lexical,
                "files": files,
                "semantic": semantic.score,
                "scorer": semantic.details,
            }),
        })
    }
}
