//! The reward side of the actor: finished samples go through a bounded flume channel to a pool
//! of reward worker threads (so a slow verifier never stalls decoding), are collected into
//! [`RolloutGroup`]s and written to the replay sink by one writer thread.
//!
//! Backpressure travels back through the bounded channels: when the replay log is full the
//! writer blocks in [`RolloutSink::send`], the scored channel fills, the workers block, the
//! sample channel fills and [`RewardPipeline::submit`] blocks the decode loop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use cascade_rewards::Verifier;
use cascade_shared::chat::split_response;
use cascade_shared::transport::RolloutSink;
use cascade_shared::{RolloutGroup, Sample, SampleTiming, StageKind};

use crate::engine::Finished;
use crate::error::{ActorError, Result};

/// Turns response token ids into text (the tokenizer's decode, special tokens skipped).
pub type Detokenize = Arc<dyn Fn(&[u32]) -> std::result::Result<String, String> + Send + Sync>;

/// What every sample of a group shares: where it goes and how it is scored.
pub struct GroupContext {
    /// Stage kind.
    pub stage: StageKind,
    /// Stage index in the run's cascade.
    pub stage_index: u32,
    /// The actor writing the group.
    pub actor_id: u32,
    /// The prompt's reference fields (the dataset line).
    pub reference: serde_json::Value,
    /// The stage's verifier.
    pub verifier: Arc<dyn Verifier>,
    /// Rewards of the responses scored so far, by response tokens: a group's samples often
    /// repeat one another word for word, and each distinct response is verified once (a code
    /// or SWE check is a sandboxed Python run).
    verdicts: Mutex<HashMap<Vec<u32>, Verdict>>,
}

/// The breakdown key of a response whose verification failed (scored 0).
const VERIFY_ERROR: &str = "verify_error";

/// A scored response: its reward and breakdown.
type Verdict = (f32, Vec<(String, f32)>);

impl GroupContext {
    /// The context of one prompt's group.
    pub fn new(
        stage: StageKind,
        stage_index: u32,
        actor_id: u32,
        reference: serde_json::Value,
        verifier: Arc<dyn Verifier>,
    ) -> Self {
        Self {
            stage,
            stage_index,
            actor_id,
            reference,
            verifier,
            verdicts: Mutex::new(HashMap::new()),
        }
    }
}

impl std::fmt::Debug for GroupContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupContext")
            .field("stage", &self.stage)
            .field("stage_index", &self.stage_index)
            .field("verifier", &self.verifier.name())
            .finish()
    }
}

/// One finished sample to score.
#[derive(Debug)]
pub struct ScoreTask {
    /// The sample.
    pub sample: Finished,
    /// Its group's context.
    pub ctx: Arc<GroupContext>,
}

struct Scored {
    task: ScoreTask,
    sample: Sample,
}

/// Counters of a finished pipeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PipelineStats {
    /// Groups written to the sink.
    pub groups: u64,
    /// Samples scored.
    pub samples: u64,
    /// Samples whose verifier reported malformed reference data (scored 0).
    pub verify_errors: u64,
    /// Groups left incomplete at shutdown (not written).
    pub incomplete_groups: u64,
}

/// Reward workers plus the group writer.
pub struct RewardPipeline {
    tx: Option<flume::Sender<ScoreTask>>,
    workers: Vec<JoinHandle<u64>>,
    writer: Option<JoinHandle<Result<PipelineStats>>>,
}

impl std::fmt::Debug for RewardPipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RewardPipeline")
            .field("workers", &self.workers.len())
            .finish()
    }
}

