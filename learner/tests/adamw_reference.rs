//! AdamW + global-norm clipping against torch.optim.AdamW (scripts/grpo_reference.py).

mod common;

use anyhow::{Context, Result};
use candle_core::{Tensor, Var};
use cascade_learner::{AdamW, AdamWConfig, StepOutcome};
use common::{fixture_dir, load_fixture, max_abs_diff};

#[derive(serde::Deserialize)]
struct Settings {
    lrs: Vec<f64>,
    betas: [f64; 2],
    eps: f64,
    weight_decay: f64,
    max_grad_norm: f64,
    no_grad: std::collections::BTreeMap<String, Vec<String>>,
}

#[test]
fn adamw_matches_torch() -> Result<()> {
    let s: Settings =
        serde_json::from_str(&std::fs::read_to_string(fixture_dir().join("adamw.json"))?)?;
    let t = load_fixture("adamw.safetensors")?;
    let names = ["embed.weight", "lm_head.weight", "mix.weight"];
    let vars: Vec<(String, Var)> = names
        .iter()
        .map(|n| Ok((n.to_string(), Var::from_tensor(&t[&format!("init.{n}")])?)))
        .collect::<Result<_>>()?;
    let mut opt = AdamW::new(
        vars.clone(),
        AdamWConfig {
            beta1: s.betas[0],
            beta2: s.betas[1],
            eps: s.eps,
            weight_decay: s.weight_decay,
            max_grad_norm: Some(s.max_grad_norm),
            max_consecutive_skips: 3,
            ..AdamWConfig::default()
        },
    )?;
    for (k, lr) in s.lrs.iter().enumerate() {
        let skip = s.no_grad.get(&k.to_string()).cloned().unwrap_or_default();
        // loss = Σ ⟨var, g⟩ has gradient exactly g.
        let mut loss: Option<Tensor> = None;
        for (name, var) in &vars {
            if skip.contains(name) {
                continue;
            }
            let g = &t[&format!("grad.{k}.{name}")];
            let term = (var.as_tensor() * g)?.sum_all()?;
            loss = Some(match loss {
                None => term,
                Some(l) => (l + term)?,
            });
        }
        opt.accumulate(&loss.context("no gradients")?.backward()?)?;
        let out = opt.step(*lr, 0.0)?;
        assert!(matches!(out, StepOutcome::Applied { .. }), "{out:?}");
        for (name, var) in &vars {
            let want = &t[&format!("after.{k}.{name}")];
            let diff = max_abs_diff(var.as_tensor(), want)?;
            assert!(diff < 1e-6, "step {k}: {name} differs from torch by {diff}");
            // The step moved the weights (so the comparison is not vacuous).
            if !skip.contains(name) {
                let before = if k == 0 {
                    t[&format!("init.{name}")].clone()
                } else {
                    t[&format!("after.{}.{name}", k - 1)].clone()
                };
                assert!(max_abs_diff(&before, want)? > 1e-4);
            }
        }
    }
    assert_eq!(opt.steps(), s.lrs.len() as u64);
    Ok(())
}
