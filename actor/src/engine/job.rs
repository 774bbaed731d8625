//! What the engine is asked to generate and what it hands back.

use std::sync::Arc;

use cascade_shared::{FinishReason, Mode, VersionSpan};

use crate::sampler::SamplingParams;

/// Generation settings of one prompt (the stage decides them; a curriculum may change
/// `max_new_tokens` between snapshots).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenParams {
    /// Temperature, top-k and top-p.
    pub sampling: SamplingParams,
    /// Max response tokens.
    pub max_new_tokens: usize,
    /// Run seed of the sample keys.
    pub seed: u64,
}

/// One prompt to expand into `group_size` samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The caller's handle for this job (e.g. a key into its own table); not interpreted.
    pub tag: u64,
    /// Stable prompt id (the key stream is `prompt_id * group_size + sample_index`).
    pub prompt_id: u64,
    /// Rendered, tokenized prompt.
    pub prompt_ids: Vec<u32>,
    /// Think or no-think (recorded; the prompt is already rendered in this mode).
    pub mode: Mode,
    /// Samples per prompt (G).
    pub group_size: usize,
    /// Sampling settings.
    pub params: GenParams,
}

/// One finished sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// The job it belongs to.
    pub job: Arc<Job>,
    /// Index within the group, `0..group_size`.
    pub sample_index: usize,
    /// Generated tokens (the stop token included when there was one).
    pub response_ids: Vec<u32>,
    /// Behaviour log-prob of each generated token.
    pub logprobs: Vec<f32>,
    /// Policy versions that produced the tokens (per token range).
    pub versions: Vec<VersionSpan>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Milliseconds from entering the batch to the last token.
    pub generate_ms: f32,
}

/// A prompt that was not generated because it does not fit the context.
#[derive(Debug, Clone, PartialEq)]
pub struct Skipped {
    /// The prompt id.
    pub prompt_id: u64,
    /// Its length in tokens.
    pub prompt_len: usize,
}
