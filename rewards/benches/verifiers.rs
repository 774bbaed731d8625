//! Math and IFEval verifier throughput, printed as a table:
//! `cargo bench -p cascade-rewards --bench verifiers`.
//!
//! Runs each verifier over its whole reference fixture (1377 math pairs, 213 IFEval cases) for a
//! few seconds and reports verifications per second on one thread. The baseline, measured in the
//! same run on the same inputs, is the Python reference (math-verify `parse`+`verify`; lm-eval's
//! strict IFEval check) from the venv of `scripts/setup-rewards-ref.sh`
//! (`$CASCADE_REWARDS_REF`, default /tmp/cascade-rewards-ref); without it the ratio is "n/a".

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cascade_rewards::math::MathConfig;
use cascade_rewards::{IfEvalVerifier, MathVerifier, Verifier};
use cascade_shared::chat::split_response;
use serde_json::{json, Value};

fn fixture(rel: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/rewards")
        .join(rel);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).expect("fixture line"))
        .collect()
}

/// Verifications per second of `verifier` over `items` (repeated for at least `min`).
fn rate(verifier: &dyn Verifier, items: &[(Value, String)], min: Duration) -> f64 {
    let start = Instant::now();
    let mut done = 0usize;
    while start.elapsed() < min {
        for (reference, response) in items {
            let r = verifier
                .verify(reference, &split_response(response))
                .expect("verify");
            std::hint::black_box(r);
            done += 1;
        }
    }
    done as f64 / start.elapsed().as_secs_f64()
}

const PY_BENCH: &str = r#"
import json, os, sys, time, importlib.util, io, contextlib, logging
logging.disable(logging.CRITICAL)
kind, path = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(path)][1:]
if kind == "math":
    from math_verify import parse, verify
    def one(r):
        g = r["answer"]
        verify(parse(g if g.strip().startswith("$") or g.strip().lstrip("-").isdigit() else "$" + g + "$"), parse(r["response"]))
else:
    spec = importlib.util.find_spec("llama_index.core")
    os.environ["NLTK_DATA"] = os.path.join(list(spec.submodule_search_locations)[0], "_static", "nltk_cache")
    import langdetect; langdetect.DetectorFactory.seed = 0
    from lm_eval.tasks.ifeval import utils as u
    def one(r):
        u.test_instruction_following_strict(u.InputExample(0, r["instruction_id_list"], r["prompt"], r["kwargs"]), r["response"])
for r in rows[:20]:
    one(r)
n, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < 3.0:
    for r in rows:
        one(r)
        n += 1
print(n / (time.perf_counter() - t0))
"#;

fn python_rate(kind: &str, fixture: &Path) -> Option<f64> {
    let env =
        std::env::var("CASCADE_REWARDS_REF").unwrap_or_else(|_| "/tmp/cascade-rewards-ref".into());
    let py = Path::new(&env).join("bin/python");
    if !py.exists() {
        return None;
    }
    let out = Command::new(py)
        .arg("-c")
        .arg(PY_BENCH)
        .arg(kind)
        .arg(fixture)
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "python baseline failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .lines()
        .last()?
        .parse()
        .ok()
}

fn main() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/rewards");
    let math: Vec<(Value, String)> = fixture("math/pairs.jsonl")
        .into_iter()
        .map(|r| {
            (
                json!({ "answer": r["answer"] }),
                r["response"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let ifeval: Vec<(Value, String)> = fixture("ifeval/cases.jsonl")
        .into_iter()
        .map(|r| {
            let response = r["response"].as_str().unwrap_or("").to_string();
            (r, response)
        })
        .collect();
    let min = Duration::from_secs(3);
    let rows = [
        (
            "math",
            rate(
                &MathVerifier::new(MathConfig {
                    percent_equivalence: true,
                    ..MathConfig::default()
                }),
                &math,
                min,
            ),
            python_rate("math", &dir.join("math/pairs.jsonl")),
        ),
        (
            "if (strict)",
            rate(&IfEvalVerifier::default(), &ifeval, min),
            python_rate("if", &dir.join("ifeval/cases.jsonl")),
        ),
    ];
    println!(
        "{:<12} {:>16} {:>22} {:>10}",
        "verifier", "ours (verif/s)", "python ref (verif/s)", "ratio"
    );
    for (name, ours, py) in rows {
        match py {
            Some(p) => println!("{name:<12} {ours:>16.0} {p:>22.0} {:>9.1}x", ours / p),
            None => println!("{name:<12} {ours:>16.0} {:>22} {:>10}", "n/a", "n/a"),
        }
    }
}
