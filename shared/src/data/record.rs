//! The canonical rows, and their parsing from our own JSONL layout.
//!
//! These are what the trainer takes, whatever the file's layout: a preset or a column mapping
//! builds the canonical JSON object of a row ([`RlRow::reference`] is that object), and the
//! functions here turn a canonical object into a row with exactly the checks of the current
//! readers (`actor::dataset::parse_line`, `learner::sft::load_sft`, `learner::reward_train::
//! load_pairs`), so that reading a canonical file through [`crate::data`] gives what they give.

use serde_json::{Map, Value};

use crate::chat::Message;
use crate::{Mode, StageKind};

/// A row problem before the reader adds file and row: the column to blame and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The column, when one is to blame.
    pub column: Option<String>,
    /// Why.
    pub reason: String,
}

impl FieldError {
    /// A problem with `column`.
    pub fn col(column: impl Into<String>, reason: impl Into<String>) -> Self {
        FieldError {
            column: Some(column.into()),
            reason: reason.into(),
        }
    }

    /// A problem with the row as a whole.
    pub fn row(reason: impl Into<String>) -> Self {
        FieldError {
            column: None,
            reason: reason.into(),
        }
    }
}

/// Result of mapping one row.
pub type FieldResult<T> = std::result::Result<T, FieldError>;

/// One SFT conversation (`sft.jsonl`: `{"messages": [...], "mode": "think" | "no_think"}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftRow {
    /// The conversation; a think-mode assistant turn starts with `<think>\n...\n</think>\n\n`.
    pub messages: Vec<Message>,
    /// The mode its assistant turns are written in.
    pub mode: Mode,
}

/// One RL prompt (the actor's `PromptRecord`).
#[derive(Debug, Clone, PartialEq)]
pub struct RlRow {
    /// Stable prompt id (the row's own, or its 0-based index among accepted rows).
    pub id: u64,
    /// The conversation to continue (ends with a user turn).
    pub messages: Vec<Message>,
    /// The canonical JSON object of the row: the verifier's reference fields, and what
    /// `cascade data convert` writes.
    pub reference: Value,
}

/// One preference pair (the learner's `PreferencePair`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairRow {
    /// The user prompt.
    pub prompt: String,
    /// The preferred response.
    pub chosen: String,
    /// The dispreferred response.
    pub rejected: String,
}

/// A canonical row of any kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Row {
    /// An SFT conversation.
    Sft(SftRow),
    /// An RL prompt.
    Rl(RlRow),
    /// A preference pair.
    Pair(PairRow),
}

impl Row {
    /// The canonical JSONL object of the row (what `cascade data convert` writes; an RL row
    /// with its `id`).
    pub fn to_canonical(&self) -> Value {
        match self {
            Row::Sft(r) => serde_json::json!({
                "messages": r.messages,
                "mode": r.mode.as_str(),
            }),
            Row::Rl(r) => {
                // The id goes with the row, so that the written file keeps it and reads back as
                // our own layout.
                let mut obj = r.reference.clone();
                if let Some(o) = obj.as_object_mut() {
                    o.entry("id").or_insert(Value::from(r.id));
                }
                obj
            }
            Row::Pair(p) => serde_json::json!({
                "prompt": p.prompt,
                "chosen": p.chosen,
                "rejected": p.rejected,
            }),
        }
    }
}

/// The reference fields a stage's verifier needs: each inner list is a set of alternatives, one
/// of which must be present (the actor's rule).
pub fn required_fields(kind: StageKind) -> &'static [&'static [&'static str]] {
    match kind {
        StageKind::Math => &[&["answer"]],
        StageKind::If => &[&["instruction_id_list"], &["kwargs"]],
        StageKind::Code => &[&["tests", "call_tests", "test_code"]],
        StageKind::Swe => &[&["gold_patch"]],
        StageKind::Rlhf | StageKind::Sft => &[],
    }
}

