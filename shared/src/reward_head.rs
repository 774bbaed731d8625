//! The reward model's scalar head, defined once for the learner that trains it and the actors
//! that score with it.
//!
//! A reward model is the shared architecture ([`CausalLm`]) plus `score.weight`, shape
//! `(1, hidden)` (the name transformers' `*ForSequenceClassification` uses). The score of a
//! (prompt, response) pair is `score.weight · h`, where `h` is the final hidden state of the
//! last real token of the conversation rendered with the chat template (user prompt, assistant
//! response, no generation prompt, thinking mode). Sequences are scored in right-padded batches.

use candle_core::{DType, Tensor};

use crate::chat::{Chat, ChatError, Message};
use crate::model::{CausalLm, ModelError};
use crate::Mode;

/// Name of the scalar head tensor.
pub const SCORE_WEIGHT: &str = "score.weight";

/// Why sequences could not be scored.
#[derive(Debug, thiserror::Error)]
pub enum RewardHeadError {
    /// No sequence, or an empty one (a score needs a last token).
    #[error("reward model: empty batch or sequence")]
    Empty,
    /// A sequence longer than the model's context.
    #[error("reward model: sequence of {len} tokens exceeds the context of {max}")]
    TooLong {
        /// Its length.
        len: usize,
        /// The context (`max_position_embeddings`).
        max: usize,
    },
    /// The head is not `(1, hidden)`.
    #[error("reward model: {SCORE_WEIGHT} must be (1, {hidden}), got {found:?}")]
    HeadShape {
        /// The model's hidden size.
        hidden: usize,
        /// The head's shape.
        found: Vec<usize>,
    },
    /// The forward pass failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Rendering or tokenising a conversation failed.
    #[error(transparent)]
    Chat(#[from] ChatError),
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Token ids of the conversation a (prompt, response) pair is scored on.
pub fn pair_ids(chat: &Chat, prompt: &str, response: &str) -> Result<Vec<u32>, ChatError> {
    let messages = [Message::user(prompt), Message::assistant(response)];
    chat.encode_chat(&messages, false, Mode::Think)
}

/// Checks that `head` fits `model`: `(1, hidden)`.
pub fn check_head(model: &CausalLm, head: &Tensor) -> Result<(), RewardHeadError> {
    let hidden = model.config().hidden_size;
    if head.dims() != [1, hidden] {
        return Err(RewardHeadError::HeadShape {
            hidden,
            found: head.dims().to_vec(),
        });
    }
    Ok(())
}

/// Scores of whole sequences, `(n,)` f32: one right-padded forward pass, the hidden state of
/// each sequence's last token, dot `head` (`(1, hidden)`). Differentiable in the model's
/// variables and in `head` when they are `Var`s (the learner trains through it).
pub fn sequence_scores(
    model: &CausalLm,
    head: &Tensor,
    seqs: &[&[u32]],
) -> Result<Tensor, RewardHeadError> {
    check_head(model, head)?;
    let n = seqs.len();
    if n == 0 || seqs.iter().any(|s| s.is_empty()) {
        return Err(RewardHeadError::Empty);
    }
    let width = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
    let max = model.config().max_position_embeddings;
    if width > max {
        return Err(RewardHeadError::TooLong { len: width, max });
    }
    let mut ids = vec![0u32; n * width];
    let mut mask = vec![0u8; n * width];
    for (r, s) in seqs.iter().enumerate() {
        ids[r * width..r * width + s.len()].copy_from_slice(s);
        mask[r * width..r * width + s.len()].fill(1);
    }
    let dev = model.device();
    let ids = Tensor::from_vec(ids, (n, width), dev)?;
    let mask = Tensor::from_vec(mask, (n, width), dev)?;
    let hidden = model.forward_hidden(&ids, Some(&mask))?; // (n, width, h)
    let h = model.config().hidden_size;
    let last: Vec<u32> = seqs
        .iter()
        .enumerate()
        .map(|(r, s)| (r * width + s.len() - 1) as u32)
        .collect();
    let last = Tensor::from_vec(last, n, dev)?;
    let last_hidden = hidden.reshape((n * width, h))?.index_select(&last, 0)?; // (n, h)
    let head = head.to_dtype(last_hidden.dtype())?.t()?.contiguous()?; // (h, 1)
    Ok(last_hidden
        .matmul(&head)?
        .squeeze(1)?
        .to_dtype(DType::F32)?)
}

/// Scores of whole token sequences, `max_batch` sequences per forward pass (no gradient is
/// kept beyond each batch's values).
pub fn score_ids(
    model: &CausalLm,
    head: &Tensor,
    seqs: &[Vec<u32>],
    max_batch: usize,
) -> Result<Vec<f32>, RewardHeadError> {
    let mut out = Vec::with_capacity(seqs.len());
    for chunk in seqs.chunks(max_batch.max(1)) {
        let chunk: Vec<&[u32]> = chunk.iter().map(Vec::as_slice).collect();
        out.extend(sequence_scores(model, head, &chunk)?.to_vec1::<f32>()?);
    }
    Ok(out)
}

/// Scores of (prompt, response) pairs: each rendered with [`pair_ids`], then [`score_ids`].
pub fn score_pairs(
    model: &CausalLm,
    head: &Tensor,
    chat: &Chat,
    pairs: &[(&str, &str)],
    max_batch: usize,
) -> Result<Vec<f32>, RewardHeadError> {
    let seqs = pairs
        .iter()
        .map(|(p, r)| pair_ids(chat, p, r))
        .collect::<Result<Vec<_>, _>>()?;
    score_ids(model, head, &seqs, max_batch)
}
