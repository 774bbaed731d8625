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
//! - **RL** stages take groups from the replay log, keep those of the current stage that pass
//!   [`GroupFilter`] (bad input, staleness, all-equal rewards), take `batch_prompts` of them per
//!   optimizer step, and run GRPO ([`accumulate_grpo_gradients`] + AdamW).
//!
//! Every optimizer step advances the policy version; every `publish_every` steps, and at the
//! end of each stage, a snapshot is published. The snapshot at the end of a stage is
//! stage-final (kept forever) and already points at the next stage, which is how actors learn
//! that the stage changed. The replay position stored in a snapshot covers exactly the groups
//! decided (trained or dropped) before it, and only that position is committed to the replay
//! log, so a crash loses nothing and uses nothing twice.
//!
//! SIGTERM/SIGINT (the `stop` flag) publishes a snapshot of the last completed step and returns.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use cascade_replay::ReplayError;
use cascade_replay::{Cursors, ReaderOptions};
use cascade_shared::chat::Chat;
use cascade_shared::config::KlEstimator as KlChoice;
use cascade_shared::config::{DtypeChoice, LossAgg, RunConfig, Schedule, StageConfig};
use cascade_shared::metrics::{MetricsLog, METRICS_FILE};
use cascade_shared::model::{
    compute_dtype, random_weights, trainable_from_tensors, CausalLm, ModelConfig, Params,
};
use cascade_shared::transport::{ReceivedGroup, ReplaySource, RolloutSource, TransportError};
use cascade_shared::{Mode, RolloutGroup};
use serde_json::json;

use crate::batch::GrpoBatch;
use crate::error::{LearnerError, Result};
use crate::filter::{DropReason, FilterConfig, GroupFilter};
use crate::grpo::{GrpoConfig, KlEstimator, LossAggregation};
use crate::optim::{AdamW, AdamWConfig, StepOutcome};
use crate::outcomes::{OutcomeConfig, PromptTracker};
use crate::rng::{seeded, RngState};
use crate::schedule::{LrSchedule, ScheduleKind};
use crate::sft::{accumulate_sft_gradients, load_sft, SftSchedule};
use crate::snapshot::{self, SnapshotInput};
use crate::state::{LearnerState, STATE_FORMAT_VERSION};
use crate::train_step::accumulate_grpo_gradients;

/// File name of the chat template / special tokens config kept beside `tokenizer.json`.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

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

/// After this many × `batch_prompts` groups in a row with all-equal rewards, an RL step is
/// completed with such groups (zero advantages, weights unchanged) so that a stage whose task
/// the model cannot (or always) solve still ends.
const NO_SIGNAL_GROUPS: u64 = 8;

/// Salt of the SFT packing order.
const SFT_SALT: u64 = 0x5f73_6674_5f6f_7264;
/// Salt of the learner's RNG (prompt retirement draws).
const LEARNER_SALT: u64 = 0x6c65_6172_6e65_7221;

/// The tokenizer files of the run (copied into every snapshot).
struct TokenizerFiles {
    tokenizer_json: Vec<u8>,
    tokenizer_config_json: Option<Vec<u8>>,
    /// A directory holding them, for [`Chat::from_dir`].
    dir: PathBuf,
}

impl TokenizerFiles {
    fn from_dir(dir: &Path) -> Result<Self> {
        let read = |p: PathBuf| std::fs::read(&p).map_err(|e| LearnerError::io(&p, e));
        let tokenizer_json = read(dir.join("tokenizer.json"))?;
        let cfg = dir.join(TOKENIZER_CONFIG_FILE);
        let tokenizer_config_json = if cfg.exists() { Some(read(cfg)?) } else { None };
        Ok(TokenizerFiles {
            tokenizer_json,
            tokenizer_config_json,
            dir: dir.to_path_buf(),
        })
    }
}

/// The trained model and its variables.
struct Policy {
    cfg: ModelConfig,
    model: CausalLm,
    params: Params,
}

impl Policy {
    fn from_tensors(cfg: ModelConfig, tensors: HashMap<String, Tensor>) -> Result<Self> {
        let (model, params) = trainable_from_tensors(&cfg, tensors)?;
        Ok(Policy { cfg, model, params })
    }

