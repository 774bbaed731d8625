//! Publishing the learner's state as a snapshot, and committing the replay position it covers.

use std::time::Instant;

use candle_core::DType;
use cascade_shared::metrics as events;
use cascade_shared::snapshot::TOKENIZER_CONFIG_FILE;
use cascade_shared::transport::RolloutSource;

use super::start::serialise_position;
use super::Learner;
use crate::error::{LearnerError, Result};
use crate::snapshot::{self, SnapshotInput};

impl<S: RolloutSource> Learner<'_, S> {
    /// Publishes the current state as snapshot `policy_version` (unless already published),
    /// commits the replay position it covers, and applies retention. In a group every rank
    /// calls it at the same points (a sharded optimizer state is gathered) and rank 0 writes.
    pub(super) fn publish(&mut self, stage_final: bool) -> Result<()> {
        let version = self.state.policy_version;
        if self.published == Some(version) {
            return Ok(());
        }
        let started = Instant::now();
        // Inside a stage the snapshot carries the optimizer state; at a stage's step 0 the next
        // step starts a fresh optimizer, so the snapshot is weights only.
        let mut gathered = None;
        let optimizer = if self.state.stage_step > 0 {
            self.optimizer
                .state_to_save(self.group.as_mut(), &mut gathered)?
        } else {
            None
        };
        if !self.leads() {
            self.published = Some(version);
            return Ok(());
        }
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
        snapshot::publish(
            &self.snapshots,
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
        )?;
        self.published = Some(version);
        if let Some(source) = self.source.as_mut() {
            source.commit_at(&self.consumed)?;
        }
        self.progressed = self.consumed.clone();
        let deleted = snapshot::retain(&self.snapshots, self.opts.config.learner.keep_snapshots)?;
        self.metrics.record(&events::Snapshot {
            policy_version: Some(version),
            stage_index: Some(u64::from(self.state.stage_index)),
            stage_final: Some(stage_final),
            publish_s: Some(started.elapsed().as_secs_f64()),
            deleted: Some(deleted),
        });
        Ok(())
    }
}
