//! Tokenizer loading (`tokenizer.json` + `tokenizer_config.json`) and the tiny byte-level
//! tokenizer of the embedded default.
//!
//! [`Tokenizer`] wraps `tokenizers::Tokenizer` so that every error names the file it came from,
//! encoding never inserts special tokens the text did not contain (chat templates already write
//! `<|im_start|>` and friends as text, which the tokenizer maps to their ids), and the ids the
//! rest of the system needs (`<|im_start|>`, `<|im_end|>`, `<think>`, `</think>`, EOS, pad) are
//! looked up once.

mod chatml;
mod tiny;

pub use chatml::CHATML_TEMPLATE;
pub use tiny::{
    tiny_tokenizer, tiny_tokenizer_config, train_tiny_bpe, write_tiny_tokenizer,
    write_tokenizer_with_tiny_config, TINY_SPECIAL_TOKENS,
};

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Errors from loading or using a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `tokenizer.json` is not a tokenizer the `tokenizers` crate can load.
    #[error("{path}: not a valid tokenizer.json: {message}")]
    Load {
        /// The file.
        path: PathBuf,
        /// What the `tokenizers` crate said.
        message: String,
    },
    /// `tokenizer_config.json` is not valid JSON of the expected shape.
    #[error("{path}: invalid tokenizer_config.json: {message}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// A token the system relies on is not in the vocabulary.
    #[error("{source_name}: the vocabulary has no token {token:?} (needed for {purpose})")]
    MissingToken {
        /// Where the tokenizer came from (a path, or a description).
        source_name: String,
        /// The token text.
        token: String,
        /// Why it is needed.
        purpose: &'static str,
    },
    /// Encoding or decoding failed inside the `tokenizers` crate.
    #[error("{source_name}: {message}")]
    Codec {
        /// Where the tokenizer came from.
        source_name: String,
        /// What the `tokenizers` crate said.
        message: String,
    },
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, TokenizerError>;

/// A token written in `tokenizer_config.json`: either a plain string or the
/// `{"content": "...", ...}` object older configs use.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum TokenSpec {
    Text(String),
    Object { content: String },
}

impl TokenSpec {
    fn into_text(self) -> String {
        match self {
            TokenSpec::Text(s) | TokenSpec::Object { content: s } => s,
        }
    }
}

/// `chat_template` is a string, or (newer Hugging Face configs) a list of named templates.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum TemplateSpec {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Debug, Clone, Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct RawTokenizerConfig {
    #[serde(default)]
    chat_template: Option<TemplateSpec>,
    #[serde(default)]
    eos_token: Option<TokenSpec>,
    #[serde(default)]
    pad_token: Option<TokenSpec>,
    #[serde(default)]
    bos_token: Option<TokenSpec>,
}

/// The parts of `tokenizer_config.json` this project uses. Unknown keys are ignored on purpose:
/// the file is written by Hugging Face tooling and carries many keys we have no use for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenizerConfig {
    /// The Jinja chat template (the one named `default` when the file lists several).
    pub chat_template: Option<String>,
    /// The end-of-sequence token text.
    pub eos_token: Option<String>,
    /// The padding token text.
    pub pad_token: Option<String>,
    /// The beginning-of-sequence token text (`None` for Qwen).
    pub bos_token: Option<String>,
}

impl TokenizerConfig {
    /// Reads `tokenizer_config.json`. Errors name the file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&text).map_err(|message| TokenizerError::Config {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses the JSON text of a `tokenizer_config.json`.
    pub fn from_json(text: &str) -> std::result::Result<Self, String> {
        let raw: RawTokenizerConfig = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let chat_template = match raw.chat_template {
            None => None,
            Some(TemplateSpec::One(t)) => Some(t),
            Some(TemplateSpec::Named(list)) => {
                let default = list.iter().find(|t| t.name == "default").or(list.first());
                default.map(|t| t.template.clone())
            }
        };
        Ok(TokenizerConfig {
            chat_template,
            eos_token: raw.eos_token.map(TokenSpec::into_text),
            pad_token: raw.pad_token.map(TokenSpec::into_text),
            bos_token: raw.bos_token.map(TokenSpec::into_text),
        })
    }
}

