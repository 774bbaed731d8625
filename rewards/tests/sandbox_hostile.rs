//! Hostile programs are contained and score 0, and this (the scoring) process stays healthy.
//! Each program would be a correct `add` if its attack silently did nothing, so a 0 shows the
//! attack was stopped, not merely that the answer was wrong.

use std::net::TcpListener;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cascade_rewards::code::CodeConfig;
use cascade_rewards::{CodeVerifier, Reward, Verifier};
use cascade_shared::chat::split_response;
use serde_json::{json, Value};

const CORRECT: &str = "\ndef add(a, b):\n    return a + b\n";

fn verifier() -> &'static CodeVerifier {
    static V: OnceLock<CodeVerifier> = OnceLock::new();
    V.get_or_init(|| CodeVerifier::new(CodeConfig::default()).expect("sandbox available"))
}

fn reference(timeout_s: f64) -> Value {
    json!({
        "test_code": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
        "entry_point": "add",
        "timeout_s": timeout_s,
    })
}

fn score(program: &str, timeout_s: f64) -> Reward {
    let response = format!("```python\n{program}\n```");
    verifier()
        .verify(&reference(timeout_s), &split_response(&response))
        .expect("verifies")
}

/// After an attack, an honest program still passes promptly (the scorer is healthy).
/// The run failed with one of `errors` in its stderr (the attack was refused, not crashed).
fn assert_refused(r: &Reward, errors: &[&str]) {
    assert_eq!(r.reward, 0.0, "{}", r.details);
    let stderr = r.details["stderr_tail"].as_str().unwrap_or("");
    assert!(
        errors.iter().any(|e| stderr.contains(e)),
        "expected one of {errors:?}: {}",
        r.details
    );
}

fn assert_healthy() {
    let r = score(CORRECT, 10.0);
    assert_eq!(
        r.reward, 1.0,
        "honest program after an attack: {}",
        r.details
    );
}

#[test]
fn honest_program_passes_and_wrong_one_fails() {
    assert_eq!(score(CORRECT, 10.0).reward, 1.0);
    assert_eq!(
        score("def add(a, b):\n    return a - b\n", 10.0).reward,
        0.0
    );
}

#[test]
fn fork_bomb() {
    let start = Instant::now();
    let r = score(&format!("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n{CORRECT}"), 3.0);
    assert_eq!(r.reward, 0.0, "{}", r.details);
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
    assert_healthy();
}

#[test]
fn infinite_loop() {
    let start = Instant::now();
    let r = score(&format!("while True:\n    pass\n{CORRECT}"), 2.0);
    assert_eq!(r.reward, 0.0);
    assert_eq!(r.details["timed_out"], json!(true), "{}", r.details);
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn allocating_10_gb() {
    let r = score(
        &format!("x = bytearray(10 * 1024 ** 3)\nx[-1] = 1\n{CORRECT}"),
        10.0,
    );
    assert_eq!(r.reward, 0.0, "{}", r.details);
    assert!(
        r.details["stderr_tail"]
            .as_str()
            .unwrap()
            .contains("MemoryError"),
        "{}",
        r.details
    );
}

#[test]
fn writing_outside_the_scratch_dir() {
    let outside = tempfile::tempdir().unwrap();
    let run_dir = std::env::current_dir().unwrap();
    let targets = [
        outside.path().join("escaped"),
        run_dir.join("escaped-from-sandbox"),
    ];
    for target in &targets {
        let r = score(
            &format!(
                "open({:?}, 'w').write('pwned')\n{CORRECT}",
                target.to_str().unwrap()
            ),
            10.0,
        );
        assert_refused(&r, &["PermissionError"]);
        assert!(!target.exists(), "{} was written", target.display());
    }
}

#[test]
fn reading_the_run_directory() {
    let run_dir = std::env::current_dir().unwrap();
    let cargo_toml = run_dir.join("Cargo.toml");
    assert!(cargo_toml.exists());
    for attack in [
        format!("open({:?}).read()", cargo_toml.to_str().unwrap()),
        format!("import os\nos.listdir({:?})", run_dir.to_str().unwrap()),
        format!("open('/proc/{}/environ', 'rb').read()", std::process::id()),
    ] {
        let r = score(&format!("{attack}\n{CORRECT}"), 10.0);
        assert_refused(&r, &["PermissionError"]);
    }
}

#[test]
fn opening_a_socket() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let r = score(
        &format!("import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'hi')\n{CORRECT}"),
        10.0,
    );
    assert_refused(
        &r,
        &[
            "Network is unreachable",
            "PermissionError",
            "Connection refused",
            "OSError",
        ],
    );
    assert!(
        listener.accept().is_err(),
        "the sandbox reached a host socket"
    );
}

