//! `cascade score` end to end: the real binary on a mixed JSONL file.

use std::process::Command;

use serde_json::{json, Value};

#[test]
fn scores_mixed_domains_in_order_and_reports_bad_lines() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let gold = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n";
    let near = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 3\n";
    let lines = [
        json!({"domain": "code", "response": "<think>\nsum\n</think>\n```python\na, b = map(int, input().split())\nprint(a + b)\n```",
               "tests": [{"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "5 7", "stdout": " 12 "}]}),
        json!({"domain": "code", "response": "```python\nprint(0)\n```", "tests": [{"stdin": "1 2\n", "stdout": "3\n"}]}),
        json!({"domain": "code", "response": "```python\ndef inc(x):\n    return x + 1\n```",
               "test_code": "def check(candidate):\n    assert candidate(1) == 2\n", "entry_point": "inc", "timeout_s": 5}),
        json!({"domain": "swe", "response": format!("```diff\n{gold}```"), "gold_patch": gold}),
        json!({"domain": "swe", "response": format!("```diff\n{near}```"), "gold_patch": gold}),
        json!({"domain": "swe", "response": "I would change the return value.", "gold_patch": gold}),
        json!({"domain": "swe", "response": "<think>hmm</think>", "gold_patch": gold}),
        json!({"domain": "rm", "response": "hello", "prompt": "hi"}),
    ];
    let mut text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    text.push_str("{\"domain\": \"code\", \"response\": \n");
    text.push_str(&format!("{}\n", json!({"domain": "code", "response": "```python\nprint(1)\n```", "tests": [{"stdin": "", "stdout": "1"}]})));
    std::fs::write(&input, text).unwrap();

    let out = Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(["score", "--workers", "2", "--input"])
        .arg(&input)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "errors present → exit 2; stderr: {stderr}"
    );
    assert!(
        stderr.contains("sandbox: network isolation"),
        "start-up isolation line: {stderr}"
    );
    let rows: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 10);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row["line"], json!(i + 1));
    }
    let rewards: Vec<Value> = rows.iter().map(|r| r["reward"].clone()).collect();
    assert_eq!(
        rewards[..7],
        [
            json!(1.0),
            json!(0.0),
            json!(1.0),
            json!(1.0),
            rewards[4].clone(),
            json!(-1.0),
            json!(0.0)
        ]
    );
    // One changed character out of two changed lines: high, not identical, via the fallback.
    let near_reward = rewards[4].as_f64().unwrap();
    assert!(near_reward > 0.9 && near_reward < 1.0, "{near_reward}");
    assert_eq!(
        rows[4]["details"]["scorer"]["scorer"],
        json!("lexical-fallback")
    );
    assert_eq!(
        rows[7]["error"],
        json!("domain rm needs --reward-model DIR")
    );
    assert!(
        rows[8]["error"]
            .as_str()
            .unwrap()
            .starts_with("malformed JSON"),
        "{}",
        rows[8]
    );
    assert_eq!(
        rows[9]["reward"],
        json!(1.0),
        "scoring continues after a bad line"
    );
    assert!(stderr.contains("scored 8 lines, 2 errors"), "{stderr}");
}

#[test]
fn missing_input_file_is_an_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(["score", "--input", "/nonexistent/in.jsonl"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("opening /nonexistent/in.jsonl"));
}

fn fixture(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(path)
}

