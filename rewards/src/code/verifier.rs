//! The code [`Verifier`]: stdin/stdout cases (`tests`), call-based cases (`fn_name` +
//! `call_tests`, as LiveCodeBench "functional" tests and APPS/TACO `fn_name` problems), or a
//! HumanEval-style `check(candidate)` (`test_code` + `entry_point`). A row may have both `tests`
//! and `call_tests`; reward 1 only when every case passes.

use std::sync::Once;
use std::time::Duration;

use cascade_shared::data::record::kind_of;
use serde_json::{json, Value};

use super::extract::{extract_code, StdoutCompare};
use super::sandbox::{Job, RunOutput, Sandbox, SandboxConfig};
use crate::{Reward, SplitResponse, Verifier, VerifyError};

const HARNESS: &str = include_str!("harness.py");
const CALLS: &str = include_str!("calls.py");

/// Outcome of one kind of tests: cases passed before the first failure, cases, the failure.
struct Outcome {
    passed: usize,
    total: usize,
    failure: Value,
}

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

    /// Runs a HumanEval-style `check(candidate)` (`test_code`) against `entry_point` of the
    /// Python program `code`, in the sandbox: reward 1 when it passes, else 0. `timeout_s`
    /// overrides the configured default. What the SWE verifier's test scorer runs on a patched
    /// file.
    pub fn check_program(
        &self,
        code: &str,
        test_code: &str,
        entry_point: &str,
        timeout_s: Option<f64>,
    ) -> Result<Reward, VerifyError> {
        if !is_identifier(entry_point) {
            return Err(VerifyError::BadReference {
                field: "entry_point".into(),
                problem: format!("not a Python identifier: {entry_point:?}"),
            });
        }
        let timeout = timeout_s.map_or(self.default_timeout, secs);
        self.function_test(code, test_code, entry_point, timeout)
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
        compare: StdoutCompare,
        timeout: Duration,
    ) -> Result<Outcome, VerifyError> {
        let mut cases = Vec::with_capacity(tests.len());
        for (i, case) in tests.iter().enumerate() {
            let field = |name: &str| {
                case.get(name)
                    .and_then(Value::as_str)
                    .ok_or_else(|| VerifyError::BadReference {
                        field: format!("tests[{i}].{name}"),
                        problem: "missing or not a string".into(),
                    })
            };
            cases.push((field("stdin")?, field("stdout")?));
        }
        let mut passed = 0usize;
        let mut failure = Value::Null;
        for (i, (stdin, expected)) in cases.into_iter().enumerate() {
            let job = Job {
                files: vec![("program.py", code.as_bytes())],
                args: vec!["program.py".into()],
                stdin: stdin.as_bytes(),
                timeout,
                result_pipe: false,
            };
            let out = self.sandbox.run(&job)?;
            let ok =
                out.success() && compare.matches(&String::from_utf8_lossy(&out.stdout), expected);
            if !ok {
                failure = run_details(&out);
                failure["test"] = json!(i);
                break;
            }
            passed += 1;
        }
        Ok(Outcome {
            passed,
            total: tests.len(),
            failure,
        })
    }

    /// Runs every call-based case in one sandboxed harness run (`calls.py`): each call in a
    /// fresh process forked from the loaded program, `timeout` per call.
    fn call_tests(
        &self,
        code: &str,
        fn_name: &str,
        cases: &[Value],
        timeout: Duration,
    ) -> Result<Outcome, VerifyError> {
        let cases_json = serde_json::to_vec(&json!({ "cases": cases }))
            .map_err(|e| VerifyError::Environment(format!("encoding call tests: {e}")))?;
        let per_call = format!("{}", timeout.as_secs_f64());
        let total_timeout = timeout
            .saturating_mul(u32::try_from(cases.len() + 1).unwrap_or(u32::MAX))
            .saturating_add(Duration::from_secs(2))
            .min(Duration::from_secs(3600));
        let job = Job {
            files: vec![
                ("calls.py", CALLS.as_bytes()),
                ("program.py", code.as_bytes()),
                ("cases.json", cases_json.as_slice()),
            ],
            args: vec![
                "calls.py".into(),
                "{result_fd}".into(),
                fn_name.into(),
                per_call,
            ],
            stdin: b"",
            timeout: total_timeout,
            result_pipe: true,
        };
        let out = self.sandbox.run(&job)?;
        let verdict: Option<Value> = serde_json::from_slice(&out.result).ok();
        let passed = verdict
            .as_ref()
            .and_then(|v| v.get("passed"))
            .and_then(Value::as_u64)
            .map_or(0, |n| (n as usize).min(cases.len()));
        let complete = passed == cases.len()
            && verdict.as_ref().is_some_and(|v| v.get("failure").is_none())
            && !out.timed_out
            && !out.output_overflow;
        let failure = if complete {
            Value::Null
        } else {
            let mut f = run_details(&out);
            if let Some(v) = verdict.as_ref().and_then(|v| v.get("failure")) {
                f["test"] = v.get("test").cloned().unwrap_or(Value::Null);
                for key in ["error", "got", "expected"] {
                    if let Some(x) = v.get(key) {
                        f[key] = x.clone();
                    }
                }
            }
            f
        };
        Ok(Outcome {
            passed: if complete {
                passed
            } else {
                passed.min(cases.len().saturating_sub(1))
            },
            total: cases.len(),
            failure,
        })
    }
}

