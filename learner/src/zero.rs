//! AdamW with its state sharded over the ranks of a learner group (ZeRO stage 1/2, issue 17).
//!
//! The trained parameters, sorted by name, are laid end to end as one flat vector; rank `r` of
//! `W` owns the elements [`shard_range`]`(total, r, W)` and keeps the f32 master weights and the
//! two Adam moments of those elements only (12 bytes per owned parameter instead of 12 per
//! parameter), **on the parameters' device**. The flat vector itself is never built: every
//! collective runs in buckets ([`BUCKET`] elements per rank), each bucket being every rank's
//! next piece of its own shard, padded to the longest, so that the collective cuts equal
//! chunks (NCCL's reduce-scatter and all-gather do) and the device holds `W × BUCKET` elements
//! of a collective's buffer at a time. One step:
//!
//! 1. each micro-batch's gradients are **reduce-scattered** as soon as backward has produced
//!    them ([`ShardedAdamW::flush`], through a [`GroupSink`]), bucket by bucket: the bucket is
//!    cut from the gradients where they lie (converted to the accumulation dtype a piece at a
//!    time, never copied whole) and each rank adds the sum over ranks of its piece to its shard
//!    of the step's gradient, so no rank holds a full gradient sum (ZeRO-2). The sums are f64
//!    by default ([`AdamWConfig::grad_accum`]): f32 gradients added in f64 are exact in
//!    practice, so the step's gradient is the same bits however the micro-batches are spread
//!    over the ranks, and the same as a single process's;
//! 2. the squared norm of each shard (summed on the device, one scalar read) is
//!    **all-reduced** with the per-parameter "received a gradient" flags: every rank has the
//!    global norm, so clipping and the NaN/inf guard decide the same on every rank without a
//!    host read per tensor;
//! 3. each rank applies the AdamW update of [`crate::optim::AdamW`] to its shard, parameter
//!    slice by parameter slice, in the same tensor operations (element-wise, so the update is
//!    bit-for-bit that of a single process given the same summed gradient);
//! 4. the updated master shards are **all-gathered**, bucket by bucket, and every rank writes
//!    each bucket, cast to the model's dtype, into its weights in place.
//!
//! The collectives take tensors ([`Collective::reduce_scatter_sum_tensor`],
//! [`Collective::all_gather_tensor`]): the NCCL backend runs them on the device's buffers, the
//! CPU backend through host slices.
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
pub use cascade_shared::collective::BUCKET;
use cascade_shared::collective::{shard_range, Collective};

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
    /// This rank's micro-batch gradients since the last flush.
    grad: Option<Pending>,
    /// Updates received (per parameter, as in torch).
    steps: u64,
}

impl FlatParam {
    fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.numel
    }
}

/// A parameter's gradients waiting for the next flush.
enum Pending {
    /// One micro-batch's gradient as backward made it (shared with its `GradStore`, so never
    /// written; converted piece by piece as it is sent).
    Raw(Tensor),
    /// The sum of several, in [`AdamWConfig::grad_accum`]'s dtype (ours to add into).
    Sum(Tensor),
}

/// Piece `k` of this rank's shard (see [`BUCKET`]) and its state, on the parameters' device.
struct Piece {
    /// Its elements of the flat vector (empty where this rank's shard is shorter).
    range: Range<usize>,
    master: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// The group's gradient summed so far this step, these elements of it, in
    /// [`AdamWConfig::grad_accum`]'s dtype.
    grad: Option<Tensor>,
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
    /// Elements per rank and bucket ([`BUCKET`] unless [`ShardedAdamW::with_bucket`]).
    bucket: usize,
    /// The parameters' device, where the state and the collectives' buffers live.
    device: Device,
    /// This rank's shard in buckets: piece `k` is its part of bucket `k`.
    pieces: Vec<Piece>,
    /// Which parameters received a gradient this step on this rank.
    got: Vec<bool>,
    counters: Counters,
}

