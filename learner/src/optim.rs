//! AdamW with f32 master weights, gradient accumulation, global-norm clipping and NaN/inf guards.
//!
//! The update is `torch.optim.AdamW`'s (`_single_tensor_adamw`), per parameter `p` with gradient
//! `g` at step `k` (1-based):
//!
//! ```text
//! p ← p · (1 − lr · wd)
//! m ← β1 · m + (1 − β1) · g
//! v ← β2 · v + (1 − β2) · g²
//! p ← p − (lr / (1 − β1^k)) · m / (√v / √(1 − β2^k) + eps)
//! ```
//!
//! Gradients are first summed over micro-batches ([`AdamW::accumulate`]; in f64 by default,
//! [`AdamWConfig::grad_accum`], then rounded once to f32), then, if
//! `max_grad_norm` is set, scaled by `min(1, max_norm / (‖g‖₂ + 1e-6))` as
//! `torch.nn.utils.clip_grad_norm_` does. As in torch, `k` counts per parameter. The master copy, `m` and `v` are f32 whatever the
//! model's dtype; after the update the master is cast back into the model's `Var`.
//! Parameters that received no gradient in a step are left alone (no decay), like torch.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;
use serde::{Deserialize, Serialize};

use crate::error::{LearnerError, Result};
pub(crate) use crate::grad_sum::add_gradient;
use crate::grad_sum::squared_norm_as_f32;
use cascade_shared::config::GradAccum;
use cascade_shared::snapshot::durable::FileDigest;
use cascade_shared::snapshot::tensors::{
    read_safetensors, read_safetensors_metadata, write_safetensors,
};

/// Value of the `format` metadata key of `optimizer.safetensors`.
const OPTIMIZER_FORMAT: &str = "cascade-adamw-1";

/// AdamW hyper-parameters (per stage).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdamWConfig {
    /// β1.
    pub beta1: f64,
    /// β2.
    pub beta2: f64,
    /// ε added to the denominator.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Global-norm gradient clipping threshold; `None` = no clipping.
    pub max_grad_norm: Option<f64>,
    /// Stop with an error after this many consecutive skipped (NaN/inf) steps.
    pub max_consecutive_skips: u32,
    /// Precision of the gradient sum over micro-batches (and ranks): f64 makes the step
    /// independent of the order of the additions.
    pub grad_accum: GradAccum,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: Some(1.0),
            max_consecutive_skips: 5,
            grad_accum: GradAccum::F64,
        }
    }
}

impl AdamWConfig {
    /// Checks ranges; call once at start-up.
    pub fn validate(&self) -> Result<()> {
        let in_unit = |x: f64| (0.0..1.0).contains(&x);
        if !in_unit(self.beta1) || !in_unit(self.beta2) {
            return Err(LearnerError::InvalidConfig(format!(
                "betas ({}, {}) must be in [0, 1)",
                self.beta1, self.beta2
            )));
        }
        // Written so that NaN fails every check.
        let eps_and_decay_ok = self.eps > 0.0 && self.weight_decay >= 0.0;
        if !eps_and_decay_ok {
            return Err(LearnerError::InvalidConfig(format!(
                "eps {} must be > 0 and weight_decay {} ≥ 0",
                self.eps, self.weight_decay
            )));
        }
        if let Some(n) = self.max_grad_norm {
            let positive = n > 0.0;
            if !positive {
                return Err(LearnerError::InvalidConfig(format!(
                    "max_grad_norm {n} must be > 0"
                )));
            }
        }
        if self.max_consecutive_skips == 0 {
            return Err(LearnerError::InvalidConfig(
                "max_consecutive_skips must be ≥ 1".into(),
            ));
        }
        Ok(())
    }
}

/// Why a step was not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// The loss was NaN or infinite.
    NonFiniteLoss,
    /// The global gradient norm was NaN or infinite.
    NonFiniteGradNorm,
}

/// What [`AdamW::step`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepOutcome {
    /// The weights were updated.
    Applied {
        /// Global L2 norm of the accumulated gradient, before clipping.
        grad_norm: f64,
        /// Learning rate used.
        lr: f64,
    },
    /// The step was skipped; weights and moments are untouched.
    Skipped {
        /// Why.
        reason: SkipReason,
        /// Skipped steps in a row, this one included.
        consecutive: u32,
    },
}

