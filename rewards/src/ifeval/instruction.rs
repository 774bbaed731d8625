//! The 25 IFEval instruction types, built from an id and its kwargs exactly as in IFEval's JSONL,
//! and their checks, ported from lm-eval's `lm_eval/tasks/ifeval/instructions.py`.

use regex::Regex;
use serde_json::{Map, Value};

use super::punkt;
use super::text::{count_words, detect_language, py_islower, py_isupper, word_tokens};
use crate::VerifyError;

/// A comparison of IFEval (`relation`, `let_relation`, `capital_relation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    /// `"less than"`: count < threshold.
    LessThan,
    /// `"at least"`: count >= threshold.
    AtLeast,
}

impl Relation {
    fn holds(self, count: usize, threshold: i64) -> bool {
        let count = count as i64;
        match self {
            Relation::LessThan => count < threshold,
            Relation::AtLeast => count >= threshold,
        }
    }
}

/// One instruction with its parameters.
#[derive(Debug, Clone)]
pub enum Instruction {
    /// `keywords:existence`
    KeywordsExist(Vec<String>),
    /// `keywords:frequency`
    KeywordFrequency {
        /// The keyword (a regular expression, as in lm-eval).
        keyword: String,
        /// The threshold count.
        frequency: i64,
        /// How the count compares with the threshold.
        relation: Relation,
    },
    /// `keywords:forbidden_words`
    ForbiddenWords(Vec<String>),
    /// `keywords:letter_frequency`
    LetterFrequency {
        /// The letter (lowercase ASCII).
        letter: char,
        /// The threshold count.
        frequency: i64,
        /// How the count compares with the threshold.
        relation: Relation,
    },
    /// `language:response_language`
    ResponseLanguage(String),
    /// `length_constraints:number_sentences`
    NumberSentences {
        /// The threshold count.
        num: i64,
        /// How the count compares with the threshold.
        relation: Relation,
    },
    /// `length_constraints:number_paragraphs`
    NumberParagraphs(i64),
    /// `length_constraints:number_words`
    NumberWords {
        /// The threshold count.
        num: i64,
        /// How the count compares with the threshold.
        relation: Relation,
    },
    /// `length_constraints:nth_paragraph_first_word`
    NthParagraphFirstWord {
        /// The exact number of paragraphs.
        num_paragraphs: i64,
        /// Which paragraph (1-based) must start with `first_word`.
        nth: i64,
        /// The required first word (lowercase).
        first_word: String,
    },
    /// `detectable_content:number_placeholders`
    Placeholders(i64),
    /// `detectable_content:postscript`
    Postscript(String),
    /// `detectable_format:number_bullet_lists`
    BulletLists(i64),
    /// `detectable_format:constrained_response`
    ConstrainedResponse,
    /// `detectable_format:number_highlighted_sections`
    HighlightedSections(i64),
    /// `detectable_format:multiple_sections`
    MultipleSections {
        /// The section marker word (e.g. `Section`).
        splitter: String,
        /// The threshold count.
        num: i64,
    },
    /// `detectable_format:json_format`
    JsonFormat,
    /// `detectable_format:title`
    Title,
    /// `combination:two_responses`
    TwoResponses,
    /// `combination:repeat_prompt`
    RepeatPrompt(String),
    /// `startend:end_checker`
    EndChecker(String),
    /// `change_case:capital_word_frequency`
    CapitalWordFrequency {
        /// The threshold count.
        frequency: i64,
        /// How the count compares with the threshold.
        relation: Relation,
    },
    /// `change_case:english_capital`
    EnglishCapital,
    /// `change_case:english_lowercase`
    EnglishLowercase,
    /// `punctuation:no_comma`
    NoComma,
    /// `startend:quotation`
    Quotation,
}

