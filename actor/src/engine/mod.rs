//! The generation engine: batched decoding over the model's ragged KV cache with continuous
//! batching.
//!
//! A [`Job`] (one prompt) expands into `group_size` rows. Rows wait in a queue; whenever a
//! slot of the [`DecodeBatch`] is free, the next row is prefilled into it, so a long straggler
//! never idles the rest of the batch. Every token is drawn with the key
//! `(seed, prompt_id * G + sample_index, position)`, so what a row generates does not depend on
//! which other rows share its batch. A row stops at a stop token (`<|im_end|>`, EOS), at its
//! max response tokens or at the end of the model's context, and records why. Weights can be
//! swapped between steps ([`Engine::swap_model`]); rows in flight keep their cache and record
//! from which token on the new policy version sampled ([`VersionSpan`]).

#[cfg(feature = "cuda")]
mod device;
mod job;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use candle_core::Tensor;
use cascade_shared::model::{CausalLm, DecodeBatch};
use cascade_shared::{FinishReason, VersionSpan};

pub use job::{Finished, GenParams, Job, Skipped};

use crate::error::{ActorError, Result};
use crate::sampler::{sample_batch, SampleKey, Sampled, SamplingParams};

/// A sample in a slot.
#[derive(Debug)]
struct Row {
    job: Arc<Job>,
    sample_index: usize,
    response: Vec<u32>,
    logprobs: Vec<f32>,
    versions: Vec<VersionSpan>,
    started: Instant,
}

impl Row {
    fn key(&self) -> SampleKey {
        SampleKey::for_sample(
            self.job.params.seed,
            self.job.prompt_id,
            self.job.group_size as u64,
            self.sample_index as u64,
            self.response.len() as u64,
        )
    }

    fn push(&mut self, s: Sampled, version: u64) {
        if self.versions.last().map(|v| v.version) != Some(version) {
            self.versions.push(VersionSpan {
                start_token: self.response.len() as u32,
                version,
            });
        }
        self.response.push(s.token);
        self.logprobs.push(s.logprob);
    }
}

/// Counters of an engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Prompts skipped because they do not fit the context.
    pub skipped_prompts: u64,
    /// Tokens generated.
    pub tokens: u64,
    /// Decode steps run.
    pub decode_steps: u64,
    /// Prefill calls run.
    pub prefills: u64,
}

/// Continuous-batching generator over one model.
#[derive(Debug)]
pub struct Engine {
    model: CausalLm,
    version: u64,
    batch: DecodeBatch,
    rows: Vec<Option<Row>>,
    queue: VecDeque<(Arc<Job>, usize)>,
    stop_ids: Vec<u32>,
    stats: EngineStats,
    skipped: Vec<Skipped>,
    /// Samples on the GPU when the model runs on one (feature `cuda`).
    #[cfg(feature = "cuda")]
    device_sampler: Option<device::DeviceSampler>,
}

