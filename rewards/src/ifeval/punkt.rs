//! A port of NLTK's Punkt sentence tokenizer (nltk 3.10 `PunktSentenceTokenizer.tokenize` with
//! `realign_boundaries=True`) using NLTK's pretrained English parameters (`punkt_tab/english`,
//! committed under `punkt_english/`). IFEval counts sentences with it.
//!
//! Indices are char indices (Python string semantics); the regular expressions of NLTK's
//! `PunktLanguageVars` are written out as hand scanners because they rely on look-ahead.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

/// The pretrained model parameters.
struct Params {
    abbrev_types: HashSet<String>,
    collocations: HashSet<(String, String)>,
    sent_starters: HashSet<String>,
    ortho_context: HashMap<String, u32>,
}

const ORTHO_BEG_LC: u32 = 1 << 4;
const ORTHO_MID_UC: u32 = 1 << 2;
const ORTHO_UC: u32 = (1 << 1) | (1 << 2) | (1 << 3);
const ORTHO_LC: u32 = (1 << 4) | (1 << 5) | (1 << 6);

fn params() -> &'static Params {
    static P: OnceLock<Params> = OnceLock::new();
    P.get_or_init(|| {
        let lines = |s: &'static str| s.lines().map(str::trim).filter(|l| !l.is_empty());
        Params {
            abbrev_types: lines(include_str!("punkt_english/abbrev_types.txt"))
                .map(String::from)
                .collect(),
            collocations: lines(include_str!("punkt_english/collocations.tab"))
                .filter_map(|l| l.split_once('\t'))
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            sent_starters: lines(include_str!("punkt_english/sent_starters.txt"))
                .map(String::from)
                .collect(),
            ortho_context: lines(include_str!("punkt_english/ortho_context.tab"))
                .filter_map(|l| l.rsplit_once('\t'))
                .filter_map(|(t, v)| Some((t.to_string(), v.parse().ok()?)))
                .collect(),
        }
    })
}

/// `string.whitespace` of Python.
fn py_ascii_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c')
}

/// `_re_non_word_chars` (sentence-end chars other than `.` included).
fn non_word(c: char) -> bool {
    matches!(
        c,
        ')' | '"' | ';' | '}' | ']' | '*' | ':' | '@' | '\'' | '(' | '{' | '[' | '?' | '!'
    ) || matches!(
        c,
        '\u{2018}' | '\u{2019}' | '\u{201c}' | '\u{201d}' | '\u{ab}' | '\u{bb}'
    )
}

/// `_re_word_start`: characters a word token may start with.
fn word_start(c: char) -> bool {
    !matches!(
        c,
        '(' | '"'
            | '`'
            | '{'
            | '['
            | ':'
            | ';'
            | '&'
            | '#'
            | '*'
            | '@'
            | ')'
            | '}'
            | ']'
            | '-'
            | ','
    )
}

/// Length of `_re_multi_char_punct` (`-{2,}|\.{2,}|(?:\.\s){2,}\.`) matched at `i`, if any.
fn multi_char(t: &[char], i: usize) -> Option<usize> {
    let run = |c: char| t[i..].iter().take_while(|&&x| x == c).count();
    if t.get(i) == Some(&'-') && run('-') >= 2 {
        return Some(run('-'));
    }
    if t.get(i) == Some(&'.') && run('.') >= 2 {
        return Some(run('.'));
    }
    let mut j = i;
    let mut pairs = 0;
    while t.get(j) == Some(&'.') && t.get(j + 1).is_some_and(|c| c.is_whitespace()) {
        j += 2;
        pairs += 1;
    }
    // Backtrack until a final '.' follows.
    while pairs >= 2 {
        if t.get(i + 2 * pairs) == Some(&'.') {
            return Some(2 * pairs + 1);
        }
        pairs -= 1;
    }
    None
}

