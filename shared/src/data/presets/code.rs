//! Code problems: LiveCodeBench code generation, APPS / TACO, CodeContests.
//!
//! Tests become our canonical fields: stdin/stdout cases as `tests: [{"stdin", "stdout"}]`
//! (what the code verifier runs); call-based cases (LiveCodeBench "functional", APPS/TACO rows
//! with `fn_name`) as `fn_name` + `call_tests: [{"input", "output"}]`, which the code verifier
//! runs in its call harness (`rewards/src/code/calls.py`). LiveCodeBench rows also get
//! `stdout_compare = "lcb"` (its line rule for stdin/stdout tests); APPS-style rows keep the
//! verifier's default, the APPS rule.

use serde_json::{json, Map, Value};

use super::{keep, req, req_str, with_domain, MapOptions, Mapped};
use crate::data::codec::decode_lcb_blob;
use crate::data::record::{kind_of, FieldError, FieldResult};
use crate::StageKind;

const STDIN_FORMAT: &str = "### Format: Read the inputs from stdin solve the problem and write \
the answer to stdout (do not directly test on the sample inputs). Enclose your code within \
delimiters as follows. Ensure that when the python program runs, it reads the inputs, runs the \
algorithm and writes output to STDOUT.\n```python\n# YOUR CODE HERE\n```";

/// The prompt of a problem statement, in LiveCodeBench's format (starter code or stdin).
fn code_prompt(statement: &str, starter: Option<&str>) -> String {
    match starter.filter(|s| !s.trim().is_empty()) {
        Some(code) => format!(
            "### Question:\n{}\n\n### Format: You will use the following starter code to write \
             the solution to the problem and enclose your code within delimiters.\n```python\n{}\n\
             ```\n\n### Answer: (use the provided format with backticks)",
            statement.trim(),
            code.trim_end()
        ),
        None => format!(
            "### Question:\n{}\n\n{STDIN_FORMAT}\n\n### Answer: (use the provided format with backticks)",
            statement.trim()
        ),
    }
}

/// A test input or output as text (lists of lines joined, numbers written out).
fn io_text(col: &str, v: &Value) -> FieldResult<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(a) if a.iter().all(Value::is_string) => Ok(a
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join("\n")),
        Value::Number(n) => Ok(n.to_string()),
        other => Err(FieldError::col(
            col,
            format!("a stdin/stdout case must be text, got {}", kind_of(other)),
        )),
    }
}

/// Sets `tests` (stdin/stdout) or `fn_name` + `call_tests` from an APPS-style
/// `{"inputs": [...], "outputs": [...], "fn_name"?}` object.
pub fn put_io_tests(out: &mut Map<String, Value>, col: &str, io: &Value) -> FieldResult<()> {
    let list = |key: &str| -> FieldResult<&Vec<Value>> {
        io.get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| FieldError::col(col, format!("needs `{key}`, a list")))
    };
    let (inputs, outputs) = (list("inputs")?, list("outputs")?);
    if inputs.len() != outputs.len() {
        return Err(FieldError::col(
            col,
            format!("{} inputs for {} outputs", inputs.len(), outputs.len()),
        ));
    }
    if inputs.is_empty() {
        return Err(FieldError::col(col, "no test cases"));
    }
    match io
        .get("fn_name")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        Some(name) => {
            let cases: Vec<Value> = inputs
                .iter()
                .zip(outputs)
                .map(|(i, o)| json!({"input": i, "output": o}))
                .collect();
            out.insert("fn_name".into(), Value::String(name.into()));
            out.insert("call_tests".into(), Value::Array(cases));
        }
        None => {
            let mut cases = Vec::with_capacity(inputs.len());
            for (i, o) in inputs.iter().zip(outputs) {
                cases.push(json!({"stdin": io_text(col, i)?, "stdout": io_text(col, o)?}));
            }
            out.insert("tests".into(), Value::Array(cases));
        }
    }
    Ok(())
}

/// A LiveCodeBench test-case column: a JSON list, a JSON-encoded string of one, or (private
/// tests) base64 + zlib + pickle of that string.
fn lcb_cases(row: &Map<String, Value>, col: &str) -> FieldResult<Vec<Value>> {
    let v = match row.get(col) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(v) => v,
    };
    let decoded = match v {
        Value::Array(a) => return Ok(a.clone()),
        Value::String(s) if s.trim().is_empty() => return Ok(Vec::new()),
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(v) => v,
            Err(_) => {
                let text = decode_lcb_blob(s).map_err(|e| FieldError::col(col, e))?;
                serde_json::from_str(&text).map_err(|e| {
                    FieldError::col(col, format!("decoded test blob is not JSON: {e}"))
                })?
            }
        },
        other => {
            return Err(FieldError::col(
                col,
                format!("expected test cases, got {}", kind_of(other)),
            ))
        }
    };
    match decoded {
        Value::Array(a) => Ok(a),
        other => Err(FieldError::col(
            col,
            format!("expected a list of test cases, got {}", kind_of(&other)),
        )),
    }
}

