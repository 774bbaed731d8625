//! The actor process: load weights, generate groups for the current stage, score them, write
//! them to the replay log, hot-reload snapshots between decode steps, stop cleanly on SIGTERM.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Device;
use cascade_replay::WriterOptions;
use cascade_rewards::code::CodeConfig;
use cascade_rewards::ifeval::{IfEvalConfig, IfEvalMode};
use cascade_rewards::math::MathConfig;
use cascade_rewards::{CodeVerifier, IfEvalVerifier, MathVerifier, SweVerifier, Verifier};
use cascade_shared::chat::Chat;
use cascade_shared::config::{IfStrictness, RunConfig, StageConfig};
use cascade_shared::model::{compute_dtype, load_model, random_weights, CausalLm, ModelConfig};
use cascade_shared::transport::{ReplaySink, RolloutSink};
use cascade_shared::{Mode, StageKind};

use crate::dataset::Dataset;
use crate::engine::{Engine, GenParams, Job};
use crate::error::{ActorError, Result};
use crate::reward_model::RewardModel;
use crate::rewards::{Detokenize, GroupContext, PipelineStats, RewardPipeline, ScoreTask};
use crate::sampler::philox::{uniform_bits, uniform_f32};
use crate::sampler::{SampleKey, SamplingParams};
use crate::snapshot_watch::SnapshotWatch;

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

/// The verifier of a stage.
pub fn build_verifier(
    stage: &StageConfig,
    config: &RunConfig,
    device: &Device,
) -> Result<Arc<dyn Verifier>> {
    let v = &stage.verifier;
    Ok(match stage.kind {
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
                ..CodeConfig::default()
            })
            .map_err(|e| ActorError::Invalid(format!("code verifier: {e}")))?,
        ),
        StageKind::Swe => Arc::new(SweVerifier::default()),
        StageKind::Rlhf => {
            let dir = v.reward_model.as_ref().ok_or_else(|| {
                ActorError::Invalid(format!(
                    "stage {}: rlhf needs verifier.reward_model",
                    stage.name
                ))
            })?;
            Arc::new(RewardModel::load(&config.resolve(dir), device)?)
        }
        StageKind::Sft => {
            return Err(ActorError::Invalid(format!(
                "stage {} is SFT: no rollouts",
                stage.name
            )))
        }
    })
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
}

impl Stage {
    fn open(opts: &ActorOptions, index: u32, stage_step: u64, seed: u64) -> Result<Stage> {
        let cfg = &opts.config;
        let config = cfg
            .stages
            .get(index as usize)
            .ok_or_else(|| {
                ActorError::Invalid(format!("stage index {index} is not in the run config"))
            })?
            .clone();
        let dataset = Dataset::load(cfg.resolve(&config.dataset), config.kind)?;
        let verifier = build_verifier(&config, cfg, &opts.device)?;
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

    fn next_prompt(&mut self, opts: &ActorOptions) -> usize {
        if self.cursor >= self.order.len() {
            self.epoch += 1;
            self.shuffle(opts);
        }
        let i = self.order[self.cursor];
        self.cursor += 1;
        i
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
        Some(t) => opts.config.resolve(t),
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

/// [`run_actor`] with an explicit stop flag (tests set it themselves).
pub fn run_actor_with(opts: ActorOptions, stop: Arc<AtomicBool>) -> Result<RunSummary> {
    let started = Instant::now();
    let seed = mix(opts.config.actor.seed, u64::from(opts.actor_id));
    let mut watch = SnapshotWatch::new(
        opts.run_dir.join("snapshots"),
        opts.actor_id,
        opts.device.clone(),
    );
    // 1. Weights: the newest valid snapshot, else the run's initial model (version 0).
    let (model, chat, version, mut stage_index, mut stage_step) = match watch.poll(None)? {
        Some(w) => {
            let chat = Chat::from_dir(&w.dir)?;
            (
                w.model,
                chat,
                w.version,
                w.state.stage_index,
                w.state.stage_step,
            )
        }
        None => {
            let (m, c) = initial_model(&opts)?;
            watch.set_current(0)?;
            (m, c, 0, 0, 0)
        }
    };
    let chat = Arc::new(chat);
    let stop_ids = chat.tokenizer().special().stop_ids();
    let mut engine = Engine::new(model, version, opts.config.actor.gen_batch.max(1), stop_ids)?;
    let mut stage = match rl_stage_from(&opts.config, stage_index) {
        Some(i) => Stage::open(
            &opts,
            i,
            if i == stage_index { stage_step } else { 0 },
            seed,
        )?,
        None => {
            return Err(ActorError::Invalid(
                "the run config has no RL stage left".into(),
            ))
        }
    };
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
                    Some(i) if i != stage.index || w.state.stage_step != stage_step => {
                        stage_step = if i == w.state.stage_index {
                            w.state.stage_step
                        } else {
                            0
                        };
                        if i != stage.index {
                            stage = Stage::open(&opts, i, stage_step, seed)?;
                        } else {
                            stage.params.max_new_tokens =
                                opts.overrides.max_new_tokens.unwrap_or_else(|| {
                                    stage.config.max_response_tokens_at(
                                        stage_step as usize,
                                        opts.config.actor.max_new_tokens,
                                    )
                                });
                        }
                        stage_index = i;
                    }
                    Some(_) => {}
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
                        seed: mix(stage.params.seed, stage.epoch),
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
