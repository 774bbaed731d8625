//! The GRPO objective (TRL's `GRPOTrainer` formula, with DAPO's asymmetric clip).
//!
//! Per response token `t` of a sample with advantage `A`, with `lp` the current policy's
//! log-prob, `b` the behaviour log-prob from the rollout and `sg` stop-gradient:
//!
//! * without a TIS cap: `ratio = exp(lp − b)` and
//!   `ℓ_t = −min(ratio·A, clip(ratio, 1 − ε_low, 1 + ε_high)·A)`;
//! * with a TIS cap `C` (truncated importance sampling, TRL's
//!   `vllm_importance_sampling_correction` with one update per batch): the PPO ratio is taken
//!   against the learner's own current log-probs, `ratio = exp(lp − sg(lp))` (= 1 in value,
//!   gradient `∇lp`), and the behaviour mismatch enters as a truncated, stop-gradient weight
//!   `w = min(exp(sg(lp) − b), C)`: `ℓ_t = −w·min(ratio·A, clip(ratio, …)·A)`;
//! * with a KL coefficient `β > 0` and reference log-probs `r` (k3 estimator):
//!   `ℓ_t += β·(exp(r − lp) − (r − lp) − 1)`.
//!
//! Aggregation over the (accumulated) batch, `m_t` the loss mask:
//! token-level `Σ m_t ℓ_t / Σ m_t` (the sum over all trained tokens of the batch) or
//! sequence-level `(1/N) Σ_seq (Σ_t m_t ℓ_t / max(1, Σ_t m_t))` with `N` the number of samples
//! (TRL's `loss_type="grpo"`; a fully masked sample contributes 0 and still counts in `N`).
//! Denominators come from the whole batch ([`LossNormaliser`]), never the micro-batch.

use candle_core::{DType, Tensor, D};
use serde::{Deserialize, Serialize};

pub use crate::batch::LossAggregation;
use crate::batch::{BatchConfig, LossNormaliser, MicroBatch};
use crate::error::{LearnerError, Result};

/// GRPO settings of one stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpoConfig {
    /// Divide centred rewards by the group's std (`false`: Dr. GRPO-style, centre only).
    pub scale_by_std: bool,
    /// Added to the std before dividing.
    pub advantage_eps: f32,
    /// Lower clip range ε_low: the ratio is clipped at `1 − ε_low`.
    pub clip_eps_low: f32,
    /// Upper clip range ε_high: the ratio is clipped at `1 + ε_high` (DAPO's clip-higher).
    pub clip_eps_high: f32,
    /// Truncated-importance-sampling cap `C`; `None` = ratio against the behaviour policy.
    pub tis_cap: Option<f32>,
    /// KL coefficient β to the frozen reference (0 = no KL term, no reference forward).
    pub kl_coef: f32,
    /// Token- or sequence-level aggregation.
    pub aggregation: LossAggregation,
    /// Give samples that hit the length limit zero loss weight (overlong masking).
    pub mask_truncated: bool,
}

impl Default for GrpoConfig {
    fn default() -> Self {
        GrpoConfig {
            scale_by_std: true,
            advantage_eps: 1e-4,
            clip_eps_low: 0.2,
            clip_eps_high: 0.28,
            tis_cap: None,
            kl_coef: 0.0,
            aggregation: LossAggregation::Token,
            mask_truncated: true,
        }
    }
}

impl From<&GrpoConfig> for BatchConfig {
    fn from(cfg: &GrpoConfig) -> Self {
        BatchConfig {
            scale_by_std: cfg.scale_by_std,
            advantage_eps: cfg.advantage_eps,
            mask_truncated: cfg.mask_truncated,
            aggregation: cfg.aggregation,
        }
    }
}

impl GrpoConfig {
    /// Checks ranges; call once at start-up.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(LearnerError::InvalidConfig(msg));
        if !(self.clip_eps_low >= 0.0 && self.clip_eps_low < 1.0) {
            return bad(format!(
                "clip_eps_low {} must be in [0, 1)",
                self.clip_eps_low
            ));
        }
        if !(self.clip_eps_high >= 0.0 && self.clip_eps_high.is_finite()) {
            return bad(format!("clip_eps_high {} must be ≥ 0", self.clip_eps_high));
        }
        if !(self.advantage_eps >= 0.0 && self.advantage_eps.is_finite()) {
            return bad(format!("advantage_eps {} must be ≥ 0", self.advantage_eps));
        }
        if !(self.kl_coef >= 0.0 && self.kl_coef.is_finite()) {
            return bad(format!("kl_coef {} must be ≥ 0", self.kl_coef));
        }
        if let Some(cap) = self.tis_cap {
            if !(cap > 0.0 && cap.is_finite()) {
                return bad(format!("tis_cap {cap} must be > 0"));
            }
        }
        Ok(())
    }
}

