//! The decoder-only language model shared by Qwen3, Qwen2 and Llama.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::{DType, Device, Module, Tensor};

use super::config::parameter_shapes;
use super::config::ModelConfig;
use super::flash_attn::{flash_attn, Segments};
use super::layers::{apply_rotary, softmax_last, Linear, Mlp, OpsMode, RmsNorm, Rotary};
use super::paged::{self, PagedAttention};
use super::recompute::{
    checkpoint_layer, chunked_logprob_sum, chunked_logprobs, logits_chunk_rows, Recomputable,
};
use super::{ModelError, Result};

/// How the full-sequence (training) forward computes attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionImpl {
    /// The fused causal attention op ([`super::flash_attn`]): never materialises the `t × t`
    /// scores, masks by segments. Used where it has a kernel (the CPU, f32/bf16/f16; CUDA
    /// builds, f32/bf16 with head_dim ≤ 128: [`super::flash_attn::supported`]) and the mask is
    /// expressible as segments; elsewhere the unfused path runs.
    #[default]
    Fused,
    /// Scores, a dense `t × t` additive mask and a softmax as separate candle ops (the
    /// reference the fused op is checked against; the path where no kernel exists).
    Unfused,
}

/// The attention mask of a forward pass.
#[derive(Clone, Copy)]
pub(crate) enum AttnMask<'a> {
    /// `(b, 1, s, keys)` additive bias (0 or -inf).
    Dense(&'a Tensor),
    /// Segments of the fused op (full-sequence forward only: keys are the queries).
    Segments(&'a Arc<Segments>),
    /// No mask: the keys each query sees are listed by [`KvMode::Paged`] (a decode step).
    Paged,
}

/// Where a layer finds and stores keys/values during a forward pass.
pub(crate) enum KvMode<'a> {
    /// Attend over this call's own keys/values only (full-sequence forward).
    Own,
    /// Attend over this call's keys/values and copy them into the per-layer paged pools
    /// `(pool_rows, kv_heads, hd)` (the prefill of a decode batch): of the `(b * s)` tokens,
    /// those `take` lists (all when `None`) go to the pool rows of `rows`
    /// ([`paged::row_index`]), in order.
    OwnAndWrite {
        pools: &'a [(Tensor, Tensor)],
        take: Option<&'a Tensor>,
        rows: &'a Tensor,
    },
    /// One decode step (one query per batch row): write each row's key/value into the
    /// per-layer paged pools `(pool_rows, kv_heads, hd)` at its pool row (`rows`,
    /// [`paged::row_index`]), then attend over the pool rows the op's table lists.
    Paged {
        pools: &'a [(Tensor, Tensor)],
        rows: &'a Tensor,
        attention: &'a PagedAttention,
    },
}

#[derive(Debug, Clone)]
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    n_heads: usize,
    n_kv: usize,
    head_dim: usize,
}

impl Attention {
    fn detached(&self) -> Attention {
        Attention {
            q: self.q.detached(),
            k: self.k.detached(),
            v: self.v.detached(),
            o: self.o.detached(),
            q_norm: self.q_norm.as_ref().map(RmsNorm::detached),
            k_norm: self.k_norm.as_ref().map(RmsNorm::detached),
            ..*self
        }
    }

    fn push_params(&self, out: &mut Vec<Tensor>) {
        for l in [&self.q, &self.k, &self.v, &self.o] {
            l.push_params(out);
        }
        for n in [&self.q_norm, &self.k_norm].into_iter().flatten() {
            n.push_params(out);
        }
    }

