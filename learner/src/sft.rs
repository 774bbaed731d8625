//! Supervised fine-tuning: conversations in both modes, packed into fixed-budget rows, loss on
//! the assistant tokens only.
//!
//! Data is read through `cascade_shared::data` ([`load_sft_from`]): in our layout, JSONL with
//! one conversation per line, `{"messages": [{"role", "content"}, ...], "mode": "think" |
//! "no_think"}` (mode defaults to `think`); or Parquet / JSONL in a public layout (a preset or
//! a column mapping). A think-mode assistant turn carries its
//! reasoning as `<think>\n...\n</think>\n\n` before the answer. [`Chat::encode_sft`] renders
//! the conversation with the chat template of `mode` and marks the tokens the model is trained
//! to produce.
//!
//! **Packing**: each epoch visits the conversations in a seeded order and fills rows of at most
//! `token_budget` tokens with whole conversations (next-fit). A row numbers its conversations
//! 1, 2, ... in the attention mask, so each attends only within itself and its positions
//! restart at 0 (see `CausalLm::forward_hidden`): packing changes the cost, never the loss. A
//! conversation longer than the budget is skipped and counted.
//!
//! **Loss**: the sum over the step's rows of `−log p(token)` over trained tokens, divided by the
//! number of trained tokens of the whole step (token-level, as in the RL stages), accumulated
//! micro-batch by micro-batch so memory follows `micro_batch`.

use std::ops::Range;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use cascade_shared::chat::Chat;
use cascade_shared::collective::shard_range;
use cascade_shared::data::record::FieldError;
use cascade_shared::data::{scan, DataReader, DataSpec, Kind, Row};
use cascade_shared::model::CausalLm;
use cascade_shared::Mode;
use rand::seq::SliceRandom;

use crate::error::{LearnerError, Result};
use crate::optim::GradientSink;
use cascade_shared::rng::seeded;

/// One tokenized conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftExample {
    /// Token ids of the whole rendered conversation.
    pub ids: Vec<u32>,
    /// `true` where the token is trained.
    pub trained: Vec<bool>,
    /// The conversation's mode.
    pub mode: Mode,
}

/// A loaded SFT file.
#[derive(Debug, Clone)]
pub struct SftData {
    /// Where it came from.
    pub path: PathBuf,
    /// Conversations that fit the token budget.
    pub examples: Vec<SftExample>,
    /// Conversations skipped because they are longer than the budget.
    pub too_long: usize,
}

/// Loads and tokenizes an SFT file (its layout recognised from the columns); see
/// [`load_sft_from`].
pub fn load_sft(path: &Path, chat: &Chat, token_budget: usize) -> Result<SftData> {
    load_sft_from(&DataSpec::of_kind(path, Kind::Sft), chat, token_budget)
}

/// Reads and tokenizes the SFT conversations of `spec` (JSONL or Parquet, one file, a glob or
/// a directory; our layout or a preset / column mapping) in one pass through the file index,
/// keeping only the token ids. A malformed row, or one that does not render to a trained
/// token, is counted and logged naming file, row and column; a dataset with no usable row is an
/// error with the first reasons.
pub fn load_sft_from(spec: &DataSpec, chat: &Chat, token_budget: usize) -> Result<SftData> {
    let reader = DataReader::open(spec)?;
    if reader.kind() != Kind::Sft {
        return Err(LearnerError::InvalidConfig(format!(
            "{}: holds {} rows, not SFT conversations",
            spec.path,
            reader.kind().as_str()
        )));
    }
    let mut examples = Vec::new();
    let mut too_long = 0;
    let stats = scan(&reader, |_, row| {
        let Row::Sft(conv) = row else {
            return Err(FieldError::row("not an SFT conversation"));
        };
        let enc = chat
            .encode_sft(&conv.messages, conv.mode)
            .map_err(|e| FieldError::col("messages", format!("cannot render: {e}")))?;
        if enc.ids.len() > token_budget {
            too_long += 1;
            return Ok(());
        }
        if !enc.assistant_mask.iter().any(|&m| m) {
            return Err(FieldError::col(
                "messages",
                "no trained token after rendering",
            ));
        }
        examples.push(SftExample {
            ids: enc.ids,
            trained: enc.assistant_mask,
            mode: conv.mode,
        });
        Ok(())
    })?;
    if examples.is_empty() {
        return Err(LearnerError::Dataset {
            path: PathBuf::from(&spec.path),
            line: 0,
            reason: format!(
                "no usable conversation ({too_long} longer than the token budget {token_budget}, \
                 {} rejected)",
                stats.rejected
            ),
        });
    }
    Ok(SftData {
        path: PathBuf::from(&spec.path),
        examples,
        too_long,
    })
}

