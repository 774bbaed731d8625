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

use super::CHATML_TEMPLATE;
use super::{Result, TokenizerError};

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
    add_tiny_special_tokens(&mut tokenizer);
    tokenizer
}

/// Adds [`TINY_SPECIAL_TOKENS`] after the model's vocabulary (ids 256.. for a byte vocabulary).
fn add_tiny_special_tokens(tokenizer: &mut tokenizers::Tokenizer) {
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

/// Trains byte-level BPE merges on `texts` on top of the tiny tokenizer: ids 0–255 are still
/// the bytes and 256–260 the added tokens of [`TINY_SPECIAL_TOKENS`] (so the tiny tokenizer's
/// config applies unchanged), and every merge adds one token from 261 up to `vocab_size`.
/// Texts are split as GPT-2 does (words with their leading space, digit runs, punctuation)
/// before merging, and encoding splits the same way. Any UTF-8 text still round-trips.
/// Deterministic: the same texts give the same tokenizer.
pub fn train_tiny_bpe<'a>(
    texts: impl Iterator<Item = &'a str> + Send,
    vocab_size: usize,
) -> Result<tokenizers::Tokenizer> {
    let base = 256 + TINY_SPECIAL_TOKENS.len();
    if vocab_size < base {
        return Err(TokenizerError::Codec {
            source_name: "tiny BPE".into(),
            message: format!("vocab_size {vocab_size} < {base} (bytes and added tokens)"),
        });
    }
    let err = |e: tokenizers::Error| TokenizerError::Codec {
        source_name: "tiny BPE training".into(),
        message: e.to_string(),
    };
    // 1. Learn the merges with the library's trainer (its own id layout is discarded).
    let mut trainer = tokenizers::models::bpe::BpeTrainer::builder()
        .vocab_size(vocab_size - TINY_SPECIAL_TOKENS.len())
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut learner = tokenizers::TokenizerBuilder::<
        BPE,
        tokenizers::NormalizerWrapper,
        ByteLevel,
        tokenizers::PostProcessorWrapper,
        ByteLevel,
    >::default()
    .with_model(BPE::default())
    .with_pre_tokenizer(Some(ByteLevel::new(false, false, true)))
    .with_decoder(Some(ByteLevel::new(false, false, true)))
    .build()
    .map_err(err)?;
    // The chat markers never take part in merges.
    let specials: Vec<&str> = TINY_SPECIAL_TOKENS.iter().map(|(t, _)| *t).collect();
    let texts = texts.map(move |t| {
        let mut s = t.to_string();
        for sp in &specials {
            s = s.replace(sp, " ");
        }
        s
    });
    learner.train(&mut trainer, texts).map_err(err)?;
    // The merges in rank order, as the model serialises them (`[["a", "b"], ...]`).
    let model = serde_json::to_value(learner.get_model()).map_err(|e| TokenizerError::Codec {
        source_name: "tiny BPE training".into(),
        message: e.to_string(),
    })?;
    let merges: Vec<(String, String)> = model
        .get("merges")
        .and_then(|m| m.as_array())
        .map(|list| {
            list.iter()
                .filter_map(|m| match m {
                    serde_json::Value::Array(p) if p.len() == 2 => {
                        Some((p[0].as_str()?.to_string(), p[1].as_str()?.to_string()))
                    }
                    serde_json::Value::String(s) => {
                        let (a, b) = s.split_once(' ')?;
                        Some((a.to_string(), b.to_string()))
                    }
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    // 2. Rebuild with the tiny layout: bytes, then the added tokens, then one id per merge.
    let mut vocab: Vocab = byte_to_char()
        .iter()
        .enumerate()
        .map(|(b, c)| (c.to_string(), b as u32))
        .collect();
    for (i, (content, _)) in TINY_SPECIAL_TOKENS.iter().enumerate() {
        vocab.insert(content.to_string(), 256 + i as u32);
    }
    let mut merge_list = Vec::with_capacity(merges.len());
    for (a, b) in merges {
        let merged = format!("{a}{b}");
        if vocab.contains_key(&merged) || base + merge_list.len() >= vocab_size {
            continue;
        }
        vocab.insert(merged, (base + merge_list.len()) as u32);
        merge_list.push((a, b));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merge_list)
        .build()
        .map_err(err)?;
    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, false, true)));
    tokenizer.with_decoder(Some(ByteLevel::new(false, false, true)));
    add_tiny_special_tokens(&mut tokenizer);
    Ok(tokenizer)
}

/// Writes `tokenizer.json` and `tokenizer_config.json` of the tiny tokenizer into `dir`
/// (created if missing).
pub fn write_tiny_tokenizer(dir: impl AsRef<Path>) -> Result<()> {
    write_tokenizer_with_tiny_config(dir, &tiny_tokenizer())
}

/// Writes `tokenizer` (the tiny one, or one from [`train_tiny_bpe`]) as `tokenizer.json` with
/// the tiny `tokenizer_config.json` into `dir` (created if missing).
pub fn write_tokenizer_with_tiny_config(
    dir: impl AsRef<Path>,
    tokenizer: &tokenizers::Tokenizer,
) -> Result<()> {
    let dir = dir.as_ref();
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TokenizerError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let tokenizer_path = dir.join("tokenizer.json");
    let json = tokenizer
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

    fn corpus() -> Vec<String> {
        (0..300)
            .map(|i| {
                format!(
                    "What is {} + {}? <think>\n{}+{}={}\n</think>\n\n\\boxed{{{}}} ```python\ndef times{}(x):\n    return x * {}\n```",
                    i % 9,
                    i % 7,
                    i % 9,
                    i % 7,
                    i % 9 + i % 7,
                    i % 9 + i % 7,
                    i % 8,
                    i % 8
                )
            })
            .collect()
    }

    #[test]
    fn trained_bpe_keeps_the_tiny_layout_compresses_and_round_trips() {
        let texts = corpus();
        let t = train_tiny_bpe(texts.iter().map(String::as_str), 400).unwrap();
        // As many merges as the corpus has pairs seen twice, up to the asked size.
        let size = t.get_vocab_size(true);
        assert!((300..=400).contains(&size), "{size}");
        for (i, (content, _)) in TINY_SPECIAL_TOKENS.iter().enumerate() {
            assert_eq!(t.token_to_id(content), Some(256 + i as u32), "{content}");
        }
        assert_eq!(t.token_to_id("A"), Some(b'A' as u32));
        let text = "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<think>\n3+4=7\n</think>\n\n\\boxed{7} é 中";
        let enc = t.encode(text, false).unwrap();
        assert!(
            enc.get_ids().len() * 2 < text.len(),
            "{} tokens",
            enc.get_ids().len()
        );
        assert!(enc.get_ids().contains(&257) && enc.get_ids().contains(&259));
        assert_eq!(t.decode(enc.get_ids(), false).unwrap(), text);
        // Same texts, same tokenizer.
        let again = train_tiny_bpe(texts.iter().map(String::as_str), 400).unwrap();
        assert_eq!(t.to_string(false).unwrap(), again.to_string(false).unwrap());
    }
}