/// Ids of the tokens the chat format and generation loop depend on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialTokens {
    /// `<|im_start|>`.
    pub im_start: u32,
    /// `<|im_end|>`: ends every turn.
    pub im_end: u32,
    /// `<think>`, when the vocabulary has it.
    pub think_open: Option<u32>,
    /// `</think>`, when the vocabulary has it.
    pub think_close: Option<u32>,
    /// EOS from `tokenizer_config.json` (Qwen3 post-trained: `<|im_end|>`), else
    /// `<|endoftext|>` when present, else `<|im_end|>`.
    pub eos: u32,
    /// Pad from `tokenizer_config.json`, else `<|endoftext|>` when present.
    pub pad: Option<u32>,
    /// `<|endoftext|>`, when the vocabulary has it.
    pub endoftext: Option<u32>,
}

impl SpecialTokens {
    /// Token ids that end generation: `<|im_end|>`, EOS and `<|endoftext|>`, without duplicates.
    pub fn stop_ids(&self) -> Vec<u32> {
        let mut ids = vec![self.im_end, self.eos];
        ids.extend(self.endoftext);
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// A loaded tokenizer with its special-token ids.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    source_name: String,
    config: TokenizerConfig,
    special: SpecialTokens,
}

impl Tokenizer {
    /// Loads `tokenizer.json` and, when it exists beside it, `tokenizer_config.json`.
    /// Errors name the file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read(path).map_err(|source| TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let inner = tokenizers::Tokenizer::from_bytes(&text).map_err(|e| TokenizerError::Load {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let config_path = path.with_file_name("tokenizer_config.json");
        let config = if config_path.is_file() {
            TokenizerConfig::from_file(&config_path)?
        } else {
            TokenizerConfig::default()
        };
        Self::new(inner, config, path.display().to_string())
    }

    /// Loads `DIR/tokenizer.json` (and `DIR/tokenizer_config.json` when present).
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        Self::from_file(dir.as_ref().join("tokenizer.json"))
    }

    /// Wraps an in-memory tokenizer. `source_name` appears in error messages.
    pub fn new(
        inner: tokenizers::Tokenizer,
        config: TokenizerConfig,
        source_name: impl Into<String>,
    ) -> Result<Self> {
        let source_name = source_name.into();
        let lookup = |token: &str, purpose: &'static str| {
            inner
                .token_to_id(token)
                .ok_or_else(|| TokenizerError::MissingToken {
                    source_name: source_name.clone(),
                    token: token.to_string(),
                    purpose,
                })
        };
        let im_start = lookup("<|im_start|>", "the ChatML chat format")?;
        let im_end = lookup("<|im_end|>", "the ChatML chat format")?;
        let endoftext = inner.token_to_id("<|endoftext|>");
        let eos = match &config.eos_token {
            Some(t) => lookup(t, "eos_token of tokenizer_config.json")?,
            None => endoftext.unwrap_or(im_end),
        };
        let pad = match &config.pad_token {
            Some(t) => Some(lookup(t, "pad_token of tokenizer_config.json")?),
            None => endoftext,
        };
        let special = SpecialTokens {
            im_start,
            im_end,
            think_open: inner.token_to_id("<think>"),
            think_close: inner.token_to_id("</think>"),
            eos,
            pad,
            endoftext,
        };
        Ok(Tokenizer {
            inner,
            source_name,
            config,
            special,
        })
    }

    /// The special-token ids.
    pub fn special(&self) -> &SpecialTokens {
        &self.special
    }

    /// What `tokenizer_config.json` said (empty when there was none).
    pub fn config(&self) -> &TokenizerConfig {
        &self.config
    }

    /// Where this tokenizer was loaded from (for messages).
    pub fn source_name(&self) -> &str {
        &self.source_name
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Vocabulary size including added tokens (the smallest valid model `vocab_size`).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of an exact token string.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Encodes `text` as is: special-token strings inside the text become their ids, but no
    /// BOS/EOS or template tokens are added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| self.codec_error(e))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Decodes ids to text. With `skip_special_tokens`, tokens marked special (`<|im_end|>`,
    /// `<|endoftext|>`) are dropped; `<think>`/`</think>` are ordinary added tokens and stay.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| self.codec_error(e))
    }

    fn codec_error(&self, e: tokenizers::Error) -> TokenizerError {
        TokenizerError::Codec {
            source_name: self.source_name.clone(),
            message: e.to_string(),
        }
    }
}