/// A packed training row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedRow {
    /// Concatenated token ids.
    pub ids: Vec<u32>,
    /// Conversation number (1-based) of each token.
    pub segments: Vec<u32>,
    /// `weights[i]`: whether predicting `ids[i + 1]` from position `i` is trained (same
    /// conversation and a trained token); length `ids.len() - 1`.
    pub weights: Vec<bool>,
}

impl PackedRow {
    /// Trained target tokens of the row.
    pub fn trained_tokens(&self) -> usize {
        self.weights.iter().filter(|&&w| w).count()
    }
}

/// Packs `order` (indices into `examples`) next-fit into rows of at most `budget` tokens.
pub fn pack(examples: &[SftExample], order: &[usize], budget: usize) -> Vec<PackedRow> {
    let mut rows = Vec::new();
    let mut ids: Vec<u32> = Vec::new();
    let mut segments: Vec<u32> = Vec::new();
    let mut trained: Vec<bool> = Vec::new();
    let flush = |ids: &mut Vec<u32>,
                 segments: &mut Vec<u32>,
                 trained: &mut Vec<bool>,
                 rows: &mut Vec<_>| {
        if ids.len() >= 2 {
            let weights = (0..ids.len() - 1)
                .map(|i| segments[i] == segments[i + 1] && trained[i + 1])
                .collect();
            rows.push(PackedRow {
                ids: std::mem::take(ids),
                segments: std::mem::take(segments),
                weights,
            });
        }
        ids.clear();
        segments.clear();
        trained.clear();
    };
    for &i in order {
        let ex = &examples[i];
        if !ids.is_empty() && ids.len() + ex.ids.len() > budget {
            flush(&mut ids, &mut segments, &mut trained, &mut rows);
        }
        let seg = segments.last().map_or(1, |s| s + 1);
        ids.extend_from_slice(&ex.ids);
        segments.extend(std::iter::repeat_n(seg, ex.ids.len()));
        trained.extend_from_slice(&ex.trained);
    }
    flush(&mut ids, &mut segments, &mut trained, &mut rows);
    rows
}

/// The rows of an SFT stage, epoch after epoch, each epoch in its own seeded order. Row `k` of
/// the stage is a pure function of (seed, data, budget, k), so a resumed stage continues with
/// exactly the rows an uninterrupted one would have used.
#[derive(Debug)]
pub struct SftSchedule {
    data: SftData,
    budget: usize,
    seed: u64,
    epochs: Vec<Vec<PackedRow>>,
}

impl SftSchedule {
    /// A schedule over `data`.
    pub fn new(data: SftData, budget: usize, seed: u64) -> Self {
        SftSchedule {
            data,
            budget,
            seed,
            epochs: Vec::new(),
        }
    }

    /// The data.
    pub fn data(&self) -> &SftData {
        &self.data
    }

    fn epoch(&mut self, e: usize) -> &[PackedRow] {
        while self.epochs.len() <= e {
            let n = self.epochs.len() as u64;
            let mut order: Vec<usize> = (0..self.data.examples.len()).collect();
            let mut rng = seeded(self.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            order.shuffle(&mut rng);
            self.epochs
                .push(pack(&self.data.examples, &order, self.budget));
        }
        &self.epochs[e]
    }

    /// Rows `start .. start + n` of the stage (crossing epochs as needed).
    pub fn rows(&mut self, start: usize, n: usize) -> Vec<PackedRow> {
        let mut out = Vec::with_capacity(n);
        let mut k = start;
        let mut e = 0;
        let mut offset = 0; // rows before epoch e
        while out.len() < n {
            let len = self.epoch(e).len();
            if k < offset + len {
                out.push(self.epoch(e)[k - offset].clone());
                k += 1;
            } else {
                offset += len;
                e += 1;
            }
        }
        out
    }
}

/// What one SFT step computed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SftStats {
    /// Mean negative log-likelihood per trained token.
    pub loss: f64,
    /// Trained tokens.
    pub trained_tokens: usize,
    /// All tokens that went through the model.
    pub total_tokens: usize,
}

