//! Finding the fenced code blocks of a final answer (code and SWE verifiers).

use std::sync::OnceLock;

use regex::Regex;

/// Every closed Markdown code fence of `answer`, in order, as `(language tag, body)`.
pub fn fenced_blocks(answer: &str) -> Vec<(&str, &str)> {
    static FENCE: OnceLock<Regex> = OnceLock::new();
    let fence = FENCE.get_or_init(|| {
        Regex::new(r"(?s)```[ \t]*([A-Za-z0-9_+\-]*)[^\n]*\n(.*?)```").expect("valid regex")
    });
    fence
        .captures_iter(answer)
        .map(|c| {
            (
                c.get(1).map_or("", |m| m.as_str()),
                c.get(2).map_or("", |m| m.as_str()),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_closed_fences_with_their_language() {
        let blocks = fenced_blocks("a\n```python\nx = 1\n```\nb\n```\ny\n```\n```open");
        assert_eq!(blocks, vec![("python", "x = 1\n"), ("", "y\n")]);
    }
}