    /// `x`: `(b, s, hidden)`; `mask`: a `(b, 1, s, keys)` additive bias (0 or -inf) or the
    /// segments of the fused op.
    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &AttnMask<'_>,
        mode: OpsMode,
        kv: (&mut KvMode<'_>, usize),
    ) -> Result<Tensor> {
        let (b, s, _) = x.dims3()?;
        let (hd, nh, nkv) = (self.head_dim, self.n_heads, self.n_kv);
        // 1. Projections: (b, s, heads, hd).
        let q = self.q.forward(x)?.reshape((b, s, nh, hd))?;
        let k = self.k.forward(x)?.reshape((b, s, nkv, hd))?;
        let v = self.v.forward(x)?.reshape((b, s, nkv, hd))?;
        // 2. Per-head q/k RMSNorm (Qwen3).
        let q = match &self.q_norm {
            Some(n) => n.forward(&q, mode)?,
            None => q,
        };
        let k = match &self.k_norm {
            Some(n) => n.forward(&k, mode)?,
            None => k,
        };
        // 3. (b, heads, s, hd) and rotary.
        let rotate = |x: Tensor| -> Result<Tensor> {
            if super::fused::applies(&[&x, cos, sin]) {
                return Ok(super::fused::rotary_heads_first(&x, cos, sin)?);
            }
            apply_rotary(&x.transpose(1, 2)?.contiguous()?, cos, sin)
        };
        let (q, k) = (rotate(q)?, rotate(k)?);
        let v = v.transpose(1, 2)?.contiguous()?;
        // 4. The keys/values attended over: (b, n_kv, keys, hd).
        let (layer_kv, layer) = kv;
        let (k_all, v_all) = match layer_kv {
            KvMode::Own => (k, v),
            KvMode::OwnAndWrite { pools, take, rows } => {
                let (kp, vp) = &pools[layer];
                for (src, pool) in [(&k, kp), (&v, vp)] {
                    // (b, n_kv, s, hd) -> (b * s, n_kv, hd), the listed tokens only.
                    let src = src.transpose(1, 2)?.reshape((b * s, nkv, hd))?;
                    let src = match take {
                        Some(take) => src.index_select(take, 0)?,
                        None => src,
                    };
                    paged::write_rows(pool, &src, rows)?;
                }
                (k, v)
            }
            KvMode::Paged {
                pools,
                rows,
                attention,
            } => {
                if s != 1 {
                    return Err(ModelError::Config(format!(
                        "a paged decode step takes one token per row, not {s}"
                    )));
                }
                // 4'. Paged: this token's k/v into the pools, then its query against the
                //     row's cached keys, (b, heads, hd).
                let (kp, vp) = &pools[layer];
                paged::write_rows(kp, &k.reshape((b, nkv, hd))?, rows)?;
                paged::write_rows(vp, &v.reshape((b, nkv, hd))?, rows)?;
                let out = paged::attend(&q.reshape((b, nh, hd))?, kp, vp, attention)?;
                return Ok(self.o.forward(&out.reshape((b, 1, nh * hd))?)?);
            }
        };
        let keys = k_all.dim(2)?;
        let bias = match mask {
            AttnMask::Dense(bias) => *bias,
            AttnMask::Paged => {
                return Err(ModelError::Config(
                    "a paged mask without the paged cache".into(),
                ))
            }
            AttnMask::Segments(segments) => {
                if keys != s {
                    return Err(ModelError::Config(format!(
                        "fused attention over {keys} cached keys for {s} queries"
                    )));
                }
                // 5'. Fused: (b, heads, s, hd), GQA read in place, no (s, keys) tensor.
                let out = flash_attn(&q, &k_all, &v_all, segments, None)?;
                let out = out.transpose(1, 2)?.reshape((b, s, nh * hd))?;
                return Ok(self.o.forward(&out)?);
            }
        };
        // 5. Grouped-query attention without copying k/v per query head: the `rep` query heads
        //    of a kv group become extra rows, (b, n_kv, rep * s, hd).
        let rep = nh / nkv;
        let qg = q.reshape((b, nkv, rep * s, hd))?;
        let scale = 1.0 / (hd as f64).sqrt();
        let scores = (qg.matmul(&k_all.t()?)? * scale)?; // (b, n_kv, rep * s, keys)
        let scores = scores
            .to_dtype(DType::F32)?
            .reshape((b, nkv, rep, s, keys))?
            .broadcast_add(&bias.unsqueeze(1)?)?; // bias (b, 1, 1, s, keys)
        let probs = softmax_last(&scores, mode)?
            .to_dtype(v_all.dtype())?
            .reshape((b, nkv, rep * s, keys))?;
        let out = probs.matmul(&v_all)?; // (b, n_kv, rep * s, hd)
                                         // 6. Back to (b, s, heads * hd) and the output projection.
        let out = out
            .reshape((b, nh, s, hd))?
            .transpose(1, 2)?
            .reshape((b, s, nh * hd))?;
        Ok(self.o.forward(&out)?)
    }
}

#[derive(Debug, Clone)]
struct DecoderLayer {
    input_norm: RmsNorm,
    attn: Attention,
    post_norm: RmsNorm,
    mlp: Mlp,
}

impl DecoderLayer {
    /// Pre-norm residual block: `x + attn(norm(x))`, then `+ mlp(norm(·))`.
    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &AttnMask<'_>,
        mode: OpsMode,
        kv: (&mut KvMode<'_>, usize),
    ) -> Result<Tensor> {
        let x = self.attention_block(x, cos, sin, mask, mode, kv)?;
        self.mlp_block(&x, mode)
    }

