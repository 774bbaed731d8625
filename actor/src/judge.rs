//! The judge-model [`SemanticScorer`] of the SWE reward (RECIPE.md: execution-free SWE reward).
//!
//! When a predicted patch is neither empty, unparsable nor lexically identical to the gold
//! patch, the SWE verifier asks a semantic scorer for a score in [0, 1]. This one asks a causal
//! language model (any checkpoint our model code loads, with its tokenizer and chat template in
//! the same directory) whether the two patches fix the same issue, and reads the answer off the
//! next-token distribution instead of generating:
//!
//! 1. The user message is [`judge_message`]: the issue text (when the reference line has one),
//!    the gold patch and the candidate patch, and the question, to be answered YES or NO.
//! 2. It is rendered with the chat template in **no-think** mode with the generation prompt
//!    (`…<|im_start|>assistant\n<think>\n\n</think>\n\n` for Qwen3-style templates), so the next
//!    token is the answer itself.
//! 3. One forward pass; the log-softmax over the vocabulary at the last position gives
//!    `log p_yes` and `log p_no`, the log-probabilities of the **first token of `"YES"`** and of
//!    the **first token of `"NO"`**, as the tokenizer encodes those exact strings (no leading
//!    space: the answer follows the generation prompt's `\n\n` directly; no `Yes`/` YES`
//!    variants are summed in). Loading fails when the two first tokens coincide.
//! 4. The score is `p_yes / (p_yes + p_no)`, computed as `σ(log p_yes − log p_no)` so that it
//!    stays defined when both probabilities are tiny.
//!
//! A prompt longer than the model's context, or a failing forward pass, is an environment
//! failure ([`VerifyError::Environment`]), never a low score.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, D};
use cascade_rewards::swe::{PatchPair, SemanticScore, SemanticScorer};
use cascade_rewards::VerifyError;
use cascade_shared::chat::{Chat, Message};
use cascade_shared::model::{load_model, CausalLm};
use cascade_shared::Mode;
use serde_json::{json, Value};

use crate::error::{ActorError, Result};

/// The answer whose first token counts as "the patches fix the same issue".
pub const YES: &str = "YES";
/// The answer whose first token counts as "they do not".
pub const NO: &str = "NO";

/// Reference-line fields searched, in order, for the issue text shown to the judge (after them,
/// the last user turn of `messages`).
pub const ISSUE_FIELDS: [&str; 3] = ["problem_statement", "issue", "prompt"];

/// The issue text of a SWE reference line: the first string among [`ISSUE_FIELDS`], else the
/// last user turn of `messages`, else none.
pub fn issue_text(reference: &Value) -> Option<&str> {
    for field in ISSUE_FIELDS {
        if let Some(text) = reference.get(field).and_then(Value::as_str) {
            return Some(text);
        }
    }
    reference
        .get("messages")
        .and_then(Value::as_array)?
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))?
        .get("content")
        .and_then(Value::as_str)
}

/// The judge's user message (before the chat template adds the `/no_think` flag).
///
/// ~~~text
/// You are reviewing a candidate patch for a software issue. Decide whether the candidate patch
/// fixes the same issue as the reference patch, in an equivalent way.
///
/// Issue:
/// {issue}                      (this section only when there is an issue text)
///
/// Reference patch:
/// ```diff
/// {gold}
/// ```
///
/// Candidate patch:
/// ```diff
/// {candidate}
/// ```
///
/// Do the two patches fix the same issue? Answer YES or NO.
/// ~~~
///
/// Each text is stripped of trailing newlines before it is placed. `scripts/gen-judge-fixtures.py`
/// builds the same string for the transformers reference; change both together.
pub fn judge_message(issue: Option<&str>, gold: &str, candidate: &str) -> String {
    let mut text = String::from(
        "You are reviewing a candidate patch for a software issue. Decide whether the candidate \
         patch fixes the same issue as the reference patch, in an equivalent way.\n\n",
    );
    if let Some(issue) = issue {
        text.push_str("Issue:\n");
        text.push_str(issue.trim_end_matches('\n'));
        text.push_str("\n\n");
    }
    text.push_str("Reference patch:\n```diff\n");
    text.push_str(gold.trim_end_matches('\n'));
    text.push_str("\n```\n\nCandidate patch:\n```diff\n");
    text.push_str(candidate.trim_end_matches('\n'));
    text.push_str("\n```\n\nDo the two patches fix the same issue? Answer YES or NO.");
    text
}

