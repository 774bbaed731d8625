//! The generation engine: batched decoding over the model's ragged KV cache with continuous
//! batching.
//!
//! A [`Job`] (one prompt) expands into `group_size` rows. Rows wait in a queue; whenever a
//! slot of the [`DecodeBatch`] is free, the next row is prefilled into it, so a long straggler
//! never idles the rest of the batch.
//!
//! The rows' keys and values live in a paged cache ([`cascade_shared::model::paged`]). With a
//! budget ([`Engine::with_kv_budget`]) a queued row enters only when the free blocks hold its
//! prefill and the next step of every row; when decoding runs out of blocks, the row that
//! entered last is *preempted*: its blocks are freed and it goes back to the head of the queue
//! with what it generated, to be prefilled again (prompt and response) when blocks free up.
//! Its tokens are drawn with the same keys either way.
//!
//! The samples of one prompt share the prompt's cache: the first to enter is prefilled, and
//! its siblings that enter while a row holding the prompt is in flight start from that row's
//! cache ([`DecodeBatch::fork`]: the full blocks shared, the partly filled one copied) and draw
//! their first token from the same logits, so a group of `G` runs its prompt once and holds
//! its full blocks once instead of `G` times. Every token is drawn with the key
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
use cascade_shared::model::paged::BLOCK_TOKENS;
use cascade_shared::model::{CausalLm, DecodeBatch, PREFILL_TOKENS};
use cascade_shared::{FinishReason, VersionSpan};

pub use job::{Finished, GenParams, Job, Skipped};

use crate::error::{ActorError, Result};
use crate::sampler::{sample_batch, SampleKey, Sampled, SamplingParams};

/// A sample in a slot, or preempted and waiting to be prefilled again.
#[derive(Debug)]
struct Row {
    job: Arc<Job>,
    sample_index: usize,
    response: Vec<u32>,
    logprobs: Vec<f32>,
    versions: Vec<VersionSpan>,
    started: Instant,
    /// When it (last) entered the batch, in engine admissions: the latest is preempted first.
    admitted: u64,
}

/// A sample waiting for a slot: new, or preempted with what it generated.
#[derive(Debug)]
enum Queued {
    New(Arc<Job>, usize),
    Preempted(Row),
}

impl Queued {
    /// Tokens its prefill writes to the cache.
    fn prefill_len(&self) -> usize {
        match self {
            Queued::New(job, _) => job.prompt_ids.len(),
            Queued::Preempted(row) => row.job.prompt_ids.len() + row.response.len(),
        }
    }
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
    /// Rows preempted because the KV cache was full (each is prefilled again later).
    pub preemptions: u64,
    /// Tokens run through prefills (prompts, and the responses of preempted rows).
    pub prefill_tokens: u64,
    /// Rows started from the cache of a sibling sample's prompt instead of a prefill (new
    /// samples, and preempted ones, whose responses still run).
    pub shared_prompts: u64,
    /// Of those, preempted rows (only their responses ran).
    pub resumed: u64,
}

/// A prompt whose cache rows in flight hold, for its job's samples still queued.
#[derive(Debug)]
struct SharedPrompt {
    job: Arc<Job>,
    /// Slots whose sequence starts with the prompt's cache, computed by the current weights.
    slots: Vec<usize>,
    /// The logits after the prompt, `(1, vocab)`: every sample's first token is drawn from them.
    logits: Tensor,
}

/// How an admitted row starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Its prompt (and response, if preempted) run through the model.
    Prefill,
    /// From the prompt cache of a sibling in flight or prefilled in the same call.
    Shared,
    /// A preempted row: from its prompt's cache held by a sibling in flight, then its response
    /// run through the model.
    Resume,
}

/// Continuous-batching generator over one model.
#[derive(Debug)]
pub struct Engine {
    model: CausalLm,
    version: u64,
    batch: DecodeBatch,
    rows: Vec<Option<Row>>,
    queue: VecDeque<Queued>,
    admissions: u64,
    stop_ids: Vec<u32>,
    stats: EngineStats,
    skipped: Vec<Skipped>,
    /// Prompts whose cache queued siblings can start from.
    shared: Vec<SharedPrompt>,
    /// Whether siblings share their prompt's cache (on by default).
    share_prompts: bool,
    /// Samples on the GPU when the model runs on one (feature `cuda`).
    #[cfg(feature = "cuda")]
    device_sampler: Option<device::DeviceSampler>,
}

