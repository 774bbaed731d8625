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

/// How a program's stdout is compared with the expected output (reference field
/// `stdout_compare`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StdoutCompare {
    /// APPS / TACO (`eval/testing_util.py`, `run_test`): the same whitespace-separated tokens in
    /// the same order, else the same number of tokens with every differing pair numbers that
    /// `np.allclose` accepts (`|a - b| <= 1e-8 + 1e-5 * |b|`, b expected). See [`apps_match`].
    #[default]
    Apps,
    /// LiveCodeBench (`lcb_runner/evaluation/testing_util.py`, `grade_stdio`): both outputs
    /// stripped and split into lines, each line stripped; the same number of lines, and each
    /// line pair equal, or both lines whitespace-split into tokens that are all decimals and
    /// equal as `decimal.Decimal` values (so `1.0` = `1`, but `0.333` != `0.3333`). See
    /// [`lcb_match`].
    Lcb,
}

impl StdoutCompare {
    /// Parses the reference field's value (`"apps"` or `"lcb"`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "apps" => Some(Self::Apps),
            "lcb" => Some(Self::Lcb),
            _ => None,
        }
    }

    /// Whether `actual` matches `expected` under this rule.
    pub fn matches(self, actual: &str, expected: &str) -> bool {
        match self {
            Self::Apps => apps_match(actual, expected),
            Self::Lcb => lcb_match(actual, expected),
        }
    }
}

/// APPS/TACO's stdout rule as we implement it: [`tokens_match`], else the same number of tokens
/// where every pair is equal or both parse as floats and are close by `np.allclose`'s defaults
/// (rtol 1e-5, atol 1e-8; NaN never equal, infinities equal when of the same sign).
///
/// APPS applies the float tolerance to outputs whose every line is one number; we apply it per
/// token, which also covers lines of several numbers. APPS's last fallbacks (comparing each line
/// as an unordered set of tokens, and numbers rounded to 3 decimals in such sets) are not
/// implemented: they accept permuted output.
pub fn apps_match(actual: &str, expected: &str) -> bool {
    if tokens_match(actual, expected) {
        return true;
    }
    let (a, e): (Vec<&str>, Vec<&str>) = (
        actual.split_whitespace().collect(),
        expected.split_whitespace().collect(),
    );
    a.len() == e.len()
        && a.iter().zip(&e).all(|(x, y)| {
            x == y
                || match (python_float(x), python_float(y)) {
                    (Some(x), Some(y)) => allclose(x, y),
                    _ => false,
                }
        })
}

/// `np.isclose(a, b)` with the defaults (b is the expected value).
fn allclose(a: f64, b: f64) -> bool {
    if a.is_nan() || b.is_nan() {
        return false;
    }
    if a.is_infinite() || b.is_infinite() {
        return a == b;
    }
    (a - b).abs() <= 1e-8 + 1e-5 * b.abs()
}

/// Python's `float(token)` for a whitespace-free token: decimal and exponent forms, `inf`,
/// `infinity`, `nan` in any case, optional sign, `_` between digits.
fn python_float(token: &str) -> Option<f64> {
    let t = if token.contains('_') {
        let b = token.as_bytes();
        let ok = b.iter().enumerate().all(|(i, &c)| {
            c != b'_'
                || (i > 0
                    && i + 1 < b.len()
                    && b[i - 1].is_ascii_digit()
                    && b[i + 1].is_ascii_digit())
        });
        if !ok {
            return None;
        }
        token.replace('_', "")
    } else {
        token.to_string()
    };
    let body = t.trim_start_matches(['+', '-']);
    if t.len() - body.len() > 1 {
        return None;
    }
    let lower = body.to_ascii_lowercase();
    if !matches!(lower.as_str(), "inf" | "infinity" | "nan")
        && !body
            .bytes()
            .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'+' | b'-'))
    {
        return None;
    }
    t.parse::<f64>().ok()
}

/// LiveCodeBench's stdout rule (`grade_stdio`); see [`StdoutCompare::Lcb`].
pub fn lcb_match(actual: &str, expected: &str) -> bool {
    let lines =
        |s: &str| -> Vec<String> { s.trim().split('\n').map(|l| l.trim().to_string()).collect() };
    let (a, e) = (lines(actual), lines(expected));
    if a.len() != e.len() {
        return false;
    }
    a.iter().zip(&e).all(|(x, y)| {
        if x == y {
            return true;
        }
        let decimals = |line: &str| -> Option<Vec<Decimal>> {
            line.split_whitespace().map(Decimal::parse).collect()
        };
        match (decimals(x), decimals(y)) {
            (Some(x), Some(y)) => x.len() == y.len() && x.iter().zip(&y).all(|(p, q)| p.equals(q)),
            _ => false,
        }
    })
}

/// A `decimal.Decimal` value, reduced so that equal values compare equal.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Decimal {
    /// Zero (of either sign and any exponent).
    Zero,
    /// sign, significant digits without leading or trailing zeros, exponent of the last digit.
    Finite(bool, String, i64),
    /// An infinity with its sign.
    Inf(bool),
    /// A quiet or signalling NaN: equal to nothing.
    NaN,
}

