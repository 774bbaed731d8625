//! Batched incremental decoding with a KV cache over ragged rows.
//!
//! A [`DecodeBatch`] has a fixed number of slots. Each slot holds one sequence; sequences of
//! different lengths share one cache time axis, right-aligned: a slot's tokens occupy the
//! columns `start..len` and everything left of `start` is masked out (the "left padding"
//! layout, kept up to date as slots are refilled). Finished slots are released and refilled
//! with new prompts by [`CausalLm::prefill`] while the other slots keep decoding
//! (continuous batching).

use candle_core::Tensor;

use super::causal_lm::{full_sequence_layout, CausalLm, KvMode};
use super::layers::OpsMode;
use super::{ModelError, Result};

/// Per-slot state and the per-layer key/value buffers of a decode batch.
#[derive(Debug)]
pub struct DecodeBatch {
    slots: usize,
    /// Per layer `(keys, values)`, each `(slots, n_kv, capacity, head_dim)`.
    layers: Vec<(Tensor, Tensor)>,
    /// Columns in use.
    len: usize,
    /// First valid column of each active slot.
    start: Vec<Option<usize>>,
    /// Position of the next token of each slot (= tokens so far).
    next_pos: Vec<u32>,
}

impl DecodeBatch {
    /// An empty batch with `slots` rows.
    pub fn new(slots: usize) -> DecodeBatch {
        DecodeBatch {
            slots,
            layers: Vec::new(),
            len: 0,
            start: vec![None; slots],
            next_pos: vec![0; slots],
        }
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Whether `slot` holds a sequence.
    pub fn is_active(&self, slot: usize) -> bool {
        self.start.get(slot).is_some_and(Option::is_some)
    }

    /// Slots without a sequence.
    pub fn free_slots(&self) -> Vec<usize> {
        (0..self.slots).filter(|&s| !self.is_active(s)).collect()
    }

    /// Slots with a sequence.
    pub fn active_slots(&self) -> Vec<usize> {
        (0..self.slots).filter(|&s| self.is_active(s)).collect()
    }

    /// Number of tokens (prompt + generated) of a slot's sequence.
    pub fn seq_len(&self, slot: usize) -> usize {
        self.next_pos[slot] as usize
    }

    /// Frees a slot; its columns are reclaimed at the next compaction.
    pub fn release(&mut self, slot: usize) {
        self.start[slot] = None;
        self.next_pos[slot] = 0;
    }

    /// Cache columns currently allocated (for memory accounting).
    pub fn capacity(&self) -> usize {
        self.layers
            .first()
            .and_then(|(k, _)| k.dim(2).ok())
            .unwrap_or(0)
    }

    /// Rebuilds the buffers with the live columns right-aligned at `new_len`, optionally
    /// placing new sequences (`(slot, keys/values per layer (1, n_kv, L, hd), tokens)`) whose
    /// last column is `new_len - 1`, with room for `headroom` more columns.
    fn rebuild(
        &mut self,
        new_rows: &[(usize, usize)],
        new_kv: Option<&[(Tensor, Tensor)]>,
        new_width: usize,
        headroom: usize,
        model: &CausalLm,
    ) -> Result<()> {
        let live_start = (0..self.slots)
            .filter(|s| !new_rows.iter().any(|(r, _)| r == s))
            .filter_map(|s| self.start[s])
            .min()
            .unwrap_or(self.len);
        let live = self.len - live_start;
        let width = live.max(new_width);
        let cap = width + headroom;
        let cfg = model.config();
        let (nkv, hd) = (cfg.num_kv_heads(), cfg.head_dim());
        let zeros = Tensor::zeros((1, nkv, cap, hd), model.dtype(), model.device())?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let mut ks = Vec::with_capacity(self.slots);
            let mut vs = Vec::with_capacity(self.slots);
            for s in 0..self.slots {
                if let Some(idx) = new_rows.iter().position(|(r, _)| *r == s) {
                    let (k, v) = &new_kv.expect("new rows come with their kv")[l];
                    let pad = |t: &Tensor| -> Result<Tensor> {
                        Ok(t.narrow(0, idx, 1)?.pad_with_zeros(
                            2,
                            width - new_width,
                            cap - width,
                        )?)
                    };
                    ks.push(pad(k)?);
                    vs.push(pad(v)?);
                } else if self.start[s].is_some() && live > 0 {
                    let (k, v) = &self.layers[l];
                    let take = |t: &Tensor| -> Result<Tensor> {
                        Ok(t.narrow(0, s, 1)?
                            .narrow(2, live_start, live)?
                            .pad_with_zeros(2, width - live, cap - width)?)
                    };
                    ks.push(take(k)?);
                    vs.push(take(v)?);
                } else {
                    ks.push(zeros.clone());
                    vs.push(zeros.clone());
                }
            }
            layers.push((
                Tensor::cat(&ks, 0)?.contiguous()?,
                Tensor::cat(&vs, 0)?.contiguous()?,
            ));
        }
        for s in 0..self.slots {
            if let Some((_, tokens)) = new_rows.iter().find(|(r, _)| *r == s) {
                self.start[s] = Some(width - tokens);
            } else if let Some(st) = self.start[s] {
                self.start[s] = Some(st - live_start + (width - live));
            }
        }
        self.layers = layers;
        self.len = width;
        Ok(())
    }
}

