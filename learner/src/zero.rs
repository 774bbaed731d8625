//! AdamW with its state sharded over the ranks of a learner group (ZeRO stage 1/2, issue 17).
//!
//! The trained parameters, sorted by name, are laid end to end as one flat f32 vector; rank `r`
//! of `W` owns the elements [`shard_range`]`(total, r, W)` and keeps the f32 master weights and
//! the two Adam moments of those elements only (12 bytes per owned parameter instead of 12 per
//! parameter). One step:
//!
//! 1. each micro-batch's gradients are flattened and **reduce-scattered** as soon as backward
//!    has produced them ([`ShardedAdamW::flush`], through a [`GroupSink`]): each rank adds the
//!    sum over ranks of its shard to a shard accumulator, so no rank holds a full gradient sum
//!    (ZeRO-2). The sums are f64 by default ([`AdamWConfig::grad_accum`]): f32 gradients added
//!    in f64 are exact in practice, so the step's gradient is the same bits however the
//!    micro-batches are spread over the ranks, and the same as a single process's;
//! 2. the squared norm of each shard is **all-reduced** (with the per-parameter "received a
//!    gradient" flags): every rank has the global norm, so clipping and the NaN/inf guard decide
//!    the same on every rank without a host read per tensor;
//! 3. each rank applies the AdamW update of [`crate::optim::AdamW`] to its shard, element by
//!    element in the same f32 operations in the same order as candle's tensor ops there (so the
//!    update is bit-for-bit that of a single process given the same summed gradient);
//! 4. the updated master shards are **all-gathered** and every rank writes the result, cast to
//!    the model's dtype, into its weights.
//!
//! The state is saved by every rank in parallel, each its own shard
//! ([`ShardedAdamW::save_shard`]: `optimizer.rank-R-of-W.safetensors`, the flat f32 master
//! weights and moments of its elements, with the layout and the counters in the metadata); no
//! rank ever holds more than its shard. Loading ([`ShardedAdamW::load_shards`]) reads, through
//! memory maps, only the pieces of the files that overlap the loading rank's shard, so a run
//! saved by `W` ranks resumes with any number of ranks (the shards are re-cut), and
//! [`crate::optim::AdamW::load_shards`] assembles them for a single process. The single-process
//! file (`optimizer.safetensors`) loads too ([`ShardedAdamW::load`]), and
//! [`ShardedAdamW::gather`] writes one.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use cascade_shared::collective::{shard_range, Collective};
use cascade_shared::config::GradAccum;

use crate::error::{LearnerError, Result};
use crate::optim::{
    accum_dtype, add_gradient, guard_step, AdamWConfig, Counters, GradientSink, OptimizerFile,
    OptimizerImage, SavedMeta, StepOutcome,
};
use cascade_shared::snapshot::durable::FileDigest;
use cascade_shared::snapshot::tensors::write_safetensors;

/// One trained tensor and where it lies in the flat vector.
struct FlatParam {
    name: String,
    var: Var,
    offset: usize,
    numel: usize,
    /// Sum of this rank's micro-batch gradients since the last step (f32).
    grad: Option<Tensor>,
    /// Updates received (per parameter, as in torch).
    steps: u64,
}

impl FlatParam {
    fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.numel
    }
}

/// AdamW whose master weights and moments are sharded over the ranks of a [`Collective`].
pub struct ShardedAdamW {
    cfg: AdamWConfig,
    params: Vec<FlatParam>,
    total: usize,
    rank: usize,
    world: usize,
    /// This rank's elements of the flat vector.
    shard: Range<usize>,
    master: Vec<f32>,
    exp_avg: Vec<f32>,
    exp_avg_sq: Vec<f32>,
    /// The group's gradient summed so far this step, this rank's shard of it (ZeRO-2: each
    /// micro-batch's gradients are reduce-scattered by [`ShardedAdamW::flush`]).
    grad_shard: Option<ShardSum>,
    /// Which parameters received a gradient this step on this rank.
    got: Vec<bool>,
    counters: Counters,
}

