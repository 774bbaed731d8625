//! One SFT stage: packed conversations, a fixed number of optimizer steps.

use std::time::Instant;

use cascade_shared::config::{DatasetEntry, SftMix, StageConfig};
use cascade_shared::data::Kind;
use cascade_shared::metrics::{SftStep, StepMemory};
use cascade_shared::plan::DEFAULT_SFT_TOKEN_BUDGET;
use cascade_shared::transport::RolloutSource;

use super::best;
use super::group;
use super::settings::lr_schedule;
use super::Learner;
use crate::error::Result;
use crate::optim::StepOutcome;
use crate::sft::{accumulate_sft_gradients_part, load_sft_from, sft_part, SftData, SftSchedule};

/// Salt of the SFT packing order.
const SFT_SALT: u64 = 0x5f73_6674_5f6f_7264;

/// Salt of the packing order of an RL stage's `sft_mix` rows.
const SFT_MIX_SALT: u64 = 0x6d69_785f_7366_7400;

/// Salt of the packing order of an RL stage's replayed best responses.
const SFT_REPLAY_SALT: u64 = 0x7265_706c_6179_0000;

impl<S: RolloutSource> Learner<'_, S> {
    /// Loads the stage's conversations and packs them into rows.
    pub(super) fn sft_schedule(&self, index: usize, stage: &StageConfig) -> Result<SftSchedule> {
        let budget = stage.token_budget.unwrap_or(DEFAULT_SFT_TOKEN_BUDGET);
        self.conversations(&stage.name, &stage.dataset, budget, SFT_SALT ^ index as u64)
    }

    /// The conversations an RL stage's `sft_mix` adds to its steps, packed into rows.
    pub(super) fn sft_mix_schedule(
        &self,
        index: usize,
        stage: &StageConfig,
        mix: &SftMix,
    ) -> Result<SftSchedule> {
        let budget = mix.token_budget.unwrap_or(DEFAULT_SFT_TOKEN_BUDGET);
        self.conversations(
            &stage.name,
            &mix.dataset,
            budget,
            SFT_MIX_SALT ^ index as u64,
        )
    }

    /// The best responses of the earlier RL stages an RL stage's `sft_mix.replay` names,
    /// packed into rows; `None` when it names none (or they kept none).
    pub(super) fn replay_schedule(
        &self,
        index: usize,
        stage: &StageConfig,
        mix: &SftMix,
    ) -> Result<Option<SftSchedule>> {
        if mix.replay.is_empty() {
            return Ok(None);
        }
        let config = &self.opts.config;
        let budget = mix.token_budget.unwrap_or(DEFAULT_SFT_TOKEN_BUDGET);
        let mut examples = Vec::new();
        let mut too_long = 0;
        for name in &mix.replay {
            let Some(earlier) = config.stages[..index].iter().position(|s| &s.name == name) else {
                return Err(crate::error::LearnerError::InvalidConfig(format!(
                    "stage {}: sft_mix.replay names {name:?}, which is not an earlier stage",
                    stage.name
                )));
            };
            let entries = best::read(&self.opts.run_dir, earlier)?;
            let before = examples.len();
            for e in entries {
                let ex = e.example();
                if ex.ids.len() > budget {
                    too_long += 1;
                } else {
                    examples.push(ex);
                }
            }
            tracing::info!(
                "stage {}: replays {} best responses of stage {name}",
                stage.name,
                examples.len() - before
            );
        }
        if examples.is_empty() {
            tracing::warn!(
                "stage {}: sft_mix.replay: the stages {:?} kept no best response; no replay rows",
                stage.name,
                mix.replay
            );
            return Ok(None);
        }
        let data = SftData {
            path: self.opts.run_dir.join(best::BEST_DIR),
            examples,
            too_long,
        };
        Ok(Some(SftSchedule::new(
            data,
            budget,
            config.learner.seed ^ SFT_REPLAY_SALT ^ index as u64,
        )))
    }

    fn conversations(
        &self,
        stage: &str,
        dataset: &DatasetEntry,
        budget: usize,
        salt: u64,
    ) -> Result<SftSchedule> {
        let config = &self.opts.config;
        let spec = config.data_spec(dataset, Kind::Sft, None)?;
        let data = load_sft_from(&spec, &self.chat, budget)?;
        if data.too_long > 0 {
            tracing::warn!(
                "stage {stage}: {} conversations longer than {budget} tokens skipped",
                data.too_long
            );
        }
        Ok(SftSchedule::new(data, budget, config.learner.seed ^ salt))
    }

    /// Runs the SFT stage to its end; `false` if stopped first.
    pub(super) fn run_sft(
        &mut self,
        index: usize,
        stage: &StageConfig,
        mut schedule: SftSchedule,
    ) -> Result<bool> {
        let schedule_lr = lr_schedule(stage);
        let micro = self.opts.config.learner.micro_batch;
        while (self.state.stage_step as usize) < stage.steps {
            if !self.agree_to_go()? {
                return Ok(false);
            }
            let t0 = Instant::now();
            let memory = StepMemory::start_on(&self.opts.device);
            let start = self.state.stage_step as usize * stage.batch_prompts;
            let rows = schedule.rows(start, stage.batch_prompts);
            // This rank's micro-batches of the step (all of them in one process).
            let part = sft_part(
                rows.len(),
                micro,
                self.group.rank(),
                self.group.world_size(),
            );
            let chunks = rows.len().div_ceil(micro.max(1));
            let mut stats =
                group::with_sink(&mut self.optimizer, self.group.as_mut(), chunks, |sink| {
                    accumulate_sft_gradients_part(
                        &self.policy.model,
                        &rows,
                        micro,
                        part,
                        sink,
                        &self.opts.device,
                        1.0,
                    )
                })?;
            stats.loss = group::sum_over_ranks(self.group.as_mut(), stats.loss)?;
            let lr = schedule_lr.lr(self.state.stage_step);
            let outcome = self.optimizer.step(lr, stats.loss, self.group.as_mut())?;
            let grad_norm = match outcome {
                StepOutcome::Applied { grad_norm, .. } => Some(grad_norm),
                StepOutcome::Skipped { .. } => None,
            };
            let step_s = t0.elapsed().as_secs_f64();
            let reading = memory.finish(&self.opts.device);
            let stage_step = self.state.stage_step;
            let (applied, due) = self.finish_step(outcome, stage);
            self.metrics.record(&SftStep {
                stage: Some(stage.name.clone()),
                stage_index: Some(index as u64),
                stage_step: Some(stage_step + 1),
                stage_steps: Some(stage.steps as u64),
                step: Some(self.state.step),
                policy_version: Some(self.state.policy_version),
                loss: Some(stats.loss),
                lr: Some(lr),
                grad_norm,
                train_tokens: Some(stats.total_tokens as u64),
                trained_tokens: Some(stats.trained_tokens as u64),
                tokens_per_s: Some(stats.total_tokens as f64 / step_s.max(1e-9)),
                step_s: Some(step_s),
                skipped: Some(!applied),
                peak_rss_mb: reading.peak_rss_mb,
                peak_heap_mb: reading.peak_heap_mb,
                device_memory_mb: reading.device_memory_mb,
                device_peak_mb: reading.device_peak_mb,
            });
            if due {
                self.publish(false)?;
            }
        }
        Ok(true)
    }
}
