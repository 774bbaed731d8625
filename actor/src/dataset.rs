//! RL prompt datasets: JSONL, one object per line.
//!
//! Each line holds the prompt as `prompt` (a user message string) or `messages` (a list of
//! `{"role", "content"}`), an optional `id` (a non-negative integer; default: the 0-based line
//! index among prompt lines), and the domain's reference fields exactly as `cascade score`
//! takes them: `answer` (math), `instruction_id_list` + `kwargs` (if), `tests` or `test_code` +
//! `entry_point` (code), `gold_patch` (swe), nothing extra for rm. The whole object is kept as
//! the verifier's reference. A malformed line is an error naming the file and the line.

use std::path::{Path, PathBuf};

use cascade_shared::chat::Message;
use cascade_shared::StageKind;
use serde_json::Value;

use crate::error::{ActorError, Result};

/// One RL prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptRecord {
    /// Stable prompt id.
    pub id: u64,
    /// The conversation to continue (ends with a user turn).
    pub messages: Vec<Message>,
    /// The whole JSON object (reference fields for the verifier).
    pub reference: Value,
}

/// A loaded prompt file.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Where it came from.
    pub path: PathBuf,
    /// The prompts, in file order.
    pub prompts: Vec<PromptRecord>,
}

/// The reference fields a stage's verifier needs: each inner list is a set of alternatives, one
/// of which must be present.
fn required_fields(kind: StageKind) -> &'static [&'static [&'static str]] {
    match kind {
        StageKind::Math => &[&["answer"]],
        StageKind::If => &[&["instruction_id_list"], &["kwargs"]],
        StageKind::Code => &[&["tests", "test_code"]],
        StageKind::Swe => &[&["gold_patch"]],
        StageKind::Rlhf | StageKind::Sft => &[],
    }
}

/// Parses one line (`line` is 1-based, for messages).
pub fn parse_line(
    path: &Path,
    line: usize,
    text: &str,
    default_id: u64,
    kind: StageKind,
) -> Result<PromptRecord> {
    let bad = |reason: String| ActorError::Dataset {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let value: Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let obj = value
        .as_object()
        .ok_or_else(|| bad("expected a JSON object".into()))?;
    let messages = match (obj.get("prompt"), obj.get("messages")) {
        (Some(Value::String(p)), None) => vec![Message::user(p.clone())],
        (None, Some(Value::Array(list))) => {
            let mut out = Vec::with_capacity(list.len());
            for (i, m) in list.iter().enumerate() {
                let role = m.get("role").and_then(Value::as_str);
                let content = m.get("content").and_then(Value::as_str);
                match (role, content) {
                    (Some(r), Some(c)) => out.push(Message::new(r, c)),
                    _ => {
                        return Err(bad(format!(
                            "messages[{i}] needs string `role` and `content`"
                        )))
                    }
                }
            }
            if out.last().map(|m| m.role.as_str()) != Some("user") {
                return Err(bad("`messages` must end with a user turn".into()));
            }
            out
        }
        (Some(_), Some(_)) => {
            return Err(bad("give either `prompt` or `messages`, not both".into()))
        }
        (Some(_), None) => return Err(bad("`prompt` must be a string".into())),
        (None, Some(_)) => return Err(bad("`messages` must be a list".into())),
        (None, None) => return Err(bad("no `prompt` or `messages`".into())),
    };
    let id = match obj.get("id") {
        None => default_id,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| bad(format!("`id` must be a non-negative integer, got {v}")))?,
    };
    if kind == StageKind::Code && obj.contains_key("test_code") && !obj.contains_key("entry_point")
    {
        return Err(bad("`test_code` needs `entry_point`".into()));
    }
    for alternatives in required_fields(kind) {
        if !alternatives.iter().any(|f| obj.contains_key(*f)) {
            return Err(bad(format!(
                "a {kind} prompt needs `{}`",
                alternatives.join("` or `")
            )));
        }
    }
    Ok(PromptRecord {
        id,
        messages,
        reference: value,
    })
}

impl Dataset {
    /// Reads a prompt file for a stage of `kind`. Blank lines are skipped.
    pub fn load(path: impl AsRef<Path>, kind: StageKind) -> Result<Dataset> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ActorError::io(path, e))?;
        let mut prompts = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let default_id = prompts.len() as u64;
            prompts.push(parse_line(path, i + 1, line, default_id, kind)?);
        }
        if prompts.is_empty() {
            return Err(ActorError::Dataset {
                path: path.to_path_buf(),
                line: 0,
                reason: "no prompts".into(),
            });
        }
        Ok(Dataset {
            path: path.to_path_buf(),
            prompts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str, kind: StageKind) -> Result<Dataset> {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("data.jsonl");
        std::fs::write(&p, text).unwrap();
        Dataset::load(&p, kind)
    }

    #[test]
    fn lines_parse_with_ids_and_references() {
        let ds = load(
            "{\"prompt\": \"1+1?\", \"answer\": \"2\"}\n\n{\"id\": 40, \"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"q\"}], \"answer\": \"3\"}\n",
            StageKind::Math,
        )
        .unwrap();
        assert_eq!(ds.prompts.len(), 2);
        assert_eq!(ds.prompts[0].id, 0);
        assert_eq!(ds.prompts[0].messages, vec![Message::user("1+1?")]);
        assert_eq!(ds.prompts[1].id, 40);
        assert_eq!(ds.prompts[1].messages.len(), 2);
        assert_eq!(ds.prompts[1].reference["answer"], "3");
    }

    #[test]
    fn a_malformed_line_names_file_and_line() {
        let e = load(
            "{\"prompt\": \"a\", \"answer\": \"1\"}\n{\"prompt\": \"b\"\n",
            StageKind::Math,
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("data.jsonl:2") && msg.contains("JSON"),
            "{msg}"
        );
        let e = load("{\"prompt\": \"a\"}\n", StageKind::Math)
            .unwrap_err()
            .to_string();
        assert!(e.contains(":1:") && e.contains("answer"), "{e}");
        let e = load(
            "{\"prompt\": \"a\", \"test_code\": \"x\"}\n",
            StageKind::Code,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("entry_point"), "{e}");
        let e = load("{\"messages\": [{\"role\": \"user\"}]}\n", StageKind::Rlhf)
            .unwrap_err()
            .to_string();
        assert!(e.contains("messages[0]"), "{e}");
        let e = load("{\"prompt\": \"a\", \"id\": -1}\n", StageKind::Rlhf)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`id`"), "{e}");
        assert!(load(
            "{\"prompt\": \"a\", \"instruction_id_list\": [], \"kwargs\": []}\n",
            StageKind::If
        )
        .is_ok());
    }
}
