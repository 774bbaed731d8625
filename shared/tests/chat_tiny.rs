//! The tiny byte-level tokenizer: committed files equal what the code builds, Python
//! `tokenizers` and jinja2 agree with it (tests/fixtures/chat/tiny_cases.json, from
//! scripts/gen-chat-fixtures.py), and arbitrary UTF-8 round-trips.
//!
//! `CASCADE_BLESS=1` rewrites tests/fixtures/chat/tiny-tokenizer/ (then rerun the script).

use std::path::PathBuf;

use anyhow::Result;
use cascade_shared::chat::{Chat, Message};
use cascade_shared::tokenizer::{tiny_tokenizer, write_tiny_tokenizer, Tokenizer, TokenizerConfig};
use cascade_shared::Mode;
use proptest::prelude::*;
use serde::Deserialize;

fn tiny_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat/tiny-tokenizer")
}

#[test]
fn committed_tiny_tokenizer_is_what_the_code_builds() -> Result<()> {
    if std::env::var_os("CASCADE_BLESS").is_some() {
        write_tiny_tokenizer(tiny_dir())?;
    }
    let fresh = tempfile::tempdir()?;
    write_tiny_tokenizer(fresh.path())?;
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        let built = std::fs::read_to_string(fresh.path().join(file))?;
        let committed = std::fs::read_to_string(tiny_dir().join(file))?;
        assert!(built == committed, "{file} differs from the committed fixture; rerun with CASCADE_BLESS=1 and scripts/gen-chat-fixtures.py");
    }
    Ok(())
}

#[derive(Deserialize)]
struct Case {
    name: String,
    mode: String,
    add_generation_prompt: bool,
    messages: Vec<Message>,
    text: String,
    ids: Vec<u32>,
    #[serde(default)]
    assistant_mask: Option<Vec<bool>>,
}

#[derive(Deserialize)]
struct Encoded {
    text: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct Fixture {
    vocab_size: usize,
    strings: Vec<Encoded>,
    cases: Vec<Case>,
}

fn fixture() -> Result<Fixture> {
    let path = tiny_dir().join("../tiny_cases.json");
    Ok(serde_json::from_str(&std::fs::read_to_string(path)?)?)
}

#[test]
fn python_tokenizers_agree_with_the_tiny_tokenizer() -> Result<()> {
    let fx = fixture()?;
    let tok = Tokenizer::new(tiny_tokenizer(), TokenizerConfig::default(), "tiny")?;
    assert_eq!(tok.vocab_size(), fx.vocab_size);
    assert!(tok.vocab_size() <= 512);
    for s in &fx.strings {
        assert_eq!(tok.encode(&s.text)?, s.ids, "{:?}", s.text);
        assert_eq!(tok.decode(&s.ids, false)?, s.text);
    }
    Ok(())
}

#[test]
fn tiny_chat_matches_python_jinja2() -> Result<()> {
    let fx = fixture()?;
    let chat = Chat::from_dir(tiny_dir())?;
    let special = chat.tokenizer().special().clone();
    assert_eq!(
        (special.endoftext, special.im_start, special.im_end),
        (Some(256), 257, 258)
    );
    assert_eq!(
        (special.think_open, special.think_close),
        (Some(259), Some(260))
    );
    assert_eq!((special.eos, special.pad), (258, Some(256)));
    for case in &fx.cases {
        let mode = Mode::parse(&case.mode).unwrap();
        assert_eq!(
            chat.render(&case.messages, case.add_generation_prompt, mode)?,
            case.text,
            "{}",
            case.name
        );
        assert_eq!(
            chat.encode_chat(&case.messages, case.add_generation_prompt, mode)?,
            case.ids,
            "{}",
            case.name
        );
        if let Some(mask) = &case.assistant_mask {
            assert_eq!(
                &chat.encode_sft(&case.messages, mode)?.assistant_mask,
                mask,
                "{}",
                case.name
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn any_utf8_round_trips(text in any::<String>()) {
        let tok = tiny_tokenizer();
        let ids = tok.encode(text.as_str(), false).unwrap().get_ids().to_vec();
        prop_assert_eq!(ids.len(), text.len(), "one token per byte");
        prop_assert_eq!(tok.decode(&ids, false).unwrap(), text);
    }
}