/// Parses a list of `{"role", "content"}` messages (`column` names it in errors). ShareGPT
/// turns (`{"from": "human" | "gpt" | "system", "value"}`) are accepted too.
pub fn parse_messages(column: &str, value: &Value) -> FieldResult<Vec<Message>> {
    let list = value.as_array().ok_or_else(|| {
        FieldError::col(column, format!("must be a list, got {}", kind_of(value)))
    })?;
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str);
        let content = m.get("content").and_then(Value::as_str);
        match (role, content) {
            (Some(r), Some(c)) => out.push(Message::new(r, c)),
            _ => {
                let from = m.get("from").and_then(Value::as_str);
                let text = m.get("value").and_then(Value::as_str);
                let role = match from {
                    Some("human" | "user") => Some("user"),
                    Some("gpt" | "assistant") => Some("assistant"),
                    Some("system") => Some("system"),
                    _ => None,
                };
                match (role, text) {
                    (Some(r), Some(c)) => out.push(Message::new(r, c)),
                    _ => {
                        return Err(FieldError::col(
                            format!("{column}[{i}]"),
                            "needs string `role` and `content`",
                        ))
                    }
                }
            }
        }
    }
    Ok(out)
}

/// A short name of a JSON value's type, for messages.
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// An RL prompt from a canonical object, with the actor's checks for a stage of `kind`
/// (`None`: no domain check). `default_id` is used when the object has no `id`.
pub fn rl_from_canonical(
    obj: Map<String, Value>,
    default_id: u64,
    kind: Option<StageKind>,
) -> FieldResult<RlRow> {
    let messages = match (obj.get("prompt"), obj.get("messages")) {
        (Some(Value::String(p)), None) => {
            if p.trim().is_empty() {
                return Err(FieldError::col("prompt", "empty prompt"));
            }
            vec![Message::user(p.clone())]
        }
        (None, Some(list @ Value::Array(_))) => {
            let out = parse_messages("messages", list)?;
            if out.last().map(|m| m.role.as_str()) != Some("user") {
                return Err(FieldError::col("messages", "must end with a user turn"));
            }
            out
        }
        (Some(_), Some(_)) => {
            return Err(FieldError::row(
                "give either `prompt` or `messages`, not both",
            ))
        }
        (Some(_), None) => return Err(FieldError::col("prompt", "must be a string")),
        (None, Some(_)) => return Err(FieldError::col("messages", "must be a list")),
        (None, None) => return Err(FieldError::row("no `prompt` or `messages`")),
    };
    let id = match obj.get("id") {
        None => default_id,
        Some(v) => v.as_u64().ok_or_else(|| {
            FieldError::col("id", format!("must be a non-negative integer, got {v}"))
        })?,
    };
    if let Some(kind) = kind {
        check_domain(&obj, kind)?;
    }
    Ok(RlRow {
        id,
        messages,
        reference: Value::Object(obj),
    })
}

/// The actor's per-domain check: the fields a stage's verifier needs are there.
pub fn check_domain(obj: &Map<String, Value>, kind: StageKind) -> FieldResult<()> {
    if kind == StageKind::Code && obj.contains_key("test_code") && !obj.contains_key("entry_point")
    {
        return Err(FieldError::col(
            "test_code",
            "`test_code` needs `entry_point`",
        ));
    }
    if kind == StageKind::Code && obj.contains_key("call_tests") && !obj.contains_key("fn_name") {
        return Err(FieldError::col(
            "call_tests",
            "call-based tests need `fn_name`, the function they call",
        ));
    }
    for alternatives in required_fields(kind) {
        if !alternatives.iter().any(|f| obj.contains_key(*f)) {
            let mut reason = format!(
                "a {kind} prompt needs `{}`, which this row does not have",
                alternatives.join("` or `")
            );
            if kind == StageKind::Swe && obj.contains_key("FAIL_TO_PASS") {
                reason.push_str(
                    " (it has tests, `FAIL_TO_PASS`, but the SWE verifier scores against a gold \
                     patch)",
                );
            }
            return Err(FieldError::row(reason));
        }
    }
    Ok(())
}

