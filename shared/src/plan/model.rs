//! Bytes of what the learner and the actors keep alive, counted from the code that allocates
//! them (`shared/src/model/{causal_lm,layers,decode}.rs`, `learner/src/optim.rs`).

use crate::model::ModelConfig;

use super::Item;

/// Which training-forward path the learner takes on its device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivationModel {
    /// The fused attention keeps no `t × t` tensor; the unfused one keeps the scores and the
    /// probabilities of every layer.
    pub fused_attention: bool,
    /// `learner.activation_checkpointing`: every k-th layer (0, k, 2k, ...) keeps only its
    /// input and is recomputed in backward; 0 = off.
    pub checkpoint_every: usize,
    /// The fused RMSNorm, rotary and SwiGLU kernels (`shared/src/model/fused.rs`: f32 on the
    /// CPU) keep only their outputs.
    pub fused_ops: bool,
    /// The SFT loss through `CausalLm::token_logprob_sum` on the fused path (f32 on the CPU):
    /// the LM head's gradients are computed in the forward's pass over each chunk of logits,
    /// whose buffer becomes their gradient in place (`fused::logprobs_into_grad`: one f32 copy,
    /// not three), and the hidden states' f32 gradient is kept from forward to backward.
    pub fused_loss: bool,
}

/// The byte arithmetic of one architecture at one in-memory dtype.
#[derive(Debug, Clone)]
pub struct MemoryModel {
    params: u64,
    b: u64,
    h: u64,
    q: u64,
    kv: u64,
    heads: u64,
    inter: u64,
    vocab: u64,
    layers: u64,
    head_dim: u64,
    qk_norm: bool,
    max_len: usize,
}

impl MemoryModel {
    /// The model `cfg` held in a dtype of `dtype_bytes` bytes per element.
    pub fn new(cfg: &ModelConfig, dtype_bytes: u64) -> MemoryModel {
        let hd = cfg.head_dim() as u64;
        MemoryModel {
            params: cfg.num_parameters() as u64,
            b: dtype_bytes,
            h: cfg.hidden_size as u64,
            q: cfg.num_attention_heads as u64 * hd,
            kv: cfg.num_kv_heads() as u64 * hd,
            heads: cfg.num_attention_heads as u64,
            inter: cfg.intermediate_size as u64,
            vocab: cfg.vocab_size as u64,
            layers: cfg.num_hidden_layers as u64,
            head_dim: hd,
            qk_norm: cfg.qk_norm(),
            max_len: cfg.max_position_embeddings,
        }
    }

    /// The optimizer update's own transient memory: AdamW (one process) updates one tensor at a
    /// time through tensor operations, with up to 6 f32 temporaries of that tensor alive
    /// (measured 5.6 with `learner/examples/sft_step_memory.rs`); a group's sharded update runs
    /// in place and only builds each updated tensor once. The largest tensor is the embedding
    /// (or the LM head), `vocab × hidden`, or an MLP projection.
    pub fn optimizer_step_transient(&self, world: u64) -> u64 {
        let largest = (self.vocab * self.h).max(self.inter * self.h);
        let copies = if world > 1 { 1 } else { 6 };
        copies * 4 * largest
    }

