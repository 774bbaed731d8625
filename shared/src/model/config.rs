//! `ModelConfig`: a serde mirror of a Hugging Face `config.json` for the Qwen3 family.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{ModelError, Result};

/// The architectures this crate implements, chosen by `config.json`'s `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelType {
    /// Qwen3: RMSNorm on q and k per head, no attention bias by default.
    Qwen3,
    /// Qwen2 / Qwen2.5: bias on q, k and v projections, no q/k norm.
    Qwen2,
    /// Llama: no bias (unless `attention_bias`), no q/k norm.
    Llama,
}

impl ModelType {
    /// The `model_type` strings we accept.
    pub const SUPPORTED: &'static [&'static str] = &["qwen3", "qwen2", "llama"];

    /// The transformers class name written to `architectures`.
    pub fn architecture(self) -> &'static str {
        match self {
            ModelType::Qwen3 => "Qwen3ForCausalLM",
            ModelType::Qwen2 => "Qwen2ForCausalLM",
            ModelType::Llama => "LlamaForCausalLM",
        }
    }
}

fn default_rope_theta() -> f64 {
    10_000.0
}
fn default_rms_eps() -> f64 {
    1e-6
}
fn default_max_pos() -> usize {
    32_768
}
fn default_act() -> String {
    "silu".into()
}
fn default_init_range() -> f64 {
    0.02
}