/// `PunktLanguageVars.word_tokenize` for one line (no newlines inside).
fn word_tokenize(t: &[char]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < t.len() {
        if t[i].is_whitespace() {
            i += 1;
            continue;
        }
        if let Some(n) = multi_char(t, i) {
            out.push(t[i..i + n].iter().collect());
            i += n;
            continue;
        }
        if word_start(t[i]) {
            let ends_word = |j: usize| {
                j >= t.len()
                    || t[j].is_whitespace()
                    || non_word(t[j])
                    || multi_char(t, j).is_some()
                    || (t[j] == ','
                        && (j + 1 >= t.len()
                            || t[j + 1].is_whitespace()
                            || non_word(t[j + 1])
                            || multi_char(t, j + 1).is_some()))
            };
            let mut j = i + 1;
            while j < t.len() && !t[j].is_whitespace() && !ends_word(j) {
                j += 1;
            }
            if j <= t.len() && ends_word(j) {
                out.push(t[i..j].iter().collect());
                i = j;
                continue;
            }
        }
        out.push(t[i].to_string());
        i += 1;
    }
    out
}

#[derive(Debug)]
struct Token {
    tok: String,
    typ: String,
    period_final: bool,
    sentbreak: bool,
    abbr: bool,
    ellipsis: bool,
}

impl Token {
    fn new(tok: String) -> Self {
        let lower = tok.to_lowercase();
        let typ = if is_numeric(&lower) {
            "##number##".to_string()
        } else {
            lower
        };
        let period_final = tok.ends_with('.');
        Token {
            tok,
            typ,
            period_final,
            sentbreak: false,
            abbr: false,
            ellipsis: false,
        }
    }

    fn type_no_period(&self) -> &str {
        if self.typ.chars().count() > 1 && self.typ.ends_with('.') {
            &self.typ[..self.typ.len() - 1]
        } else {
            &self.typ
        }
    }

    fn type_no_sentperiod(&self) -> &str {
        if self.sentbreak {
            self.type_no_period()
        } else {
            &self.typ
        }
    }

    fn first_upper(&self) -> bool {
        self.tok.chars().next().is_some_and(char::is_uppercase)
    }

    fn first_lower(&self) -> bool {
        self.tok.chars().next().is_some_and(char::is_lowercase)
    }

    /// `_RE_INITIAL.match`: one letter then a period.
    fn is_initial(&self) -> bool {
        let c: Vec<char> = self.tok.chars().collect();
        c.len() == 2 && c[1] == '.' && c[0].is_alphabetic()
    }

    /// `_RE_ELLIPSIS.match`: two or more periods, nothing else.
    fn is_ellipsis(&self) -> bool {
        self.tok.len() >= 2 && self.tok.chars().all(|c| c == '.')
    }
}

/// `_RE_NUMERIC` (`^-?[\.,]?\d[\d,\.-]*\.?$`) on a lowercased token.
fn is_numeric(s: &str) -> bool {
    let c: Vec<char> = s.chars().collect();
    let mut i = 0;
    if c.get(i) == Some(&'-') {
        i += 1;
    }
    if matches!(c.get(i), Some('.') | Some(',')) {
        i += 1;
    }
    if !c.get(i).is_some_and(|d| d.is_numeric()) {
        return false;
    }
    i += 1;
    while i < c.len() && (c[i].is_numeric() || matches!(c[i], ',' | '.' | '-')) {
        i += 1;
    }
    // `[\d,\.-]*` is greedy and may give back a final '.', which `\.?` then takes: any tail of
    // those characters matches, so reaching the end is the whole condition.
    i == c.len()
}

fn first_pass(tok: &mut Token, p: &Params) {
    let t = tok.tok.as_str();
    if t == "." || t == "?" || t == "!" {
        tok.sentbreak = true;
    } else if tok.is_ellipsis() {
        tok.ellipsis = true;
    } else if tok.period_final && !t.ends_with("..") {
        let stem = t[..t.len() - 1].to_lowercase();
        let last = stem.rsplit('-').next().unwrap_or("");
        if p.abbrev_types.contains(&stem) || p.abbrev_types.contains(last) {
            tok.abbr = true;
        } else {
            tok.sentbreak = true;
        }
    }
}