/// An SFT conversation from a canonical object (`load_sft`'s checks, before tokenization).
pub fn sft_from_canonical(obj: &Map<String, Value>) -> FieldResult<SftRow> {
    let list = obj
        .get("messages")
        .filter(|v| v.is_array())
        .ok_or_else(|| {
            FieldError::col("messages", "needs `messages`, a list of {role, content}")
        })?;
    let messages = parse_messages("messages", list)?;
    if !messages.iter().any(|m| m.role == "assistant") {
        return Err(FieldError::col("messages", "no assistant turn to train on"));
    }
    let mode = match obj.get("mode") {
        None => Mode::Think,
        Some(Value::String(s)) => Mode::parse(s).ok_or_else(|| {
            FieldError::col(
                "mode",
                format!("must be \"think\" or \"no_think\", got {s:?}"),
            )
        })?,
        Some(other) => {
            return Err(FieldError::col(
                "mode",
                format!("must be a string, got {other}"),
            ))
        }
    };
    Ok(SftRow { messages, mode })
}

/// A preference pair from a canonical object (`load_pairs`' checks: string `prompt`, `chosen`,
/// `rejected`; other keys ignored).
pub fn pair_from_canonical(obj: &Map<String, Value>) -> FieldResult<PairRow> {
    let get = |k: &str| -> FieldResult<String> {
        match obj.get(k) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(v) => Err(FieldError::col(
                k,
                format!("must be a string, got {}", kind_of(v)),
            )),
            None => Err(FieldError::col(k, "missing")),
        }
    };
    Ok(PairRow {
        prompt: get("prompt")?,
        chosen: get("chosen")?,
        rejected: get("rejected")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn rl_rows_follow_the_actor_rules() {
        let r = rl_from_canonical(
            obj(json!({"prompt": "1+1?", "answer": "2"})),
            7,
            Some(StageKind::Math),
        )
        .unwrap();
        assert_eq!(r.id, 7);
        assert_eq!(r.messages, vec![Message::user("1+1?")]);
        let e =
            rl_from_canonical(obj(json!({"prompt": "q"})), 0, Some(StageKind::Math)).unwrap_err();
        assert!(e.reason.contains("answer"), "{e:?}");
        let e = rl_from_canonical(obj(json!({"prompt": "q", "id": -1})), 0, None).unwrap_err();
        assert_eq!(e.column.as_deref(), Some("id"));
        let e =
            rl_from_canonical(obj(json!({"messages": [{"role": "user"}]})), 0, None).unwrap_err();
        assert_eq!(e.column.as_deref(), Some("messages[0]"));
        let calls = json!([{"input": "1", "output": "2"}]);
        let r = rl_from_canonical(
            obj(json!({"prompt": "q", "call_tests": calls, "fn_name": "f"})),
            0,
            Some(StageKind::Code),
        )
        .unwrap();
        assert_eq!(r.reference["fn_name"], "f");
        let e = rl_from_canonical(
            obj(json!({"prompt": "q", "call_tests": calls})),
            0,
            Some(StageKind::Code),
        )
        .unwrap_err();
        assert_eq!(e.column.as_deref(), Some("call_tests"), "{e:?}");
    }

    #[test]
    fn sft_and_pairs_follow_the_learner_rules() {
        let s = sft_from_canonical(&obj(json!({"messages": [
            {"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]})))
        .unwrap();
        assert_eq!(s.mode, Mode::Think);
        assert_eq!(s.messages[1], Message::new("assistant", "yo"));
        let e = sft_from_canonical(&obj(
            json!({"messages": [{"role": "user", "content": "x"}]}),
        ))
        .unwrap_err();
        assert!(e.reason.contains("assistant"));
        let e = pair_from_canonical(&obj(json!({"prompt": "p", "chosen": 1, "rejected": "r"})))
            .unwrap_err();
        assert_eq!(e.column.as_deref(), Some("chosen"));
    }
}
