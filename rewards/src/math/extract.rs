//! Finding the final answer in a response: the last `\boxed{...}` (balanced braces), or an
//! explicit "answer is ..." sentence when configured as a fallback.

use std::sync::OnceLock;

use regex::Regex;

/// Returns the content of the last `\boxed{...}` / `\fbox{...}` in `text` (braces balanced), or of
/// the last `\boxed X` written without braces. `None` when there is none or it is unclosed.
pub fn last_boxed(text: &str) -> Option<&str> {
    let mut best: Option<(usize, &str)> = None;
    for cmd in ["\\boxed", "\\fbox"] {
        let Some(start) = text.rfind(cmd) else {
            continue;
        };
        if best.is_some_and(|(pos, _)| pos > start) {
            continue;
        }
        let rest = &text[start + cmd.len()..];
        let content = if let Some(inner) = rest.strip_prefix('{') {
            balanced_prefix(inner)
        } else if let Some(spaced) = rest.strip_prefix(' ') {
            // `\boxed 5`: the argument runs to the next `$` or whitespace.
            let end = spaced
                .find(|c: char| c == '$' || c.is_whitespace())
                .unwrap_or(spaced.len());
            Some(&spaced[..end])
        } else {
            None
        };
        if let Some(c) = content {
            best = Some((start, c));
        }
    }
    best.map(|(_, c)| c.trim())
}

/// Given the text just after an opening `{`, returns the text up to its matching `}`.
pub fn balanced_prefix(inner: &str) -> Option<&str> {
    let mut depth = 1usize;
    let mut escaped = false;
    for (i, c) in inner.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&inner[..i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// The last "the answer is X" in `text` (X up to the end of the line or a sentence-ending period),
/// with surrounding `$` removed.
pub fn answer_is(text: &str) -> Option<&str> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| {
        Regex::new(r"(?i)answer\s+is\s*:?\s*(.+?)\s*(?:\.\s|\.$|\n|$)").expect("static regex")
    });
    let cap = re.captures_iter(text).last()?;
    let m = cap.get(1)?.as_str().trim();
    let m = m.trim_start_matches('$').trim_end_matches('$').trim();
    (!m.is_empty()).then_some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_braces_and_last_box() {
        assert_eq!(
            last_boxed(r"\boxed{1} then \boxed{\frac{1}{2}}."),
            Some(r"\frac{1}{2}")
        );
        assert_eq!(last_boxed(r"$\boxed{\{1, 2\}}$"), Some(r"\{1, 2\}"));
        assert_eq!(last_boxed(r"\boxed 5$"), Some("5"));
        assert_eq!(last_boxed(r"\boxed{unclosed"), None);
        assert_eq!(last_boxed("no box"), None);
    }

    #[test]
    fn answer_is_fallback() {
        assert_eq!(answer_is("So the answer is $42$. Done"), Some("42"));
        assert_eq!(answer_is("The answer is: 3/4"), Some("3/4"));
        assert_eq!(answer_is("nothing"), None);
    }
}
