//! LaTeX answer normalisation and parsing into a small expression tree.
//!
//! Normalisation removes what never changes an answer's value (`\left`, spacing commands, `\$`,
//! degree signs, thousands separators, units written with `\text{}` after a value); parsing
//! understands numbers, `+ - * / ^`, implicit multiplication, `\frac`/`\dfrac`/`\tfrac`, `\sqrt[n]`,
//! `\pi`, `e`, `\infty`, `\log`/`\ln`/trig functions, mixed numbers (`4\frac{2}{3}`) and factorials.

use std::sync::OnceLock;

use regex::Regex;

use super::extract::balanced_prefix;

/// A parsed scalar expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A number (may be infinite).
    Num(f64),
    /// A free symbol (a variable, or a text answer's letter).
    Sym(String),
    /// A sum.
    Add(Vec<Expr>),
    /// A product.
    Mul(Vec<Expr>),
    /// `base ^ exponent`.
    Pow(Box<Expr>, Box<Expr>),
    /// A named function of one argument (`sqrt`, `ln`, `sin`, ...).
    Func(&'static str, Box<Expr>),
    /// `log_base(argument)`.
    Log(Box<Expr>, Box<Expr>),
    /// `n!`.
    Factorial(Box<Expr>),
}

/// Tokens of a normalised answer.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    Ident(String),
    Cmd(String),
    Op(char),
}

