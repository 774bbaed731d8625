//! Rows with a checkable answer or constraint list: math problems (Nemotron-Cascade RL-Math,
//! AIME, MATH-500, DeepScaleR), instruction following (Nemotron-Cascade RL-IF, IFEval), and the
//! veRL / OpenRLHF conventions whose domain comes from `data_source` or the user.

use serde_json::{Map, Value};

use super::{answer_text, keep, put_prompt, put_prompt_owned, req, with_domain, Mapped};
use crate::data::record::{kind_of, FieldError, FieldResult};
use crate::StageKind;

/// `problem` (or `question`) and `answer`.
pub fn problem_answer(row: &Map<String, Value>) -> FieldResult<Mapped> {
    let col = if row.get("problem").is_some_and(|v| !v.is_null()) {
        "problem"
    } else {
        "question"
    };
    let mut out = Map::new();
    put_prompt(&mut out, col, req(row, col)?)?;
    out.insert("answer".into(), Value::String(answer_text(row, "answer")?));
    keep(
        &mut out,
        row,
        &["unique_id", "subject", "level", "url", "year"],
    );
    source_id(&mut out, row, &["id", "ID", "unique_id"]);
    Ok(Mapped::Row(with_domain(out, StageKind::Math)))
}

/// Keeps the row's own identifier (any type) as `source_id`; our `id` stays the row index.
fn source_id(out: &mut Map<String, Value>, row: &Map<String, Value>, cols: &[&str]) {
    if let Some(v) = cols
        .iter()
        .find_map(|c| row.get(*c).filter(|v| !v.is_null()))
    {
        out.insert("source_id".into(), v.clone());
    }
}

/// `prompt`, `instruction_id_list` and `kwargs` (one object per instruction; null keys, which
/// the Parquet exports fill in for every unused argument, are dropped).
pub fn instruction_following(row: &Map<String, Value>) -> FieldResult<Mapped> {
    let mut out = Map::new();
    put_prompt(&mut out, "prompt", req(row, "prompt")?)?;
    let ids = match req(row, "instruction_id_list")? {
        Value::Array(a) if a.iter().all(Value::is_string) && !a.is_empty() => a.clone(),
        Value::Array(a) if a.is_empty() => {
            return Err(FieldError::col("instruction_id_list", "empty"))
        }
        v => {
            return Err(FieldError::col(
                "instruction_id_list",
                format!("must be a list of strings, got {}", kind_of(v)),
            ))
        }
    };
    let kwargs = match req(row, "kwargs")? {
        Value::String(s) => serde_json::from_str(s)
            .map_err(|e| FieldError::col("kwargs", format!("a string that is not JSON: {e}")))?,
        v => v.clone(),
    };
    let Value::Array(kwargs) = kwargs else {
        return Err(FieldError::col("kwargs", "must be a list of objects"));
    };
    if kwargs.len() != ids.len() {
        return Err(FieldError::col(
            "kwargs",
            format!("{} entries for {} instructions", kwargs.len(), ids.len()),
        ));
    }
    let mut clean = Vec::with_capacity(kwargs.len());
    for (i, k) in kwargs.into_iter().enumerate() {
        match k {
            Value::Object(o) => clean.push(Value::Object(
                o.into_iter().filter(|(_, v)| !v.is_null()).collect(),
            )),
            Value::Null => clean.push(Value::Object(Map::new())),
            v => {
                return Err(FieldError::col(
                    format!("kwargs[{i}]"),
                    format!("must be an object, got {}", kind_of(&v)),
                ))
            }
        }
    }
    out.insert("instruction_id_list".into(), Value::Array(ids));
    out.insert("kwargs".into(), Value::Array(clean));
    source_id(&mut out, row, &["key", "id"]);
    Ok(Mapped::Row(with_domain(out, StageKind::If)))
}

/// The domain a veRL `data_source` names, by the conventions of the public recipes.
pub fn domain_of_source(source: &str) -> Option<StageKind> {
    let s = source.to_ascii_lowercase();
    let any = |keys: &[&str]| keys.iter().any(|k| s.contains(k));
    if any(&["swe"]) {
        Some(StageKind::Swe)
    } else if any(&["ifeval", "if_", "instruction"]) {
        Some(StageKind::If)
    } else if any(&[
        "code",
        "apps",
        "taco",
        "livecodebench",
        "leetcode",
        "primeintellect",
        "kodcode",
    ]) {
        Some(StageKind::Code)
    } else if any(&[
        "math",
        "gsm",
        "aime",
        "amc",
        "dapo",
        "deepscaler",
        "olympiad",
        "numina",
    ]) {
        Some(StageKind::Math)
    } else {
        None
    }
}