impl Engine {
    /// An engine with `slots` concurrent rows over `model` (policy `version`), stopping at any
    /// of `stop_ids`.
    pub fn new(model: CausalLm, version: u64, slots: usize, stop_ids: Vec<u32>) -> Result<Engine> {
        if slots == 0 {
            return Err(ActorError::Invalid(
                "the engine needs at least one slot".into(),
            ));
        }
        #[cfg(feature = "cuda")]
        let device_sampler = match device::DeviceSampler::for_device(model.device()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(
                    "CUDA sampler unavailable ({e}); sampling on the CPU, which copies every \
                     step's logits to the host"
                );
                None
            }
        };
        Ok(Engine {
            model,
            version,
            batch: DecodeBatch::new(slots),
            rows: (0..slots).map(|_| None).collect(),
            queue: VecDeque::new(),
            stop_ids,
            stats: EngineStats::default(),
            skipped: Vec::new(),
            #[cfg(feature = "cuda")]
            device_sampler,
        })
    }

    /// Whether tokens are drawn on the model's GPU (feature `cuda`, model on a CUDA device,
    /// kernels compiled) rather than by the CPU sampler.
    #[cfg(feature = "cuda")]
    pub fn samples_on_device(&self) -> bool {
        self.device_sampler.is_some()
    }

    /// Whether tokens are drawn on the model's GPU: never without the `cuda` feature.
    #[cfg(not(feature = "cuda"))]
    pub fn samples_on_device(&self) -> bool {
        false
    }

    /// Draws tokens with the CPU sampler even when the model is on a GPU (the logits are then
    /// copied to the host every step). Same keys, same tokens; for checks and comparisons.
    pub fn use_host_sampler(&mut self) {
        #[cfg(feature = "cuda")]
        {
            self.device_sampler = None;
        }
    }

    /// The current model.
    pub fn model(&self) -> &CausalLm {
        &self.model
    }

    /// The policy version of the current weights.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Counters so far.
    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    /// Prompts skipped since the last call (too long for the context).
    pub fn take_skipped(&mut self) -> Vec<Skipped> {
        std::mem::take(&mut self.skipped)
    }

    /// Replaces the weights between steps. Rows in flight keep their cache (computed by the
    /// old weights) and record that later tokens come from `version`.
    pub fn swap_model(&mut self, model: CausalLm, version: u64) -> Result<()> {
        let (old, new) = (self.model.config(), model.config());
        if old.vocab_size != new.vocab_size
            || old.num_hidden_layers != new.num_hidden_layers
            || old.num_kv_heads() != new.num_kv_heads()
            || old.head_dim() != new.head_dim()
        {
            return Err(ActorError::Invalid(
                "new weights have another shape than the running model".into(),
            ));
        }
        self.model = model;
        self.version = version;
        Ok(())
    }

    /// Queues the `group_size` samples of a job. A prompt that leaves no room for one response
    /// token in the context is skipped and counted instead (never an error).
    pub fn submit(&mut self, job: Job) -> Result<bool> {
        if job.group_size == 0 || job.prompt_ids.is_empty() || job.params.max_new_tokens == 0 {
            return Err(ActorError::Invalid(format!(
                "prompt {}: needs group_size >= 1, a non-empty prompt and max_new_tokens >= 1",
                job.prompt_id
            )));
        }
        job.params.sampling.validate()?;
        if job.prompt_ids.len() >= self.context() {
            self.stats.skipped_prompts += 1;
            self.skipped.push(Skipped {
                prompt_id: job.prompt_id,
                prompt_len: job.prompt_ids.len(),
            });
            return Ok(false);
        }
        let job = Arc::new(job);
        for i in 0..job.group_size {
            self.queue.push_back((job.clone(), i));
        }
        Ok(true)
    }

    /// Samples waiting for a slot.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Rows being generated.
    pub fn active(&self) -> usize {
        self.rows.iter().filter(|r| r.is_some()).count()
    }

    /// Whether nothing is queued or in flight.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.active() == 0
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.rows.len()
    }

    fn context(&self) -> usize {
        self.model.config().max_position_embeddings
    }

    /// One engine step: refills free slots from the queue (prefill and first token), then
    /// decodes one token for every row in flight. Returns the samples that finished.
    pub fn step(&mut self) -> Result<Vec<Finished>> {
        let mut done = Vec::new();
        self.refill(&mut done)?;
        let active: Vec<usize> = (0..self.rows.len())
            .filter(|&s| self.rows[s].is_some())
            .collect();
        if active.is_empty() {
            return Ok(done);
        }
        let feed: Vec<(usize, u32)> = active
            .iter()
            .map(|&s| {
                (
                    s,
                    *self.rows[s]
                        .as_ref()
                        .and_then(|r| r.response.last())
                        .expect("row has a token"),
                )
            })
            .collect();
        let logits = self.model.decode_step(&mut self.batch, &feed)?;
        self.stats.decode_steps += 1;
        self.sample_into(&active, &logits, &mut done)?;
        Ok(done)
    }

    /// Runs until every queued sample has finished.
    pub fn run_to_completion(&mut self) -> Result<Vec<Finished>> {
        let mut out = Vec::new();
        while !self.is_idle() {
            out.extend(self.step()?);
        }
        Ok(out)
    }

    /// [`Engine::abort_all`], then a fresh KV cache: what is generated next is computed exactly
    /// as by a new engine (same cache layout, so the same float results), which a strictly
    /// on-policy actor needs to reproduce a run bit for bit after a restart.
    pub fn reset(&mut self) -> Vec<Finished> {
        let out = self.abort_all();
        self.batch = DecodeBatch::new(self.rows.len());
        out
    }

    /// Stops every row in flight and drops the queue; the rows in flight are returned with
    /// [`FinishReason::Abort`].
    pub fn abort_all(&mut self) -> Vec<Finished> {
        self.queue.clear();
        let mut out = Vec::new();
        for slot in 0..self.rows.len() {
            if let Some(row) = self.rows[slot].take() {
                self.batch.release(slot);
                out.push(finish(row, FinishReason::Abort));
            }
        }
        out
    }

    fn refill(&mut self, done: &mut Vec<Finished>) -> Result<()> {
        let free: Vec<usize> = (0..self.rows.len())
            .filter(|&s| self.rows[s].is_none())
            .collect();
        let mut new_slots = Vec::new();
        for slot in free {
            let Some((job, sample_index)) = self.queue.pop_front() else {
                break;
            };
            self.rows[slot] = Some(Row {
                job,
                sample_index,
                response: Vec::new(),
                logprobs: Vec::new(),
                versions: Vec::new(),
                started: Instant::now(),
            });
            new_slots.push(slot);
        }
        if new_slots.is_empty() {
            return Ok(());
        }
        let jobs: Vec<Arc<Job>> = new_slots
            .iter()
            .map(|&s| self.rows[s].as_ref().expect("just filled").job.clone())
            .collect();
        let prompts: Vec<(usize, &[u32])> = new_slots
            .iter()
            .zip(&jobs)
            .map(|(&s, j)| (s, j.prompt_ids.as_slice()))
            .collect();
        let logits = self.model.prefill(&mut self.batch, &prompts)?;
        self.stats.prefills += 1;
        self.sample_into(&new_slots, &logits, done)
    }

    /// Samples one token per listed slot from `logits` (rows in the order of `slots`), then
    /// finishes the rows that stop.
    fn sample_into(
        &mut self,
        slots: &[usize],
        logits: &Tensor,
        done: &mut Vec<Finished>,
    ) -> Result<()> {
        let (n, _) = logits.dims2()?;
        debug_assert_eq!(n, slots.len());
        // Rows of different jobs may use different settings: one sampler call per setting.
        let mut groups: Vec<(SamplingParams, Vec<usize>, Vec<SampleKey>)> = Vec::new();
        for (i, &s) in slots.iter().enumerate() {
            let row = self.rows[s].as_ref().expect("active row");
            let p = row.job.params.sampling;
            match groups.iter_mut().find(|(q, _, _)| *q == p) {
                Some((_, idx, keys)) => {
                    idx.push(i);
                    keys.push(row.key());
                }
                None => groups.push((p, vec![i], vec![row.key()])),
            }
        }
        let drawn = self.draw(logits, &groups)?;
        let context = self.context();
        for (&slot, s) in slots.iter().zip(drawn) {
            let s = s.expect("every row drawn");
            let row = self.rows[slot].as_mut().expect("active row");
            row.push(s, self.version);
            self.stats.tokens += 1;
            let reason = if self.stop_ids.contains(&s.token) {
                Some(FinishReason::Stop)
            } else if row.response.len() >= row.job.params.max_new_tokens
                || row.job.prompt_ids.len() + row.response.len() >= context
            {
                Some(FinishReason::Length)
            } else {
                None
            };
            if let Some(reason) = reason {
                let row = self.rows[slot].take().expect("active row");
                self.batch.release(slot);
                done.push(finish(row, reason));
            }
        }
        Ok(())
    }
}

