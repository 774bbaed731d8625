//! The actor process: load weights, generate groups for the current stage, score them, write
//! them to the replay log, hot-reload snapshots between decode steps, stop cleanly on SIGTERM.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Device;
use cascade_replay::WriterOptions;
use cascade_rewards::code::{CodeConfig, SandboxConfig};
use cascade_rewards::ifeval::{IfEvalConfig, IfEvalMode};
use cascade_rewards::math::MathConfig;
use cascade_rewards::{CodeVerifier, IfEvalVerifier, MathVerifier, SweVerifier, Verifier};
use cascade_shared::chat::{Chat, ChatTemplate};
use cascade_shared::config::{IfStrictness, RunConfig, StageConfig, VerifierConfig};
use cascade_shared::model::{compute_dtype, load_model, random_weights, CausalLm, ModelConfig};
use cascade_shared::tokenizer::Tokenizer;
use cascade_shared::transport::{ReplaySink, RolloutSink};
use cascade_shared::{Mode, StageKind};

use crate::dataset::Dataset;
use crate::engine::{Engine, GenParams, Job};
use crate::error::{ActorError, Result};
use crate::judge::JudgeScorer;
use crate::reward_model::RewardModel;
use crate::rewards::{Detokenize, GroupContext, PipelineStats, RewardPipeline, ScoreTask};
use crate::sampler::philox::{uniform_bits, uniform_f32};
use crate::sampler::{SampleKey, SamplingParams};
use crate::snapshot_watch::SnapshotWatch;
use cascade_shared::config::OutcomeConfig;
use cascade_shared::metrics::{MetricsLog, METRICS_FILE};
use cascade_shared::outcomes::PromptTracker;
use cascade_shared::snapshot::{self, LearnerState};

/// Command-line overrides of the stage's rollout settings (`None`: the stage/config decides).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RolloutOverrides {
    /// G.
    pub group_size: Option<usize>,
    /// Temperature.
    pub temperature: Option<f32>,
    /// Top-p.
    pub top_p: Option<f32>,
    /// Top-k (0 = off).
    pub top_k: Option<usize>,
    /// Max response tokens (replaces the stage's curriculum).
    pub max_new_tokens: Option<usize>,
}

/// Everything an actor run needs.
#[derive(Debug, Clone)]
pub struct ActorOptions {
    /// The run directory (`snapshots/`, `replay/` inside).
    pub run_dir: PathBuf,
    /// This actor's id.
    pub actor_id: u32,
    /// Compute device.
    pub device: Device,
    /// The run config, `[actor]` overrides applied.
    pub config: RunConfig,
    /// Per-run overrides of the stage settings.
    pub overrides: RolloutOverrides,
    /// Stop after this many groups were handed to the reward pipeline (`None`: until SIGTERM).
    pub max_groups: Option<u64>,
}

/// What an actor run did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RunSummary {
    /// Groups written to the replay log.
    pub groups: u64,
    /// Tokens generated.
    pub tokens: u64,
    /// Prompts skipped as too long for the context.
    pub skipped_prompts: u64,
    /// Snapshots loaded / refused.
    pub snapshots_loaded: u64,
    /// Snapshots refused.
    pub snapshots_refused: u64,
    /// Decode throughput, generated tokens per second of the run.
    pub tokens_per_s: f64,
    /// Reward pipeline counters.
    pub pipeline: PipelineStats,
}

/// Salt of the per-prompt think/no-think draw (a Philox stream apart from the sampler's).
const MODE_SALT: u64 = 0x6d6f_6465_5f6d_6978;
/// Salt of the per-epoch prompt order.
const ORDER_SALT: u64 = 0x6f72_6465_725f_7368;

fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Think or no-think for a prompt: a seeded draw, `Think` with probability `mode_mix`.
pub fn choose_mode(seed: u64, prompt_id: u64, epoch: u64, mode_mix: f64) -> Mode {
    let u = uniform_f32(uniform_bits(&SampleKey {
        seed: seed ^ MODE_SALT,
        stream: prompt_id,
        position: epoch,
    }));
    if f64::from(u) < mode_mix {
        Mode::Think
    } else {
        Mode::NoThink
    }
}

/// The verifier of a domain with the stage's verifier options; `rm_dir` is the reward-model
/// checkpoint (needed by `rlhf`).
/// The verifier of a stage kind. `rm_dir` is the reward model (rlhf), `judge_dir` the SWE judge
/// model (resolved paths; `None`: no judge, the lexical fallback).
pub fn verifier_for(
    kind: StageKind,
    v: &VerifierConfig,
    rm_dir: Option<&Path>,
    judge_dir: Option<&Path>,
    device: &Device,
) -> Result<Arc<dyn Verifier>> {
    Ok(match kind {
        StageKind::Math => Arc::new(MathVerifier::new(MathConfig {
            percent_equivalence: v.math_percent_equivalence,
            ..MathConfig::default()
        })),
        StageKind::If => Arc::new(IfEvalVerifier::new(IfEvalConfig {
            mode: if v.if_strictness == IfStrictness::Loose {
                IfEvalMode::Loose
            } else {
                IfEvalMode::Strict
            },
            ..IfEvalConfig::default()
        })),
        StageKind::Code => Arc::new(
            CodeVerifier::new(CodeConfig {
                default_timeout_s: v.code_timeout_s,
                sandbox: SandboxConfig {
                    address_space_bytes: v.code_memory_mb.saturating_mul(1 << 20),
                    ..SandboxConfig::default()
                },
            })
            .map_err(|e| ActorError::Invalid(format!("code verifier: {e}")))?,
        ),
        StageKind::Swe => match judge_dir {
            Some(dir) => Arc::new(SweVerifier::new(Box::new(JudgeScorer::load(dir, device)?))),
            None => Arc::new(SweVerifier::default()),
        },
        StageKind::Rlhf => {
            let dir = rm_dir.ok_or_else(|| {
                ActorError::Invalid("the rlhf verifier needs a reward model".into())
            })?;
            Arc::new(RewardModel::load(dir, device)?)
        }
        StageKind::Sft => {
            return Err(ActorError::Invalid(
                "SFT data has no verifier (no rollouts)".into(),
            ))
        }
    })
}

