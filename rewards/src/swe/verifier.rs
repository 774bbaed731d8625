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

/// Test fields an SWE row may carry (SWE-bench / SWE-Gym / SWE-smith / Nemotron RL-SWE): kept
/// with the row, never run by this execution-free verifier.
pub const TEST_FIELDS: [&str; 3] = ["FAIL_TO_PASS", "PASS_TO_PASS", "test_patch"];

/// The error for a row without `gold_patch`, saying which tests it has instead, if any.
fn missing_gold(reference: &Value) -> VerifyError {
    let tests: Vec<&str> = TEST_FIELDS
        .iter()
        .copied()
        .filter(|f| reference.get(*f).is_some_and(|v| !v.is_null()))
        .collect();
    let problem = if tests.is_empty() {
        "missing: the execution-free SWE reward compares the answer's patch with a gold patch"
            .to_string()
    } else {
        format!(
            "missing: this row has tests (`{}`) but no gold patch; the SWE reward is \
             execution-free (it compares the answer's patch with a gold patch) and does not run \
             tests, so the row cannot be scored by it",
            tests.join("`, `")
        )
    };
    VerifyError::BadReference {
        field: "gold_patch".into(),
        problem,
    }
}

/// Scores patches against `gold_patch`. Rows that also carry tests ([`TEST_FIELDS`]) are
/// scored against the gold patch alone (the paper's execution-free reward); a row with tests but
/// no gold patch is a [`VerifyError::BadReference`] naming `gold_patch` and the tests it has.
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
        let gold_text = match reference.get("gold_patch") {
            Some(Value::String(s)) => s.as_str(),
            Some(other) => {
                return Err(VerifyError::BadReference {
                    field: "gold_patch".into(),
                    problem: format!("must be a string (a unified diff), got {other}"),
                })
            }
            None => return Err(missing_gold(reference)),
        };
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

#[cfg(test)]
mod tests {
    use super::*;
    use cascade_shared::chat::split_response;

    const GOLD: &str = "--- a/src/calc.py\n+++ b/src/calc.py\n@@ -1,2 +1,2 @@\n def mean(xs):\n-    return sum(xs) / len(xs) + 1\n+    return sum(xs) / len(xs)\n";

    fn verify(reference: Value, answer: &str) -> Result<Reward, VerifyError> {
        SweVerifier::default().verify(&reference, &split_response(answer))
    }

    #[test]
    fn gold_patch_rows_score_with_or_without_tests() {
        let answer = format!("```diff\n{GOLD}```");
        // Nemotron RL-SWE: a gold patch and no tests.
        let r = verify(json!({"gold_patch": GOLD}), &answer).unwrap();
        assert_eq!(r.reward, 1.0);
        // SWE-bench / SWE-smith: tests are carried along and not needed.
        let r = verify(
            json!({"gold_patch": GOLD, "FAIL_TO_PASS": ["tests/test_calc.py::test_mean"],
                   "PASS_TO_PASS": [], "test_patch": null}),
            &answer,
        )
        .unwrap();
        assert_eq!(r.reward, 1.0);
        let r = verify(json!({"gold_patch": GOLD, "FAIL_TO_PASS": []}), "no patch").unwrap();
        assert!(r.reward <= 0.0, "{}", r.details);
    }

    #[test]
    fn rows_without_a_gold_patch_say_what_they_have() {
        let e = verify(
            json!({"FAIL_TO_PASS": ["tests/test_calc.py::test_mean"], "PASS_TO_PASS": [],
                   "test_patch": "--- a/t.py\n+++ b/t.py\n"}),
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("reference field `gold_patch`: missing"),
            "{e}"
        );
        assert!(
            e.contains("`FAIL_TO_PASS`, `PASS_TO_PASS`, `test_patch`")
                && e.contains("execution-free"),
            "{e}"
        );
        let e = verify(json!({"prompt": "p"}), "x").unwrap_err().to_string();
        assert!(e.contains("gold_patch") && !e.contains("has tests"), "{e}");
        let e = verify(json!({"gold_patch": 3}), "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be a string"), "{e}");
    }
}
