//! GRPO loss and gradients against the PyTorch reference (scripts/grpo_reference.py, TRL's
//! formula) on the same stand-in model and batch; gradient accumulation over micro-batches
//! must reproduce the full-batch gradient.

mod common;

use anyhow::{Context, Result};
use candle_core::Device;
use cascade_learner::filter::{FilterConfig, GroupFilter};
use cascade_learner::train_step::accumulate_grpo_gradients;
use cascade_learner::{AdamW, AdamWConfig, GrpoBatch, GrpoConfig};
use cascade_shared::RolloutGroup;
use common::{fixture_dir, load_fixture, max_abs_diff, stand_in, varmap_from};

fn load_groups() -> Result<Vec<RolloutGroup>> {
    let path = fixture_dir().join("groups.json");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    Ok(serde_json::from_str(&text)?)
}

#[test]
fn grpo_gradients_match_pytorch_reference() -> Result<()> {
    let groups = load_groups()?;
    // The reference batch is valid input: every group passes the learner's filter.
    let mut filter = GroupFilter::new(FilterConfig {
        max_staleness: 0,
        drop_equal_rewards: true,
        vocab_size: 32,
        stage_index: groups[0].stage_index,
        no_signal_groups: 0,
    })?;
    for g in &groups {
        filter.admit(g, 3).map_err(|r| anyhow::anyhow!("{r}"))?;
    }

    let cases: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(fixture_dir().join("cases.json"))?)?;
    assert!(cases.len() >= 3);
    let ref_vars = varmap_from(&fixture_dir().join("reference.safetensors"))?;
    let reference = stand_in(&ref_vars)?;

    for (name, cfg) in &cases {
        let cfg: GrpoConfig = serde_json::from_value(cfg.clone()).context(name.clone())?;
        cfg.validate()?;
        let expected = load_fixture(&format!("expected_{name}.safetensors"))?;
        let batch = GrpoBatch::from_groups(&groups, &cfg)?;
        assert_eq!(batch.len(), 12);

        let mut full_batch_grads = None;
        // All rows at once, uneven micro-batches, one row at a time.
        for micro_batch in [12, 5, 1] {
            let vars = varmap_from(&fixture_dir().join("policy.safetensors"))?;
            let policy = stand_in(&vars)?;
            let mut opt = AdamW::from_varmap(&vars, AdamWConfig::default())?;
            let stats = accumulate_grpo_gradients(
                &policy,
                Some(&reference),
                &batch,
                micro_batch,
                &cfg,
                &mut opt,
                &Device::Cpu,
            )?;
            let want_loss = expected["loss"].to_vec1::<f32>()?[0] as f64;
            assert!(
                (stats.loss - want_loss).abs() < 1e-5,
                "{name} micro {micro_batch}: loss {} vs reference {want_loss}",
                stats.loss
            );
            let mut grads = Vec::new();
            for param in ["embed.weight", "mix.weight", "lm_head.weight"] {
                let got = opt
                    .grad(param)
                    .with_context(|| format!("no grad for {param}"))?;
                let want = &expected[&format!("grad.{param}")];
                let diff = max_abs_diff(&got, want)?;
                assert!(
                    diff < 1e-4,
                    "{name} micro {micro_batch}: {param} differs from PyTorch by {diff}"
                );
                // The gradients are not trivially zero.
                let scale = want
                    .abs()?
                    .max_keepdim(0)?
                    .max_keepdim(1)?
                    .flatten_all()?
                    .to_vec1::<f32>()?[0];
                assert!(scale > 1e-3, "{name}: reference gradient of {param} is ~0");
                grads.push(got.clone());
            }
            match &full_batch_grads {
                None => full_batch_grads = Some(grads),
                Some(full) => {
                    for (a, b) in full.iter().zip(&grads) {
                        let diff = max_abs_diff(a, b)?;
                        assert!(
                            diff < 1e-6,
                            "{name}: micro-batch {micro_batch} accumulation differs from the full batch by {diff}"
                        );
                    }
                }
            }
        }
    }
    Ok(())
}