impl CausalLm {
    /// Puts new sequences into free (or released) slots and runs their prompts. Returns the
    /// logits of each prompt's last token, `(rows.len(), vocab)` f32, in the order of `rows`.
    pub fn prefill(&self, batch: &mut DecodeBatch, rows: &[(usize, &[u32])]) -> Result<Tensor> {
        if rows.is_empty() {
            return Err(ModelError::Config("prefill needs at least one row".into()));
        }
        let max_pos = self.config().max_position_embeddings;
        let width = rows.iter().map(|(_, p)| p.len()).max().unwrap_or(0);
        for (slot, prompt) in rows {
            if *slot >= batch.slots {
                return Err(ModelError::Config(format!(
                    "slot {slot} out of range ({} slots)",
                    batch.slots
                )));
            }
            if prompt.is_empty() {
                return Err(ModelError::Config(format!("empty prompt for slot {slot}")));
            }
            if prompt.len() > max_pos {
                return Err(ModelError::TooLong {
                    len: prompt.len(),
                    max: max_pos,
                });
            }
            if let Some(&id) = prompt
                .iter()
                .find(|&&id| id as usize >= self.config().vocab_size)
            {
                return Err(ModelError::BadTokenId {
                    id,
                    vocab: self.config().vocab_size,
                });
            }
            if rows.iter().filter(|(s, _)| s == slot).count() > 1 {
                return Err(ModelError::Config(format!("slot {slot} listed twice")));
            }
        }
        // 1. Left-padded mini-batch of the new prompts: (n, width).
        let n = rows.len();
        let mut ids = vec![0u32; n * width];
        let mut mask = vec![0u8; n * width];
        for (r, (_, prompt)) in rows.iter().enumerate() {
            let off = r * width + width - prompt.len();
            ids[off..off + prompt.len()].copy_from_slice(prompt);
            mask[off..off + prompt.len()].fill(1);
        }
        let ids = Tensor::from_vec(ids, (n, width), self.device())?;
        let mask = Tensor::from_vec(mask, (n, width), self.device())?;
        let (positions, bias) = full_sequence_layout(&ids, Some(&mask), self.device())?;
        // 2. Run it, keeping each layer's keys/values.
        let mut kv = Vec::new();
        let hidden = self.run_layers(
            &ids,
            &positions,
            &bias,
            OpsMode::Infer,
            KvMode::OwnAndReturn(&mut kv),
        )?;
        let last = hidden.narrow(1, width - 1, 1)?.squeeze(1)?; // (n, hidden)
        let logits = self.lm_head(&last)?;
        // 3. Merge into the batch's buffers, right-aligned.
        let new_rows: Vec<(usize, usize)> = rows.iter().map(|(s, p)| (*s, p.len())).collect();
        let headroom = 32.max(width);
        batch.rebuild(&new_rows, Some(&kv), width, headroom, self)?;
        for (slot, prompt) in rows {
            batch.next_pos[*slot] = prompt.len() as u32;
        }
        Ok(logits)
    }

