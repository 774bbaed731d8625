//! One RL stage: GRPO steps on the groups the filter admits, until the stage's step count.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use cascade_shared::config::StageConfig;
use cascade_shared::intake;
use cascade_shared::metrics::{LearnerStep, ModeStats, StepMemory};
use cascade_shared::model::CausalLm;
use cascade_shared::outcomes::PromptTracker;
use cascade_shared::snapshot::{self, version_dir_name};
use cascade_shared::transport::RolloutSource;
use cascade_shared::{Mode, RolloutGroup};

use super::best;
use super::group::{self, Command};
use super::intake::StepBatch;
use super::settings::{filter_config, grpo_config, lr_schedule};
use super::Learner;
use crate::batch::GrpoBatch;
use crate::error::{LearnerError, Result};
use crate::filter::GroupFilter;
use crate::optim::StepOutcome;
use crate::sft::{accumulate_sft_gradients_part, sft_part};
use crate::train_step::accumulate_grpo_gradients_part;

impl<S: RolloutSource> Learner<'_, S> {
    /// The reference model of a KL-penalised stage: the weights at the stage's start.
    fn reference_model(&self) -> Result<Option<CausalLm>> {
        let Some(v) = self.state.stage_progress.reference_version else {
            return Ok(None);
        };
        let dir = self.snapshots.join(version_dir_name(v));
        let dtype = self.policy.model.dtype();
        let tensors = snapshot::load_model(&dir, &self.opts.device)?
            .into_iter()
            .map(|(k, t)| Ok((k, t.to_dtype(dtype)?)))
            .collect::<Result<HashMap<_, _>>>()?;
        Ok(Some(CausalLm::from_tensors(&self.policy.cfg, &tensors)?))
    }

    /// Runs the RL stage to its end; `false` if stopped first.
    pub(super) fn run_rl(&mut self, index: usize, stage: &StageConfig) -> Result<bool> {
        let config = &self.opts.config;
        let grpo = grpo_config(stage);
        grpo.validate()?;
        let schedule_lr = lr_schedule(stage);
        let mut filter = GroupFilter::resume(
            filter_config(config, index, stage, self.policy.cfg.vocab_size),
            self.state.filter_metrics.clone(),
            self.state.stage_progress.equal_in_a_row,
            self.state.stage_progress.groups_decided,
        )?;
        let mut tracker = match &self.state.prompt_tracker {
            Some(s) => PromptTracker::from_state(config.outcomes.clone(), s)?,
            None => PromptTracker::new(config.outcomes.clone(), config.learner.seed ^ index as u64),
        };
        let reference = if stage.kl_coef > 0.0 {
            self.reference_model()?
        } else {
            None
        };
        let mut sft_mix = match &stage.sft_mix {
            Some(mix) => Some((
                mix,
                self.sft_mix_schedule(index, stage, mix)?,
                self.replay_schedule(index, stage, mix)?,
            )),
            None => None,
        };
        // A later stage replays this one's best responses: cut the file back to the state
        // this stage starts or resumes from (rank 0 writes it).
        let record_best = config.replayed_later(index) && self.leads();
        if record_best {
            best::truncate_after(&self.opts.run_dir, index, self.state.step)?;
        }
        let on_policy = stage.max_staleness_or(config.learner.max_staleness) == 0;
        while (self.state.stage_step as usize) < stage.steps {
            let t0 = Instant::now();
            let memory = StepMemory::start_on(&self.opts.device);
            let version = self.state.policy_version;
            let before = filter.metrics().clone();
            // Once this batch is decided, no group of this version or older will be trained on:
            // strictly on-policy after every step, and in any mode after the stage's last.
            let close = on_policy || self.state.stage_step as usize + 1 == stage.steps;
            let Some(step) = self.next_step(&mut filter, &mut tracker, stage, close)? else {
                self.state.filter_metrics = filter.metrics().clone();
                self.state.prompt_tracker = Some(tracker.state());
                return Ok(false);
            };
            // learner.token_budget > 0: samples packed into rows of at most that many tokens
            // (0: one padded sample per row); `micro_batch` rows per forward either way.
            let batch = GrpoBatch::from_groups(&step.kept, &grpo)?
                .with_token_budget(config.learner.token_budget)?;
            // This rank's micro-batches (all of them in one process); the statistics of all.
            let micro_batches = batch.micro_batch_ranges(config.learner.micro_batch).len();
            let part = group::my_part(self.group.as_ref(), micro_batches);
            let stats = group::with_sink(
                &mut self.optimizer,
                self.group.as_mut(),
                micro_batches,
                |sink| {
                    accumulate_grpo_gradients_part(
                        &self.policy.model,
                        reference.as_ref(),
                        &batch,
                        config.learner.micro_batch,
                        part,
                        &grpo,
                        sink,
                        &self.opts.device,
                    )
                },
            )?;
            let stats = group::reduce_grpo_stats(self.group.as_mut(), &stats)?;
            // sft_mix: coef × the mean NLL of the next rows of SFT conversations, added to the
            // GRPO loss (skipped with it on a step without signal).
            let mix_stats = match (&mut sft_mix, step.no_signal) {
                (Some((mix, rows, replay)), false) => {
                    let start = self.state.stage_step as usize * mix.rows;
                    let mut rows = rows.rows(start, mix.rows);
                    if let Some(replay) = replay {
                        let start = self.state.stage_step as usize * mix.replay_rows;
                        rows.extend(replay.rows(start, mix.replay_rows));
                    }
                    let part = sft_part(
                        rows.len(),
                        config.learner.micro_batch,
                        self.group.rank(),
                        self.group.world_size(),
                    );
                    let chunks = rows.len().div_ceil(config.learner.micro_batch.max(1));
                    let mut stats = group::with_sink(
                        &mut self.optimizer,
                        self.group.as_mut(),
                        chunks,
                        |sink| {
                            accumulate_sft_gradients_part(
                                &self.policy.model,
                                &rows,
                                config.learner.micro_batch,
                                part,
                                sink,
                                &self.opts.device,
                                mix.coef,
                            )
                        },
                    )?;
                    stats.loss = group::sum_over_ranks(self.group.as_mut(), stats.loss)?;
                    Some((mix.coef, stats))
                }
                _ => None,
            };
            let loss = stats.loss + mix_stats.map_or(0.0, |(coef, m)| coef * m.loss);
            let lr = schedule_lr.lr(self.state.stage_step);
            let outcome = if step.no_signal {
                self.optimizer.zero_grad();
                StepOutcome::Applied { grad_norm: 0.0, lr }
            } else {
                self.optimizer.step(lr, loss, self.group.as_mut())?
            };
            let grad_norm = match outcome {
                StepOutcome::Applied { grad_norm, .. } => Some(grad_norm),
                StepOutcome::Skipped { .. } => None,
            };
            self.state.filter_metrics = filter.metrics().clone();
            self.state.prompt_tracker = Some(tracker.state());
            self.state.stage_progress.equal_in_a_row = filter.equal_in_a_row();
            self.state.stage_progress.groups_decided = filter.decided();
            let stage_step = self.state.stage_step;
            let step_s = t0.elapsed().as_secs_f64();
            let compute_s = (step_s - step.idle_s).max(1e-9);
            let (applied, due) = self.finish_step(outcome, stage);
            if record_best && applied && !step.no_signal {
                // Synced before this step can be published.
                let kept = best::best_of(self.state.step, &step.kept);
                best::append(&self.opts.run_dir, index, &kept)?;
            }
            let reading = memory.finish(&self.opts.device);
            let after = filter.metrics();
            let lags: Vec<u64> = step
                .kept
                .iter()
                .map(|g| version.saturating_sub(g.min_policy_version()))
                .collect();
            let dropped = BTreeMap::from([
                ("stale".to_string(), after.stale - before.stale),
                (
                    "equal_rewards".to_string(),
                    after.equal_rewards - before.equal_rewards,
                ),
                (
                    "bad_input".to_string(),
                    after.bad_input() - before.bad_input(),
                ),
                (
                    "other_stage".to_string(),
                    after.other_stage - before.other_stage,
                ),
                ("duplicate".to_string(), after.duplicate - before.duplicate),
            ]);
            self.metrics.record(&LearnerStep {
                stage: Some(stage.name.clone()),
                stage_kind: Some(stage.kind.as_str().to_string()),
                stage_index: Some(index as u64),
                stage_step: Some(stage_step + 1),
                stage_steps: Some(stage.steps as u64),
                step: Some(self.state.step),
                policy_version: Some(self.state.policy_version),
                loss: Some(stats.loss),
                sft_mix_loss: mix_stats.map(|(_, m)| m.loss),
                grad_norm,
                lr: Some(lr),
                train_tokens: Some(batch.total_tokens() as u64),
                trained_tokens: Some(batch.trained_tokens() as u64),
                tokens_per_s: Some(batch.total_tokens() as f64 / compute_s),
                step_s: Some(step_s),
                idle_s: Some(step.idle_s),
                reward_mean: mean_reward(step.seen.iter()),
                by_mode: Some(by_mode(&step.seen)),
                policy_lag: Some(lags),
                groups_kept: Some(step.kept.len() as u64),
                rollouts: Some(step.kept_ids),
                dropped: Some(dropped),
                queue_depth: Some(self.queue.len() as u64),
                clip_fraction: Some(stats.clipped_tokens / stats.tokens.max(1.0)),
                // Issue 19: what bounds the objective did on this batch.
                ratio_mean: Some(stats.ratio_sum / stats.tokens.max(1.0)),
                ratio_max: Some(stats.ratio_max),
                dual_clip_fraction: Some(stats.dual_clipped_tokens / stats.tokens.max(1.0)),
                kl_mean: Some(stats.kl_sum / stats.tokens.max(1.0)),
                kl_max: Some(stats.kl_max),
                kl_bounded_fraction: Some(stats.kl_bounded_tokens / stats.tokens.max(1.0)),
                ref_log_ratio_max: Some(stats.ref_log_ratio_max),
                no_signal: Some(step.no_signal),
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

impl<S: RolloutSource> Learner<'_, S> {
    /// The groups of the next step: rank 0 fills the batch and tells the other ranks; they
    /// wait for it (through rank 0's heartbeats). `None`: stop.
    ///
    /// With `close`, rank 0 tells the actors when the batch is decided ([`intake`]): every
    /// later group of this version or older would be dropped (as stale, or of another stage).
    fn next_step(
        &mut self,
        filter: &mut GroupFilter,
        tracker: &mut PromptTracker,
        stage: &StageConfig,
        close: bool,
    ) -> Result<Option<StepBatch>> {
        if self.leads() {
            let replay = self.opts.run_dir.join("replay");
            let version = self.state.policy_version;
            let io = |e: std::io::Error| LearnerError::Io {
                path: replay.join(intake::CLOSED_FILE),
                source: e,
            };
            // A marker closing this version (a resumed learner, a skipped step) would keep the
            // actors from generating the groups this step waits for.
            intake::reopen(&replay, version).map_err(io)?;
            // Checked here too, not only when the queue runs dry: a backlog of queued groups
            // must not delay a stop (SIGTERM, max_steps); undecided groups stay in the log.
            let step = if self.stopping() {
                None
            } else {
                self.fill_batch(filter, tracker, stage.batch_prompts, &stage.name)?
            };
            if close && step.is_some() {
                intake::close(&replay, version)?;
            }
            if self.group.world_size() == 1 {
                return Ok(step);
            }
            let Some(mut step) = step else {
                group::broadcast_command(self.group.as_mut(), Some(&Command::Stop))?;
                return Ok(None);
            };
            let command = Command::Step {
                kept: std::mem::take(&mut step.kept),
                no_signal: step.no_signal,
            };
            group::broadcast_command(self.group.as_mut(), Some(&command))?;
            if let Command::Step { kept, .. } = command {
                step.kept = kept;
            }
            return Ok(Some(step));
        }
        loop {
            match group::broadcast_command(self.group.as_mut(), None)? {
                Command::Wait => continue,
                Command::Stop => return Ok(None),
                Command::Step { kept, no_signal } => {
                    return Ok(Some(StepBatch {
                        kept,
                        no_signal,
                        ..StepBatch::default()
                    }))
                }
                Command::Go => {
                    return Err(LearnerError::State(format!(
                        "rank {}: an SFT step command in an RL stage",
                        self.group.rank()
                    )))
                }
            }
        }
    }
}

fn mean_reward<'g>(groups: impl Iterator<Item = &'g RolloutGroup>) -> Option<f64> {
    let (mut sum, mut n) = (0.0, 0usize);
    for g in groups {
        for s in &g.samples {
            sum += f64::from(s.reward);
            n += 1;
        }
    }
    (n > 0).then(|| sum / n as f64)
}

/// Per-mode reward mean, pass rate (fraction of samples with reward ≥ 1) and response length.
fn by_mode(groups: &[RolloutGroup]) -> BTreeMap<String, ModeStats> {
    let mut out = BTreeMap::new();
    for mode in [Mode::Think, Mode::NoThink] {
        let of_mode: Vec<&RolloutGroup> = groups.iter().filter(|g| g.mode == mode).collect();
        if of_mode.is_empty() {
            continue;
        }
        let samples: Vec<_> = of_mode.iter().flat_map(|g| g.samples.iter()).collect();
        let n = samples.len().max(1) as f64;
        out.insert(
            mode.as_str().to_string(),
            ModeStats {
                groups: Some(of_mode.len() as u64),
                reward_mean: Some(samples.iter().map(|s| f64::from(s.reward)).sum::<f64>() / n),
                pass_rate: Some(samples.iter().filter(|s| s.reward >= 1.0).count() as f64 / n),
                response_len: Some(
                    samples
                        .iter()
                        .map(|s| s.response_ids.len() as f64)
                        .sum::<f64>()
                        / n,
                ),
            },
        );
    }
    out
}
