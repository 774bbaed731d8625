//! Conversations: Nemotron-Cascade SFT, TRL prompt/completion and preference layouts,
//! Skywork, HelpSteer3, and RLHF prompts.

use serde_json::{json, Map, Value};

use super::{put_prompt, req, Mapped};
use crate::chat::Message;
use crate::data::record::{kind_of, parse_messages, FieldError, FieldResult};
use crate::Mode;

/// Phrases of a system prompt that only set the mode (Nemotron's "detailed thinking on/off",
/// Qwen3's `/think`, `/no_think`).
const THINK_ON: [&str; 2] = ["detailed thinking on", "/think"];
const THINK_OFF: [&str; 2] = ["detailed thinking off", "/no_think"];

/// `content` without a leading empty `<think>…</think>` block (a non-thinking answer's; our
/// chat template writes it for `no_think` conversations itself).
pub fn strip_empty_think(content: &str) -> Option<&str> {
    let rest = content.trim_start().strip_prefix("<think>")?;
    let end = rest.find("</think>")?;
    if !rest[..end].trim().is_empty() {
        return None;
    }
    Some(rest[end + "</think>".len()..].trim_start())
}

/// The mode of a conversation, and the conversation as our template wants it: from a
/// `thinking` / `reasoning` column (a boolean, `on`/`off`, or the reasoning text itself, which
/// is put back into the last assistant turn), else a system prompt that sets it (dropped when
/// it says nothing else), else the assistant turns' `<think>` blocks (none or empty: no_think).
pub fn sft_mode_from(
    row: &Map<String, Value>,
    mut messages: Vec<Message>,
) -> FieldResult<(Vec<Message>, Mode)> {
    let mut mode = None;
    for col in ["thinking", "reasoning"] {
        let Some(v) = row.get(col).filter(|v| !v.is_null()) else {
            continue;
        };
        mode = Some(match v {
            Value::Bool(b) => {
                if *b {
                    Mode::Think
                } else {
                    Mode::NoThink
                }
            }
            Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
                "on" | "true" | "think" | "yes" => Mode::Think,
                "off" | "false" | "no_think" | "no" | "" => Mode::NoThink,
                _ => {
                    // The reasoning text itself.
                    let Some(last) = messages.iter_mut().rev().find(|m| m.role == "assistant")
                    else {
                        return Err(FieldError::col("messages", "no assistant turn to train on"));
                    };
                    if !last.content.contains("<think>") {
                        last.content = format!(
                            "<think>\n{}\n</think>\n\n{}",
                            s.trim(),
                            last.content.trim_start()
                        );
                    }
                    Mode::Think
                }
            },
            other => {
                return Err(FieldError::col(
                    col,
                    format!(
                        "must be a boolean, on/off or the reasoning text, got {}",
                        kind_of(other)
                    ),
                ))
            }
        });
        break;
    }
    if let Some(pos) = messages.iter().position(|m| m.role == "system") {
        let text = messages[pos].content.trim().to_ascii_lowercase();
        let off = THINK_OFF.iter().any(|p| text.contains(p));
        let on = !off && THINK_ON.iter().any(|p| text.contains(p));
        if on || off {
            mode = mode.or(Some(if on { Mode::Think } else { Mode::NoThink }));
            if THINK_ON.contains(&text.as_str()) || THINK_OFF.contains(&text.as_str()) {
                messages.remove(pos);
            }
        }
    }
    let mode = match mode {
        Some(m) => m,
        None => {
            let thinks = messages
                .iter()
                .filter(|m| m.role == "assistant")
                .any(|m| m.content.contains("<think>") && strip_empty_think(&m.content).is_none());
            if thinks {
                Mode::Think
            } else {
                Mode::NoThink
            }
        }
    };
    if mode == Mode::NoThink {
        for m in messages.iter_mut().filter(|m| m.role == "assistant") {
            if let Some(rest) = strip_empty_think(&m.content) {
                m.content = rest.to_string();
            } else if m.content.contains("<think>") {
                return Err(FieldError::col(
                    "messages",
                    "the mode is no_think but an assistant turn has a non-empty <think> block",
                ));
            }
        }
    }
    Ok((messages, mode))
}

fn sft_object(messages: Vec<Message>, mode: Mode) -> Map<String, Value> {
    let v = json!({"messages": messages, "mode": mode.as_str()});
    v.as_object().cloned().unwrap_or_default()
}

/// Nemotron-Cascade SFT.
pub fn nemotron_sft(row: &Map<String, Value>) -> FieldResult<Mapped> {
    let messages = parse_messages("messages", req(row, "messages")?)?;
    if !messages.iter().any(|m| m.role == "assistant") {
        return Err(FieldError::col("messages", "no assistant turn to train on"));
    }
    let (messages, mode) = sft_mode_from(row, messages)?;
    Ok(Mapped::Row(sft_object(messages, mode)))
}

/// Turns from a string (one message of `role`) or a message list.
fn turns(col: &str, v: &Value, role: &str) -> FieldResult<Vec<Message>> {
    match v {
        Value::String(s) => Ok(vec![Message::new(role, s.clone())]),
        Value::Array(_) => parse_messages(col, v),
        other => Err(FieldError::col(
            col,
            format!("must be a string or a message list, got {}", kind_of(other)),
        )),
    }
}

/// TRL prompt/completion (string or conversational) as an SFT conversation.
pub fn trl_sft(row: &Map<String, Value>) -> FieldResult<Mapped> {
    let mut messages = turns("prompt", req(row, "prompt")?, "user")?;
    let completion = turns("completion", req(row, "completion")?, "assistant")?;
    if !completion.iter().any(|m| m.role == "assistant") {
        return Err(FieldError::col(
            "completion",
            "no assistant turn to train on",
        ));
    }
    messages.extend(completion);
    let (messages, mode) = sft_mode_from(row, messages)?;
    Ok(Mapped::Row(sft_object(messages, mode)))
}

