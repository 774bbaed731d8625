//! The code verifier on real problems in the layouts the dataset presets read: LiveCodeBench
//! code generation (LeetCode "functional" tests and AtCoder stdin tests, private tests as base64 +
//! zlib + pickle) and APPS/TACO (`fn_name` call-based problems, plain and `class Solution`, and
//! stdin problems). The rows of `tests/fixtures/rewards/code/{livecodebench,apps}_real.jsonl`
//! (written by `scripts/gen-code-fixtures.py`) go through the presets exactly as a training run
//! reads them, and each is scored with a correct solution (reward 1), wrong ones (0) and hostile
//! ones (0, with the scorer healthy afterwards).

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::OnceLock;

use cascade_rewards::code::CodeConfig;
use cascade_rewards::{CodeVerifier, Reward, Verifier, VerifyError};
use cascade_shared::chat::split_response;
use cascade_shared::data::presets::Mapped;
use cascade_shared::data::{MapOptions, Preset};
use serde_json::{json, Map, Value};

fn verifier() -> &'static CodeVerifier {
    static V: OnceLock<CodeVerifier> = OnceLock::new();
    V.get_or_init(|| CodeVerifier::new(CodeConfig::default()).expect("sandbox available"))
}

/// The canonical rows (reference objects) of a fixture file mapped by `preset`, exactly as the
/// preset emits them. (`Preset::map` directly: the reader's per-domain check in
/// `shared/src/data/record.rs` still rejects rows with only call-based tests.)
fn rows(file: &str, preset: Preset) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/rewards/code")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("fixture");
    text.lines()
        .map(|line| {
            let row: Map<String, Value> = serde_json::from_str(line).expect("JSON row");
            match preset.map(row, &MapOptions::default()).expect("row maps") {
                Mapped::Row(obj) => Value::Object(obj),
                Mapped::Skip(why) => panic!("{file}: skipped: {why}"),
            }
        })
        .collect()
}

fn lcb() -> &'static [Value] {
    static R: OnceLock<Vec<Value>> = OnceLock::new();
    R.get_or_init(|| rows("livecodebench_real.jsonl", Preset::LiveCodeBench))
}

fn apps() -> &'static [Value] {
    static R: OnceLock<Vec<Value>> = OnceLock::new();
    R.get_or_init(|| rows("apps_real.jsonl", Preset::Apps))
}

fn score(reference: &Value, program: &str) -> Reward {
    let response = format!("<think>\nok\n</think>\n\n```python\n{program}\n```");
    verifier()
        .verify(reference, &split_response(&response))
        .expect("verifies")
}

fn assert_scores(reference: &Value, program: &str, want: f32) -> Reward {
    let r = score(reference, program);
    assert_eq!(r.reward, want, "{program}\n{}", r.details);
    r
}

const TWO_SUM: &str = "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        seen = {}\n        for i, x in enumerate(nums):\n            if target - x in seen:\n                return [seen[target - x], i]\n            seen[x] = i\n";

#[test]
fn presets_emit_call_tests_with_starter_code_in_the_prompt() {
    let two_sum = &lcb()[0];
    assert_eq!(two_sum["fn_name"], json!("twoSum"));
    // 2 public + 3 private (decoded from the pickle blob).
    assert_eq!(two_sum["call_tests"].as_array().unwrap().len(), 5);
    assert!(two_sum["prompt"]
        .as_str()
        .unwrap()
        .contains("def twoSum(self, nums: List[int], target: int)"));
    assert_eq!(apps()[0]["fn_name"], json!("even_or_odd"));
    assert!(apps()[0]["prompt"]
        .as_str()
        .unwrap()
        .contains("def even_or_odd(number):"));
    assert!(lcb()[3].get("tests").is_some() && lcb()[3].get("call_tests").is_none());
}

