//! The tiny tokenizer of the embedded default: byte-level, no merges, 261 tokens.
//!
//! Token `b` (0 ≤ b < 256) is the byte `b`, written in `tokenizer.json` with GPT-2's printable
//! byte-to-character table so that the file is an ordinary ByteLevel BPE that Python
//! `tokenizers` and transformers load. Then come the special tokens of [`TINY_SPECIAL_TOKENS`],
//! ids 256 to 260. Any UTF-8 text round-trips; a text is as many tokens as it has bytes (plus
//! one per special token it contains).

use std::path::Path;

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

use super::{Result, TokenizerError};
use crate::chat::CHATML_TEMPLATE;

/// The added tokens of the tiny tokenizer, in id order from 256, with whether each is "special"
/// (skipped by `decode(.., skip_special_tokens = true)`). As in Qwen3, `<think>`/`</think>` are
/// added but not special, so they survive decoding.
pub const TINY_SPECIAL_TOKENS: [(&str, bool); 5] = [
    ("<|endoftext|>", true),
    ("<|im_start|>", true),
    ("<|im_end|>", true),
    ("<think>", false),
    ("</think>", false),
];

/// GPT-2's byte → printable character table (the one ByteLevel pre-tokenizers use).
fn byte_to_char() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut table = ['\0'; 256];
    let mut next_unprintable = 0u32;
    for b in 0..=255u8 {
        table[b as usize] = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(256 + next_unprintable).expect("256..324 are valid chars");
            next_unprintable += 1;
            c
        };
    }
    table
}

/// Builds the tiny byte-level tokenizer in memory.
pub fn tiny_tokenizer() -> tokenizers::Tokenizer {
    let vocab: Vocab = byte_to_char()
        .iter()
        .enumerate()
        .map(|(b, c)| (c.to_string(), b as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, Vec::new())
        .build()
        .expect("a byte vocabulary without merges is a valid BPE");
    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    // No regex split: without merges it could not change the result, only cost time.
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, false, false)));
    tokenizer.with_decoder(Some(ByteLevel::new(false, false, false)));
    let added: Vec<AddedToken> = TINY_SPECIAL_TOKENS
        .iter()
        .map(|(content, special)| AddedToken::from(*content, *special).normalized(false))
        .collect();
    // `add_special_tokens` registers every token as special; add the two think tags as plain
    // added tokens so the ids follow TINY_SPECIAL_TOKENS' order either way.
    for token in added {
        let added = if token.special {
            tokenizer.add_special_tokens([token])
        } else {
            tokenizer.add_tokens([token])
        };
        added.expect("adding a fresh token to a tokenizer without normalizer cannot fail");
    }
    tokenizer
}

/// The `tokenizer_config.json` written beside the tiny tokenizer: the built-in ChatML template,
/// EOS `<|im_end|>` and pad `<|endoftext|>` (as in Qwen3's post-trained models).
pub fn tiny_tokenizer_config() -> serde_json::Value {
    let decoder: serde_json::Map<String, serde_json::Value> = TINY_SPECIAL_TOKENS
        .iter()
        .enumerate()
        .map(|(i, (content, special))| {
            (
                (256 + i).to_string(),
                serde_json::json!({
                    "content": content,
                    "lstrip": false,
                    "normalized": false,
                    "rstrip": false,
                    "single_word": false,
                    "special": special,
                }),
            )
        })
        .collect();
    serde_json::json!({
        "add_bos_token": false,
        "add_prefix_space": false,
        "added_tokens_decoder": decoder,
        "bos_token": null,
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": false,
        "eos_token": "<|im_end|>",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": false,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": null,
    })
}

/// Writes `tokenizer.json` and `tokenizer_config.json` of the tiny tokenizer into `dir`
/// (created if missing).
pub fn write_tiny_tokenizer(dir: impl AsRef<Path>) -> Result<()> {
    let dir = dir.as_ref();
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TokenizerError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let tokenizer_path = dir.join("tokenizer.json");
    let json = tiny_tokenizer()
        .to_string(true)
        .map_err(|e| TokenizerError::Codec {
            source_name: "tiny tokenizer".into(),
            message: e.to_string(),
        })?;
    std::fs::write(&tokenizer_path, json + "\n").map_err(io(&tokenizer_path))?;
    let config_path = dir.join("tokenizer_config.json");
    let config = serde_json::to_string_pretty(&tiny_tokenizer_config())
        .expect("a JSON value always serialises");
    std::fs::write(&config_path, config + "\n").map_err(io(&config_path))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_a_bijection_onto_bytelevel_alphabet() {
        let table = byte_to_char();
        let mut chars: Vec<char> = table.to_vec();
        chars.sort_unstable();
        chars.dedup();
        assert_eq!(chars.len(), 256);
        assert_eq!(table[b'A' as usize], 'A');
        assert_eq!(table[b' ' as usize], 'Ġ');
        assert_eq!(table[b'\n' as usize], 'Ċ');
        let alphabet = ByteLevel::alphabet();
        assert!(table.iter().all(|c| alphabet.contains(c)));
    }

    #[test]
    fn ids_of_added_tokens() {
        let t = tiny_tokenizer();
        for (i, (content, _)) in TINY_SPECIAL_TOKENS.iter().enumerate() {
            assert_eq!(t.token_to_id(content), Some(256 + i as u32), "{content}");
        }
        assert_eq!(t.get_vocab_size(true), 261);
    }
}