/// A shard of the step's gradient sum, in [`AdamWConfig::grad_accum`]'s precision.
enum ShardSum {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl ShardSum {
    /// The sum as the update uses it: rounded once to f32.
    fn into_f32(self) -> Vec<f32> {
        match self {
            ShardSum::F32(v) => v,
            ShardSum::F64(v) => v.into_iter().map(|x| x as f32).collect(),
        }
    }
}

/// The overlap of `a` and `b` (empty when they do not meet).
fn overlap(a: &Range<usize>, b: &Range<usize>) -> Range<usize> {
    a.start.max(b.start)..a.end.min(b.end).max(a.start.max(b.start))
}

fn flat_f32(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?)
}

fn flat_f64(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?)
}

impl ShardedAdamW {
    /// The optimizer of rank `rank` of `world` over `params` (sorted by name internally).
    pub fn new(
        params: Vec<(String, Var)>,
        cfg: AdamWConfig,
        rank: usize,
        world: usize,
    ) -> Result<Self> {
        cfg.validate()?;
        if world == 0 || rank >= world {
            return Err(LearnerError::InvalidCall(format!(
                "rank {rank} of a group of {world}"
            )));
        }
        let mut params = params;
        params.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(w) = params.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(LearnerError::InvalidCall(format!(
                "parameter {} listed twice",
                w[0].0
            )));
        }
        let mut offset = 0;
        let params: Vec<FlatParam> = params
            .into_iter()
            .map(|(name, var)| {
                let numel = var.elem_count();
                let p = FlatParam {
                    name,
                    var,
                    offset,
                    numel,
                    grad: None,
                    steps: 0,
                };
                offset += numel;
                p
            })
            .collect();
        let total = offset;
        let shard = shard_range(total, rank, world);
        let n_params = params.len();
        let mut master = Vec::with_capacity(shard.len());
        for p in &params {
            let part = overlap(&p.range(), &shard);
            if part.is_empty() {
                continue;
            }
            let values = flat_f32(p.var.as_tensor())?;
            master.extend_from_slice(&values[part.start - p.offset..part.end - p.offset]);
        }
        Ok(ShardedAdamW {
            cfg,
            params,
            total,
            rank,
            world,
            exp_avg: vec![0.0; shard.len()],
            exp_avg_sq: vec![0.0; shard.len()],
            master,
            shard,
            grad_shard: None,
            got: vec![false; n_params],
            counters: Counters::default(),
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdamWConfig {
        &self.cfg
    }

    /// Applied optimizer steps so far.
    pub fn steps(&self) -> u64 {
        self.counters.step
    }

    /// Elements of the flat parameter vector this rank owns.
    pub fn shard(&self) -> Range<usize> {
        self.shard.clone()
    }

    /// Adds one micro-batch's gradients to this rank's running sum.
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
        self.grad_shard = None;
        self.got.iter_mut().for_each(|g| *g = false);
    }

    /// The gradients accumulated since the last flush, laid end to end (zeros where a
    /// parameter got none) by `flat`, and taken: the parameters that had one are marked.
    fn take_flat<T: Copy + Default>(
        &mut self,
        flat: impl Fn(&Tensor) -> Result<Vec<T>>,
    ) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.total];
        for (i, p) in self.params.iter_mut().enumerate() {
            if let Some(g) = p.grad.take() {
                out[p.range()].copy_from_slice(&flat(&g)?);
                self.got[i] = true;
            }
        }
        Ok(out)
    }

    /// Reduce-scatters the gradients accumulated since the last flush into this rank's shard
    /// of the step's gradient, and frees them (ZeRO-2: between micro-batches a rank holds
    /// one micro-batch's gradients and a 1/W shard of the sum, not a full f32 accumulator).
    /// Every rank must call it the same number of times per step (see [`GroupSink`]).
    pub fn flush(&mut self, group: &mut dyn Collective) -> Result<()> {
        self.check_group(group)?;
        let part = match self.cfg.grad_accum {
            GradAccum::F32 => {
                let flat = self.take_flat(flat_f32)?;
                let mut part = vec![0f32; self.shard.len()];
                group.reduce_scatter_sum(&flat, &mut part)?;
                ShardSum::F32(part)
            }
            GradAccum::F64 => {
                let flat = self.take_flat(flat_f64)?;
                let mut part = vec![0f64; self.shard.len()];
                group.reduce_scatter_sum_f64(&flat, &mut part)?;
                ShardSum::F64(part)
            }
        };
        self.grad_shard = Some(match (self.grad_shard.take(), part) {
            (None, part) => part,
            (Some(ShardSum::F32(mut acc)), ShardSum::F32(part)) => {
                acc.iter_mut().zip(&part).for_each(|(a, b)| *a += b);
                ShardSum::F32(acc)
            }
            (Some(ShardSum::F64(mut acc)), ShardSum::F64(part)) => {
                acc.iter_mut().zip(&part).for_each(|(a, b)| *a += b);
                ShardSum::F64(acc)
            }
            _ => {
                return Err(LearnerError::InvalidCall(
                    "grad_accum changed in the middle of a step".into(),
                ))
            }
        });
        Ok(())
    }

    /// One AdamW step over the group: every rank calls it with the same `lr` and the same
    /// global batch `loss` (see the module docs). Returns what [`crate::optim::AdamW::step`]
    /// would for the summed gradient: skipped on a NaN/inf loss or norm (on every rank alike),
    /// [`LearnerError::TooManyNonFiniteSteps`] after too many in a row.
    pub fn step(&mut self, lr: f64, loss: f64, group: &mut dyn Collective) -> Result<StepOutcome> {
        self.check_group(group)?;
        // 1. The group's gradient, this rank's shard: what the flushes summed, plus what is still
        // accumulated here (every rank flushes once more, so the counts match); and which
        // parameters received a gradient on any rank.
        self.flush(group)?;
        let shard_grad = self
            .grad_shard
            .take()
            .map(ShardSum::into_f32)
            .unwrap_or_default();
        let mut reduced = vec![0f64; self.params.len() + 1];
        for (i, got) in self.got.iter_mut().enumerate() {
            reduced[i] = f64::from(u8::from(*got));
            *got = false;
        }
        // 2. Global squared norm of the f32 gradient (rank-order sum of the shards' f64 sums).
        let sq: f64 = shard_grad
            .iter()
            .map(|&g| f64::from(g) * f64::from(g))
            .sum();
        reduced[self.params.len()] = sq;
        group.all_reduce_sum_f64(&mut reduced)?;
        let grad_norm = reduced[self.params.len()].sqrt();
        if let Some(outcome) = guard_step(&self.cfg, &mut self.counters, loss, grad_norm)? {
            return Ok(outcome);
        }
        let clip = match self.cfg.max_grad_norm {
            Some(max) => (max / (grad_norm + 1e-6)).min(1.0),
            None => 1.0,
        };
        self.counters.step += 1;
        // 3. The update of this rank's shard, in candle's f32 operations (see `AdamW::step`):
        // `t * s` is `t * (s as f32) + 0`, `t / s` is `t * ((1 / s) as f32) + 0`, `t + s` is
        // `t * 1 + (s as f32)`.
        let (b1, b2) = (self.cfg.beta1, self.cfg.beta2);
        let decay = (1.0 - lr * self.cfg.weight_decay) as f32;
        let clip32 = clip as f32;
        let (b1f, one_minus_b1) = (b1 as f32, (1.0 - b1) as f32);
        let (b2f, one_minus_b2) = (b2 as f32, (1.0 - b2) as f32);
        let eps = self.cfg.eps as f32;
        let mut updated = Vec::with_capacity(self.params.len());
        for (i, p) in self.params.iter_mut().enumerate() {
            if reduced[i] == 0.0 {
                continue;
            }
            p.steps += 1;
            updated.push(i);
            let part = overlap(&p.range(), &self.shard);
            if part.is_empty() {
                continue;
            }
            let k = p.steps as i32;
            let step_size = (lr / (1.0 - b1.powi(k))) as f32;
            let inv_bc2 = (1.0 / (1.0 - b2.powi(k)).sqrt()) as f32;
            let local = part.start - self.shard.start..part.end - self.shard.start;
            for j in local {
                let mut g = shard_grad[j];
                if clip < 1.0 {
                    g = g * clip32 + 0.0;
                }
                let master = self.master[j] * decay + 0.0;
                let m = (self.exp_avg[j] * b1f + 0.0) + (g * one_minus_b1 + 0.0);
                let v = (self.exp_avg_sq[j] * b2f + 0.0) + ((g * g) * one_minus_b2 + 0.0);
                let denom = (v.sqrt() * inv_bc2 + 0.0) * 1.0 + eps;
                self.master[j] = master - ((m / denom) * step_size + 0.0);
                self.exp_avg[j] = m;
                self.exp_avg_sq[j] = v;
            }
        }
        // 4. Every rank's weights from the gathered masters.
        let mut full = vec![0f32; self.total];
        group.all_gather(&self.master, &mut full)?;
        for i in updated {
            let p = &self.params[i];
            let t = Tensor::from_slice(&full[p.range()], p.var.shape(), p.var.device())?;
            p.var.set(&t.to_dtype(p.var.dtype())?)?;
        }
        Ok(StepOutcome::Applied { grad_norm, lr })
    }

    fn check_group(&self, group: &dyn Collective) -> Result<()> {
        if group.rank() != self.rank || group.world_size() != self.world {
            return Err(LearnerError::InvalidCall(format!(
                "optimizer shard of rank {} of {} used with rank {} of {}",
                self.rank,
                self.world,
                group.rank(),
                group.world_size()
            )));
        }
        Ok(())
    }

    /// Gathers the state of every shard. Rank 0 gets the single-process
    /// `optimizer.safetensors` contents (write them with
    /// [`crate::optim::OptimizerState::save`]); the other ranks get `None`. Every rank must call it.
    pub(crate) fn gather(&self, group: &mut dyn Collective) -> Result<Option<OptimizerImage>> {
        self.check_group(group)?;
        let mut out = Vec::new();
        for shard in [&self.exp_avg, &self.exp_avg_sq, &self.master] {
            let mut full = vec![0f32; self.total];
            group.all_gather(shard, &mut full)?;
            out.push(full);
        }
        if self.rank != 0 {
            return Ok(None);
        }
        let device = Device::Cpu;
        let mut tensors = Vec::with_capacity(self.params.len() * 3);
        for p in &self.params {
            let piece = |v: &Vec<f32>| Tensor::from_slice(&v[p.range()], p.var.shape(), &device);
            tensors.push((format!("exp_avg.{}", p.name), piece(&out[0])?));
            tensors.push((format!("exp_avg_sq.{}", p.name), piece(&out[1])?));
            if p.var.dtype() != DType::F32 {
                tensors.push((format!("master.{}", p.name), piece(&out[2])?));
            }
        }
        Ok(Some(OptimizerImage {
            tensors,
            counters: self.counters,
            param_steps: self
                .params
                .iter()
                .map(|p| (p.name.clone(), p.steps))
                .collect::<BTreeMap<_, _>>(),
        }))
    }

    /// Gathers the state (every rank calls it) and rank 0 writes it to `path` as
    /// `optimizer.safetensors`.
    pub fn save_gathered(&self, group: &mut dyn Collective, path: &Path) -> Result<()> {
        if let Some(image) = self.gather(group)? {
            crate::optim::OptimizerState::save(&image, path)?;
        }
        Ok(())
    }

    /// Restores this rank's shard from an `optimizer.safetensors` written by any number of
    /// ranks (or by [`crate::optim::AdamW`]), and sets the weights to its master copy. Call
    /// after the model weights are loaded; every rank reads the file.
    pub fn load(&mut self, path: &Path) -> Result<()> {
        let mut file = OptimizerFile::read(path, &Device::Cpu)?;
        let mut exp_avg = Vec::with_capacity(self.shard.len());
        let mut exp_avg_sq = Vec::with_capacity(self.shard.len());
        let mut master = Vec::with_capacity(self.shard.len());
        let mut steps = Vec::with_capacity(self.params.len());
        for p in &self.params {
            let dims = p.var.dims().to_vec();
            let m = file.take(&format!("exp_avg.{}", p.name), &dims)?;
            let v = file.take(&format!("exp_avg_sq.{}", p.name), &dims)?;
            // An f32 parameter is its own master (its weights are already loaded).
            let w = if p.var.dtype() == DType::F32 {
                p.var.as_tensor().clone()
            } else {
                file.take(&format!("master.{}", p.name), &dims)?
            };
            steps.push(file.param_steps(&p.name)?);
            let part = overlap(&p.range(), &self.shard);
            if part.is_empty() {
                continue;
            }
            let local = part.start - p.offset..part.end - p.offset;
            exp_avg.extend_from_slice(&flat_f32(&m)?[local.clone()]);
            exp_avg_sq.extend_from_slice(&flat_f32(&v)?[local.clone()]);
            master.extend_from_slice(&flat_f32(&w)?[local]);
            if p.var.dtype() != DType::F32 {
                p.var
                    .set(&w.to_device(p.var.device())?.to_dtype(p.var.dtype())?)?;
            }
        }
        file.finish()?;
        for (p, s) in self.params.iter_mut().zip(steps) {
            p.steps = s;
            p.grad = None;
        }
        self.exp_avg = exp_avg;
        self.exp_avg_sq = exp_avg_sq;
        self.master = master;
        self.counters = file.counters;
        Ok(())
    }
}

