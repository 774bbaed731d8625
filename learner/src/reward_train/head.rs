//! The scalar head: its tensor name, how it starts, and how it scores sequences.

use candle_core::{DType, Device, Tensor};
use cascade_shared::model::CausalLm;

use super::shared_err;
use crate::error::{LearnerError, Result};
use crate::rng;

/// Name of the scalar head tensor (as the actor's `RewardModel` and transformers'
/// `*ForSequenceClassification` call it).
pub const SCORE_WEIGHT: &str = "score.weight";

/// How the scalar head starts.
#[derive(Debug, Clone)]
pub enum HeadInit {
    /// All zeros: every score starts at 0 (held-out accuracy exactly 0.5); the first step
    /// trains only the head, since the backbone gets no gradient through a zero head.
    Zeros,
    /// Seeded normal(0, `std`) draws (transformers uses `initializer_range`).
    Normal {
        /// Standard deviation.
        std: f64,
        /// Seed.
        seed: u64,
    },
    /// A given `(1, hidden)` tensor (e.g. to continue from a saved reward model).
    Tensor(Tensor),
}

/// The starting head, `(1, hidden)`, on `device` (f32, or the given tensor's dtype).
pub(super) fn initial_head(init: HeadInit, hidden: usize, device: &Device) -> Result<Tensor> {
    Ok(match init {
        HeadInit::Zeros => Tensor::zeros((1, hidden), DType::F32, device)?,
        HeadInit::Normal { std, seed } => {
            let mut r = rng::seeded(seed);
            let data: Vec<f32> = (0..hidden)
                .map(|_| {
                    // Box–Muller.
                    let u1 = rng::uniform(&mut r).max(f64::MIN_POSITIVE);
                    let u2 = rng::uniform(&mut r);
                    (std * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
                })
                .collect();
            Tensor::from_vec(data, (1, hidden), device)?
        }
        HeadInit::Tensor(t) => {
            if t.dims() != [1, hidden] {
                return Err(LearnerError::InvalidConfig(format!(
                    "reward model: {SCORE_WEIGHT} must be (1, {hidden}), got {:?}",
                    t.dims()
                )));
            }
            t.to_device(device)?
        }
    })
}

/// Scores of whole sequences, `(n,)` f32, differentiable: right-padded batch,
/// `forward_hidden`, hidden state of each sequence's last token, dot the head `(1, hidden)`.
pub(super) fn score_sequences(model: &CausalLm, head: &Tensor, seqs: &[&[u32]]) -> Result<Tensor> {
    let n = seqs.len();
    let width = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
    if n == 0 || seqs.iter().any(|s| s.is_empty()) {
        return Err(LearnerError::InvalidBatch(
            "reward model: empty batch or sequence".into(),
        ));
    }
    let max_pos = model.config().max_position_embeddings;
    if width > max_pos {
        return Err(LearnerError::InvalidBatch(format!(
            "reward model: sequence of {width} tokens exceeds the context of {max_pos}"
        )));
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
    let hidden = model
        .forward_hidden(&ids, Some(&mask))
        .map_err(shared_err)?; // (n, width, h)
    let h = model.config().hidden_size;
    let last: Vec<u32> = seqs
        .iter()
        .enumerate()
        .map(|(r, s)| (r * width + s.len() - 1) as u32)
        .collect();
    let last = Tensor::from_vec(last, n, dev)?;
    let last_hidden = hidden.reshape((n * width, h))?.index_select(&last, 0)?; // (n, h)
    let scores = last_hidden
        .matmul(&head.t()?.contiguous()?)?
        .squeeze(1)?
        .to_dtype(DType::F32)?;
    Ok(scores)
}