    /// The longest sequence the model takes (`max_position_embeddings`): no row is longer.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// `bf16`, `f16`-sized or `f32`.
    pub fn dtype_name(&self) -> &'static str {
        if self.b == 4 {
            "f32"
        } else {
            "bf16"
        }
    }

    /// The weights, once.
    pub fn weights(&self) -> u64 {
        self.params * self.b
    }

    /// What the learner holds whatever the stage (`AdamW` in `learner/src/optim.rs`): the model's
    /// weights, an f32 master copy when the model is not f32, the f32 moments `m` and `v`, the
    /// gradient accumulator (`accum_bytes` per element: 8 for `learner.grad_accum = "f64"`, 4
    /// for `"f32"`), and one micro-batch's gradients in the model's dtype while they are added
    /// to it.
    pub fn learner_state(&self, world: u64, accum_bytes: u64) -> Vec<Item> {
        let p = self.params;
        // With several ranks each keeps the master and moments of its 1/world shard only.
        let world = world.max(1);
        let shard = p.div_ceil(world);
        let of = if world > 1 {
            format!(", this rank's 1/{world} shard")
        } else {
            String::new()
        };
        let mut items = vec![Item {
            what: format!("weights ({}, {p} parameters)", self.dtype_name()),
            bytes: self.weights(),
        }];
        // One process keeps an f32 parameter as its own master; a rank of a group keeps the
        // f32 master of its shard whatever the dtype (`cascade_learner::zero`).
        if self.b != 4 || world > 1 {
            items.push(Item {
                what: format!("f32 master weights{of}"),
                bytes: 4 * shard,
            });
        }
        items.push(Item {
            what: format!("Adam moments (f32 m and v{of})"),
            bytes: 8 * shard,
        });
        // In a group each micro-batch's gradients are reduce-scattered at once (ZeRO-2): the
        // sum is kept for the rank's shard only.
        let accum = if accum_bytes == 8 { "f64" } else { "f32" };
        items.push(Item {
            what: format!("gradient accumulator ({accum}{of})"),
            bytes: accum_bytes * shard,
        });
        items.push(Item {
            what: format!("one micro-batch's gradients ({})", self.dtype_name()),
            bytes: self.weights(),
        });
        items
    }

    /// Bytes an RMSNorm over `n` features keeps per token in training mode: the f32 copy of its
    /// input (when the model is not f32), the squares, the normalised f32 values, their cast back
    /// and the scaled output.
    fn norm(&self, n: u64) -> u64 {
        let cast = if self.b != 4 { 4 + self.b } else { 0 };
        n * (4 + 4 + self.b + cast)
    }

    /// Bytes an RMSNorm over `n` features keeps per token: with the fused kernel its output
    /// only.
    fn norm_kept(&self, n: u64, fused: bool) -> u64 {
        if fused {
            self.b * n
        } else {
            self.norm(n)
        }
    }

    /// Bytes the attention block of a decoder layer keeps per token for backward, without the
    /// attention scores: the input norm, the q/k/v projections, the q/k norms (Qwen3), the
    /// head-major copies and rotary halves with their concatenation (fused: the rotated q/k and
    /// v's head-major copy), the attention output and its token-major copy (plus the log-sum-exp
    /// of the fused op), the output projection and the residual.
    pub fn attention_block_bytes(&self, fused: bool) -> u64 {
        let (b, h, q, kv) = (self.b, self.h, self.q, self.kv);
        let qk_norm = if self.qk_norm {
            self.norm_kept(q, fused) + self.norm_kept(kv, fused)
        } else {
            0
        };
        let rotary = if fused {
            b * (q + kv) + b * kv
        } else {
            b * (q + 2 * kv) + 4 * b * (q + kv)
        };
        self.norm_kept(h, fused)
            + b * (q + 2 * kv) // projections
            + qk_norm
            + rotary
            + 2 * b * q + 4 * self.heads // attention output, its copy, log-sum-exp
            + 2 * b * h // o_proj, residual
    }

    /// Bytes the MLP block keeps per token: the post-attention norm, the gate, SiLU (not with
    /// the fused SwiGLU), up and their product, the down projection and the residual.
    pub fn mlp_block_bytes(&self, fused: bool) -> u64 {
        let act = if fused { 3 } else { 4 };
        self.norm_kept(self.h, fused) + 2 * self.b * self.h + act * self.b * self.inter
    }

    /// Bytes one decoder layer keeps per token for backward: its two blocks.
    pub fn layer_bytes_per_token(&self, fused: bool) -> u64 {
        self.attention_block_bytes(fused) + self.mlp_block_bytes(fused)
    }

    /// Bytes per `(query, key)` pair of one layer's unfused attention, kept for backward: the
    /// scores, scaled, in f32, with the mask added, shifted, exponentiated, normalised, and cast
    /// back, over all heads.
    fn unfused_pair_bytes(&self) -> u64 {
        let cast = if self.b != 4 { 4 + self.b } else { 0 };
        self.heads * (2 * self.b + 4 * 4 + cast)
    }

    /// Activations of one training micro-batch of `rows` rows of `tokens` tokens.
    ///
    /// A checkpointed layer keeps the inputs of its two blocks (attention, MLP; the first
    /// layer's input is the embedding output); the others everything
    /// [`MemoryModel::layer_bytes_per_token`] counts. In backward one block at a time is
    /// recomputed with its graph and its gradients are in flight: the larger block's
    /// activations twice (without checkpointing, one layer's). The LM head and log-probs run a
    /// chunk of 2^24 logits at a time (`shared/src/model/recompute.rs`): per token only the
    /// hidden state's copy, the log-prob and the log-sum-exp are kept; the chunk's f32
    /// temporaries (logits, shifted, exponentiated; fused loss: logits and their gradient) live
    /// in the forward and at the start of backward, before the other parameters' gradients
    /// exist: only what they add beyond those gradients is counted (for a large model,
    /// nothing).
    pub fn training_activations(
        &self,
        rows: usize,
        tokens: usize,
        act: ActivationModel,
    ) -> Vec<Item> {
        let (rows, t) = (rows as u64, tokens.min(self.max_len) as u64);
        let n = rows * t;
        let checkpointed = match act.checkpoint_every {
            0 => 0,
            k => self.layers.div_ceil(k as u64),
        };
        let full = self.layers - checkpointed;
        let layer = self.layer_bytes_per_token(act.fused_ops);
        let in_flight = if checkpointed > 0 {
            self.attention_block_bytes(act.fused_ops)
                .max(self.mlp_block_bytes(act.fused_ops))
        } else {
            layer
        };
        let mut items = vec![Item {
            what: format!(
                "activations: {full} layers kept whole, {checkpointed} checkpointed, × {rows} × {t} tokens"
            ),
            bytes: n
                * (full * layer
                    + checkpointed * 2 * self.b * self.h // the inputs of its two blocks
                    + self.b * self.h // embedding output
                    + self.norm_kept(self.h, act.fused_ops) // final norm
                    + self.b * self.head_dim), // rotary tables
        }];
        if !act.fused_attention {
            items.push(Item {
                what: format!(
                    "activations: unfused attention scores, {} layers × {rows} × {t}² pairs",
                    self.layers
                ),
                bytes: rows * t * t * (self.layers * self.unfused_pair_bytes() + 4),
            });
        }
        // A chunk holds min(n, 2^24 / vocab) positions × the vocabulary
        // (`crate::model::recompute::logits_chunk_rows`).
        let chunk_rows = ((1u64 << 24) / self.vocab.max(1)).max(1).min(n);
        let dh = if act.fused_loss { 4 * self.h } else { 0 };
        items.push(Item {
            what: format!("activations: LM head and log-probs, {rows} × {t} tokens"),
            bytes: n * (self.b * self.h + dh + 8),
        });
        let copies = if act.fused_loss { 1 } else { 3 };
        let other_grads = (self.params - self.vocab * self.h) * self.b;
        let chunk = (copies * 4 * chunk_rows * self.vocab).saturating_sub(other_grads);
        if chunk > 0 {
            items.push(Item {
                what: "LM head chunk of ≤ 2^24 logits: its temporaries beyond the other \
                       parameters' gradients (freed before them)"
                    .into(),
                bytes: chunk,
            });
        }
        items.push(Item {
            what: if checkpointed > 0 {
                "activations: backward, one block recomputed and its gradients in flight".into()
            } else {
                "activations: backward, one layer's gradients in flight".into()
            },
            bytes: 2 * n * in_flight,
        });
        items
    }

    /// What one actor's decoding adds to its weights: its paged KV cache of `kv_tokens` tokens
    /// (whole blocks, allocated in full: `shared/src/model/decode.rs`), the prefill of as many
    /// of its `slots` prompts of `prompt` tokens as [`crate::model::PREFILL_TOKENS`] holds (at
    /// least one; or one preempted row of `row` tokens, prompt and response, when the cache
    /// cannot hold every row at its longest), and the logits of a step of `slots` rows. With
    /// the fused attention (`packed`) the prompts run packed into one row and a layer's
    /// transients are linear in their tokens (the larger of the attention and MLP blocks'
    /// per-token bytes, one layer at a time); a row longer than `PREFILL_TOKENS` runs in chunks
    /// of that many tokens, each chunk's queries over the paged cache, whose block table lists
    /// the row's blocks once per query (4 bytes each). Without the fused attention the prompts
    /// run left-padded in one pass through the unfused attention (scores, their f32 copy with
    /// the mask, the probabilities and their cast, plus the mask). Each layer writes its keys
    /// and values straight into the cache.
    pub fn decode(
        &self,
        slots: usize,
        kv_tokens: usize,
        (prompt, row): (usize, usize),
        packed: bool,
    ) -> Vec<Item> {
        let block = crate::model::paged::BLOCK_TOKENS as u64;
        let prompt = prompt.min(self.max_len);
        let row = row.min(self.max_len);
        // Rows per prefill call: as many prompts as PREFILL_TOKENS holds, at least one.
        let per_call = (crate::model::PREFILL_TOKENS / prompt.max(1)).clamp(1, slots.max(1));
        let (mut s, mut p) = (per_call as u64, prompt as u64);
        // A cache smaller than every row at its longest can preempt a row, whose prompt and
        // response are later prefilled again in one call.
        if kv_tokens < slots * row && row > per_call * prompt {
            (s, p) = (1, row as u64);
        }
        let per_token_kv = self.layers * 2 * self.kv * self.b;
        let cached = (kv_tokens as u64).div_ceil(block) * block;
        let cast = if self.b != 4 { 4 + self.b } else { 0 };
        let chunk = crate::model::PREFILL_TOKENS as u64;
        let per_token = self
            .attention_block_bytes(false)
            .max(self.mlp_block_bytes(false));
        let prefill = if packed && p > chunk {
            Item {
                what: format!(
                    "prefill of 1 row × {p} tokens in chunks of {chunk} (one layer at a time), \
                     with a block table of {chunk} queries × {} blocks",
                    p.div_ceil(block)
                ),
                bytes: chunk * per_token + chunk * p.div_ceil(block) * 4,
            }
        } else if packed {
            Item {
                what: format!(
                    "prefill of {s} prompts × {p} tokens packed (fused attention, one layer at a \
                     time)"
                ),
                bytes: s * p * per_token,
            }
        } else {
            Item {
                what: format!(
                    "prefill of {s} prompts × {p}² attention pairs (one layer at a time)"
                ),
                bytes: s * p * p * (self.heads * (2 * self.b + 4 + cast) + 4),
            }
        };
        vec![
            Item {
                what: format!(
                    "KV cache: {cached} tokens (actor.kv_cache_tokens; {slots} rows) × {} per \
                     token",
                    super::format_bytes(per_token_kv)
                ),
                bytes: cached * per_token_kv,
            },
            prefill,
            Item {
                what: format!(
                    "logits: {slots} rows × {} vocabulary (f32, twice)",
                    self.vocab
                ),
                bytes: slots as u64 * self.vocab * 8,
            },
        ]
    }
}