/// `format` of a shard file's metadata.
const SHARD_FORMAT: &str = "cascade-adamw-shard-1";

/// The file rank `rank` of `world` writes its optimizer shard to, in a snapshot.
pub fn shard_file_name(rank: usize, world: usize) -> String {
    format!("optimizer.rank-{rank}-of-{world}.safetensors")
}

/// The flat layout of a parameter set: `(name, elements)` sorted by name.
pub(crate) type Layout = Vec<(String, usize)>;

impl ShardedAdamW {
    fn layout(&self) -> Layout {
        self.params
            .iter()
            .map(|p| (p.name.clone(), p.numel))
            .collect()
    }

    /// Writes this rank's shard (every rank writes its own, in parallel): tensors `master`,
    /// `exp_avg`, `exp_avg_sq` (f32, the elements of [`Self::shard`]); metadata: the rank, the
    /// world size, the range, the layout of the flat vector, the counters.
    pub fn save_shard(&self, path: &Path) -> Result<FileDigest> {
        let dev = Device::Cpu;
        let n = self.shard.len();
        let tensors = vec![
            (
                "master".to_string(),
                Tensor::from_slice(&self.master, n, &dev)?,
            ),
            (
                "exp_avg".to_string(),
                Tensor::from_slice(&self.exp_avg, n, &dev)?,
            ),
            (
                "exp_avg_sq".to_string(),
                Tensor::from_slice(&self.exp_avg_sq, n, &dev)?,
            ),
        ];
        let param_steps: BTreeMap<&str, u64> = self
            .params
            .iter()
            .map(|p| (p.name.as_str(), p.steps))
            .collect();
        let meta = BTreeMap::from([
            ("format".to_string(), SHARD_FORMAT.to_string()),
            ("rank".to_string(), self.rank.to_string()),
            ("world".to_string(), self.world.to_string()),
            ("start".to_string(), self.shard.start.to_string()),
            ("end".to_string(), self.shard.end.to_string()),
            ("total".to_string(), self.total.to_string()),
            (
                "layout".to_string(),
                serde_json::to_string(&self.layout()).map_err(|e| LearnerError::json(path, e))?,
            ),
            (
                "param_steps".to_string(),
                serde_json::to_string(&param_steps).map_err(|e| LearnerError::json(path, e))?,
            ),
            ("step".to_string(), self.counters.step.to_string()),
            (
                "consecutive_skips".to_string(),
                self.counters.consecutive_skips.to_string(),
            ),
            (
                "skipped_total".to_string(),
                self.counters.skipped_total.to_string(),
            ),
        ]);
        Ok(write_safetensors(path, &tensors, &meta)?)
    }

