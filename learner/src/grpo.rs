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
//! * with a dual clip `c` ([`GrpoConfig::dual_clip`], Ye et al. 2020): for `A < 0` the
//!   surrogate is also bounded by `c·|A|`, `ℓ_t = min(ℓ_t, −c·A)` (before the TIS weight);
//! * with a KL coefficient `β > 0` and reference log-probs `r`, with `Δ = r − lp`:
//!   - [`KlEstimator::K3`] (TRL): `ℓ_t += β·k3(Δ)`, `k3(Δ) = exp(Δ) − Δ − 1`;
//!   - [`KlEstimator::K3Importance`]: `ℓ_t += β·w·k3(Δ)` with the stop-gradient importance
//!     weight `w = exp(sg(lp) − b)`. k3 is an unbiased estimate of KL(π_θ‖π_ref) only on
//!     tokens drawn from π_θ; the learner's tokens were drawn from the behaviour policy, and
//!     `E_b[w·k3] = E_θ[k3]`. On-policy `w = 1`: value and gradient equal K3's. Off-policy, when
//!     the behaviour policy is the reference (the first steps of a stage), the per-token
//!     gradient `w·(1 − exp(Δ)) = w − π_ref/π_b` is `w − 1 ≥ −1` instead of `1 − exp(Δ)`,
//!     which is unbounded when one update made a reference-likely token unlikely;
//!   - with a bound `δ` ([`GrpoConfig::kl_log_ratio_max`]): `k3` is continued linearly past
//!     `Δ = δ` (`k3(δ) + (e^δ − 1)(Δ − δ)`, same value and slope at `δ`) and `w ≤ e^δ`, so one
//!     token's KL gradient is at most `β·e^δ·(e^δ − 1)` whatever the batch holds.
//!
//! Aggregation over the (accumulated) batch, `m_t` the loss mask:
//! token-level `Σ m_t ℓ_t / Σ m_t` (the sum over all trained tokens of the batch) or
//! sequence-level `(1/N) Σ_seq (Σ_t m_t ℓ_t / max(1, Σ_t m_t))` with `N` the number of samples
//! (TRL's `loss_type="grpo"`; a fully masked sample contributes 0 and still counts in `N`).
//! Denominators come from the whole batch ([`LossNormaliser`]), never the micro-batch.
//! Everything is per target column (advantage, sequence denominator, masks), so a row may
//! hold one sample, padded, or several packed ones ([`crate::batch`]): the loss, its statistics
//! and its gradients are the same.

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

pub use crate::batch::LossAggregation;
use crate::batch::{BatchConfig, LossNormaliser, MicroBatch};
use crate::error::{LearnerError, Result};

