//! Chat: messages, the chat template with `/think` and `/no_think` modes, chat encoding with an
//! assistant-token mask for SFT, and splitting a response into its thinking part and its final
//! answer (the output side of the same format).
//!
//! The exact text each mode produces is documented on [`ChatTemplate::render`].

mod encode;
mod response;
mod template;

pub use encode::{Chat, SftEncoding};
pub use response::{split_response, SplitResponse};
pub use template::{mode_flag, ChatTemplate, CHATML_TEMPLATE};

use serde::{Deserialize, Serialize};

use crate::tokenizer::TokenizerError;

/// Errors from rendering or encoding a conversation.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// Loading or running the tokenizer failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The chat template does not compile.
    #[error("chat template: {message}")]
    Template {
        /// minijinja's message, with the template line.
        message: String,
    },
    /// The chat template failed while rendering (e.g. it called `raise_exception`).
    #[error("rendering the chat template: {message}")]
    Render {
        /// minijinja's message, with the template line.
        message: String,
    },
    /// A message role outside system / user / assistant / tool.
    #[error("message {index}: unknown role {role:?} (allowed: system, user, assistant, tool)")]
    Role {
        /// Index of the message.
        index: usize,
        /// The role found.
        role: String,
    },
    /// The conversation has no user turn to carry the mode flag.
    #[error("the conversation has no user turn to carry the /think or /no_think flag")]
    NoUserTurn,
    /// The last user turn already ends with the other mode's flag.
    #[error("the last user turn ends with {found} but the requested mode is {requested}")]
    ModeConflict {
        /// The flag found.
        found: &'static str,
        /// The flag of the requested mode.
        requested: &'static str,
    },
    /// An assistant turn after the last user turn has reasoning, but the mode is no-think.
    #[error("message {index}: an assistant turn with a non-empty <think> block in no-think mode")]
    ThinkingInNoThinkMode {
        /// Index of the message.
        index: usize,
    },
    /// The assistant span of an SFT sample does not start or end on a token boundary.
    #[error(
        "message {index}: the assistant turn does not start/end on a token boundary ({detail})"
    )]
    MaskBoundary {
        /// Index of the assistant message.
        index: usize,
        /// Which boundary failed.
        detail: String,
    },
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, ChatError>;

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text. An assistant's may hold `<think>…</think>` before its answer.
    pub content: String,
}

impl Message {
    /// A message with any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}