    fn named_tensors(&self) -> Vec<(String, Tensor)> {
        self.params
            .vars
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
            .collect()
    }

    fn optimizer(&self, stage: &StageConfig, max_bad_steps: usize) -> Result<AdamW> {
        AdamW::new(
            self.params
                .vars
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            AdamWConfig {
                beta1: stage.betas[0],
                beta2: stage.betas[1],
                eps: 1e-8,
                weight_decay: stage.weight_decay,
                max_grad_norm: Some(stage.grad_clip),
                max_consecutive_skips: max_bad_steps.max(1) as u32,
            },
        )
    }
}

/// The dtype of the weights in memory.
fn weight_dtype(choice: DtypeChoice, device: &Device) -> DType {
    match choice {
        DtypeChoice::Auto => compute_dtype(device),
        DtypeChoice::F32 => DType::F32,
        DtypeChoice::Bf16 => DType::BF16,
        DtypeChoice::F16 => DType::F16,
    }
}

/// The run's initial model and tokenizer (`[model] path`, or the seeded random init with the
/// given or the built-in tiny tokenizer, materialised in `RUN_DIR/tokenizer/`).
fn initial_policy(opts: &LearnerOptions) -> Result<(Policy, TokenizerFiles)> {
    let config = &opts.config;
    let dtype = weight_dtype(config.model.dtype, &opts.device);
    if let Some(path) = &config.model.path {
        let dir = config.resolve(path);
        let (cfg, tensors) = cascade_shared::model::load_tensors(&dir, dtype, &opts.device)?;
        return Ok((
            Policy::from_tensors(cfg, tensors)?,
            TokenizerFiles::from_dir(&dir)?,
        ));
    }
    let init =
        config.model.init.as_ref().ok_or_else(|| {
            LearnerError::InvalidConfig("[model] has neither path nor init".into())
        })?;
    let cfg = ModelConfig::from_file(&config.resolve(&init.config))?;
    let tok_dir = opts.run_dir.join("tokenizer");
    match &init.tokenizer {
        Some(t) => {
            std::fs::create_dir_all(&tok_dir).map_err(|e| LearnerError::io(&tok_dir, e))?;
            let src = config.resolve(t);
            let dst = tok_dir.join("tokenizer.json");
            std::fs::copy(&src, &dst).map_err(|e| LearnerError::io(&src, e))?;
            // Its chat template and special-token settings, when they sit beside it.
            let src_config = src.with_file_name("tokenizer_config.json");
            if src_config.is_file() {
                let dst_config = tok_dir.join("tokenizer_config.json");
                std::fs::copy(&src_config, &dst_config)
                    .map_err(|e| LearnerError::io(&src_config, e))?;
            }
        }
        None => cascade_shared::tokenizer::write_tiny_tokenizer(&tok_dir)
            .map_err(|e| LearnerError::Model(format!("writing the tiny tokenizer: {e}")))?,
    }
    let tensors = random_weights(&cfg, init.seed, &opts.device)?
        .into_iter()
        .map(|(k, t)| Ok((k, t.to_dtype(dtype)?)))
        .collect::<Result<HashMap<_, _>>>()?;
    Ok((
        Policy::from_tensors(cfg, tensors)?,
        TokenizerFiles::from_dir(&tok_dir)?,
    ))
}

/// Per-stage data loaded lazily.
enum StageData {
    Sft(SftSchedule),
    Rl,
}

/// The learner's working state.
struct Learner<'a> {
    opts: &'a LearnerOptions,
    metrics: MetricsLog,
    snapshots: PathBuf,
    policy: Policy,
    tokenizer: TokenizerFiles,
    chat: Chat,
    state: LearnerState,
    optimizer: AdamW,
    source: ReplaySource,
    /// Groups received but not yet decided.
    queue: VecDeque<ReceivedGroup>,
    /// Replay position covering every decided group.
    consumed: Cursors,
    /// The decided position last reported as progress (backpressure follows it; retention
    /// follows only the snapshots' positions, committed at publish).
    progressed: Cursors,
    /// Version of the newest published snapshot.
    published: Option<u64>,
    steps_here: u64,
    idle_s: f64,
    stop: Arc<AtomicBool>,
}

