//! Tiny models, chats and synthetic pairs shared by the reward-model unit tests.

use candle_core::Device;
use cascade_shared::chat::{Chat, ChatTemplate};
use cascade_shared::model::{random_weights, ModelConfig};
use cascade_shared::tokenizer::{tiny_tokenizer, Tokenizer, TokenizerConfig};

use super::{HeadInit, PreferencePair, RmTrainConfig, RmTrainer};

pub(super) fn tiny_chat() -> Chat {
    let tokenizer = Tokenizer::new(tiny_tokenizer(), TokenizerConfig::default(), "tiny").unwrap();
    Chat::new(tokenizer, ChatTemplate::chatml())
}

pub(super) fn tiny_config() -> ModelConfig {
    ModelConfig::from_json_str(
        r#"{"model_type": "qwen3", "vocab_size": 264, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 256,
            "initializer_range": 0.2}"#,
    )
    .unwrap()
}

pub(super) fn tiny_trainer(head: HeadInit, cfg: RmTrainConfig) -> RmTrainer {
    let mcfg = tiny_config();
    let w = random_weights(&mcfg, 7, &Device::Cpu).unwrap();
    RmTrainer::from_tensors(&mcfg, w, head, tiny_chat(), cfg).unwrap()
}

/// Separable synthetic pairs: a short concise answer beats a long repetitive one.
pub(super) fn synthetic_pairs(n: usize, offset: usize) -> Vec<PreferencePair> {
    let words = ["cat", "blue", "seven", "river", "tree", "moon"];
    (offset..offset + n)
        .map(|i| {
            let (a, b) = (i % 13, (i * 7) % 11);
            let w = words[i % words.len()];
            PreferencePair {
                prompt: format!("Q{i}: what is {a} plus {b}?"),
                chosen: format!("{}.", a + b),
                rejected: format!("{w} {w} {w} {w} {w} {w} {w} {w} so {w} {w} {w}"),
            }
        })
        .collect()
}
