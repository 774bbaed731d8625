//! SWE: a two-line Python file whose return line is wrong, and a sentence saying what it should
//! return. The gold patch is a unified diff replacing line 2; the gold answer is that diff,
//! bare (the SWE verifier reads an answer that starts with `--- ` as the patch, as it reads a
//! fenced `diff` block). Everything the fix needs is in the prompt: the file name, the buggy
//! line and the right expression.
//!
//! Bare, not fenced: the code answers are fenced `python` blocks, and with both domains opening
//! their answers with a fence the SWE stage taught the tiny model to continue a `python` fence
//! with `--- ` (code held-out fell from 0.84 to 0.33 in one run, measured on 96 prompts × 4
//! samples), and the code stage pulled SWE answers the other way.
//!
//! Each row also carries the repository (`files`: `f.py` before the fix) and the code domain's
//! `check(candidate)` test (`test_code`, `entry_point`), so the SWE reward's semantic score can
//! run the test on the patched file (`cascade_rewards::swe::TestScorer`): a patch that is not
//! the gold scores 1 if it fixes the function, 0 if not. Without them the semantic score is the
//! lexical ratio, which gives a one-character near miss (`return x + 2` for `return x * 2`)
//! 0.97: after SFT the tiny model fixed 18 % of held-out bugs and scored 0.90, so the SWE stage
//! had almost nothing to learn from and no room to show it.
//!
//! Every task patches the same file, `f.py` (the file of the function `f`). With six file names
//! drawn at random, the tiny model never learned to copy the name from the prompt (the diff's
//! path was right in 18 % of samples, chance is 17 %), and a patch to the wrong path scores 0,
//! so the SWE stage's reward was a lottery over file names rather than a signal about the fix.

use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value};

use crate::code::FnSpec;
use crate::common::{pick, short_prompt, Domain, Task};

/// The patched file (see the module docs for why there is only one).
const FILE: &str = "f.py";

const TEMPLATES: [&str; 3] = [
    "Fix {file} to return {expr}:",
    "{file} should return {expr}. Fix it:",
    "Bug in {file}: must return {expr}.",
];

/// The unified diff turning `return {bug}` into `return {fix}` on line 2 of `file`.
pub fn patch(file: &str, bug: &str, fix: &str) -> String {
    format!("--- a/{file}\n+++ b/{file}\n@@ -2 +2 @@\n-    return {bug}\n+    return {fix}\n")
}

/// Draws one SWE task.
pub fn sample(rng: &mut ChaCha8Rng) -> Task {
    short_prompt(rng, sample_any)
}

fn sample_any(rng: &mut ChaCha8Rng) -> Task {
    let spec = FnSpec::sample(rng);
    let file = FILE;
    let fix = spec.expr();
    let bug = pick(rng, &spec.bugs()).clone();
    let header = pick(rng, &TEMPLATES)
        .replace("{file}", file)
        .replace("{expr}", &fix);
    let source = spec.source(&bug);
    let gold = patch(file, &bug, &fix);
    let mut reference = Map::new();
    reference.insert("gold_patch".into(), Value::from(gold.clone()));
    let mut files = Map::new();
    files.insert(file.into(), Value::from(source.clone()));
    reference.insert("files".into(), Value::Object(files));
    reference.insert("test_code".into(), Value::from(spec.test_code()));
    reference.insert("entry_point".into(), Value::from(spec.name.clone()));
    Task {
        domain: Domain::Swe,
        prompt: format!("{header}\n{}", source.trim_end()),
        reference,
        reasoning: format!("line 2 needs: return {fix}"),
        answer: gold,
    }
}