/// Forward + backward of `rows`, `micro_batch` rows at a time, gradients added to
/// `optimizer`; the loss is normalised by the trained tokens of all `rows`.
pub fn accumulate_sft_gradients(
    model: &CausalLm,
    rows: &[PackedRow],
    micro_batch: usize,
    optimizer: &mut dyn GradientSink,
    device: &Device,
) -> Result<SftStats> {
    accumulate_scaled_sft_gradients(model, rows, micro_batch, optimizer, device, 1.0)
}

/// The micro-batches (chunks of `micro_batch` rows) of an SFT step over `n_rows` rows that rank
/// `rank` of `world` runs: contiguous, whole micro-batches, as a single process would cut them.
pub fn sft_part(n_rows: usize, micro_batch: usize, rank: usize, world: usize) -> Range<usize> {
    let chunks = n_rows.div_ceil(micro_batch.max(1));
    shard_range(chunks, rank, world)
}

/// [`accumulate_sft_gradients`] with the loss weighted by `scale` (an RL stage's `sft_mix`
/// coefficient): the gradients added are `scale` × those of the mean NLL; the loss reported
/// is the unweighted mean NLL.
pub fn accumulate_scaled_sft_gradients(
    model: &CausalLm,
    rows: &[PackedRow],
    micro_batch: usize,
    optimizer: &mut dyn GradientSink,
    device: &Device,
    scale: f64,
) -> Result<SftStats> {
    let chunks = rows.len().div_ceil(micro_batch.max(1));
    accumulate_sft_gradients_part(
        model,
        rows,
        micro_batch,
        0..chunks,
        optimizer,
        device,
        scale,
    )
}

/// [`accumulate_scaled_sft_gradients`] over the micro-batches `part` (chunks of `micro_batch`
/// rows, see [`sft_part`]) only: one rank's share of a step. The loss keeps the trained tokens
/// of all `rows` as its denominator, so the parts' gradients and losses sum to the step's.
pub fn accumulate_sft_gradients_part(
    model: &CausalLm,
    rows: &[PackedRow],
    micro_batch: usize,
    part: Range<usize>,
    optimizer: &mut dyn GradientSink,
    device: &Device,
    scale: f64,
) -> Result<SftStats> {
    let trained: usize = rows.iter().map(PackedRow::trained_tokens).sum();
    let total: usize = rows.iter().map(|r| r.ids.len()).sum();
    if trained == 0 {
        return Err(LearnerError::InvalidBatch(
            "SFT step without trained tokens".into(),
        ));
    }
    check_context(model, rows)?;
    let norm = trained as f64;
    let mut loss_sum = 0.0;
    for chunk in rows
        .chunks(micro_batch.max(1))
        .skip(part.start)
        .take(part.len())
    {
        let width = chunk.iter().map(|r| r.ids.len()).max().unwrap_or(0);
        let n = chunk.len();
        let mut ids = vec![0u32; n * width];
        let mut seg = vec![0u32; n * width];
        // The trained positions of the (n, width - 1) next-token grid: the LM head runs there
        // only, a chunk at a time.
        let mut selected: Vec<u32> = Vec::new();
        for (r, row) in chunk.iter().enumerate() {
            ids[r * width..r * width + row.ids.len()].copy_from_slice(&row.ids);
            seg[r * width..r * width + row.ids.len()].copy_from_slice(&row.segments);
            for (i, &on) in row.weights.iter().enumerate() {
                if on {
                    selected.push((r * (width - 1) + i) as u32);
                }
            }
        }
        if selected.is_empty() {
            continue;
        }
        let ids = Tensor::from_vec(ids, (n, width), device)?;
        let seg = Tensor::from_vec(seg, (n, width), device)?;
        let selected = Tensor::new(selected.as_slice(), device)?;
        // The summed log-probs with the LM head's gradients computed in the forward's pass over
        // each chunk of logits (on the CPU in f32; elsewhere the chunked log-probs, summed).
        let nll = (model
            .token_logprob_sum_selected(&ids, Some(&seg), &selected)?
            .neg()?
            / norm)?;
        loss_sum += f64::from(nll.to_scalar::<f32>()?);
        let weighted = if scale == 1.0 { nll } else { (nll * scale)? };
        let grads = weighted.backward()?;
        // The graph (every activation backward kept) goes before the gradients are added.
        drop(weighted);
        optimizer.accumulate(&grads)?;
    }
    Ok(SftStats {
        loss: loss_sum,
        trained_tokens: trained,
        total_tokens: total,
    })
}

