//! What a draw is asked for and what it returns.

use super::error::{Result, SamplerError};

/// Sampling settings of a batch (the stage decides them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `0` means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `k` largest logits (`None`: no limit). Ties at the k-th value are all kept.
    pub top_k: Option<usize>,
    /// Keep the smallest top set with probability mass `>= p` after top-k (`None` or `1`: all).
    /// Ties at the threshold value are all kept.
    pub top_p: Option<f32>,
}

impl SamplingParams {
    /// Plain sampling at temperature 1, no truncation.
    pub const fn plain() -> Self {
        Self {
            temperature: 1.0,
            top_k: None,
            top_p: None,
        }
    }

    /// Greedy decoding.
    pub const fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: None,
        }
    }

    /// Checks the ranges: `temperature >= 0` and finite, `top_k >= 1`, `0 < top_p <= 1`.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(SamplerError::Temperature(self.temperature));
        }
        if self.top_k == Some(0) {
            return Err(SamplerError::TopK);
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(SamplerError::TopP(p));
            }
        }
        Ok(())
    }

    /// The temperature of the behaviour log-probs this sampler reports: its temperature, or 1
    /// for greedy decoding (whose log-probs are taken at `T = 1`).
    pub fn logprob_temperature(&self) -> f32 {
        if self.is_greedy() {
            1.0
        } else {
            self.temperature
        }
    }

    /// Whether this is greedy decoding.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// The top-k limit that actually truncates a vocabulary of `vocab` tokens (`None` otherwise).
    pub fn effective_top_k(&self, vocab: usize) -> Option<usize> {
        self.top_k.filter(|&k| k < vocab)
    }

    /// The top-p that actually truncates (`None` for `None` or `>= 1`).
    pub fn effective_top_p(&self) -> Option<f32> {
        self.top_p.filter(|&p| p < 1.0)
    }
}

/// Which random numbers a draw uses. Two draws with equal keys give the same token, whatever
/// the batch they are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SampleKey {
    /// Run seed.
    pub seed: u64,
    /// Sample stream: `prompt_id * G + sample_index`, so the G samples of a prompt differ.
    pub stream: u64,
    /// Token position within the sample (decode step).
    pub position: u64,
}

impl SampleKey {
    /// The key of sample `sample_index` of prompt `prompt_id` in groups of `group_size`.
    pub fn for_sample(
        seed: u64,
        prompt_id: u64,
        group_size: u64,
        sample_index: u64,
        position: u64,
    ) -> Self {
        Self {
            seed,
            stream: prompt_id * group_size + sample_index,
            position,
        }
    }
}

/// One drawn token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    /// The token id.
    pub token: u32,
    /// Behaviour log-prob `log_softmax(logits / T)[token]` over the whole vocabulary, before
    /// top-k/top-p truncation (for greedy: at `T = 1`).
    pub logprob: f32,
}
