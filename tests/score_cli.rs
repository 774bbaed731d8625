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