/// Detached per-micro-batch statistics, summed over micro-batches by the caller.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GrpoStats {
    /// The loss value of this micro-batch (its share of the batch loss).
    pub loss: f64,
    /// Trained tokens.
    pub tokens: f64,
    /// Trained tokens whose clipped branch was taken (the gradient through the ratio is zero).
    pub clipped_tokens: f64,
    /// Sum over trained tokens of `exp(lp − b)`.
    pub ratio_sum: f64,
    /// Sum over trained tokens of the k3 KL estimate (0 without a reference).
    pub kl_sum: f64,
}

impl GrpoStats {
    /// Adds another micro-batch's statistics.
    pub fn add(&mut self, other: &GrpoStats) {
        self.loss += other.loss;
        self.tokens += other.tokens;
        self.clipped_tokens += other.clipped_tokens;
        self.ratio_sum += other.ratio_sum;
        self.kl_sum += other.kl_sum;
    }
}

/// The loss of one micro-batch (to call `backward` on) and its statistics.
#[derive(Debug)]
pub struct GrpoLoss {
    /// Scalar f32 loss; its gradients summed over micro-batches are the batch gradient.
    pub loss: Tensor,
    /// Detached statistics.
    pub stats: GrpoStats,
}

fn scalar(t: &Tensor) -> Result<f64> {
    Ok(t.to_dtype(DType::F64)?.to_scalar::<f64>()?)
}

