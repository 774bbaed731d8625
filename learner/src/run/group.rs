//! A learner that spans several processes (issue 17): one rank per device, working as one
//! learner over a [`Collective`].
//!
//! **Rank 0 leads.** It alone reads the replay log, runs the filter, the staleness and prompt
//! decisions, writes `metrics.jsonl` and publishes snapshots; it decides each step once and
//! broadcasts it as a [`Command`]: the admitted groups of a GRPO step, or "go" for an SFT step
//! (whose rows every rank computes from the same schedule), or "stop". While it waits for
//! rollouts it broadcasts a heartbeat, so that the other ranks' collective timeout tells a
//! silent leader from a slow actor.
//!
//! **Every rank trains its share.** The step's micro-batches (cut exactly as one process would
//! cut them) are split into contiguous runs, one per rank ([`shard_range`]); each rank
//! accumulates the gradients of its micro-batches with the whole batch's loss denominator, so
//! the gradients of all ranks sum to the single-process gradient. The optimizer is
//! [`ShardedAdamW`] (ZeRO-2: each micro-batch's gradients reduce-scattered through a
//! [`GroupSink`], global-norm clip, sharded update, all-gather); with one rank it is the plain
//! [`AdamW`].
//!
//! Snapshots: rank 0 writes them; inside a stage every rank writes its own optimizer shard into
//! the snapshot's temporary directory before rank 0 publishes it (`run/publish.rs`); a
//! stage's step-0 snapshot (stage-final, initial) carries weights only.

use std::path::{Path, PathBuf};

use candle_core::backprop::GradStore;
use cascade_shared::collective::{shard_range, Collective};
use cascade_shared::RolloutGroup;
use serde::{Deserialize, Serialize};

use crate::error::{LearnerError, Result};
use crate::grpo::GrpoStats;
use crate::optim::{AdamW, GradientSink, StepOutcome};
use crate::zero::ShardedAdamW;
use crate::zero::{shard_file_name, GroupSink};
use cascade_shared::snapshot::OPTIMIZER_FILE;

/// What rank 0 tells the other ranks before each step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) enum Command {
    /// Rank 0 is waiting for rollouts; wait with it.
    Wait,
    /// Publish what is done and return.
    Stop,
    /// Run the next SFT step.
    Go,
    /// Run a GRPO step on these groups.
    Step {
        /// The admitted groups, in the order rank 0 batches them.
        kept: Vec<RolloutGroup>,
        /// The step has no signal (equal rewards): no update.
        no_signal: bool,
    },
}

/// Broadcasts rank 0's `command` (`Some` on rank 0, ignored elsewhere) to every rank.
pub(super) fn broadcast_command(
    group: &mut dyn Collective,
    command: Option<&Command>,
) -> Result<Command> {
    if group.world_size() == 1 {
        return command
            .cloned()
            .ok_or_else(|| LearnerError::InvalidCall("rank 0 must give the command".into()));
    }
    let payload = match (group.rank(), command) {
        (0, Some(c)) => serde_json::to_vec(c)
            .map_err(|e| LearnerError::State(format!("step command does not serialise: {e}")))?,
        (0, None) => {
            return Err(LearnerError::InvalidCall(
                "rank 0 must give the command".into(),
            ))
        }
        _ => Vec::new(),
    };
    let mut len = (payload.len() as u64).to_le_bytes();
    group.broadcast(&mut len, 0)?;
    let mut buf = payload;
    buf.resize(u64::from_le_bytes(len) as usize, 0);
    group.broadcast(&mut buf, 0)?;
    serde_json::from_slice(&buf).map_err(|e| {
        LearnerError::State(format!(
            "rank {}: step command from rank 0 does not parse: {e}",
            group.rank()
        ))
    })
}

/// Every rank's `values`, in rank order (bits exact: each f64 travels as two f32 words that the
/// gather only copies).
pub(super) fn all_gather_f64(group: &mut dyn Collective, values: &[f64]) -> Result<Vec<Vec<f64>>> {
    let world = group.world_size();
    if world == 1 {
        return Ok(vec![values.to_vec()]);
    }
    let words: Vec<f32> = values
        .iter()
        .flat_map(|v| {
            let bits = v.to_bits();
            [
                f32::from_bits(bits as u32),
                f32::from_bits((bits >> 32) as u32),
            ]
        })
        .collect();
    let mut all = vec![0f32; words.len() * world];
    group.all_gather(&words, &mut all)?;
    Ok(all
        .chunks(words.len().max(1))
        .take(world)
        .map(|rank| {
            rank.chunks(2)
                .map(|w| {
                    f64::from_bits(u64::from(w[0].to_bits()) | (u64::from(w[1].to_bits()) << 32))
                })
                .collect()
        })
        .collect())
}