    /// `x + attn(norm(x))`.
    fn attention_block(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &AttnMask<'_>,
        mode: OpsMode,
        kv: (&mut KvMode<'_>, usize),
    ) -> Result<Tensor> {
        let h = self.input_norm.forward(x, mode)?;
        Ok((x + self.attn.forward(&h, cos, sin, mask, mode, kv)?)?)
    }

    /// `x + mlp(norm(x))`.
    fn mlp_block(&self, x: &Tensor, mode: OpsMode) -> Result<Tensor> {
        let h = self.post_norm.forward(x, mode)?;
        Ok((x + self.mlp.forward(&h)?)?)
    }
}

/// The half of a decoder layer a checkpoint covers.
#[derive(Clone, Copy)]
enum Block {
    /// The attention residual block.
    Attention,
    /// The MLP residual block.
    Mlp,
}

/// The owned mask of a checkpointed layer.
#[derive(Clone)]
enum OwnedMask {
    Dense(Tensor),
    Segments(Arc<Segments>),
}

/// One block of a decoder layer with what its full-sequence forward needs, recomputed in
/// backward. A checkpointed layer is two of them (attention, then MLP), each keeping only its
/// input, so that backward has one block's activations and gradients in flight at a time
/// instead of the whole layer's.
#[derive(Clone)]
struct CheckpointedLayer {
    layer: DecoderLayer,
    block: Block,
    cos: Tensor,
    sin: Tensor,
    mask: OwnedMask,
}

impl Recomputable for CheckpointedLayer {
    fn run(&self, x: &Tensor) -> Result<Tensor> {
        let mask = match &self.mask {
            OwnedMask::Dense(bias) => AttnMask::Dense(bias),
            OwnedMask::Segments(s) => AttnMask::Segments(s),
        };
        match self.block {
            Block::Attention => self.layer.attention_block(
                x,
                &self.cos,
                &self.sin,
                &mask,
                OpsMode::Train,
                (&mut KvMode::Own, 0),
            ),
            Block::Mlp => self.layer.mlp_block(x, OpsMode::Train),
        }
    }

    fn detached(&self) -> Self {
        CheckpointedLayer {
            layer: DecoderLayer {
                input_norm: self.layer.input_norm.detached(),
                attn: self.layer.attn.detached(),
                post_norm: self.layer.post_norm.detached(),
                mlp: self.layer.mlp.detached(),
            },
            ..self.clone()
        }
    }

    fn params(&self) -> Vec<Tensor> {
        let mut out = Vec::new();
        match self.block {
            Block::Attention => {
                self.layer.input_norm.push_params(&mut out);
                self.layer.attn.push_params(&mut out);
            }
            Block::Mlp => {
                self.layer.post_norm.push_params(&mut out);
                self.layer.mlp.push_params(&mut out);
            }
        }
        out
    }
}

/// A Qwen3 / Qwen2 / Llama causal language model.
///
/// Built from named tensors in the Hugging Face layout; when those tensors are
/// [`candle_core::Var`]s (see [`CausalLm::new`] with a `VarMap`-backed `VarBuilder`), the
/// full-sequence paths are differentiable with respect to every parameter.
#[derive(Debug, Clone)]
pub struct CausalLm {
    cfg: ModelConfig,
    embed: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Tensor,
    rotary: Rotary,
    dtype: DType,
    device: Device,
    attention: AttentionImpl,
    /// Checkpoint every this many decoder layers in a differentiable forward (0 = off).
    checkpoint_every: usize,
    /// Positions per chunk of the LM head's log-probs (`None`: 64 MiB of f32 logits).
    logits_chunk_rows: Option<usize>,
}

impl CausalLm {
    /// Builds the model the candle-transformers way, fetching every parameter from `vb` by its
    /// checkpoint name (`vb.pp("model.layers")`-style paths).
    pub fn new(cfg: &ModelConfig, vb: candle_nn::VarBuilder) -> Result<CausalLm> {
        let mut get = |name: &str, shape: &[usize]| -> Result<Tensor> {
            vb.get(shape.to_vec(), name).map_err(|e| ModelError::Load {
                name: name.to_string(),
                message: e.to_string(),
            })
        };
        Self::build(cfg, vb.dtype(), vb.device().clone(), &mut get)
    }

    /// Builds the model from a map of named tensors (already on the target device and dtype).
    pub fn from_tensors(cfg: &ModelConfig, tensors: &HashMap<String, Tensor>) -> Result<CausalLm> {
        let first =
            tensors
                .get("model.embed_tokens.weight")
                .ok_or_else(|| ModelError::MissingTensor {
                    path: "<in memory>".into(),
                    name: "model.embed_tokens.weight".into(),
                })?;
        let (dtype, device) = (first.dtype(), first.device().clone());
        super::weights::check_tensors(cfg, tensors)?;
        let mut get =
            |name: &str, _shape: &[usize]| -> Result<Tensor> { Ok(tensors[name].clone()) };
        Self::build(cfg, dtype, device, &mut get)
    }