impl RewardPipeline {
    /// Starts `workers` reward threads reading a channel of `capacity` samples, and a writer
    /// thread that owns `sink`.
    pub fn start(
        workers: usize,
        capacity: usize,
        detokenize: Detokenize,
        sink: Box<dyn RolloutSink + Send>,
    ) -> Result<RewardPipeline> {
        if workers == 0 || capacity == 0 {
            return Err(ActorError::Invalid(
                "the reward pool needs >= 1 worker and capacity >= 1".into(),
            ));
        }
        let (tx, rx) = flume::bounded::<ScoreTask>(capacity);
        let (scored_tx, scored_rx) = flume::bounded::<Scored>(capacity);
        let workers = (0..workers)
            .map(|i| {
                let rx = rx.clone();
                let out = scored_tx.clone();
                let detok = detokenize.clone();
                std::thread::Builder::new()
                    .name(format!("reward-{i}"))
                    .spawn(move || worker(rx, out, detok))
                    .map_err(|e| ActorError::Pipeline(format!("spawning a reward worker: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        drop(scored_tx);
        let writer = std::thread::Builder::new()
            .name("rollout-writer".into())
            .spawn(move || write_groups(scored_rx, sink))
            .map_err(|e| ActorError::Pipeline(format!("spawning the writer: {e}")))?;
        Ok(RewardPipeline {
            tx: Some(tx),
            workers,
            writer: Some(writer),
        })
    }

    /// Hands a finished sample to the workers; blocks while the channel is full (backpressure).
    /// Fails when the pipeline stopped (the writer failed: see [`RewardPipeline::finish`]).
    pub fn submit(&self, task: ScoreTask) -> Result<()> {
        let tx = self.tx.as_ref().expect("pipeline open until finish");
        tx.send(task).map_err(|_| {
            ActorError::Pipeline("the reward pipeline stopped (see the writer's error)".into())
        })
    }

    /// Whether the pipeline still runs.
    pub fn is_alive(&self) -> bool {
        self.writer.as_ref().is_some_and(|w| !w.is_finished())
    }

    /// Closes the input, waits for every sample to be scored and every complete group to be
    /// written and flushed; returns the counters or the writer's error.
    pub fn finish(mut self) -> Result<PipelineStats> {
        self.tx.take();
        let mut scored = 0;
        for w in self.workers.drain(..) {
            scored += w
                .join()
                .map_err(|_| ActorError::Pipeline("a reward worker panicked".into()))?;
        }
        let writer = self.writer.take().expect("writer until finish");
        let mut stats = writer
            .join()
            .map_err(|_| ActorError::Pipeline("the writer panicked".into()))??;
        stats.samples = stats.samples.max(scored);
        Ok(stats)
    }
}

/// Numeric top-level fields of a verifier's details, for the breakdown.
fn breakdown(name: &str, reward: f32, details: &serde_json::Value) -> Vec<(String, f32)> {
    let mut out = vec![(name.to_string(), reward)];
    if let Some(obj) = details.as_object() {
        for (k, v) in obj {
            if let Some(x) = v.as_f64() {
                out.push((k.clone(), x as f32));
            } else if let Some(b) = v.as_bool() {
                out.push((k.clone(), if b { 1.0 } else { 0.0 }));
            }
        }
    }
    out
}

/// Scores one sample; a response its group has already had is not verified again.
fn score(task: &ScoreTask, detok: &Detokenize) -> Sample {
    let start = Instant::now();
    let f = &task.sample;
    let verdicts = || task.ctx.verdicts.lock().unwrap_or_else(|e| e.into_inner());
    let known = verdicts().get(&f.response_ids).cloned();
    let (reward, parts) = match known {
        Some(v) => v,
        None => {
            let v = verify(task, detok);
            // A failure of the environment (a sandbox that could not start, a judge's forward
            // pass) says nothing about the response: a repeat is verified again.
            if !v.1.iter().any(|(k, _)| k == VERIFY_ERROR) {
                verdicts().insert(f.response_ids.clone(), v.clone());
            }
            v
        }
    };
    Sample {
        response_ids: f.response_ids.clone(),
        behaviour_logprobs: f.logprobs.clone(),
        policy_versions: f.versions.clone(),
        finish_reason: f.finish_reason,
        reward,
        reward_breakdown: parts,
        timing: SampleTiming {
            generate_ms: f.generate_ms,
            reward_ms: start.elapsed().as_secs_f32() * 1e3,
        },
    }
}

/// Decodes and verifies one response (never fails: a malformed reference scores 0 and is
/// flagged).
fn verify(task: &ScoreTask, detok: &Detokenize) -> Verdict {
    let f = &task.sample;
    let verifier = &task.ctx.verifier;
    match detok(&f.response_ids) {
        Err(e) => {
            tracing::warn!("prompt {}: response does not decode: {e}", f.job.prompt_id);
            (
                0.0,
                vec![
                    (verifier.name().to_string(), 0.0),
                    ("decode_error".into(), 1.0),
                ],
            )
        }
        Ok(text) => match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            verifier.verify(&task.ctx.reference, &split_response(&text))
        }))
        .unwrap_or_else(|panic| {
            // Model output is hostile: a verifier bug it triggers costs this sample its
            // reward, never the actor.
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(cascade_rewards::VerifyError::Environment(format!(
                "verifier panicked: {what}"
            )))
        }) {
            Ok(r) => (r.reward, breakdown(verifier.name(), r.reward, &r.details)),
            Err(e) => {
                tracing::warn!(
                    "prompt {}: verifier {}: {e}",
                    f.job.prompt_id,
                    verifier.name()
                );
                (
                    0.0,
                    vec![
                        (verifier.name().to_string(), 0.0),
                        (VERIFY_ERROR.into(), 1.0),
                    ],
                )
            }
        },
    }
}

fn worker(rx: flume::Receiver<ScoreTask>, out: flume::Sender<Scored>, detok: Detokenize) -> u64 {
    let mut n = 0;
    for task in rx.iter() {
        let sample = score(&task, &detok);
        n += 1;
        if out.send(Scored { task, sample }).is_err() {
            break; // the writer stopped; its error is reported by `finish`
        }
    }
    n
}

/// Collects the samples of each group (one group per submitted job) and writes complete
/// groups, samples in index order.
fn write_groups(
    rx: flume::Receiver<Scored>,
    mut sink: Box<dyn RolloutSink + Send>,
) -> Result<PipelineStats> {
    let mut stats = PipelineStats::default();
    let mut pending: HashMap<usize, Vec<Scored>> = HashMap::new();
    for s in rx.iter() {
        stats.samples += 1;
        if s.sample
            .reward_breakdown
            .iter()
            .any(|(k, _)| k == "verify_error")
        {
            stats.verify_errors += 1;
        }
        let job = Arc::as_ptr(&s.task.sample.job) as usize;
        let g = s.task.sample.job.group_size;
        let entry = pending.entry(job).or_default();
        entry.push(s);
        if entry.len() == g {
            let mut samples = pending.remove(&job).expect("present");
            samples.sort_by_key(|s| s.task.sample.sample_index);
            let first = &samples[0].task;
            let group = RolloutGroup {
                stage: first.ctx.stage,
                stage_index: first.ctx.stage_index,
                prompt_id: first.sample.job.prompt_id,
                mode: first.sample.job.mode,
                actor_id: first.ctx.actor_id,
                prompt_ids: first.sample.job.prompt_ids.clone(),
                temperature: first.sample.job.params.sampling.logprob_temperature(),
                samples: samples.into_iter().map(|s| s.sample).collect(),
            };
            sink.send(&group)?;
            stats.groups += 1;
        }
    }
    stats.incomplete_groups = pending.len() as u64;
    sink.flush()?;
    Ok(stats)
}
