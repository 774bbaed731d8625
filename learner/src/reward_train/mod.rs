//! Bradley–Terry reward-model training on preference pairs.
//!
//! The reward model is the shared architecture ([`CausalLm`](cascade_shared::model::CausalLm)) plus a scalar head
//! `score.weight`, shape `(1, hidden)`, scored as [`cascade_shared::reward_head`] defines it
//! (once, for this trainer and the actor's `RewardModel`).
//!
//! Training minimises the Bradley–Terry loss, the mean over pairs of
//! `−log σ(s_chosen − s_rejected) = softplus(s_rejected − s_chosen)`, computed in a form that
//! neither overflows nor has a wrong gradient at a tie (see [`pairwise_loss`]). A step covers
//! `batch_pairs` pairs in micro-batches of `micro_batch` pairs (the gradients are summed, so
//! memory follows the micro-batch and the result does not depend on it), then applies
//! [`AdamW`](crate::optim::AdamW) with a linear warm-up + cosine
//! [`LrSchedule`](crate::schedule::LrSchedule). Every backbone tensor and the head
//! are trained.
//!
//! Data: read through `cascade_shared::data` ([`load_pairs_from`]): our JSONL, one `{"prompt":
//! str, "chosen": str, "rejected": str}` per line (other keys are ignored, blank lines
//! skipped), or a pairs preset / column mapping, JSONL or Parquet; a malformed row is counted
//! and logged naming file, row and column, and a file with no usable pair is an error. A pair whose chosen or rejected conversation is longer than `max_len` tokens
//! (or the model's context) is **skipped**, not truncated, and counted.
//!
//! [`RmTrainer::save`] writes a Hugging Face directory that the actor's
//! `RewardModel::load` reads: `config.json`, `model.safetensors` (every backbone tensor under
//! its HF name plus `score.weight`), `tokenizer.json`, optionally `tokenizer_config.json`, and
//! the marker `COMPLETE` last; it is published atomically
//! ([`cascade_shared::snapshot::durable::AtomicDir`]: `DIR.tmp`, each file fsynced, renamed to
//! `DIR`, the parent fsynced).
//!
//! Layout: `data` (the pairs file, encoded pairs), `config` ([`RmTrainConfig`]), `head` (the
//! scalar head's initialisation), `loss` (Bradley–Terry),
//! `trainer` ([`RmTrainer`]: encode, score, accumulate, step), `save` (the saved directory),
//! `train` (the whole run: [`train_reward_model`]).

mod config;
mod data;
mod head;
mod loss;
mod save;
mod train;
mod trainer;

#[cfg(test)]
mod test_support;

pub use config::RmTrainConfig;
pub use data::{load_pairs, load_pairs_from, EncodedPair, PreferencePair};
pub use head::{HeadInit, SCORE_WEIGHT};
pub use loss::pairwise_loss;
pub use save::{is_complete, COMPLETE_FILE};
pub use train::{train_reward_model, RmInputs, RmReport};
pub use trainer::{RmStepStats, RmTrainer};