    /// Restores this rank's shard from the shard files of a save by any number of ranks
    /// (`files[r]` written by rank `r`), reading only the overlapping pieces.
    pub fn load_shards(&mut self, files: &[PathBuf]) -> Result<()> {
        let set = ShardSet::open(files, &self.layout())?;
        let [master, exp_avg, exp_avg_sq] = set.read_range(self.shard.clone())?;
        for p in &mut self.params {
            p.steps = set.param_steps(&p.name)?;
            p.grad = None;
        }
        // The weights already are the master cast to their dtype (a snapshot's model is).
        self.master = master;
        self.exp_avg = exp_avg;
        self.exp_avg_sq = exp_avg_sq;
        self.counters = set.counters;
        Ok(())
    }
}

/// The shard files of one save, checked against each other and against a parameter layout.
pub(crate) struct ShardSet {
    files: Vec<(PathBuf, Range<usize>)>,
    param_steps: BTreeMap<String, u64>,
    pub(crate) counters: Counters,
}

impl ShardSet {
    /// Opens `files` (rank order) and checks: the format, each file's rank and world size, that
    /// the ranges tile the flat vector, and that the layout is `layout`. Errors name the file.
    pub(crate) fn open(files: &[PathBuf], layout: &Layout) -> Result<Self> {
        if files.is_empty() {
            return Err(LearnerError::OptimizerMismatch(
                "no optimizer shard files".into(),
            ));
        }
        let total: usize = layout.iter().map(|(_, n)| n).sum();
        let mut out = Vec::with_capacity(files.len());
        let mut first: Option<(BTreeMap<String, u64>, Counters)> = None;
        let mut end = 0usize;
        for (rank, path) in files.iter().enumerate() {
            let meta = SavedMeta::read(path, SHARD_FORMAT)?;
            let num = |key: &str| meta.num(key);
            if num("rank")? != rank as u64 || num("world")? != files.len() as u64 {
                return Err(meta.bad(format!(
                    "written by rank {} of {}, read as rank {rank} of {}",
                    num("rank")?,
                    num("world")?,
                    files.len()
                )));
            }
            let theirs: Layout = meta.json("layout")?;
            if &theirs != layout {
                return Err(LearnerError::OptimizerMismatch(format!(
                    "{}: the saved parameters ({} tensors, {} elements) are not the model's \
                     ({} tensors, {total} elements)",
                    path.display(),
                    theirs.len(),
                    theirs.iter().map(|(_, n)| n).sum::<usize>(),
                    layout.len()
                )));
            }
            let range = num("start")? as usize..num("end")? as usize;
            if range.start != end || range.end < range.start || num("total")? as usize != total {
                return Err(meta.bad(format!(
                    "holds elements {range:?} of {}; the shards before it end at {end}",
                    num("total")?
                )));
            }
            end = range.end;
            if first.is_none() {
                first = Some((meta.json("param_steps")?, meta.counters()?));
            }
            out.push((path.clone(), range));
        }
        if end != total {
            return Err(LearnerError::OptimizerMismatch(format!(
                "the {} shard files hold elements 0..{end} of {total}",
                files.len()
            )));
        }
        let (param_steps, counters) = first.expect("at least one file");
        Ok(ShardSet {
            files: out,
            param_steps,
            counters,
        })
    }