#[derive(PartialEq)]
enum Ortho {
    Starter,
    NotStarter,
    Unknown,
}

fn ortho_heuristic(tok: &Token, p: &Params) -> Ortho {
    if matches!(tok.tok.as_str(), ";" | ":" | "," | "." | "!" | "?") {
        return Ortho::NotStarter;
    }
    let ctx = p
        .ortho_context
        .get(tok.type_no_sentperiod())
        .copied()
        .unwrap_or(0);
    if tok.first_upper() && ctx & ORTHO_LC != 0 && ctx & ORTHO_MID_UC == 0 {
        return Ortho::Starter;
    }
    if tok.first_lower() && (ctx & ORTHO_UC != 0 || ctx & ORTHO_BEG_LC == 0) {
        return Ortho::NotStarter;
    }
    Ortho::Unknown
}

fn second_pass(t1: &mut Token, t2: &Token, p: &Params) {
    if !t1.period_final {
        return;
    }
    let typ = t1.type_no_period().to_string();
    let next_typ = t2.type_no_sentperiod().to_string();
    let initial = t1.is_initial();
    if p.collocations.contains(&(typ.clone(), next_typ.clone())) {
        t1.sentbreak = false;
        t1.abbr = true;
        return;
    }
    if (t1.abbr || t1.ellipsis) && !initial {
        if ortho_heuristic(t2, p) == Ortho::Starter {
            t1.sentbreak = true;
            return;
        }
        if t2.first_upper() && p.sent_starters.contains(&next_typ) {
            t1.sentbreak = true;
            return;
        }
    }
    if initial || typ == "##number##" {
        let o = ortho_heuristic(t2, p);
        if o == Ortho::NotStarter {
            t1.sentbreak = false;
            t1.abbr = true;
            return;
        }
        let ctx = p.ortho_context.get(&next_typ).copied().unwrap_or(0);
        if o == Ortho::Unknown && initial && t2.first_upper() && ctx & ORTHO_LC == 0 {
            t1.sentbreak = false;
            t1.abbr = true;
        }
    }
}

/// `text_contains_sentbreak`: a break on any token but the last.
fn contains_sentbreak(context: &str, p: &Params) -> bool {
    let mut toks: Vec<Token> = context
        .split('\n')
        .filter(|l| !l.trim().is_empty())
        .flat_map(|l| word_tokenize(&l.chars().collect::<Vec<_>>()))
        .map(Token::new)
        .collect();
    for t in toks.iter_mut() {
        first_pass(t, p);
    }
    for i in 0..toks.len() {
        if i + 1 < toks.len() {
            let (a, b) = toks.split_at_mut(i + 1);
            second_pass(&mut a[i], &b[0], p);
        }
        if toks[i].sentbreak {
            return i + 1 < toks.len();
        }
    }
    false
}

/// A potential sentence end: the end char's index, and where the next token starts (if the
/// look-ahead matched whitespace and a token) and the end of the look-ahead.
struct EndMatch {
    start: usize,
    next_tok: Option<usize>,
    after_end: usize,
}

fn period_contexts(t: &[char]) -> Vec<EndMatch> {
    let mut out = Vec::new();
    for i in 0..t.len() {
        if !matches!(t[i], '.' | '?' | '!') {
            continue;
        }
        let j = i + 1;
        if j < t.len() && non_word(t[j]) {
            out.push(EndMatch {
                start: i,
                next_tok: None,
                after_end: j + 1,
            });
            continue;
        }
        let mut k = j;
        while k < t.len() && t[k].is_whitespace() {
            k += 1;
        }
        if k > j && k < t.len() {
            let mut e = k;
            while e < t.len() && !t[e].is_whitespace() {
                e += 1;
            }
            out.push(EndMatch {
                start: i,
                next_tok: Some(k),
                after_end: e,
            });
        }
    }
    out
}

