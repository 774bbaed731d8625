//! Shared helpers of the engine tests: a tiny random Qwen3 checkpoint.
#![allow(dead_code)]

use std::path::Path;

use candle_core::{DType, Device};
use cascade_shared::model::{random_weights, save_checkpoint, CausalLm, ModelConfig};

/// A tiny Qwen3 config (vocabulary of the tiny byte-level tokenizer, rounded up).
pub fn tiny_config(max_pos: usize) -> ModelConfig {
    ModelConfig::from_json_str(&format!(
        r#"{{"model_type": "qwen3", "vocab_size": 264, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "max_position_embeddings": {max_pos}, "initializer_range": 0.5,
            "eos_token_id": 258}}"#
    ))
    .expect("valid config")
}

/// A random tiny model in memory.
pub fn tiny_model(seed: u64, max_pos: usize) -> CausalLm {
    let cfg = tiny_config(max_pos);
    let w = random_weights(&cfg, seed, &Device::Cpu).expect("weights");
    CausalLm::from_tensors(&cfg, &w).expect("model")
}

/// Writes a random tiny checkpoint (config, weights, tiny tokenizer) into `dir`.
pub fn write_tiny_checkpoint(dir: &Path, seed: u64, max_pos: usize) {
    let cfg = tiny_config(max_pos);
    let w = random_weights(&cfg, seed, &Device::Cpu).expect("weights");
    save_checkpoint(dir, &cfg, &w, DType::F32).expect("save");
    cascade_shared::tokenizer::write_tiny_tokenizer(dir).expect("tokenizer");
}
