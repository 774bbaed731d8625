//! Helpers of the learner's GPU tests (`learner_cuda.rs`, `learner_nccl_cuda.rs`): the CUDA
//! device, a small Qwen3-shaped config and packed SFT rows.
#![allow(dead_code)]

use anyhow::Result;
use candle_core::Device;
use cascade_learner::sft::PackedRow;
use cascade_shared::model::ModelConfig;

pub fn gpu() -> Device {
    Device::new_cuda(0).unwrap_or_else(|e| panic!("no CUDA device 0: {e}"))
}

pub fn small_config() -> Result<ModelConfig> {
    Ok(ModelConfig::from_json_str(
        r#"{"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 256,
            "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 4096,
            "initializer_range": 0.05, "tie_word_embeddings": true}"#,
    )?)
}

/// Two packed rows: one of two conversations (65 + 200 tokens), one of a single 63-token
/// conversation, each with an untrained prompt.
pub fn rows(vocab: u32) -> Vec<PackedRow> {
    let mut out = Vec::new();
    for (r, lens) in [vec![65usize, 200], vec![63]].into_iter().enumerate() {
        let n: usize = lens.iter().sum();
        let ids: Vec<u32> = (0..n as u64)
            .map(|i| ((i * 2_654_435_761 + r as u64 * 97) % vocab as u64) as u32)
            .collect();
        let (mut segments, mut seg_start) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut start = 0;
        for (s, &len) in lens.iter().enumerate() {
            segments.extend(std::iter::repeat_n(s as u32 + 1, len));
            seg_start.extend(std::iter::repeat_n(start, len));
            start += len;
        }
        // Train where the target is in the same conversation, past its first 10 tokens.
        let weights = (0..n - 1)
            .map(|i| segments[i] == segments[i + 1] && i + 1 >= seg_start[i + 1] + 10)
            .collect();
        out.push(PackedRow {
            ids,
            weights,
            segments,
        });
    }
    out
}
