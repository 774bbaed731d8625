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

/// Publishes a snapshot of a random tiny model (`cfg`, weights seed `seed`) as `version`
/// with the learner's own publisher, at stage `stage_index`.
pub fn publish_tiny(
    snapshots: &Path,
    version: u64,
    cfg: &ModelConfig,
    seed: u64,
    stage_index: u32,
) {
    use cascade_shared::snapshot::LearnerState;
    let state = LearnerState {
        step: version,
        policy_version: version,
        stage_index,
        stage_step: version,
        ..LearnerState::initial(serde_json::json!({}))
    };
    publish_tiny_with(snapshots, cfg, seed, &state);
}

/// Publishes a snapshot of a random tiny model (`cfg`, weights seed `seed`) as version
/// `state.policy_version`, with the learner's `state`.
pub fn publish_tiny_with(
    snapshots: &Path,
    cfg: &ModelConfig,
    seed: u64,
    state: &cascade_shared::snapshot::LearnerState,
) {
    use cascade_learner::snapshot::{publish, SnapshotInput};
    use cascade_learner::{AdamW, AdamWConfig};
    let version = state.policy_version;
    let w = random_weights(cfg, seed, &Device::Cpu).expect("weights");
    let mut model: Vec<(String, candle_core::Tensor)> = w.into_iter().collect();
    model.sort_by(|a, b| a.0.cmp(&b.0));
    let vars = model
        .iter()
        .take(1)
        .map(|(k, t)| (k.clone(), candle_core::Var::from_tensor(t).unwrap()))
        .collect();
    let opt = AdamW::new(vars, AdamWConfig::default()).expect("optimizer");
    let config_json = serde_json::to_vec(&cfg.to_hf_json("float32")).unwrap();
    let tok = tempfile::tempdir().unwrap();
    cascade_shared::tokenizer::write_tiny_tokenizer(tok.path()).unwrap();
    let tokenizer_json = std::fs::read(tok.path().join("tokenizer.json")).unwrap();
    publish(
        snapshots,
        version,
        &SnapshotInput {
            model: &model,
            optimizer: Some(&opt),
            state,
            config_json: &config_json,
            tokenizer_json: &tokenizer_json,
            extra_files: &[],
            stage_final: false,
        },
    )
    .expect("publish");
}
