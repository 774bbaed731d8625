//! The actor's main loop: start the engine, the reward pipeline and the replay writer, then
//! keep one batch of samples queued, hot-reload snapshots between decode steps (switching
//! stage or restarting on-policy prompts as the learner moves on), hand finished groups to the
//! reward pipeline, and on SIGTERM finish the groups in flight and flush.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_replay::WriterOptions;
use cascade_shared::intake;
use cascade_shared::metrics::{MetricsLog, METRICS_FILE};
use cascade_shared::transport::{ReplaySink, RolloutSink};

use super::seeds::{choose_mode, mix};
use super::stage::Stage;
use super::start::{rl_stage_from, wait_for_weights};
use super::{ActorOptions, RunSummary};
use crate::engine::{Engine, GenParams, Job};
use crate::error::{ActorError, Result};
use crate::rewards::{Detokenize, GroupContext, PipelineStats, RewardPipeline, ScoreTask};
use crate::snapshot_watch::SnapshotWatch;

/// How often a holding actor looks for the next snapshot or a reopened batch.
const HOLD_POLL: Duration = Duration::from_millis(2);

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
    let kv_tokens = opts
        .config
        .actor_kv_tokens(start.model.config().max_position_embeddings);
    let mut engine = Engine::with_kv_budget(
        start.model,
        version,
        opts.config.actor.gen_batch.max(1),
        stop_ids,
        kv_tokens,
    )?;
    tracing::info!(
        device = ?opts.device,
        kv_cache_tokens = kv_tokens,
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
    stage.restart_for(start.state.as_ref());
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
    let replay_dir = opts.run_dir.join("replay");
    // Holds ([`intake`]): how many, since when, seconds spent in finished ones.
    let (mut holds, mut held_since, mut held_s) = (0u64, None::<Instant>, 0.0f64);
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
                        let switched = i != stage.index;
                        if switched {
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
                        if stage.on_policy || switched {
                            // Rollouts of the old version (strictly on-policy) or of the old
                            // stage would be dropped as stale or as another stage's: stop them.
                            drop_rows(&mut engine, &mut contexts);
                        }
                        if stage.on_policy {
                            // And start the new version's prompts.
                            stage.restart_for(Some(&w.state));
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
            // Once the learner has decided a batch after which it wants no group of this
            // version (strictly on-policy: every step's; in any mode: a stage's last), every
            // further group would be dropped. Pause (no decode step, no new prompt) until the
            // next snapshot, whose reload resets the rows, or until the learner reopens the
            // version (a skipped step, a resumed learner): the rows then go on untouched, so
            // what is written is what an actor that never paused writes.
            let hold = intake::stops(&replay_dir, engine.version());
            match (hold, held_since) {
                (true, None) => {
                    held_since = Some(Instant::now());
                    holds += 1;
                }
                (false, Some(t)) => {
                    held_s += t.elapsed().as_secs_f64();
                    held_since = None;
                }
                _ => {}
            }
            // Keep one batch worth of samples queued.
            while !hold
                && !stopping
                && !stop.load(Ordering::Relaxed)
                && engine.queued() < engine.slots()
            {
                if opts.max_groups.is_some_and(|m| submitted >= m) {
                    break;
                }
                let rec = stage.next_prompt(&opts)?;
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
                    let ctx = GroupContext::new(
                        stage.config.kind,
                        stage_index,
                        opts.actor_id,
                        rec.reference,
                        stage.verifier.clone(),
                    );
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
                let held = held_s + held_since.map_or(0.0, |t| t.elapsed().as_secs_f64());
                let event = actor_event(
                    &opts,
                    &stage,
                    &engine,
                    submitted,
                    last_report,
                    (holds, held),
                );
                metrics.record(&event);
                last_report = (Instant::now(), engine.stats().tokens);
            }
            if hold {
                if stopping || stop.load(Ordering::Relaxed) {
                    // Its rows would only finish groups the learner drops: stop them, then exit.
                    drop_rows(&mut engine, &mut contexts);
                } else {
                    std::thread::sleep(HOLD_POLL);
                }
                continue;
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
    let held_s = held_s + held_since.map_or(0.0, |t| t.elapsed().as_secs_f64());
    // The totals at exit (the last periodic report may be up to 2 s old).
    metrics.record(&actor_event(
        &opts,
        &stage,
        &engine,
        submitted,
        last_report,
        (holds, held_s),
    ));
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
        holds,
        held_s,
        tokens_per_s: es.tokens as f64 / elapsed.max(1e-9),
        pipeline,
    })
}

/// Stops every row in flight and forgets their groups. A group's context leaves `contexts` once
/// its last row is handed to the reward pipeline, so the rows left are all of them.
fn drop_rows(engine: &mut Engine, contexts: &mut HashMap<u64, (Arc<GroupContext>, usize)>) {
    engine.reset();
    contexts.clear();
}

/// The actor's periodic report: progress, throughput since `since` (instant, tokens then), and
/// holds (count, seconds).
fn actor_event(
    opts: &ActorOptions,
    stage: &Stage,
    engine: &Engine,
    submitted: u64,
    since: (Instant, u64),
    (holds, held_s): (u64, f64),
) -> cascade_shared::metrics::ActorEvent {
    let tokens = engine.stats().tokens;
    cascade_shared::metrics::ActorEvent {
        actor: Some(opts.actor_id.into()),
        stage: Some(stage.config.name.clone()),
        policy_version: Some(engine.version()),
        groups: Some(submitted),
        tokens: Some(tokens),
        tokens_per_s: Some(
            tokens.saturating_sub(since.1) as f64 / since.0.elapsed().as_secs_f64().max(1e-9),
        ),
        peak_rss_mb: cascade_shared::metrics::peak_rss_mb(),
        peak_heap_mb: cascade_shared::metrics::heap_peak_mb(),
        held: Some(holds),
        held_s: Some(held_s),
        kv_preemptions: Some(engine.stats().preemptions),
        prefill_tokens: Some(engine.stats().prefill_tokens),
        shared_prompts: Some(engine.stats().shared_prompts),
    }
}