    fn build(
        cfg: &ModelConfig,
        dtype: DType,
        device: Device,
        get: &mut dyn FnMut(&str, &[usize]) -> Result<Tensor>,
    ) -> Result<CausalLm> {
        cfg.validate()?;
        match dtype {
            DType::F32 | DType::BF16 | DType::F16 => {}
            other => {
                return Err(ModelError::Config(format!(
                    "compute dtype {other:?} is not supported (f32, bf16, f16)"
                )))
            }
        }
        let shapes: HashMap<String, Vec<usize>> = parameter_shapes(cfg).into_iter().collect();
        let mut fetch = |name: String| -> Result<Tensor> {
            let shape = shapes.get(&name).expect("parameter list and model agree");
            get(&name, shape)
        };
        let eps = cfg.rms_norm_eps;
        let opt =
            |present: bool, f: &mut dyn FnMut() -> Result<Tensor>| -> Result<Option<Tensor>> {
                if present {
                    f().map(Some)
                } else {
                    Ok(None)
                }
            };
        let embed = fetch("model.embed_tokens.weight".into())?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let mut lin = |name: &str, bias: bool| -> Result<Linear> {
                let w = fetch(format!("{p}.{name}.weight"))?;
                let b = opt(bias, &mut || fetch(format!("{p}.{name}.bias")))?;
                Ok(Linear::new(w, b))
            };
            let attn = Attention {
                q: lin("self_attn.q_proj", cfg.qkv_bias())?,
                k: lin("self_attn.k_proj", cfg.qkv_bias())?,
                v: lin("self_attn.v_proj", cfg.qkv_bias())?,
                o: lin("self_attn.o_proj", cfg.o_bias())?,
                q_norm: None,
                k_norm: None,
                n_heads: cfg.num_attention_heads,
                n_kv: cfg.num_kv_heads(),
                head_dim: cfg.head_dim(),
            };
            let mlp = Mlp {
                gate: lin("mlp.gate_proj", cfg.mlp_bias)?,
                up: lin("mlp.up_proj", cfg.mlp_bias)?,
                down: lin("mlp.down_proj", cfg.mlp_bias)?,
            };
            let mut attn = attn;
            if cfg.qk_norm() {
                attn.q_norm = Some(RmsNorm::new(
                    fetch(format!("{p}.self_attn.q_norm.weight"))?,
                    eps,
                ));
                attn.k_norm = Some(RmsNorm::new(
                    fetch(format!("{p}.self_attn.k_norm.weight"))?,
                    eps,
                ));
            }
            layers.push(DecoderLayer {
                input_norm: RmsNorm::new(fetch(format!("{p}.input_layernorm.weight"))?, eps),
                attn,
                post_norm: RmsNorm::new(
                    fetch(format!("{p}.post_attention_layernorm.weight"))?,
                    eps,
                ),
                mlp,
            });
        }
        let norm = RmsNorm::new(fetch("model.norm.weight".into())?, eps);
        let lm_head = if cfg.tie_word_embeddings {
            embed.clone()
        } else {
            fetch("lm_head.weight".into())?
        };
        let rotary = Rotary::new(
            cfg.head_dim(),
            cfg.max_position_embeddings,
            cfg.rope_theta,
            dtype,
            &device,
        )?;
        Ok(CausalLm {
            cfg: cfg.clone(),
            embed,
            layers,
            norm,
            lm_head,
            rotary,
            dtype,
            device,
            attention: AttentionImpl::default(),
            checkpoint_every: 0,
            logits_chunk_rows: None,
        })
    }

    /// Chooses how the full-sequence forward computes attention (default
    /// [`AttentionImpl::Fused`]). The decode path is unaffected.
    pub fn set_attention(&mut self, attention: AttentionImpl) {
        self.attention = attention;
    }

    /// [`CausalLm::set_attention`] by value.
    pub fn with_attention(mut self, attention: AttentionImpl) -> CausalLm {
        self.attention = attention;
        self
    }

    /// Activation checkpointing of the differentiable full-sequence forward: every `k`-th
    /// decoder layer (layers `0, k, 2k, ...`) keeps only the inputs of its two blocks (attention,
    /// MLP) for backward and is recomputed there, one block at a time; `0` turns it off, `1` checkpoints every layer. Gradients are the same
    /// either way; a forward without a graph (inference, the KL reference) is unaffected.
    pub fn set_checkpoint_every(&mut self, k: usize) {
        self.checkpoint_every = k;
    }

    /// [`CausalLm::set_checkpoint_every`] by value.
    pub fn with_checkpoint_every(mut self, k: usize) -> CausalLm {
        self.checkpoint_every = k;
        self
    }

    /// Positions per chunk of the LM head when computing log-probs (`None`: as many as make
    /// 64 MiB of f32 logits). Values and gradients do not depend on it.
    pub fn set_logits_chunk_rows(&mut self, rows: Option<usize>) {
        self.logits_chunk_rows = rows.map(|r| r.max(1));
    }

