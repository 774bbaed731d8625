//! The reward-model verifier: the shared architecture with a scalar head.
//!
//! A reward-model checkpoint is a Hugging Face model directory (config, safetensors,
//! tokenizer) whose safetensors also hold `score.weight`; how a pair is scored is defined once
//! in [`cascade_shared::reward_head`] (shared with the learner, which trains the head).

use std::path::Path;

use candle_core::{Device, Tensor};
use cascade_rewards::{Reward, SplitResponse, Verifier, VerifyError};
use cascade_shared::chat::Chat;
use cascade_shared::model::{compute_dtype, CausalLm, Checkpoint, ModelConfig};
pub use cascade_shared::reward_head::SCORE_WEIGHT;
use cascade_shared::reward_head::{self, check_head, pair_ids};

use crate::error::Result;

/// A loaded reward model.
pub struct RewardModel {
    model: CausalLm,
    /// `score.weight`, `(1, hidden)`, in the model's dtype.
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
        check_head(&model, &head)?;
        let head = head.to_dtype(model.dtype())?;
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
        Ok(pair_ids(&self.chat, prompt, response)?)
    }

    /// Scores token sequences (each a whole conversation), batched.
    pub fn score_ids(&self, seqs: &[Vec<u32>]) -> Result<Vec<f32>> {
        Ok(reward_head::score_ids(
            &self.model,
            &self.head,
            seqs,
            self.max_batch,
        )?)
    }

    /// Scores (prompt, response) pairs, batched.
    pub fn score_pairs(&self, pairs: &[(&str, &str)]) -> Result<Vec<f32>> {
        Ok(reward_head::score_pairs(
            &self.model,
            &self.head,
            &self.chat,
            pairs,
            self.max_batch,
        )?)
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