/// Runs the learner until every stage is done, or the stop flag / `max_steps` stops it.
pub fn run_learner(opts: &LearnerOptions, stop: Arc<AtomicBool>) -> Result<LearnerSummary> {
    let started = Instant::now();
    std::fs::create_dir_all(&opts.run_dir).map_err(|e| LearnerError::io(&opts.run_dir, e))?;
    let metrics = MetricsLog::open(opts.run_dir.join(METRICS_FILE), "learner")
        .map_err(|e| LearnerError::io(opts.run_dir.join(METRICS_FILE), e))?;
    let mut learner = Learner::start(opts, metrics, stop)?;
    let exit = learner.run_stages()?;
    let summary = LearnerSummary {
        exit,
        steps: learner.steps_here,
        policy_version: learner.state.policy_version,
        idle_s: learner.idle_s,
        wall_s: started.elapsed().as_secs_f64(),
    };
    learner.metrics.emit(
        "learner_exit",
        json!({
            "status": if exit == LearnerExit::Completed { "completed" } else { "stopped" },
            "steps": summary.steps,
            "policy_version": summary.policy_version,
            "idle_s": summary.idle_s,
            "wall_s": summary.wall_s,
            "peak_rss_mb": peak_rss_mb(),
        }),
    );
    Ok(summary)
}

/// Peak resident set size of this process in MiB (Linux `VmHWM`), if known.
pub fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn grpo_config(stage: &StageConfig) -> GrpoConfig {
    GrpoConfig {
        scale_by_std: stage.std_normalize,
        advantage_eps: 1e-4,
        clip_eps_low: stage.eps_low as f32,
        clip_eps_high: stage.eps_high as f32,
        tis_cap: stage.tis_cap.map(|c| c as f32),
        // Issue 19: dual clip, KL estimator and its bound; 0 in the config = off.
        dual_clip: (stage.dual_clip > 0.0).then_some(stage.dual_clip as f32),
        kl_coef: stage.kl_coef as f32,
        kl_estimator: match stage.kl_estimator {
            KlChoice::K3 => KlEstimator::K3,
            KlChoice::K3Is => KlEstimator::K3Importance,
        },
        kl_log_ratio_max: (stage.kl_log_ratio_max > 0.0).then_some(stage.kl_log_ratio_max as f32),
        aggregation: match stage.loss_agg {
            LossAgg::Token => LossAggregation::Token,
            LossAgg::Sequence => LossAggregation::Sequence,
        },
        mask_truncated: stage.overlong_mask,
    }
}

fn lr_schedule(stage: &StageConfig) -> LrSchedule {
    LrSchedule {
        peak_lr: stage.lr,
        warmup_steps: stage.warmup_steps as u64,
        total_steps: stage.steps as u64,
        kind: match stage.schedule {
            Schedule::Constant => ScheduleKind::Constant,
            Schedule::Cosine => ScheduleKind::Cosine,
        },
        min_lr_ratio: 0.0,
    }
}