    /// Positions per LM-head chunk: the override, else 2^24 logits' worth.
    fn chunk_rows(&self) -> usize {
        self.logits_chunk_rows
            .unwrap_or_else(|| logits_chunk_rows(self.cfg.vocab_size))
    }

    /// The activation checkpointing interval (0 = off).
    pub fn checkpoint_every(&self) -> usize {
        self.checkpoint_every
    }

    /// How the full-sequence forward computes attention.
    pub fn attention(&self) -> AttentionImpl {
        self.attention
    }

    /// Whether the full-sequence forward can use the fused attention on this device and dtype.
    /// (The CPU kernel; the CUDA kernel when built with the `cuda` feature: f32/bf16, head dim
    /// up to 128.)
    pub(crate) fn fused_attention(&self) -> bool {
        self.attention == AttentionImpl::Fused
            && super::flash_attn::supported(&self.device, self.dtype, self.cfg.head_dim())
    }

    /// The model's config.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Compute dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Device of the weights.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Runs the decoder stack. `input_ids` `(b, s)` u32, `positions` `(b, s)` u32, `bias`
    /// `(b, 1, s, keys)` f32. Returns the final-normed hidden states `(b, s, hidden)`.
    pub(crate) fn run_layers(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        bias: &Tensor,
        mode: OpsMode,
        kv: KvMode<'_>,
    ) -> Result<Tensor> {
        self.run_layers_masked(input_ids, positions, &AttnMask::Dense(bias), mode, kv)
    }

    /// [`CausalLm::run_layers`] with either mask.
    pub(crate) fn run_layers_masked(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        mask: &AttnMask<'_>,
        mode: OpsMode,
        mut kv: KvMode<'_>,
    ) -> Result<Tensor> {
        let (b, s) = input_ids.dims2()?;
        // 1. Embedding: (b, s, hidden).
        let mut x = self
            .embed
            .index_select(&input_ids.flatten_all()?, 0)?
            .reshape((b, s, self.cfg.hidden_size))?;
        // 2. Rotary tables for these positions: (b, 1, s, hd / 2).
        let (cos, sin) = self.rotary.at(positions)?;
        // 3. Decoder layers, pre-norm residual; with checkpointing, every k-th layer of a
        //    differentiable full-sequence forward keeps only its blocks' inputs.
        let k = self.checkpoint_every;
        let own = matches!(kv, KvMode::Own) && mode == OpsMode::Train;
        for (i, layer) in self.layers.iter().enumerate() {
            x = if own && k > 0 && i % k == 0 && x.track_op() {
                let mask = match *mask {
                    AttnMask::Dense(bias) => OwnedMask::Dense(bias.clone()),
                    AttnMask::Segments(s) => OwnedMask::Segments(s.clone()),
                    AttnMask::Paged => {
                        return Err(ModelError::Config("checkpointing a decode step".into()))
                    }
                };
                let block = |block| CheckpointedLayer {
                    layer: layer.clone(),
                    block,
                    cos: cos.clone(),
                    sin: sin.clone(),
                    mask: mask.clone(),
                };
                let x = checkpoint_layer(block(Block::Attention), &x)?;
                checkpoint_layer(block(Block::Mlp), &x)?
            } else {
                layer.forward(&x, &cos, &sin, mask, mode, (&mut kv, i))?
            };
        }
        // 4. Final norm.
        self.norm.forward(&x, mode)
    }

    /// Checks that every sequence fits the model's context (on the host positions: a sequence
    /// too long is an error naming its row and segment) and every id is inside the vocabulary
    /// (on the device tensor; the decode path checks the same on the host, without a sync).
    fn check_inputs(&self, input_ids: &Tensor, rows: &[Vec<u32>], positions: &[u32]) -> Result<()> {
        let max_pos = self.cfg.max_position_embeddings;
        // A position past the rotary table would be an out-of-bounds gather.
        let t = rows.first().map_or(0, Vec::len);
        for (r, row) in rows.iter().enumerate() {
            let pos = &positions[r * t..(r + 1) * t];
            if let Some(i) = (0..t).find(|&i| row[i] != 0 && pos[i] as usize >= max_pos) {
                let segment = row[i];
                let len = (0..t).filter(|&j| row[j] == segment).count();
                return Err(ModelError::RowTooLong {
                    row: r,
                    segment,
                    len,
                    max: max_pos,
                });
            }
        }
        let vocab = self.cfg.vocab_size as u32;
        let top_id = input_ids.flatten_all()?.max(0)?.to_scalar::<u32>()?;
        if top_id >= vocab {
            return Err(ModelError::BadTokenId {
                id: top_id,
                vocab: self.cfg.vocab_size,
            });
        }
        Ok(())
    }

    /// Projects hidden states `(.., hidden)` to logits `(.., vocab)` in f32.
    pub fn lm_head(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(Linear::new(self.lm_head.clone(), None)
            .forward(hidden)?
            .to_dtype(DType::F32)?)
    }

