//! The learner process: the cascade's stage controller.
//!
//! On a fresh run directory it builds the initial model (`[model] path` or its seeded random
//! init) and publishes it as snapshot `v000000` (stage 0, stage-final so it is kept). With
//! `resume` it restores everything from the newest complete snapshot instead: weights, the
//! optimizer moments of the current stage, step, policy version, stage pointer, RNG, replay
//! cursors, filtering counters and prompt outcomes.
//!
//! Then it walks the stages in order:
//! - **SFT** stages train on packed conversations ([`crate::sft`]);
//! - before the first stage that uses the reward model `[reward_model]` trains, that model is
//!   trained (from the current weights) into `RUN_DIR/reward_model/`;
//! - **RL** stages take groups from a [`RolloutSource`] (the replay log), keep those the
//!   [`crate::filter::GroupFilter`] admits (stage, bad input, duplicates, staleness, all-equal
//!   rewards, no-signal steps), take `batch_prompts` of them per optimizer step, and run GRPO
//!   ([`crate::train_step::accumulate_grpo_gradients`] + AdamW).
//!
//! Every optimizer step advances the policy version; every `publish_every` steps, and at the
//! end of each stage, a snapshot is published. The snapshot at the end of a stage is
//! stage-final (kept forever) and already points at the next stage, which is how actors learn
//! that the stage changed. The replay position stored in a snapshot covers exactly the groups
//! decided (trained or dropped) before it, and only that position is committed to the replay
//! log, so a crash loses nothing and uses nothing twice.
//!
//! SIGTERM/SIGINT (the `stop` flag) publishes a snapshot of the last completed step and returns.
//!
//! Several processes can form one learner ([`run_learner_in_group`], [`group`]): rank 0 leads
//! (replay, decisions, metrics, snapshots), every rank trains its share of each step, and the
//! optimizer state is sharded over the ranks.
//!
//! The pieces: [`start`] (fresh or resumed), [`settings`] (a stage's config translated into
//! the learner's settings), [`intake`] (groups in, one step's batch out), [`sft`] and [`rl`]
//! (one stage each), [`publish`] (snapshots and the replay position they cover).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use candle_core::Device;
use cascade_shared::chat::Chat;
use cascade_shared::collective::{Collective, Single};
use cascade_shared::config::{RunConfig, StageConfig};
use cascade_shared::metrics::{self as events, MetricsLog, METRICS_FILE};
use cascade_shared::snapshot::LearnerState;
use cascade_shared::transport::{ReceivedGroup, RolloutSource};

use crate::error::{LearnerError, Result};
use crate::optim::StepOutcome;

pub mod best;
mod group;
mod intake;
mod publish;
mod rl;
mod settings;
mod sft;
mod start;

use group::TrainOptimizer;
use start::{Policy, TokenizerFiles};

/// Everything a learner run needs.
#[derive(Debug, Clone)]
pub struct LearnerOptions {
    /// The run directory (`snapshots/`, `replay/`, `metrics.jsonl`).
    pub run_dir: PathBuf,
    /// Compute device.
    pub device: Device,
    /// The run config, `[learner]` overrides applied.
    pub config: RunConfig,
    /// Continue from the newest complete snapshot (required when one exists).
    pub resume: bool,
    /// Stop (with a snapshot) after this many optimizer steps in this process (tests).
    pub max_steps: Option<u64>,
}

/// How a learner run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LearnerExit {
    /// Every stage finished.
    Completed,
    /// Stopped by the stop flag or `max_steps`, after publishing a snapshot.
    Stopped,
}

/// What a learner run did.
#[derive(Debug, Clone, PartialEq)]
pub struct LearnerSummary {
    /// How it ended.
    pub exit: LearnerExit,
    /// Optimizer steps applied in this process.
    pub steps: u64,
    /// Policy version at the end.
    pub policy_version: u64,
    /// Seconds spent waiting for rollouts / in total.
    pub idle_s: f64,
    /// Wall-clock seconds of the run.
    pub wall_s: f64,
}

