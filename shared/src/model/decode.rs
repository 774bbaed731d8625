//! Batched incremental decoding over a paged KV cache.
//!
//! A [`DecodeBatch`] has a fixed number of slots. Each slot holds one sequence whose keys and
//! values sit in blocks of [`BLOCK_TOKENS`] tokens of a shared pool ([`super::paged`]): no
//! padding between sequences of different lengths, nothing copied when a sequence starts, grows
//! or ends. Finished slots are released (their blocks return to the free list) and refilled
//! with new prompts by [`CausalLm::prefill`] while the other slots keep decoding (continuous
//! batching).
//!
//! The pool either has a fixed budget ([`DecodeBatch::with_kv_budget`]: allocated in full on
//! first use, so the cache's memory is known before the first token) or grows as needed
//! ([`DecodeBatch::new`]). With a budget, a call that needs more blocks than are free fails with
//! [`ModelError::KvFull`] and changes nothing; [`DecodeBatch::free_blocks`] and
//! [`DecodeBatch::blocks_for_step`] let a scheduler check first.

use std::sync::Arc;

use candle_core::Tensor;

use super::causal_lm::{full_sequence_layout, AttnMask, CausalLm, KvMode};
use super::flash_attn::Segments;
use super::layers::OpsMode;
use super::paged::{PageTable, PagedAttention, BLOCK_TOKENS};
use super::{ModelError, Result};

/// Prompt tokens a scheduler should prefill in one call (more rows wait for the next step; a
/// single longer row still goes alone), and the default chunk in which
/// [`CausalLm::prefill`] runs a longer row: bounds the prefill's activations, which are linear
/// in the tokens of one pass.
pub const PREFILL_TOKENS: usize = 8192;

/// Per-slot block tables and the per-layer key/value pools of a decode batch.
#[derive(Debug)]
pub struct DecodeBatch {
    slots: usize,
    /// The most blocks the pool may hold (`None`: grows as needed).
    max_blocks: Option<usize>,
    /// Per layer `(keys, values)`, each `(blocks × BLOCK_TOKENS, kv_heads, head_dim)`; empty
    /// until the first prefill.
    pool: Vec<(Tensor, Tensor)>,
    /// Blocks allocated in `pool`.
    blocks: usize,
    /// Free block ids, taken from the end (a new pool's lowest ids first; released blocks are
    /// reused first).
    free: Vec<u32>,
    /// Blocks of each slot's sequence, in order. A full block may be listed by several slots
    /// ([`DecodeBatch::fork`]); a slot's last, partly filled block is always its own.
    tables: Vec<Vec<u32>>,
    /// Slots listing each allocated block (0: free).
    refs: Vec<u32>,
    /// Tokens cached per slot (= the position of its next token).
    lens: Vec<usize>,
    active: Vec<bool>,
    /// Tokens of a row [`CausalLm::prefill`] runs in one pass; the rest follow in chunks
    /// ([`CausalLm::extend`]).
    prefill_chunk: usize,
}

impl DecodeBatch {
    /// An empty batch with `slots` rows whose cache grows as needed.
    pub fn new(slots: usize) -> DecodeBatch {
        DecodeBatch {
            slots,
            max_blocks: None,
            pool: Vec::new(),
            blocks: 0,
            free: Vec::new(),
            tables: vec![Vec::new(); slots],
            refs: Vec::new(),
            lens: vec![0; slots],
            active: vec![false; slots],
            prefill_chunk: PREFILL_TOKENS,
        }
    }

    /// Runs rows longer than `tokens` through [`CausalLm::prefill`] in chunks of `tokens`
    /// (default [`PREFILL_TOKENS`]; at least 1).
    pub fn set_prefill_chunk(&mut self, tokens: usize) {
        self.prefill_chunk = tokens.max(1);
    }

    /// An empty batch with `slots` rows sharing a cache of `tokens` tokens (rounded up to whole
    /// blocks), allocated in full by the first prefill.
    pub fn with_kv_budget(slots: usize, tokens: usize) -> DecodeBatch {
        DecodeBatch {
            max_blocks: Some(Self::blocks_for(tokens)),
            ..DecodeBatch::new(slots)
        }
    }