/// The overlap of `a` and `b` (empty when they do not meet).
fn overlap(a: &Range<usize>, b: &Range<usize>) -> Range<usize> {
    a.start.max(b.start)..a.end.min(b.end).max(a.start.max(b.start))
}

fn flat_f32(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?)
}

/// Rank `rank`'s piece of bucket `k`: the elements of its shard of `total` from `k × bucket`
/// on, at most `bucket` of them (empty past its end).
fn piece_range(total: usize, rank: usize, world: usize, bucket: usize, k: usize) -> Range<usize> {
    let s = shard_range(total, rank, world);
    let start = (s.start + k * bucket).min(s.end);
    start..(start + bucket).min(s.end)
}

/// `t` followed by zeros up to `len` elements (1-D).
fn padded(t: Tensor, len: usize) -> Result<Tensor> {
    let n = t.elem_count();
    if n == len {
        return Ok(t);
    }
    let zeros = Tensor::zeros(len - n, t.dtype(), t.device())?;
    Ok(if n == 0 {
        zeros
    } else {
        Tensor::cat(&[&t, &zeros], 0)?
    })
}

impl ShardedAdamW {
    /// The optimizer of rank `rank` of `world` over `params` (sorted by name internally). Its
    /// state lives on the parameters' device.
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
        let device = params
            .first()
            .map(|(_, v)| v.device().clone())
            .unwrap_or(Device::Cpu);
        if let Some((name, _)) = params
            .iter()
            .find(|(_, v)| !v.device().same_device(&device))
        {
            return Err(LearnerError::InvalidCall(format!(
                "parameter {name} is on another device than the others"
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
        let n_params = params.len();
        let mut opt = ShardedAdamW {
            cfg,
            params,
            total,
            rank,
            world,
            shard: shard_range(total, rank, world),
            bucket: BUCKET,
            device,
            pieces: Vec::new(),
            got: vec![false; n_params],
            counters: Counters::default(),
        };
        opt.init_pieces()?;
        Ok(opt)
    }

    /// The same optimizer with buckets of `bucket` elements per rank (at least 1; every rank
    /// of a group must use the same). Call before any other method: the state restarts from
    /// the weights.
    pub fn with_bucket(mut self, bucket: usize) -> Result<Self> {
        if bucket == 0 {
            return Err(LearnerError::InvalidCall("a bucket of 0 elements".into()));
        }
        self.bucket = bucket;
        self.init_pieces()?;
        Ok(self)
    }

    /// Fresh state: masters from the weights, zero moments.
    fn init_pieces(&mut self) -> Result<()> {
        let masters = (0..self.buckets())
            .map(|k| {
                let range = self.piece(k);
                self.flat_slice(range, DType::F32, |_, p| {
                    Ok(Some(p.var.as_tensor().clone()))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.set_state(masters, None)
    }

    /// Replaces the state: `masters[k]` is piece `k`'s; the moments are `moments[k]` (or zeros).
    fn set_state(
        &mut self,
        masters: Vec<Tensor>,
        moments: Option<Vec<(Tensor, Tensor)>>,
    ) -> Result<()> {
        let mut moments = moments.map(Vec::into_iter);
        self.pieces = masters
            .into_iter()
            .enumerate()
            .map(|(k, master)| {
                let range = self.piece(k);
                let (exp_avg, exp_avg_sq) = match moments.as_mut().and_then(Iterator::next) {
                    Some(m) => m,
                    None => {
                        let zeros = Tensor::zeros(range.len(), DType::F32, &self.device)?;
                        (zeros.clone(), zeros)
                    }
                };
                Ok(Piece {
                    range,
                    master,
                    exp_avg,
                    exp_avg_sq,
                    grad: None,
                })
            })
            .collect::<Result<_>>()?;
        Ok(())
    }

    /// Buckets per collective: as many as the longest shard (rank 0's) has pieces.
    fn buckets(&self) -> usize {
        shard_range(self.total, 0, self.world)
            .len()
            .div_ceil(self.bucket)
    }

    /// This rank's piece of bucket `k`.
    fn piece(&self, k: usize) -> Range<usize> {
        piece_range(self.total, self.rank, self.world, self.bucket, k)
    }

    /// Every rank's piece of bucket `k`, and the bucket's width per rank (the longest).
    fn bucket_pieces(&self, k: usize) -> (Vec<Range<usize>>, usize) {
        let pieces: Vec<_> = (0..self.world)
            .map(|r| piece_range(self.total, r, self.world, self.bucket, k))
            .collect();
        let width = pieces.iter().map(|p| p.len()).max().unwrap_or(0);
        (pieces, width)
    }

    /// The elements `range` of the flat vector as one 1-D `dtype` tensor on the device, each
    /// parameter's part taken from `of(param)` (any shape; `None` = zeros).
    fn flat_slice(
        &self,
        range: Range<usize>,
        dtype: DType,
        of: impl Fn(usize, &FlatParam) -> Result<Option<Tensor>>,
    ) -> Result<Tensor> {
        let mut parts = Vec::new();
        for (i, p) in self.params.iter().enumerate() {
            let part = overlap(&p.range(), &range);
            if part.is_empty() {
                continue;
            }
            let t = match of(i, p)? {
                Some(t) => t
                    .flatten_all()?
                    .narrow(0, part.start - p.offset, part.len())?
                    .to_device(&self.device)?
                    .to_dtype(dtype)?,
                None => Tensor::zeros(part.len(), dtype, &self.device)?,
            };
            parts.push(t);
        }
        // Detached: cut from a variable, the slice would record it (and the state made from it
        // would hold every earlier step's through candle's backprop graph).
        Ok(match parts.len() {
            0 => Tensor::zeros(0, dtype, &self.device)?,
            1 => parts.pop().expect("one part").contiguous()?,
            _ => Tensor::cat(&parts, 0)?,
        }
        .detach())
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

    /// Adds one micro-batch's gradients to this rank's pending ones. The first is kept as
    /// backward made it (no copy); a second before the flush starts a sum in the accumulation
    /// dtype.
    pub fn accumulate(&mut self, grads: &GradStore) -> Result<()> {
        let dtype = accum_dtype(self.cfg.grad_accum);
        for p in &mut self.params {
            let Some(g) = grads.get(p.var.as_tensor()) else {
                continue;
            };
            p.grad = Some(match p.grad.take() {
                None => Pending::Raw(g.clone()),
                Some(pending) => {
                    let sum = match pending {
                        // A copy: the raw gradient belongs to its store.
                        Pending::Raw(raw) if raw.dtype() == dtype => raw.force_contiguous()?,
                        Pending::Raw(raw) => raw.to_dtype(dtype)?,
                        Pending::Sum(sum) => sum,
                    };
                    let mut slot = Some(sum);
                    add_gradient(&mut slot, grads, &p.var, dtype)?;
                    Pending::Sum(slot.expect("a sum"))
                }
            });
        }
        Ok(())
    }

    /// Drops the accumulated gradients.
    pub fn zero_grad(&mut self) {
        for p in &mut self.params {
            p.grad = None;
        }
        for piece in &mut self.pieces {
            piece.grad = None;
        }
        self.got.iter_mut().for_each(|g| *g = false);
    }

    /// Reduce-scatters the gradients accumulated since the last flush into this rank's shard
    /// of the step's gradient, bucket by bucket on the parameters' device, and frees them
    /// (ZeRO-2: between micro-batches a rank holds one micro-batch's gradients and a 1/W shard
    /// of the sum, never a flat copy of the gradient). Every rank must call it the same number
    /// of times per step (see [`GroupSink`]).
    pub fn flush(&mut self, group: &mut dyn Collective) -> Result<()> {
        self.check_group(group)?;
        let dtype = accum_dtype(self.cfg.grad_accum);
        let mut pending: Vec<Option<Tensor>> = Vec::with_capacity(self.params.len());
        for (i, p) in self.params.iter_mut().enumerate() {
            pending.push(p.grad.take().map(|g| match g {
                Pending::Raw(t) | Pending::Sum(t) => t,
            }));
            self.got[i] |= pending[i].is_some();
        }
        let grad_of = |i: usize, _: &FlatParam| Ok(pending[i].clone());
        for k in 0..self.buckets() {
            let (ranges, width) = self.bucket_pieces(k);
            let parts = ranges
                .into_iter()
                .map(|r| padded(self.flat_slice(r, dtype, grad_of)?, width))
                .collect::<Result<Vec<_>>>()?;
            let send = Tensor::cat(&parts, 0)?;
            drop(parts);
            let sum = group.reduce_scatter_sum_tensor(&send)?;
            drop(send);
            let piece = &mut self.pieces[k];
            let mine = sum.narrow(0, 0, piece.range.len())?;
            piece.grad = Some(match piece.grad.take() {
                None => mine.detach(),
                Some(acc) => (acc + mine)?.detach(),
            });
        }
        Ok(())
    }

    /// One AdamW step over the group: every rank calls it with the same `lr` and the same
    /// global batch `loss` (see the module docs). Returns what [`crate::optim::AdamW::step`]
    /// would for the summed gradient: skipped on a NaN/inf loss or norm (on every rank alike),
    /// [`LearnerError::TooManyNonFiniteSteps`] after too many in a row.
    pub fn step(&mut self, lr: f64, loss: f64, group: &mut dyn Collective) -> Result<StepOutcome> {
        self.check_group(group)?;
        // 1. The group's gradient, this rank's shard: what the flushes summed, plus what is still
        // accumulated here (every rank flushes once more, so the counts match), rounded once to
        // f32 as the update uses it; and which parameters received a gradient on any rank.
        self.flush(group)?;
        let grads = self
            .pieces
            .iter_mut()
            .map(|piece| match piece.grad.take() {
                Some(g) => Ok(g.to_dtype(DType::F32)?),
                None => Ok(Tensor::zeros(piece.range.len(), DType::F32, &self.device)?),
            })
            .collect::<Result<Vec<_>>>()?;
        // 2. Global squared norm: each piece's in f64 on the device, one scalar read per step,
        // summed over ranks with the "received a gradient" flags.
        let mut sq: Option<Tensor> = None;
        for g in grads.iter().filter(|g| g.elem_count() > 0) {
            let s = g.to_dtype(DType::F64)?.sqr()?.sum_all()?;
            sq = Some(match sq {
                None => s,
                Some(acc) => (acc + s)?,
            });
        }
        let mut reduced = vec![0f64; self.params.len() + 1];
        for (i, got) in self.got.iter_mut().enumerate() {
            reduced[i] = f64::from(u8::from(*got));
            *got = false;
        }
        reduced[self.params.len()] = match sq {
            Some(s) => s.to_scalar::<f64>()?,
            None => 0.0,
        };
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
        let mut updated = vec![false; self.params.len()];
        for (i, p) in self.params.iter_mut().enumerate() {
            if reduced[i] != 0.0 {
                p.steps += 1;
                updated[i] = true;
            }
        }
        // 3. The update of this rank's pieces, parameter by parameter, in the tensor operations
        // of `AdamW::step` (element-wise, so a slice of a parameter gets the same bits).
        for (k, grad) in grads.into_iter().enumerate() {
            self.update_piece(k, &grad, &updated, lr, clip)?;
        }
        // 4. Every rank's weights from the gathered masters, bucket by bucket.
        for k in 0..self.buckets() {
            let (ranges, width) = self.bucket_pieces(k);
            let mine = padded(self.pieces[k].master.clone(), width)?;
            let all = group.all_gather_tensor(&mine)?;
            for (r, range) in ranges.iter().enumerate() {
                for (p, _) in self.params.iter().zip(&updated).filter(|(_, &u)| u) {
                    let part = overlap(&p.range(), range);
                    if part.is_empty() {
                        continue;
                    }
                    let src = all
                        .narrow(0, r * width + part.start - range.start, part.len())?
                        .to_dtype(p.var.dtype())?
                        .contiguous()?;
                    let flat = p.var.as_tensor().flatten_all()?;
                    if !flat.is_contiguous() {
                        return Err(LearnerError::InvalidCall(format!(
                            "parameter {} is not contiguous",
                            p.name
                        )));
                    }
                    flat.slice_set(&src, 0, part.start - p.offset)?;
                }
            }
        }
        Ok(StepOutcome::Applied { grad_norm, lr })
    }

    /// AdamW's update of piece `k` given its f32 gradient: the segments of the parameters in
    /// `updated` change, the others keep their state.
    fn update_piece(
        &mut self,
        k: usize,
        grad: &Tensor,
        updated: &[bool],
        lr: f64,
        clip: f64,
    ) -> Result<()> {
        let piece = &self.pieces[k];
        if piece.range.is_empty() {
            return Ok(());
        }
        let (b1, b2) = (self.cfg.beta1, self.cfg.beta2);
        let decay = 1.0 - lr * self.cfg.weight_decay;
        let (mut masters, mut ms, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        for (p, &up) in self.params.iter().zip(updated) {
            let part = overlap(&p.range(), &piece.range);
            if part.is_empty() {
                continue;
            }
            let at = |t: &Tensor| t.narrow(0, part.start - piece.range.start, part.len());
            let (master, exp_avg, exp_avg_sq) = (
                at(&piece.master)?,
                at(&piece.exp_avg)?,
                at(&piece.exp_avg_sq)?,
            );
            if !up {
                masters.push(master);
                ms.push(exp_avg);
                vs.push(exp_avg_sq);
                continue;
            }
            let grad = at(grad)?;
            let k = p.steps as i32;
            let step_size = lr / (1.0 - b1.powi(k));
            let bias_correction2_sqrt = (1.0 - b2.powi(k)).sqrt();
            let grad = if clip < 1.0 { (grad * clip)? } else { grad };
            let master = (master * decay)?;
            let exp_avg = ((exp_avg * b1)? + (&grad * (1.0 - b1))?)?;
            let exp_avg_sq = ((exp_avg_sq * b2)? + (grad.sqr()? * (1.0 - b2))?)?;
            let denom = ((exp_avg_sq.sqrt()? / bias_correction2_sqrt)? + self.cfg.eps)?;
            let master = (master - ((&exp_avg / denom)? * step_size)?)?;
            masters.push(master);
            ms.push(exp_avg);
            vs.push(exp_avg_sq);
        }
        let join = |parts: Vec<Tensor>| -> Result<Tensor> {
            Ok(if parts.len() == 1 {
                parts.into_iter().next().expect("one").contiguous()?
            } else {
                Tensor::cat(&parts, 0)?
            }
            .detach())
        };
        let piece = &mut self.pieces[k];
        piece.master = join(masters)?;
        piece.exp_avg = join(ms)?;
        piece.exp_avg_sq = join(vs)?;
        Ok(())
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

    /// This rank's shard of `[master, exp_avg, exp_avg_sq]`, on the host.
    fn shard_state(&self) -> Result<[Vec<f32>; 3]> {
        let mut out: [Vec<f32>; 3] = std::array::from_fn(|_| Vec::with_capacity(self.shard.len()));
        for piece in self.pieces.iter().filter(|p| !p.range.is_empty()) {
            for (o, t) in out
                .iter_mut()
                .zip([&piece.master, &piece.exp_avg, &piece.exp_avg_sq])
            {
                o.extend(t.to_vec1::<f32>()?);
            }
        }
        Ok(out)
    }

    /// Sets this rank's state from host vectors of its shard (`[master, exp_avg, exp_avg_sq]`).
    fn load_shard_state(&mut self, state: [Vec<f32>; 3]) -> Result<()> {
        let [master, exp_avg, exp_avg_sq] = state;
        let mut masters = Vec::new();
        let mut moments = Vec::new();
        for k in 0..self.buckets() {
            let p = self.piece(k);
            let local = p.start - self.shard.start..p.end - self.shard.start;
            let on_device = |v: &[f32]| -> Result<Tensor> {
                Ok(Tensor::from_slice(v, v.len(), &Device::Cpu)?.to_device(&self.device)?)
            };
            masters.push(on_device(&master[local.clone()])?);
            moments.push((
                on_device(&exp_avg[local.clone()])?,
                on_device(&exp_avg_sq[local])?,
            ));
        }
        self.set_state(masters, Some(moments))
    }

    /// Gathers the state of every shard. Rank 0 gets the single-process
    /// `optimizer.safetensors` contents (write them with
    /// [`crate::optim::OptimizerState::save`]); the other ranks get `None`. Every rank must call
    /// it; only rank 0 holds the whole state, on the host.
    pub(crate) fn gather(&self, group: &mut dyn Collective) -> Result<Option<OptimizerImage>> {
        self.check_group(group)?;
        let root = self.rank == 0;
        let mut out: [Vec<f32>; 3] =
            std::array::from_fn(|_| Vec::with_capacity(if root { self.total } else { 0 }));
        for k in 0..self.buckets() {
            let (ranges, width) = self.bucket_pieces(k);
            let piece = &self.pieces[k];
            for (o, t) in out
                .iter_mut()
                .zip([&piece.exp_avg, &piece.exp_avg_sq, &piece.master])
            {
                let all = group.all_gather_tensor(&padded(t.clone(), width)?)?;
                if root {
                    let all = all.to_vec1::<f32>()?;
                    o.resize(self.total, 0.0);
                    for (r, range) in ranges.iter().enumerate() {
                        o[range.clone()].copy_from_slice(&all[r * width..r * width + range.len()]);
                    }
                }
            }
        }
        if !root {
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
        let mut state: [Vec<f32>; 3] =
            std::array::from_fn(|_| Vec::with_capacity(self.shard.len()));
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
            for (s, t) in state.iter_mut().zip([&w, &m, &v]) {
                s.extend_from_slice(&flat_f32(t)?[local.clone()]);
            }
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
        self.load_shard_state(state)?;
        self.got.iter_mut().for_each(|g| *g = false);
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
        let [master, exp_avg, exp_avg_sq] = self.shard_state()?;
        let tensors = vec![
            ("master".to_string(), Tensor::from_vec(master, n, &dev)?),
            ("exp_avg".to_string(), Tensor::from_vec(exp_avg, n, &dev)?),
            (
                "exp_avg_sq".to_string(),
                Tensor::from_vec(exp_avg_sq, n, &dev)?,
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
        let state = set.read_range(self.shard.clone())?;
        for p in &mut self.params {
            p.steps = set.param_steps(&p.name)?;
            p.grad = None;
        }
        // The weights already are the master cast to their dtype (a snapshot's model is).
        self.load_shard_state(state)?;
        self.got.iter_mut().for_each(|g| *g = false);
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

#[cfg(test)]
mod tests {
    use super::*;
    use cascade_shared::collective::Single;

    /// The sharded state is plain data: no piece records the operations that made it (cut from
    /// the variables, the first masters did, and each step's state then held the one before
    /// it: 12 bytes per owned parameter more every step).
    #[test]
    fn the_state_kept_across_steps_holds_no_graph() -> Result<()> {
        for dtype in [DType::F32, DType::BF16] {
            let w = Tensor::arange(0f32, 10f32, &Device::Cpu)?
                .affine(0.1, -0.5)?
                .to_dtype(dtype)?;
            let var = Var::from_tensor(&w)?;
            let mut opt = ShardedAdamW::new(
                vec![("w".into(), var.clone())],
                AdamWConfig::default(),
                0,
                1,
            )?
            .with_bucket(4)?;
            for _ in 0..3 {
                let loss = var.as_tensor().to_dtype(DType::F32)?.sqr()?.sum_all()?;
                opt.accumulate(&loss.backward()?)?;
                opt.step(0.1, 1.0, &mut Single)?;
            }
            for piece in &opt.pieces {
                for t in [&piece.master, &piece.exp_avg, &piece.exp_avg_sq] {
                    assert!(!t.track_op(), "{dtype:?}: a piece records its history");
                }
            }
        }
        Ok(())
    }
}
