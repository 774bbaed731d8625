//! The reward-model verifier: the shared architecture with a scalar head.
//!
//! A reward-model checkpoint is a Hugging Face model directory (config, safetensors,
//! tokenizer) whose safetensors also hold `score.weight`, shape `(1, hidden)`. The score of a
//! (prompt, response) pair is `score.weight · h`, where `h` is the final hidden state of the
//! last real token of the conversation rendered with the chat template (user prompt, assistant
//! response, no generation prompt). Pairs are scored in right-padded batches.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use cascade_rewards::{Reward, SplitResponse, Verifier, VerifyError};
use cascade_shared::chat::{Chat, Message};
use cascade_shared::model::{compute_dtype, CausalLm, Checkpoint, ModelConfig};
use cascade_shared::Mode;

use crate::error::{ActorError, Result};

/// Name of the scalar head tensor.
pub const SCORE_WEIGHT: &str = "score.weight";

/// A loaded reward model.
pub struct RewardModel {
    model: CausalLm,
    /// `(hidden, 1)` in the model's dtype.
    head: Tensor,
    chat: Chat,
    max_batch: usize,
}

impl std::fmt::Debug for RewardModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RewardModel")
            .field("max_batch", &self.max_batch)
            .finish()
    }
}

impl RewardModel {
    /// Loads a reward-model checkpoint directory onto `device`.
    ///
    /// Both our own saves (learner `RmTrainer::save`) and transformers'
    /// `*ForSequenceClassification` checkpoints (`num_labels = 1`) load: the latter have
    /// `model.*` and `score.weight` but no `lm_head.weight`, whatever `tie_word_embeddings`
    /// says. The LM head is never used for scoring, so when the config asks for an untied head
    /// that the checkpoint does not have, the model is built with the head tied to the
    /// embedding instead.
    pub fn load(dir: &Path, device: &Device) -> Result<RewardModel> {
        let mut cfg = ModelConfig::from_file(&dir.join("config.json"))?;
        let ckpt = Checkpoint::open_dir(dir)?;
        if !cfg.tie_word_embeddings && !ckpt.contains("lm_head.weight") {
            cfg.tie_word_embeddings = true;
        }
        let tensors = ckpt.load_all(&cfg, compute_dtype(device), device)?;
        let model = CausalLm::from_tensors(&cfg, &tensors)?;
        drop(tensors);
        let hidden = model.config().hidden_size;
        let head = ckpt.load(SCORE_WEIGHT, &[1, hidden], model.dtype(), device)?;
        let chat = Chat::from_dir(dir)?;
        RewardModel::new(model, head, chat)
    }

    /// A reward model from parts; `head` is `score.weight`, `(1, hidden)`.
    pub fn new(model: CausalLm, head: Tensor, chat: Chat) -> Result<RewardModel> {
        let hidden = model.config().hidden_size;
        if head.dims() != [1, hidden] {
            return Err(ActorError::Invalid(format!(
                "{SCORE_WEIGHT} must be (1, {hidden}), got {:?}",
                head.dims()
            )));
        }
        let head = head.to_dtype(model.dtype())?.t()?.contiguous()?;
        Ok(RewardModel {
            model,
            head,
            chat,
            max_batch: 16,
        })
    }

    /// Sets how many pairs go through the model at once.
    pub fn with_max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        self
    }

    /// Token ids of a (prompt, response) conversation.
    pub fn encode_pair(&self, prompt: &str, response: &str) -> Result<Vec<u32>> {
        let messages = [Message::user(prompt), Message::assistant(response)];
        Ok(self.chat.encode_chat(&messages, false, Mode::Think)?)
    }

    /// Scores token sequences (each a whole conversation), batched.
    pub fn score_ids(&self, seqs: &[Vec<u32>]) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(seqs.len());
        for chunk in seqs.chunks(self.max_batch) {
            out.extend(self.score_chunk(chunk)?);
        }
        Ok(out)
    }

    fn score_chunk(&self, seqs: &[Vec<u32>]) -> Result<Vec<f32>> {
        let max_pos = self.model.config().max_position_embeddings;
        let width = seqs.iter().map(Vec::len).max().unwrap_or(0);
        if seqs.iter().any(Vec::is_empty) {
            return Err(ActorError::Invalid("reward model: empty sequence".into()));
        }
        if width > max_pos {
            return Err(ActorError::Invalid(format!(
                "reward model: sequence of {width} tokens exceeds the context of {max_pos}"
            )));
        }
        let n = seqs.len();
        let mut ids = vec![0u32; n * width];
        let mut mask = vec![0u8; n * width];
        for (r, s) in seqs.iter().enumerate() {
            ids[r * width..r * width + s.len()].copy_from_slice(s);
            mask[r * width..r * width + s.len()].fill(1);
        }
        let dev = self.model.device();
        let ids = Tensor::from_vec(ids, (n, width), dev)?;
        let mask = Tensor::from_vec(mask, (n, width), dev)?;
        let hidden = self.model.forward_hidden(&ids, Some(&mask))?; // (n, width, h)
        let last: Vec<u32> = seqs.iter().map(|s| (s.len() - 1) as u32).collect();
        let h = self.model.config().hidden_size;
        let idx = Tensor::from_vec(last, (n, 1, 1), dev)?
            .broadcast_as((n, 1, h))?
            .contiguous()?;
        let last_hidden = hidden.gather(&idx, 1)?.squeeze(1)?; // (n, h)
        let scores = last_hidden
            .matmul(&self.head)?
            .squeeze(1)?
            .to_dtype(DType::F32)?;
        Ok(scores.to_vec1()?)
    }

    /// Scores (prompt, response) pairs, batched.
    pub fn score_pairs(&self, pairs: &[(&str, &str)]) -> Result<Vec<f32>> {
        let seqs = pairs
            .iter()
            .map(|(p, r)| self.encode_pair(p, r))
            .collect::<Result<Vec<_>>>()?;
        self.score_ids(&seqs)
    }
}

/// The prompt text of a reference: `prompt`, or the last user turn of `messages`.
fn prompt_of(reference: &serde_json::Value) -> std::result::Result<&str, VerifyError> {
    if let Some(p) = reference.get("prompt").and_then(|p| p.as_str()) {
        return Ok(p);
    }
    reference
        .get("messages")
        .and_then(|m| m.as_array())
        .and_then(|m| {
            m.iter()
                .rev()
                .find(|m| m.get("role").and_then(|r| r.as_str()) == Some("user"))
        })
        .and_then(|m| m.get("content"))
        .and_then(|c| c.as_str())
        .ok_or_else(|| VerifyError::BadReference {
            field: "prompt".into(),
            problem: "missing (a string, or `messages` with a user turn)".into(),
        })
}

impl Verifier for RewardModel {
    fn name(&self) -> &'static str {
        "rm"
    }

    /// Scores the final answer (a thinking response without `</think>` has none: the score is
    /// the model's score of an empty answer).
    fn verify(
        &self,
        reference: &serde_json::Value,
        response: &SplitResponse<'_>,
    ) -> std::result::Result<Reward, VerifyError> {
        let prompt = prompt_of(reference)?;
        let answer = response.answer.unwrap_or("");
        let score = self
            .score_pairs(&[(prompt, answer)])
            .map_err(|e| VerifyError::Environment(format!("reward model: {e}")))?[0];
        Ok(Reward {
            reward: score,
            details: serde_json::json!({ "rm_score": score, "has_answer": response.answer.is_some() }),
        })
    }
}
