//! Sandbox cost, printed as a table: `cargo bench -p cascade-rewards --bench sandbox`.
//!
//! 1. Per-run overhead: the same HumanEval program (solution + tests + `check(...)` in one file)
//!    run with plain `python3 -I -S -B file.py` vs in the sandbox; ratio sandbox / direct.
//! 2. Throughput of the full code verifier (split checker/worker harness) on the 164 canonical
//!    HumanEval solutions with 2 workers, in verifications per second.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cascade_rewards::code::{CodeConfig, Job, Sandbox, SandboxConfig};
use cascade_rewards::{CodeVerifier, Verifier};
use cascade_shared::chat::split_response;
use serde_json::{json, Value};

fn problems() -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/rewards/code/humaneval.jsonl"
    );
    std::fs::read_to_string(path)
        .expect("fixture")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn script(p: &Value) -> String {
    format!(
        "{}\n\n{}\n\ncheck({})\n",
        p["program"].as_str().unwrap(),
        p["test_code"].as_str().unwrap(),
        p["entry_point"].as_str().unwrap()
    )
}

fn main() {
    let problems = problems();
    let sandbox = Sandbox::new(SandboxConfig::default()).expect("sandbox");
    eprintln!("{}", sandbox.isolation().describe());
    let python = sandbox.python().to_path_buf();
    let scripts: Vec<String> = problems.iter().map(script).collect();
    let dir = tempfile::tempdir().unwrap();

    // 1. Sequential, one run at a time, same programs both ways.
    let t = Instant::now();
    for (i, s) in scripts.iter().enumerate() {
        let f = dir.path().join(format!("p{i}.py"));
        std::fs::write(&f, s).unwrap();
        let out = Command::new(&python)
            .args(["-I", "-S", "-B"])
            .arg(&f)
            .output()
            .unwrap();
        assert!(out.status.success(), "direct run {i} failed");
    }
    let direct = t.elapsed();
    let t = Instant::now();
    for (i, s) in scripts.iter().enumerate() {
        let job = Job {
            files: vec![("p.py", s.as_bytes())],
            args: vec!["p.py".into()],
            stdin: b"",
            timeout: Duration::from_secs(20),
            result_pipe: false,
        };
        let out = sandbox.run(&job).unwrap();
        assert!(
            out.success(),
            "sandboxed run {i} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let sandboxed = t.elapsed();

    // 2. Full verifier, 2 workers.
    let verifier = CodeVerifier::new(CodeConfig::default()).expect("verifier");
    let next = AtomicUsize::new(0);
    let passed = AtomicUsize::new(0);
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(p) = problems.get(i) else { break };
                let response = format!("```python\n{}\n```", p["program"].as_str().unwrap());
                let reference =
                    json!({"test_code": p["test_code"], "entry_point": p["entry_point"]});
                let r = verifier
                    .verify(&reference, &split_response(&response))
                    .unwrap();
                if r.reward == 1.0 {
                    passed.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    let verify = t.elapsed();

    let n = scripts.len() as f64;
    println!("| measurement (164 HumanEval canonical programs)      | total s | per run ms |");
    println!("|-----------------------------------------------------|---------|------------|");
    println!(
        "| python3 -I -S -B file.py, direct, sequential         | {:7.2} | {:10.1} |",
        direct.as_secs_f64(),
        1e3 * direct.as_secs_f64() / n
    );
    println!(
        "| same program in the sandbox, sequential              | {:7.2} | {:10.1} |",
        sandboxed.as_secs_f64(),
        1e3 * sandboxed.as_secs_f64() / n
    );
    println!(
        "| sandbox / direct ratio                               | {:>20.2}x |",
        sandboxed.as_secs_f64() / direct.as_secs_f64()
    );
    println!(
        "| code verifier (checker/worker harness), 2 workers   | {:7.2} | {:.1} verifications/s, {}/164 passed |",
        verify.as_secs_f64(),
        n / verify.as_secs_f64(),
        passed.load(Ordering::Relaxed)
    );
}