    /// Blocks that hold `tokens` tokens.
    pub fn blocks_for(tokens: usize) -> usize {
        tokens.div_ceil(BLOCK_TOKENS)
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Whether `slot` holds a sequence.
    pub fn is_active(&self, slot: usize) -> bool {
        self.active.get(slot).copied().unwrap_or(false)
    }

    /// Slots without a sequence.
    pub fn free_slots(&self) -> Vec<usize> {
        (0..self.slots).filter(|&s| !self.active[s]).collect()
    }

    /// Slots with a sequence.
    pub fn active_slots(&self) -> Vec<usize> {
        (0..self.slots).filter(|&s| self.active[s]).collect()
    }

    /// Number of tokens (prompt + generated) of a slot's sequence.
    pub fn seq_len(&self, slot: usize) -> usize {
        self.lens[slot]
    }

    /// Frees a slot; its blocks that no other slot lists return to the free list.
    pub fn release(&mut self, slot: usize) {
        let blocks = std::mem::take(&mut self.tables[slot]);
        for block in blocks.into_iter().rev() {
            let refs = &mut self.refs[block as usize];
            *refs -= 1;
            if *refs == 0 {
                self.free.push(block);
            }
        }
        self.active[slot] = false;
        self.lens[slot] = 0;
    }

    /// Blocks the slots hold between them, each shared block counted once.
    pub fn blocks_in_use(&self) -> usize {
        self.refs.iter().filter(|&&r| r > 0).count()
    }

    /// Blocks a [`DecodeBatch::fork`] of `tokens` tokens takes from the free list (its partly
    /// filled last block; the full ones are shared).
    pub fn blocks_for_fork(tokens: usize) -> usize {
        usize::from(!tokens.is_multiple_of(BLOCK_TOKENS))
    }

    /// Starts `dst` as a copy of the first `tokens` tokens of `src`'s sequence without running
    /// the model: `dst` lists `src`'s full blocks (shared, never written again: a sequence only
    /// writes past its length) and gets its own copy of the partly filled block, if any. This is
    /// how the samples of one prompt share the prompt's cache. A slot that still holds a
    /// sequence is released first. With a budget whose free blocks cannot hold the copied
    /// block, [`ModelError::KvFull`] and nothing changes.
    pub fn fork(&mut self, model: &CausalLm, src: usize, dst: usize, tokens: usize) -> Result<()> {
        if src >= self.slots || dst >= self.slots || src == dst {
            return Err(ModelError::Config(format!(
                "fork from slot {src} to slot {dst} ({} slots)",
                self.slots
            )));
        }
        if !self.active[src] || tokens == 0 || tokens > self.lens[src] {
            return Err(ModelError::Config(format!(
                "fork of {tokens} tokens from slot {src}, which holds {}",
                self.lens[src]
            )));
        }
        let needed = Self::blocks_for_fork(tokens);
        let returned = self.tables[dst]
            .iter()
            .filter(|&&b| self.refs[b as usize] == 1)
            .count();
        if let Some(free) = self.free_blocks() {
            if needed > free + returned {
                return Err(self.full(needed));
            }
        }
        if self.active[dst] {
            self.release(dst);
        }
        self.reserve(needed, model)?;
        let full = tokens / BLOCK_TOKENS;
        let mut table: Vec<u32> = self.tables[src][..full].to_vec();
        for &block in &table {
            self.refs[block as usize] += 1;
        }
        let part = tokens % BLOCK_TOKENS;
        if part > 0 {
            let block = self.take();
            let from = self.tables[src][full] as usize * BLOCK_TOKENS;
            let to = block as usize * BLOCK_TOKENS;
            let dev = model.device();
            let from = Tensor::from_vec((from as u32..(from + part) as u32).collect(), part, dev)?;
            let to = Tensor::from_vec((to as u32..(to + part) as u32).collect(), part, dev)?;
            let cfg = model.config();
            let to = super::paged::row_index(&to, cfg.num_kv_heads(), cfg.head_dim())?;
            for (k, v) in &self.pool {
                super::paged::write_rows(k, &k.index_select(&from, 0)?, &to)?;
                super::paged::write_rows(v, &v.index_select(&from, 0)?, &to)?;
            }
            table.push(block);
        }
        self.tables[dst] = table;
        self.lens[dst] = tokens;
        self.active[dst] = true;
        Ok(())
    }

    /// Releases every slot and puts the free list back in its first order, keeping the pool:
    /// what is decoded next uses the same blocks as in a new batch.
    pub fn clear(&mut self) {
        for slot in 0..self.slots {
            self.tables[slot].clear();
            self.active[slot] = false;
            self.lens[slot] = 0;
        }
        self.refs.fill(0);
        self.free = (0..self.blocks as u32).rev().collect();
    }

    /// Tokens the pool holds now (allocated blocks × [`BLOCK_TOKENS`]).
    pub fn capacity(&self) -> usize {
        self.blocks * BLOCK_TOKENS
    }

    /// The budget in tokens (whole blocks), or `None` for a cache that grows as needed.
    pub fn kv_budget(&self) -> Option<usize> {
        self.max_blocks.map(|b| b * BLOCK_TOKENS)
    }

    /// Blocks that can still be given out: the free ones plus those the budget has not
    /// allocated yet (`None`: no budget).
    pub fn free_blocks(&self) -> Option<usize> {
        self.max_blocks
            .map(|max| self.free.len() + max.saturating_sub(self.blocks))
    }

    /// Blocks the next [`CausalLm::decode_step`] over `slots` takes from the free list: one for
    /// each slot whose last block is full.
    pub fn blocks_for_step(&self, slots: &[usize]) -> usize {
        slots
            .iter()
            .filter(|&&s| self.lens[s] == self.tables[s].len() * BLOCK_TOKENS)
            .count()
    }

    /// A [`ModelError::KvFull`] for `needed` more blocks.
    fn full(&self, needed: usize) -> ModelError {
        ModelError::KvFull {
            needed: needed * BLOCK_TOKENS,
            free: self.free_blocks().unwrap_or(0) * BLOCK_TOKENS,
            budget: self.kv_budget().unwrap_or(0),
        }
    }

    /// Makes sure `n` blocks are free, allocating (the whole budget on first use, else growing
    /// the pool) when needed. Changes nothing on error.
    fn reserve(&mut self, n: usize, model: &CausalLm) -> Result<()> {
        if self.free.len() >= n {
            return Ok(());
        }
        let wanted = self.blocks + n - self.free.len();
        let target = match self.max_blocks {
            Some(max) if wanted > max => return Err(self.full(n)),
            Some(max) => max,
            None => wanted.max(2 * self.blocks).max(self.slots),
        };
        let cfg = model.config();
        let (nkv, hd) = (cfg.num_kv_heads(), cfg.head_dim());
        let extra = target - self.blocks;
        let zeros = Tensor::zeros(
            (extra * BLOCK_TOKENS, nkv, hd),
            model.dtype(),
            model.device(),
        )?;
        let pool = if self.pool.is_empty() {
            // Two tensors per layer (keys and values), never shared.
            (0..cfg.num_hidden_layers)
                .map(|_| -> Result<(Tensor, Tensor)> { Ok((zeros.copy()?, zeros.copy()?)) })
                .collect::<Result<Vec<_>>>()?
        } else {
            self.pool
                .iter()
                .map(|(k, v)| -> Result<(Tensor, Tensor)> {
                    Ok((Tensor::cat(&[k, &zeros], 0)?, Tensor::cat(&[v, &zeros], 0)?))
                })
                .collect::<Result<Vec<_>>>()?
        };
        self.pool = pool;
        // New ids go under the free ones (taken after them, lowest first).
        let mut ids: Vec<u32> = (self.blocks as u32..target as u32).rev().collect();
        ids.append(&mut self.free);
        self.free = ids;
        self.blocks = target;
        self.refs.resize(target, 0);
        Ok(())
    }

    /// Takes a free block (after [`DecodeBatch::reserve`]).
    fn take(&mut self) -> u32 {
        let block = self.free.pop().expect("blocks reserved");
        self.refs[block as usize] = 1;
        block
    }

    /// The pool row of token `i` of `slot`.
    fn pool_row(&self, slot: usize, i: usize) -> u32 {
        (self.tables[slot][i / BLOCK_TOKENS] as usize * BLOCK_TOKENS + i % BLOCK_TOKENS) as u32
    }
}

impl CausalLm {
    /// Puts new sequences into free (or released) slots and runs their prompts. Returns the
    /// logits of each prompt's last token, `(rows.len(), vocab)` f32, in the order of `rows`.
    /// A slot that still holds a sequence is released first. A prompt longer than the batch's
    /// prefill chunk ([`DecodeBatch::set_prefill_chunk`]) runs its first chunk here and the
    /// rest chunk by chunk through [`CausalLm::extend`], so the activations of one pass stay
    /// bounded (where the paged attention has a kernel; elsewhere in one pass). With a KV budget
    /// that cannot hold the prompts, [`ModelError::KvFull`] and nothing changes.
    pub fn prefill(&self, batch: &mut DecodeBatch, rows: &[(usize, &[u32])]) -> Result<Tensor> {
        if rows.is_empty() {
            return Err(ModelError::Config("prefill needs at least one row".into()));
        }
        let max_pos = self.config().max_position_embeddings;
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
            self.check_ids(prompt)?;
            if rows.iter().filter(|(s, _)| s == slot).count() > 1 {
                return Err(ModelError::Config(format!("slot {slot} listed twice")));
            }
        }
        // 1. Blocks for every prompt (the blocks of slots being replaced count as free).
        let needed: usize = rows
            .iter()
            .map(|(_, p)| DecodeBatch::blocks_for(p.len()))
            .sum();
        let returned: usize = rows
            .iter()
            .flat_map(|(s, _)| &batch.tables[*s])
            .filter(|&&b| batch.refs[b as usize] == 1)
            .count();
        if let Some(free) = batch.free_blocks() {
            if needed > free + returned {
                return Err(batch.full(needed));
            }
        }
        for (slot, _) in rows {
            if batch.active[*slot] {
                batch.release(*slot);
            }
        }
        // 2. Longer prompts: the first chunk now, the rest below.
        let cfg = self.config();
        let chunk = if super::paged::supported(self.device(), self.dtype(), cfg.head_dim()) {
            batch.prefill_chunk
        } else {
            usize::MAX
        };
        let heads: Vec<(usize, &[u32])> = rows
            .iter()
            .map(|&(slot, p)| (slot, &p[..p.len().min(chunk)]))
            .collect();
        let mut logits = self.prefill_heads(batch, &heads)?;
        for (i, &(slot, prompt)) in rows.iter().enumerate() {
            if prompt.len() <= chunk {
                continue;
            }
            let last = self.extend(batch, &[(slot, &prompt[chunk..])])?;
            logits = logits.slice_scatter0(&last, i)?;
        }
        Ok(logits)
    }