    /// Final hidden states `(b, t, hidden)` of a full sequence. `attention_mask` `(b, t)` (1 = real
    /// token, 0 = padding; left or right padding), or `None` for no padding. Differentiable.
    /// A packed row numbers its sequences instead (1, 1, 1, 2, 2, 0, ...): each attends only
    /// within itself and its positions restart at 0, as if it were alone.
    ///
    /// With the fused attention (the default on the CPU) the mask becomes per-row segments and
    /// no `t × t` tensor is built; padded positions then hold the output of a zero attention
    /// (garbage either way, masked by the caller). A mask whose segment id recurs after a gap
    /// or another id is not a set of segments and takes the unfused path.
    pub fn forward_hidden(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        let rows = mask_rows(input_ids, attention_mask)?;
        let positions = mask_positions(&rows);
        self.check_inputs(input_ids, &rows, &positions)?;
        let positions = Tensor::from_vec(positions, (b, t), &self.device)?;
        let segments = if self.fused_attention() {
            mask_segments(&rows, t)
        } else {
            None
        };
        let (mode, kv) = (OpsMode::Train, KvMode::Own);
        match segments {
            Some(segments) => {
                let mask = AttnMask::Segments(&Arc::new(segments));
                self.run_layers_masked(input_ids, &positions, &mask, mode, kv)
            }
            None => {
                let bias = dense_bias(&rows, &self.device)?;
                self.run_layers(input_ids, &positions, &bias, mode, kv)
            }
        }
    }

    /// Logits `(b, t, vocab)` (f32) of a full sequence. Differentiable.
    pub fn forward_logits(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.lm_head(&self.forward_hidden(input_ids, attention_mask)?)
    }

    /// `log p(targets[b, i] | input_ids[b, ..= i])` for every position: `(b, t)` f32.
    /// Differentiable with respect to every parameter. Padded positions hold garbage that the
    /// caller masks out.
    pub fn forward_logprobs(
        &self,
        input_ids: &Tensor,
        targets: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let hidden = self.forward_hidden(input_ids, attention_mask)?;
        self.hidden_logprobs(&hidden, targets, None)
    }

    /// `log softmax(lm_head(hidden) / T_b)[targets]` at every position, a chunk of positions at
    /// a time ([`super::recompute::chunked_logprobs`]): no `(positions × vocab)` tensor lives
    /// longer than one chunk, in forward or backward. `hidden` `(b, s, h)`, `targets` `(b, s)`
    /// u32, `inv_temperature` one `1 / T` per row (`None`: `T = 1`). Returns `(b, s)` f32.
    fn hidden_logprobs(
        &self,
        hidden: &Tensor,
        targets: &Tensor,
        inv_temperature: Option<&[f32]>,
    ) -> Result<Tensor> {
        let (b, s, h) = hidden.dims3()?;
        let n = b * s;
        let inv = match inv_temperature {
            Some(inv) => {
                let per_position: Vec<f32> = inv
                    .iter()
                    .flat_map(|&x| std::iter::repeat_n(x, s))
                    .collect();
                Some(Tensor::from_vec(per_position, n, &self.device)?)
            }
            None => None,
        };
        let lp = chunked_logprobs(
            &hidden.reshape((n, h))?,
            &self.lm_head,
            &targets.reshape(n)?,
            inv.as_ref(),
            self.chunk_rows(),
        )?;
        Ok(lp.reshape((b, s))?)
    }

    /// Log-probs of each next token of the sequence itself: `(b, t - 1)` where entry `i` is
    /// `log p(ids[:, i + 1] | ids[:, ..= i])`.
    pub fn token_logprobs(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (hidden, targets) = self.next_token_hidden(input_ids, attention_mask)?;
        self.hidden_logprobs(&hidden, &targets, None)
    }

    /// [`CausalLm::token_logprobs`] at selected positions only: `selected` `(n)` u32 indexes
    /// the flattened `(b, t - 1)` grid (`row * (t - 1) + i` is `log p(ids[row, i + 1] | ..)`).
    /// The LM head runs on those positions alone (the ones that carry a loss). Returns `(n)`
    /// f32; differentiable.
    pub fn token_logprobs_selected(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        selected: &Tensor,
    ) -> Result<Tensor> {
        let (hidden, targets) = self.selected_hidden(input_ids, attention_mask, selected)?;
        let lp = self.hidden_logprobs(&hidden.unsqueeze(0)?, &targets.unsqueeze(0)?, None)?;
        Ok(lp.squeeze(0)?)
    }