/// The verifier of stage `index`. A reward model that the learner trains inside the run
/// (`[reward_model]`) is waited for (until its `COMPLETE` marker appears or `stop` is set).
pub fn build_verifier(
    index: usize,
    config: &RunConfig,
    run_dir: &Path,
    device: &Device,
    stop: &AtomicBool,
) -> Result<Arc<dyn Verifier>> {
    let stage = config.stages.get(index).ok_or_else(|| {
        ActorError::Invalid(format!("stage index {index} is not in the run config"))
    })?;
    let rm_dir = config.reward_model_dir(index, run_dir);
    if stage.kind == StageKind::Rlhf && rm_dir.is_none() {
        return Err(ActorError::Invalid(format!(
            "stage {}: rlhf needs verifier.reward_model or a [reward_model] section",
            stage.name
        )));
    }
    if let (true, Some(dir)) = (config.uses_trained_reward_model(index), &rm_dir) {
        let mut logged = false;
        while !dir.join("COMPLETE").exists() {
            if stop.load(Ordering::Relaxed) {
                return Err(ActorError::Invalid(
                    "stopped while waiting for the reward model".into(),
                ));
            }
            if !logged {
                tracing::info!("waiting for the learner to train {}", dir.display());
                logged = true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let judge = stage.verifier.swe_judge.as_ref().map(|p| config.resolve(p));
    verifier_for(
        stage.kind,
        &stage.verifier,
        rm_dir.as_deref(),
        judge.as_deref(),
        device,
    )
}

/// The settings of the stage the actor works on.
struct Stage {
    index: u32,
    config: StageConfig,
    dataset: Dataset,
    verifier: Arc<dyn Verifier>,
    params: GenParams,
    group_size: usize,
    /// Position in the dataset and epoch.
    cursor: usize,
    epoch: u64,
    order: Vec<usize>,
    /// Strictly on-policy (staleness bound 0): the prompts of policy version `v` are a pure
    /// function of the learner's stage step, so a restarted actor regenerates exactly what an
    /// uninterrupted one would have.
    on_policy: bool,
    /// On-policy: first global prompt index of the current version, and the next draw.
    base: u64,
    next_k: u64,
    /// On-policy: the shared (not per-actor) order of the current epoch.
    shared_order: Option<(u64, Vec<usize>)>,
    /// The learner's per-prompt outcomes (retired prompts are drawn with a small probability).
    tracker: Option<PromptTracker>,
}

impl Stage {
    fn open(
        opts: &ActorOptions,
        index: u32,
        stage_step: u64,
        seed: u64,
        stop: &AtomicBool,
    ) -> Result<Stage> {
        let cfg = &opts.config;
        let config = cfg
            .stages
            .get(index as usize)
            .ok_or_else(|| {
                ActorError::Invalid(format!("stage index {index} is not in the run config"))
            })?
            .clone();
        let dataset = Dataset::load(cfg.resolve(&config.dataset), config.kind)?;
        let verifier = build_verifier(index as usize, cfg, &opts.run_dir, &opts.device, stop)?;
        let o = &opts.overrides;
        let top_k = o.top_k.unwrap_or(cfg.actor.top_k);
        let sampling = SamplingParams {
            temperature: o.temperature.unwrap_or(config.temperature),
            top_k: (top_k > 0).then_some(top_k),
            top_p: Some(o.top_p.unwrap_or(config.top_p)),
        };
        sampling.validate()?;
        let max_new_tokens = o.max_new_tokens.unwrap_or_else(|| {
            config.max_response_tokens_at(stage_step as usize, cfg.actor.max_new_tokens)
        });
        let group_size = o.group_size.unwrap_or(config.group_size);
        let on_policy = config.max_staleness_or(cfg.learner.max_staleness) == 0;
        let mut stage = Stage {
            index,
            dataset,
            verifier,
            params: GenParams {
                sampling,
                max_new_tokens,
                seed,
            },
            group_size,
            cursor: 0,
            epoch: 0,
            order: Vec::new(),
            on_policy,
            base: stage_step * config.batch_prompts as u64,
            next_k: 0,
            shared_order: None,
            tracker: None,
            config,
        };
        stage.shuffle(opts);
        Ok(stage)
    }

    /// This actor's share of the prompts, in a seeded order per epoch.
    fn shuffle(&mut self, opts: &ActorOptions) {
        let actors = opts.config.devices.actor_assignment().len().max(1) as u64;
        let mine = opts.actor_id as u64 % actors;
        let mut order: Vec<usize> = (0..self.dataset.prompts.len())
            .filter(|i| *i as u64 % actors == mine || self.dataset.prompts.len() as u64 <= mine)
            .collect();
        let seed = self.params.seed ^ ORDER_SALT;
        let epoch = self.epoch;
        order.sort_by_key(|&i| {
            uniform_bits(&SampleKey {
                seed,
                stream: i as u64,
                position: epoch,
            })
        });
        self.order = order;
        self.cursor = 0;
    }

    /// On-policy: the prompt at global index `g` of the stage (every actor agrees on it).
    fn shared_prompt(&mut self, opts: &ActorOptions, g: u64) -> usize {
        let n = self.dataset.prompts.len() as u64;
        let epoch = g / n;
        if self.shared_order.as_ref().map(|(e, _)| *e) != Some(epoch) {
            let seed = opts.config.actor.seed ^ ORDER_SALT;
            let mut order: Vec<usize> = (0..n as usize).collect();
            order.sort_by_key(|&i| {
                uniform_bits(&SampleKey {
                    seed,
                    stream: i as u64,
                    position: epoch,
                })
            });
            self.shared_order = Some((epoch, order));
        }
        self.epoch = epoch;
        self.shared_order.as_ref().expect("just set").1[(g % n) as usize]
    }

    /// Starts the prompts of a new policy version (on-policy mode).
    fn restart_at(&mut self, stage_step: u64) {
        self.base = stage_step * self.config.batch_prompts as u64;
        self.next_k = 0;
    }

    fn draw(&mut self, opts: &ActorOptions) -> usize {
        if self.on_policy {
            let actors = opts.config.devices.actor_assignment().len().max(1) as u64;
            let mine = opts.actor_id as u64 % actors;
            let g = self.base + self.next_k * actors + mine;
            self.next_k += 1;
            return self.shared_prompt(opts, g);
        }
        if self.cursor >= self.order.len() {
            self.epoch += 1;
            self.shuffle(opts);
        }
        let i = self.order[self.cursor];
        self.cursor += 1;
        i
    }

    /// The next prompt, skipping retired ones unless they come back by chance (a bounded
    /// number of tries, so a fully retired dataset still yields prompts).
    fn next_prompt(&mut self, opts: &ActorOptions) -> usize {
        let tries = self.dataset.prompts.len().max(1);
        let mut i = self.draw(opts);
        for _ in 0..tries {
            let id = self.dataset.prompts[i].id;
            let back = self.tracker.as_mut().is_none_or(|t| t.should_draw(id));
            if back {
                break;
            }
            i = self.draw(opts);
        }
        i
    }

    /// Adopts the learner's prompt outcomes of this stage from a snapshot (with the run's
    /// `[outcomes]` settings, the learner's own).
    fn set_tracker(&mut self, state: &LearnerState, outcomes: &OutcomeConfig) {
        self.tracker = match (&state.prompt_tracker, state.stage_index == self.index) {
            (Some(t), true) => PromptTracker::from_state(outcomes.clone(), t).ok(),
            _ => None,
        };
    }

    /// The generation seed of the current draw: per epoch, and per version when on-policy.
    fn job_seed(&self, version: u64) -> u64 {
        if self.on_policy {
            mix(mix(self.params.seed, self.epoch), version)
        } else {
            mix(self.params.seed, self.epoch)
        }
    }
}

/// Initial weights when no snapshot is published yet: `[model] path`, or the random init.
fn initial_model(opts: &ActorOptions) -> Result<(CausalLm, Chat)> {
    let m = &opts.config.model;
    if let Some(path) = &m.path {
        let dir = opts.config.resolve(path);
        return Ok((load_model(&dir, &opts.device)?, Chat::from_dir(&dir)?));
    }
    let init = m
        .init
        .as_ref()
        .ok_or_else(|| ActorError::Invalid("[model] has neither path nor init".into()))?;
    let cfg = ModelConfig::from_file(&opts.config.resolve(&init.config))?;
    let w = random_weights(&cfg, init.seed, &opts.device)?;
    let w = w
        .into_iter()
        .map(|(k, t)| Ok((k, t.to_dtype(compute_dtype(&opts.device))?)))
        .collect::<Result<HashMap<_, _>>>()?;
    let tok_dir = match &init.tokenizer {
        // A `tokenizer.json` file (with its `tokenizer_config.json` beside it, if any).
        Some(t) => {
            let tokenizer = Tokenizer::from_file(opts.config.resolve(t))
                .map_err(cascade_shared::chat::ChatError::from)?;
            let template = ChatTemplate::from_tokenizer_config(tokenizer.config())?;
            return Ok((
                CausalLm::from_tensors(&cfg, &w)?,
                Chat::new(tokenizer, template),
            ));
        }
        None => {
            let d = opts
                .run_dir
                .join(format!("actor-{}-tokenizer", opts.actor_id));
            cascade_shared::tokenizer::write_tiny_tokenizer(&d)
                .map_err(|e| ActorError::Invalid(format!("writing the tiny tokenizer: {e}")))?;
            d
        }
    };
    Ok((CausalLm::from_tensors(&cfg, &w)?, Chat::from_dir(&tok_dir)?))
}

/// Index of the first RL stage at or after `index`.
fn rl_stage_from(config: &RunConfig, index: u32) -> Option<u32> {
    (index as usize..config.stages.len())
        .find(|&i| config.stages[i].is_rl())
        .map(|i| i as u32)
}

/// The version `LATEST` names and the stage index in its `state.json` (cheap: no weights).
fn latest_stage(snapshots: &Path) -> Option<(u64, u32)> {
    snapshot::peek_latest_state(snapshots).map(|(v, state)| (v, state.stage_index))
}

/// Runs an actor until SIGTERM/SIGINT (or `max_groups`), then finishes the groups in flight,
/// flushes the replay log and returns.
pub fn run_actor(opts: ActorOptions) -> Result<RunSummary> {
    if opts.config.actor.threads > 0 {
        // Best effort: the global pool may already exist (then its size stays).
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.config.actor.threads)
            .build_global();
    }
    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, term.clone())
            .map_err(|e| ActorError::Invalid(format!("installing a signal handler: {e}")))?;
    }
    run_actor_with(opts, term)
}