/// The learner's working state, generic over where its rollouts come from.
struct Learner<'a, S: RolloutSource> {
    opts: &'a LearnerOptions,
    metrics: MetricsLog,
    snapshots: PathBuf,
    policy: Policy,
    tokenizer: TokenizerFiles,
    chat: Chat,
    state: LearnerState,
    optimizer: TrainOptimizer,
    /// The rollout source; rank 0 only (the other ranks get each step's groups from it).
    source: Option<S>,
    /// The learner group ([`Single`] for one process).
    group: Box<dyn Collective>,
    /// Groups received but not yet decided.
    queue: VecDeque<ReceivedGroup<S::Mark>>,
    /// Source position covering every decided group.
    consumed: S::Position,
    /// The decided position last reported as progress (backpressure follows it; retention
    /// follows only the snapshots' positions, committed at publish).
    progressed: S::Position,
    /// Version of the newest published snapshot.
    published: Option<u64>,
    steps_here: u64,
    /// The stage step of the last checkpoint (`learner.checkpoint_every`).
    checkpointed_at: u64,
    idle_s: f64,
    stop: Arc<AtomicBool>,
    /// When rank 0 last told the group it is waiting ([`intake`]).
    heartbeat: Instant,
}

/// Runs the learner until every stage is done, or the stop flag / `max_steps` stops it.
pub fn run_learner(opts: &LearnerOptions, stop: Arc<AtomicBool>) -> Result<LearnerSummary> {
    run_learner_in_group(opts, stop, Box::new(Single))
}

/// [`run_learner`] as one rank of a learner group (every rank calls it with the same config
/// and run directory). Rank 0 leads and logs; the stop flag and `max_steps` act through rank 0
/// (the other ranks stop when it does). A rank that dies or stops answering makes the others
/// fail with [`LearnerError::Collective`] within the group's timeout.
pub fn run_learner_in_group(
    opts: &LearnerOptions,
    stop: Arc<AtomicBool>,
    group: Box<dyn Collective>,
) -> Result<LearnerSummary> {
    let started = Instant::now();
    std::fs::create_dir_all(&opts.run_dir).map_err(|e| LearnerError::io(&opts.run_dir, e))?;
    let metrics = if group.rank() == 0 {
        MetricsLog::open(opts.run_dir.join(METRICS_FILE), "learner")
            .map_err(|e| LearnerError::io(opts.run_dir.join(METRICS_FILE), e))?
    } else {
        MetricsLog::disabled()
    };
    let mut learner = Learner::start(opts, metrics, stop, group)?;
    let exit = learner.run_stages()?;
    let summary = LearnerSummary {
        exit,
        steps: learner.steps_here,
        policy_version: learner.state.policy_version,
        idle_s: learner.idle_s,
        wall_s: started.elapsed().as_secs_f64(),
    };
    learner.metrics.record(&events::LearnerExit {
        status: Some(
            match exit {
                LearnerExit::Completed => "completed",
                LearnerExit::Stopped => "stopped",
            }
            .into(),
        ),
        steps: Some(summary.steps),
        policy_version: Some(summary.policy_version),
        idle_s: Some(summary.idle_s),
        wall_s: Some(summary.wall_s),
        peak_rss_mb: peak_rss_mb(),
    });
    Ok(summary)
}

/// Peak resident set size of this process in MiB (Linux `VmHWM`), if known.
pub fn peak_rss_mb() -> Option<f64> {
    cascade_shared::metrics::peak_rss_mb()
}

