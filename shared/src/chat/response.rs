//! The assistant's output format: a response is an optional thinking block closed by
//! `</think>`, then the final answer (see [`super::ChatTemplate::render`] for what each mode
//! renders). Splitting it here is the one place that knows the tags; verifiers see the parts.

/// A response split at `</think>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitResponse<'a> {
    /// The whole response text.
    pub full: &'a str,
    /// The text inside `<think>…</think>` (trimmed), if a thinking block was closed.
    pub thinking: Option<&'a str>,
    /// The text after the last `</think>`; `None` when the response opened a thinking block and
    /// never closed it (no final answer). A response with no `<think>` at all is all answer.
    pub answer: Option<&'a str>,
}

/// Splits `text` into thinking and final answer. No `</think>` after a `<think>` means there is no
/// final answer; text with neither tag is treated as a direct answer.
pub fn split_response(text: &str) -> SplitResponse<'_> {
    const OPEN: &str = "<think>";
    const CLOSE: &str = "</think>";
    if let Some(close) = text.rfind(CLOSE) {
        let before = &text[..close];
        let thinking = match before.find(OPEN) {
            Some(open) => &before[open + OPEN.len()..],
            None => before,
        };
        SplitResponse {
            full: text,
            thinking: Some(thinking.trim()),
            answer: Some(text[close + CLOSE.len()..].trim()),
        }
    } else if text.contains(OPEN) {
        SplitResponse {
            full: text,
            thinking: None,
            answer: None,
        }
    } else {
        SplitResponse {
            full: text,
            thinking: None,
            answer: Some(text.trim()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_thinking_and_answer() {
        let s = split_response("<think>\nlet me see\n</think>\n\nThe answer is \\boxed{4}.");
        assert_eq!(s.thinking, Some("let me see"));
        assert_eq!(s.answer, Some("The answer is \\boxed{4}."));
    }

    #[test]
    fn empty_think_block_of_no_think_mode() {
        let s = split_response("<think>\n\n</think>\n\nHello");
        assert_eq!(s.thinking, Some(""));
        assert_eq!(s.answer, Some("Hello"));
    }

    #[test]
    fn unclosed_think_has_no_answer() {
        let s = split_response("<think>I keep thinking \\boxed{3}");
        assert_eq!(s.answer, None);
        assert_eq!(s.thinking, None);
    }

    #[test]
    fn plain_text_is_all_answer() {
        assert_eq!(split_response(" 42 ").answer, Some("42"));
    }

    #[test]
    fn prompt_side_think_open_is_optional() {
        // When the template already opened <think>, the response starts inside the block.
        let s = split_response("reasoning here</think>answer");
        assert_eq!(s.thinking, Some("reasoning here"));
        assert_eq!(s.answer, Some("answer"));
    }
}