    /// The sum of [`CausalLm::token_logprobs_selected`], a scalar (the SFT loss is its negative
    /// over a count). Same value and gradients; on the CPU in f32 the LM head's gradients are
    /// computed in the forward's pass over each chunk of logits, so that backward does not
    /// recompute them ([`super::recompute::chunked_logprob_sum`]). The SFT learner's loss.
    pub fn token_logprob_sum_selected(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        selected: &Tensor,
    ) -> Result<Tensor> {
        let (hidden, targets) = self.selected_hidden(input_ids, attention_mask, selected)?;
        chunked_logprob_sum(&hidden, &self.lm_head, &targets, self.chunk_rows())
    }

    /// The sum of [`CausalLm::token_logprobs`] over every position, a scalar, as
    /// [`CausalLm::token_logprob_sum_selected`] computes it.
    pub fn token_logprob_sum(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (hidden, targets) = self.next_token_hidden(input_ids, attention_mask)?;
        let (b, s, h) = hidden.dims3()?;
        chunked_logprob_sum(
            &hidden.reshape((b * s, h))?,
            &self.lm_head,
            &targets.reshape(b * s)?,
            self.chunk_rows(),
        )
    }

    /// The hidden states `(n, h)` at `selected` positions of the next-token grid and the
    /// tokens they predict `(n)`.
    fn selected_hidden(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        selected: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let (b, t) = input_ids.dims2()?;
        let n = selected.dim(0)?;
        let top = if n == 0 {
            0
        } else {
            selected.max(0)?.to_scalar::<u32>()? as usize + 1
        };
        if top > b * t.saturating_sub(1) {
            return Err(ModelError::Config(format!(
                "selected position {} outside the {b} × {} next-token grid",
                top - 1,
                t.saturating_sub(1)
            )));
        }
        let (hidden, targets) = self.next_token_hidden(input_ids, attention_mask)?;
        let h = hidden.dim(2)?;
        let hidden = hidden
            .reshape((b * (t - 1), h))?
            .index_select(selected, 0)?;
        let targets = targets
            .contiguous()?
            .flatten_all()?
            .index_select(selected, 0)?;
        Ok((hidden, targets))
    }

    /// [`CausalLm::token_logprobs_at`] at selected positions only (see
    /// [`CausalLm::token_logprobs_selected`]): the LM head runs on the positions that carry a
    /// loss, each at its row's temperature. Returns `(n)` f32; differentiable.
    pub fn token_logprobs_at_selected(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        temperatures: &[f32],
        selected: &Tensor,
    ) -> Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        check_temperatures(temperatures, b)?;
        if temperatures.iter().all(|&x| x == 1.0) {
            return self.token_logprobs_selected(input_ids, attention_mask, selected);
        }
        let s = t.saturating_sub(1).max(1);
        let positions = selected.to_dtype(DType::U32)?.to_vec1::<u32>()?;
        if let Some(&p) = positions.iter().find(|&&p| p as usize >= b * s) {
            return Err(ModelError::Config(format!(
                "selected position {p} outside the {b} × {s} next-token grid"
            )));
        }
        let (hidden, targets) = self.next_token_hidden(input_ids, attention_mask)?;
        let h = hidden.dim(2)?;
        let hidden = hidden.reshape((b * s, h))?.index_select(selected, 0)?;
        let targets = targets.reshape(b * s)?.index_select(selected, 0)?;
        let inv: Vec<f32> = positions
            .iter()
            .map(|&p| 1.0 / temperatures[p as usize / s])
            .collect();
        let n = inv.len();
        let inv = Tensor::from_vec(inv, n, &self.device)?;
        chunked_logprobs(
            &hidden,
            &self.lm_head,
            &targets,
            Some(&inv),
            self.chunk_rows(),
        )
    }

    /// Hidden states `(b, t - 1, h)` at every position but the last, and the tokens they
    /// predict.
    fn next_token_hidden(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        let t = input_ids.dim(1)?;
        if t < 2 {
            return Err(ModelError::Config(
                "token_logprobs needs at least 2 tokens".into(),
            ));
        }
        let hidden = self
            .forward_hidden(input_ids, attention_mask)?
            .narrow(1, 0, t - 1)?;
        let targets = input_ids.narrow(1, 1, t - 1)?;
        Ok((hidden, targets))
    }

    /// [`CausalLm::token_logprobs`] of the tempered distribution `softmax(logits / T_b)`, one
    /// temperature per row (what a sampler at temperature `T_b` reports as the behaviour
    /// log-prob). All-ones temperatures take exactly the untempered path.
    pub fn token_logprobs_at(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        temperatures: &[f32],
    ) -> Result<Tensor> {
        let b = input_ids.dim(0)?;
        check_temperatures(temperatures, b)?;
        if temperatures.iter().all(|&x| x == 1.0) {
            return self.token_logprobs(input_ids, attention_mask);
        }
        let (hidden, targets) = self.next_token_hidden(input_ids, attention_mask)?;
        let inv: Vec<f32> = temperatures.iter().map(|&x| 1.0 / x).collect();
        self.hidden_logprobs(&hidden, &targets, Some(&inv))
    }
}

