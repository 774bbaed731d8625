//! The chat template: a Jinja template rendered with minijinja the way Hugging Face transformers
//! renders it with Python jinja2 (`trim_blocks`, `lstrip_blocks`, Python string methods,
//! `namespace`, loop controls, `raise_exception`, a `tojson` equal to Python's `json.dumps`).

use minijinja::value::Value;
use minijinja::{Environment, ErrorKind};
use serde::Serialize;

use super::{ChatError, Message, Result};
use crate::tokenizer::TokenizerConfig;
pub use crate::tokenizer::CHATML_TEMPLATE;
use crate::Mode;

/// The user-turn flag of a mode: `"/think"` or `"/no_think"`.
pub fn mode_flag(mode: Mode) -> &'static str {
    match mode {
        Mode::Think => "/think",
        Mode::NoThink => "/no_think",
    }
}

const TEMPLATE_NAME: &str = "chat_template";

/// A compiled chat template plus the special-token strings it may refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    builtin: bool,
    bos_token: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
}

#[derive(Serialize)]
struct Context<'a> {
    messages: &'a [Message],
    add_generation_prompt: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    enable_thinking: Option<bool>,
    bos_token: &'a Option<String>,
    eos_token: &'a Option<String>,
    pad_token: &'a Option<String>,
}

impl ChatTemplate {
    /// Compiles a Jinja chat template. A syntax error names the template line.
    pub fn from_source(source: &str) -> Result<Self> {
        Self::build(source.to_string(), false)
    }

    /// The built-in ChatML template ([`CHATML_TEMPLATE`]).
    pub fn chatml() -> Self {
        Self::build(CHATML_TEMPLATE.to_string(), true).expect("the built-in template compiles")
    }

    /// The template of a `tokenizer_config.json` (with its EOS/pad/BOS strings), or the built-in
    /// ChatML template when it has none.
    pub fn from_tokenizer_config(config: &TokenizerConfig) -> Result<Self> {
        let mut template = match &config.chat_template {
            Some(source) => Self::from_source(source)?,
            None => Self::chatml(),
        };
        template.bos_token = config.bos_token.clone();
        template.eos_token = config.eos_token.clone();
        template.pad_token = config.pad_token.clone();
        Ok(template)
    }

    /// Whether this is the built-in ChatML template.
    pub fn is_builtin(&self) -> bool {
        self.builtin
    }

    fn build(source: String, builtin: bool) -> Result<Self> {
        let mut env = Environment::new();
        // Hugging Face compiles chat templates with these two options on.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", python_tojson);
        env.add_function(
            "raise_exception",
            |message: String| -> std::result::Result<Value, _> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|e| ChatError::Template {
                message: describe(&e),
            })?;
        Ok(ChatTemplate {
            env,
            builtin,
            bos_token: None,
            eos_token: None,
            pad_token: None,
        })
    }

    /// Renders `messages` exactly as the template says, with `enable_thinking` passed through
    /// when given (undefined otherwise). No mode flag is added: this is what Python's
    /// `tokenizer.apply_chat_template(messages, tokenize=False, ...)` returns.
    pub fn render_raw(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<String> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .expect("the template was added at construction");
        let ctx = Context {
            messages,
            add_generation_prompt,
            enable_thinking,
            bos_token: &self.bos_token,
            eos_token: &self.eos_token,
            pad_token: &self.pad_token,
        };
        template
            .render(Value::from_serialize(&ctx))
            .map_err(|e| ChatError::Render {
                message: describe(&e),
            })
    }

    /// Renders a conversation in `mode`.
    ///
    /// 1. The last user turn gets the mode flag appended after a space (`"… /think"` or
    ///    `"… /no_think"`), unless it already ends with that flag; ending with the other flag is
    ///    an error ([`ChatError::ModeConflict`]). A conversation without a user turn is an error.
    /// 2. The template is rendered with `enable_thinking = (mode == Think)`. With Qwen3's
    ///    template and the built-in one this gives:
    ///    - generation prompt, think: `<|im_start|>assistant\n` (the model writes `<think>` itself);
    ///    - generation prompt, no-think: `<|im_start|>assistant\n<think>\n\n</think>\n\n`;
    ///    - an assistant turn after the last user turn, think:
    ///      `<|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{answer}<|im_end|>\n`;
    ///    - the same, no-think: `<|im_start|>assistant\n<think>\n\n</think>\n\n{answer}<|im_end|>\n`
    ///      (an assistant turn with non-empty reasoning here is an error,
    ///      [`ChatError::ThinkingInNoThinkMode`]).
    ///
    /// Assistant turns before the last user turn lose their reasoning (the template's choice).
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        mode: Mode,
    ) -> Result<String> {
        let flagged = with_mode_flag(messages, mode)?;
        self.render_raw(&flagged, add_generation_prompt, Some(mode == Mode::Think))
    }
}

