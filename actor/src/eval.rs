//! Evaluation: generate `samples` responses per prompt of a held-out file and score them with
//! the same verifiers as training. Used by `cascade eval` and by `cascade run`'s held-out table.
//!
//! The score of a prompt is the mean reward of its samples; the reported `mean_reward` is the
//! mean over prompts. `pass@1` is the mean fraction of samples with full reward (≥ 1), and
//! `pass@k` the unbiased estimator of Chen et al. (2021), `1 − C(n − c, k) / C(n, k)`, averaged
//! over prompts. The mode of each prompt is fixed (`--mode`) or drawn per prompt with the stage's
//! think/no-think mix, with a seed that is the same for every model evaluated, so rows of the
//! held-out table differ only by the weights.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cascade_rewards::Verifier;
use cascade_shared::chat::split_response;
use cascade_shared::chat::Chat;
use cascade_shared::model::CausalLm;
use cascade_shared::Mode;
use rayon::prelude::*;
use serde::Serialize;

use crate::dataset::Dataset;
use crate::engine::{Engine, GenParams, Job};
use crate::error::{ActorError, Result};
use crate::run::choose_mode;
use crate::sampler::SamplingParams;

/// Evaluation settings.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// Samples per prompt (k of pass@k).
    pub samples: usize,
    /// Sampling temperature (0 = greedy).
    pub temperature: f32,
    /// Nucleus threshold.
    pub top_p: f32,
    /// Max response tokens.
    pub max_new_tokens: usize,
    /// A fixed mode, or `None` to draw one per prompt with `mode_mix`.
    pub mode: Option<Mode>,
    /// Fraction of thinking prompts when `mode` is `None`.
    pub mode_mix: f64,
    /// Seed of the samplers and of the mode draw.
    pub seed: u64,
    /// Rows decoded together.
    pub gen_batch: usize,
    /// Use only the first N prompts (0 = all).
    pub max_prompts: usize,
}

/// Scores of one mode.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ModeScores {
    /// Prompts evaluated in this mode.
    pub prompts: usize,
    /// Mean over prompts of the mean reward of their samples.
    pub mean_reward: f64,
    /// Standard error of `mean_reward` over prompts (sample standard deviation of the prompts'
    /// mean rewards / √prompts; 0 with fewer than two prompts).
    pub mean_reward_se: f64,
    /// Mean fraction of samples with reward ≥ 1.
    pub pass_at_1: f64,
    /// Unbiased pass@k with k = samples.
    pub pass_at_k: f64,
    /// Mean response length in tokens.
    pub response_len: f64,
}

/// The result of an evaluation.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EvalResult {
    /// All prompts together.
    pub all: ModeScores,
    /// Per mode (`think`, `no_think`).
    pub by_mode: BTreeMap<String, ModeScores>,
    /// Samples per prompt.
    pub samples: usize,
    /// Verifier errors (malformed references), counted as reward 0.
    pub verify_errors: usize,
    /// Each evaluated prompt's mean reward, by prompt id: two models evaluated on the same file
    /// with the same seed can be compared prompt by prompt (a paired difference), which is far
    /// less noisy than comparing their means. Not part of `--json` output.
    #[serde(skip)]
    pub prompt_scores: BTreeMap<u64, f64>,
    /// Every sample (prompt id, mode, decoded response, reward), in prompt order, for
    /// `cascade eval --dump`. Not part of `--json` output.
    #[serde(skip)]
    pub responses: Vec<EvalSample>,
}

/// One evaluated sample.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalSample {
    /// The prompt's id in the data file.
    pub prompt_id: u64,
    /// `think` or `no_think`.
    pub mode: &'static str,
    /// The decoded response (special tokens removed).
    pub response: String,
    /// The verifier's reward (0 when it failed).
    pub reward: f32,
    /// Response tokens.
    pub tokens: usize,
}

/// `1 − C(n − c, k) / C(n, k)`: the probability that at least one of k samples drawn without
/// replacement from n, c of them correct, is correct.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    if k == 0 || n == 0 {
        return 0.0;
    }
    if n - c < k {
        return 1.0;
    }
    let mut fail = 1.0;
    for i in (n - c + 1)..=n {
        fail *= 1.0 - k as f64 / i as f64;
    }
    1.0 - fail
}