/// The step's statistics over all ranks: sums in rank order, maxima of the maxima.
pub(super) fn reduce_grpo_stats(group: &mut dyn Collective, mine: &GrpoStats) -> Result<GrpoStats> {
    if group.world_size() == 1 {
        return Ok(*mine);
    }
    let fields = [
        mine.loss,
        mine.tokens,
        mine.clipped_tokens,
        mine.dual_clipped_tokens,
        mine.ratio_sum,
        mine.ratio_max,
        mine.kl_sum,
        mine.kl_max,
        mine.kl_bounded_tokens,
        mine.ref_log_ratio_max,
    ];
    let mut total = GrpoStats::default();
    for r in all_gather_f64(group, &fields)? {
        total.add(&GrpoStats {
            loss: r[0],
            tokens: r[1],
            clipped_tokens: r[2],
            dual_clipped_tokens: r[3],
            ratio_sum: r[4],
            ratio_max: r[5],
            kl_sum: r[6],
            kl_max: r[7],
            kl_bounded_tokens: r[8],
            ref_log_ratio_max: r[9],
        });
    }
    Ok(total)
}

/// The sum over ranks of one number (an SFT loss: each rank's share of the mean).
pub(super) fn sum_over_ranks(group: &mut dyn Collective, mine: f64) -> Result<f64> {
    Ok(all_gather_f64(group, &[mine])?
        .iter()
        .fold(0.0, |acc, r| acc + r[0]))
}

/// The micro-batches of `n` a rank runs.
pub(super) fn my_part(group: &dyn Collective, n: usize) -> std::ops::Range<usize> {
    shard_range(n, group.rank(), group.world_size())
}

/// The learner's optimizer: AdamW alone, or sharded over the group.
pub(super) enum TrainOptimizer {
    /// One process.
    Local(AdamW),
    /// State sharded over the ranks of a group.
    Sharded(ShardedAdamW),
}

impl TrainOptimizer {
    /// A step over the group (`loss`: the global batch loss).
    pub(super) fn step(
        &mut self,
        lr: f64,
        loss: f64,
        group: &mut dyn Collective,
    ) -> Result<StepOutcome> {
        match self {
            TrainOptimizer::Local(o) => o.step(lr, loss),
            TrainOptimizer::Sharded(o) => o.step(lr, loss, group),
        }
    }

    pub(super) fn zero_grad(&mut self) {
        match self {
            TrainOptimizer::Local(o) => o.zero_grad(),
            TrainOptimizer::Sharded(o) => o.zero_grad(),
        }
    }

    /// Restores the state saved in a snapshot, by one process or by a group of any size.
    pub(super) fn load(&mut self, files: &OptimizerFiles) -> Result<()> {
        match (self, files) {
            (TrainOptimizer::Local(o), OptimizerFiles::Single(path)) => o.load(path),
            (TrainOptimizer::Local(o), OptimizerFiles::Shards(paths)) => o.load_shards(paths),
            (TrainOptimizer::Sharded(o), OptimizerFiles::Single(path)) => o.load(path),
            (TrainOptimizer::Sharded(o), OptimizerFiles::Shards(paths)) => o.load_shards(paths),
        }
    }
}

/// Where a snapshot keeps its optimizer state.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum OptimizerFiles {
    /// `optimizer.safetensors`, written by one process.
    Single(PathBuf),
    /// `optimizer.rank-R-of-W.safetensors` for R in 0..W, written by a group of W ranks.
    Shards(Vec<PathBuf>),
}