/// The instruction ids this module knows, in IFEval's registry order.
pub const INSTRUCTION_IDS: [&str; 25] = [
    "keywords:existence",
    "keywords:frequency",
    "keywords:forbidden_words",
    "keywords:letter_frequency",
    "language:response_language",
    "length_constraints:number_sentences",
    "length_constraints:number_paragraphs",
    "length_constraints:number_words",
    "length_constraints:nth_paragraph_first_word",
    "detectable_content:number_placeholders",
    "detectable_content:postscript",
    "detectable_format:number_bullet_lists",
    "detectable_format:constrained_response",
    "detectable_format:number_highlighted_sections",
    "detectable_format:multiple_sections",
    "detectable_format:json_format",
    "detectable_format:title",
    "combination:two_responses",
    "combination:repeat_prompt",
    "startend:end_checker",
    "change_case:capital_word_frequency",
    "change_case:english_capital",
    "change_case:english_lowercase",
    "punctuation:no_comma",
    "startend:quotation",
];

/// Kwargs with lm-eval's filtering applied: falsy values (null, 0, "", [], false) are dropped.
struct Kwargs<'a> {
    id: &'a str,
    map: Map<String, Value>,
}

impl<'a> Kwargs<'a> {
    fn new(id: &'a str, raw: &Value) -> Result<Self, VerifyError> {
        let obj = match raw {
            Value::Object(o) => o.clone(),
            Value::Null => Map::new(),
            _ => return Err(bad(id, "kwargs entry is not an object")),
        };
        let truthy = |v: &Value| match v {
            Value::Null => false,
            Value::Bool(b) => *b,
            Value::Number(n) => n.as_f64() != Some(0.0),
            Value::String(s) => !s.is_empty(),
            Value::Array(a) => !a.is_empty(),
            Value::Object(o) => !o.is_empty(),
        };
        Ok(Kwargs {
            id,
            map: obj.into_iter().filter(|(_, v)| truthy(v)).collect(),
        })
    }

    /// lm-eval draws a random value for a missing parameter; a verifier must not, so it is an error.
    fn missing(&self, key: &str) -> VerifyError {
        bad(
            self.id,
            &format!("kwarg `{key}` is missing (lm-eval would draw it at random)"),
        )
    }

    fn int(&self, key: &str) -> Result<i64, VerifyError> {
        let v = self.map.get(key).ok_or_else(|| self.missing(key))?;
        v.as_i64()
            .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
            .ok_or_else(|| bad(self.id, &format!("kwarg `{key}` is not an integer")))
    }

    /// lm-eval also redraws a negative count at random.
    fn count(&self, key: &str) -> Result<i64, VerifyError> {
        let n = self.int(key)?;
        if n < 0 {
            return Err(bad(self.id, &format!("kwarg `{key}` is negative")));
        }
        Ok(n)
    }

    fn string(&self, key: &str) -> Result<String, VerifyError> {
        match self.map.get(key) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(bad(self.id, &format!("kwarg `{key}` is not a string"))),
            None => Err(self.missing(key)),
        }
    }

    fn strings(&self, key: &str) -> Result<Vec<String>, VerifyError> {
        match self.map.get(key) {
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(String::from)
                        .ok_or_else(|| bad(self.id, &format!("kwarg `{key}` has a non-string")))
                })
                .collect(),
            Some(_) => Err(bad(self.id, &format!("kwarg `{key}` is not a list"))),
            None => Err(self.missing(key)),
        }
    }

    fn relation(&self, key: &str) -> Result<Relation, VerifyError> {
        match self.string(key)?.as_str() {
            "less than" => Ok(Relation::LessThan),
            "at least" => Ok(Relation::AtLeast),
            other => Err(bad(
                self.id,
                &format!("kwarg `{key}` = {other:?} is neither \"less than\" nor \"at least\""),
            )),
        }
    }
}

fn bad(id: &str, problem: &str) -> VerifyError {
    VerifyError::BadReference {
        field: "kwargs".into(),
        problem: format!("{id}: {problem}"),
    }
}

