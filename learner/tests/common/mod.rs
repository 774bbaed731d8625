//! Shared test helpers: a tiny stand-in causal LM (defined identically in
//! `scripts/grpo_reference.py`) and fixture loading.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{VarBuilder, VarMap};
use cascade_learner::PolicyModel;

/// `tests/fixtures/grpo/` at the repository root.
pub fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/grpo")
}

/// Per sequence x_0..x_{t-1} (padding excluded by the mask):
/// `e_i = E[x_i]; c_i = mean_{j ≤ i, real} e_j; h_i = tanh(e_i + c_i Mᵀ); logits_i = h_i Uᵀ`.
pub struct StandInLm {
    embed: Tensor,
    mix: Tensor,
    lm_head: Tensor,
}

impl StandInLm {
    /// Built the candle-transformers way, from a `VarBuilder` over a `VarMap`.
    pub fn new(vocab: usize, hidden: usize, vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(StandInLm {
            embed: vb.get((vocab, hidden), "embed.weight")?,
            mix: vb.get((hidden, hidden), "mix.weight")?,
            lm_head: vb.get((vocab, hidden), "lm_head.weight")?,
        })
    }
}

impl PolicyModel for StandInLm {
    fn token_logprobs(&self, ids: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let hidden = self.embed.dim(1)?;
        // 1. Embeddings, with padding zeroed for the prefix sums.  (b, t, d)
        let x = self
            .embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, hidden))?;
        let m = mask.to_dtype(DType::F32)?.unsqueeze(2)?; // (b, t, 1)
        let tril = Tensor::tril2(t, DType::F32, ids.device())?; // (t, t)
        let sums = tril.broadcast_matmul(&x.broadcast_mul(&m)?)?; // (b, t, d)
        let counts = tril.broadcast_matmul(&m)?.clamp(1f32, f32::MAX)?; // (b, t, 1)
        let prefix = sums.broadcast_div(&counts)?;
        // 2. Mix and project.  (b, t, vocab)
        let h = (x + prefix.broadcast_matmul(&self.mix.t()?)?)?.tanh()?;
        let logits = h.broadcast_matmul(&self.lm_head.t()?)?;
        // 3. Log-prob of each next token.  (b, t-1)
        let logp = candle_nn::ops::log_softmax(&logits.narrow(1, 0, t - 1)?, D::Minus1)?;
        let targets = ids.narrow(1, 1, t - 1)?.contiguous()?.unsqueeze(2)?;
        logp.gather(&targets, 2)?.squeeze(2)
    }
}

/// Loads a safetensors file's tensors into a fresh `VarMap` (one `Var` per tensor, f32).
pub fn varmap_from(path: &std::path::Path) -> Result<VarMap> {
    let tensors = candle_core::safetensors::load(path, &Device::Cpu)
        .with_context(|| format!("loading {}", path.display()))?;
    let varmap = VarMap::new();
    {
        let mut data = varmap.data().lock().unwrap();
        for (name, t) in tensors {
            data.insert(name, Var::from_tensor(&t.to_dtype(DType::F32)?)?);
        }
    }
    Ok(varmap)
}

/// The stand-in model over `varmap` (vocab and hidden size from the embedding).
pub fn stand_in(varmap: &VarMap) -> Result<StandInLm> {
    let (vocab, hidden) = varmap.data().lock().unwrap()["embed.weight"].dims2()?;
    let vb = VarBuilder::from_varmap(varmap, DType::F32, &Device::Cpu);
    Ok(StandInLm::new(vocab, hidden, vb)?)
}

/// All tensors of a fixture file.
pub fn load_fixture(name: &str) -> Result<BTreeMap<String, Tensor>> {
    let path = fixture_dir().join(name);
    let map = candle_core::safetensors::load(&path, &Device::Cpu).with_context(|| {
        format!(
            "loading {} (regenerate with scripts/grpo_reference.py)",
            path.display()
        )
    })?;
    Ok(map.into_iter().collect())
}

/// max |a − b| over all elements.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    anyhow::ensure!(
        a.dims() == b.dims(),
        "shapes {:?} vs {:?}",
        a.dims(),
        b.dims()
    );
    Ok((a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()?)
}