impl Decimal {
    /// Python's `Decimal(token)` for a whitespace-free ASCII token; `None` where Python raises.
    fn parse(token: &str) -> Option<Decimal> {
        let (neg, body) = match token.as_bytes().first() {
            Some(b'-') => (true, &token[1..]),
            Some(b'+') => (false, &token[1..]),
            _ => (false, token),
        };
        let lower = body.to_ascii_lowercase();
        if lower == "inf" || lower == "infinity" {
            return Some(Decimal::Inf(neg));
        }
        for nan in ["nan", "snan"] {
            if let Some(payload) = lower.strip_prefix(nan) {
                return payload
                    .bytes()
                    .all(|c| c.is_ascii_digit())
                    .then_some(Decimal::NaN);
            }
        }
        let (mantissa, exp) = match body.find(['e', 'E']) {
            Some(i) => (&body[..i], Some(&body[i + 1..])),
            None => (body, None),
        };
        let exp: i64 = match exp {
            None => 0,
            Some(e) => {
                let digits = e.trim_start_matches(['+', '-']);
                if e.len() - digits.len() > 1 || !digits_with_underscores(digits) {
                    return None;
                }
                let v: i64 = digits.replace('_', "").parse().unwrap_or(i64::MAX / 4);
                if e.starts_with('-') {
                    -v
                } else {
                    v
                }
            }
        };
        let (int, frac) = match mantissa.split_once('.') {
            Some((i, f)) => (i, f),
            None => (mantissa, ""),
        };
        let int_ok = int.is_empty() || digits_with_underscores(int);
        let frac_ok = frac.is_empty() || digits_with_underscores(frac);
        if !int_ok || !frac_ok || (int.is_empty() && frac.is_empty()) {
            return None;
        }
        let frac = frac.replace('_', "");
        let all = format!("{}{}", int.replace('_', ""), frac);
        let mut exp = exp - frac.len() as i64;
        let digits = all.trim_start_matches('0');
        let trimmed = digits.trim_end_matches('0');
        exp += (digits.len() - trimmed.len()) as i64;
        if trimmed.is_empty() {
            return Some(Decimal::Zero);
        }
        Some(Decimal::Finite(neg, trimmed.to_string(), exp))
    }

    /// `Decimal.__eq__`: NaN equals nothing.
    fn equals(&self, other: &Decimal) -> bool {
        !matches!(self, Decimal::NaN) && self == other
    }
}

/// Non-empty ASCII digits, `_` allowed only between two digits (Python's numeric literals).
fn digits_with_underscores(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter().enumerate().all(|(i, &c)| {
            c.is_ascii_digit()
                || (c == b'_'
                    && i > 0
                    && i + 1 < b.len()
                    && b[i - 1].is_ascii_digit()
                    && b[i + 1].is_ascii_digit())
        })
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
    fn apps_rule_tokens_then_float_tolerance() {
        assert!(apps_match("1 2\n3\n", "1  2 3"));
        assert!(apps_match("0.3333333", "0.333333"));
        assert!(apps_match("1.0 2", "1 2.000001"));
        assert!(apps_match("1e5", "100000"));
        assert!(apps_match("inf", "Infinity"));
        assert!(!apps_match("nan", "NaN"), "NaN is never close");
        assert!(!apps_match("0.33", "0.333333"));
        assert!(!apps_match("1 2", "1 2 3"));
        assert!(!apps_match("2 1", "1 2"), "no order-insensitive fallback");
        assert!(!apps_match("YES", "yes"));
        assert!(!apps_match("1__0", "10"));
    }

    #[test]
    fn lcb_rule_lines_then_decimals() {
        assert!(lcb_match("  1 2\n3  \n\n", "1 2\n3"));
        assert!(lcb_match("1.0 2.50\n", "1 2.5"));
        assert!(lcb_match("-0", "0.000"));
        assert!(lcb_match("1E+2", "100"));
        assert!(lcb_match("1_000", "1000"));
        assert!(!lcb_match("1 2 3", "1 2\n3"), "line structure counts");
        assert!(
            !lcb_match("0.333", "0.3333"),
            "no tolerance: exact decimals"
        );
        assert!(
            lcb_match("NaN", "NaN"),
            "equal lines match before any decimal reading"
        );
        assert!(!lcb_match("NaN", "nan"), "Decimal NaN equals nothing");
        assert!(!lcb_match("1  2", "1 2 3"));
        assert!(
            !lcb_match("abc 1", "abc 1.0"),
            "a non-numeric token forbids the decimal compare"
        );
        assert!(lcb_match("a   b", "a   b"));
        assert!(
            !lcb_match("a   b", "a b"),
            "inner whitespace of a non-numeric line counts"
        );
        assert_eq!(StdoutCompare::parse("lcb"), Some(StdoutCompare::Lcb));
        assert_eq!(StdoutCompare::parse("x"), None);
    }

    #[test]
    fn token_comparison_ignores_whitespace_only() {
        assert!(tokens_match("1 2\n3\n", "1  2 3"));
        assert!(tokens_match("", "\n"));
        assert!(!tokens_match("1 2", "1 2 3"));
        assert!(!tokens_match("12", "1 2"));
    }
}