impl Engine {
    /// An engine with `slots` concurrent rows over `model` (policy `version`), stopping at any
    /// of `stop_ids`, whose KV cache grows as needed.
    pub fn new(model: CausalLm, version: u64, slots: usize, stop_ids: Vec<u32>) -> Result<Engine> {
        Engine::build(model, version, DecodeBatch::new(slots), stop_ids)
    }

    /// [`Engine::new`] with a KV cache of `kv_tokens` tokens shared by the rows, allocated in
    /// full at the first prefill: rows wait for blocks, and the newest row is preempted when
    /// decoding runs out of them.
    pub fn with_kv_budget(
        model: CausalLm,
        version: u64,
        slots: usize,
        stop_ids: Vec<u32>,
        kv_tokens: usize,
    ) -> Result<Engine> {
        if kv_tokens == 0 {
            return Err(ActorError::Invalid(
                "the KV cache budget must be at least one token".into(),
            ));
        }
        let batch = DecodeBatch::with_kv_budget(slots, kv_tokens);
        Engine::build(model, version, batch, stop_ids)
    }

    fn build(
        model: CausalLm,
        version: u64,
        batch: DecodeBatch,
        stop_ids: Vec<u32>,
    ) -> Result<Engine> {
        let slots = batch.slots();
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
            batch,
            rows: (0..slots).map(|_| None).collect(),
            queue: VecDeque::new(),
            admissions: 0,
            stop_ids,
            stats: EngineStats::default(),
            skipped: Vec::new(),
            shared: Vec::new(),
            share_prompts: true,
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

    /// Prefills every row on its own instead of starting siblings from their prompt's shared
    /// cache (same keys; the same tokens up to float rounding). For checks and comparisons.
    pub fn set_prompt_sharing(&mut self, on: bool) {
        self.share_prompts = on;
        if !on {
            self.shared.clear();
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
        // Queued siblings must not start from a prompt cache the old weights computed.
        self.shared.clear();
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
        if let Some(budget) = self.batch.kv_budget() {
            // The longest this prompt's rows can get must fit the cache alone.
            let longest = self
                .context()
                .min(job.prompt_ids.len() + job.params.max_new_tokens);
            if DecodeBatch::blocks_for(longest) > DecodeBatch::blocks_for(budget) {
                return Err(ActorError::Invalid(format!(
                    "prompt {}: a row of {} prompt + {} response tokens does not fit a KV cache \
                     of {budget} tokens (raise actor.kv_cache_tokens or lower the response \
                     budget)",
                    job.prompt_id,
                    job.prompt_ids.len(),
                    longest - job.prompt_ids.len()
                )));
            }
        }
        let job = Arc::new(job);
        for i in 0..job.group_size {
            self.queue.push_back(Queued::New(job.clone(), i));
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
        let active = self.preempt_for_step(active);
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
        self.batch.clear();
        self.shared.clear();
        self.admissions = 0;
        out
    }

    /// Stops every row in flight and drops the queue; the rows in flight are returned with
    /// [`FinishReason::Abort`].
    pub fn abort_all(&mut self) -> Vec<Finished> {
        let mut out = Vec::new();
        for queued in std::mem::take(&mut self.queue) {
            if let Queued::Preempted(row) = queued {
                out.push(finish(row, FinishReason::Abort));
            }
        }
        for slot in 0..self.rows.len() {
            if let Some(row) = self.rows[slot].take() {
                self.free_slot(slot);
                out.push(finish(row, FinishReason::Abort));
            }
        }
        out
    }

    fn refill(&mut self, done: &mut Vec<Finished>) -> Result<()> {
        let free: Vec<usize> = (0..self.rows.len())
            .filter(|&s| self.rows[s].is_none())
            .collect();
        // With a budget, rows enter in queue order while the free blocks hold their prefill,
        // their first decoded token and the next step of the rows already in flight.
        let active: Vec<usize> = (0..self.rows.len())
            .filter(|&s| self.rows[s].is_some())
            .collect();
        let mut room = self
            .batch
            .free_blocks()
            .map(|free| free.saturating_sub(self.batch.blocks_for_step(&active)));
        let mut admitted: Vec<(usize, Start)> = Vec::new();
        let mut tokens = 0;
        for slot in free {
            let Some(next) = self.queue.front() else {
                break;
            };
            let len = next.prefill_len();
            let (start, prompt) = match next {
                Queued::New(job, _) if self.can_share(job, &admitted) => {
                    (Start::Shared, job.prompt_ids.len())
                }
                Queued::Preempted(row)
                    if self.share_prompts && self.shared_index(&row.job).is_some() =>
                {
                    (Start::Resume, row.job.prompt_ids.len())
                }
                _ => (Start::Prefill, 0),
            };
            let need = match start {
                Start::Prefill | Start::Resume => {
                    // One call runs up to PREFILL_TOKENS tokens (at least one row); a resumed
                    // row runs its response only.
                    tokens += len - prompt;
                    if tokens > PREFILL_TOKENS && admitted.iter().any(|a| a.1 != Start::Shared) {
                        break;
                    }
                    // Its prompt's full blocks are shared (none for a prefill).
                    DecodeBatch::blocks_for(len + 1) - prompt / BLOCK_TOKENS
                }
                Start::Shared => DecodeBatch::blocks_for(len + 1) - len / BLOCK_TOKENS,
            };
            if let Some(room) = room.as_mut() {
                if need > *room {
                    break;
                }
                *room -= need;
            }
            let row = match self.queue.pop_front().expect("front exists") {
                Queued::New(job, sample_index) => Row {
                    job,
                    sample_index,
                    response: Vec::new(),
                    logprobs: Vec::new(),
                    versions: Vec::new(),
                    started: Instant::now(),
                    admitted: 0,
                },
                Queued::Preempted(row) => row,
            };
            self.admissions += 1;
            self.rows[slot] = Some(Row {
                admitted: self.admissions,
                ..row
            });
            admitted.push((slot, start));
        }
        if admitted.is_empty() {
            return Ok(());
        }
        // 1. The prefills, in one call.
        let prefilled: Vec<usize> = admitted
            .iter()
            .filter(|a| a.1 == Start::Prefill)
            .map(|a| a.0)
            .collect();
        let mut logits = Vec::with_capacity(admitted.len());
        if !prefilled.is_empty() {
            let ids: Vec<Vec<u32>> = prefilled
                .iter()
                .map(|&s| {
                    let row = self.rows[s].as_ref().expect("just filled");
                    let mut ids = row.job.prompt_ids.clone();
                    ids.extend_from_slice(&row.response);
                    ids
                })
                .collect();
            let prompts: Vec<(usize, &[u32])> = prefilled
                .iter()
                .zip(&ids)
                .map(|(&s, ids)| (s, ids.as_slice()))
                .collect();
            let out = self.model.prefill(&mut self.batch, &prompts)?;
            self.stats.prefills += 1;
            self.stats.prefill_tokens += ids.iter().map(|i| i.len() as u64).sum::<u64>();
            for (i, &slot) in prefilled.iter().enumerate() {
                let row = out.narrow(0, i, 1)?;
                let row_state = self.rows[slot].as_ref().expect("just filled");
                if self.share_prompts
                    && row_state.response.is_empty()
                    && row_state.job.group_size > 1
                    && self.shared_index(&row_state.job).is_none()
                {
                    self.shared.push(SharedPrompt {
                        job: row_state.job.clone(),
                        slots: vec![slot],
                        logits: row.clone(),
                    });
                }
                logits.push(row);
            }
        }
        // 2. The rows that start from a sibling's prompt cache: new samples draw their first
        //    token from the prompt's logits, preempted ones run their response first.
        let mut shared = Vec::new();
        let mut resumed = Vec::new();
        for &(slot, start) in &admitted {
            if start == Start::Prefill {
                continue;
            }
            let job = self.rows[slot].as_ref().expect("just filled").job.clone();
            let e = self.shared_index(&job).expect("a shared prompt was found");
            let src = self.shared[e].slots[0];
            self.batch
                .fork(&self.model, src, slot, job.prompt_ids.len())?;
            self.shared[e].slots.push(slot);
            self.stats.shared_prompts += 1;
            if start == Start::Shared {
                logits.push(self.shared[e].logits.clone());
                shared.push(slot);
            } else {
                resumed.push(slot);
                self.stats.resumed += 1;
            }
        }
        if !resumed.is_empty() {
            logits.extend(self.run_responses(&resumed)?);
        }
        // A prompt's cache is kept while a row holding it is in flight (see free_slot), for its
        // queued and preempted samples.
        let slots: Vec<usize> = prefilled.into_iter().chain(shared).chain(resumed).collect();
        let logits = if logits.len() == 1 {
            logits.pop().expect("one row")
        } else {
            Tensor::cat(&logits, 0)?
        };
        self.sample_into(&slots, &logits, done)
    }

    /// Runs the responses of preempted rows resumed from their prompt's cache (in chunks of
    /// at most `PREFILL_TOKENS`, as a prefill). Returns each row's next-token logits,
    /// `(1, vocab)`, in the order of `slots`.
    fn run_responses(&mut self, slots: &[usize]) -> Result<Vec<Tensor>> {
        let responses: Vec<(usize, &[u32])> = slots
            .iter()
            .map(|&s| {
                (
                    s,
                    self.rows[s]
                        .as_ref()
                        .expect("resumed row")
                        .response
                        .as_slice(),
                )
            })
            .collect();
        let out = self.model.extend(&mut self.batch, &responses)?;
        self.stats.prefill_tokens += responses.iter().map(|r| r.1.len() as u64).sum::<u64>();
        (0..slots.len()).map(|i| Ok(out.narrow(0, i, 1)?)).collect()
    }

    /// Whether a new sample of `job` can start from its prompt's cache: a sibling is in flight
    /// with it, or is prefilled in this refill (`admitted`).
    fn can_share(&self, job: &Arc<Job>, admitted: &[(usize, Start)]) -> bool {
        self.share_prompts
            && job.group_size > 1
            && (self.shared_index(job).is_some()
                || admitted.iter().any(|&(slot, start)| {
                    start == Start::Prefill
                        && self.rows[slot]
                            .as_ref()
                            .is_some_and(|r| r.response.is_empty() && Arc::ptr_eq(&r.job, job))
                }))
    }

    fn shared_index(&self, job: &Arc<Job>) -> Option<usize> {
        self.shared.iter().position(|p| Arc::ptr_eq(&p.job, job))
    }

    /// Releases a slot's cache and forgets it as a holder of a shared prompt.
    fn free_slot(&mut self, slot: usize) {
        self.batch.release(slot);
        for p in &mut self.shared {
            p.slots.retain(|&s| s != slot);
        }
        self.shared.retain(|p| !p.slots.is_empty());
    }

    /// Frees blocks for the next decode step when the budget is short: preempts the rows that
    /// entered last, back to the head of the queue with what they generated. Returns the slots
    /// still in flight.
    fn preempt_for_step(&mut self, mut active: Vec<usize>) -> Vec<usize> {
        while let Some(free) = self.batch.free_blocks() {
            if self.batch.blocks_for_step(&active) <= free || active.len() <= 1 {
                break;
            }
            let (i, &slot) = active
                .iter()
                .enumerate()
                .max_by_key(|(_, &s)| self.rows[s].as_ref().map_or(0, |r| r.admitted))
                .expect("rows in flight");
            active.remove(i);
            let row = self.rows[slot].take().expect("active row");
            self.free_slot(slot);
            self.queue.push_front(Queued::Preempted(row));
            self.stats.preemptions += 1;
        }
        active
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
                self.free_slot(slot);
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
