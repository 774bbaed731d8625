//! Publishing the learner's state as a snapshot, and committing the replay position it covers.

use std::time::Instant;

use candle_core::DType;
use cascade_shared::metrics as events;
use cascade_shared::snapshot::TOKENIZER_CONFIG_FILE;
use cascade_shared::transport::RolloutSource;

use super::start::serialise_position;
use std::path::Path;

use cascade_shared::collective::Collective;
use cascade_shared::snapshot::durable::FileDigest;

use super::group::{all_gather_f64, TrainOptimizer};
use super::Learner;
use crate::error::{LearnerError, Result};
use crate::optim::OptimizerState;
use crate::snapshot::{self, SnapshotInput};
use crate::zero::{shard_file_name, ShardedAdamW};

impl<S: RolloutSource> Learner<'_, S> {
    /// Publishes the current state as snapshot `policy_version` (unless already published),
    /// commits the replay position it covers, and applies retention. In a group every rank
    /// calls it at the same points: rank 0 writes the snapshot, and every rank writes its own
    /// optimizer shard into it, in parallel.
    pub(super) fn publish(&mut self, stage_final: bool) -> Result<()> {
        let version = self.state.policy_version;
        if self.published == Some(version) {
            return Ok(());
        }
        let started = Instant::now();
        // Inside a stage a checkpoint carries the optimizer state; at a stage's step 0 the next
        // step starts a fresh optimizer, so the snapshot is weights only (and a checkpoint).
        // Between checkpoints (`learner.checkpoint_every`) snapshots are weights only. A stop
        // (SIGTERM, `max_steps`) makes the snapshot of its step a checkpoint; it is rank 0's
        // to see, so in a group rank 0's decision is broadcast (every rank publishes at the same
        // points) and every rank writes its shard or none.
        let inside = self.state.stage_step > 0;
        let every = self.opts.config.learner.checkpoint_every.max(1) as u64;
        let mut checkpoint = [u8::from(
            !inside
                || stage_final
                || self.stopping()
                || self.state.stage_step >= self.checkpointed_at + every,
        )];
        if self.group.world_size() > 1 {
            self.group.broadcast(&mut checkpoint, 0)?;
        }
        let checkpoint = checkpoint[0] == 1;
        self.state.checkpoint = checkpoint;
        if checkpoint {
            self.checkpointed_at = self.state.stage_step;
        }
        let inside = inside && checkpoint;
        let shards = match &self.optimizer {
            TrainOptimizer::Sharded(o) if inside => Some(o),
            _ => None,
        };
        if !self.leads() {
            if let Some(o) = shards {
                write_shards(self.group.as_mut(), o, &self.snapshots, version)?;
            }
            self.published = Some(version);
            return Ok(());
        }
        let optimizer: Option<&dyn OptimizerState> = match &self.optimizer {
            TrainOptimizer::Local(o) if inside => Some(o),
            _ => None,
        };
        self.state.replay_cursors = serialise_position(&self.consumed)?;
        let model = self.policy.named_tensors();
        let torch_dtype = match self.policy.model.dtype() {
            DType::BF16 => "bfloat16",
            DType::F16 => "float16",
            _ => "float32",
        };
        let config_json = serde_json::to_vec_pretty(&self.policy.cfg.to_hf_json(torch_dtype))
            .map_err(|e| LearnerError::json("config.json", e))?;
        let extra: Vec<(&str, &[u8])> = self
            .tokenizer
            .tokenizer_config_json
            .as_deref()
            .map(|b| vec![(TOKENIZER_CONFIG_FILE, b)])
            .unwrap_or_default();
        let group = self.group.as_mut();
        let snapshots = &self.snapshots;
        snapshot::publish_with(
            snapshots,
            version,
            &SnapshotInput {
                model: &model,
                optimizer,
                state: &self.state,
                config_json: &config_json,
                tokenizer_json: &self.tokenizer.tokenizer_json,
                extra_files: &extra,
                stage_final,
            },
            |_| match shards {
                Some(o) => write_shards(group, o, snapshots, version),
                None => Ok(Vec::new()),
            },
        )?;
        self.published = Some(version);
        if checkpoint {
            if let Some(source) = self.source.as_mut() {
                source.commit_at(&self.consumed)?;
            }
        } else if let Some(source) = self.source.as_mut() {
            // Not committed: a resume from the last checkpoint reads these rollouts again.
            source.report_progress(&self.consumed)?;
        }
        self.progressed = self.consumed.clone();
        let deleted = snapshot::retain(&self.snapshots, self.opts.config.learner.keep_snapshots)?;
        self.metrics.record(&events::Snapshot {
            policy_version: Some(version),
            stage_index: Some(u64::from(self.state.stage_index)),
            stage_final: Some(stage_final),
            checkpoint: Some(checkpoint),
            publish_s: Some(started.elapsed().as_secs_f64()),
            deleted: Some(deleted),
        });
        Ok(())
    }
}

/// Every rank writes its optimizer shard into snapshot `version`'s temporary directory (rank 0
/// has created it and says so with a broadcast), and rank 0 gets every shard's name and digest
/// for the manifest (the other ranks get them too, and drop them).
fn write_shards(
    group: &mut dyn Collective,
    optimizer: &ShardedAdamW,
    snapshots: &Path,
    version: u64,
) -> Result<Vec<(String, FileDigest)>> {
    let mut ready = [1u8];
    group.broadcast(&mut ready, 0)?;
    let (rank, world) = (group.rank(), group.world_size());
    let dir = snapshot::shard_tmp_dir(snapshots, version);
    let digest = optimizer.save_shard(&dir.join(shard_file_name(rank, world)))?;
    let all = all_gather_f64(group, &[digest.bytes as f64, f64::from(digest.crc32c)])?;
    Ok(all
        .iter()
        .enumerate()
        .map(|(r, d)| {
            (
                shard_file_name(r, world),
                FileDigest {
                    bytes: d[0] as u64,
                    crc32c: d[1] as u32,
                },
            )
        })
        .collect())
}
