//! SWE: a two-line Python file whose return line is wrong, and a sentence saying what it should
//! return. The gold patch is a unified diff replacing line 2; the gold answer is that diff in a
//! fence tagged `diff` (the block the SWE verifier extracts). Everything the fix needs is in the
//! prompt: the file name, the buggy line and the right expression.

use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value};

use crate::code::FnSpec;
use crate::common::{pick, short_prompt, Domain, Task};

/// Short names keep the diff answer near 90 bytes.
const FILES: [&str; 6] = ["f.py", "m.py", "ops.py", "lib.py", "app.py", "calc.py"];

const TEMPLATES: [&str; 3] = [
    "Fix {file} to return {expr}:",
    "{file} should return {expr}. Fix it:",
    "Bug in {file}: must return {expr}.",
];

/// The unified diff turning `return {bug}` into `return {fix}` on line 2 of `file`.
pub fn patch(file: &str, bug: &str, fix: &str) -> String {
    format!("--- a/{file}\n+++ b/{file}\n@@ -2 +2 @@\n-    return {bug}\n+    return {fix}\n")
}

/// `patch` in a fence tagged `diff`, as an answer.
pub fn fenced(patch: &str) -> String {
    format!("```diff\n{patch}```")
}

/// Draws one SWE task.
pub fn sample(rng: &mut ChaCha8Rng) -> Task {
    short_prompt(rng, sample_any)
}

fn sample_any(rng: &mut ChaCha8Rng) -> Task {
    let spec = FnSpec::sample(rng);
    let file = *pick(rng, &FILES);
    let fix = spec.expr();
    let bug = pick(rng, &spec.bugs()).clone();
    let header = pick(rng, &TEMPLATES)
        .replace("{file}", file)
        .replace("{expr}", &fix);
    let source = spec.source(&bug);
    let gold = patch(file, &bug, &fix);
    let mut reference = Map::new();
    reference.insert("gold_patch".into(), Value::from(gold.clone()));
    Task {
        domain: Domain::Swe,
        prompt: format!("{header}\n{}", source.trim_end()),
        reference,
        reasoning: format!("line 2 needs: return {fix}"),
        answer: fenced(&gold),
    }
}