impl OptimizerFiles {
    /// The optimizer files listed in snapshot `dir`'s manifest (`files`); an error names a
    /// missing shard or a mix of layouts.
    pub(super) fn of_snapshot<'f>(
        dir: &Path,
        files: impl Iterator<Item = &'f String>,
    ) -> Result<Option<OptimizerFiles>> {
        let mut single = false;
        let mut shards: Vec<(usize, usize)> = Vec::new();
        for f in files {
            if f == OPTIMIZER_FILE {
                single = true;
            } else if let Some(rest) = f
                .strip_prefix("optimizer.rank-")
                .and_then(|r| r.strip_suffix(".safetensors"))
            {
                let parsed = rest
                    .split_once("-of-")
                    .and_then(|(r, w)| Some((r.parse().ok()?, w.parse().ok()?)));
                match parsed {
                    Some(rw) => shards.push(rw),
                    None => {
                        return Err(LearnerError::State(format!(
                            "{}: optimizer file {f} is not named optimizer.rank-R-of-W.safetensors",
                            dir.display()
                        )))
                    }
                }
            }
        }
        match (single, shards.is_empty()) {
            (false, true) => Ok(None),
            (true, true) => Ok(Some(OptimizerFiles::Single(dir.join(OPTIMIZER_FILE)))),
            (true, false) => Err(LearnerError::State(format!(
                "{} holds both {OPTIMIZER_FILE} and optimizer shards",
                dir.display()
            ))),
            (false, false) => {
                let world = shards[0].1;
                for rank in 0..world {
                    if !shards.contains(&(rank, world)) {
                        return Err(LearnerError::State(format!(
                            "{} lacks the optimizer shard {}",
                            dir.display(),
                            shard_file_name(rank, world)
                        )));
                    }
                }
                if shards.len() != world {
                    return Err(LearnerError::State(format!(
                        "{} holds optimizer shards of different group sizes",
                        dir.display()
                    )));
                }
                Ok(Some(OptimizerFiles::Shards(
                    (0..world)
                        .map(|r| dir.join(shard_file_name(r, world)))
                        .collect(),
                )))
            }
        }
    }
}

/// Runs `f` (one phase of a step: a rank's micro-batches, `n` in all over the group) with the
/// gradient sink of this rank: the optimizer itself in one process; in a group, a
/// [`GroupSink`] that reduce-scatters each micro-batch's gradients (ZeRO-2) and pads this
/// rank's flushes to the largest share.
pub(super) fn with_sink<T>(
    optimizer: &mut TrainOptimizer,
    group: &mut dyn Collective,
    n: usize,
    f: impl FnOnce(&mut dyn GradientSink) -> Result<T>,
) -> Result<T> {
    match optimizer {
        TrainOptimizer::Local(o) => f(o),
        TrainOptimizer::Sharded(o) => {
            let largest = shard_range(n, 0, group.world_size()).len();
            let mut sink = GroupSink::new(o, group);
            let out = f(&mut sink)?;
            sink.finish(largest)?;
            Ok(out)
        }
    }
}

impl GradientSink for TrainOptimizer {
    fn accumulate(&mut self, grads: &GradStore) -> Result<()> {
        match self {
            TrainOptimizer::Local(o) => o.accumulate(grads),
            TrainOptimizer::Sharded(o) => o.accumulate(grads),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> Result<Option<OptimizerFiles>> {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        OptimizerFiles::of_snapshot(Path::new("/s/v000007"), names.iter())
    }

    #[test]
    fn the_optimizer_files_of_a_snapshot_are_one_file_or_every_rank_s_shard() {
        assert_eq!(files(&["model.safetensors"]).unwrap(), None);
        assert_eq!(
            files(&["model.safetensors", "optimizer.safetensors"]).unwrap(),
            Some(OptimizerFiles::Single(
                "/s/v000007/optimizer.safetensors".into()
            ))
        );
        let two = [
            "optimizer.rank-1-of-2.safetensors",
            "optimizer.rank-0-of-2.safetensors",
        ];
        assert_eq!(
            files(&two).unwrap(),
            Some(OptimizerFiles::Shards(vec![
                "/s/v000007/optimizer.rank-0-of-2.safetensors".into(),
                "/s/v000007/optimizer.rank-1-of-2.safetensors".into(),
            ]))
        );
        let e = files(&[
            "optimizer.rank-0-of-3.safetensors",
            "optimizer.rank-2-of-3.safetensors",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("lacks the optimizer shard optimizer.rank-1-of-3"),
            "{e}"
        );
        let e = files(&["optimizer.safetensors", two[0]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("both"), "{e}");
        let e = files(&["optimizer.rank-x-of-2.safetensors"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not named"), "{e}");
    }
}