impl<'a> Learner<'a> {
    fn start(opts: &'a LearnerOptions, metrics: MetricsLog, stop: Arc<AtomicBool>) -> Result<Self> {
        let started = Instant::now();
        let config = &opts.config;
        let snapshots = opts.run_dir.join("snapshots");
        let existing = snapshot::latest_complete(&snapshots)?;
        let (policy, tokenizer, state, optimizer_file) = match existing {
            Some(info) => {
                if !opts.resume {
                    return Err(LearnerError::InvalidConfig(format!(
                        "{} already holds snapshot v{}; pass --resume to continue that run, or \
                         use a new run directory",
                        opts.run_dir.display(),
                        info.version
                    )));
                }
                let loaded = snapshot::load_snapshot(&info.dir)?;
                let cfg = ModelConfig::from_file(&info.dir.join(snapshot::CONFIG_FILE))?;
                let dtype = weight_dtype(config.model.dtype, &opts.device);
                let tensors = snapshot::load_model(&info.dir, &opts.device)?
                    .into_iter()
                    .map(|(k, t)| Ok((k, t.to_dtype(dtype)?)))
                    .collect::<Result<HashMap<_, _>>>()?;
                let policy = Policy::from_tensors(cfg, tensors)?;
                let tokenizer = TokenizerFiles::from_dir(&info.dir)?;
                tracing::info!(
                    "resuming from snapshot v{} (step {}, stage {}, stage step {})",
                    info.version,
                    loaded.state.step,
                    loaded.state.stage_index,
                    loaded.state.stage_step
                );
                let opt_file =
                    (loaded.state.stage_step > 0).then(|| info.dir.join(snapshot::OPTIMIZER_FILE));
                (policy, tokenizer, loaded.state, opt_file)
            }
            None => {
                let (policy, tokenizer) = initial_policy(opts)?;
                let state = LearnerState {
                    format_version: STATE_FORMAT_VERSION,
                    step: 0,
                    policy_version: 0,
                    stage_index: 0,
                    stage_step: 0,
                    rng: RngState::capture(&seeded(config.actor.seed ^ LEARNER_SALT)),
                    replay_cursors: serde_json::to_value(Cursors::default())
                        .expect("cursors serialise"),
                    curriculum: json!({}),
                    filter_metrics: Default::default(),
                    prompt_tracker: None,
                };
                (policy, tokenizer, state, None)
            }
        };
        let chat = Chat::from_dir(&tokenizer.dir)?;
        let stage_cfg = config
            .stages
            .get(state.stage_index as usize)
            .or(config.stages.last())
            .ok_or_else(|| LearnerError::InvalidConfig("the run has no stage".into()))?;
        let mut optimizer = policy.optimizer(stage_cfg, config.learner.max_bad_steps)?;
        if let Some(file) = optimizer_file {
            optimizer.load(&file)?;
        }
        let consumed: Cursors = serde_json::from_value(state.replay_cursors.clone())
            .map_err(|e| LearnerError::InvalidConfig(format!("snapshot replay cursors: {e}")))?;
        let replay_root = opts.run_dir.join("replay");
        std::fs::create_dir_all(&replay_root).map_err(|e| LearnerError::io(&replay_root, e))?;
        let source = ReplaySource::open(
            &replay_root,
            ReaderOptions::default(),
            (!consumed.actors.is_empty()).then(|| consumed.clone()),
        )?;
        let mut learner = Learner {
            opts,
            metrics,
            published: snapshot::read_latest(&snapshots),
            snapshots,
            policy,
            tokenizer,
            chat,
            state,
            optimizer,
            source,
            queue: VecDeque::new(),
            progressed: consumed.clone(),
            consumed,
            steps_here: 0,
            idle_s: 0.0,
            stop,
        };
        if learner.published.is_none() {
            // Version 0: the initial weights, kept as the start of stage 0.
            learner.publish(true)?;
        } else {
            learner.metrics.emit(
                "resume",
                json!({
                    "policy_version": learner.state.policy_version,
                    "step": learner.state.step,
                    "stage_index": learner.state.stage_index,
                    "stage_step": learner.state.stage_step,
                    "resume_s": started.elapsed().as_secs_f64(),
                }),
            );
        }
        Ok(learner)
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
            || self.opts.max_steps.is_some_and(|m| self.steps_here >= m)
    }