impl Engine {
    /// Draws one token per row of `logits` for each `(params, rows, keys)` group, on the GPU
    /// where the logits are when it can, else on the host.
    fn draw(
        &self,
        logits: &Tensor,
        groups: &[(SamplingParams, Vec<usize>, Vec<SampleKey>)],
    ) -> Result<Vec<Option<Sampled>>> {
        let n = logits.dims2()?.0;
        let mut drawn: Vec<Option<Sampled>> = vec![None; n];
        #[cfg(feature = "cuda")]
        if let Some(sampler) = &self.device_sampler {
            if logits.device().is_cuda() {
                for (params, idx, keys) in groups {
                    let subset = (idx.len() != n).then_some(idx.as_slice());
                    for (&i, s) in idx
                        .iter()
                        .zip(sampler.sample(logits, subset, params, keys)?)
                    {
                        drawn[i] = Some(s);
                    }
                }
                return Ok(drawn);
            }
        }
        let logits = logits.to_dtype(candle_core::DType::F32)?;
        let vocab = logits.dims2()?.1;
        let flat: Vec<f32> = logits.flatten_all()?.to_vec1()?;
        for (params, idx, keys) in groups {
            let rows: Vec<f32> = if idx.len() == n {
                flat.clone()
            } else {
                idx.iter()
                    .flat_map(|&i| flat[i * vocab..(i + 1) * vocab].iter().copied())
                    .collect()
            };
            for (&i, s) in idx.iter().zip(sample_batch(&rows, vocab, params, keys)?) {
                drawn[i] = Some(s);
            }
        }
        Ok(drawn)
    }
}

fn finish(row: Row, reason: FinishReason) -> Finished {
    Finished {
        job: row.job,
        sample_index: row.sample_index,
        response_ids: row.response,
        logprobs: row.logprobs,
        versions: row.versions,
        finish_reason: reason,
        generate_ms: row.started.elapsed().as_secs_f32() * 1e3,
    }
}