/// The judge's verdict on one pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// Natural log of P(first token of "YES") at the answer position.
    pub logp_yes: f64,
    /// Natural log of P(first token of "NO") at the answer position.
    pub logp_no: f64,
    /// `exp(logp_yes)`.
    pub p_yes: f64,
    /// `exp(logp_no)`.
    pub p_no: f64,
    /// `p_yes / (p_yes + p_no)`, in [0, 1].
    pub score: f64,
}

impl Verdict {
    fn from_logprobs(logp_yes: f64, logp_no: f64) -> Verdict {
        // σ(a − b) = p_yes / (p_yes + p_no), without underflow when both are tiny.
        let d = logp_yes - logp_no;
        let score = if d >= 0.0 {
            1.0 / (1.0 + (-d).exp())
        } else {
            let e = d.exp();
            e / (1.0 + e)
        };
        Verdict {
            logp_yes,
            logp_no,
            p_yes: logp_yes.exp(),
            p_no: logp_no.exp(),
            score,
        }
    }
}

/// A judge model scoring whether a candidate patch fixes the same issue as the gold patch.
///
/// The model is only read (`&self` forward passes), so one judge is shared by every verifier
/// thread; it is `Send + Sync` like the model and the tokenizer it holds.
pub struct JudgeScorer {
    model: CausalLm,
    chat: Chat,
    yes_id: u32,
    no_id: u32,
    path: PathBuf,
    max_batch: usize,
}

impl std::fmt::Debug for JudgeScorer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JudgeScorer")
            .field("path", &self.path)
            .field("yes_id", &self.yes_id)
            .field("no_id", &self.no_id)
            .field("max_batch", &self.max_batch)
            .finish()
    }
}

impl JudgeScorer {
    /// Loads a judge checkpoint directory (config, safetensors, tokenizer and chat template)
    /// onto `device`.
    pub fn load(dir: &Path, device: &Device) -> Result<JudgeScorer> {
        let model = load_model(dir, device)?;
        let chat = Chat::from_dir(dir)?;
        JudgeScorer::new(model, chat, dir.to_path_buf())
    }

    /// A judge from parts; `path` is only reported in the details.
    pub fn new(model: CausalLm, chat: Chat, path: PathBuf) -> Result<JudgeScorer> {
        let first = |text: &str| -> Result<u32> {
            let ids = chat
                .tokenizer()
                .encode(text)
                .map_err(cascade_shared::chat::ChatError::from)?;
            ids.first().copied().ok_or_else(|| {
                ActorError::Invalid(format!("judge: the tokenizer encodes {text:?} as nothing"))
            })
        };
        let (yes_id, no_id) = (first(YES)?, first(NO)?);
        if yes_id == no_id {
            return Err(ActorError::Invalid(format!(
                "judge: {YES:?} and {NO:?} start with the same token ({yes_id})"
            )));
        }
        let vocab = model.config().vocab_size;
        if yes_id as usize >= vocab || no_id as usize >= vocab {
            return Err(ActorError::Invalid(format!(
                "judge: answer token ids {yes_id}/{no_id} are outside the model's vocabulary of {vocab}"
            )));
        }
        Ok(JudgeScorer {
            model,
            chat,
            yes_id,
            no_id,
            path,
            max_batch: 8,
        })
    }