impl<S: RolloutSource> Learner<'_, S> {
    /// Rank 0 of the group (the only rank of a single process).
    fn leads(&self) -> bool {
        self.group.rank() == 0
    }

    /// Whether rank 0 should stop (the other ranks follow its commands).
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
            || self.opts.max_steps.is_some_and(|m| self.steps_here >= m)
    }

    /// Rank 0 decides whether to run the next (SFT) step and tells the others; `false`: stop.
    fn agree_to_go(&mut self) -> Result<bool> {
        let mine = self.leads().then(|| {
            if self.stopping() {
                group::Command::Stop
            } else {
                group::Command::Go
            }
        });
        match group::broadcast_command(self.group.as_mut(), mine.as_ref())? {
            group::Command::Go => Ok(true),
            group::Command::Stop => Ok(false),
            other => Err(LearnerError::State(format!(
                "rank {}: expected an SFT step command, got {other:?}",
                self.group.rank()
            ))),
        }
    }

    fn run_stages(&mut self) -> Result<LearnerExit> {
        let config = &self.opts.config;
        while (self.state.stage_index as usize) < config.stages.len() {
            let index = self.state.stage_index as usize;
            let stage = config.stages[index].clone();
            self.policy
                .model
                .set_checkpoint_every(config.learner.activation_checkpointing);
            if config.uses_trained_reward_model(index) {
                self.ensure_reward_model()?;
            }
            let sft = if stage.is_rl() {
                None
            } else {
                Some(self.sft_schedule(index, &stage)?)
            };
            if self.state.stage_step == 0 {
                // A fresh optimizer per stage (its own betas, weight decay, clip).
                self.optimizer =
                    self.policy
                        .optimizer(&stage, &config.learner, self.group.as_ref())?;
                self.state.stage_progress = cascade_shared::snapshot::StageProgress {
                    reference_version: Some(self.state.policy_version),
                    equal_in_a_row: 0,
                    groups_decided: 0,
                };
            }
            let finished = match sft {
                Some(schedule) => self.run_sft(index, &stage, schedule)?,
                None => self.run_rl(index, &stage)?,
            };
            if !finished {
                self.publish(false)?;
                return Ok(LearnerExit::Stopped);
            }
            // Stage end: the stage-final snapshot points at the next stage.
            if config.uses_trained_reward_model(index + 1) {
                self.ensure_reward_model()?;
            }
            self.state.stage_index += 1;
            self.state.stage_step = 0;
            self.state.prompt_tracker = None;
            self.publish(true)?;
            self.metrics.record(&events::StageEnd {
                stage: Some(stage.name.clone()),
                stage_index: Some(index as u64),
                step: Some(self.state.step),
                policy_version: Some(self.state.policy_version),
            });
            tracing::info!("stage {} done at step {}", stage.name, self.state.step);
        }
        Ok(LearnerExit::Completed)
    }

    /// Trains the `[reward_model]` into `RUN_DIR/reward_model` when it is not there yet. In a
    /// group rank 0 trains it and the other ranks wait for it to be complete (outside any
    /// collective, so the training time is not bounded by the group's timeout).
    fn ensure_reward_model(&mut self) -> Result<()> {
        let dir = self
            .opts
            .run_dir
            .join(cascade_shared::config::TRAINED_REWARD_MODEL_DIR);
        if crate::reward_train::is_complete(&dir) {
            return Ok(());
        }
        if !self.leads() {
            while !crate::reward_train::is_complete(&dir) {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            return Ok(());
        }
        // `RunConfig::validate` refuses stages that use a trained reward model without one.
        let rm = self
            .opts
            .config
            .reward_model
            .as_ref()
            .expect("a validated config trains the reward model its stages use");
        let weights = self.policy.named_tensors();
        crate::reward_run::train_for_run(
            crate::reward_run::RunRmInputs {
                cfg: &self.policy.cfg,
                weights: &weights,
                tokenizer_dir: &self.tokenizer.dir,
                tokenizer_json: &self.tokenizer.tokenizer_json,
                tokenizer_config_json: self.tokenizer.tokenizer_config_json.as_deref(),
            },
            rm,
            &self.opts.config,
            &dir,
            self.opts.config.learner.micro_batch,
            self.opts.config.learner.seed,
            &self.metrics,
        )
    }

    /// Common bookkeeping after an optimizer step: returns whether it was applied and whether a
    /// (non-final) snapshot is due. The caller logs the step first and publishes after, so that
    /// a crash between the two redoes (and re-logs) the step rather than losing its metrics.
    fn finish_step(&mut self, outcome: StepOutcome, stage: &StageConfig) -> (bool, bool) {
        let applied = matches!(outcome, StepOutcome::Applied { .. });
        if !applied {
            return (false, false);
        }
        self.state.step += 1;
        self.state.stage_step += 1;
        self.state.policy_version += 1;
        self.steps_here += 1;
        let last = self.state.stage_step as usize >= stage.steps;
        let due = !last
            && self
                .state
                .policy_version
                .is_multiple_of(self.opts.config.learner.publish_every as u64);
        (true, due)
    }
}