/// One trained tensor.
struct Param {
    name: String,
    var: Var,
    /// f32 master copy, or `None` when the `Var` itself is f32 (it is then its own master).
    master: Option<Tensor>,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// Sum of the micro-batch gradients since the last step (f32).
    grad: Option<Tensor>,
    /// Updates this parameter has received (torch keeps the bias-correction step per
    /// parameter, so one that missed a gradient lags behind the global count).
    steps: u64,
}

impl Param {
    fn master(&self) -> Tensor {
        self.master
            .clone()
            .unwrap_or_else(|| self.var.as_tensor().clone())
    }
}

/// AdamW over a fixed set of named parameters.
pub struct AdamW {
    cfg: AdamWConfig,
    params: Vec<Param>,
    /// Applied steps (the `k` of the bias correction).
    step: u64,
    consecutive_skips: u32,
    skipped_total: u64,
}

impl AdamW {
    /// An optimizer over `params` (sorted by name internally; names must be unique).
    pub fn new(params: Vec<(String, Var)>, cfg: AdamWConfig) -> Result<Self> {
        cfg.validate()?;
        let mut params = params;
        params.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(w) = params.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(LearnerError::InvalidCall(format!(
                "parameter {} listed twice",
                w[0].0
            )));
        }
        let params = params
            .into_iter()
            .map(|(name, var)| {
                let master = match var.dtype() {
                    DType::F32 => None,
                    // Detached: cast from the variable, the copy would record the cast, and
                    // each step's master would then hold the one before it.
                    _ => Some(var.as_tensor().to_dtype(DType::F32)?.detach()),
                };
                let zeros = Tensor::zeros(var.shape(), DType::F32, var.device())?;
                Ok(Param {
                    name,
                    master,
                    exp_avg: zeros.clone(),
                    exp_avg_sq: zeros,
                    grad: None,
                    steps: 0,
                    var,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(AdamW {
            cfg,
            params,
            step: 0,
            consecutive_skips: 0,
            skipped_total: 0,
        })
    }

    /// An optimizer over every variable of `varmap`, named as in the map.
    pub fn from_varmap(varmap: &VarMap, cfg: AdamWConfig) -> Result<Self> {
        let vars = varmap
            .data()
            .lock()
            .map_err(|_| LearnerError::Poisoned("the model's variables"))?
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        AdamW::new(vars, cfg)
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdamWConfig {
        &self.cfg
    }

    /// Replaces the hyper-parameters (a new stage); moments are kept.
    pub fn set_config(&mut self, cfg: AdamWConfig) -> Result<()> {
        cfg.validate()?;
        self.cfg = cfg;
        Ok(())
    }

    /// Applied optimizer steps so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Steps skipped because of NaN/inf, in total.
    pub fn skipped_total(&self) -> u64 {
        self.skipped_total
    }

    /// Parameter names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.params.iter().map(|p| p.name.as_str())
    }

    /// Adds one micro-batch's gradients to the running sum.
    pub fn accumulate(&mut self, grads: &GradStore) -> Result<()> {
        let dtype = accum_dtype(self.cfg.grad_accum);
        for p in &mut self.params {
            add_gradient(&mut p.grad, grads, &p.var, dtype)?;
        }
        Ok(())
    }

    /// Drops the accumulated gradients.
    pub fn zero_grad(&mut self) {
        for p in &mut self.params {
            p.grad = None;
        }
    }

    /// The accumulated gradient of `name` as the step uses it, rounded to f32, if any (for tests
    /// and diagnostics).
    pub fn grad(&self, name: &str) -> Option<Tensor> {
        self.params
            .iter()
            .find(|p| p.name == name)
            .and_then(|p| p.grad.as_ref())
            .and_then(|g| g.to_dtype(DType::F32).ok())
    }

    /// Global L2 norm of the accumulated gradients, as the step sees them (rounded to f32),
    /// with the squares summed in f64.
    pub fn grad_norm(&self) -> Result<f64> {
        let mut sq = 0f64;
        for g in self.params.iter().filter_map(|p| p.grad.as_ref()) {
            sq += squared_norm_as_f32(g)?;
        }
        Ok(sq.sqrt())
    }

    /// Applies one AdamW step with learning rate `lr` to the accumulated gradients and clears
    /// them. `loss` is the batch loss: a NaN/inf loss or gradient norm skips the step (weights and
    /// moments untouched, gradients dropped) and, after `max_consecutive_skips` in a row, returns
    /// [`LearnerError::TooManyNonFiniteSteps`].
    pub fn step(&mut self, lr: f64, loss: f64) -> Result<StepOutcome> {
        let grad_norm = self.grad_norm()?;
        let mut counters = self.counters();
        let skipped = guard_step(&self.cfg, &mut counters, loss, grad_norm);
        (self.consecutive_skips, self.skipped_total) =
            (counters.consecutive_skips, counters.skipped_total);
        if !matches!(skipped, Ok(None)) {
            self.zero_grad();
        }
        if let Some(outcome) = skipped? {
            return Ok(outcome);
        }
        let clip = match self.cfg.max_grad_norm {
            Some(max) => (max / (grad_norm + 1e-6)).min(1.0),
            None => 1.0,
        };
        self.step += 1;
        let (b1, b2) = (self.cfg.beta1, self.cfg.beta2);
        let decay = 1.0 - lr * self.cfg.weight_decay;
        for p in &mut self.params {
            let Some(grad) = p.grad.take() else { continue };
            let grad = grad.to_dtype(DType::F32)?;
            p.steps += 1;
            let k = p.steps as i32;
            let step_size = lr / (1.0 - b1.powi(k));
            let bias_correction2_sqrt = (1.0 - b2.powi(k)).sqrt();
            let grad = if clip < 1.0 { (grad * clip)? } else { grad };
            let master = (p.master() * decay)?;
            // Detached, as everything kept across steps (see `AdamW::new`).
            p.exp_avg = ((&p.exp_avg * b1)? + (&grad * (1.0 - b1))?)?.detach();
            p.exp_avg_sq = ((&p.exp_avg_sq * b2)? + (grad.sqr()? * (1.0 - b2))?)?.detach();
            let denom = ((p.exp_avg_sq.sqrt()? / bias_correction2_sqrt)? + self.cfg.eps)?;
            let master = (master - ((&p.exp_avg / denom)? * step_size)?)?.detach();
            match &mut p.master {
                Some(m) => {
                    p.var.set(&master.to_dtype(p.var.dtype())?)?;
                    *m = master;
                }
                None => p.var.set(&master)?,
            }
        }
        Ok(StepOutcome::Applied { grad_norm, lr })
    }

    /// Writes `optimizer.safetensors`: `exp_avg.NAME`, `exp_avg_sq.NAME`, `master.NAME` (only
    /// for non-f32 parameters) and the step counters (global, and per parameter as a JSON map
    /// under `param_steps`) in the metadata.
    pub fn save(&self, path: &Path) -> Result<FileDigest> {
        let mut tensors = Vec::with_capacity(self.params.len() * 2);
        for p in &self.params {
            tensors.push((format!("exp_avg.{}", p.name), p.exp_avg.clone()));
            tensors.push((format!("exp_avg_sq.{}", p.name), p.exp_avg_sq.clone()));
            if let Some(m) = &p.master {
                tensors.push((format!("master.{}", p.name), m.clone()));
            }
        }
        let image = OptimizerImage {
            tensors,
            counters: self.counters(),
            param_steps: self
                .params
                .iter()
                .map(|p| (p.name.clone(), p.steps))
                .collect(),
        };
        image.save(path)
    }

    fn counters(&self) -> Counters {
        Counters {
            step: self.step,
            consecutive_skips: self.consecutive_skips,
            skipped_total: self.skipped_total,
        }
    }

    /// Restores moments, master weights and counters written by [`AdamW::save`] for the same
    /// parameter set. Call after the model weights are loaded into the `Var`s.
    pub fn load(&mut self, path: &Path) -> Result<()> {
        let device = self
            .params
            .first()
            .map(|p| p.var.device().clone())
            .unwrap_or(Device::Cpu);
        let mut file = OptimizerFile::read(path, &device)?;
        let mut restored = Vec::with_capacity(self.params.len());
        for p in &self.params {
            let exp_avg = file.take(&format!("exp_avg.{}", p.name), p.var.dims())?;
            let exp_avg_sq = file.take(&format!("exp_avg_sq.{}", p.name), p.var.dims())?;
            let master = match p.master {
                Some(_) => Some(file.take(&format!("master.{}", p.name), p.var.dims())?),
                None => None,
            };
            restored.push((exp_avg, exp_avg_sq, master, file.param_steps(&p.name)?));
        }
        file.finish()?;
        for (p, (exp_avg, exp_avg_sq, master, steps)) in self.params.iter_mut().zip(restored) {
            p.steps = steps;
            p.exp_avg = exp_avg;
            p.exp_avg_sq = exp_avg_sq;
            if let Some(m) = master {
                p.var.set(&m.to_dtype(p.var.dtype())?)?;
                p.master = Some(m);
            }
            p.grad = None;
        }
        self.step = file.counters.step;
        self.consecutive_skips = file.counters.consecutive_skips;
        self.skipped_total = file.counters.skipped_total;
        Ok(())
    }
}

impl AdamW {
    /// Restores the state from the shard files of a learner group's save (`files[r]` written
    /// by rank `r`, see [`crate::zero`]), assembled whole.
    pub fn load_shards(&mut self, files: &[std::path::PathBuf]) -> Result<()> {
        let layout: crate::zero::Layout = self
            .params
            .iter()
            .map(|p| (p.name.clone(), p.var.elem_count()))
            .collect();
        let set = crate::zero::ShardSet::open(files, &layout)?;
        let total = layout.iter().map(|(_, n)| n).sum();
        let [master, exp_avg, exp_avg_sq] = set.read_range(0..total)?;
        let mut offset = 0;
        for p in &mut self.params {
            let range = offset..offset + p.var.elem_count();
            offset = range.end;
            let device = p.var.device().clone();
            let piece = |v: &[f32]| Tensor::from_slice(&v[range.clone()], p.var.shape(), &device);
            p.exp_avg = piece(&exp_avg)?;
            p.exp_avg_sq = piece(&exp_avg_sq)?;
            if p.master.is_some() {
                let m = piece(&master)?;
                p.var.set(&m.to_dtype(p.var.dtype())?)?;
                p.master = Some(m);
            }
            p.steps = set.param_steps(&p.name)?;
            p.grad = None;
        }
        self.step = set.counters.step;
        self.consecutive_skips = set.counters.consecutive_skips;
        self.skipped_total = set.counters.skipped_total;
        Ok(())
    }
}

impl GradientSink for AdamW {
    fn accumulate(&mut self, grads: &GradStore) -> Result<()> {
        AdamW::accumulate(self, grads)
    }
}

impl OptimizerState for AdamW {
    fn save(&self, path: &Path) -> Result<FileDigest> {
        AdamW::save(self, path)
    }
}

/// Adds `var`'s gradient in `grads` (as f32) to the running sum in `slot`.
/// The dtype of the gradient sums for `accum`.
pub(crate) fn accum_dtype(accum: GradAccum) -> DType {
    match accum {
        GradAccum::F32 => DType::F32,
        GradAccum::F64 => DType::F64,
    }
}

/// The NaN/inf guard of a step: `Ok(Some(Skipped))` for a non-finite loss or gradient norm
/// (counted), [`LearnerError::TooManyNonFiniteSteps`] after `max_consecutive_skips` in a row,
/// `Ok(None)` (the run of skips reset) when the step may go ahead.
pub(crate) fn guard_step(
    cfg: &AdamWConfig,
    counters: &mut Counters,
    loss: f64,
    grad_norm: f64,
) -> Result<Option<StepOutcome>> {
    let reason = if !loss.is_finite() {
        SkipReason::NonFiniteLoss
    } else if !grad_norm.is_finite() {
        SkipReason::NonFiniteGradNorm
    } else {
        counters.consecutive_skips = 0;
        return Ok(None);
    };
    counters.consecutive_skips += 1;
    counters.skipped_total += 1;
    tracing::warn!(
        ?reason,
        loss,
        grad_norm,
        consecutive = counters.consecutive_skips,
        "optimizer step skipped"
    );
    if counters.consecutive_skips >= cfg.max_consecutive_skips {
        return Err(LearnerError::TooManyNonFiniteSteps {
            consecutive: counters.consecutive_skips,
            limit: cfg.max_consecutive_skips,
        });
    }
    Ok(Some(StepOutcome::Skipped {
        reason,
        consecutive: counters.consecutive_skips,
    }))
}

/// Where the gradients of a backward pass go: summed into an optimizer's accumulator.
pub trait GradientSink {
    /// Adds one micro-batch's gradients to the running sum.
    fn accumulate(&mut self, grads: &GradStore) -> Result<()>;
}

/// Something that writes `optimizer.safetensors` (an optimizer, or the gathered state of a
/// sharded one).
pub trait OptimizerState {
    /// Writes the file and returns its digest.
    fn save(&self, path: &Path) -> Result<FileDigest>;
}

/// The step counters of an optimizer, as saved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) step: u64,
    pub(crate) consecutive_skips: u32,
    pub(crate) skipped_total: u64,
}

/// The contents of `optimizer.safetensors`, ready to write: `exp_avg.NAME`, `exp_avg_sq.NAME`,
/// `master.NAME` (non-f32 parameters only), the counters and the per-parameter step counts.
pub(crate) struct OptimizerImage {
    pub(crate) tensors: Vec<(String, Tensor)>,
    pub(crate) counters: Counters,
    pub(crate) param_steps: BTreeMap<String, u64>,
}

impl OptimizerState for OptimizerImage {
    fn save(&self, path: &Path) -> Result<FileDigest> {
        let meta = BTreeMap::from([
            ("format".to_string(), OPTIMIZER_FORMAT.to_string()),
            ("step".to_string(), self.counters.step.to_string()),
            (
                "consecutive_skips".to_string(),
                self.counters.consecutive_skips.to_string(),
            ),
            (
                "skipped_total".to_string(),
                self.counters.skipped_total.to_string(),
            ),
            (
                "param_steps".to_string(),
                serde_json::to_string(&self.param_steps)
                    .map_err(|e| LearnerError::json(path, e))?,
            ),
        ]);
        Ok(write_safetensors(path, &self.tensors, &meta)?)
    }
}

/// The metadata of a saved optimizer state (a whole file or a shard), with errors that name
/// the file.
pub(crate) struct SavedMeta {
    path: std::path::PathBuf,
    map: BTreeMap<String, String>,
}

impl SavedMeta {
    /// Reads `path`'s metadata and checks its `format` is `format`.
    pub(crate) fn read(path: &Path, format: &str) -> Result<Self> {
        let meta = SavedMeta {
            path: path.to_path_buf(),
            map: read_safetensors_metadata(path)?,
        };
        if meta.map.get("format").map(String::as_str) != Some(format) {
            return Err(meta.bad(format!(
                "format {:?}, expected {format}",
                meta.map.get("format")
            )));
        }
        Ok(meta)
    }

    /// An error about this file.
    pub(crate) fn bad(&self, reason: String) -> LearnerError {
        LearnerError::Safetensors {
            path: self.path.clone(),
            reason,
        }
    }

    /// The number under `key`.
    pub(crate) fn num(&self, key: &str) -> Result<u64> {
        self.map
            .get(key)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| self.bad(format!("metadata {key} missing or not a number")))
    }

    /// The JSON value under `key`.
    pub(crate) fn json<T: serde::de::DeserializeOwned>(&self, key: &str) -> Result<T> {
        self.map
            .get(key)
            .and_then(|v| serde_json::from_str(v).ok())
            .ok_or_else(|| self.bad(format!("metadata {key} missing or malformed")))
    }

    /// The step counters.
    pub(crate) fn counters(&self) -> Result<Counters> {
        Ok(Counters {
            step: self.num("step")?,
            consecutive_skips: self.num("consecutive_skips")? as u32,
            skipped_total: self.num("skipped_total")?,
        })
    }
}

/// `optimizer.safetensors` read back: its tensors are taken one by one, and whatever is left
/// at the end belongs to no parameter (an error).
pub(crate) struct OptimizerFile {
    path: std::path::PathBuf,
    tensors: BTreeMap<String, Tensor>,
    param_steps: BTreeMap<String, u64>,
    pub(crate) counters: Counters,
}

impl OptimizerFile {
    pub(crate) fn read(path: &Path, device: &Device) -> Result<Self> {
        let meta = SavedMeta::read(path, OPTIMIZER_FORMAT)?;
        Ok(OptimizerFile {
            path: path.to_path_buf(),
            tensors: read_safetensors(path, device)?,
            param_steps: meta.json("param_steps")?,
            counters: meta.counters()?,
        })
    }