#[test]
fn livecodebench_functional_leetcode() {
    let [two_sum, fascinating, prefix] = [&lcb()[0], &lcb()[1], &lcb()[2]];
    let r = assert_scores(two_sum, TWO_SUM, 1.0);
    assert_eq!(r.details["passed"], json!(5));
    assert_eq!(r.details["kind"], json!("call"));
    // A tuple result counts as the list (LiveCodeBench converts it).
    assert_scores(
        two_sum,
        &TWO_SUM.replace("[seen[target - x], i]", "(seen[target - x], i)"),
        1.0,
    );
    // Wrong order of the indices: fails on the first case.
    let r = assert_scores(
        two_sum,
        &TWO_SUM.replace("[seen[target - x], i]", "[i, seen[target - x]]"),
        0.0,
    );
    assert_eq!(r.details["failure"]["test"], json!(0), "{}", r.details);
    assert_eq!(r.details["failure"]["error"], json!("wrong answer"));
    // Right on the public tests only (hard-coded): the private ones catch it.
    let r = assert_scores(
        two_sum,
        "class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1] if nums[0] == 2 else [1, 2]\n",
        0.0,
    );
    assert_eq!(r.details["passed"], json!(2), "{}", r.details);
    // A module-level function instead of the method still answers (the name is resolved on
    // `Solution()` only when the program defines it).
    assert_scores(
        two_sum,
        "def twoSum(nums, target):\n    return sorted(i for i, x in enumerate(nums) for j, y in enumerate(nums) if i != j and x + y == target)[:2]\n",
        1.0,
    );
    // JSON booleans: `true` is True, and 1 is not accepted for a wrong answer.
    let fasc = "class Solution:\n    def isFascinating(self, n: int) -> bool:\n        s = str(n) + str(2 * n) + str(3 * n)\n        return len(s) == 9 and set(s) == set('123456789')\n";
    assert_scores(fascinating, fasc, 1.0);
    // Checks only for zeros: wrong on 111 (a private test).
    assert_scores(
        fascinating,
        "class Solution:\n    def isFascinating(self, n):\n        return '0' not in str(n) + str(2 * n) + str(3 * n)\n",
        0.0,
    );
    assert_scores(
        prefix,
        "class Solution:\n    def longestCommonPrefix(self, strs):\n        import os\n        return os.path.commonprefix(strs)\n",
        1.0,
    );
    assert_scores(
        prefix,
        "class Solution:\n    def longestCommonPrefix(self, strs):\n        return strs[0][:2]\n",
        0.0,
    );
    // The wrong method name: a clear failure, not an error.
    let r = assert_scores(
        prefix,
        "class Solution:\n    def lcp(self, strs):\n        return ''\n",
        0.0,
    );
    assert!(
        r.details["failure"]["error"]
            .as_str()
            .unwrap()
            .contains("missing entry point `longestCommonPrefix`"),
        "{}",
        r.details
    );
}

#[test]
fn livecodebench_stdin_uses_its_line_and_decimal_rule() {
    let [product, exam] = [&lcb()[3], &lcb()[4]];
    let product_ok =
        "a, b = map(int, input().split())\nprint('Even' if a * b % 2 == 0 else 'Odd')\n";
    let r = assert_scores(product, product_ok, 1.0);
    assert_eq!(r.details["kind"], json!("stdio"));
    assert_scores(
        product,
        "a, b = map(int, input().split())\nprint('Odd' if a * b % 2 == 0 else 'Even')\n",
        0.0,
    );
    // Trailing spaces and blank lines are stripped; the line structure is not.
    assert_scores(
        product,
        "a, b = map(int, input().split())\nprint('Even ' if a * b % 2 == 0 else 'Odd ')\nprint()\n",
        1.0,
    );
    // LiveCodeBench compares decimals exactly: the expected digits must be printed.
    assert_scores(
        exam,
        "t, x = map(int, input().split())\nprint(f'{t / x:.10f}')\n",
        1.0,
    );
    assert_scores(
        exam,
        "t, x = map(int, input().split())\nprint(t / x)\n",
        0.0,
    );
    // Under the APPS rule (asked for explicitly) the same program passes by float tolerance.
    let mut apps_rule = exam.clone();
    apps_rule["stdout_compare"] = json!("apps");
    assert_scores(
        &apps_rule,
        "t, x = map(int, input().split())\nprint(t / x)\n",
        1.0,
    );
}