impl Instruction {
    /// Builds the instruction `id` from its kwargs object. `_prompt` (the example's prompt) is
    /// accepted for symmetry with lm-eval, which passes it on only to instructions whose arguments
    /// include a `prompt` key; none of the 25 has one.
    pub fn from_kwargs(
        id: &str,
        kwargs: &Value,
        _prompt: Option<&str>,
    ) -> Result<Self, VerifyError> {
        let k = Kwargs::new(id, kwargs)?;
        use Instruction as I;
        Ok(match id {
            "keywords:existence" => {
                let mut kw = k.strings("keywords")?;
                kw.sort();
                I::KeywordsExist(kw)
            }
            "keywords:frequency" => I::KeywordFrequency {
                keyword: k.string("keyword")?.trim().to_string(),
                frequency: k.count("frequency")?,
                relation: k.relation("relation")?,
            },
            "keywords:forbidden_words" => {
                let mut w = k.strings("forbidden_words")?;
                w.sort();
                w.dedup();
                I::ForbiddenWords(w)
            }
            "keywords:letter_frequency" => {
                let letter = k.string("letter")?;
                let mut chars = letter.chars();
                let c = match (chars.next(), chars.next()) {
                    (Some(c), None) if c.is_ascii_alphabetic() => c.to_ascii_lowercase(),
                    _ => return Err(bad(id, "kwarg `letter` is not one ASCII letter")),
                };
                I::LetterFrequency {
                    letter: c,
                    frequency: k.count("let_frequency")?,
                    relation: k.relation("let_relation")?,
                }
            }
            "language:response_language" => I::ResponseLanguage(k.string("language")?),
            "length_constraints:number_sentences" => I::NumberSentences {
                num: k.count("num_sentences")?,
                relation: k.relation("relation")?,
            },
            "length_constraints:number_paragraphs" => {
                I::NumberParagraphs(k.count("num_paragraphs")?)
            }
            "length_constraints:number_words" => I::NumberWords {
                num: k.count("num_words")?,
                relation: k.relation("relation")?,
            },
            "length_constraints:nth_paragraph_first_word" => {
                let num_paragraphs = k.count("num_paragraphs")?;
                let nth = k.int("nth_paragraph")?;
                if nth <= 0 || nth > num_paragraphs {
                    return Err(bad(id, "kwarg `nth_paragraph` is out of range"));
                }
                I::NthParagraphFirstWord {
                    num_paragraphs,
                    nth,
                    first_word: k.string("first_word")?.to_lowercase(),
                }
            }
            "detectable_content:number_placeholders" => {
                I::Placeholders(k.count("num_placeholders")?)
            }
            "detectable_content:postscript" => {
                I::Postscript(k.string("postscript_marker")?.trim().to_string())
            }
            "detectable_format:number_bullet_lists" => I::BulletLists(k.count("num_bullets")?),
            "detectable_format:constrained_response" => I::ConstrainedResponse,
            "detectable_format:number_highlighted_sections" => {
                I::HighlightedSections(k.count("num_highlights")?)
            }
            "detectable_format:multiple_sections" => I::MultipleSections {
                splitter: k.string("section_spliter")?.trim().to_string(),
                num: k.count("num_sections")?,
            },
            "detectable_format:json_format" => I::JsonFormat,
            "detectable_format:title" => I::Title,
            "combination:two_responses" => I::TwoResponses,
            // lm-eval rebuilds an instruction from the example's prompt only when its arguments
            // have a key named `prompt`; this one's key is `prompt_to_repeat`, so never.
            "combination:repeat_prompt" => I::RepeatPrompt(k.string("prompt_to_repeat")?),
            "startend:end_checker" => I::EndChecker(k.string("end_phrase")?.trim().to_string()),
            "change_case:capital_word_frequency" => I::CapitalWordFrequency {
                frequency: k.int("capital_frequency")?,
                relation: k.relation("capital_relation")?,
            },
            "change_case:english_capital" => I::EnglishCapital,
            "change_case:english_lowercase" => I::EnglishLowercase,
            "punctuation:no_comma" => I::NoComma,
            "startend:quotation" => I::Quotation,
            other => {
                return Err(VerifyError::BadReference {
                    field: "instruction_id_list".into(),
                    problem: format!("unknown instruction id {other:?}"),
                })
            }
        })
    }