/// Checks roles and the no-think rule, and appends the mode flag to the last user turn.
pub(crate) fn with_mode_flag(messages: &[Message], mode: Mode) -> Result<Vec<Message>> {
    for (index, message) in messages.iter().enumerate() {
        if !matches!(
            message.role.as_str(),
            "system" | "user" | "assistant" | "tool"
        ) {
            return Err(ChatError::Role {
                index,
                role: message.role.clone(),
            });
        }
    }
    let last_user = last_user_index(messages).ok_or(ChatError::NoUserTurn)?;
    if mode == Mode::NoThink {
        for (index, message) in messages.iter().enumerate().skip(last_user + 1) {
            let thinking = super::split_response(&message.content).thinking;
            if message.role == "assistant" && thinking.is_some_and(|t| !t.is_empty()) {
                return Err(ChatError::ThinkingInNoThinkMode { index });
            }
        }
    }
    let wanted = mode_flag(mode);
    let other = match mode {
        Mode::Think => mode_flag(Mode::NoThink),
        Mode::NoThink => mode_flag(Mode::Think),
    };
    let mut out = messages.to_vec();
    let content = &mut out[last_user].content;
    let trimmed = content.trim_end();
    if trimmed.ends_with(other) && !trimmed.ends_with(wanted) {
        return Err(ChatError::ModeConflict {
            found: other,
            requested: wanted,
        });
    }
    if !trimmed.ends_with(wanted) {
        content.push(' ');
        content.push_str(wanted);
    }
    Ok(out)
}

/// Index of the last `user` message.
pub(crate) fn last_user_index(messages: &[Message]) -> Option<usize> {
    messages.iter().rposition(|m| m.role == "user")
}

/// A minijinja error with its template line when known.
fn describe(e: &minijinja::Error) -> String {
    match e.line() {
        Some(line) => format!("{e} (template line {line})"),
        None => e.to_string(),
    }
}

/// `tojson` as Hugging Face defines it: Python `json.dumps(x, ensure_ascii=False)` with the
/// default `", "` / `": "` separators (minijinja's own `tojson` is compact and HTML-escapes).
fn python_tojson(value: &Value) -> std::result::Result<Value, minijinja::Error> {
    let mut out = String::new();
    write_python_json(value, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn write_python_json(value: &Value, out: &mut String) -> std::result::Result<(), minijinja::Error> {
    use minijinja::value::ValueKind;
    match value.kind() {
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_json(&item, out)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let key_text = match key.as_str() {
                    Some(s) => s.to_string(),
                    None => key.to_string(),
                };
                out.push_str(&serde_json::Value::String(key_text).to_string());
                out.push_str(": ");
                write_python_json(&value.get_item(&key)?, out)?;
            }
            out.push('}');
        }
        _ => {
            let scalar = serde_json::to_string(value).map_err(|e| {
                minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}"))
            })?;
            out.push_str(&scalar);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv() -> Vec<Message> {
        vec![
            Message::user("Hi"),
            Message::assistant("Hello!"),
            Message::user("2+2?"),
        ]
    }

    #[test]
    fn flag_is_appended_to_last_user_turn_only() {
        let out = with_mode_flag(&conv(), Mode::Think).unwrap();
        assert_eq!(out[0].content, "Hi");
        assert_eq!(out[2].content, "2+2? /think");
        let again = with_mode_flag(&out, Mode::Think).unwrap();
        assert_eq!(again[2].content, "2+2? /think");
        assert!(matches!(
            with_mode_flag(&out, Mode::NoThink),
            Err(ChatError::ModeConflict { .. })
        ));
    }

    #[test]
    fn builtin_generation_prompts() {
        let t = ChatTemplate::chatml();
        let think = t.render(&conv(), true, Mode::Think).unwrap();
        assert!(think.ends_with("2+2? /think<|im_end|>\n<|im_start|>assistant\n"));
        let no = t.render(&conv(), true, Mode::NoThink).unwrap();
        assert!(no
            .ends_with("2+2? /no_think<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    }

    #[test]
    fn no_user_turn_and_bad_role_are_errors() {
        let t = ChatTemplate::chatml();
        let only_system = [Message::system("x")];
        assert!(matches!(
            t.render(&only_system, true, Mode::Think),
            Err(ChatError::NoUserTurn)
        ));
        let bad = [Message::new("robot", "x"), Message::user("y")];
        assert!(matches!(
            t.render(&bad, true, Mode::Think),
            Err(ChatError::Role { index: 0, .. })
        ));
    }

    #[test]
    fn thinking_in_no_think_mode_is_an_error() {
        let t = ChatTemplate::chatml();
        let conv = [
            Message::user("q"),
            Message::assistant("<think>\nhmm\n</think>\n\nA"),
        ];
        assert!(matches!(
            t.render(&conv, false, Mode::NoThink),
            Err(ChatError::ThinkingInNoThinkMode { index: 1 })
        ));
        let empty = [
            Message::user("q"),
            Message::assistant("<think>\n\n</think>\n\nA"),
        ];
        assert!(t.render(&empty, false, Mode::NoThink).is_ok());
    }

    #[test]
    fn syntax_error_names_line() {
        let err = ChatTemplate::from_source("line one\n{% if %}").unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let t = ChatTemplate::from_source("{{ x | tojson }}").unwrap();
        let env = &t.env;
        let out = env
            .render_str(
                "{{ x | tojson }}",
                minijinja::context! { x => serde_json::json!({"a": [1, "é<b>"], "b": null}) },
            )
            .unwrap();
        assert_eq!(out, r#"{"a": [1, "é<b>"], "b": null}"#);
    }
}