    /// Sets how many prompts go through the model at once in [`JudgeScorer::judge_ids`]
    /// (default 8). The [`SemanticScorer`] path scores one pair per call. Rows are right-padded
    /// to the longest prompt of the batch, so on CPU (where a single row already keeps the
    /// cores busy) batching is slower: 1 was the fastest on the tiny fixture model, 1 thread.
    pub fn with_max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        self
    }

    /// The token ids of the first token of `"YES"` and of `"NO"`.
    pub fn answer_ids(&self) -> (u32, u32) {
        (self.yes_id, self.no_id)
    }

    /// Where the judge was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The prompt token ids for one pair: [`judge_message`] as the only user turn, no-think
    /// mode, generation prompt added.
    pub fn encode(&self, issue: Option<&str>, gold: &str, candidate: &str) -> Result<Vec<u32>> {
        let messages = [Message::user(judge_message(issue, gold, candidate))];
        Ok(self.chat.encode_chat(&messages, true, Mode::NoThink)?)
    }

    /// Verdicts for whole prompts (token ids ending where the answer starts), run in
    /// right-padded batches of up to `max_batch`.
    pub fn judge_ids(&self, prompts: &[Vec<u32>]) -> Result<Vec<Verdict>> {
        let mut out = Vec::with_capacity(prompts.len());
        for chunk in prompts.chunks(self.max_batch) {
            out.extend(self.judge_chunk(chunk)?);
        }
        Ok(out)
    }

    fn judge_chunk(&self, prompts: &[Vec<u32>]) -> Result<Vec<Verdict>> {
        let max_pos = self.model.config().max_position_embeddings;
        if prompts.iter().any(Vec::is_empty) {
            return Err(ActorError::Invalid("judge: empty prompt".into()));
        }
        let width = prompts.iter().map(Vec::len).max().unwrap_or(0);
        if width > max_pos {
            return Err(ActorError::Invalid(format!(
                "judge: prompt of {width} tokens exceeds the judge's context of {max_pos}"
            )));
        }
        let n = prompts.len();
        let dev = self.model.device();
        let mut ids = vec![0u32; n * width];
        for (r, p) in prompts.iter().enumerate() {
            ids[r * width..r * width + p.len()].copy_from_slice(p);
        }
        let ids = Tensor::from_vec(ids, (n, width), dev)?;
        let hidden = if prompts.iter().all(|p| p.len() == width) {
            self.model.forward_hidden(&ids, None)?
        } else {
            let mut mask = vec![0u8; n * width];
            for (r, p) in prompts.iter().enumerate() {
                mask[r * width..r * width + p.len()].fill(1);
            }
            let mask = Tensor::from_vec(mask, (n, width), dev)?;
            self.model.forward_hidden(&ids, Some(&mask))?
        }; // (n, width, h)
        let h = self.model.config().hidden_size;
        let last: Vec<u32> = prompts.iter().map(|p| (p.len() - 1) as u32).collect();
        let idx = Tensor::from_vec(last, (n, 1, 1), dev)?
            .broadcast_as((n, 1, h))?
            .contiguous()?;
        let last_hidden = hidden.gather(&idx, 1)?.squeeze(1)?; // (n, h)
        let logits = self.model.lm_head(&last_hidden)?; // (n, vocab) f32
        let logp = candle_nn::ops::log_softmax(&logits.to_dtype(DType::F32)?, D::Minus1)?;
        let pick = Tensor::from_vec(vec![self.yes_id, self.no_id], 2, dev)?;
        let both = logp.index_select(&pick, 1)?.to_vec2::<f32>()?; // (n, 2)
        Ok(both
            .into_iter()
            .map(|r| Verdict::from_logprobs(r[0] as f64, r[1] as f64))
            .collect())
    }

    /// Verdicts for (issue, gold, candidate) triples, batched.
    pub fn judge(&self, pairs: &[(Option<&str>, &str, &str)]) -> Result<Vec<Verdict>> {
        let prompts = pairs
            .iter()
            .map(|(issue, gold, candidate)| self.encode(*issue, gold, candidate))
            .collect::<Result<Vec<_>>>()?;
        self.judge_ids(&prompts)
    }

    /// The `details` object of a verdict.
    pub fn details(&self, verdict: &Verdict) -> Value {
        json!({
            "scorer": self.name(),
            "judge": self.path.display().to_string(),
            "p_yes": verdict.p_yes,
            "p_no": verdict.p_no,
            "logp_yes": verdict.logp_yes,
            "logp_no": verdict.logp_no,
        })
    }
}

impl SemanticScorer for JudgeScorer {
    fn name(&self) -> &'static str {
        "judge"
    }

    fn score(&self, pair: &PatchPair<'_>) -> std::result::Result<SemanticScore, VerifyError> {
        let issue = issue_text(pair.reference);
        let verdict = self
            .judge(&[(issue, pair.gold, pair.predicted)])
            .map_err(|e| VerifyError::Environment(format!("judge model: {e}")))?[0];
        if !verdict.score.is_finite() {
            return Err(VerifyError::Environment(format!(
                "judge model: non-finite log-probs (YES {}, NO {})",
                verdict.logp_yes, verdict.logp_no
            )));
        }
        Ok(SemanticScore {
            score: verdict.score.clamp(0.0, 1.0),
            details: self.details(&verdict),
        })
    }
}