    /// Whether `value` follows the instruction (lm-eval's `check_following`).
    pub fn check(&self, value: &str) -> bool {
        use Instruction as I;
        match self {
            I::KeywordsExist(kws) => kws.iter().all(|k| py_regex(k, true).is_match(value)),
            I::KeywordFrequency {
                keyword,
                frequency,
                relation,
            } => relation.holds(py_regex(keyword, true).find_iter(value).count(), *frequency),
            I::ForbiddenWords(words) => !words
                .iter()
                .any(|w| py_regex(&format!(r"\b{w}\b"), true).is_match(value)),
            I::LetterFrequency {
                letter,
                frequency,
                relation,
            } => {
                let n = value.to_lowercase().chars().filter(|c| c == letter).count();
                relation.holds(n, *frequency)
            }
            I::ResponseLanguage(lang) => detect_language(value).is_none_or(|l| l == lang),
            I::NumberSentences { num, relation } => {
                relation.holds(punkt::sentences(value).len(), *num)
            }
            I::NumberParagraphs(n) => check_paragraphs(value, *n),
            I::NumberWords { num, relation } => relation.holds(count_words(value), *num),
            I::NthParagraphFirstWord {
                num_paragraphs,
                nth,
                first_word,
            } => check_nth_paragraph(value, *num_paragraphs, *nth, first_word),
            I::Placeholders(n) => re(r"\[.*?\]").find_iter(value).count() as i64 >= *n,
            I::Postscript(marker) => {
                let pattern = match marker.as_str() {
                    "P.P.S" => r"(?m)\s*p\.\s?p\.\s?s.*$".to_string(),
                    "P.S." => r"(?m)\s*p\.\s?s\..*$".to_string(),
                    m => format!(r"(?m)\s*{}.*$", m.to_lowercase()),
                };
                py_regex(&pattern, false).is_match(&value.to_lowercase())
            }
            I::BulletLists(n) => {
                let stars = re(r"(?m)^\s*\*[^\*].*$").find_iter(value).count();
                let dashes = re(r"(?m)^\s*-.*$").find_iter(value).count();
                (stars + dashes) as i64 == *n
            }
            I::ConstrainedResponse => {
                let v = value.trim();
                [
                    "My answer is yes.",
                    "My answer is no.",
                    "My answer is maybe.",
                ]
                .iter()
                .any(|o| v.contains(o))
            }
            I::HighlightedSections(n) => {
                let single = re(r"\*[^\n\*]*\*")
                    .find_iter(value)
                    .filter(|m| !m.as_str().trim_matches('*').trim().is_empty())
                    .count();
                let double = re(r"\*\*[^\n\*]*\*\*")
                    .find_iter(value)
                    .filter(|m| !m.as_str()[2..m.as_str().len() - 2].trim().is_empty())
                    .count();
                (single + double) as i64 >= *n
            }
            I::MultipleSections { splitter, num } => {
                let pattern = format!(r"\s?{splitter}\s?\d+\s?");
                py_regex(&pattern, false).find_iter(value).count() as i64 >= *num
            }
            I::JsonFormat => {
                let mut v = value.trim();
                for p in ["```json", "```Json", "```JSON", "```"] {
                    v = v.strip_prefix(p).unwrap_or(v);
                }
                let v = v.strip_suffix("```").unwrap_or(v).trim();
                serde_json::from_str::<Value>(v).is_ok()
            }
            I::Title => re(r"<<[^\n]+>>").find_iter(value).any(|m| {
                !m.as_str()
                    .trim_start_matches('<')
                    .trim_end_matches('>')
                    .trim()
                    .is_empty()
            }),
            I::TwoResponses => {
                let parts: Vec<&str> = value.split("******").collect();
                let mut valid = Vec::new();
                for (i, p) in parts.iter().enumerate() {
                    if p.trim().is_empty() {
                        if i != 0 && i != parts.len() - 1 {
                            return false;
                        }
                    } else {
                        valid.push(*p);
                    }
                }
                valid.len() == 2 && valid[0].trim() != valid[1].trim()
            }
            I::RepeatPrompt(p) => value
                .trim()
                .to_lowercase()
                .starts_with(&p.trim().to_lowercase()),
            I::EndChecker(end) => value
                .trim()
                .trim_matches('"')
                .to_lowercase()
                .ends_with(&end.trim().to_lowercase()),
            I::CapitalWordFrequency {
                frequency,
                relation,
            } => relation.holds(
                word_tokens(value).iter().filter(|w| py_isupper(w)).count(),
                *frequency,
            ),
            I::EnglishCapital => {
                py_isupper(value) && detect_language(value).is_none_or(|l| l == "en")
            }
            I::EnglishLowercase => {
                py_islower(value) && detect_language(value).is_none_or(|l| l == "en")
            }
            I::NoComma => !value.contains(','),
            I::Quotation => {
                let v = value.trim();
                v.chars().count() > 1 && v.starts_with('"') && v.ends_with('"')
            }
        }
    }
}