    /// Token ids outside the vocabulary are refused.
    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let vocab = self.config().vocab_size;
        match ids.iter().find(|&&id| id as usize >= vocab) {
            Some(&id) => Err(ModelError::BadTokenId { id, vocab }),
            None => Ok(()),
        }
    }

    /// [`CausalLm::prefill`] of prompts in one pass, their slots free and their blocks known to
    /// fit.
    fn prefill_heads(&self, batch: &mut DecodeBatch, rows: &[(usize, &[u32])]) -> Result<Tensor> {
        let needed: usize = rows
            .iter()
            .map(|(_, p)| DecodeBatch::blocks_for(p.len()))
            .sum();
        batch.reserve(needed, self)?;
        for (slot, prompt) in rows {
            let blocks = (0..DecodeBatch::blocks_for(prompt.len()))
                .map(|_| batch.take())
                .collect();
            batch.tables[*slot] = blocks;
            batch.lens[*slot] = prompt.len();
            batch.active[*slot] = true;
        }
        // Where each prompt token's key/value goes.
        let pool_rows: Vec<u32> = rows
            .iter()
            .flat_map(|(slot, p)| (0..p.len()).map(move |i| (*slot, i)))
            .map(|(slot, i)| batch.pool_row(slot, i))
            .collect();
        let cfg = self.config();
        let to = Tensor::from_vec(pool_rows, rows_tokens(rows), self.device())?;
        let to = super::paged::row_index(&to, cfg.num_kv_heads(), cfg.head_dim())?;
        // Run the prompts, each layer writing its keys/values into the slots' blocks.
        let last = if self.fused_attention() {
            self.prefill_packed(rows, &batch.pool, &to)?
        } else {
            self.prefill_padded(rows, &batch.pool, &to)?
        };
        self.lm_head(&last)
    }

    /// Appends tokens to sequences in flight, each query attending over its row's cache up to
    /// itself: the rest of a long prompt after its first chunk, or any continuation. Returns
    /// the logits after each row's last new token, `(rows.len(), vocab)` f32, in the order of
    /// `rows`. Every token is one row of the paged attention (a decode step is one token per
    /// slot). More tokens than the batch's prefill chunk run a row at a time, in chunks. With a
    /// KV budget that cannot hold the tokens, [`ModelError::KvFull`] and nothing changes.
    pub fn extend(&self, batch: &mut DecodeBatch, rows: &[(usize, &[u32])]) -> Result<Tensor> {
        if rows.is_empty() {
            return Err(ModelError::Config("extend needs at least one row".into()));
        }
        let max_pos = self.config().max_position_embeddings;
        for (slot, tokens) in rows {
            if !batch.is_active(*slot) {
                return Err(ModelError::Config(format!(
                    "extend: slot {slot} holds no sequence"
                )));
            }
            if tokens.is_empty() {
                return Err(ModelError::Config(format!(
                    "extend: no tokens for slot {slot}"
                )));
            }
            if batch.lens[*slot] + tokens.len() > max_pos {
                return Err(ModelError::TooLong {
                    len: batch.lens[*slot] + tokens.len(),
                    max: max_pos,
                });
            }
            self.check_ids(tokens)?;
            if rows.iter().filter(|(s, _)| s == slot).count() > 1 {
                return Err(ModelError::Config(format!("slot {slot} listed twice")));
            }
        }
        // 1. The blocks the new tokens fill.
        let more = |slot: usize, n: usize, batch: &DecodeBatch| {
            DecodeBatch::blocks_for(batch.lens[slot] + n) - batch.tables[slot].len()
        };
        let needed: usize = rows.iter().map(|(s, t)| more(*s, t.len(), batch)).sum();
        batch.reserve(needed, self)?;
        for (slot, tokens) in rows {
            for _ in 0..more(*slot, tokens.len(), batch) {
                let block = batch.take();
                batch.tables[*slot].push(block);
            }
        }
        // 2. Passes of at most a prefill chunk.
        let chunk = batch.prefill_chunk;
        if rows_tokens(rows) <= chunk {
            return self.extend_pass(batch, rows);
        }
        let mut last = Vec::with_capacity(rows.len());
        for &(slot, tokens) in rows {
            let mut out = None;
            for part in tokens.chunks(chunk) {
                out = Some(self.extend_pass(batch, &[(slot, part)])?);
            }
            last.push(out.expect("a row has tokens"));
        }
        Ok(Tensor::cat(&last, 0)?)
    }

    /// One pass of [`CausalLm::extend`], the rows' blocks already taken.
    fn extend_pass(&self, batch: &mut DecodeBatch, rows: &[(usize, &[u32])]) -> Result<Tensor> {
        // One paged-attention row per token: its id, position, pool row, and the keys it reads
        // (its row's, up to itself).
        let total = rows_tokens(rows);
        let (mut ids, mut pos, mut to) = (
            Vec::with_capacity(total),
            Vec::with_capacity(total),
            Vec::with_capacity(total),
        );
        let mut reads = Vec::with_capacity(total);
        let mut last = Vec::with_capacity(rows.len());
        for (slot, tokens) in rows {
            let start = batch.lens[*slot];
            for (i, &t) in tokens.iter().enumerate() {
                ids.push(t);
                pos.push((start + i) as u32);
                to.push(batch.pool_row(*slot, start + i));
                reads.push((batch.tables[*slot].as_slice(), start + i + 1));
            }
            last.push(ids.len() as u32 - 1);
        }
        let table = PageTable::new(&reads).map_err(ModelError::Config)?;
        let hidden = self.run_paged(batch, ids, pos, to, table)?;
        for (slot, tokens) in rows {
            batch.lens[*slot] += tokens.len();
        }
        let n = last.len();
        let last = Tensor::from_vec(last, n, self.device())?;
        self.lm_head(&hidden.index_select(&last, 0)?)
    }

    /// Runs `ids` (one token per paged-attention row, at positions `pos`) through the stack,
    /// each layer writing the tokens' keys/values to pool rows `to` and attending over the rows
    /// `table` lists. Returns the hidden states, `(ids.len(), hidden)`.
    fn run_paged(
        &self,
        batch: &DecodeBatch,
        ids: Vec<u32>,
        pos: Vec<u32>,
        to: Vec<u32>,
        table: PageTable,
    ) -> Result<Tensor> {
        let dev = self.device();
        let cfg = self.config();
        let n = ids.len();
        let scale = 1.0 / (cfg.head_dim() as f32).sqrt();
        let attention = PagedAttention::new(Arc::new(table), scale);
        let ids = Tensor::from_vec(ids, (n, 1), dev)?;
        let positions = Tensor::from_vec(pos, (n, 1), dev)?;
        let rows = Tensor::from_vec(to, n, dev)?;
        let rows = super::paged::row_index(&rows, cfg.num_kv_heads(), cfg.head_dim())?;
        let hidden = self.run_layers_masked(
            &ids,
            &positions,
            &AttnMask::Paged,
            OpsMode::Infer,
            KvMode::Paged {
                pools: &batch.pool,
                rows: &rows,
                attention: &attention,
            },
        )?;
        Ok(hidden.squeeze(1)?)
    }

    /// The prompts packed into one row of segments, through the fused attention (no padding,
    /// no `t × t` mask), their keys/values written to pool rows `to`. Returns the last token's
    /// hidden state of each prompt, `(n, hidden)`.
    fn prefill_packed(
        &self,
        rows: &[(usize, &[u32])],
        pools: &[(Tensor, Tensor)],
        to: &Tensor,
    ) -> Result<Tensor> {
        let total: usize = rows.iter().map(|(_, p)| p.len()).sum();
        let mut ids = Vec::with_capacity(total);
        let mut pos = Vec::with_capacity(total);
        let mut segments = Vec::with_capacity(rows.len());
        let mut last = Vec::with_capacity(rows.len());
        for (_, prompt) in rows {
            let start = ids.len();
            ids.extend_from_slice(prompt);
            pos.extend(0..prompt.len() as u32);
            segments.push((start, ids.len()));
            last.push(ids.len() as u32 - 1);
        }
        let segments = Segments::new(total, vec![segments]).map_err(candle_core::Error::wrap)?;
        let dev = self.device();
        let ids = Tensor::from_vec(ids, (1, total), dev)?;
        let pos = Tensor::from_vec(pos, (1, total), dev)?;
        let mask = AttnMask::Segments(&Arc::new(segments));
        let hidden = self.run_layers_masked(
            &ids,
            &pos,
            &mask,
            OpsMode::Infer,
            KvMode::OwnAndWrite {
                pools,
                take: None,
                rows: to,
            },
        )?;
        let n = last.len();
        let last = Tensor::from_vec(last, n, dev)?;
        Ok(hidden.squeeze(0)?.index_select(&last, 0)?)
    }

    /// The prompts left-padded to the longest, through the unfused attention with a dense
    /// mask (where the fused op has no kernel); the real tokens' keys/values written to pool
    /// rows `to`. Returns the last token's hidden state of each prompt, `(n, hidden)`.
    fn prefill_padded(
        &self,
        rows: &[(usize, &[u32])],
        pools: &[(Tensor, Tensor)],
        to: &Tensor,
    ) -> Result<Tensor> {
        let n = rows.len();
        let width = rows.iter().map(|(_, p)| p.len()).max().unwrap_or(0);
        let mut ids = vec![0u32; n * width];
        let mut mask = vec![0u8; n * width];
        let mut take = Vec::with_capacity(rows_tokens(rows));
        for (r, (_, prompt)) in rows.iter().enumerate() {
            let off = r * width + width - prompt.len();
            ids[off..off + prompt.len()].copy_from_slice(prompt);
            mask[off..off + prompt.len()].fill(1);
            take.extend(off as u32..(off + prompt.len()) as u32);
        }
        let dev = self.device();
        let ids = Tensor::from_vec(ids, (n, width), dev)?;
        let mask = Tensor::from_vec(mask, (n, width), dev)?;
        let (positions, bias) = full_sequence_layout(&ids, Some(&mask), dev)?;
        let take = Tensor::from_vec(take, to.dim(0)?, dev)?;
        let hidden = self.run_layers(
            &ids,
            &positions,
            &bias,
            OpsMode::Infer,
            KvMode::OwnAndWrite {
                pools,
                take: Some(&take),
                rows: to,
            },
        )?;
        Ok(hidden.narrow(1, width - 1, 1)?.squeeze(1)?) // (n, hidden)
    }

    /// Feeds one token to every active slot and returns the next-token logits,
    /// `(tokens.len(), vocab)` f32, in the order of `tokens`. Every active slot must be listed
    /// exactly once (a slot that should stop is released first). With a KV budget whose free
    /// blocks do not cover [`DecodeBatch::blocks_for_step`], [`ModelError::KvFull`] and
    /// nothing changes.
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
            self.check_ids(&[tok])?;
            if batch.lens[slot] >= max_pos {
                return Err(ModelError::TooLong {
                    len: batch.lens[slot] + 1,
                    max: max_pos,
                });
            }
        }
        // 1. A new block for every slot whose last one is full.
        let slots: Vec<usize> = tokens.iter().map(|(s, _)| *s).collect();
        let needed = batch.blocks_for_step(&slots);
        batch.reserve(needed, self)?;
        for &slot in &slots {
            if batch.lens[slot] == batch.tables[slot].len() * BLOCK_TOKENS {
                let block = batch.take();
                batch.tables[slot].push(block);
            }
        }
        // 2. Inputs, where each token's key/value goes, and what each row reads (itself
        //    included).
        let ids: Vec<u32> = tokens.iter().map(|(_, t)| *t).collect();
        let pos: Vec<u32> = slots.iter().map(|&s| batch.lens[s] as u32).collect();
        let to: Vec<u32> = slots
            .iter()
            .map(|&s| batch.pool_row(s, batch.lens[s]))
            .collect();
        let table: Vec<(&[u32], usize)> = slots
            .iter()
            .map(|&s| (batch.tables[s].as_slice(), batch.lens[s] + 1))
            .collect();
        let table = PageTable::new(&table).map_err(ModelError::Config)?;
        // 3. One step through the stack.
        let hidden = self.run_paged(batch, ids, pos, to, table)?;
        for &slot in &slots {
            batch.lens[slot] += 1;
        }
        self.lm_head(&hidden)
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
/// Tokens of all prompts of a prefill.
fn rows_tokens(rows: &[(usize, &[u32])]) -> usize {
    rows.iter().map(|(_, p)| p.len()).sum()
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