/// `_match_potential_end_contexts`: each match with its decision text (previous word + end char
/// + look-ahead).
fn end_contexts(t: &[char]) -> Vec<(EndMatch, String)> {
    let s = |a: usize, b: usize| -> String { t[a.min(b)..b].iter().collect() };
    let mut out = Vec::new();
    let (mut prev_start, mut prev_stop) = (0usize, 0usize);
    let mut previous: Option<EndMatch> = None;
    for m in period_contexts(t) {
        let before = &t[prev_stop..m.start];
        let last_ws = before.iter().rposition(|&c| py_ascii_ws(c)).unwrap_or(0);
        let word_start = if last_ws != 0 {
            last_ws + prev_stop + 1
        } else {
            prev_start
        };
        if let Some(pm) = previous.take() {
            if prev_stop <= word_start {
                let ctx = s(prev_start, prev_stop) + &s(pm.start, pm.after_end);
                out.push((pm, ctx));
            }
        }
        previous = Some(m);
        prev_start = word_start;
        prev_stop = previous.as_ref().map_or(0, |m| m.start);
    }
    if let Some(pm) = previous {
        let ctx = s(prev_start, prev_stop) + &s(pm.start, pm.after_end);
        out.push((pm, ctx));
    }
    out
}

/// `re_boundary_realignment.match`: closing quotes/brackets then whitespace, `--` or line end.
fn realignment(t: &[char]) -> Option<(usize, usize)> {
    let closer = |c: char| {
        matches!(
            c,
            '"' | '\''
                | ')'
                | ']'
                | '}'
                | '\u{2018}'
                | '\u{2019}'
                | '\u{201c}'
                | '\u{201d}'
                | '\u{ab}'
                | '\u{bb}'
        )
    };
    let n = t.iter().take_while(|&&c| closer(c)).count();
    for k in 1..=n {
        let ws = t[k..].iter().take_while(|c| c.is_whitespace()).count();
        if ws > 0 {
            return Some((k, k + ws));
        }
        if t[k..].starts_with(&['-', '-']) || k == t.len() || t[k] == '\n' {
            return Some((k, k));
        }
    }
    None
}

/// The sentences of `text` as Punkt (English) splits them.
pub fn sentences(text: &str) -> Vec<String> {
    let p = params();
    let t: Vec<char> = text.chars().collect();
    let mut slices = Vec::new();
    let mut last_break = 0;
    for (m, ctx) in end_contexts(&t) {
        if contains_sentbreak(&ctx, p) {
            slices.push((last_break, m.start + 1));
            last_break = m.next_tok.unwrap_or(m.start + 1);
        }
    }
    let trimmed_len = text.trim_end().chars().count();
    slices.push((last_break, trimmed_len));

    let mut out = Vec::new();
    let mut realign = 0;
    for i in 0..slices.len() {
        let (s1, e1) = (slices[i].0 + realign, slices[i].1);
        let piece =
            |a: usize, b: usize| -> String { t[a.min(b)..b.max(a).min(t.len())].iter().collect() };
        match slices.get(i + 1) {
            None => {
                if s1 < e1 {
                    out.push(piece(s1, e1));
                }
            }
            Some(&(s2, e2)) => {
                if let Some((len, end)) = realignment(&t[s2..e2.max(s2)]) {
                    let _ = len;
                    let m: String = t[s2..s2 + end].iter().collect();
                    out.push(piece(s1, s2 + m.trim_end().chars().count()));
                    realign = end;
                } else {
                    realign = 0;
                    if s1 < e1 {
                        out.push(piece(s1, e1));
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_nltk() {
        assert_eq!(
            sentences("Hello there. Mr. Smith went to Washington. He said hi! Really? Yes.").len(),
            5
        );
        assert_eq!(sentences("One. Two.").len(), 2);
        assert_eq!(sentences("(Sent1.) Sent2."), vec!["(Sent1.)", "Sent2."]);
    }

    #[test]
    fn word_tokens() {
        let w = word_tokenize(
            &"Hello, world... (yes) don't--stop."
                .chars()
                .collect::<Vec<_>>(),
        );
        assert_eq!(
            w,
            vec!["Hello", ",", "world", "...", "(", "yes", ")", "don", "'t", "--", "stop."]
        );
    }
}
