//! Chat encoding: rendered conversations to token ids, and the assistant-token mask for SFT.

use std::path::Path;

use super::template::last_user_index;
use super::{ChatError, ChatTemplate, Message, Result};
use crate::tokenizer::Tokenizer;
use crate::Mode;

/// A tokenizer and the chat template that goes with it.
#[derive(Debug)]
pub struct Chat {
    tokenizer: Tokenizer,
    template: ChatTemplate,
}

/// An SFT sample: token ids and which of them the loss covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftEncoding {
    /// The whole rendered conversation, tokenized.
    pub ids: Vec<u32>,
    /// `true` for the tokens the model is trained to produce (see [`Chat::encode_sft`]).
    pub assistant_mask: Vec<bool>,
}

impl Chat {
    /// Pairs a tokenizer with a template.
    pub fn new(tokenizer: Tokenizer, template: ChatTemplate) -> Self {
        Chat {
            tokenizer,
            template,
        }
    }

    /// Loads `DIR/tokenizer.json` and the template of `DIR/tokenizer_config.json` (the
    /// built-in ChatML template when the file or its `chat_template` is missing).
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let tokenizer = Tokenizer::from_dir(dir)?;
        let template = ChatTemplate::from_tokenizer_config(tokenizer.config())?;
        Ok(Chat::new(tokenizer, template))
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The chat template.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// Renders a conversation in `mode` (see [`ChatTemplate::render`]).
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        mode: Mode,
    ) -> Result<String> {
        self.template.render(messages, add_generation_prompt, mode)
    }

    /// Renders and tokenizes a conversation. Special tokens come only from the rendered text.
    pub fn encode_chat(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        mode: Mode,
    ) -> Result<Vec<u32>> {
        let text = self.render(messages, add_generation_prompt, mode)?;
        Ok(self.tokenizer.encode(&text)?)
    }

    /// Tokenizes an SFT conversation and marks the tokens the loss covers: for every assistant
    /// turn after the last user turn, the tokens the model would generate after the generation
    /// prompt of `mode`, through its `<|im_end|>` (the `\n` after it is not trained).
    ///
    /// In think mode that is `<think>\n{reasoning}\n</think>\n\n{answer}<|im_end|>`; in no-think
    /// mode the empty `<think>\n\n</think>\n\n` belongs to the generation prompt (the actor puts
    /// it in the prompt), so only `{answer}<|im_end|>` is trained. Earlier assistant turns are
    /// context only: the template drops their reasoning, so training on them would teach the
    /// model to answer without thinking.
    ///
    /// The boundaries are found by rendering the conversation up to each trained turn with the
    /// generation prompt and checking that its tokens are a prefix of the whole encoding; a
    /// template or tokenizer for which that fails is an error, never a wrong mask.
    pub fn encode_sft(&self, messages: &[Message], mode: Mode) -> Result<SftEncoding> {
        let full = self.render(messages, false, mode)?;
        let ids = self.tokenizer.encode(&full)?;
        let mut assistant_mask = vec![false; ids.len()];
        let last_user = last_user_index(messages).ok_or(ChatError::NoUserTurn)?;
        let boundary = |index: usize, detail: String| ChatError::MaskBoundary { index, detail };
        for index in (last_user + 1)..messages.len() {
            if messages[index].role != "assistant" {
                continue;
            }
            let prefix = self.render(&messages[..index], true, mode)?;
            if !full.starts_with(&prefix) {
                return Err(boundary(
                    index,
                    "the rendered conversation does not start with the generation prompt".into(),
                ));
            }
            let end_marker = "<|im_end|>";
            let end = full[prefix.len()..]
                .find(end_marker)
                .map(|at| prefix.len() + at + end_marker.len())
                .ok_or_else(|| boundary(index, "no <|im_end|> after the turn".into()))?;
            let prefix_ids = self.tokenizer.encode(&prefix)?;
            let through_end = self.tokenizer.encode(&full[..end])?;
            if !ids.starts_with(&prefix_ids) {
                return Err(boundary(index, "start splits a token".into()));
            }
            if !ids.starts_with(&through_end) {
                return Err(boundary(index, "end splits a token".into()));
            }
            assistant_mask[prefix_ids.len()..through_end.len()].fill(true);
        }
        Ok(SftEncoding {
            ids,
            assistant_mask,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{tiny_tokenizer, TokenizerConfig};

    fn tiny_chat() -> Chat {
        let tokenizer =
            Tokenizer::new(tiny_tokenizer(), TokenizerConfig::default(), "tiny").unwrap();
        Chat::new(tokenizer, ChatTemplate::chatml())
    }

    fn masked_text(chat: &Chat, enc: &SftEncoding) -> String {
        let ids: Vec<u32> = enc
            .ids
            .iter()
            .zip(&enc.assistant_mask)
            .filter(|(_, m)| **m)
            .map(|(id, _)| *id)
            .collect();
        chat.tokenizer().decode(&ids, false).unwrap()
    }

    #[test]
    fn sft_mask_think_mode_covers_reasoning_answer_and_im_end() {
        let chat = tiny_chat();
        let conv = [
            Message::system("Be brief."),
            Message::user("2+2?"),
            Message::assistant("<think>\nadd\n</think>\n\n4"),
        ];
        let enc = chat.encode_sft(&conv, Mode::Think).unwrap();
        assert_eq!(
            masked_text(&chat, &enc),
            "<think>\nadd\n</think>\n\n4<|im_end|>"
        );
        assert!(
            !enc.assistant_mask[enc.ids.len() - 1],
            "trailing newline is not trained"
        );
    }

    #[test]
    fn sft_mask_no_think_mode_covers_answer_only() {
        let chat = tiny_chat();
        let conv = [
            Message::user("Hi"),
            Message::assistant("Hello"),
            Message::user("2+2?"),
            Message::assistant("4"),
        ];
        let enc = chat.encode_sft(&conv, Mode::NoThink).unwrap();
        assert_eq!(masked_text(&chat, &enc), "4<|im_end|>");
        let text = chat.tokenizer().decode(&enc.ids, false).unwrap();
        assert!(text
            .contains("2+2? /no_think<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n4"));
    }
}