#[test]
fn apps_call_based_and_stdin() {
    let [even, digits, profit, div, melon] =
        [&apps()[0], &apps()[1], &apps()[2], &apps()[3], &apps()[4]];
    // Outputs stored wrapped in a list ([["Even"]]): the bare value matches.
    assert_scores(
        even,
        "def even_or_odd(number):\n    return 'Odd' if number % 2 else 'Even'\n",
        1.0,
    );
    assert_scores(
        even,
        "def even_or_odd(number):\n    return 'Even' if number > 0 else 'Odd'\n",
        0.0,
    );
    assert_scores(
        digits,
        "def digitize(n):\n    return [int(d) for d in reversed(str(n))]\n",
        1.0,
    );
    assert_scores(
        digits,
        "def digitize(n):\n    return tuple(int(d) for d in reversed(str(n)))\n",
        1.0,
    );
    assert_scores(
        digits,
        "def digitize(n):\n    return [int(d) for d in str(n)]\n",
        0.0,
    );
    // A TACO LeetCode row: bare outputs, `class Solution`.
    let mp = "class Solution:\n    def maxProfit(self, prices: List[int]) -> int:\n        best, low = 0, prices[0]\n        for p in prices:\n            low = min(low, p)\n            best = max(best, p - low)\n        return best\n";
    assert_scores(profit, mp, 1.0);
    assert_scores(
        profit,
        "class Solution:\n    def maxProfit(self, prices):\n        return max(prices) - min(prices)\n",
        0.0,
    );
    // stdin with APPS's float tolerance.
    assert_scores(div, "a, b = map(int, input().split())\nprint(a / b)\n", 1.0);
    assert_scores(
        div,
        "a, b = map(int, input().split())\nprint(round(a / b, 2))\n",
        0.0,
    );
    assert_scores(
        melon,
        "w = int(input())\nprint('YES' if w % 2 == 0 and w > 2 else 'NO')\n",
        1.0,
    );
    assert_scores(
        melon,
        "w = int(input())\nprint('YES' if w % 2 == 0 else 'NO')\n",
        0.0,
    );
}

#[test]
fn hostile_call_based_programs_score_zero_and_the_scorer_stays_healthy() {
    let two_sum = &lcb()[0];
    let mut quick = two_sum.clone();
    quick["timeout_s"] = json!(2.0);
    // Each would be a correct answer if its attack silently did nothing.
    let correct_body = "        seen = {}\n        for i, x in enumerate(nums):\n            if target - x in seen:\n                return [seen[target - x], i]\n            seen[x] = i\n";
    let method = |attack: &str| {
        let attack = attack.replace('\n', "\n        ");
        format!("class Solution:\n    def twoSum(self, nums, target):\n        {attack}\n{correct_body}")
    };
    // Infinite loop inside the call, and at import time.
    let r = assert_scores(&quick, &method("while True:\n    pass"), 0.0);
    assert!(
        r.details["failure"]["error"]
            .as_str()
            .unwrap()
            .contains("timed out"),
        "{}",
        r.details
    );
    assert_scores(&quick, &format!("while True:\n    pass\n{TWO_SUM}"), 0.0);
    // A huge return value.
    assert_scores(two_sum, &method("return 'x' * (1 << 28)"), 0.0);
    // Writing outside the scratch directory.
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("escaped");
    assert_scores(
        two_sum,
        &method(&format!(
            "open({:?}, 'w').write('pwned')",
            target.to_str().unwrap()
        )),
        0.0,
    );
    assert!(!target.exists());
    // The network.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    assert_scores(
        two_sum,
        &method(&format!(
            "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')"
        )),
        0.0,
    );
    assert!(
        listener.accept().is_err(),
        "the sandbox reached a host socket"
    );
    // Looking for the expected outputs: the test file is gone and not in the program's memory.
    assert_scores(
        two_sum,
        "import gc, json\nclass Solution:\n    def twoSum(self, nums, target):\n        for o in gc.get_objects():\n            if isinstance(o, dict) and 'cases' in o:\n                return o['cases']\n        return json.load(open('cases.json'))\n",
        0.0,
    );
    // A forged equality.
    assert_scores(
        two_sum,
        "class Any(list):\n    def __eq__(self, other):\n        return True\nclass Solution:\n    def twoSum(self, nums, target):\n        return Any()\n",
        0.0,
    );
    // Exiting from inside the call.
    assert_scores(&quick, &method("import os\nos._exit(0)"), 0.0);
    assert_scores(two_sum, &method("raise SystemExit(0)"), 0.0);
    // Printing a lot goes nowhere: the answer is still judged on its return value.
    assert_scores(
        two_sum,
        &method("import sys\nfor _ in range(64):\n    sys.stdout.write('x' * (1 << 20))"),
        1.0,
    );
    // Healthy afterwards.
    assert_scores(two_sum, TWO_SUM, 1.0);
}

