//! The chat template and tokenizer on the real Qwen3 tokenizer, against fixtures rendered by
//! Python jinja2 and encoded by Python `tokenizers` (scripts/gen-chat-fixtures.py).

use std::path::PathBuf;

use anyhow::{Context, Result};
use cascade_shared::chat::{split_response, Chat, ChatTemplate, Message};
use cascade_shared::tokenizer::Tokenizer;
use cascade_shared::Mode;
use serde::Deserialize;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
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
struct Raw {
    name: String,
    messages: Vec<Message>,
    add_generation_prompt: bool,
    enable_thinking: Option<bool>,
    text: String,
}

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
    raw: Vec<Raw>,
    special_ids: std::collections::HashMap<String, u32>,
}

fn load() -> Result<(Chat, Fixture)> {
    let chat = Chat::from_dir(fixtures().join("qwen3-tokenizer"))?;
    let path = fixtures().join("chat/qwen3_cases.json");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    Ok((chat, serde_json::from_str(&text)?))
}

fn mode(s: &str) -> Mode {
    Mode::parse(s).expect("fixture mode")
}

#[test]
fn rendered_text_and_ids_match_python() -> Result<()> {
    let (chat, fixture) = load()?;
    assert!(
        !chat.template().is_builtin(),
        "Qwen3's own template is used"
    );
    assert!(fixture.cases.iter().any(|c| c.name == "two_turn_think"));
    assert!(fixture.cases.iter().any(|c| c.name == "two_turn_no_think"));
    for case in &fixture.cases {
        let m = mode(&case.mode);
        let text = chat.render(&case.messages, case.add_generation_prompt, m)?;
        assert_eq!(text, case.text, "{}: rendered text", case.name);
        let ids = chat.encode_chat(&case.messages, case.add_generation_prompt, m)?;
        assert_eq!(ids, case.ids, "{}: token ids", case.name);
    }
    Ok(())
}

#[test]
fn two_turn_conversation_ends_as_documented() -> Result<()> {
    let (chat, fixture) = load()?;
    let case = |name: &str| fixture.cases.iter().find(|c| c.name == name).unwrap();
    let think = &case("two_turn_think").text;
    assert!(think.ends_with("And times 3? /think<|im_end|>\n<|im_start|>assistant\n"));
    let no = &case("two_turn_no_think").text;
    assert!(no.ends_with(
        "And times 3? /no_think<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ));
    // The no-think generation prompt is these exact Qwen3 ids.
    let s = &fixture.special_ids;
    let tail = &case("two_turn_no_think").ids[case("two_turn_no_think").ids.len() - 7..];
    assert_eq!(tail[0], s["<|im_start|>"]);
    assert_eq!(tail[3], s["<think>"]);
    assert_eq!(tail[5], s["</think>"]);
    assert_eq!(
        chat.tokenizer().decode(tail, false)?,
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    Ok(())
}

#[test]
fn sft_masks_match_python_offsets() -> Result<()> {
    let (chat, fixture) = load()?;
    let mut checked = 0;
    for case in fixture.cases.iter().filter(|c| c.assistant_mask.is_some()) {
        let enc = chat.encode_sft(&case.messages, mode(&case.mode))?;
        assert_eq!(enc.ids, case.ids, "{}", case.name);
        assert_eq!(
            Some(&enc.assistant_mask),
            case.assistant_mask.as_ref(),
            "{}",
            case.name
        );
        assert!(enc.assistant_mask.iter().any(|m| *m));
        checked += 1;
    }
    assert_eq!(checked, 2);
    Ok(())
}

#[test]
fn raw_render_matches_python_with_enable_thinking_unset_true_false() -> Result<()> {
    let (chat, fixture) = load()?;
    assert_eq!(fixture.raw.len(), 6);
    for raw in &fixture.raw {
        let text = chat.template().render_raw(
            &raw.messages,
            raw.add_generation_prompt,
            raw.enable_thinking,
        )?;
        assert_eq!(
            text, raw.text,
            "{} enable_thinking={:?}",
            raw.name, raw.enable_thinking
        );
    }
    Ok(())
}

#[test]
fn builtin_chatml_renders_like_qwen3_without_tools() -> Result<()> {
    let (_, fixture) = load()?;
    let builtin = ChatTemplate::chatml();
    for case in &fixture.cases {
        let text = builtin.render(&case.messages, case.add_generation_prompt, mode(&case.mode))?;
        assert_eq!(text, case.text, "{}", case.name);
    }
    Ok(())
}

#[test]
fn special_tokens_from_tokenizer_config() -> Result<()> {
    let (chat, fixture) = load()?;
    let s = chat.tokenizer().special();
    let ids = &fixture.special_ids;
    assert_eq!(s.im_start, ids["<|im_start|>"]);
    assert_eq!(s.im_end, ids["<|im_end|>"]);
    assert_eq!(s.think_open, Some(ids["<think>"]));
    assert_eq!(s.think_close, Some(ids["</think>"]));
    assert_eq!(
        s.eos, ids["<|im_end|>"],
        "eos_token of tokenizer_config.json"
    );
    assert_eq!(s.pad, Some(ids["<|endoftext|>"]));
    assert_eq!(s.stop_ids(), vec![ids["<|endoftext|>"], ids["<|im_end|>"]]);
    Ok(())
}

#[test]
fn encode_adds_nothing_and_decode_round_trips() -> Result<()> {
    let (chat, _) = load()?;
    let tok = chat.tokenizer();
    let text = "Hello, world! 👋";
    let ids = tok.encode(text)?;
    assert!(!ids.contains(&tok.special().eos) && !ids.contains(&tok.special().im_start));
    assert_eq!(tok.decode(&ids, false)?, text);
    let response = "<think>\nsum\n</think>\n\nThe answer is \\boxed{4}.<|im_end|>";
    let ids = tok.encode(response)?;
    assert_eq!(*ids.last().unwrap(), tok.special().im_end);
    let decoded = tok.decode(&ids, true)?;
    assert_eq!(
        decoded,
        "<think>\nsum\n</think>\n\nThe answer is \\boxed{4}."
    );
    let split = split_response(&decoded);
    assert_eq!(split.thinking, Some("sum"));
    assert_eq!(split.answer, Some("The answer is \\boxed{4}."));
    Ok(())
}

#[test]
fn load_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("tokenizer.json");
    let err = Tokenizer::from_file(&missing).unwrap_err().to_string();
    assert!(err.contains(&missing.display().to_string()), "{err}");
    std::fs::write(&missing, "{ not json").unwrap();
    let err = Tokenizer::from_file(&missing).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer.json") && err.contains("not a valid"),
        "{err}"
    );
    // A valid tokenizer with a broken tokenizer_config.json beside it.
    std::fs::copy(
        fixtures().join("chat/tiny-tokenizer/tokenizer.json"),
        &missing,
    )
    .unwrap();
    let config = dir.path().join("tokenizer_config.json");
    std::fs::write(&config, "[1, 2]").unwrap();
    let err = Tokenizer::from_file(&missing).unwrap_err().to_string();
    assert!(err.contains("tokenizer_config.json"), "{err}");
    std::fs::write(&config, r#"{"eos_token": "<nope>"}"#).unwrap();
    let err = Tokenizer::from_file(&missing).unwrap_err().to_string();
    assert!(err.contains("<nope>") && err.contains("eos_token"), "{err}");
}
