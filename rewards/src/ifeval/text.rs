//! Python string semantics and NLTK/langdetect stand-ins that IFEval's checks rely on.

use std::sync::OnceLock;

use regex::Regex;

/// Python's `str.isupper()`: at least one cased character and no lowercase one.
pub fn py_isupper(s: &str) -> bool {
    s.chars().any(|c| c.is_uppercase() || c.is_lowercase()) && !s.chars().any(char::is_lowercase)
}

/// Python's `str.islower()`: at least one cased character and no uppercase one.
pub fn py_islower(s: &str) -> bool {
    s.chars().any(|c| c.is_uppercase() || c.is_lowercase()) && !s.chars().any(char::is_uppercase)
}

/// IFEval's `count_words`: the number of `\w+` runs (NLTK `RegexpTokenizer(r"\w+")`).
pub fn count_words(s: &str) -> usize {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"\w+").expect("static regex"))
        .find_iter(s)
        .count()
}

/// The language of `s` as an ISO 639-1 code, or `None` when it cannot be told (no letters), which
/// IFEval (through langdetect's exception) counts as the instruction being followed.
///
/// IFEval uses `langdetect`; this uses `whatlang`, a different statistical detector. They agree on
/// ordinary sentences of a few words; on very short or mixed texts they can differ.
pub fn detect_language(s: &str) -> Option<&'static str> {
    if !s.chars().any(char::is_alphabetic) {
        return None;
    }
    let info = whatlang::detect(s)?;
    Some(iso639_1(info.lang()))
}

fn iso639_1(l: whatlang::Lang) -> &'static str {
    use whatlang::Lang::*;
    match l {
        Eng => "en",
        Rus => "ru",
        Cmn => "zh-cn",
        Spa => "es",
        Por => "pt",
        Ita => "it",
        Ben => "bn",
        Fra => "fr",
        Deu => "de",
        Ukr => "uk",
        Kat => "ka",
        Ara => "ar",
        Hin => "hi",
        Jpn => "ja",
        Heb => "he",
        Yid => "yi",
        Pol => "pl",
        Amh => "am",
        Jav => "jv",
        Kor => "ko",
        Nob => "no",
        Dan => "da",
        Swe => "sv",
        Fin => "fi",
        Tur => "tr",
        Nld => "nl",
        Hun => "hu",
        Ces => "cs",
        Ell => "el",
        Bul => "bg",
        Bel => "be",
        Mar => "mr",
        Kan => "kn",
        Ron => "ro",
        Slv => "sl",
        Hrv => "hr",
        Srp => "sr",
        Mkd => "mk",
        Lit => "lt",
        Lav => "lv",
        Est => "et",
        Tam => "ta",
        Vie => "vi",
        Urd => "ur",
        Tha => "th",
        Guj => "gu",
        Uzb => "uz",
        Pan => "pa",
        Aze => "az",
        Ind => "id",
        Tel => "te",
        Pes => "fa",
        Mal => "ml",
        Ori => "or",
        Mya => "my",
        Nep => "ne",
        Sin => "si",
        Khm => "km",
        Tuk => "tk",
        Aka => "ak",
        Zul => "zu",
        Sna => "sn",
        Afr => "af",
        Lat => "la",
        Slk => "sk",
        Cat => "ca",
        Tgl => "tl",
        Hye => "hy",
        _ => "unknown",
    }
}

/// Word tokens in the manner of `nltk.word_tokenize` as far as IFEval's capital-word count can
/// tell: Punkt sentences, whitespace pieces, leading/trailing punctuation split off, and the
/// Treebank contraction suffixes (`n't`, `'s`, `'ll`, `'re`, `'ve`, `'m`, `'d`) split from their word.
pub fn word_tokens(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    for sentence in super::punkt::sentences(s) {
        for piece in sentence.split_whitespace() {
            let lead: &[char] = &['(', '[', '{', '<', '"', '`', '\'', '\u{201c}'];
            let trail: &[char] = &[
                '.', ',', ';', ':', '!', '?', ')', ']', '}', '>', '"', '\'', '\u{201d}',
            ];
            let core = piece.trim_start_matches(lead);
            out.extend(piece[..piece.len() - core.len()].chars().map(String::from));
            let body = core.trim_end_matches(trail);
            let tail = &core[body.len()..];
            let lower = body.to_lowercase();
            let split = ["n't", "'s", "'ll", "'re", "'ve", "'m", "'d"]
                .iter()
                .find(|suf| lower.ends_with(*suf) && lower.len() > suf.len())
                .map(|suf| body.len() - suf.len());
            match split {
                Some(at) => {
                    out.push(body[..at].to_string());
                    out.push(body[at..].to_string());
                }
                None if !body.is_empty() => out.push(body.to_string()),
                None => {}
            }
            out.extend(tail.chars().map(String::from));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_case_predicates() {
        assert!(py_isupper("ABC 123"));
        assert!(!py_isupper("123"));
        assert!(py_islower("abc."));
        assert!(!py_islower("aBc"));
    }

    #[test]
    fn words_and_tokens() {
        assert_eq!(count_words("can't stop, well-known"), 5);
        assert_eq!(word_tokens("DON'T STOP."), vec!["DO", "N'T", "STOP", "."]);
    }

    #[test]
    fn languages() {
        assert_eq!(
            detect_language("This is a perfectly ordinary English sentence about the weather."),
            Some("en")
        );
        assert_eq!(detect_language("12345"), None);
    }
}