/// Positions and the additive attention bias of a full (possibly padded, possibly packed)
/// sequence batch. The mask holds 0 for padding and a segment id ≥ 1 for real tokens: a plain
/// 0/1 mask is one segment per row; a packed row numbers its sequences 1, 2, ... (SFT packing).
/// Positions count the real tokens of the same segment before a token, so a left-padded row
/// sees the same positions as unpadded and every packed sequence starts at position 0. Key `j`
/// is visible to query `i` when `j <= i` and `j` is a real token of `i`'s segment; the diagonal
/// is always visible so that padded queries never produce NaN (their outputs are masked by the
/// caller).
pub(crate) fn full_sequence_layout(
    input_ids: &Tensor,
    attention_mask: Option<&Tensor>,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let (b, t) = input_ids.dims2()?;
    let rows = mask_rows(input_ids, attention_mask)?;
    let positions = Tensor::from_vec(mask_positions(&rows), (b, t), device)?;
    Ok((positions, dense_bias(&rows, device)?))
}

/// The mask as host rows of segment ids (all ones without a mask).
fn mask_rows(input_ids: &Tensor, attention_mask: Option<&Tensor>) -> Result<Vec<Vec<u32>>> {
    let (b, t) = input_ids.dims2()?;
    match attention_mask {
        Some(m) => {
            if m.dims() != [b, t] {
                return Err(ModelError::Config(format!(
                    "attention_mask shape {:?} != input_ids shape {:?}",
                    m.dims(),
                    [b, t]
                )));
            }
            Ok(m.to_dtype(DType::U32)?.to_vec2::<u32>()?)
        }
        None => Ok(vec![vec![1u32; t]; b]),
    }
}

/// Positions `(b * t)`: real tokens count within their segment; padding gets a harmless
/// in-range position.
fn mask_positions(rows: &[Vec<u32>]) -> Vec<u32> {
    let mut positions = Vec::with_capacity(rows.iter().map(Vec::len).sum());
    for row in rows {
        let mut count = 0u32;
        let mut segment = 0u32;
        for &m in row {
            if m != 0 && m != segment {
                segment = m;
                count = 0;
            }
            positions.push(if m != 0 {
                count
            } else {
                count.saturating_sub(1)
            });
            if m != 0 {
                count += 1;
            }
        }
    }
    positions
}

/// The dense `(b, 1, t, t)` additive bias of the unfused attention (see
/// [`full_sequence_layout`]).
fn dense_bias(rows: &[Vec<u32>], device: &Device) -> Result<Tensor> {
    let b = rows.len();
    let t = rows.first().map_or(0, Vec::len);
    let mut bias = vec![f32::NEG_INFINITY; b * t * t];
    for (r, row) in rows.iter().enumerate() {
        for i in 0..t {
            let base = (r * t + i) * t;
            let own = row[i];
            for j in 0..=i {
                let visible = if own == 0 { row[j] != 0 } else { row[j] == own };
                if visible || j == i {
                    bias[base + j] = 0.0;
                }
            }
        }
    }
    Ok(Tensor::from_vec(bias, (b, 1, t, t), device)?)
}

/// The mask as segments of the fused attention: each maximal run of one non-zero id is a
/// segment. `None` when an id recurs after a gap or another id (its tokens would attend across
/// the gap, which segments cannot say; the unfused path handles it).
fn mask_segments(rows: &[Vec<u32>], t: usize) -> Option<Segments> {
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let mut segs: Vec<(usize, usize)> = Vec::new();
        let mut seen: Vec<u32> = Vec::new();
        let mut i = 0;
        while i < row.len() {
            let id = row[i];
            let start = i;
            while i < row.len() && row[i] == id {
                i += 1;
            }
            if id == 0 {
                continue;
            }
            if seen.contains(&id) {
                return None;
            }
            seen.push(id);
            segs.push((start, i));
        }
        out.push(segs);
    }
    Segments::new(t, out).ok()
}

/// The device's compute dtype: f32 on CPU, bf16 on GPU.
pub fn compute_dtype(device: &Device) -> DType {
    if device.is_cpu() {
        DType::F32
    } else {
        DType::BF16
    }
}

/// One finite, positive temperature per row of a batch of `b`.
fn check_temperatures(temperatures: &[f32], b: usize) -> Result<()> {
    if temperatures.len() != b {
        return Err(ModelError::Config(format!(
            "{} temperatures for a batch of {b} rows",
            temperatures.len()
        )));
    }
    if let Some(bad) = temperatures.iter().find(|x| !(**x > 0.0 && x.is_finite())) {
        return Err(ModelError::Config(format!(
            "temperature {bad} is not a finite positive number"
        )));
    }
    Ok(())
}
