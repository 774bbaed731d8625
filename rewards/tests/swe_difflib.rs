//! The SWE lexical similarity against CPython's difflib (fixtures from
//! scripts/gen-swe-fixtures.py), and the reward rules end to end.

use anyhow::{Context, Result};
use cascade_rewards::swe::similarity::matching_chars;
use cascade_rewards::swe::{lexical_similarity, parse_diff, str_ratio};
use cascade_rewards::{SweVerifier, Verifier};
use cascade_shared::chat::split_response;
use serde_json::{json, Value};

fn fixture(name: &str) -> Result<Vec<Value>> {
    let path = format!(
        "{}/../tests/fixtures/rewards/swe/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    text.lines()
        .map(|l| serde_json::from_str(l).context("fixture line"))
        .collect()
}

#[test]
fn ratio_matches_python_difflib_exactly() -> Result<()> {
    let rows = fixture("ratio_pairs.jsonl")?;
    assert_eq!(rows.len(), 300);
    for (i, row) in rows.iter().enumerate() {
        let (a, b) = (row["a"].as_str().unwrap(), row["b"].as_str().unwrap());
        // The matched-character count must be identical; the ratio is compared with a tolerance
        // only because JSON float parsing may be off by one ulp.
        let (ac, bc): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
        assert_eq!(
            matching_chars(&ac, &bc) as u64,
            row["matches"].as_u64().unwrap(),
            "pair {i}: {a:?} vs {b:?}"
        );
        let expected = row["ratio"].as_f64().unwrap();
        assert!((str_ratio(a, b) - expected).abs() < 1e-15, "pair {i}");
    }
    Ok(())
}

#[test]
fn patch_similarity_matches_python() -> Result<()> {
    let rows = fixture("patch_pairs.jsonl")?;
    assert!(rows.len() >= 50);
    let verifier = SweVerifier::default();
    for (i, row) in rows.iter().enumerate() {
        let (pred, gold) = (
            row["predicted"].as_str().unwrap(),
            row["gold"].as_str().unwrap(),
        );
        let expected = row["similarity"].as_f64().unwrap();
        let (sim, _) = lexical_similarity(&parse_diff(pred)?, &parse_diff(gold)?);
        assert!(
            (sim - expected).abs() < 1e-12,
            "pair {i}: {sim} vs python {expected}"
        );
        let r = verifier.verify(
            &json!({"gold_patch": gold}),
            &split_response(&format!("```diff\n{pred}```")),
        )?;
        let want = if expected == 1.0 {
            1.0
        } else {
            expected as f32
        };
        assert!(
            (r.reward - want).abs() < 1e-6,
            "pair {i}: reward {} vs {want}",
            r.reward
        );
    }
    Ok(())
}

#[test]
fn reward_rules() -> Result<()> {
    let gold = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n";
    let reference = json!({"gold_patch": gold});
    let v = SweVerifier::default();
    let score = |answer: &str| {
        v.verify(&reference, &split_response(answer))
            .map(|r| r.reward)
    };
    assert_eq!(score(&format!("<think>x</think>```diff\n{gold}```"))?, 1.0);
    // Trailing whitespace on changed lines is normalised away.
    assert_eq!(
        score("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1  \n+a = 2\t\n")?,
        1.0
    );
    assert_eq!(score("")?, 0.0);
    assert_eq!(score("<think>never closed")?, 0.0);
    assert_eq!(score("```diff\n```")?, 0.0);
    assert_eq!(score("Just change a to 2.")?, -1.0);
    assert_eq!(
        score("```diff\n--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n-a = 1\n```")?,
        -1.0
    );
    // A different file only: similarity 0 for both files, through the lexical fallback.
    let other = score("--- a/y.py\n+++ b/y.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n")?;
    assert_eq!(other, 0.0);
    assert!(
        v.verify(&json!({}), &split_response(gold)).is_err(),
        "missing gold_patch is a dataset error"
    );
    Ok(())
}
