//! GRPO gradients through the real model (`cascade_shared::model::CausalLm`, a tiny Qwen3)
//! against transformers' Qwen3ForCausalLM + the TRL formula (scripts/grpo_reference.py).

mod common;

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use cascade_learner::train_step::accumulate_grpo_gradients;
use cascade_learner::{AdamW, AdamWConfig, GrpoBatch, GrpoConfig};
use cascade_shared::model::{CausalLm, ModelConfig};
use cascade_shared::RolloutGroup;
use common::{fixture_dir, load_fixture, max_abs_diff, varmap_from};

#[test]
fn qwen3_grpo_gradients_match_transformers() -> Result<()> {
    let dir = fixture_dir().join("qwen3");
    let model_cfg = ModelConfig::from_file(&dir.join("config.json"))?;
    let groups: Vec<RolloutGroup> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("groups.json"))?)?;
    let cases: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(fixture_dir().join("cases.json"))?)?;
    let ref_vars = varmap_from(&dir.join("reference.safetensors"))?;
    let reference = CausalLm::new(
        &model_cfg,
        VarBuilder::from_varmap(&ref_vars, DType::F32, &Device::Cpu),
    )?;
    let mut checked = 0;
    for name in ["token_std_kl_overlong", "sequence_nostd_tis"] {
        let cfg: GrpoConfig = serde_json::from_value(cases[name].clone())?;
        let expected = load_fixture(&format!("qwen3/expected_{name}.safetensors"))?;
        let batch = GrpoBatch::from_groups(&groups, &cfg)?;
        let vars = varmap_from(&dir.join("policy.safetensors"))?;
        let policy = CausalLm::new(
            &model_cfg,
            VarBuilder::from_varmap(&vars, DType::F32, &Device::Cpu),
        )?;
        let mut opt = AdamW::from_varmap(&vars, AdamWConfig::default())?;
        let stats = accumulate_grpo_gradients(
            &policy,
            Some(&reference),
            &batch,
            5,
            &cfg,
            &mut opt,
            &Device::Cpu,
        )?;
        let want_loss = expected["loss"].to_vec1::<f32>()?[0] as f64;
        assert!(
            (stats.loss - want_loss).abs() < 1e-5,
            "{name}: loss {} vs transformers {want_loss}",
            stats.loss
        );
        for (key, want) in &expected {
            let Some(param) = key.strip_prefix("grad.") else {
                continue;
            };
            let got = opt
                .grad(param)
                .with_context(|| format!("{name}: no gradient for {param}"))?;
            let diff = max_abs_diff(&got, want)?;
            assert!(
                diff < 1e-4,
                "{name}: {param} differs from transformers by {diff}"
            );
            checked += 1;
        }
    }
    // 2 layers × 11 tensors + embed + norm + lm_head, for two cases.
    assert_eq!(checked, 2 * 25);
    Ok(())
}