/// Sets the reference field of `domain` from a ground truth.
fn put_ground_truth(
    out: &mut Map<String, Value>,
    col: &str,
    domain: StageKind,
    truth: &Value,
) -> FieldResult<()> {
    match domain {
        StageKind::Math => {
            let text = match truth {
                Value::String(s) if !s.trim().is_empty() => s.trim().to_string(),
                Value::Number(n) => n.to_string(),
                Value::Array(a) if a.len() == 1 && a[0].is_string() => a[0].as_str().unwrap_or("").to_string(),
                v => return Err(FieldError::col(col, format!("a math answer must be a string or a number, got {}", kind_of(v)))),
            };
            out.insert("answer".into(), Value::String(text));
        }
        StageKind::Code => {
            let decoded = match truth {
                Value::String(s) => serde_json::from_str(s).map_err(|e| {
                    FieldError::col(col, format!("code tests must be JSON ({{\"inputs\", \"outputs\"}}): {e}"))
                })?,
                v => v.clone(),
            };
            super::code::put_io_tests(out, col, &decoded)?;
        }
        StageKind::Swe => match truth {
            Value::String(s) if !s.trim().is_empty() => {
                out.insert("gold_patch".into(), Value::String(s.clone()));
            }
            _ => return Err(FieldError::col(col, "a SWE ground truth must be the gold patch text")),
        },
        StageKind::If => {
            return Err(FieldError::col(
                col,
                "instruction-following rows need `instruction_id_list` and `kwargs`; map them with --schema",
            ))
        }
        StageKind::Rlhf | StageKind::Sft => {}
    }
    Ok(())
}

/// veRL: `prompt` (message list), `reward_model.ground_truth`, `data_source`, `extra_info`.
pub fn verl(row: Map<String, Value>, domain: Option<StageKind>) -> FieldResult<Mapped> {
    // The row is ours: the columns used move (with their names) into the canonical object
    // rather than being copied.
    let (mut prompt, mut rm, mut source, mut extra) = (None, None, None, None);
    for (k, v) in row {
        match k.as_str() {
            "prompt" => prompt = Some(v),
            "reward_model" => rm = Some(v),
            "data_source" => source = Some((k, v)),
            "extra_info" => extra = Some((k, v)),
            _ => {}
        }
    }
    let source_text = source.as_ref().and_then(|(_, v)| v.as_str()).unwrap_or("");
    let domain = domain
        .or_else(|| domain_of_source(source_text))
        .ok_or_else(|| {
            FieldError::col(
                "data_source",
                format!("cannot tell the domain of data_source {source_text:?}; give --domain"),
            )
        })?;
    let mut out = Map::new();
    match prompt {
        None | Some(Value::Null) => return Err(FieldError::col("prompt", "missing")),
        Some(prompt) => put_prompt_owned(&mut out, "prompt", prompt)?,
    }
    if domain != StageKind::Rlhf {
        let rm = rm
            .filter(|v| !v.is_null())
            .ok_or_else(|| FieldError::col("reward_model", "missing"))?;
        let truth = rm
            .get("ground_truth")
            .filter(|v| !v.is_null())
            .ok_or_else(|| FieldError::col("reward_model.ground_truth", "missing"))?;
        put_ground_truth(&mut out, "reward_model.ground_truth", domain, truth)?;
    }
    for (k, v) in [source, extra].into_iter().flatten() {
        if !v.is_null() {
            out.insert(k, v);
        }
    }
    Ok(Mapped::Row(with_domain(out, domain)))
}

/// OpenRLHF-style `input` / `label` (the label is the math answer unless `--domain` says
/// otherwise).
pub fn openrlhf(row: &Map<String, Value>, domain: Option<StageKind>) -> FieldResult<Mapped> {
    let domain = domain.unwrap_or(StageKind::Math);
    let mut out = Map::new();
    put_prompt(&mut out, "input", req(row, "input")?)?;
    if domain != StageKind::Rlhf {
        put_ground_truth(&mut out, "label", domain, req(row, "label")?)?;
    }
    Ok(Mapped::Row(with_domain(out, domain)))
}