/// The one user prompt of a pair's context (our pairs hold a single-turn prompt).
fn single_prompt(col: &str, context: &[Message]) -> FieldResult<String> {
    match context {
        [m] if m.role == "user" => Ok(m.content.clone()),
        [] => Err(FieldError::col(col, "no prompt")),
        _ => Err(FieldError::col(
            col,
            format!(
                "a {}-turn context; preference pairs take a single user prompt",
                context.len()
            ),
        )),
    }
}

/// The response text of a pair side: a string, or a conversation whose last turn is the
/// assistant's (its earlier turns are returned as the side's own context).
fn side(col: &str, v: &Value) -> FieldResult<(Vec<Message>, String)> {
    match v {
        Value::String(s) => Ok((Vec::new(), s.clone())),
        Value::Array(_) => {
            let mut msgs = parse_messages(col, v)?;
            match msgs.pop() {
                Some(m) if m.role == "assistant" => Ok((msgs, m.content)),
                _ => Err(FieldError::col(col, "must end with an assistant turn")),
            }
        }
        other => Err(FieldError::col(
            col,
            format!("must be a string or a message list, got {}", kind_of(other)),
        )),
    }
}

fn pair_object(prompt: String, chosen: String, rejected: String) -> Mapped {
    let v = json!({"prompt": prompt, "chosen": chosen, "rejected": rejected});
    Mapped::Row(v.as_object().cloned().unwrap_or_default())
}

/// TRL preference rows (explicit or implicit prompt, string or conversational); Skywork.
pub fn trl_pairs(row: &Map<String, Value>) -> FieldResult<Mapped> {
    let (chosen_ctx, chosen) = side("chosen", req(row, "chosen")?)?;
    let (rejected_ctx, rejected) = side("rejected", req(row, "rejected")?)?;
    let prompt = match row.get("prompt").filter(|v| !v.is_null()) {
        Some(p) => {
            if !chosen_ctx.is_empty() || !rejected_ctx.is_empty() {
                return Err(FieldError::col(
                    "chosen",
                    "has turns before the response although `prompt` is given",
                ));
            }
            single_prompt("prompt", &turns("prompt", p, "user")?)?
        }
        None => {
            if chosen_ctx != rejected_ctx {
                return Err(FieldError::col(
                    "rejected",
                    "its conversation before the response differs from `chosen`'s",
                ));
            }
            single_prompt("chosen", &chosen_ctx)?
        }
    };
    Ok(pair_object(prompt, chosen, rejected))
}

/// HelpSteer3 preference: `overall_preference` < 0 prefers `response1`, > 0 `response2`; ties
/// are dropped.
pub fn helpsteer3(row: &Map<String, Value>) -> FieldResult<Mapped> {
    let pref = req(row, "overall_preference")?
        .as_i64()
        .ok_or_else(|| FieldError::col("overall_preference", "must be an integer"))?;
    if pref == 0 {
        return Ok(Mapped::Skip("tie (overall_preference 0)".into()));
    }
    let prompt = single_prompt("context", &turns("context", req(row, "context")?, "user")?)?;
    let text = |col: &str| match req(row, col)? {
        Value::String(s) => Ok(s.clone()),
        v => Err(FieldError::col(
            col,
            format!("must be a string, got {}", kind_of(v)),
        )),
    };
    let (r1, r2) = (text("response1")?, text("response2")?);
    Ok(if pref < 0 {
        pair_object(prompt, r1, r2)
    } else {
        pair_object(prompt, r2, r1)
    })
}

/// An RLHF prompt (Nemotron-Cascade RL-RLHF; TRL conversational prompt-only).
pub fn rlhf_prompt(row: &Map<String, Value>) -> FieldResult<Mapped> {
    let mut out = Map::new();
    put_prompt(&mut out, "prompt", req(row, "prompt")?)?;
    Ok(Mapped::Row(super::with_domain(out, crate::StageKind::Rlhf)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn the_mode_comes_from_whatever_the_row_has() {
        let msgs = |a: &str| vec![Message::user("q"), Message::new("assistant", a)];
        let (m, mode) = sft_mode_from(&obj(json!({})), msgs("<think>\nhm\n</think>\n\nA")).unwrap();
        assert_eq!(
            (mode, m[1].content.as_str()),
            (Mode::Think, "<think>\nhm\n</think>\n\nA")
        );
        let (m, mode) = sft_mode_from(&obj(json!({})), msgs("<think>\n\n</think>\n\nA")).unwrap();
        assert_eq!((mode, m[1].content.as_str()), (Mode::NoThink, "A"));
        let (_, mode) = sft_mode_from(&obj(json!({})), msgs("A")).unwrap();
        assert_eq!(mode, Mode::NoThink);
        let (m, mode) = sft_mode_from(&obj(json!({"reasoning": "because"})), msgs("A")).unwrap();
        assert_eq!(
            (mode, m[1].content.as_str()),
            (Mode::Think, "<think>\nbecause\n</think>\n\nA")
        );
        let (_, mode) = sft_mode_from(&obj(json!({"thinking": false})), msgs("A")).unwrap();
        assert_eq!(mode, Mode::NoThink);
        let mut with_sys = msgs("A");
        with_sys.insert(0, Message::system("detailed thinking off"));
        let (m, mode) = sft_mode_from(&obj(json!({})), with_sys).unwrap();
        assert_eq!((mode, m.len()), (Mode::NoThink, 2));
        let e =
            sft_mode_from(&obj(json!({"thinking": "off"})), msgs("<think>x</think>A")).unwrap_err();
        assert!(e.reason.contains("non-empty"), "{e:?}");
    }
}