    /// The update count of parameter `name`.
    pub(crate) fn param_steps(&self, name: &str) -> Result<u64> {
        self.param_steps.get(name).copied().ok_or_else(|| {
            LearnerError::OptimizerMismatch(format!("no step count for {name} in the shards"))
        })
    }

    /// `[master, exp_avg, exp_avg_sq]` of the flat elements `want`, read from the files that
    /// overlap it.
    pub(crate) fn read_range(&self, want: Range<usize>) -> Result<[Vec<f32>; 3]> {
        let mut out: [Vec<f32>; 3] = std::array::from_fn(|_| Vec::with_capacity(want.len()));
        for (path, range) in &self.files {
            let part = overlap(range, &want);
            if part.is_empty() {
                continue;
            }
            let io = |e: std::io::Error| LearnerError::io(path, e);
            let file = std::fs::File::open(path).map_err(io)?;
            // SAFETY: the file is a published snapshot's, which is never written again; the map
            // is read-only and dropped before this function returns.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
            let st = safetensors::SafeTensors::deserialize(&map).map_err(|e| {
                LearnerError::Safetensors {
                    path: path.clone(),
                    reason: e.to_string(),
                }
            })?;
            let local = part.start - range.start..part.end - range.start;
            for (i, key) in ["master", "exp_avg", "exp_avg_sq"].iter().enumerate() {
                let view = st.tensor(key).map_err(|e| LearnerError::Safetensors {
                    path: path.clone(),
                    reason: format!("{key}: {e}"),
                })?;
                if view.dtype() != safetensors::Dtype::F32 || view.shape() != [range.len()] {
                    return Err(LearnerError::Safetensors {
                        path: path.clone(),
                        reason: format!(
                            "{key} is {:?} {:?}, expected F32 [{}]",
                            view.dtype(),
                            view.shape(),
                            range.len()
                        ),
                    });
                }
                let bytes = &view.data()[local.start * 4..local.end * 4];
                out[i].extend(
                    bytes
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                );
            }
        }
        Ok(out)
    }
}