    /// Publishes the current state as snapshot `policy_version` (unless already published)
    /// and commits the replay position it covers.
    fn publish(&mut self, stage_final: bool) -> Result<()> {
        let version = self.state.policy_version;
        if self.published == Some(version) {
            return Ok(());
        }
        let started = Instant::now();
        self.state.replay_cursors = serde_json::to_value(&self.consumed)
            .map_err(|e| LearnerError::InvalidConfig(format!("replay cursors: {e}")))?;
        let model = self.policy.named_tensors();
        let config_json = serde_json::to_vec_pretty(&self.policy.cfg.to_hf_json(
            match self.policy.model.dtype() {
                DType::BF16 => "bfloat16",
                DType::F16 => "float16",
                _ => "float32",
            },
        ))
        .map_err(|e| LearnerError::InvalidConfig(format!("config.json: {e}")))?;
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
                optimizer: &self.optimizer,
                state: &self.state,
                config_json: &config_json,
                tokenizer_json: &self.tokenizer.tokenizer_json,
                extra_files: &extra,
                stage_final,
            },
        )?;
        self.published = Some(version);
        self.source.commit_at(&self.consumed)?;
        self.progressed = self.consumed.clone();
        let deleted = snapshot::retain(&self.snapshots, self.opts.config.learner.keep_snapshots)?;
        self.metrics.emit(
            "snapshot",
            json!({
                "policy_version": version,
                "stage_index": self.state.stage_index,
                "stage_final": stage_final,
                "publish_s": started.elapsed().as_secs_f64(),
                "deleted": deleted,
            }),
        );
        Ok(())
    }

    fn run_stages(&mut self) -> Result<LearnerExit> {
        let config = &self.opts.config;
        while (self.state.stage_index as usize) < config.stages.len() {
            let index = self.state.stage_index as usize;
            let stage = config.stages[index].clone();
            if config.uses_trained_reward_model(index) {
                self.ensure_reward_model(index)?;
            }
            let data = if stage.is_rl() {
                StageData::Rl
            } else {
                let budget = stage.token_budget.unwrap_or(2048);
                let data = load_sft(&config.resolve(&stage.dataset), &self.chat, budget)?;
                if data.too_long > 0 {
                    tracing::warn!(
                        "stage {}: {} conversations longer than {budget} tokens skipped",
                        stage.name,
                        data.too_long
                    );
                }
                StageData::Sft(SftSchedule::new(
                    data,
                    budget,
                    config.actor.seed ^ SFT_SALT ^ index as u64,
                ))
            };
            if self.state.stage_step == 0 {
                // A fresh optimizer per stage (its own betas, weight decay, clip).
                self.optimizer = self
                    .policy
                    .optimizer(&stage, config.learner.max_bad_steps)?;
                self.state.curriculum =
                    json!({ "reference_version": self.state.policy_version, "equal_in_a_row": 0 });
            }
            let finished = match data {
                StageData::Sft(schedule) => self.run_sft(index, &stage, schedule)?,
                StageData::Rl => self.run_rl(index, &stage)?,
            };
            if !finished {
                self.publish(false)?;
                return Ok(LearnerExit::Stopped);
            }
            // Stage end: the stage-final snapshot points at the next stage.
            if config.uses_trained_reward_model(index + 1) {
                self.ensure_reward_model(index + 1)?;
            }
            self.state.stage_index += 1;
            self.state.stage_step = 0;
            self.state.prompt_tracker = None;
            self.publish(true)?;
            self.metrics.emit(
                "stage_end",
                json!({
                    "stage": stage.name,
                    "stage_index": index,
                    "step": self.state.step,
                    "policy_version": self.state.policy_version,
                }),
            );
            tracing::info!("stage {} done at step {}", stage.name, self.state.step);
        }
        Ok(LearnerExit::Completed)
    }

    /// Trains the `[reward_model]` into `RUN_DIR/reward_model` when it is not there yet.
    fn ensure_reward_model(&mut self, _stage_index: usize) -> Result<()> {
        let dir = self
            .opts
            .run_dir
            .join(cascade_shared::config::TRAINED_REWARD_MODEL_DIR);
        if dir.join("COMPLETE").exists() {
            return Ok(());
        }
        let rm = self
            .opts
            .config
            .reward_model
            .as_ref()
            .ok_or_else(|| LearnerError::InvalidConfig("no [reward_model] section".into()))?;
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
            self.opts.config.actor.seed,
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

    /// Runs the SFT stage to its end; `false` if stopped first.
    fn run_sft(
        &mut self,
        index: usize,
        stage: &StageConfig,
        mut schedule: SftSchedule,
    ) -> Result<bool> {
        let schedule_lr = lr_schedule(stage);
        let micro = self.opts.config.learner.micro_batch;
        while (self.state.stage_step as usize) < stage.steps {
            if self.stopping() {
                return Ok(false);
            }
            let t0 = Instant::now();
            let start = self.state.stage_step as usize * stage.batch_prompts;
            let rows = schedule.rows(start, stage.batch_prompts);
            let stats = accumulate_sft_gradients(
                &self.policy.model,
                &rows,
                micro,
                &mut self.optimizer,
                &self.opts.device,
            )?;
            let lr = schedule_lr.lr(self.state.stage_step);
            let outcome = self.optimizer.step(lr, stats.loss)?;
            let grad_norm = match outcome {
                StepOutcome::Applied { grad_norm, .. } => Some(grad_norm),
                StepOutcome::Skipped { .. } => None,
            };
            let step_s = t0.elapsed().as_secs_f64();
            let stage_step = self.state.stage_step;
            let (applied, due) = self.finish_step(outcome, stage);
            self.metrics.emit(
                "sft_step",
                json!({
                    "stage": stage.name,
                    "stage_index": index,
                    "stage_step": stage_step + 1,
                    "stage_steps": stage.steps,
                    "step": self.state.step,
                    "policy_version": self.state.policy_version,
                    "loss": stats.loss,
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "train_tokens": stats.total_tokens,
                    "trained_tokens": stats.trained_tokens,
                    "tokens_per_s": stats.total_tokens as f64 / step_s.max(1e-9),
                    "step_s": step_s,
                    "skipped": !applied,
                }),
            );
            if due {
                self.publish(false)?;
            }
        }
        Ok(true)
    }

    /// The next group of the replay log, waiting; `None` when stopping.
    fn next_group(&mut self, idle: &mut f64) -> Result<Option<ReceivedGroup>> {
        loop {
            if let Some(g) = self.queue.pop_front() {
                return Ok(Some(g));
            }
            if self.stopping() {
                return Ok(None);
            }
            // About to wait: let the actors past what is decided (dropped groups and the
            // partial batch), or a batch that needs more groups than `max_inflight` would
            // never fill.
            if self.consumed != self.progressed {
                self.source.report_progress(&self.consumed)?;
                self.progressed = self.consumed.clone();
            }
            let t0 = Instant::now();
            let got = match self.source.recv(Duration::from_millis(200)) {
                Ok(g) => g,
                Err(e @ TransportError::Decode { .. }) => {
                    tracing::warn!("replay record skipped: {e}");
                    self.metrics
                        .emit("replay_error", json!({ "error": e.to_string() }));
                    Vec::new()
                }
                Err(TransportError::Replay(ReplayError::CursorLost {
                    actor,
                    next_seq,
                    oldest_seq,
                    ..
                })) => {
                    // Retention deletes only what a snapshot's position covers, so this means
                    // another consumer or an operator removed segments: read on from the oldest
                    // record still on disk (and say so).
                    tracing::warn!(
                        "{actor}: records {next_seq}..{oldest_seq} were dropped before the                          restart and deleted since; continuing at {oldest_seq}"
                    );
                    self.metrics.emit(
                        "replay_skip",
                        json!({ "actor": actor, "from_seq": next_seq, "to_seq": oldest_seq }),
                    );
                    self.consumed.actors.remove(&actor);
                    self.queue.clear();
                    self.source = ReplaySource::open(
                        self.opts.run_dir.join("replay"),
                        ReaderOptions::default(),
                        Some(self.consumed.clone()),
                    )?;
                    Vec::new()
                }
                Err(e) => return Err(e.into()),
            };
            let waited = t0.elapsed().as_secs_f64();
            *idle += waited;
            self.idle_s += waited;
            self.queue.extend(got);
        }
    }

    /// The reference model of a KL-penalised stage: the weights at the stage's start.
    fn reference_model(&self) -> Result<Option<CausalLm>> {
        let Some(v) = self.state.curriculum["reference_version"].as_u64() else {
            return Ok(None);
        };
        let dir = self.snapshots.join(snapshot::version_dir_name(v));
        let dtype = self.policy.model.dtype();
        let tensors = snapshot::load_model(&dir, &self.opts.device)?
            .into_iter()
            .map(|(k, t)| Ok((k, t.to_dtype(dtype)?)))
            .collect::<Result<HashMap<_, _>>>()?;
        Ok(Some(CausalLm::from_tensors(&self.policy.cfg, &tensors)?))
    }

    /// Runs the RL stage to its end; `false` if stopped first.
    fn run_rl(&mut self, index: usize, stage: &StageConfig) -> Result<bool> {
        let config = &self.opts.config;
        let grpo = grpo_config(stage);
        grpo.validate()?;
        let schedule_lr = lr_schedule(stage);
        let mut filter = GroupFilter::with_metrics(
            FilterConfig {
                max_staleness: stage.max_staleness_or(config.learner.max_staleness),
                drop_equal_rewards: true,
                vocab_size: self.policy.cfg.vocab_size as u32,
            },
            self.state.filter_metrics.clone(),
        )?;
        let outcome_cfg = OutcomeConfig::default();
        let mut tracker = match &self.state.prompt_tracker {
            Some(s) => PromptTracker::from_state(outcome_cfg, s)?,
            None => PromptTracker::new(outcome_cfg, config.actor.seed ^ index as u64)?,
        };
        let reference = if stage.kl_coef > 0.0 {
            self.reference_model()?
        } else {
            None
        };
        // Part of the resumable state: it decides when a no-signal step happens.
        let mut equal_in_a_row = self.state.curriculum["equal_in_a_row"]
            .as_u64()
            .unwrap_or(0);
        while (self.state.stage_step as usize) < stage.steps {
            let t0 = Instant::now();
            let mut idle = 0.0;
            let version = self.state.policy_version;
            let mut kept: Vec<RolloutGroup> = Vec::new();
            let mut kept_ids: Vec<(String, u64)> = Vec::new();
            let mut seen: Vec<RolloutGroup> = Vec::new();
            let mut other_stage = 0u64;
            let mut no_signal: Vec<(String, u64, RolloutGroup)> = Vec::new();
            // Content of the groups decided at this version: a restarted actor regenerates
            // exactly the groups it wrote before it died (same weights, same keys), which must
            // not count twice.
            let mut decided: std::collections::HashSet<u64> = Default::default();
            let mut duplicates = 0u64;
            let mut no_signal_step = false;
            let before = filter.metrics().clone();
            while kept.len() < stage.batch_prompts {
                let Some(rg) = self.next_group(&mut idle)? else {
                    // Stopping: the undecided groups stay in the log for the resumed run.
                    self.state.filter_metrics = filter.metrics().clone();
                    self.state.prompt_tracker = Some(tracker.state());
                    return Ok(false);
                };
                // Decided from here on: the snapshot position moves past it.
                self.consumed
                    .actors
                    .insert(rg.actor.clone(), rg.cursor_after);
                if !decided.insert(content_hash(&rg.group)) {
                    duplicates += 1;
                    continue;
                }
                let verdict = (rg.group.stage_index as usize == index)
                    .then(|| filter.admit(&rg.group, version));
                let rewards: Vec<f32> = rg.group.samples.iter().map(|s| s.reward).collect();
                match verdict {
                    None => other_stage += 1,
                    Some(Ok(())) => {
                        equal_in_a_row = 0;
                        kept_ids.push((rg.actor.clone(), rg.seq));
                        tracker.record(rg.group.prompt_id, &rewards);
                        seen.push(rg.group.clone());
                        kept.push(rg.group);
                    }
                    Some(Err(DropReason::EqualRewards)) => {
                        tracker.record(rg.group.prompt_id, &rewards);
                        seen.push(rg.group.clone());
                        if no_signal.len() >= stage.batch_prompts {
                            no_signal.remove(0);
                        }
                        no_signal.push((rg.actor.clone(), rg.seq, rg.group));
                        equal_in_a_row += 1;
                        if equal_in_a_row >= NO_SIGNAL_GROUPS * stage.batch_prompts as u64
                            && kept.len() + no_signal.len() >= stage.batch_prompts
                        {
                            // Nothing to learn from for a long while: complete the step with
                            // these groups (zero advantages) so the stage still ends in
                            // bounded time; the weights do not change.
                            for (actor, seq, group) in no_signal.drain(..) {
                                if kept.len() < stage.batch_prompts {
                                    kept_ids.push((actor, seq));
                                    kept.push(group);
                                }
                            }
                            no_signal_step = true;
                            equal_in_a_row = 0;
                        }
                        if equal_in_a_row == 4 * stage.batch_prompts as u64 {
                            tracing::warn!(
                                "stage {}: the last {equal_in_a_row} groups all had equal rewards \
                                 (every sample right, or every sample wrong): nothing to learn \
                                 from; is the task too hard or too easy for this model?",
                                stage.name
                            );
                            self.metrics.emit(
                                "warning",
                                json!({ "stage": stage.name, "equal_reward_groups_in_a_row": equal_in_a_row }),
                            );
                        }
                    }
                    Some(Err(DropReason::Stale { .. })) => seen.push(rg.group),
                    Some(Err(DropReason::BadInput(_))) => {}
                }
            }
            let batch = GrpoBatch::from_groups(&kept, &grpo)?;
            let stats = accumulate_grpo_gradients(
                &self.policy.model,
                reference.as_ref(),
                &batch,
                config.learner.micro_batch,
                &grpo,
                &mut self.optimizer,
                &self.opts.device,
            )?;
            let lr = schedule_lr.lr(self.state.stage_step);
            let outcome = if no_signal_step {
                self.optimizer.zero_grad();
                StepOutcome::Applied { grad_norm: 0.0, lr }
            } else {
                self.optimizer.step(lr, stats.loss)?
            };
            let grad_norm = match outcome {
                StepOutcome::Applied { grad_norm, .. } => Some(grad_norm),
                StepOutcome::Skipped { .. } => None,
            };
            self.state.filter_metrics = filter.metrics().clone();
            self.state.prompt_tracker = Some(tracker.state());
            self.state.curriculum["equal_in_a_row"] = json!(equal_in_a_row);
            let stage_step = self.state.stage_step;
            let step_s = t0.elapsed().as_secs_f64();
            let compute_s = (step_s - idle).max(1e-9);
            let (applied, due) = self.finish_step(outcome, stage);
            let after = filter.metrics();
            let lags: Vec<u64> = kept
                .iter()
                .map(|g| version.saturating_sub(g.min_policy_version()))
                .collect();
            self.metrics.emit(
                "learner_step",
                json!({
                    "stage": stage.name,
                    "stage_kind": stage.kind.as_str(),
                    "stage_index": index,
                    "stage_step": stage_step + 1,
                    "stage_steps": stage.steps,
                    "step": self.state.step,
                    "policy_version": self.state.policy_version,
                    "loss": stats.loss,
                    "grad_norm": grad_norm,
                    "lr": lr,
                    "train_tokens": batch.total_tokens(),
                    "trained_tokens": batch.trained_tokens(),
                    "tokens_per_s": batch.total_tokens() as f64 / compute_s,
                    "step_s": step_s,
                    "idle_s": idle,
                    "reward_mean": mean_reward(seen.iter()),
                    "by_mode": by_mode(&seen),
                    "policy_lag": lags,
                    "groups_kept": kept.len(),
                    "rollouts": kept_ids,
                    "dropped": {
                        "stale": after.stale - before.stale,
                        "equal_rewards": after.equal_rewards - before.equal_rewards,
                        "bad_input": after.bad_input() - before.bad_input(),
                        "other_stage": other_stage,
                        "duplicate": duplicates,
                    },
                    "queue_depth": self.queue.len(),
                    "clip_fraction": stats.clipped_tokens / stats.tokens.max(1.0),
                    // Issue 19: what bounds the objective did on this batch.
                    "ratio_mean": stats.ratio_sum / stats.tokens.max(1.0),
                    "ratio_max": stats.ratio_max,
                    "dual_clip_fraction": stats.dual_clipped_tokens / stats.tokens.max(1.0),
                    "kl_mean": stats.kl_sum / stats.tokens.max(1.0),
                    "kl_max": stats.kl_max,
                    "kl_bounded_fraction": stats.kl_bounded_tokens / stats.tokens.max(1.0),
                    "ref_log_ratio_max": stats.ref_log_ratio_max,
                    "no_signal": no_signal_step,
                    "skipped": !applied,
                }),
            );
            if due {
                self.publish(false)?;
            }
        }
        Ok(true)
    }
}

/// A hash of what a group contains (prompt, responses, versions): equal for a group an actor
/// regenerated after a restart.
fn content_hash(g: &RolloutGroup) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (g.stage_index, g.prompt_id, g.actor_id, &g.prompt_ids).hash(&mut h);
    for s in &g.samples {
        s.response_ids.hash(&mut h);
        for v in &s.policy_versions {
            (v.start_token, v.version).hash(&mut h);
        }
    }
    h.finish()
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
fn by_mode(groups: &[RolloutGroup]) -> serde_json::Value {
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
            json!({
                "groups": of_mode.len(),
                "reward_mean": samples.iter().map(|s| f64::from(s.reward)).sum::<f64>() / n,
                "pass_rate": samples.iter().filter(|s| s.reward >= 1.0).count() as f64 / n,
                "response_len": samples.iter().map(|s| s.response_ids.len() as f64).sum::<f64>() / n,
            }),
        );
    }
    json!(out)
}
