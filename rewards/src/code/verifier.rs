//! The code [`Verifier`]: stdin/stdout cases or a HumanEval-style `check(candidate)`.

use std::sync::Once;
use std::time::Duration;

use serde_json::{json, Value};

use super::extract::{extract_code, tokens_match};
use super::sandbox::{Job, RunOutput, Sandbox, SandboxConfig};
use crate::{Reward, SplitResponse, Verifier, VerifyError};

const HARNESS: &str = include_str!("harness.py");

/// Settings of the code verifier.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct CodeConfig {
    /// The sandbox.
    pub sandbox: SandboxConfig,
    /// Wall-clock limit per test run when the line has no `timeout_s`.
    pub default_timeout_s: f64,
}

impl Default for CodeConfig {
    fn default() -> Self {
        Self {
            sandbox: SandboxConfig::default(),
            default_timeout_s: 10.0,
        }
    }
}

/// Runs Python answers in the [`Sandbox`].
#[derive(Debug)]
pub struct CodeVerifier {
    sandbox: Sandbox,
    default_timeout: Duration,
}

impl CodeVerifier {
    /// Probes the kernel and the interpreter; prints one line (once per process) saying what
    /// the sandbox isolates on this machine.
    pub fn new(cfg: CodeConfig) -> Result<Self, VerifyError> {
        let sandbox = Sandbox::new(cfg.sandbox)?;
        static ANNOUNCE: Once = Once::new();
        ANNOUNCE.call_once(|| eprintln!("{}", sandbox.isolation().describe()));
        Ok(Self {
            sandbox,
            default_timeout: secs(cfg.default_timeout_s),
        })
    }

    /// The sandbox, e.g. to report its isolation.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    fn function_test(
        &self,
        code: &str,
        test_code: &str,
        entry_point: &str,
        timeout: Duration,
    ) -> Result<Reward, VerifyError> {
        let job = Job {
            files: vec![
                ("harness.py", HARNESS.as_bytes()),
                ("program.py", code.as_bytes()),
                ("test_code.py", test_code.as_bytes()),
            ],
            args: vec![
                "harness.py".into(),
                "{result_fd}".into(),
                entry_point.into(),
            ],
            stdin: b"",
            timeout,
            result_pipe: true,
        };
        let out = self.sandbox.run(&job)?;
        let passed = out.result == b"PASS" && !out.timed_out && !out.output_overflow;
        let mut details = run_details(&out);
        details["kind"] = json!("function");
        details["passed"] = json!(passed);
        Ok(Reward {
            reward: if passed { 1.0 } else { 0.0 },
            details,
        })
    }

    fn stdio_tests(
        &self,
        code: &str,
        tests: &[Value],
        timeout: Duration,
    ) -> Result<Reward, VerifyError> {
        let mut passed = 0usize;
        let mut failure = Value::Null;
        for (i, case) in tests.iter().enumerate() {
            let field = |name: &str| {
                case.get(name)
                    .and_then(Value::as_str)
                    .ok_or_else(|| VerifyError::BadReference {
                        field: format!("tests[{i}].{name}"),
                        problem: "missing or not a string".into(),
                    })
            };
            let (stdin, expected) = (field("stdin")?, field("stdout")?);
            let job = Job {
                files: vec![("program.py", code.as_bytes())],
                args: vec!["program.py".into()],
                stdin: stdin.as_bytes(),
                timeout,
                result_pipe: false,
            };
            let out = self.sandbox.run(&job)?;
            let ok = out.success() && tokens_match(&String::from_utf8_lossy(&out.stdout), expected);
            if !ok {
                failure = run_details(&out);
                failure["test"] = json!(i);
                break;
            }
            passed += 1;
        }
        let all = passed == tests.len();
        Ok(Reward {
            reward: if all { 1.0 } else { 0.0 },
            details: json!({"kind": "stdio", "passed": passed, "total": tests.len(), "failure": failure}),
        })
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(if s.is_finite() && s > 0.0 {
        s.min(3600.0)
    } else {
        10.0
    })
}

fn tail(bytes: &[u8], n: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let start = text.len().saturating_sub(n);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[start..].to_string()
}

fn run_details(out: &RunOutput) -> Value {
    json!({
        "exit_code": out.code,
        "signal": out.signal,
        "timed_out": out.timed_out,
        "output_overflow": out.output_overflow,
        "stderr_tail": tail(&out.stderr, 400),
        "elapsed_ms": out.elapsed.as_millis() as u64,
    })
}

impl Verifier for CodeVerifier {
    fn name(&self) -> &'static str {
        "code"
    }

    fn verify(
        &self,
        reference: &Value,
        response: &SplitResponse<'_>,
    ) -> Result<Reward, VerifyError> {
        let timeout = match reference.get("timeout_s") {
            None | Some(Value::Null) => self.default_timeout,
            Some(v) => secs(v.as_f64().ok_or_else(|| VerifyError::BadReference {
                field: "timeout_s".into(),
                problem: "not a number".into(),
            })?),
        };
        let fail = |why: &str| {
            Ok(Reward {
                reward: 0.0,
                details: json!({"error": why}),
            })
        };
        let tests = reference.get("tests");
        let test_code = reference.get("test_code");
        if tests.is_none() && test_code.is_none() {
            return Err(VerifyError::BadReference {
                field: "tests".into(),
                problem: "neither `tests` nor `test_code` + `entry_point` given".into(),
            });
        }
        let Some(answer) = response.answer else {
            return fail("no final answer (unclosed <think>)");
        };
        let Some(code) = extract_code(answer) else {
            return fail("no code block in the answer");
        };
        if let Some(tests) = tests {
            let tests = tests.as_array().ok_or_else(|| VerifyError::BadReference {
                field: "tests".into(),
                problem: "not an array".into(),
            })?;
            return self.stdio_tests(code, tests, timeout);
        }
        let bad = |field: &str| VerifyError::BadReference {
            field: field.into(),
            problem: "missing or not a string".into(),
        };
        let test_code = test_code
            .and_then(Value::as_str)
            .ok_or_else(|| bad("test_code"))?;
        let entry = reference
            .get("entry_point")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("entry_point"))?;
        if !entry.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') || entry.is_empty() {
            return Err(VerifyError::BadReference {
                field: "entry_point".into(),
                problem: "not a Python identifier".into(),
            });
        }
        self.function_test(code, test_code, entry, timeout)
    }
}
