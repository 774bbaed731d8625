//! Getting the program out of a response and comparing program output.

/// The program in a final answer: the last fenced block tagged `python`/`py`/`python3`, else
/// the last fenced block of any kind, else the whole answer when it has no fence at all.
/// `None` when the answer is empty or only has an unclosed fence.
pub fn extract_code(answer: &str) -> Option<&str> {
    let blocks = crate::response::fenced_blocks(answer);
    let is_python = |lang: &str| {
        matches!(
            lang.to_ascii_lowercase().as_str(),
            "python" | "py" | "python3"
        )
    };
    if let Some((_, code)) = blocks.iter().rev().find(|(lang, _)| is_python(lang)) {
        return Some(code);
    }
    if let Some((_, code)) = blocks.last() {
        return Some(code);
    }
    if answer.contains("```") || answer.trim().is_empty() {
        return None;
    }
    Some(answer)
}

/// Whitespace-tolerant comparison: the same whitespace-separated tokens in the same order.
pub fn tokens_match(actual: &str, expected: &str) -> bool {
    actual.split_whitespace().eq(expected.split_whitespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefers_last_python_block() {
        let a = "x\n```python\nprint(1)\n```\ntext\n```\nplain\n```\n```py\nprint(2)\n```\n";
        assert_eq!(extract_code(a), Some("print(2)\n"));
        assert_eq!(extract_code("```text\nhello\n```"), Some("hello\n"));
    }

    #[test]
    fn bare_answer_and_unclosed_fence() {
        assert_eq!(extract_code("print(3)"), Some("print(3)"));
        assert_eq!(extract_code("```python\nprint(3)"), None);
        assert_eq!(extract_code("   "), None);
    }

    #[test]
    fn token_comparison_ignores_whitespace_only() {
        assert!(tokens_match("1 2\n3\n", "1  2 3"));
        assert!(tokens_match("", "\n"));
        assert!(!tokens_match("1 2", "1 2 3"));
        assert!(!tokens_match("12", "1 2"));
    }
}