/// LiveCodeBench code generation (`question_content`, `starter_code`, `public_test_cases`,
/// `private_test_cases`, `metadata` with `func_name`, `contest_date`).
pub fn livecodebench(row: &Map<String, Value>, opts: &MapOptions) -> FieldResult<Mapped> {
    if opts.since.is_some() || opts.until.is_some() {
        let date = req_str(row, "contest_date")?;
        if opts.since.as_deref().is_some_and(|s| date.as_str() < s) {
            return Ok(Mapped::Skip(format!(
                "contest_date {date} before {}",
                opts.since.as_deref().unwrap_or("")
            )));
        }
        if opts.until.as_deref().is_some_and(|u| date.as_str() >= u) {
            return Ok(Mapped::Skip(format!(
                "contest_date {date} not before {}",
                opts.until.as_deref().unwrap_or("")
            )));
        }
    }
    let statement = req_str(row, "question_content")?;
    let starter = row.get("starter_code").and_then(Value::as_str);
    let mut cases = lcb_cases(row, "public_test_cases")?;
    cases.extend(lcb_cases(row, "private_test_cases")?);
    if cases.is_empty() {
        return Err(FieldError::col("public_test_cases", "no test cases"));
    }
    let mut stdio = Vec::new();
    let mut calls = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let field = |k: &str| {
            c.get(k).and_then(Value::as_str).ok_or_else(|| {
                FieldError::col(format!("test_cases[{i}]"), format!("needs string `{k}`"))
            })
        };
        let (input, output) = (field("input")?, field("output")?);
        match c.get("testtype").and_then(Value::as_str).unwrap_or("stdin") {
            "stdin" => stdio.push(json!({"stdin": input, "stdout": output})),
            "functional" => calls.push(json!({"input": input, "output": output})),
            other => {
                return Err(FieldError::col(
                    format!("test_cases[{i}]"),
                    format!("unknown testtype {other:?}"),
                ))
            }
        }
    }
    let mut out = Map::new();
    let functional = !calls.is_empty();
    out.insert(
        "prompt".into(),
        Value::String(code_prompt(&statement, starter.filter(|_| functional))),
    );
    if !stdio.is_empty() {
        out.insert("tests".into(), Value::Array(stdio));
        out.insert("stdout_compare".into(), Value::String("lcb".into()));
    }
    if functional {
        let meta = match row.get("metadata") {
            Some(Value::String(s)) => serde_json::from_str(s)
                .map_err(|e| FieldError::col("metadata", format!("not valid JSON: {e}")))?,
            Some(v) => v.clone(),
            None => Value::Null,
        };
        let name = meta
            .get("func_name")
            .and_then(Value::as_str)
            .ok_or_else(|| FieldError::col("metadata", "functional tests need `func_name`"))?;
        out.insert("fn_name".into(), Value::String(name.into()));
        out.insert("call_tests".into(), Value::Array(calls));
        if let Some(s) = starter {
            out.insert("starter_code".into(), Value::String(s.into()));
        }
    }
    keep(
        &mut out,
        row,
        &[
            "question_id",
            "question_title",
            "platform",
            "contest_date",
            "difficulty",
        ],
    );
    Ok(Mapped::Row(with_domain(out, StageKind::Code)))
}

/// APPS / TACO: `question`, `input_output` (JSON string; `fn_name` for call-based problems),
/// `starter_code`.
pub fn apps(row: &Map<String, Value>) -> FieldResult<Mapped> {
    let statement = req_str(row, "question")?;
    let io = match req(row, "input_output")? {
        Value::String(s) if s.trim().is_empty() => {
            return Err(FieldError::col(
                "input_output",
                "empty: the problem has no tests",
            ))
        }
        Value::String(s) => serde_json::from_str(s)
            .map_err(|e| FieldError::col("input_output", format!("not valid JSON: {e}")))?,
        v => v.clone(),
    };
    let mut out = Map::new();
    put_io_tests(&mut out, "input_output", &io)?;
    let starter = row.get("starter_code").and_then(Value::as_str);
    out.insert(
        "prompt".into(),
        Value::String(code_prompt(&statement, starter)),
    );
    if let Some(s) = starter.filter(|s| !s.trim().is_empty()) {
        out.insert("starter_code".into(), Value::String(s.into()));
    }
    keep(&mut out, row, &["problem_id", "difficulty", "url"]);
    Ok(Mapped::Row(with_domain(out, StageKind::Code)))
}

/// CodeContests: `description`; `public_tests`, `private_tests`, `generated_tests` as
/// `{"input": [...], "output": [...]}`, all run.
pub fn code_contests(row: &Map<String, Value>) -> FieldResult<Mapped> {
    let statement = req_str(row, "description")?;
    let mut tests = Vec::new();
    for col in ["public_tests", "private_tests", "generated_tests"] {
        let Some(t) = row.get(col).filter(|v| !v.is_null()) else {
            continue;
        };
        let list = |k: &str| {
            t.get(k)
                .and_then(Value::as_array)
                .ok_or_else(|| FieldError::col(format!("{col}.{k}"), "missing or not a list"))
        };
        let (inputs, outputs) = (list("input")?, list("output")?);
        if inputs.len() != outputs.len() {
            return Err(FieldError::col(
                col,
                format!("{} inputs for {} outputs", inputs.len(), outputs.len()),
            ));
        }
        for (i, o) in inputs.iter().zip(outputs) {
            tests.push(json!({"stdin": io_text(col, i)?, "stdout": io_text(col, o)?}));
        }
    }
    if tests.is_empty() {
        return Err(FieldError::col("public_tests", "no test cases"));
    }
    let mut out = Map::new();
    out.insert(
        "prompt".into(),
        Value::String(code_prompt(&statement, None)),
    );
    out.insert("tests".into(), Value::Array(tests));
    if let Some(name) = row.get("name").filter(|v| !v.is_null()) {
        out.insert("source_id".into(), name.clone());
    }
    Ok(Mapped::Row(with_domain(out, StageKind::Code)))
}