/// A Hugging Face `config.json` for Qwen3 / Qwen2 / Llama. Keys we do not use are kept in
/// `extra` so that a config round-trips unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Which architecture.
    pub model_type: ModelType,
    /// Vocabulary size (rows of the embedding and of the LM head).
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); defaults to `num_attention_heads`.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Per-head width; defaults to `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Longest sequence the model accepts.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    /// Rotary base frequency.
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    #[serde(default = "default_rms_eps")]
    pub rms_norm_eps: f64,
    /// Whether the LM head shares the embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Bias on q/k/v/o (Qwen3, Llama). Qwen2 always has q/k/v bias and ignores this.
    #[serde(default)]
    pub attention_bias: bool,
    /// Bias on the MLP projections (Llama).
    #[serde(default)]
    pub mlp_bias: bool,
    /// MLP activation; only `silu` is supported.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Std of the normal initialiser (for random init).
    #[serde(default = "default_init_range")]
    pub initializer_range: f64,
    /// BOS token id, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<serde_json::Value>,
    /// EOS token id(s), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<serde_json::Value>,
    /// Rotary scaling; only absent/null is supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<serde_json::Value>,
    /// Qwen2 sliding-window attention; only `false` is supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_sliding_window: Option<bool>,
    /// Every other key of the file (`architectures`, `torch_dtype`, ...), kept verbatim.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl ModelConfig {
    /// Reads and validates `config.json`. Errors name the file.
    pub fn from_file(path: &Path) -> Result<ModelConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        Self::from_json_str(&text).map_err(|e| e.in_file(path))
    }

    /// Parses and validates a config from JSON text.
    pub fn from_json_str(text: &str) -> Result<ModelConfig> {
        let raw: serde_json::Value =
            serde_json::from_str(text).map_err(|e| ModelError::Config(e.to_string()))?;
        if let Some(mt) = raw.get("model_type").and_then(|v| v.as_str()) {
            if !ModelType::SUPPORTED.contains(&mt) {
                return Err(ModelError::Config(format!(
                    "unsupported model_type `{mt}`; supported: {}",
                    ModelType::SUPPORTED.join(", ")
                )));
            }
        } else {
            return Err(ModelError::Config(format!(
                "missing `model_type`; supported: {}",
                ModelType::SUPPORTED.join(", ")
            )));
        }
        let cfg: ModelConfig =
            serde_json::from_value(raw).map_err(|e| ModelError::Config(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the values we rely on.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ModelError::Config(m));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                return bad(format!("`{name}` must be > 0"));
            }
        }
        let kv = self.num_kv_heads();
        if kv == 0 || !self.num_attention_heads.is_multiple_of(kv) {
            return bad(format!(
                "`num_attention_heads` ({}) must be a multiple of `num_key_value_heads` ({kv})",
                self.num_attention_heads
            ));
        }
        if self.head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return bad("`hidden_size` must be a multiple of `num_attention_heads` when `head_dim` is absent".into());
        }
        if !self.head_dim().is_multiple_of(2) {
            return bad(format!(
                "`head_dim` ({}) must be even for rotary embeddings",
                self.head_dim()
            ));
        }
        if self.hidden_act != "silu" {
            return bad(format!(
                "`hidden_act` `{}` is not supported (only silu)",
                self.hidden_act
            ));
        }
        if self.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return bad("`rope_scaling` is not supported (must be absent or null)".into());
        }
        if self.use_sliding_window == Some(true) {
            return bad("`use_sliding_window = true` is not supported".into());
        }
        if self.rope_theta.is_nan()
            || self.rope_theta <= 0.0
            || self.rms_norm_eps.is_nan()
            || self.rms_norm_eps <= 0.0
        {
            return bad("`rope_theta` and `rms_norm_eps` must be > 0".into());
        }
        Ok(())
    }

    /// Key/value heads.
    pub fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Per-head width.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// Whether q/k/v projections carry a bias.
    pub fn qkv_bias(&self) -> bool {
        self.model_type == ModelType::Qwen2 || self.attention_bias
    }

    /// Whether the output projection carries a bias.
    pub fn o_bias(&self) -> bool {
        self.model_type != ModelType::Qwen2 && self.attention_bias
    }

    /// Whether q and k are RMS-normalised per head (Qwen3).
    pub fn qk_norm(&self) -> bool {
        self.model_type == ModelType::Qwen3
    }

    /// Token ids that end a generation according to the config (`eos_token_id`, int or list).
    pub fn eos_token_ids(&self) -> Vec<u32> {
        match &self.eos_token_id {
            Some(serde_json::Value::Number(n)) => {
                n.as_u64().map(|v| vec![v as u32]).unwrap_or_default()
            }
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .filter_map(|v| v.as_u64())
                .map(|v| v as u32)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The config as written to `config.json` (with `architectures` and `torch_dtype` filled in).
    pub fn to_hf_json(&self, torch_dtype: &str) -> serde_json::Value {
        let mut cfg = self.clone();
        cfg.extra.insert(
            "architectures".into(),
            serde_json::json!([self.model_type.architecture()]),
        );
        cfg.extra
            .insert("torch_dtype".into(), serde_json::json!(torch_dtype));
        cfg.extra
            .entry("use_cache".into())
            .or_insert(serde_json::json!(true));
        cfg.extra
            .entry("attention_dropout".into())
            .or_insert(serde_json::json!(0.0));
        // Always serialise the derived values explicitly so transformers agrees with us.
        cfg.num_key_value_heads = Some(self.num_kv_heads());
        cfg.head_dim = Some(self.head_dim());
        serde_json::to_value(&cfg).expect("ModelConfig serialises")
    }

    /// Number of parameters (counting a tied head once).
    pub fn num_parameters(&self) -> usize {
        parameter_shapes(self)
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }
}

/// Every parameter of the model described by `cfg`, with its Hugging Face name and shape, in a
/// stable order. A tied head has no `lm_head.weight`.
pub fn parameter_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let h = cfg.hidden_size;
    let hd = cfg.head_dim();
    let nh = cfg.num_attention_heads;
    let nkv = cfg.num_kv_heads();
    let i = cfg.intermediate_size;
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![cfg.vocab_size, h],
    )];
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        out.push((format!("{p}.input_layernorm.weight"), vec![h]));
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        for (name, rows) in [
            ("q_proj", nh * hd),
            ("k_proj", nkv * hd),
            ("v_proj", nkv * hd),
        ] {
            out.push((format!("{p}.self_attn.{name}.weight"), vec![rows, h]));
            if cfg.qkv_bias() {
                out.push((format!("{p}.self_attn.{name}.bias"), vec![rows]));
            }
        }
        out.push((format!("{p}.self_attn.o_proj.weight"), vec![h, nh * hd]));
        if cfg.o_bias() {
            out.push((format!("{p}.self_attn.o_proj.bias"), vec![h]));
        }
        if cfg.qk_norm() {
            out.push((format!("{p}.self_attn.q_norm.weight"), vec![hd]));
            out.push((format!("{p}.self_attn.k_norm.weight"), vec![hd]));
        }
        for (name, shape) in [
            ("gate_proj", [i, h]),
            ("up_proj", [i, h]),
            ("down_proj", [h, i]),
        ] {
            out.push((format!("{p}.mlp.{name}.weight"), shape.to_vec()));
            if cfg.mlp_bias {
                out.push((format!("{p}.mlp.{name}.bias"), vec![shape[0]]));
            }
        }
    }
    out.push(("model.norm.weight".to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![cfg.vocab_size, h]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_model_type_lists_supported() {
        let err = ModelConfig::from_json_str(r#"{"model_type": "gpt2", "vocab_size": 4}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("gpt2") && err.contains("qwen3, qwen2, llama"),
            "{err}"
        );
    }

    #[test]
    fn defaults_and_round_trip() {
        let cfg = ModelConfig::from_json_str(
            r#"{"model_type": "qwen3", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
                "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                "head_dim": 4, "transformers_version": "4.51.3"}"#,
        )
        .unwrap();
        assert_eq!(cfg.num_kv_heads(), 1);
        assert!(cfg.qk_norm() && !cfg.qkv_bias());
        assert_eq!(cfg.extra["transformers_version"], "4.51.3");
        let back = ModelConfig::from_json_str(&cfg.to_hf_json("float32").to_string()).unwrap();
        assert_eq!(back.vocab_size, 10);
        assert_eq!(back.extra["architectures"][0], "Qwen3ForCausalLM");
    }

    #[test]
    fn bad_heads_are_refused() {
        let err = ModelConfig::from_json_str(
            r#"{"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
                "num_hidden_layers": 1, "num_attention_heads": 3, "num_key_value_heads": 2}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("num_key_value_heads"), "{err}");
    }
}