/// The GRPO loss of one micro-batch.
///
/// * `logprobs`: `(b, t − 1)` current-policy log-probs from [`crate::PolicyModel`].
/// * `ref_logprobs`: `(b, t − 1)` reference log-probs, required when `cfg.kl_coef > 0`.
pub fn grpo_loss(
    logprobs: &Tensor,
    batch: &MicroBatch,
    ref_logprobs: Option<&Tensor>,
    cfg: &GrpoConfig,
    normaliser: LossNormaliser,
) -> Result<GrpoLoss> {
    let logprobs = logprobs.to_dtype(DType::F32)?;
    if logprobs.dims() != batch.loss_mask.dims() {
        return Err(LearnerError::InvalidBatch(format!(
            "log-probs of shape {:?} for a micro-batch with targets {:?}",
            logprobs.dims(),
            batch.loss_mask.dims()
        )));
    }
    let mask = &batch.loss_mask;
    let advantages = batch.advantages.unsqueeze(1)?; // (b, 1)
    let behaviour = &batch.behaviour_logprobs;

    // 1. Importance ratio and (optionally) the truncated importance weight.
    let detached = logprobs.detach();
    let behaviour_ratio = (&detached - behaviour)?.exp()?; // (b, t-1), no gradient
    let (ratio, tis_weight) = match cfg.tis_cap {
        None => ((&logprobs - behaviour)?.exp()?, None),
        Some(cap) => (
            (&logprobs - &detached)?.exp()?,
            Some(behaviour_ratio.clamp(f32::MIN, cap)?),
        ),
    };

    // 2. Clipped surrogate: −min(ratio·A, clip(ratio)·A).
    let clipped = ratio.clamp(1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)?;
    let unclipped_term = ratio.broadcast_mul(&advantages)?;
    let clipped_term = clipped.broadcast_mul(&advantages)?;
    let mut per_token = unclipped_term.minimum(&clipped_term)?.neg()?;
    if let Some(w) = &tis_weight {
        per_token = (per_token * w)?;
    }

    // 3. k3 KL to the reference.
    let mut kl_sum = 0.0;
    if cfg.kl_coef > 0.0 {
        let reference = ref_logprobs.ok_or_else(|| {
            LearnerError::InvalidBatch("kl_coef > 0 but no reference log-probs".into())
        })?;
        let delta = (reference.to_dtype(DType::F32)? - &logprobs)?;
        let kl = ((delta.exp()? - &delta)? - 1.0)?;
        kl_sum = scalar(&(kl.detach() * mask)?.sum_all()?)?;
        per_token = (per_token + (kl * cfg.kl_coef as f64)?)?;
    }

    // 4. Aggregate with the batch-wide denominator.
    let masked = (per_token * mask)?;
    let loss = match normaliser {
        LossNormaliser::Tokens(n) => (masked.sum_all()? / n as f64)?,
        LossNormaliser::Sequences(n) => {
            let per_seq_tokens = mask.sum(D::Minus1)?.clamp(1f32, f32::MAX)?;
            (masked.sum(D::Minus1)?.div(&per_seq_tokens)?.sum_all()? / n as f64)?
        }
    };

    // 5. Detached statistics.
    let was_clipped = unclipped_term
        .detach()
        .gt(&clipped_term.detach())?
        .to_dtype(DType::F32)?;
    let stats = GrpoStats {
        loss: scalar(&loss)?,
        tokens: scalar(&mask.sum_all()?)?,
        clipped_tokens: scalar(&(was_clipped * mask)?.sum_all()?)?,
        ratio_sum: scalar(&(behaviour_ratio * mask)?.sum_all()?)?,
        kl_sum,
    };
    Ok(GrpoLoss { loss, stats })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn micro(adv: f32, behaviour: f32) -> MicroBatch {
        let d = Device::Cpu;
        MicroBatch {
            input_ids: Tensor::zeros((1, 3), DType::U32, &d).unwrap(),
            attention_mask: Tensor::ones((1, 3), DType::U8, &d).unwrap(),
            loss_mask: Tensor::new(&[[0f32, 1.0]], &d).unwrap(),
            behaviour_logprobs: Tensor::new(&[[0f32, behaviour]], &d).unwrap(),
            advantages: Tensor::new(&[adv], &d).unwrap(),
            temperatures: vec![1.0],
        }
    }

    #[test]
    fn clipped_branch_has_no_gradient_and_unclipped_is_ratio_times_advantage() {
        let cfg = GrpoConfig::default();
        // ratio = e^0.5 ≈ 1.65 > 1.28 with A > 0: clipped, gradient 0.
        let lp = candle_core::Var::new(&[[0f32, -1.0]], &Device::Cpu).unwrap();
        let mb = micro(1.0, -1.5);
        let out = grpo_loss(lp.as_tensor(), &mb, None, &cfg, LossNormaliser::Tokens(1.0)).unwrap();
        assert!((out.stats.loss + 1.28).abs() < 1e-6, "{:?}", out.stats);
        assert_eq!(out.stats.clipped_tokens, 1.0);
        let g = out.loss.backward().unwrap();
        assert_eq!(
            g.get(&lp).unwrap().to_vec2::<f32>().unwrap(),
            vec![vec![0.0, 0.0]]
        );

        // Same ratio, A < 0: the unclipped branch is the min; d/dlp −ratio·A = ratio.
        let mb = micro(-1.0, -1.5);
        let out = grpo_loss(lp.as_tensor(), &mb, None, &cfg, LossNormaliser::Tokens(2.0)).unwrap();
        let g = out.loss.backward().unwrap();
        let grad = g.get(&lp).unwrap().to_vec2::<f32>().unwrap()[0][1];
        assert!((grad - 0.5f32.exp() / 2.0).abs() < 1e-6, "{grad}");
    }

    #[test]
    fn tis_weight_is_truncated_and_ratio_is_one() {
        let cfg = GrpoConfig {
            tis_cap: Some(1.5),
            ..GrpoConfig::default()
        };
        let lp = candle_core::Var::new(&[[0f32, -1.0]], &Device::Cpu).unwrap();
        // exp(−1 − (−2)) = e > 1.5: weight 1.5, loss −1.5·A.
        let mb = micro(2.0, -2.0);
        let out = grpo_loss(lp.as_tensor(), &mb, None, &cfg, LossNormaliser::Tokens(1.0)).unwrap();
        assert!((out.stats.loss + 3.0).abs() < 1e-6, "{:?}", out.stats);
        let g = out.loss.backward().unwrap();
        let grad = g.get(&lp).unwrap().to_vec2::<f32>().unwrap()[0][1];
        assert!((grad + 3.0).abs() < 1e-6, "{grad}");
    }

    #[test]
    fn kl_term_is_k3() {
        let cfg = GrpoConfig {
            kl_coef: 0.5,
            ..GrpoConfig::default()
        };
        let d = Device::Cpu;
        let lp = Tensor::new(&[[0f32, -1.0]], &d).unwrap();
        let reference = Tensor::new(&[[0f32, -0.5]], &d).unwrap();
        let mb = micro(0.0, -1.0);
        let out = grpo_loss(
            &lp,
            &mb,
            Some(&reference),
            &cfg,
            LossNormaliser::Tokens(1.0),
        )
        .unwrap();
        let k3 = 0.5f64.exp() - 0.5 - 1.0;
        assert!((out.stats.kl_sum - k3).abs() < 1e-6);
        assert!((out.stats.loss - 0.5 * k3).abs() < 1e-6);
        assert!(grpo_loss(&lp, &mb, None, &cfg, LossNormaliser::Tokens(1.0)).is_err());
    }

    #[test]
    fn validate_rejects_bad_ranges() {
        assert!(GrpoConfig::default().validate().is_ok());
        let bad = GrpoConfig {
            clip_eps_low: 1.0,
            ..GrpoConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = GrpoConfig {
            tis_cap: Some(0.0),
            ..GrpoConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}
