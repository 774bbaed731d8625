//! SWE items: Nemotron-Cascade RL-SWE, SWE-bench / SWE-Gym, SWE-smith.
//!
//! The SWE verifier is execution-free: it scores a patch against `gold_patch`. Tests
//! (`FAIL_TO_PASS`, `PASS_TO_PASS`, `test_patch`) are kept with the row for what can use them.

use serde_json::{Map, Value};

use super::{keep, put_prompt, req, req_str, with_domain, Mapped};
use crate::data::codec::reverse_patch;
use crate::data::record::{FieldError, FieldResult};
use crate::StageKind;

const KEPT: [&str; 7] = [
    "instance_id",
    "repo",
    "base_commit",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "image_name",
];

fn issue_prompt(row: &Map<String, Value>) -> FieldResult<String> {
    let statement = req_str(row, "problem_statement")?;
    let repo = row.get("repo").and_then(Value::as_str);
    Ok(match repo {
        Some(r) => format!(
            "Repository: {r}\n\n{}\n\nWrite a patch (a unified diff) that resolves this issue.",
            statement.trim()
        ),
        None => format!(
            "{}\n\nWrite a patch (a unified diff) that resolves this issue.",
            statement.trim()
        ),
    })
}

/// Nemotron-Cascade RL-SWE: `prompt`, `golden_patch`.
pub fn nemotron_swe(row: &Map<String, Value>) -> FieldResult<Mapped> {
    let mut out = Map::new();
    put_prompt(&mut out, "prompt", req(row, "prompt")?)?;
    out.insert(
        "gold_patch".into(),
        Value::String(req_str(row, "golden_patch")?),
    );
    keep(&mut out, row, &KEPT);
    Ok(Mapped::Row(with_domain(out, StageKind::Swe)))
}

/// SWE-bench / SWE-Gym: `patch` is the gold fix.
pub fn swe_bench(row: &Map<String, Value>) -> FieldResult<Mapped> {
    let mut out = Map::new();
    out.insert("prompt".into(), Value::String(issue_prompt(row)?));
    out.insert("gold_patch".into(), Value::String(req_str(row, "patch")?));
    keep(&mut out, row, &KEPT);
    Ok(Mapped::Row(with_domain(out, StageKind::Swe)))
}

/// SWE-smith: `patch` introduces the bug, so the gold fix is its reverse.
pub fn swe_smith(row: &Map<String, Value>) -> FieldResult<Mapped> {
    let mut out = Map::new();
    out.insert("prompt".into(), Value::String(issue_prompt(row)?));
    let bug = req_str(row, "patch")?;
    let fix = reverse_patch(&bug).ok_or_else(|| {
        FieldError::col(
            "patch",
            "not a unified diff; cannot reverse it into the gold fix",
        )
    })?;
    out.insert("gold_patch".into(), Value::String(fix));
    keep(&mut out, row, &KEPT);
    Ok(Mapped::Row(with_domain(out, StageKind::Swe)))
}