/// The call-based cases of a reference, checked and put in the harness's form: a string `input`
/// is LiveCodeBench's (one JSON argument per line, `output` JSON text), a list `input` is
/// APPS/TACO's (the arguments; `output` the value, possibly wrapped in a one-element list).
fn call_cases(tests: &Value) -> Result<Vec<Value>, VerifyError> {
    let bad = |field: String, problem: String| VerifyError::BadReference { field, problem };
    let list = tests
        .as_array()
        .ok_or_else(|| bad("call_tests".into(), "not an array".into()))?;
    if list.is_empty() {
        return Err(bad("call_tests".into(), "no test cases".into()));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, case) in list.iter().enumerate() {
        let (input, output) = match (case.get("input"), case.get("output")) {
            (Some(i), Some(o)) => (i, o),
            _ => {
                return Err(bad(
                    format!("call_tests[{i}]"),
                    "needs `input` and `output`".into(),
                ))
            }
        };
        match input {
            Value::String(text) => {
                for (line_no, line) in text.split('\n').enumerate() {
                    serde_json::from_str::<Value>(line).map_err(|e| {
                        bad(
                            format!("call_tests[{i}].input"),
                            format!("line {} is not JSON ({e}): {line:.80}", line_no + 1),
                        )
                    })?;
                }
                let text_out = output.as_str().ok_or_else(|| {
                    bad(
                        format!("call_tests[{i}].output"),
                        "a LiveCodeBench case (string input) needs JSON text as output".into(),
                    )
                })?;
                serde_json::from_str::<Value>(text_out).map_err(|e| {
                    bad(
                        format!("call_tests[{i}].output"),
                        format!("not JSON ({e}): {text_out:.80}"),
                    )
                })?;
                out.push(json!({"form": "lcb", "input": text, "output": text_out}));
            }
            Value::Array(_) => out.push(json!({"form": "apps", "input": input, "output": output})),
            other => {
                return Err(bad(
                    format!("call_tests[{i}].input"),
                    format!(
                        "must be newline-separated JSON arguments (a string) or a list of \
                         arguments, got {}",
                        kind_of(other)
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// The stdout rule of a row without `stdout_compare`: LiveCodeBench's for a row the
/// LiveCodeBench preset wrote (it keeps `question_id`, `platform` and `contest_date`), else
/// APPS's (the more tolerant one).
fn default_compare(reference: &Value) -> StdoutCompare {
    let lcb = ["question_id", "platform", "contest_date"]
        .iter()
        .all(|k| reference.get(k).is_some_and(Value::is_string));
    if lcb {
        StdoutCompare::Lcb
    } else {
        StdoutCompare::Apps
    }
}

fn is_identifier(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
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
        let call_tests = reference.get("call_tests");
        let test_code = reference.get("test_code");
        if tests.is_none() && call_tests.is_none() && test_code.is_none() {
            return Err(VerifyError::BadReference {
                field: "tests".into(),
                problem: "none of `tests` (stdin/stdout), `call_tests` + `fn_name` (call-based) \
                          or `test_code` + `entry_point` (HumanEval-style) given"
                    .into(),
            });
        }
        let bad = |field: &str| VerifyError::BadReference {
            field: field.into(),
            problem: "missing or not a string".into(),
        };
        // The reference is checked before the answer, so a dataset bug is reported whatever the
        // model wrote.
        let compare = match reference.get("stdout_compare") {
            None | Some(Value::Null) => default_compare(reference),
            Some(v) => v.as_str().and_then(StdoutCompare::parse).ok_or_else(|| {
                VerifyError::BadReference {
                    field: "stdout_compare".into(),
                    problem: format!("must be \"apps\" or \"lcb\", got {v}"),
                }
            })?,
        };
        let stdio = match tests {
            None => None,
            Some(t) => Some(t.as_array().ok_or_else(|| VerifyError::BadReference {
                field: "tests".into(),
                problem: "not an array".into(),
            })?),
        };
        let calls = match call_tests {
            None => None,
            Some(t) => {
                let name = reference
                    .get("fn_name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| VerifyError::BadReference {
                        field: "fn_name".into(),
                        problem: "call-based tests (`call_tests`) need `fn_name`, the function \
                                  to call; missing or not a string"
                            .into(),
                    })?;
                if !is_identifier(name) {
                    return Err(VerifyError::BadReference {
                        field: "fn_name".into(),
                        problem: format!("not a Python identifier: {name:?}"),
                    });
                }
                Some((name, call_cases(t)?))
            }
        };
        let Some(answer) = response.answer else {
            return fail("no final answer (unclosed <think>)");
        };
        let Some(code) = extract_code(answer) else {
            return fail("no code block in the answer");
        };
        if stdio.is_some() || calls.is_some() {
            let mut passed = 0;
            let mut total = 0;
            let mut failure = Value::Null;
            let mut kinds = Vec::new();
            if let Some(tests) = stdio {
                kinds.push("stdio");
                let o = self.stdio_tests(code, tests, compare, timeout)?;
                (passed, total, failure) = (o.passed, o.total, o.failure);
            }
            if let Some((name, cases)) = &calls {
                kinds.push("call");
                if failure.is_null() {
                    let o = self.call_tests(code, name, cases, timeout)?;
                    passed += o.passed;
                    failure = o.failure;
                    if !failure.is_null() {
                        failure["kind"] = json!("call");
                    }
                }
                total += cases.len();
            }
            let all = passed == total && failure.is_null();
            return Ok(Reward {
                reward: if all { 1.0 } else { 0.0 },
                details: json!({
                    "kind": kinds.join("+"),
                    "passed": passed,
                    "total": total,
                    "failure": failure,
                }),
            });
        }
        let test_code = test_code
            .and_then(Value::as_str)
            .ok_or_else(|| bad("test_code"))?;
        let entry = reference
            .get("entry_point")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("entry_point"))?;
        if !is_identifier(entry) {
            return Err(VerifyError::BadReference {
                field: "entry_point".into(),
                problem: "not a Python identifier".into(),
            });
        }
        self.function_test(code, test_code, entry, timeout)
    }
}