struct Outcome {
    prompt_id: u64,
    mode: Mode,
    rewards: Vec<f32>,
    lengths: Vec<usize>,
}

impl Outcome {
    fn mean(&self) -> f64 {
        self.rewards.iter().map(|&r| f64::from(r)).sum::<f64>() / self.rewards.len().max(1) as f64
    }
}

/// The mean of `xs` and its standard error (sample standard deviation / √n; 0 when n < 2).
pub fn mean_and_se(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, (var / n).sqrt())
}

fn scores<'a>(outcomes: impl Iterator<Item = &'a Outcome>, k: usize) -> ModeScores {
    let mut s = ModeScores::default();
    let (mut len_sum, mut len_n) = (0.0, 0usize);
    let mut prompt_means = Vec::new();
    for o in outcomes {
        let n = o.rewards.len().max(1);
        let c = o.rewards.iter().filter(|&&r| r >= 1.0).count();
        s.prompts += 1;
        prompt_means.push(o.mean());
        s.pass_at_1 += c as f64 / n as f64;
        s.pass_at_k += pass_at_k(o.rewards.len(), c, k.min(o.rewards.len()));
        len_sum += o.lengths.iter().sum::<usize>() as f64;
        len_n += o.lengths.len();
    }
    (s.mean_reward, s.mean_reward_se) = mean_and_se(&prompt_means);
    if s.prompts > 0 {
        let p = s.prompts as f64;
        s.pass_at_1 /= p;
        s.pass_at_k /= p;
    }
    s.response_len = len_sum / len_n.max(1) as f64;
    s
}

