//! Structured answers (scalars, tuples, intervals, sets, unions, matrices, text) and their
//! equivalence: scalars are compared by evaluating both sides at fixed pseudo-random points.

use std::collections::BTreeSet;

use super::latex::{as_text, normalize, parse_expr, Expr};

/// A parsed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// One scalar expression.
    Scalar(Expr),
    /// A bracketed sequence `(a, b)`, `[a, b)`, ...; brackets are part of its identity (an open
    /// interval and an ordered pair are written alike and compare alike).
    Bracketed {
        /// Opening bracket, `(` or `[`.
        open: char,
        /// Closing bracket, `)` or `]`.
        close: char,
        /// The elements in order.
        items: Vec<Answer>,
    },
    /// An unordered collection: `\{a, b\}`, a bare list `a, b`, `\pm a`, or a union of intervals.
    Set(Vec<Answer>),
    /// A matrix or column vector, rows in order.
    Matrix(Vec<Vec<Answer>>),
    /// A text answer, normalised (lowercase, no parentheses).
    Text(String),
    /// An equation `lhs = rhs` with scalar sides (`x + y = 1`, `y = 2x + 3`). One whose left side
    /// is a lone symbol also equals its right side alone (`x = 5` is `5`).
    Equation(Expr, Expr),
    /// A percentage `p\%` read as math-verify reads it (`percent_equivalence`): equal to another
    /// percentage of the same `p`; to an integer `n` when `p` is an integer too and `p = n`
    /// (`25\% = 25`); otherwise to a value `x` when `p / 100 = x` (`25\% = 0.25 = 1/4`, but
    /// `12.5\% != 12.5`).
    Percent(Expr),
    /// An inequality in one symbol (`x \ge 3`), with the interval of its values. As in
    /// math-verify, a gold inequality equals a predicted interval, but a predicted inequality
    /// equals only a gold inequality (the answer must take the gold's form).
    Inequality(Box<Answer>),
    /// Anything else: the normalised LaTeX with whitespace removed, compared literally.
    Raw(String),
}

/// Parses an extracted answer. `percent` says what a trailing `\%` means: when true the answer is
/// an [`Answer::Percent`]; otherwise the sign is dropped.
pub fn parse_answer(raw: &str, percent: bool) -> Vec<Answer> {
    let s = normalize(raw);
    let s = s.trim_start_matches('$').trim_end_matches('$').trim();
    for suffix in ["\\%", "%"] {
        if let Some(p) = s.strip_suffix(suffix) {
            let base = parse_structure(p.trim());
            if percent {
                if let Answer::Scalar(e) = base {
                    return vec![Answer::Percent(e)];
                }
            }
            return vec![base];
        }
    }
    vec![parse_structure(s)]
}

/// Splits `s` at top-level occurrences of `sep` (outside any bracket or brace).
fn split_top(s: &str, sep: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut last = 0;
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let escaped_brace = c == b'\\' && matches!(bytes.get(i + 1), Some(b'{') | Some(b'}'));
        if escaped_brace {
            depth += if bytes[i + 1] == b'{' { 1 } else { -1 };
            i += 2;
            continue;
        }
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            _ => {}
        }
        if depth == 0 && s.is_char_boundary(i) && s[i..].starts_with(sep) {
            parts.push(s[last..i].trim().to_string());
            i += sep.len();
            last = i;
            continue;
        }
        i += 1;
    }
    parts.push(s[last..].trim().to_string());
    parts
}