    /// The f32 tensor `key`, which must have `dims`.
    pub(crate) fn take(&mut self, key: &str, dims: &[usize]) -> Result<Tensor> {
        let t = self.tensors.remove(key).ok_or_else(|| {
            LearnerError::OptimizerMismatch(format!("{}: {key} missing", self.path.display()))
        })?;
        if t.dims() != dims || t.dtype() != DType::F32 {
            return Err(LearnerError::OptimizerMismatch(format!(
                "{}: {key} is {:?} {:?}, the parameter is {dims:?}",
                self.path.display(),
                t.dtype(),
                t.dims(),
            )));
        }
        Ok(t)
    }

    /// The update count of parameter `name`.
    pub(crate) fn param_steps(&self, name: &str) -> Result<u64> {
        self.param_steps.get(name).copied().ok_or_else(|| {
            LearnerError::OptimizerMismatch(format!(
                "{}: no step count for {name}",
                self.path.display()
            ))
        })
    }

    /// Refuses tensors that no parameter took.
    pub(crate) fn finish(&self) -> Result<()> {
        match self.tensors.keys().min() {
            Some(extra) => Err(LearnerError::OptimizerMismatch(format!(
                "{}: {extra} has no parameter in the model",
                self.path.display()
            ))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quadratic_grads(var: &Var, target: f32) -> GradStore {
        // loss = Σ (x − target)²
        let loss = (var.as_tensor() - target as f64)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap();
        loss.backward().unwrap()
    }

    fn one_param(values: &[f32], dtype: DType) -> (Var, AdamW) {
        let t = Tensor::new(values, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let var = Var::from_tensor(&t).unwrap();
        let opt = AdamW::new(vec![("w".into(), var.clone())], AdamWConfig::default()).unwrap();
        (var, opt)
    }

    /// The optimizer's state is plain data: no tensor it keeps across steps records the
    /// operations that made it. A bf16 parameter's f32 master, cast from the variable, did:
    /// each step's master then held the previous one (and its moments) through candle's
    /// backprop graph, so every step kept another 12 bytes per parameter alive.
    #[test]
    fn the_state_kept_across_steps_holds_no_graph() {
        for dtype in [DType::F32, DType::BF16] {
            let (var, mut opt) = one_param(&[1.0, -1.0, 0.5], dtype);
            for _ in 0..3 {
                opt.accumulate(&quadratic_grads(&var, 0.0)).unwrap();
                opt.step(0.1, 1.0).unwrap();
            }
            let p = &opt.params[0];
            for (what, t) in [("exp_avg", &p.exp_avg), ("exp_avg_sq", &p.exp_avg_sq)]
                .into_iter()
                .chain(p.master.as_ref().map(|m| ("master", m)))
            {
                assert!(!t.track_op(), "{dtype:?}: {what} records its history");
            }
        }
    }

    #[test]
    fn first_step_moves_by_lr_times_sign() {
        // At k = 1, m̂/√v̂ = g/|g|: the update is lr·sign(g) (plus decay).
        let (var, mut opt) = one_param(&[1.0, -1.0], DType::F32);
        opt.accumulate(&quadratic_grads(&var, 0.0)).unwrap();
        let out = opt.step(0.1, 1.0).unwrap();
        assert!(matches!(out, StepOutcome::Applied { .. }));
        let w = var.as_tensor().to_vec1::<f32>().unwrap();
        let want = 1.0 * (1.0 - 0.1 * 0.01) - 0.1;
        assert!(
            (w[0] - want).abs() < 1e-6 && (w[1] + want).abs() < 1e-6,
            "{w:?}"
        );
    }

    #[test]
    fn non_finite_steps_are_skipped_then_stop() {
        let (var, mut opt) = one_param(&[1.0, 2.0], DType::F32);
        let before = var.as_tensor().to_vec1::<f32>().unwrap();
        for i in 1..5 {
            opt.accumulate(&quadratic_grads(&var, 0.0)).unwrap();
            let out = opt.step(0.1, f64::NAN).unwrap();
            assert_eq!(
                out,
                StepOutcome::Skipped {
                    reason: SkipReason::NonFiniteLoss,
                    consecutive: i
                }
            );
        }
        // An infinite gradient is caught by the norm.
        let inf = Tensor::new(&[f32::INFINITY, 0.0], &Device::Cpu).unwrap();
        let loss = (var.as_tensor() * &inf).unwrap().sum_all().unwrap();
        opt.accumulate(&loss.backward().unwrap()).unwrap();
        let err = opt.step(0.1, 0.0).unwrap_err();
        assert!(matches!(
            err,
            LearnerError::TooManyNonFiniteSteps {
                consecutive: 5,
                limit: 5
            }
        ));
        assert_eq!(var.as_tensor().to_vec1::<f32>().unwrap(), before);
        assert_eq!(opt.steps(), 0);
        assert_eq!(opt.skipped_total(), 5);
    }

    #[test]
    fn a_good_step_resets_the_skip_count() {
        let (var, mut opt) = one_param(&[1.0], DType::F32);
        opt.accumulate(&quadratic_grads(&var, 0.0)).unwrap();
        opt.step(0.1, f64::INFINITY).unwrap();
        opt.accumulate(&quadratic_grads(&var, 0.0)).unwrap();
        assert!(matches!(
            opt.step(0.1, 1.0).unwrap(),
            StepOutcome::Applied { .. }
        ));
        opt.accumulate(&quadratic_grads(&var, 0.0)).unwrap();
        assert_eq!(
            opt.step(0.1, f64::NAN).unwrap(),
            StepOutcome::Skipped {
                reason: SkipReason::NonFiniteLoss,
                consecutive: 1
            }
        );
    }

    #[test]
    fn bf16_model_keeps_f32_master_and_state_round_trips() {
        let (var, mut opt) = one_param(&[1.0, 0.5, -0.25], DType::BF16);
        for _ in 0..3 {
            opt.accumulate(&quadratic_grads(&var, 0.1)).unwrap();
            opt.step(1e-3, 1.0).unwrap();
        }
        // The bf16 weights are the rounded master; small updates accumulate in the master.
        let master = opt.params[0].master.clone().unwrap();
        assert_eq!(
            var.as_tensor()
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            master
                .to_dtype(DType::BF16)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("optimizer.safetensors");
        opt.save(&path).unwrap();

        let var2 = Var::from_tensor(&Tensor::zeros(3, DType::BF16, &Device::Cpu).unwrap()).unwrap();
        let mut opt2 =
            AdamW::new(vec![("w".into(), var2.clone())], AdamWConfig::default()).unwrap();
        opt2.load(&path).unwrap();
        assert_eq!(opt2.steps(), 3);
        // Both continue identically.
        for o in [&mut opt, &mut opt2] {
            let v = o.params[0].var.clone();
            o.accumulate(&quadratic_grads(&v, 0.1)).unwrap();
            o.step(1e-3, 1.0).unwrap();
        }
        assert_eq!(
            opt.params[0].master().to_vec1::<f32>().unwrap(),
            opt2.params[0].master().to_vec1::<f32>().unwrap()
        );

        // A state for another parameter set is refused.
        let other =
            Var::from_tensor(&Tensor::zeros(4, DType::BF16, &Device::Cpu).unwrap()).unwrap();
        let mut opt3 = AdamW::new(vec![("w".into(), other)], AdamWConfig::default()).unwrap();
        assert!(matches!(
            opt3.load(&path),
            Err(LearnerError::OptimizerMismatch(_))
        ));
    }

    #[test]
    fn clipping_scales_to_max_norm() {
        let (var, mut opt) = one_param(&[3.0, 4.0], DType::F32);
        // grad = 2x = (6, 8), norm 10.
        opt.accumulate(&quadratic_grads(&var, 0.0)).unwrap();
        assert!((opt.grad_norm().unwrap() - 10.0).abs() < 1e-9);
        match opt.step(0.0, 1.0).unwrap() {
            StepOutcome::Applied { grad_norm, .. } => assert!((grad_norm - 10.0).abs() < 1e-9),
            other => panic!("{other:?}"),
        }
        // m after one step = (1 − β1)·clipped grad = 0.1·(0.6, 0.8).
        let m = opt.params[0].exp_avg.to_vec1::<f32>().unwrap();
        assert!(
            (m[0] - 0.06).abs() < 1e-6 && (m[1] - 0.08).abs() < 1e-6,
            "{m:?}"
        );
    }
}