impl GradientSink for ShardedAdamW {
    fn accumulate(&mut self, grads: &GradStore) -> Result<()> {
        ShardedAdamW::accumulate(self, grads)
    }
}

/// The gradient sink of one rank's share of a step: each micro-batch's gradients are
/// reduce-scattered as soon as they are accumulated ([`ShardedAdamW::flush`]), and
/// [`GroupSink::finish`] adds empty flushes up to the largest share, so that every rank calls
/// the collective as often as the others.
pub struct GroupSink<'a> {
    optimizer: &'a mut ShardedAdamW,
    group: &'a mut dyn Collective,
    flushes: usize,
}

impl<'a> GroupSink<'a> {
    /// A sink for `optimizer` over `group`.
    pub fn new(optimizer: &'a mut ShardedAdamW, group: &'a mut dyn Collective) -> Self {
        GroupSink {
            optimizer,
            group,
            flushes: 0,
        }
    }

    /// Flushes until `micro_batches` flushes were made: the largest number of micro-batches
    /// any rank runs in this phase of the step.
    pub fn finish(mut self, micro_batches: usize) -> Result<()> {
        while self.flushes < micro_batches {
            self.optimizer.flush(self.group)?;
            self.flushes += 1;
        }
        Ok(())
    }
}

impl GradientSink for GroupSink<'_> {
    fn accumulate(&mut self, grads: &GradStore) -> Result<()> {
        self.optimizer.accumulate(grads)?;
        self.optimizer.flush(self.group)?;
        self.flushes += 1;
        Ok(())
    }
}