/// Index of the bracket closing the one at byte 0 (any of `([{`, matched by depth only, so that
/// half-open intervals `[a, b)` close too).
fn closing_of_first(s: &str) -> Option<usize> {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

fn parse_structure(s: &str) -> Answer {
    let s = s.trim();
    if let Some(m) = parse_matrix(s) {
        return m;
    }
    let union = split_top(s, "\\cup");
    if union.len() > 1 {
        return Answer::Set(union.iter().map(|p| parse_structure(p)).collect());
    }
    if let Some(inner) = s.strip_prefix("\\{").and_then(|r| r.strip_suffix("\\}")) {
        return Answer::Set(
            split_top(inner, ",")
                .iter()
                .filter(|p| !p.is_empty())
                .map(|p| parse_structure(p))
                .collect(),
        );
    }
    let first = s.chars().next().unwrap_or(' ');
    let last = s.chars().last().unwrap_or(' ');
    if (first == '(' || first == '[')
        && (last == ')' || last == ']')
        && closing_of_first(s) == Some(s.len() - 1)
    {
        let inner = &s[1..s.len() - 1];
        let items = split_top(inner, ",");
        if items.len() > 1 {
            return Answer::Bracketed {
                open: first,
                close: last,
                items: items.iter().map(|p| parse_structure(p)).collect(),
            };
        }
    }
    let items = split_top(s, ",");
    if items.len() > 1 {
        // Empty items come from joined lists (`1, 2, \text{and } 3` is `1, 2, , 3`).
        return Answer::Set(
            items
                .iter()
                .filter(|p| !p.is_empty())
                .map(|p| parse_structure(p))
                .collect(),
        );
    }
    // `x = 5`, `y = 2x + 3`: an equation with a lone symbol on the left means its right side;
    // `x \in [1, 2]` means the set.
    for rel in ["=", "\\in"] {
        let sides = split_top(s, rel);
        if sides.len() == 2 && is_lone_symbol(&sides[0]) {
            return match (rel, parse_structure(&sides[1]), parse_expr(&sides[0])) {
                ("=", Answer::Scalar(rhs), Some(sym)) => Answer::Equation(sym, rhs),
                (_, other, _) => other,
            };
        }
    }
    let sides = split_top(s, "=");
    if sides.len() == 2 {
        if let (Some(l), Some(r)) = (parse_expr(&sides[0]), parse_expr(&sides[1])) {
            return Answer::Equation(l, r);
        }
    }
    if let Some(interval) = inequality(s) {
        return Answer::Inequality(Box::new(interval));
    }
    // A ratio `a:b` is the fraction a/b.
    let ratio = split_top(s, ":");
    if ratio.len() == 2 {
        if let (Some(a), Some(b)) = (parse_expr(&ratio[0]), parse_expr(&ratio[1])) {
            return Answer::Scalar(Expr::Mul(vec![
                a,
                Expr::Pow(Box::new(b), Box::new(Expr::Num(-1.0))),
            ]));
        }
    }
    if matches!(s, "\\emptyset" | "\\varnothing" | "\\{\\}") {
        return Answer::Set(Vec::new());
    }
    // `a \pm b` is the pair a + b, a - b.
    let pm = split_top(s, "\\pm");
    if pm.len() == 2 && !pm[0].is_empty() {
        if let (Some(a), Some(b)) = (parse_expr(&pm[0]), parse_expr(&pm[1])) {
            let minus = Expr::Add(vec![a.clone(), Expr::Mul(vec![Expr::Num(-1.0), b.clone()])]);
            return Answer::Set(vec![
                Answer::Scalar(Expr::Add(vec![a, b])),
                Answer::Scalar(minus),
            ]);
        }
    }
    if let Some(rest) = s.strip_prefix("\\pm") {
        if let Some(e) = parse_expr(rest) {
            let minus = Expr::Mul(vec![Expr::Num(-1.0), e.clone()]);
            return Answer::Set(vec![Answer::Scalar(e), Answer::Scalar(minus)]);
        }
    }
    if let Some(t) = as_text(s) {
        if t.chars().count() > 1 || s.starts_with("\\text") || s.starts_with('(') {
            return Answer::Text(t);
        }
    }
    match parse_expr(s) {
        Some(e) => Answer::Scalar(e),
        None => Answer::Raw(s.chars().filter(|c| !c.is_whitespace()).collect()),
    }
}

/// `x \ge a`, `x < a`, `a \le x`, ...: the interval of the lone symbol's values.
fn inequality(s: &str) -> Option<Answer> {
    let inf = || Answer::Scalar(Expr::Num(f64::INFINITY));
    let ninf = || Answer::Scalar(Expr::Num(f64::NEG_INFINITY));
    // (operator, symbol-on-left reading: lower bound?, closed?)
    for (op, lower, closed) in [
        ("\\geq", true, true),
        ("\\ge", true, true),
        (">=", true, true),
        ("\\leq", false, true),
        ("\\le", false, true),
        ("<=", false, true),
        (">", true, false),
        ("<", false, false),
    ] {
        let sides = split_top(s, op);
        if sides.len() != 2 {
            continue;
        }
        let (sym_left, bound) = if is_lone_symbol(&sides[0]) {
            (true, &sides[1])
        } else if is_lone_symbol(&sides[1]) {
            (false, &sides[0])
        } else {
            return None;
        };
        let b = Answer::Scalar(parse_expr(bound)?);
        let lower = lower == sym_left;
        return Some(if lower {
            Answer::Bracketed {
                open: if closed { '[' } else { '(' },
                close: ')',
                items: vec![b, inf()],
            }
        } else {
            Answer::Bracketed {
                open: '(',
                close: if closed { ']' } else { ')' },
                items: vec![ninf(), b],
            }
        });
    }
    None
}

fn is_lone_symbol(s: &str) -> bool {
    matches!(parse_expr(s), Some(Expr::Sym(_)))
}

fn parse_matrix(s: &str) -> Option<Answer> {
    for env in ["pmatrix", "bmatrix", "matrix"] {
        let open = format!("\\begin{{{env}}}");
        let close = format!("\\end{{{env}}}");
        if let Some(body) = s
            .strip_prefix(open.as_str())
            .and_then(|r| r.strip_suffix(close.as_str()))
        {
            let rows = body
                .split("\\\\")
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .map(|r| r.split('&').map(|c| parse_structure(c.trim())).collect())
                .collect();
            return Some(Answer::Matrix(rows));
        }
    }
    None
}

/// True when any reading of `gold` equals any reading of `pred`.
pub fn equivalent(gold: &[Answer], pred: &[Answer]) -> bool {
    gold.iter()
        .any(|g| pred.iter().any(|p| answers_equal(g, p)))
}

/// Whether gold-side `a` and predicted-side `b` are equal (the order matters only for
/// inequalities, see [`Answer::Inequality`]).
fn answers_equal(a: &Answer, b: &Answer) -> bool {
    match (a, b) {
        (Answer::Inequality(x), Answer::Inequality(y)) => answers_equal(x, y),
        (Answer::Inequality(x), other) => answers_equal(x, other),
        (_, Answer::Inequality(_)) => false,
        (Answer::Percent(p), Answer::Percent(q)) => exprs_equal(p, q),
        (Answer::Percent(p), Answer::Scalar(x)) | (Answer::Scalar(x), Answer::Percent(p)) => {
            if integer_valued(p) && integer_valued(x) {
                exprs_equal(p, x)
            } else {
                exprs_equal(&Expr::Mul(vec![p.clone(), Expr::Num(0.01)]), x)
            }
        }
        (Answer::Scalar(x), Answer::Scalar(y)) => exprs_equal(x, y),
        (
            Answer::Bracketed {
                open: o1,
                close: c1,
                items: i1,
            },
            Answer::Bracketed {
                open: o2,
                close: c2,
                items: i2,
            },
        ) => {
            o1 == o2
                && c1 == c2
                && i1.len() == i2.len()
                && i1.iter().zip(i2).all(|(x, y)| answers_equal(x, y))
        }
        (Answer::Set(s1), Answer::Set(s2)) => same_multiset(s1, s2),
        // A bare list and a parenthesised one name the same answer (math-verify agrees).
        (
            Answer::Set(s1),
            Answer::Bracketed {
                open: '(',
                close: ')',
                items,
            },
        )
        | (
            Answer::Bracketed {
                open: '(',
                close: ')',
                items,
            },
            Answer::Set(s1),
        ) => same_multiset(s1, items),
        (Answer::Equation(l1, r1), Answer::Equation(l2, r2)) => {
            let d1 = difference(l1, r1);
            let d2 = difference(l2, r2);
            let lone = matches!((l1, l2), (Expr::Sym(_), Expr::Sym(_)));
            exprs_equal(&d1, &d2)
                || exprs_equal(&d1, &Expr::Mul(vec![Expr::Num(-1.0), d2]))
                || (lone && exprs_equal(r1, r2))
        }
        (Answer::Equation(Expr::Sym(_), rhs), Answer::Scalar(x))
        | (Answer::Scalar(x), Answer::Equation(Expr::Sym(_), rhs)) => exprs_equal(rhs, x),
        (Answer::Matrix(m1), Answer::Matrix(m2)) => {
            m1.len() == m2.len()
                && m1.iter().zip(m2).all(|(r1, r2)| {
                    r1.len() == r2.len() && r1.iter().zip(r2).all(|(x, y)| answers_equal(x, y))
                })
        }
        (Answer::Text(t1), Answer::Text(t2)) => t1 == t2,
        (Answer::Text(t), Answer::Scalar(Expr::Sym(s)))
        | (Answer::Scalar(Expr::Sym(s)), Answer::Text(t)) => t == &s.to_lowercase(),
        (Answer::Raw(r1), Answer::Raw(r2)) => r1 == r2,
        _ => false,
    }
}

/// A number without free symbols whose value is an integer (math-verify's `Integer`).
fn integer_valued(e: &Expr) -> bool {
    let mut symbols = BTreeSet::new();
    collect_symbols(e, &mut symbols);
    let v = eval(e, &|_| f64::NAN);
    symbols.is_empty() && v.is_finite() && v.fract() == 0.0
}

fn difference(l: &Expr, r: &Expr) -> Expr {
    Expr::Add(vec![l.clone(), Expr::Mul(vec![Expr::Num(-1.0), r.clone()])])
}

/// Unordered comparison with multiplicity: each element of `a` pairs with a distinct one of `b`.
fn same_multiset(a: &[Answer], b: &[Answer]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut used = vec![false; b.len()];
    a.iter().all(|x| {
        let found = (0..b.len()).find(|&j| !used[j] && answers_equal(x, &b[j]));
        if let Some(j) = found {
            used[j] = true;
        }
        found.is_some()
    })
}

/// Values tried for free symbols; irrational-ish so that distinct expressions rarely coincide.
const POINTS: [f64; 3] = [1.2345, 2.3171, 0.7259];

/// Compares two scalar expressions numerically at a few points (every free symbol gets a value
/// derived from its name and the point). Equal when every point where both sides are finite
/// agrees to 1e-8 relative, infinities match in sign, and at least one point was comparable.
pub fn exprs_equal(a: &Expr, b: &Expr) -> bool {
    let mut symbols = BTreeSet::new();
    collect_symbols(a, &mut symbols);
    collect_symbols(b, &mut symbols);
    let points: &[f64] = if symbols.is_empty() {
        &POINTS[..1]
    } else {
        &POINTS
    };
    let mut compared = 0;
    for &base in points {
        let value_of = |name: &str| {
            let h = name
                .bytes()
                .fold(0u32, |h, c| h.wrapping_mul(31).wrapping_add(c as u32));
            base + f64::from(h % 97) / 53.0
        };
        let (x, y) = (eval(a, &value_of), eval(b, &value_of));
        if x.is_nan() || y.is_nan() {
            if x.is_nan() != y.is_nan() {
                return false;
            }
            continue;
        }
        if x.is_infinite() || y.is_infinite() {
            if x != y {
                return false;
            }
        } else if (x - y).abs() > 1e-8 * x.abs().max(y.abs()).max(1.0)
            && !(symbols.is_empty()
                && x.fract() != 0.0
                && y.fract() != 0.0
                && round6(x) == round6(y))
        {
            return false;
        }
        compared += 1;
    }
    compared > 0
}

/// Rounding to 6 decimal places, as math-verify does (`float_rounding=6`) when it compares two
/// non-integers numerically (an integer it compares exactly: 3 != 3.0000001).
fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

fn collect_symbols(e: &Expr, out: &mut BTreeSet<String>) {
    match e {
        Expr::Sym(s) => {
            out.insert(s.clone());
        }
        Expr::Num(_) => {}
        Expr::Add(v) | Expr::Mul(v) => v.iter().for_each(|x| collect_symbols(x, out)),
        Expr::Pow(a, b) | Expr::Log(a, b) => {
            collect_symbols(a, out);
            collect_symbols(b, out);
        }
        Expr::Func(_, a) | Expr::Factorial(a) => collect_symbols(a, out),
    }
}

/// Evaluates `e` with `value_of` giving each free symbol's value.
pub fn eval(e: &Expr, value_of: &dyn Fn(&str) -> f64) -> f64 {
    match e {
        Expr::Num(n) => *n,
        Expr::Sym(s) => value_of(s),
        Expr::Add(v) => v.iter().map(|x| eval(x, value_of)).sum(),
        Expr::Mul(v) => v.iter().map(|x| eval(x, value_of)).product(),
        Expr::Pow(b, x) => eval(b, value_of).powf(eval(x, value_of)),
        Expr::Log(b, x) => eval(x, value_of).ln() / eval(b, value_of).ln(),
        Expr::Factorial(x) => {
            let n = eval(x, value_of);
            if n < 0.0 || n.fract() != 0.0 || n > 170.0 {
                f64::NAN
            } else {
                (1..=n as u64).map(|k| k as f64).product()
            }
        }
        Expr::Func(name, x) => {
            let v = eval(x, value_of);
            match *name {
                "sqrt" => v.sqrt(),
                "sin" => v.sin(),
                "cos" => v.cos(),
                "tan" => v.tan(),
                "cot" => 1.0 / v.tan(),
                "ln" => v.ln(),
                "exp" => v.exp(),
                "arcsin" => v.asin(),
                "arccos" => v.acos(),
                "arctan" => v.atan(),
                _ => f64::NAN,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eq(a: &str, b: &str) -> bool {
        equivalent(&parse_answer(a, true), &parse_answer(b, true))
    }

    #[test]
    fn multibyte_text_never_panics() {
        // Seen from a tiny model in training: a replacement character before a separator.
        for raw in [
            "16\u{FFFD}y4= box",
            "\u{FFFD}=\u{FFFD},é,ü=ß",
            "(x\u{1F600}, y)=3",
            "a\u{FFFD}\\{\u{FFFD}\\}=1",
        ] {
            let _ = parse_answer(raw, true);
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let alphabet: Vec<char> = "0123456789=,.()[]{}\\ x+-é\u{FFFD}ß€".chars().collect();
        for _ in 0..2000 {
            let mut text = String::new();
            for _ in 0..12 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                text.push(alphabet[(state % alphabet.len() as u64) as usize]);
            }
            let _ = parse_answer(&text, true);
        }
    }

    #[test]
    fn numbers_and_forms() {
        assert!(eq(r"\frac{1}{2}", "0.5"));
        assert!(eq(r"\frac{14}{3}", r"4\frac{2}{3}"));
        assert!(eq("1000000", "1,000,000"));
        assert!(eq(r"2\sqrt{3}", r"\sqrt{12}"));
        assert!(eq(r"2\pi", r"\frac{4\pi}{2}"));
        assert!(!eq(r"2\pi", "6.28"));
        assert!(eq(r"50\%", "0.5"));
        assert!(!eq(r"\frac{1}{2}", "0.51"));
    }

    #[test]
    fn structures() {
        assert!(eq(r"\{1, 2, 3\}", r"\{3, 2, 1\}"));
        assert!(!eq("(1, 2)", "(2, 1)"));
        assert!(!eq("(1, 2)", "[1, 2]"));
        assert!(eq(
            r"(-\infty,-1)\cup(6,+\infty)",
            r"(6,\infty)\cup(-\infty,-1)"
        ));
        assert!(eq(r"\pm 3", "3, -3"));
        assert!(eq("x = 5", "5"));
        assert!(eq(r"x^2+2x+1", "(x+1)^2"));
        assert!(!eq(r"x^2+2x+1", "(x-1)^2"));
        assert!(eq(r"\text{(C)}", "C"));
        assert!(!eq(r"\text{(C)}", "D"));
        assert!(eq("y=-x+1", "x+y=1"));
        assert!(!eq("x = 5", "x = -5"));
        assert!(eq(r"x \ge 2", r"[2, \infty)"));
        assert!(eq(r"x \in [1, 2]", "[1,2]"));
        assert!(eq(r"\emptyset", r"\{\}"));
        assert!(eq(r"\binom{5}{2}", "10"));
        assert!(eq(r"\frac{1}{2}", "1:2"));
        assert!(eq(r"\frac{1}{3}", "0.3333333"));
        assert!(!eq("3", "3.0000001"));
    }

    #[test]
    fn percentages_as_math_verify_reads_them() {
        assert!(eq(r"25\%", "25"));
        assert!(eq(r"25\%", r"\frac{1}{4}"));
        assert!(eq(r"25\%", "0.25"));
        assert!(eq("0.4", r"40\%"));
        assert!(eq(r"\frac{1}{8}", r"12.5\%"));
        assert!(
            !eq("12.5", r"12.5\%"),
            "a non-integer percentage is only its hundredth"
        );
        assert!(!eq(r"25\%", "2.5"));
        assert!(!eq(r"40\%", "4"));
        assert!(!eq(r"25\%", r"75\%"));
    }

    #[test]
    fn gold_inequalities_accept_intervals_but_not_the_reverse() {
        assert!(eq(r"x \ge 2", r"[2, \infty)"));
        assert!(eq(r"x \ge 2", r"2 \le x"));
        assert!(!eq(r"[3, \infty)", r"x \geq 3"));
        assert!(!eq(
            r"(-\infty, 0) \cup (1, \infty)",
            r"x<0 \text{ or } x>1"
        ));
    }

    #[test]
    fn solutions_joined_by_words_and_wrapped_answers() {
        assert!(eq("2, 3", r"2 \text{ or } 3"));
        assert!(eq("2, 3", r"x = 2 \text{ and } x = 3"));
        assert!(eq("2, 3", r"2 \quad \text{or} \quad 3"));
        assert!(eq("1, 2, 3", r"1, 2, \text{and } 3"));
        assert!(eq(r"\{-1, 4\}", r"x=-1 \text{ or } x=4"));
        assert!(eq(
            r"1 \pm \sqrt{2}",
            r"1 - \sqrt 2 \text{ or } 1 + \sqrt 2"
        ));
        assert!(!eq(r"1 \pm \sqrt{2}", r"1 + \sqrt{2}"));
        assert!(eq(r"-\frac{5}{2}", r"-2\frac{1}{2}"));
        assert!(!eq("2, 3", r"2 \text{ or } 4"));
        assert!(eq("5", r"\mathbf{5}"));
        assert!(eq("5", r"\mathbf 5"));
        assert!(eq("5", r"\displaystyle{5}"));
        assert!(eq(r"\frac{3}{4}", r"\textbf{3/4}"));
        assert!(eq("12", r"12\,\text{cm}^2"));
        assert!(!eq("5", r"\text{50}"));
        assert!(eq(r"\text{(B)}", r"\textbf{(B)}"));
        assert!(!eq(r"\text{Yes}", r"\textbf{No}"));
    }
}
