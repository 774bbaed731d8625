//! A [`SemanticScorer`] that runs the row's tests: "do these two patches fix the same issue?"
//! answered by applying the predicted patch to the repository the row carries and running its
//! check in the code sandbox.
//!
//! RECIPE.md's SWE reward asks a judge model for the semantic score of a patch that is neither
//! identical to the gold, empty nor unparsable. Where a row carries the repository and a test,
//! the question has an exact answer: the patch fixes the issue when the patched repository
//! passes the test the gold patch passes. A judge-free lexical ratio cannot tell a fix from a
//! near miss (`return x + 2` for `return x * 2` scores 0.97), so on such rows the reward carries
//! almost no signal; this scorer gives 1 or 0.
//!
//! Row fields (all three, or none): `files` (path → text of the repository before the patch; one
//! Python file, the program the check imports), `test_code` (a HumanEval-style
//! `check(candidate)`) and `entry_point` (the function passed to it); `timeout_s` as the code
//! verifier reads it. Rows without them go to the fallback scorer (the judge, or the lexical
//! ratio), and the details say so.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde_json::{json, Value};

use super::diff::parse;
use super::scorer::{PatchPair, SemanticScore, SemanticScorer};
use crate::code::{CodeConfig, CodeVerifier};
use crate::VerifyError;

/// The row fields this scorer reads.
pub const REPO_FIELDS: [&str; 3] = ["files", "test_code", "entry_point"];

/// Scores a patch by running the row's check on the patched repository (see the module docs);
/// rows without a repository go to `fallback`.
pub struct TestScorer {
    code: CodeConfig,
    /// Built on first use, so a run whose rows carry no repository never probes the sandbox.
    verifier: OnceLock<Result<CodeVerifier, String>>,
    fallback: Box<dyn SemanticScorer>,
}

impl TestScorer {
    /// A scorer running checks with the code verifier's settings `code`.
    pub fn new(code: CodeConfig, fallback: Box<dyn SemanticScorer>) -> Self {
        Self {
            code,
            verifier: OnceLock::new(),
            fallback,
        }
    }

    fn verifier(&self) -> Result<&CodeVerifier, VerifyError> {
        self.verifier
            .get_or_init(|| CodeVerifier::new(self.code.clone()).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| VerifyError::Environment(format!("SWE test scorer: {e}")))
    }
}

fn zero(outcome: &str, why: String) -> SemanticScore {
    SemanticScore {
        score: 0.0,
        details: json!({"scorer": "tests", "outcome": outcome, "error": why}),
    }
}

/// What a row carries to run its test: the files before the patch, the check, its entry point.
struct Repository<'a> {
    files: BTreeMap<String, String>,
    test_code: &'a str,
    entry_point: &'a str,
}

/// The repository, check and entry point of a row, or `None` when it carries none of them.
fn repository(reference: &Value) -> Result<Option<Repository<'_>>, VerifyError> {
    let present: Vec<&str> = REPO_FIELDS
        .iter()
        .copied()
        .filter(|f| reference.get(*f).is_some_and(|v| !v.is_null()))
        .collect();
    if present.is_empty() {
        return Ok(None);
    }
    if present.len() < REPO_FIELDS.len() {
        let missing: Vec<&str> = REPO_FIELDS
            .iter()
            .copied()
            .filter(|f| !present.contains(f))
            .collect();
        return Err(VerifyError::BadReference {
            field: missing[0].into(),
            problem: format!(
                "missing: the row has `{}` but running its test needs `{}` too",
                present.join("`, `"),
                REPO_FIELDS.join("`, `")
            ),
        });
    }
    let bad = |field: &str, problem: &str| VerifyError::BadReference {
        field: field.into(),
        problem: problem.into(),
    };
    let files = reference["files"]
        .as_object()
        .ok_or_else(|| bad("files", "must be an object mapping paths to file texts"))?;
    let mut repo = BTreeMap::new();
    for (path, text) in files {
        let text = text
            .as_str()
            .ok_or_else(|| bad(&format!("files.{path}"), "must be a string"))?;
        repo.insert(path.clone(), text.to_string());
    }
    if repo.keys().filter(|p| p.ends_with(".py")).count() != 1 {
        return Err(bad(
            "files",
            "must hold exactly one Python file (the program the check imports); the test \
             scorer runs single-file repositories",
        ));
    }
    let test_code = reference["test_code"]
        .as_str()
        .ok_or_else(|| bad("test_code", "must be a string"))?;
    let entry_point = reference["entry_point"]
        .as_str()
        .ok_or_else(|| bad("entry_point", "must be a string"))?;
    Ok(Some(Repository {
        files: repo,
        test_code,
        entry_point,
    }))
}