/// Refuses a row holding a conversation longer than the model's context, naming the row of the
/// step, the conversation and the numbers (instead of a failure deep in the model).
fn check_context(model: &CausalLm, rows: &[PackedRow]) -> Result<()> {
    let max = model.config().max_position_embeddings;
    for (r, row) in rows.iter().enumerate() {
        let mut start = 0;
        while start < row.segments.len() {
            let conversation = row.segments[start];
            let len = row.segments[start..]
                .iter()
                .take_while(|&&s| s == conversation)
                .count();
            if len > max {
                return Err(LearnerError::InvalidBatch(format!(
                    "SFT row {r} of the step, conversation {conversation} (tokens {start}..{}): \
                     {len} tokens exceed the model's context of {max} \
                     (max_position_embeddings)",
                    start + len
                )));
            }
            start += len;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(len: usize, trained_from: usize) -> SftExample {
        SftExample {
            ids: (0..len as u32).collect(),
            trained: (0..len).map(|i| i >= trained_from).collect(),
            mode: Mode::Think,
        }
    }

    #[test]
    fn packing_never_trains_across_conversations() {
        let examples = vec![ex(4, 2), ex(3, 1), ex(5, 3)];
        let rows = pack(&examples, &[0, 1, 2], 8);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].segments, vec![1, 1, 1, 1, 2, 2, 2]);
        // Targets: positions 1..4 of conv 1 (trained from 2: targets 2, 3), then conv 2 (1, 2).
        assert_eq!(rows[0].weights, vec![false, true, true, false, true, true]);
        assert_eq!(rows[0].trained_tokens(), 4);
        assert_eq!(rows[1].ids.len(), 5);
    }

    /// A packed row gives every conversation exactly the log-probs it gets alone: positions
    /// restart and attention stays inside the segment.
    #[test]
    fn packed_rows_score_each_conversation_as_if_alone() {
        use cascade_shared::model::{random_weights, ModelConfig};
        let cfg = ModelConfig::from_json_str(
            r#"{"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32,
                "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
                "initializer_range": 0.2}"#,
        )
        .unwrap();
        let dev = Device::Cpu;
        let model = CausalLm::from_tensors(&cfg, &random_weights(&cfg, 3, &dev).unwrap()).unwrap();
        let a: Vec<u32> = vec![5, 9, 12, 3, 40, 41, 7];
        let b: Vec<u32> = vec![8, 1, 33, 60, 2];
        let alone = |ids: &[u32]| -> Vec<f32> {
            let t = Tensor::from_vec(ids.to_vec(), (1, ids.len()), &dev).unwrap();
            model
                .token_logprobs(&t, None)
                .unwrap()
                .squeeze(0)
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        let mut ids = a.clone();
        ids.extend(&b);
        ids.push(0); // one padding token at the end
        let seg: Vec<u32> = std::iter::repeat_n(1, a.len())
            .chain(std::iter::repeat_n(2, b.len()))
            .chain([0])
            .collect();
        let n = ids.len();
        let packed: Vec<f32> = model
            .token_logprobs(
                &Tensor::from_vec(ids, (1, n), &dev).unwrap(),
                Some(&Tensor::from_vec(seg, (1, n), &dev).unwrap()),
            )
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec1()
            .unwrap();
        let (la, lb) = (alone(&a), alone(&b));
        for (i, (x, y)) in la.iter().zip(&packed[..a.len() - 1]).enumerate() {
            assert!(
                (x - y).abs() < 1e-5,
                "conversation 1, token {i}: {x} vs {y}"
            );
        }
        let off = a.len();
        for (i, (x, y)) in lb.iter().zip(&packed[off..off + b.len() - 1]).enumerate() {
            assert!(
                (x - y).abs() < 1e-5,
                "conversation 2, token {i}: {x} vs {y}"
            );
        }
    }

    #[test]
    fn schedule_rows_are_a_function_of_the_index() {
        let examples: Vec<_> = (0..10).map(|i| ex(3 + i % 4, 1)).collect();
        let data = SftData {
            path: PathBuf::from("x"),
            examples,
            too_long: 0,
        };
        let mut a = SftSchedule::new(data.clone(), 12, 7);
        let mut b = SftSchedule::new(data, 12, 7);
        let all = a.rows(0, 20);
        assert_eq!(b.rows(13, 7), all[13..20].to_vec());
    }
}