/// Evaluates `model` on `dataset` with `verifier`.
pub fn evaluate(
    model: CausalLm,
    chat: &Chat,
    dataset: &Dataset,
    verifier: Arc<dyn Verifier>,
    opts: &EvalOptions,
) -> Result<EvalResult> {
    if opts.samples == 0 {
        return Err(ActorError::Invalid("eval: samples must be ≥ 1".into()));
    }
    let stop_ids = chat.tokenizer().special().stop_ids();
    let context = model.config().max_position_embeddings;
    let sampling = SamplingParams {
        temperature: opts.temperature,
        top_k: None,
        top_p: Some(opts.top_p),
    };
    sampling.validate()?;
    let take = if opts.max_prompts == 0 {
        dataset.len()
    } else {
        opts.max_prompts.min(dataset.len())
    };
    let prompts = dataset.head(take)?;
    let mut modes = Vec::with_capacity(take);
    let mut jobs = Vec::with_capacity(take);
    for (tag, rec) in prompts.iter().enumerate() {
        let mode = opts
            .mode
            .unwrap_or_else(|| choose_mode(opts.seed, rec.id, 0, opts.mode_mix));
        modes.push(mode);
        jobs.push(Job {
            tag: tag as u64,
            prompt_id: rec.id,
            prompt_ids: chat.encode_chat(&rec.messages, true, mode)?,
            mode,
            group_size: opts.samples,
            params: GenParams {
                sampling,
                max_new_tokens: opts.max_new_tokens,
                seed: opts.seed,
            },
        });
    }
    // A KV cache for every row at its longest (the prompts are known): no row waits, and the
    // cache is allocated once.
    let slots = opts.gen_batch.max(1);
    let longest = jobs
        .iter()
        .map(|j| j.prompt_ids.len())
        .filter(|&len| len < context)
        .max()
        .unwrap_or(1);
    let row = context.min(longest + opts.max_new_tokens);
    let mut engine = Engine::with_kv_budget(model, 0, slots, stop_ids, slots * row)?;
    for job in jobs {
        engine.submit(job)?;
    }
    let finished = engine.run_to_completion()?;
    let skipped = engine.take_skipped();
    if !skipped.is_empty() {
        tracing::warn!(
            "eval: {} prompts too long for the context skipped",
            skipped.len()
        );
    }
    let texts: Vec<String> = finished
        .iter()
        .map(|f| {
            chat.tokenizer()
                .decode(&f.response_ids, true)
                .unwrap_or_default()
        })
        .collect();
    // A prompt's samples often repeat one another word for word (the tiny default's code
    // held-out: 137 distinct responses in 384 samples); each distinct (prompt, response) is
    // verified once, in parallel (the code sandbox takes a while per sample).
    let mut distinct: HashMap<(usize, &str), usize> = HashMap::new();
    let mut keys = Vec::new();
    let which: Vec<usize> = finished
        .iter()
        .zip(&texts)
        .map(|(f, text)| {
            let key = (f.job.tag as usize, text.as_str());
            *distinct.entry(key).or_insert_with(|| {
                keys.push(key);
                keys.len() - 1
            })
        })
        .collect();
    let verdicts: Vec<(f32, bool)> = keys
        .par_iter()
        .map(
            |&(tag, text)| match verifier.verify(&prompts[tag].reference, &split_response(text)) {
                Ok(r) if r.reward.is_finite() => (r.reward, false),
                Ok(_) => (0.0, true),
                Err(e) => {
                    tracing::warn!("eval: prompt {}: {e}", prompts[tag].id);
                    (0.0, true)
                }
            },
        )
        .collect();
    let scored: Vec<(usize, f32, usize, bool, String)> = finished
        .iter()
        .zip(texts.iter())
        .zip(which)
        .map(|((f, text), k)| {
            let (reward, err) = verdicts[k];
            (
                f.job.tag as usize,
                reward,
                f.response_ids.len(),
                err,
                text.clone(),
            )
        })
        .collect();
    let mut outcomes: Vec<Outcome> = modes
        .iter()
        .zip(&prompts)
        .map(|(&mode, rec)| Outcome {
            prompt_id: rec.id,
            mode,
            rewards: Vec::new(),
            lengths: Vec::new(),
        })
        .collect();
    let mut verify_errors = 0;
    let mut responses = Vec::with_capacity(scored.len());
    for (tag, reward, len, err, text) in scored {
        responses.push((
            tag,
            EvalSample {
                prompt_id: outcomes[tag].prompt_id,
                mode: outcomes[tag].mode.as_str(),
                response: text,
                reward,
                tokens: len,
            },
        ));
        outcomes[tag].rewards.push(reward);
        outcomes[tag].lengths.push(len);
        verify_errors += usize::from(err);
    }
    outcomes.retain(|o| !o.rewards.is_empty());
    let mut by_mode = BTreeMap::new();
    for mode in [Mode::Think, Mode::NoThink] {
        if outcomes.iter().any(|o| o.mode == mode) {
            by_mode.insert(
                mode.as_str().to_string(),
                scores(outcomes.iter().filter(|o| o.mode == mode), opts.samples),
            );
        }
    }
    Ok(EvalResult {
        all: scores(outcomes.iter(), opts.samples),
        by_mode,
        samples: opts.samples,
        verify_errors,
        prompt_scores: outcomes.iter().map(|o| (o.prompt_id, o.mean())).collect(),
        responses: {
            // Samples finish in engine order; the dump lists them in the file's prompt order.
            responses.sort_by_key(|(tag, _)| *tag);
            responses.into_iter().map(|(_, s)| s).collect()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_at_k_matches_the_closed_form() {
        assert_eq!(pass_at_k(4, 0, 1), 0.0);
        assert_eq!(pass_at_k(4, 4, 1), 1.0);
        assert!((pass_at_k(4, 1, 1) - 0.25).abs() < 1e-12);
        // 1 − C(2,2)/C(4,2) = 1 − 1/6.
        assert!((pass_at_k(4, 2, 2) - (1.0 - 1.0 / 6.0)).abs() < 1e-12);
        assert_eq!(pass_at_k(4, 3, 2), 1.0);
    }

    #[test]
    fn standard_error_is_the_sample_sd_over_root_n() {
        assert_eq!(mean_and_se(&[]), (0.0, 0.0));
        assert_eq!(mean_and_se(&[0.5]), (0.5, 0.0));
        // sd of {0, 1} (n − 1 denominator) = √0.5; / √2 = 0.5.
        let (m, se) = mean_and_se(&[0.0, 1.0]);
        assert!((m - 0.5).abs() < 1e-12 && (se - 0.5).abs() < 1e-12);
        let (m, se) = mean_and_se(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert!((m - 5.0).abs() < 1e-12);
        assert!((se - (32.0f64 / 7.0 / 8.0).sqrt()).abs() < 1e-12);
    }
}