/// How the per-token KL to the reference is estimated (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// `exp(r − lp) − (r − lp) − 1` on every trained token as it is (TRL's `GRPOTrainer`).
    #[default]
    K3,
    /// k3 weighted by the stop-gradient importance ratio `π_θ/π_behaviour` (DeepSeek-V3.2's
    /// unbiased KL estimate); equal to `K3` on-policy.
    K3Importance,
}

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
    /// Dual-clip constant `c > 1`: for a negative advantage the per-token surrogate loss is at
    /// most `c·|A|` however large the ratio; `None` = plain PPO clipping (TRL).
    pub dual_clip: Option<f32>,
    /// KL coefficient β to the frozen reference (0 = no KL term, no reference forward).
    pub kl_coef: f32,
    /// How the KL term is estimated.
    pub kl_estimator: KlEstimator,
    /// Bound `δ > 0` on the log-ratio `r − lp` inside the KL estimate (linear past it) and on
    /// the log of its importance weight; `None` = unbounded (TRL).
    pub kl_log_ratio_max: Option<f32>,
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
            dual_clip: None,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K3,
            kl_log_ratio_max: None,
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
        if let Some(c) = self.dual_clip {
            if !(c > 1.0 && c.is_finite()) {
                return bad(format!("dual_clip {c} must be > 1"));
            }
        }
        if let Some(delta) = self.kl_log_ratio_max {
            if !(delta > 0.0 && delta.is_finite()) {
                return bad(format!("kl_log_ratio_max {delta} must be > 0"));
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
    /// Trained tokens with a negative advantage whose surrogate the dual clip bounded.
    pub dual_clipped_tokens: f64,
    /// Sum over trained tokens of `exp(lp − b)`.
    pub ratio_sum: f64,
    /// Largest `exp(lp − b)` of a trained token.
    pub ratio_max: f64,
    /// Sum over trained tokens of the KL estimate the loss uses (0 without a reference).
    pub kl_sum: f64,
    /// Largest per-token KL estimate the loss uses.
    pub kl_max: f64,
    /// Trained tokens whose `r − lp` exceeded `kl_log_ratio_max` (linear part of the estimate).
    pub kl_bounded_tokens: f64,
    /// Largest `r − lp` of a trained token: how far below the reference the policy has pushed
    /// a sampled token, in nats (0 without a reference).
    pub ref_log_ratio_max: f64,
}

impl GrpoStats {
    /// Adds another micro-batch's statistics.
    pub fn add(&mut self, other: &GrpoStats) {
        self.loss += other.loss;
        self.tokens += other.tokens;
        self.clipped_tokens += other.clipped_tokens;
        self.dual_clipped_tokens += other.dual_clipped_tokens;
        self.ratio_sum += other.ratio_sum;
        self.ratio_max = self.ratio_max.max(other.ratio_max);
        self.kl_sum += other.kl_sum;
        self.kl_max = self.kl_max.max(other.kl_max);
        self.kl_bounded_tokens += other.kl_bounded_tokens;
        self.ref_log_ratio_max = self.ref_log_ratio_max.max(other.ref_log_ratio_max);
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

/// `k3(Δ) = exp(Δ) − Δ − 1` elementwise, continued linearly past `Δ = δ` when a bound is given:
/// `k3(δ) + (e^δ − 1)(Δ − δ)`, so its slope (the gradient's scale) never exceeds `e^δ − 1`.
fn k3(log_ratio: &Tensor, bound: Option<f32>) -> Result<Tensor> {
    let Some(delta) = bound else {
        return Ok(((log_ratio.exp()? - log_ratio)? - 1.0)?);
    };
    let inside = log_ratio.clamp(f32::MIN, delta)?;
    let curve = ((inside.exp()? - &inside)? - 1.0)?;
    let slope = f64::from(delta).exp() - 1.0;
    Ok((curve + ((log_ratio - &inside)? * slope)?)?)
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
    for (name, t) in [
        ("advantages", &batch.advantages),
        ("sample_tokens", &batch.sample_tokens),
        ("behaviour_logprobs", &batch.behaviour_logprobs),
    ] {
        if t.dims() != batch.loss_mask.dims() {
            return Err(LearnerError::InvalidBatch(format!(
                "{name} of shape {:?} for a micro-batch with targets {:?}",
                t.dims(),
                batch.loss_mask.dims()
            )));
        }
    }
    let mask = &batch.loss_mask;
    // Per target: the advantage of its sample (rows may hold several samples).
    let advantages = &batch.advantages;
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

    // 2. Clipped surrogate: −min(ratio·A, clip(ratio)·A), and for A < 0 at most −c·A.
    let clipped = ratio.clamp(1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)?;
    let unclipped_term = (&ratio * advantages)?;
    let clipped_term = (&clipped * advantages)?;
    let mut per_token = unclipped_term.minimum(&clipped_term)?.neg()?;
    let mut dual_clipped_tokens = 0.0;
    if let Some(c) = cfg.dual_clip {
        // The bound per token: −c·A where A < 0, none (f32::MAX) otherwise.
        let none = Tensor::full(f32::MAX, advantages.shape(), advantages.device())?;
        let bound = advantages
            .lt(0f32)?
            .where_cond(&(advantages * -f64::from(c))?, &none)?;
        let over = per_token.detach().gt(&bound)?.to_dtype(DType::F32)?;
        dual_clipped_tokens = scalar(&(over * mask)?.sum_all()?)?;
        // The gradient flows to the constant bound where it is taken: none reaches lp.
        per_token = per_token.minimum(&bound)?;
    }
    if let Some(w) = &tis_weight {
        per_token = (per_token * w)?;
    }

    // 3. KL to the reference. Log-ratios are zeroed off the trained tokens, where log-probs are
    // arbitrary, so that exp cannot overflow there (inf · 0 would be NaN).
    let (mut kl_sum, mut kl_max, mut kl_bounded_tokens, mut ref_log_ratio_max) =
        (0.0, 0.0, 0.0, 0.0);
    if cfg.kl_coef > 0.0 {
        let reference = ref_logprobs.ok_or_else(|| {
            LearnerError::InvalidBatch("kl_coef > 0 but no reference log-probs".into())
        })?;
        let log_ratio = ((reference.to_dtype(DType::F32)? - &logprobs)? * mask)?;
        let mut kl = k3(&log_ratio, cfg.kl_log_ratio_max)?;
        if cfg.kl_estimator == KlEstimator::K3Importance {
            let log_w = ((&detached - behaviour)? * mask)?;
            let log_w = match cfg.kl_log_ratio_max {
                Some(delta) => log_w.clamp(f32::MIN, delta)?,
                None => log_w,
            };
            kl = kl.broadcast_mul(&log_w.exp()?)?;
        }
        let kl_detached = (kl.detach() * mask)?;
        kl_sum = scalar(&kl_detached.sum_all()?)?;
        kl_max = scalar(&kl_detached.max_all()?)?;
        ref_log_ratio_max = scalar(&log_ratio.detach().max_all()?)?;
        if let Some(delta) = cfg.kl_log_ratio_max {
            let beyond = log_ratio.detach().gt(delta as f64)?.to_dtype(DType::F32)?;
            kl_bounded_tokens = scalar(&(beyond * mask)?.sum_all()?)?;
        }
        per_token = (per_token + (kl * cfg.kl_coef as f64)?)?;
    }

    // 4. Aggregate with the batch-wide denominator.
    let masked = (per_token * mask)?;
    let loss = match normaliser {
        LossNormaliser::Tokens(n) => (masked.sum_all()? / n as f64)?,
        LossNormaliser::Sequences(n) => {
            // Each trained token divided by its own sample's trained-token count: the sum is
            // Σ_seq (Σ_t m_t ℓ_t / max(1, Σ_t m_t)) whichever samples share a row.
            let per_seq_tokens = batch.sample_tokens.clamp(1f32, f32::MAX)?;
            (masked.div(&per_seq_tokens)?.sum_all()? / n as f64)?
        }
    };

    // 5. Detached statistics.
    let was_clipped = unclipped_term
        .detach()
        .gt(&clipped_term.detach())?
        .to_dtype(DType::F32)?;
    let trained_ratio = (behaviour_ratio * mask)?;
    let stats = GrpoStats {
        loss: scalar(&loss)?,
        tokens: scalar(&mask.sum_all()?)?,
        clipped_tokens: scalar(&(was_clipped * mask)?.sum_all()?)?,
        dual_clipped_tokens,
        ratio_sum: scalar(&trained_ratio.sum_all()?)?,
        ratio_max: scalar(&trained_ratio.max_all()?)?,
        kl_sum,
        kl_max,
        kl_bounded_tokens,
        ref_log_ratio_max,
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
            advantages: Tensor::new(&[[0f32, adv]], &d).unwrap(),
            sample_tokens: Tensor::new(&[[0f32, 1.0]], &d).unwrap(),
            temperatures: vec![1.0],
            selected: Tensor::new(&[1u32], &d).unwrap(),
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

    /// Loss and d loss / d lp of the trained token for a KL-only objective (A = 0).
    fn kl_only(cfg: &GrpoConfig, lp: f32, behaviour: f32, reference: f32) -> (GrpoStats, f32) {
        let d = Device::Cpu;
        let var = candle_core::Var::new(&[[0f32, lp]], &d).unwrap();
        let reference = Tensor::new(&[[0f32, reference]], &d).unwrap();
        let out = grpo_loss(
            var.as_tensor(),
            &micro(0.0, behaviour),
            Some(&reference),
            cfg,
            LossNormaliser::Tokens(1.0),
        )
        .unwrap();
        let g = out.loss.backward().unwrap();
        let grad = g.get(&var).unwrap().to_vec2::<f32>().unwrap()[0][1];
        (out.stats, grad)
    }

    #[test]
    fn importance_weighted_k3_is_k3_on_policy_and_bounded_off_policy() {
        let k3 = GrpoConfig {
            kl_coef: 1.0,
            ..GrpoConfig::default()
        };
        let weighted = GrpoConfig {
            kl_estimator: KlEstimator::K3Importance,
            ..k3.clone()
        };
        // On-policy (lp = b): the same value and gradient.
        let (a, ga) = kl_only(&k3, -1.0, -1.0, -0.5);
        let (b, gb) = kl_only(&weighted, -1.0, -1.0, -0.5);
        assert!((a.loss - b.loss).abs() < 1e-7 && (ga - gb).abs() < 1e-7);
        assert!((a.loss - (0.5f64.exp() - 1.5)).abs() < 1e-6, "{a:?}");

        // The second step of a stage: the reference sampled the token (b = r = −0.5) and one
        // update pushed it to lp = −3. k3 = e^2.5 − 3.5, gradient 1 − e^2.5 = −11.18; weighted by
        // w = e^−2.5: value w·k3 and gradient w − 1 = −0.918.
        let (a, ga) = kl_only(&k3, -3.0, -0.5, -0.5);
        let (b, gb) = kl_only(&weighted, -3.0, -0.5, -0.5);
        let k3_value = 2.5f64.exp() - 3.5;
        let w = (-2.5f64).exp();
        assert!((a.loss - k3_value).abs() < 1e-5, "{a:?}");
        assert!((ga as f64 - (1.0 - 2.5f64.exp())).abs() < 1e-5, "{ga}");
        assert!((b.loss - w * k3_value).abs() < 1e-6, "{b:?}");
        assert!((gb as f64 - (w - 1.0)).abs() < 1e-6, "{gb}");
        assert!((b.kl_max - w * k3_value).abs() < 1e-6 && (b.ref_log_ratio_max - 2.5).abs() < 1e-6);
    }

    #[test]
    fn bounded_k3_is_linear_past_the_bound() {
        let cfg = GrpoConfig {
            kl_coef: 1.0,
            kl_log_ratio_max: Some(1.0),
            ..GrpoConfig::default()
        };
        let e = 1f64.exp();
        // Δ = 2.5 > δ = 1: k3(1) + (e − 1)(2.5 − 1), slope e − 1.
        let (s, g) = kl_only(&cfg, -3.0, -3.0, -0.5);
        assert!(
            (s.loss - ((e - 2.0) + (e - 1.0) * 1.5)).abs() < 1e-5,
            "{s:?}"
        );
        assert!((g as f64 + (e - 1.0)).abs() < 1e-5, "{g}");
        assert_eq!(s.kl_bounded_tokens, 1.0);
        // Inside the bound it is k3.
        let (s, g) = kl_only(&cfg, -1.0, -1.0, -0.5);
        assert!((s.loss - (0.5f64.exp() - 1.5)).abs() < 1e-6);
        assert!((g as f64 - (1.0 - 0.5f64.exp())).abs() < 1e-6);
        assert_eq!(s.kl_bounded_tokens, 0.0);
        // The importance weight is capped at e^δ: lp − b = 2 → w = e.
        let weighted = GrpoConfig {
            kl_estimator: KlEstimator::K3Importance,
            ..cfg
        };
        let (s, g) = kl_only(&weighted, -1.0, -3.0, -1.5);
        let k3 = (-0.5f64).exp() + 0.5 - 1.0;
        assert!((s.loss - e * k3).abs() < 1e-5, "{s:?}");
        assert!((g as f64 - e * (1.0 - (-0.5f64).exp())).abs() < 1e-5, "{g}");
        assert!((s.ratio_max - 2f64.exp()).abs() < 1e-5);
    }

    #[test]
    fn dual_clip_bounds_negative_advantages() {
        let cfg = GrpoConfig {
            dual_clip: Some(3.0),
            ..GrpoConfig::default()
        };
        let lp = candle_core::Var::new(&[[0f32, -1.0]], &Device::Cpu).unwrap();
        // ratio = e^1.5 ≈ 4.48 > 3 with A = −1: loss 3·|A|, no gradient.
        let out = grpo_loss(
            lp.as_tensor(),
            &micro(-1.0, -2.5),
            None,
            &cfg,
            LossNormaliser::Tokens(1.0),
        )
        .unwrap();
        assert!((out.stats.loss - 3.0).abs() < 1e-6, "{:?}", out.stats);
        assert_eq!(out.stats.dual_clipped_tokens, 1.0);
        let g = out.loss.backward().unwrap();
        assert_eq!(g.get(&lp).unwrap().to_vec2::<f32>().unwrap()[0][1], 0.0);
        // Below c it is plain PPO: ratio e^0.5, loss ratio·|A|, gradient ratio.
        let out = grpo_loss(
            lp.as_tensor(),
            &micro(-1.0, -1.5),
            None,
            &cfg,
            LossNormaliser::Tokens(1.0),
        )
        .unwrap();
        assert!((out.stats.loss - 0.5f64.exp()).abs() < 1e-6);
        assert_eq!(out.stats.dual_clipped_tokens, 0.0);
        let g = out.loss.backward().unwrap();
        let grad = g.get(&lp).unwrap().to_vec2::<f32>().unwrap()[0][1];
        assert!((grad - 0.5f32.exp()).abs() < 1e-6);
        // A > 0 is untouched (clipped at 1 + ε_high as before).
        let out = grpo_loss(
            lp.as_tensor(),
            &micro(1.0, -2.5),
            None,
            &cfg,
            LossNormaliser::Tokens(1.0),
        )
        .unwrap();
        assert!((out.stats.loss + 1.28).abs() < 1e-6);
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
        let bad = GrpoConfig {
            dual_clip: Some(1.0),
            ..GrpoConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = GrpoConfig {
            kl_log_ratio_max: Some(0.0),
            ..GrpoConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}