/// How the actor starts: weights, tokenizer, version and the learner's position.
struct Start {
    model: CausalLm,
    chat: Chat,
    version: u64,
    state: Option<LearnerState>,
}

/// Waits for weights to generate with: the newest snapshot once the learner is in an RL stage
/// (actors idle while it runs SFT stages), or the run's initial model when the cascade starts
/// with an RL stage and nothing is published yet. `None`: stopped, or no RL stage is left.
fn wait_for_weights(
    opts: &ActorOptions,
    watch: &mut SnapshotWatch,
    stop: &AtomicBool,
) -> Result<Option<Start>> {
    let stages = &opts.config.stages;
    let snapshots = opts.run_dir.join("snapshots");
    let mut logged = false;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        match latest_stage(&snapshots) {
            Some((_, idx)) if rl_stage_from(&opts.config, idx).is_none() => {
                tracing::info!("the learner is past the last RL stage; nothing to do");
                return Ok(None);
            }
            Some((_, idx)) if !stages[idx as usize].is_rl() && !logged => {
                tracing::info!(
                    "waiting while the learner runs SFT stage {}",
                    stages[idx as usize].name
                );
                logged = true;
            }
            Some((_, idx)) if !stages[idx as usize].is_rl() => {}
            Some(_) => {
                if let Some(w) = watch.poll(None)? {
                    let chat = Chat::from_dir(&w.dir)?;
                    return Ok(Some(Start {
                        model: w.model,
                        chat,
                        version: w.version,
                        state: Some(w.state),
                    }));
                }
            }
            None if stages.first().is_some_and(StageConfig::is_rl) => {
                let (model, chat) = initial_model(opts)?;
                watch.set_current(0)?;
                return Ok(Some(Start {
                    model,
                    chat,
                    version: 0,
                    state: None,
                }));
            }
            None => {}
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// [`run_actor`] with an explicit stop flag (tests set it themselves).
pub fn run_actor_with(opts: ActorOptions, stop: Arc<AtomicBool>) -> Result<RunSummary> {
    let started = Instant::now();
    let seed = mix(opts.config.actor.seed, u64::from(opts.actor_id));
    std::fs::create_dir_all(&opts.run_dir).map_err(|e| ActorError::io(&opts.run_dir, e))?;
    let metrics = MetricsLog::open(
        opts.run_dir.join(METRICS_FILE),
        format!("actor-{}", opts.actor_id),
    )
    .map_err(|e| ActorError::io(opts.run_dir.join(METRICS_FILE), e))?;
    let mut watch = SnapshotWatch::new(
        opts.run_dir.join("snapshots"),
        opts.actor_id,
        opts.device.clone(),
    );
    // 1. Weights.
    let Some(start) = wait_for_weights(&opts, &mut watch, &stop)? else {
        return Ok(RunSummary::default());
    };
    let (mut stage_index, mut stage_step) = start
        .state
        .as_ref()
        .map_or((0, 0), |s| (s.stage_index, s.stage_step));
    let version = start.version;
    let chat = Arc::new(start.chat);
    let stop_ids = chat.tokenizer().special().stop_ids();
    let mut engine = Engine::new(
        start.model,
        version,
        opts.config.actor.gen_batch.max(1),
        stop_ids,
    )?;
    tracing::info!(
        device = ?opts.device,
        sampler = if engine.samples_on_device() { "cuda" } else { "cpu" },
        "generation engine ready"
    );
    let mut stage = match rl_stage_from(&opts.config, stage_index) {
        Some(i) => Stage::open(
            &opts,
            i,
            if i == stage_index { stage_step } else { 0 },
            seed,
            &stop,
        )?,
        None => {
            return Err(ActorError::Invalid(
                "the run config has no RL stage left".into(),
            ))
        }
    };
    if let Some(state) = &start.state {
        stage.set_tracker(state, &opts.config.outcomes);
    }
    stage_index = stage.index;
    // 2. The reward pipeline and the replay writer.
    let replay = &opts.config.replay;
    let sink = ReplaySink::open(
        opts.run_dir
            .join("replay")
            .join(format!("actor-{}", opts.actor_id)),
        WriterOptions {
            segment_size: replay.segment_bytes,
            max_segments: replay.max_segments,
            max_inflight: Some(replay.max_inflight as u64),
            backpressure_timeout: Duration::from_secs(24 * 3600),
            cancel: Some(stop.clone()),
            doorbell: true,
        },
    )?;
    let detok_chat = chat.clone();
    let detok: Detokenize = Arc::new(move |ids: &[u32]| {
        detok_chat
            .tokenizer()
            .decode(ids, true)
            .map_err(|e| e.to_string())
    });
    let workers = opts.config.actor.reward_workers.max(1);
    let capacity = (opts.config.actor.gen_batch * 2).max(4);
    let pipeline = RewardPipeline::start(
        workers,
        capacity,
        detok,
        Box::new(sink) as Box<dyn RolloutSink + Send>,
    )?;
    // 3. The loop.
    let mut contexts: HashMap<u64, (Arc<GroupContext>, usize)> = HashMap::new();
    let mut next_tag = 0u64;
    let mut submitted = 0u64;
    let mut loaded = 0u64;
    let mut last_report = (Instant::now(), 0u64);
    let result = (|| -> Result<()> {
        loop {
            let stopping =
                stop.load(Ordering::Relaxed) || opts.max_groups.is_some_and(|m| submitted >= m);
            if stopping && engine.is_idle() {
                return Ok(());
            }
            // Hot reload between decode steps.
            if let Some(w) = watch.poll(Some(engine.model().config()))? {
                engine.swap_model(w.model, w.version)?;
                loaded += 1;
                let new_index = rl_stage_from(&opts.config, w.state.stage_index);
                match new_index {
                    Some(i) => {
                        let new_step = if i == w.state.stage_index {
                            w.state.stage_step
                        } else {
                            0
                        };
                        if i != stage.index {
                            stage = Stage::open(&opts, i, new_step, seed, &stop)?;
                        } else if new_step != stage_step {
                            stage.params.max_new_tokens =
                                opts.overrides.max_new_tokens.unwrap_or_else(|| {
                                    stage.config.max_response_tokens_at(
                                        new_step as usize,
                                        opts.config.actor.max_new_tokens,
                                    )
                                });
                        }
                        stage_step = new_step;
                        stage_index = i;
                        stage.set_tracker(&w.state, &opts.config.outcomes);
                        if stage.on_policy {
                            // Rollouts of the old version would be dropped as stale: stop them
                            // and start the new version's prompts.
                            for f in engine.reset() {
                                contexts.remove(&f.job.tag);
                            }
                            contexts.clear();
                            stage.restart_at(stage_step);
                        }
                    }
                    None => {
                        tracing::info!(
                            "no RL stage left after stage {}; stopping",
                            w.state.stage_index
                        );
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            }
            // Keep one batch worth of samples queued.
            while !stopping && !stop.load(Ordering::Relaxed) && engine.queued() < engine.slots() {
                if opts.max_groups.is_some_and(|m| submitted >= m) {
                    break;
                }
                let i = stage.next_prompt(&opts);
                let rec = &stage.dataset.prompts[i];
                let mode = choose_mode(seed, rec.id, stage.epoch, stage.config.mode_mix);
                let prompt_ids = chat.encode_chat(&rec.messages, true, mode)?;
                let tag = next_tag;
                next_tag += 1;
                let job = Job {
                    tag,
                    prompt_id: rec.id,
                    prompt_ids,
                    mode,
                    group_size: stage.group_size,
                    params: GenParams {
                        seed: stage.job_seed(engine.version()),
                        ..stage.params
                    },
                };
                if engine.submit(job)? {
                    let ctx = GroupContext {
                        stage: stage.config.kind,
                        stage_index,
                        actor_id: opts.actor_id,
                        reference: rec.reference.clone(),
                        verifier: stage.verifier.clone(),
                    };
                    contexts.insert(tag, (Arc::new(ctx), stage.group_size));
                    submitted += 1;
                } else {
                    for s in engine.take_skipped() {
                        tracing::warn!(
                            "prompt {} skipped: {} tokens do not fit the context",
                            s.prompt_id,
                            s.prompt_len
                        );
                    }
                }
            }
            if last_report.0.elapsed() >= Duration::from_secs(2) {
                let tokens = engine.stats().tokens;
                metrics.emit(
                    "actor",
                    serde_json::json!({
                        "actor": opts.actor_id,
                        "stage": stage.config.name,
                        "policy_version": engine.version(),
                        "groups": submitted,
                        "tokens": tokens,
                        "tokens_per_s": (tokens - last_report.1) as f64
                            / last_report.0.elapsed().as_secs_f64().max(1e-9),
                    }),
                );
                last_report = (Instant::now(), tokens);
            }
            if engine.is_idle() {
                continue;
            }
            for f in engine.step()? {
                let tag = f.job.tag;
                let entry = contexts.get_mut(&tag).expect("context of a submitted job");
                let ctx = entry.0.clone();
                entry.1 -= 1;
                if entry.1 == 0 {
                    contexts.remove(&tag);
                }
                pipeline.submit(ScoreTask { sample: f, ctx })?;
            }
        }
    })();
    let stats = pipeline.finish();
    let es = engine.stats();
    let elapsed = started.elapsed().as_secs_f64();
    result?;
    let pipeline = match stats {
        Ok(s) => s,
        Err(ActorError::Transport(e)) if stop.load(Ordering::Relaxed) => {
            tracing::warn!("replay write cancelled at shutdown: {e}");
            PipelineStats::default()
        }
        Err(e) => return Err(e),
    };
    Ok(RunSummary {
        groups: pipeline.groups,
        tokens: es.tokens,
        skipped_prompts: es.skipped_prompts,
        snapshots_loaded: loaded,
        snapshots_refused: watch.refused(),
        tokens_per_s: es.tokens as f64 / elapsed.max(1e-9),
        pipeline,
    })
}
