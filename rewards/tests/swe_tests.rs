//! The SWE verifier with the test scorer: patches applied to the row's repository and checked
//! in the code sandbox (real Python), against the lexical ratio on the same answers.

use cascade_rewards::code::CodeConfig;
use cascade_rewards::swe::{LexicalFallback, SweVerifier, TestScorer};
use cascade_rewards::Verifier;
use cascade_shared::chat::split_response;
use serde_json::{json, Value};

const FILE: &str = "def f(x):\n    return x - 3\n";
const GOLD: &str = "--- a/f.py\n+++ b/f.py\n@@ -2 +2 @@\n-    return x - 3\n+    return x + 3\n";

fn row() -> Value {
    json!({
        "gold_patch": GOLD,
        "files": {"f.py": FILE},
        "test_code": "def check(candidate):\n    assert candidate(1) == 4\n    assert candidate(-3) == 0\n    assert candidate(10) == 13\n",
        "entry_point": "f",
    })
}

fn patch_to(line: &str) -> String {
    format!("--- a/f.py\n+++ b/f.py\n@@ -2 +2 @@\n-    return x - 3\n+    return {line}\n")
}

fn rewards(answer: &str) -> (f32, f32, Value) {
    let tests = SweVerifier::new(Box::new(TestScorer::new(
        CodeConfig::default(),
        Box::new(LexicalFallback),
    )));
    let lexical = SweVerifier::default();
    let r = tests.verify(&row(), &split_response(answer)).unwrap();
    let l = lexical.verify(&row(), &split_response(answer)).unwrap();
    (r.reward, l.reward, r.details)
}

#[test]
fn equivalent_fixes_pass_and_near_misses_fail() {
    // Identical to the gold: 1 without running anything.
    let (t, l, d) = rewards(GOLD);
    assert_eq!((t, l), (1.0, 1.0));
    assert_eq!(d["outcome"], "identical");
    // Another fix of the same issue: the tests pass, the lexical ratio alone says 0.94.
    let (t, l, d) = rewards(&patch_to("3 + x"));
    assert_eq!(t, 1.0, "{d}");
    assert!(l < 1.0 && l > 0.9, "{l}");
    assert_eq!(d["scorer"]["outcome"], "passed", "{d}");
    // Near misses: one character from the gold, lexical ≥ 0.94, but they fix nothing.
    for wrong in ["x + 2", "x * 3", "x - 3"] {
        let (t, l, d) = rewards(&patch_to(wrong));
        assert_eq!(t, 0.0, "{wrong}: {d}");
        assert!(l > 0.9, "{wrong}: lexical {l}");
        assert_eq!(d["scorer"]["outcome"], "failed", "{wrong}: {d}");
    }
    // A patch whose removed line is not in the file does not apply.
    let (t, _, d) =
        rewards("--- a/f.py\n+++ b/f.py\n@@ -2 +2 @@\n-    return x + 0\n+    return x + 3\n");
    assert_eq!(t, 0.0);
    assert_eq!(d["scorer"]["outcome"], "does_not_apply", "{d}");
}

#[test]
fn patched_code_runs_in_the_sandbox() {
    // The patched program tries to write outside its working directory and to loop forever:
    // the sandbox's limits hold, the reward is 0, nothing is written.
    let target = std::env::temp_dir().join(format!("swe-tests-escape-{}", std::process::id()));
    let hostile = patch_to(&format!(
        "open({:?}, 'w').write('x') or x + 3",
        target.display().to_string()
    ));
    let (t, _, d) = rewards(&hostile);
    assert!(
        !target.exists(),
        "the patched program wrote {}",
        target.display()
    );
    assert_eq!(t, 0.0, "{d}");
    let mut slow = row();
    slow["timeout_s"] = json!(1.0);
    let verifier = SweVerifier::new(Box::new(TestScorer::new(
        CodeConfig::default(),
        Box::new(LexicalFallback),
    )));
    let r = verifier
        .verify(
            &slow,
            &split_response(&patch_to("[y for y in iter(int, 1)]")),
        )
        .unwrap();
    assert_eq!(r.reward, 0.0, "{}", r.details);
    assert_eq!(
        r.details["scorer"]["run"]["timed_out"], true,
        "{}",
        r.details
    );
}

/// `FilePatch::apply` against `git apply --unidiff-zero` (git writes most of the patches a SWE
/// dataset holds) on the same files and patches: both apply or both refuse, and when they
/// apply the files are byte-identical. Skipped, saying so, where git is not installed.
#[test]
fn patches_apply_as_git_applies_them() {
    use cascade_rewards::swe::parse_diff;
    use std::process::Command;
    if Command::new("git").arg("--version").output().is_err() {
        eprintln!("SKIPPED: git is not installed");
        return;
    }
    let file = "import os\n\ndef f(x):\n    return x - 3\n\ndef g(a, b):\n    if a:\n        return b\n    return a\n\nX = 1\n";
    let cases: &[(&str, &str)] = &[
        ("exact", "@@ -4 +4 @@\n-    return x - 3\n+    return x + 3\n"),
        ("context", "@@ -3,2 +3,2 @@\n def f(x):\n-    return x - 3\n+    return x + 3\n"),
        ("line number off by two", "@@ -6,2 +6,2 @@\n def f(x):\n-    return x - 3\n+    return x + 3\n"),
        ("two hunks", "@@ -4 +4,2 @@\n-    return x - 3\n+    y = x + 3\n+    return y\n@@ -11 +12 @@\n-X = 1\n+X = 2\n"),
        ("insertion", "@@ -1,0 +2 @@\n+import sys\n"),
        ("deletion", "@@ -10,2 +9,0 @@\n-\n-X = 1\n"),
        ("wrong removed line", "@@ -4 +4 @@\n-    return x * 3\n+    return x + 3\n"),
        ("wrong context", "@@ -3,2 +3,2 @@\n def h(x):\n-    return x - 3\n+    return x + 3\n"),
        ("hunks out of order", "@@ -11 +11 @@\n-X = 1\n+X = 2\n@@ -4 +4 @@\n-    return x - 3\n+    return x + 3\n"),
    ];
    let dir = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    assert!(git(&["init", "-q"]).status.success());
    for (name, hunks) in cases {
        let diff = format!("--- a/m.py\n+++ b/m.py\n{hunks}");
        std::fs::write(dir.path().join("m.py"), file).unwrap();
        std::fs::write(dir.path().join("p.diff"), &diff).unwrap();
        // `--unidiff-zero`: a hunk without trailing (leading) context is not pinned to the end
        // (start) of the file; the tiny SWE patches and many model patches have no context.
        let theirs = git(&["apply", "--unidiff-zero", "p.diff"]);
        let theirs = theirs
            .status
            .success()
            .then(|| std::fs::read_to_string(dir.path().join("m.py")).unwrap());
        let patch = parse_diff(&diff).unwrap();
        let ours = patch.files[0].apply(file).ok();
        assert_eq!(ours, theirs, "{name}:\n{diff}");
    }
}