    /// Feeds one token to every active slot and returns the next-token logits,
    /// `(tokens.len(), vocab)` f32, in the order of `tokens`. Every active slot must be listed
    /// exactly once (a slot that should stop is released first).
    pub fn decode_step(&self, batch: &mut DecodeBatch, tokens: &[(usize, u32)]) -> Result<Tensor> {
        let active = batch.active_slots();
        if tokens.len() != active.len()
            || !active
                .iter()
                .all(|s| tokens.iter().filter(|(t, _)| t == s).count() == 1)
        {
            return Err(ModelError::Config(format!(
                "decode_step must feed every active slot exactly once (active: {active:?})"
            )));
        }
        if active.is_empty() {
            return Err(ModelError::Config("decode_step with no active slot".into()));
        }
        let max_pos = self.config().max_position_embeddings;
        for &(slot, tok) in tokens {
            if tok as usize >= self.config().vocab_size {
                return Err(ModelError::BadTokenId {
                    id: tok,
                    vocab: self.config().vocab_size,
                });
            }
            if batch.next_pos[slot] as usize >= max_pos {
                return Err(ModelError::TooLong {
                    len: batch.next_pos[slot] as usize + 1,
                    max: max_pos,
                });
            }
        }
        // 1. Make room for one more column (compacting away columns no live slot uses).
        if batch.len + 1 > batch.capacity() {
            let headroom = 32.max(batch.len);
            batch.rebuild(&[], None, 0, headroom, self)?;
        }
        let slots = batch.slots;
        let offset = batch.len;
        // 2. Inputs for every slot (free slots decode a dummy token that nobody reads).
        let mut ids = vec![0u32; slots];
        let mut pos = vec![0u32; slots];
        for &(slot, tok) in tokens {
            ids[slot] = tok;
            pos[slot] = batch.next_pos[slot];
        }
        let keys = offset + 1;
        let mut bias = vec![f32::NEG_INFINITY; slots * keys];
        for s in 0..slots {
            match batch.start[s] {
                Some(st) => bias[s * keys + st..(s + 1) * keys].fill(0.0),
                None => bias[s * keys + offset] = 0.0,
            }
        }
        let dev = self.device();
        let ids = Tensor::from_vec(ids, (slots, 1), dev)?;
        let positions = Tensor::from_vec(pos, (slots, 1), dev)?;
        let bias = Tensor::from_vec(bias, (slots, 1, 1, keys), dev)?;
        // 3. One step through the stack, writing k/v at column `offset`.
        let hidden = self.run_layers(
            &ids,
            &positions,
            &bias,
            OpsMode::Infer,
            KvMode::Buffers {
                layers: &batch.layers,
                offset,
            },
        )?;
        let logits = self.lm_head(&hidden.squeeze(1)?)?; // (slots, vocab)
        batch.len += 1;
        for &(slot, _) in tokens {
            batch.next_pos[slot] += 1;
        }
        let order: Vec<u32> = tokens.iter().map(|(s, _)| *s as u32).collect();
        let order = Tensor::from_vec(order, tokens.len(), dev)?;
        Ok(logits.index_select(&order, 0)?.contiguous()?)
    }

    /// Greedy or externally sampled generation for one prompt, token by token (a convenience
    /// for `cascade inspect generate` and tests): `choose` maps the logits row to the next token.
    pub fn generate_one(
        &self,
        prompt: &[u32],
        max_new_tokens: usize,
        stop: &[u32],
        mut choose: impl FnMut(&[f32]) -> Result<u32>,
    ) -> Result<Vec<u32>> {
        let mut batch = DecodeBatch::new(1);
        let mut logits = self.prefill(&mut batch, &[(0, prompt)])?;
        let mut out = Vec::new();
        for _ in 0..max_new_tokens {
            let row: Vec<f32> = logits.squeeze(0)?.to_vec1()?;
            let tok = choose(&row)?;
            out.push(tok);
            if stop.contains(&tok) || out.len() == max_new_tokens {
                break;
            }
            logits = self.decode_step(&mut batch, &[(0, tok)])?;
        }
        Ok(out)
    }
}

/// Index of the largest value (first one on ties).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as u32
}