/// Removes formatting that never changes an answer's value.
pub fn normalize(raw: &str) -> String {
    static UNITS: OnceLock<Regex> = OnceLock::new();
    static THOUSANDS: OnceLock<Regex> = OnceLock::new();
    static BARE_TEXT: OnceLock<Regex> = OnceLock::new();
    static JOINERS: OnceLock<Regex> = OnceLock::new();
    // Protect LaTeX line breaks (`\\`, matrix rows) from the `\ ` (spacing) rule below.
    let mut s = raw.trim().replace("\\\\", "\u{1}");
    for (from, to) in [
        ("\\left", ""),
        ("\\right", ""),
        ("\\displaystyle", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\:", ""),
        ("\\quad", " "),
        ("\\ ", " "),
        ("{,}", ""),
        ("\\$", ""),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("\\circ", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("\\le ", "\\leq "),
        ("\\textbf", "\\text"),
        ("\\textrm", "\\text"),
        ("\\mathrm", "\\text"),
        ("\\mathbf", "\\text"),
        ("\\mbox", "\\text"),
        ("\\operatorname", "\\text"),
        ("\\boldsymbol", "\\text"),
        ("\\bm{", "\\text{"),
        ("°", ""),
    ] {
        s = s.replace(from, to);
    }
    // `\mathbf 5`: a one-character argument without braces.
    let bare =
        BARE_TEXT.get_or_init(|| Regex::new(r"\\text\s+([A-Za-z0-9])").expect("static regex"));
    s = bare.replace_all(&s, "\\text{$1}").into_owned();
    // Solutions joined by words: `2 \text{ or } 3`, `1, 2, \text{and } 3` are lists.
    let joiners =
        JOINERS.get_or_init(|| Regex::new(r"\\text\{\s*(?:or|and)\s*\}").expect("static regex"));
    s = joiners.replace_all(&s, ",").into_owned();
    s = s.trim_end_matches('.').trim().to_string();
    // Units: a `\text{...}` after a value is a unit (`5\text{ cm}`, `90 \text{ degrees}`).
    let units = UNITS.get_or_init(|| {
        Regex::new(r"^(.*[0-9}a-zA-Z)])\s*\\text\{[^{}]*\}(?:\^\{?[0-9]\}?)?\s*$")
            .expect("static regex")
    });
    while let Some(c) = units.captures(&s) {
        let head = c[1].trim().to_string();
        if head.is_empty() || head.ends_with("\\text{") {
            break;
        }
        s = head;
    }
    // Formatting wrappers around the whole answer: `\mathbf{5}` (now `\text{5}`) and
    // `\displaystyle{5}` are `5`; a `\text{...}` holding words stays text.
    loop {
        let inner = if let Some(rest) = s.strip_prefix("\\text{") {
            balanced_prefix(rest)
                .filter(|b| b.len() + 1 == rest.len() && as_text(&s).is_none())
                .map(str::to_string)
        } else if let Some(rest) = s.strip_prefix('{') {
            balanced_prefix(rest)
                .filter(|b| b.len() + 1 == rest.len())
                .map(str::to_string)
        } else {
            None
        };
        match inner {
            Some(body) if !body.trim().is_empty() => s = body.trim().to_string(),
            _ => break,
        }
    }
    let thousands = THOUSANDS
        .get_or_init(|| Regex::new(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$").expect("static regex"));
    if thousands.is_match(&s) {
        s = s.replace(',', "");
    }
    s.trim().replace('\u{1}', "\\\\")
}

/// If `s` is exactly one `\text{...}` group (or a bare word), returns its normalised text:
/// lowercase, surrounding parentheses and whitespace removed.
pub fn as_text(s: &str) -> Option<String> {
    let inner = match s.strip_prefix("\\text{") {
        Some(rest) => {
            let body = balanced_prefix(rest)?;
            if body.len() + 1 != rest.len() {
                return None;
            }
            body
        }
        None => s,
    };
    let t = inner
        .trim()
        .trim_start_matches('(')
        .trim_end_matches(')')
        .trim();
    let wordy = !t.is_empty() && t.chars().all(|c| c.is_alphabetic() || c == ' ' || c == '-');
    wordy.then(|| t.to_lowercase())
}

fn tokenize(s: &str) -> Option<Vec<Tok>> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            out.push(Tok::Num(text.parse().ok()?));
        } else if c.is_alphabetic() {
            out.push(Tok::Ident(c.to_string()));
            i += 1;
        } else if c == '\\' {
            let start = i + 1;
            i += 1;
            while i < chars.len() && chars[i].is_ascii_alphabetic() {
                i += 1;
            }
            if i == start {
                // `\{`, `\}`, `\%` and friends.
                let sym = *chars.get(i)?;
                i += 1;
                out.push(Tok::Cmd(sym.to_string()));
            } else {
                out.push(Tok::Cmd(chars[start..i].iter().collect()));
            }
        } else if "+-*/^_(){}[]!,=|%".contains(c) {
            out.push(Tok::Op(c));
            i += 1;
        } else if c == '×' || c == '·' {
            out.push(Tok::Op('*'));
            i += 1;
        } else if c == '−' {
            out.push(Tok::Op('-'));
            i += 1;
        } else if c == 'π' {
            out.push(Tok::Cmd("pi".into()));
            i += 1;
        } else {
            return None;
        }
    }
    Some(out)
}

/// Parses a normalised scalar expression; `None` when it is not one.
pub fn parse_expr(s: &str) -> Option<Expr> {
    let toks = tokenize(s)?;
    let mut p = Parser { toks, pos: 0 };
    let e = p.expr()?;
    (p.pos == p.toks.len()).then_some(e)
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

const FUNCS: [&str; 9] = [
    "sin", "cos", "tan", "ln", "exp", "arcsin", "arccos", "arctan", "cot",
];

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn eat_op(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Op(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expr(&mut self) -> Option<Expr> {
        let mut terms = vec![self.term()?];
        loop {
            if self.eat_op('+') {
                terms.push(self.term()?);
            } else if self.eat_op('-') {
                terms.push(neg(self.term()?));
            } else {
                break;
            }
        }
        Some(if terms.len() == 1 {
            terms.pop()?
        } else {
            Expr::Add(terms)
        })
    }

    fn term(&mut self) -> Option<Expr> {
        let mut factors = vec![self.unary()?];
        loop {
            match self.peek() {
                Some(Tok::Op('*')) => {
                    self.pos += 1;
                    factors.push(self.unary()?);
                }
                Some(Tok::Cmd(c)) if c == "cdot" || c == "times" => {
                    self.pos += 1;
                    factors.push(self.unary()?);
                }
                Some(Tok::Op('/')) => {
                    self.pos += 1;
                    factors.push(recip(self.unary()?));
                }
                Some(Tok::Cmd(c)) if c == "div" => {
                    self.pos += 1;
                    factors.push(recip(self.unary()?));
                }
                Some(t) if starts_primary(t) => {
                    let mixed = factors.len() == 1
                        && matches!(factors[0], Expr::Num(n) if n.fract() == 0.0)
                        && matches!(t, Tok::Cmd(c) if c == "frac");
                    let next = self.power()?;
                    if mixed && matches!(&next, Expr::Mul(v) if v.iter().all(is_numeric_literal)) {
                        // `4\frac{2}{3}` is a mixed number; `-2\frac{1}{2}` is -(2 + 1/2).
                        let whole = factors.pop()?;
                        let negative = matches!(whole, Expr::Num(n) if n < 0.0);
                        factors.push(Expr::Add(vec![
                            whole,
                            if negative { neg(next) } else { next },
                        ]));
                    } else {
                        factors.push(next);
                    }
                }
                _ => break,
            }
        }
        Some(if factors.len() == 1 {
            factors.pop()?
        } else {
            Expr::Mul(factors)
        })
    }

    fn unary(&mut self) -> Option<Expr> {
        if self.eat_op('-') {
            return Some(neg(self.unary()?));
        }
        if self.eat_op('+') {
            return self.unary();
        }
        self.power()
    }

    fn power(&mut self) -> Option<Expr> {
        let mut base = self.primary()?;
        loop {
            if self.eat_op('^') {
                let exp = self.exponent()?;
                base = Expr::Pow(Box::new(base), Box::new(exp));
            } else if self.eat_op('!') {
                base = Expr::Factorial(Box::new(base));
            } else {
                return Some(base);
            }
        }
    }

    /// A superscript: a braced group or one token (with an optional leading minus).
    fn exponent(&mut self) -> Option<Expr> {
        if self.eat_op('-') {
            return Some(neg(self.exponent()?));
        }
        match self.peek()? {
            Tok::Op('{') => self.primary(),
            Tok::Num(_) | Tok::Ident(_) => self.primary(),
            Tok::Cmd(_) => self.primary(),
            _ => None,
        }
    }

    /// An argument of `\frac`/`\sqrt`: a braced group, or a single digit/letter token.
    fn arg(&mut self) -> Option<Expr> {
        match self.peek()?.clone() {
            Tok::Op('{') => self.primary(),
            Tok::Num(n) => {
                // `\frac12`: the tokenizer read "12" as one number; LaTeX takes one digit.
                self.pos += 1;
                let text = format_num(n);
                if text.len() > 1 && !text.contains('.') {
                    let (first, rest) = text.split_at(1);
                    self.toks.insert(self.pos, Tok::Num(rest.parse().ok()?));
                    return Some(Expr::Num(first.parse().ok()?));
                }
                Some(Expr::Num(n))
            }
            _ => self.primary(),
        }
    }

    fn primary(&mut self) -> Option<Expr> {
        let tok = self.peek()?.clone();
        self.pos += 1;
        match tok {
            Tok::Num(n) => Some(Expr::Num(n)),
            Tok::Ident(name) => {
                let base = if name == "e" {
                    Expr::Num(std::f64::consts::E)
                } else {
                    Expr::Sym(name)
                };
                if self.eat_op('_') {
                    // Subscripted symbol `x_1` / `a_{n}`: one symbol.
                    let sub = match self.peek()?.clone() {
                        Tok::Op('{') => {
                            let e = self.primary()?;
                            format!("{e:?}")
                        }
                        t => {
                            self.pos += 1;
                            format!("{t:?}")
                        }
                    };
                    return Some(Expr::Sym(format!("{}_{sub}", sym_name(&base))));
                }
                Some(base)
            }
            Tok::Op('(') => self.group(')'),
            Tok::Op('[') => self.group(']'),
            Tok::Op('{') => self.group('}'),
            Tok::Cmd(cmd) => self.command(&cmd),
            _ => None,
        }
    }

    fn group(&mut self, close: char) -> Option<Expr> {
        let e = self.expr()?;
        self.eat_op(close).then_some(e)
    }

    fn command(&mut self, cmd: &str) -> Option<Expr> {
        match cmd {
            "frac" => {
                let num = self.arg()?;
                let den = self.arg()?;
                Some(Expr::Mul(vec![num, recip(den)]))
            }
            "sqrt" => {
                let index = if self.eat_op('[') {
                    Some(self.group(']')?)
                } else {
                    None
                };
                let radicand = self.arg()?;
                Some(match index {
                    None => Expr::Func("sqrt", Box::new(radicand)),
                    Some(n) => Expr::Pow(Box::new(radicand), Box::new(recip(n))),
                })
            }
            "pi" => Some(Expr::Num(std::f64::consts::PI)),
            "infty" | "infinity" => Some(Expr::Num(f64::INFINITY)),
            "text" => {
                // A word inside an expression (`\text{cm}` that survived): a symbol.
                self.eat_op('{').then_some(())?;
                let mut name = String::new();
                while let Some(Tok::Ident(c)) = self.peek().cloned() {
                    name.push_str(&c);
                    self.pos += 1;
                }
                self.eat_op('}').then_some(Expr::Sym(name))
            }
            "binom" | "dbinom" | "tbinom" => {
                // n! / (k! (n-k)!)
                let n = self.arg()?;
                let k = self.arg()?;
                let fact = |e: Expr| Expr::Factorial(Box::new(e));
                let n_minus_k = Expr::Add(vec![n.clone(), neg(k.clone())]);
                Some(Expr::Mul(vec![
                    fact(n),
                    recip(fact(k)),
                    recip(fact(n_minus_k)),
                ]))
            }
            "log" => {
                let base = if self.eat_op('_') {
                    self.arg()?
                } else {
                    Expr::Num(10.0)
                };
                let arg = self.power()?;
                Some(Expr::Log(Box::new(base), Box::new(arg)))
            }
            f if FUNCS.contains(&f) => {
                let name = FUNCS.iter().find(|n| **n == f)?;
                let mut pw = None;
                if self.eat_op('^') {
                    pw = Some(self.exponent()?);
                }
                let arg = self.power()?;
                let call = Expr::Func(name, Box::new(arg));
                Some(match pw {
                    Some(p) => Expr::Pow(Box::new(call), Box::new(p)),
                    None => call,
                })
            }
            greek if greek.len() > 1 && greek.chars().all(|c| c.is_ascii_alphabetic()) => {
                Some(Expr::Sym(format!("\\{greek}")))
            }
            _ => None,
        }
    }
}

fn sym_name(e: &Expr) -> String {
    match e {
        Expr::Sym(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

fn format_num(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}

fn is_numeric_literal(e: &Expr) -> bool {
    match e {
        Expr::Num(_) => true,
        Expr::Pow(b, x) => is_numeric_literal(b) && **x == Expr::Num(-1.0),
        _ => false,
    }
}

fn starts_primary(t: &Tok) -> bool {
    match t {
        Tok::Num(_) | Tok::Ident(_) => true,
        Tok::Op(c) => *c == '(' || *c == '{',
        Tok::Cmd(c) => !matches!(
            c.as_str(),
            "cdot" | "times" | "div" | "{" | "}" | "%" | "cup" | "pm"
        ),
    }
}

fn neg(e: Expr) -> Expr {
    match e {
        Expr::Num(n) => Expr::Num(-n),
        other => Expr::Mul(vec![Expr::Num(-1.0), other]),
    }
}

fn recip(e: Expr) -> Expr {
    Expr::Pow(Box::new(e), Box::new(Expr::Num(-1.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_formatting() {
        assert_eq!(normalize(r"\left(1,2\right)"), "(1,2)");
        assert_eq!(normalize(r"1{,}000{,}000"), "1000000");
        assert_eq!(normalize("12,345"), "12345");
        assert_eq!(normalize(r"5\,\text{cm}"), "5");
        assert_eq!(normalize(r"90^\circ"), "90");
        assert_eq!(normalize(r"\$18.90"), "18.90");
        assert_eq!(normalize("1, 3, 5"), "1, 3, 5");
    }

    #[test]
    fn text_answers() {
        assert_eq!(as_text(r"\text{(C)}").as_deref(), Some("c"));
        assert_eq!(as_text("Monday").as_deref(), Some("monday"));
        assert_eq!(as_text("3x"), None);
    }

    #[test]
    fn parses_shorthand_and_mixed_numbers() {
        assert!(parse_expr(r"\frac12").is_some());
        assert_eq!(
            parse_expr(r"4\frac{2}{3}"),
            Some(Expr::Add(vec![
                Expr::Num(4.0),
                Expr::Mul(vec![Expr::Num(2.0), recip(Expr::Num(3.0))])
            ]))
        );
        assert!(parse_expr(r"2\sqrt{3}\cdot\pi").is_some());
        assert!(parse_expr(r"(1+").is_none());
    }
}