fn check_paragraphs(value: &str, expected: i64) -> bool {
    let parts: Vec<&str> = re(r"\s?\*\*\*\s?").split(value).collect();
    let mut n = parts.len() as i64;
    for (i, p) in parts.iter().enumerate() {
        if p.trim().is_empty() {
            if i == 0 || i == parts.len() - 1 {
                n -= 1;
            } else {
                return false;
            }
        }
    }
    n == expected
}

fn check_nth_paragraph(value: &str, expected: i64, nth: i64, first_word: &str) -> bool {
    let parts: Vec<&str> = value.split("\n\n").collect();
    let n = parts.iter().filter(|p| !p.trim().is_empty()).count() as i64;
    if nth > n {
        return false;
    }
    let paragraph = parts[(nth - 1) as usize].trim();
    let Some(word) = paragraph.split_whitespace().next() else {
        return false;
    };
    let word = word.trim().trim_start_matches('\'').trim_start_matches('"');
    let found: String = word
        .chars()
        .take_while(|c| !matches!(c, '.' | ',' | '?' | '!' | '\'' | '"'))
        .flat_map(char::to_lowercase)
        .collect();
    n == expected && found == first_word
}

/// A static pattern, compiled once per call site's string (patterns here are all literals).
fn re(pattern: &'static str) -> Regex {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<&'static str, Regex>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    map.entry(pattern)
        .or_insert_with(|| Regex::new(pattern).expect("static regex"))
        .clone()
}

/// A pattern from the data, used as a regular expression the way lm-eval's `re.search` does;
/// one that the `regex` crate cannot compile is matched literally.
fn py_regex(pattern: &str, ignore_case: bool) -> Regex {
    let flags = if ignore_case { "(?i)" } else { "" };
    Regex::new(&format!("{flags}{pattern}"))
        .or_else(|_| Regex::new(&format!("{flags}{}", regex::escape(pattern))))
        .expect("escaped pattern compiles")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_id_builds_from_typical_kwargs() {
        let kw = json!({"keywords": ["a"], "keyword": "a", "frequency": 1, "relation": "at least",
            "forbidden_words": ["b"], "letter": "a", "let_frequency": 1, "let_relation": "at least",
            "language": "en", "num_sentences": 1, "num_paragraphs": 1, "num_words": 1,
            "nth_paragraph": 1, "first_word": "a", "num_placeholders": 1, "postscript_marker": "P.S.",
            "num_bullets": 1, "num_highlights": 1, "section_spliter": "Section", "num_sections": 1,
            "prompt_to_repeat": "x", "end_phrase": "y", "capital_frequency": 1, "capital_relation": "at least"});
        for id in INSTRUCTION_IDS {
            assert!(Instruction::from_kwargs(id, &kw, None).is_ok(), "{id}");
        }
        assert!(Instruction::from_kwargs("keywords:nope", &kw, None).is_err());
        assert!(
            Instruction::from_kwargs("keywords:frequency", &json!({"keyword": "a"}), None).is_err()
        );
    }

    #[test]
    fn falsy_kwargs_are_dropped_like_lm_eval() {
        let r = Instruction::from_kwargs(
            "punctuation:no_comma",
            &json!({"keywords": null, "num_words": 0}),
            None,
        );
        assert!(r.is_ok());
    }
}