#[test]
fn bad_call_test_references_are_errors_naming_the_field() {
    let response = split_response("```python\ndef f(x):\n    return x\n```");
    let err = |reference: Value| -> String {
        match verifier().verify(&reference, &response) {
            Err(e @ VerifyError::BadReference { .. }) => e.to_string(),
            other => panic!("expected a reference error, got {other:?}"),
        }
    };
    let e = err(json!({"call_tests": [{"input": "1", "output": "1"}]}));
    assert!(e.contains("`fn_name`"), "{e}");
    let e = err(json!({"fn_name": "f x", "call_tests": [{"input": "1", "output": "1"}]}));
    assert!(e.contains("`fn_name`") && e.contains("identifier"), "{e}");
    let e = err(json!({"fn_name": "f", "call_tests": [{"input": "1\n{oops", "output": "1"}]}));
    assert!(
        e.contains("call_tests[0].input") && e.contains("line 2"),
        "{e}"
    );
    let e = err(json!({"fn_name": "f", "call_tests": [{"input": "1", "output": 1}]}));
    assert!(e.contains("call_tests[0].output"), "{e}");
    let e = err(json!({"fn_name": "f", "call_tests": [{"input": 1, "output": 1}]}));
    assert!(e.contains("call_tests[0].input"), "{e}");
    let e = err(json!({"fn_name": "f", "call_tests": []}));
    assert!(e.contains("no test cases"), "{e}");
    let e = err(json!({"tests": [], "stdout_compare": "exact"}));
    assert!(e.contains("stdout_compare"), "{e}");
    let e = err(json!({"prompt": "x"}));
    assert!(e.contains("call_tests") && e.contains("test_code"), "{e}");
}

/// `cascade score` takes a converted row with `response` and `domain` added: the call-based
/// fields are read from the line as the presets wrote them.
#[test]
fn score_lines_of_converted_rows() {
    let mut scorer = cascade_rewards::Scorer::new();
    scorer.register(
        "code",
        Box::new(CodeVerifier::new(CodeConfig::default()).expect("sandbox available")),
    );
    let mut input = String::new();
    for (row, response) in [
        (&lcb()[0], format!("```python\n{TWO_SUM}```")),
        (
            &apps()[0],
            "```python\ndef even_or_odd(n):\n    return 'Even'\n```".to_string(),
        ),
    ] {
        let mut line = row.clone();
        line["response"] = json!(response);
        assert_eq!(line["domain"], json!("code"), "the presets name the domain");
        input.push_str(&format!("{line}\n"));
    }
    let mut out = Vec::new();
    let summary = scorer.score_stream(input.as_bytes(), &mut out, 2).unwrap();
    assert_eq!((summary.scored, summary.errors), (2, 0));
    let lines: Vec<Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["reward"], json!(1.0), "{}", lines[0]);
    assert_eq!(lines[1]["reward"], json!(0.0), "{}", lines[1]);
    assert_eq!(
        lines[1]["details"]["failure"]["test"],
        json!(1),
        "{}",
        lines[1]
    );
}