#[test]
fn exiting_before_the_asserts() {
    for exit in ["import sys\nsys.exit(0)", "import os\nos._exit(0)"] {
        // At top level, before the checker ever runs...
        let r = score(&format!("{exit}\n{CORRECT}"), 10.0);
        assert_eq!(r.reward, 0.0, "{exit}: {}", r.details);
        // ...and from inside the candidate while the asserts are running.
        let body = exit.replace('\n', "\n    ");
        let r = score(&format!("def add(a, b):\n    {body}\n"), 10.0);
        assert_eq!(r.reward, 0.0, "{exit} in candidate: {}", r.details);
    }
}

#[test]
fn monkey_patching_builtins() {
    let attacks = [
        // An answer that equals everything.
        "class Any:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\ndef add(a, b):\n    return Any()\n",
        // An int subclass with a forged __eq__.
        "class I(int):\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return I(0)\n",
        // Patching builtins the asserts might rely on, then a wrong answer.
        "import builtins\nbuiltins.AssertionError = type('X', (BaseException,), {})\nbuiltins.abs = lambda x: 0\nbuiltins.isinstance = lambda *a: True\nbuiltins.all = lambda *a: True\ndef add(a, b):\n    return 0\n",
        // Replacing the check function itself and exiting cleanly.
        "import builtins, sys\nbuiltins.check = lambda c: None\ndef add(a, b):\n    sys.modules['__main__'].__dict__['check'] = lambda c: None\n    return 0\n",
    ];
    for attack in attacks {
        let r = score(attack, 10.0);
        assert_eq!(r.reward, 0.0, "{attack}: {}", r.details);
    }
}

#[test]
fn killing_the_parent() {
    let me = std::process::id();
    for attack in [
        format!("import os\nos.kill({me}, 9)"),
        format!("import os\nos.killpg(os.getpgid({me}), 9)"),
    ] {
        let r = score(&format!("{attack}\n{CORRECT}"), 10.0);
        assert_refused(&r, &["ProcessLookupError", "PermissionError"]);
    }
    let r = score(
        "import os\nos.kill(os.getppid(), 9)\nos.kill(os.getppid(), 15)\nraise SystemExit(0)",
        10.0,
    );
    assert_eq!(r.reward, 0.0, "{}", r.details);
    // Still alive (this line runs) and still scoring.
    assert_healthy();
}

#[test]
fn printing_1_gb() {
    let start = Instant::now();
    let r = score(
        &format!(
            "import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * (1 << 20))\n{CORRECT}"
        ),
        30.0,
    );
    assert_eq!(r.reward, 0.0, "{}", r.details);
    assert_eq!(r.details["output_overflow"], json!(true), "{}", r.details);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn scratch_dir_is_removed_and_not_under_the_run_dir() {
    let r = score(
        "import os\nprint(os.getcwd())\ndef add(a, b):\n    return a + b\n",
        10.0,
    );
    assert_eq!(r.reward, 1.0);
    let tmp_count = |dir: &Path| {
        std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("cascade-sbx-"))
                    .count()
            })
            .unwrap_or(0)
    };
    assert_eq!(tmp_count(&std::env::current_dir().unwrap()), 0);
}