fn read_json(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Runs `cascade score` on `lines` with extra arguments; returns (exit code, rows, stderr).
fn score(lines: &[Value], extra: &[&std::ffi::OsStr]) -> (Option<i32>, Vec<Value>, String) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(["score", "--workers", "2", "--input"])
        .arg(&input)
        .args(extra)
        .output()
        .unwrap();
    let rows = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (
        out.status.code(),
        rows,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn rm_domain_scores_with_the_reward_model() {
    // The transformers Qwen3ForSequenceClassification fixture (scripts/gen-rm-fixtures.py).
    let model = fixture("rm/model");
    let cases = read_json(&fixture("rm/cases.json"))["cases"].clone();
    let cases = cases.as_array().unwrap();
    let mut lines: Vec<Value> = cases
        .iter()
        .map(|c| json!({"domain": "rm", "prompt": c["prompt"], "response": c["response"]}))
        .collect();
    // The reward looks at the final answer only; `messages` works as well as `prompt`.
    lines.push(json!({"domain": "rm", "messages": [{"role": "user", "content": cases[1]["prompt"]}],
                      "response": format!("<think>\nadding\n</think>\n\n{}", cases[1]["response"].as_str().unwrap())}));
    lines.push(json!({"domain": "rm", "response": "no prompt"}));
    let (code, rows, stderr) = score(&lines, &["--reward-model".as_ref(), model.as_os_str()]);
    assert_eq!(code, Some(2), "one bad line → exit 2; stderr: {stderr}");
    assert_eq!(rows.len(), cases.len() + 2);
    for (i, c) in cases.iter().enumerate() {
        let (got, want) = (
            rows[i]["reward"].as_f64().unwrap(),
            c["score"].as_f64().unwrap(),
        );
        assert!(
            (got - want).abs() < 1e-4,
            "line {}: {got} vs transformers {want}",
            i + 1
        );
        assert_eq!(rows[i]["details"]["rm_score"], rows[i]["reward"]);
    }
    let n = cases.len();
    let want = cases[1]["score"].as_f64().unwrap();
    assert!(
        (rows[n]["reward"].as_f64().unwrap() - want).abs() < 1e-4,
        "{}",
        rows[n]
    );
    assert!(
        rows[n + 1]["error"]
            .as_str()
            .unwrap()
            .contains("reference field `prompt`"),
        "{}",
        rows[n + 1]
    );
    assert!(stderr.contains("scored 5 lines, 1 errors"), "{stderr}");
}

#[test]
fn swe_domain_uses_the_judge_model() {
    // The transformers judge fixture (scripts/gen-judge-fixtures.py).
    let model = fixture("judge/model");
    let case = read_json(&fixture("judge/cases.json"))["cases"][0].clone();
    let (gold, candidate) = (
        case["gold"].as_str().unwrap(),
        case["candidate"].as_str().unwrap(),
    );
    let lines = [
        json!({"domain": "swe", "response": format!("```diff\n{gold}```"), "gold_patch": gold, "prompt": case["issue"]}),
        json!({"domain": "swe", "response": format!("```diff\n{candidate}```"), "gold_patch": gold, "prompt": case["issue"]}),
        json!({"domain": "swe", "response": "I would change the return value.", "gold_patch": gold}),
        json!({"domain": "swe", "response": "<think>hmm</think>", "gold_patch": gold}),
        json!({"domain": "swe", "response": format!("```diff\n{candidate}```"), "gold_patch": gold,
               "prompt": "x".repeat(3000)}),
    ];
    let (code, rows, stderr) = score(&lines, &["--judge".as_ref(), model.as_os_str()]);
    assert_eq!(
        code,
        Some(2),
        "the over-long line is an error; stderr: {stderr}"
    );
    let rewards: Vec<Value> = rows.iter().map(|r| r["reward"].clone()).collect();
    assert_eq!(rewards[0], json!(1.0));
    assert_eq!(rewards[2], json!(-1.0));
    assert_eq!(rewards[3], json!(0.0));
    let judged = &rows[1];
    let want = case["score"].as_f64().unwrap();
    let got = judged["reward"].as_f64().unwrap();
    assert!(
        (got - want).abs() < 1e-4,
        "judge reward {got} vs transformers {want}"
    );
    assert_eq!(judged["details"]["outcome"], json!("semantic"));
    let details = &judged["details"]["scorer"];
    assert_eq!(details["scorer"], json!("judge"));
    assert_eq!(details["judge"], json!(model.display().to_string()));
    let p_yes = details["p_yes"].as_f64().unwrap();
    assert!(
        (p_yes - case["p_yes"].as_f64().unwrap()).abs() < 1e-4 * p_yes,
        "{details}"
    );
    assert!(
        rows[4]["error"]
            .as_str()
            .unwrap()
            .starts_with("verifier environment: judge model:"),
        "{}",
        rows[4]
    );
    assert!(stderr.contains("scored 4 lines, 1 errors"), "{stderr}");
}

#[test]
fn a_judge_that_does_not_load_fails_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let (code, rows, stderr) = score(
        &[json!({"domain": "math", "response": "\\boxed{1}", "answer": "1"})],
        &["--judge".as_ref(), dir.path().as_os_str()],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(rows.is_empty());
    assert!(stderr.contains("loading the judge model"), "{stderr}");
}