impl SemanticScorer for TestScorer {
    fn name(&self) -> &'static str {
        "tests"
    }

    fn score(&self, pair: &PatchPair<'_>) -> Result<SemanticScore, VerifyError> {
        // The reference is checked before the patch, so a dataset bug is reported whatever the
        // model wrote.
        let Some(Repository {
            files: mut repo,
            test_code,
            entry_point,
        }) = repository(pair.reference)?
        else {
            let mut s = self.fallback.score(pair)?;
            if let Value::Object(d) = &mut s.details {
                d.insert(
                    "tests".into(),
                    json!("the row carries no repository and test (`files`, `test_code`, `entry_point`)"),
                );
            }
            return Ok(s);
        };
        let timeout_s = match pair.reference.get("timeout_s") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_f64().ok_or_else(|| VerifyError::BadReference {
                field: "timeout_s".into(),
                problem: "not a number".into(),
            })?),
        };
        let patch = match parse(pair.predicted) {
            Ok(p) => p,
            Err(e) => return Ok(zero("unparsable", e.to_string())),
        };
        for file in &patch.files {
            let Some(text) = repo.get_mut(&file.path) else {
                return Ok(zero(
                    "does_not_apply",
                    format!("patches {}, which is not in the repository", file.path),
                ));
            };
            match file.apply(text) {
                Ok(patched) => *text = patched,
                Err(e) => return Ok(zero("does_not_apply", e.to_string())),
            }
        }
        let program = repo
            .iter()
            .find(|(p, _)| p.ends_with(".py"))
            .map(|(_, t)| t.as_str())
            .unwrap_or_default();
        let run = self
            .verifier()?
            .check_program(program, test_code, entry_point, timeout_s)?;
        let mut details = json!({"scorer": "tests", "outcome": if run.reward >= 1.0 { "passed" } else { "failed" }});
        details["run"] = run.details;
        Ok(SemanticScore {
            score: f64::from(run.reward),
            details,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swe::LexicalFallback;

    const FILE: &str = "def f(x):\n    return x - 3\n";
    const GOLD: &str =
        "--- a/f.py\n+++ b/f.py\n@@ -2 +2 @@\n-    return x - 3\n+    return x + 3\n";

    fn row() -> Value {
        json!({
            "gold_patch": GOLD,
            "files": {"f.py": FILE},
            "test_code": "def check(candidate):\n    assert candidate(1) == 4\n    assert candidate(-3) == 0\n",
            "entry_point": "f",
        })
    }

    fn score(reference: &Value, predicted: &str) -> Result<SemanticScore, VerifyError> {
        let scorer = TestScorer::new(CodeConfig::default(), Box::new(LexicalFallback));
        scorer.score(&PatchPair {
            predicted,
            gold: GOLD,
            lexical: 0.5,
            reference,
        })
    }

    #[test]
    fn rows_without_a_repository_go_to_the_fallback() {
        let s = score(&json!({"gold_patch": GOLD}), "--- a/f.py\n+++ b/f.py\n").unwrap();
        assert_eq!(s.score, 0.5);
        assert_eq!(s.details["scorer"], "lexical-fallback");
        assert!(s.details["tests"]
            .as_str()
            .unwrap()
            .contains("no repository"));
    }

    #[test]
    fn incomplete_or_malformed_repositories_are_bad_references() {
        let mut r = row();
        r.as_object_mut().unwrap().remove("entry_point");
        let e = score(&r, GOLD).unwrap_err().to_string();
        assert!(e.contains("`entry_point`") && e.contains("missing"), "{e}");
        let mut r = row();
        r["files"] = json!({"a.py": "", "b.py": ""});
        let e = score(&r, GOLD).unwrap_err().to_string();
        assert!(e.contains("exactly one Python file"), "{e}");
        let mut r = row();
        r["files"] = json!(["f.py"]);
        assert!(score(&r, GOLD).is_err());
    }

    #[test]
    fn patches_that_do_not_apply_score_zero() {
        let wrong_line =
            "--- a/f.py\n+++ b/f.py\n@@ -2 +2 @@\n-    return x * 3\n+    return x + 3\n";
        let s = score(&row(), wrong_line).unwrap();
        assert_eq!(
            (s.score, s.details["outcome"].as_str()),
            (0.0, Some("does_not_apply"))
        );
        let other_file =
            "--- a/g.py\n+++ b/g.py\n@@ -2 +2 @@\n-    return x - 3\n+    return x + 3\n";
        let s = score(&row(), other_file).unwrap();
        assert_eq!(s.score, 0.0);
        assert!(
            s.details["error"].as_str().unwrap().contains("g.py"),
            "{}",
            s.details
        );
    }
}
