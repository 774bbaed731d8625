//! The SFT step through the memory-saving paths (log-probs only at trained positions, chunked
//! LM head, activation checkpointing) gives the gradients of the plain loss
//! `−Σ w · log p / trained` computed from full logits; a conversation longer than the model's
//! context is a clear error.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use cascade_learner::optim::{AdamW, AdamWConfig};
use cascade_learner::sft::{accumulate_scaled_sft_gradients, accumulate_sft_gradients, PackedRow};
use cascade_shared::model::{
    gather_logprobs, random_weights, trainable_from_tensors, CausalLm, ModelConfig, Params,
};

fn model(max_positions: usize) -> Result<(CausalLm, Params)> {
    let cfg = ModelConfig::from_json_str(&format!(
        r#"{{"model_type": "qwen3", "vocab_size": 200, "hidden_size": 32,
            "intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": {max_positions},
            "initializer_range": 0.2, "tie_word_embeddings": true}}"#
    ))?;
    let tensors = random_weights(&cfg, 5, &Device::Cpu)?;
    Ok(trainable_from_tensors(&cfg, tensors)?)
}

/// Two packed rows of different widths (the second is padded in the micro-batch).
fn rows() -> Vec<PackedRow> {
    let mk = |lens: &[usize], seed: u32| {
        let mut ids = Vec::new();
        let mut segments = Vec::new();
        let mut trained = Vec::new();
        for (s, &len) in lens.iter().enumerate() {
            for i in 0..len {
                ids.push((seed + 37 * (ids.len() as u32) + 11 * s as u32) % 200);
                segments.push(s as u32 + 1);
                trained.push(i >= len / 3);
            }
        }
        let weights = (0..ids.len() - 1)
            .map(|i| segments[i] == segments[i + 1] && trained[i + 1])
            .collect();
        PackedRow {
            ids,
            segments,
            weights,
        }
    };
    vec![mk(&[40, 25, 31], 1), mk(&[50, 19], 2)]
}

/// The plain loss of `rows` (one micro-batch) from full logits, and its gradients.
fn plain_gradients(model: &CausalLm, params: &Params, rows: &[PackedRow]) -> Result<Vec<Tensor>> {
    let width = rows.iter().map(|r| r.ids.len()).max().unwrap();
    let n = rows.len();
    let (mut ids, mut seg, mut w) = (
        vec![0u32; n * width],
        vec![0u32; n * width],
        vec![0f32; n * (width - 1)],
    );
    for (r, row) in rows.iter().enumerate() {
        ids[r * width..r * width + row.ids.len()].copy_from_slice(&row.ids);
        seg[r * width..r * width + row.ids.len()].copy_from_slice(&row.segments);
        for (i, &on) in row.weights.iter().enumerate() {
            w[r * (width - 1) + i] = if on { 1.0 } else { 0.0 };
        }
    }
    let trained: usize = rows.iter().map(PackedRow::trained_tokens).sum();
    let dev = Device::Cpu;
    let ids = Tensor::from_vec(ids, (n, width), &dev)?;
    let seg = Tensor::from_vec(seg, (n, width), &dev)?;
    let w = Tensor::from_vec(w, (n, width - 1), &dev)?;
    let logits = model
        .forward_logits(&ids, Some(&seg))?
        .narrow(1, 0, width - 1)?;
    let lp = gather_logprobs(&logits, &ids.narrow(1, 1, width - 1)?)?;
    let loss = (lp.mul(&w)?.sum_all()?.neg()? / trained as f64)?;
    let grads = loss.backward()?;
    Ok(params
        .vars
        .values()
        .map(|v| grads.get(v.as_tensor()).unwrap().clone())
        .collect())
}

#[test]
fn sft_gradients_equal_the_plain_loss() -> Result<()> {
    let (model, params) = model(256)?;
    let want = plain_gradients(&model, &params, &rows())?;
    for checkpoint in [0, 1, 2] {
        let mut m = model.clone();
        m.set_checkpoint_every(checkpoint);
        m.set_logits_chunk_rows(Some(16));
        let mut opt = AdamW::new(
            params.vars.clone().into_iter().collect(),
            AdamWConfig::default(),
        )?;
        accumulate_sft_gradients(&m, &rows(), 2, &mut opt, &Device::Cpu)?;
        for ((name, _), want) in params.vars.iter().zip(&want) {
            let got = opt
                .grad(name)
                .expect("every parameter has a gradient")
                .to_dtype(DType::F32)?;
            let diff = (got - want.to_dtype(DType::F32)?)?
                .abs()?
                .flatten_all()?
                .max(0)?
                .to_scalar::<f32>()?;
            let top = want.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
            assert!(
                diff <= 1e-5 * top,
                "checkpoint {checkpoint}, {name}: {diff} vs {top}"
            );
        }
    }
    Ok(())
}

/// An RL stage's `sft_mix` adds `coef` × the SFT gradients on top of what the step has already
/// accumulated (its GRPO gradients): here the gradients of one row, then 0.3 × another's.
#[test]
fn sft_mix_gradients_add_coef_times_the_plain_gradients() -> Result<()> {
    let (model, params) = model(256)?;
    let (first, second) = (&rows()[..1], &rows()[1..]);
    let want_first = plain_gradients(&model, &params, first)?;
    let want_second = plain_gradients(&model, &params, second)?;
    let mut opt = AdamW::new(
        params.vars.clone().into_iter().collect(),
        AdamWConfig::default(),
    )?;
    accumulate_sft_gradients(&model, first, 2, &mut opt, &Device::Cpu)?;
    let unscaled = accumulate_scaled_sft_gradients(&model, second, 2, &mut opt, &Device::Cpu, 1.0)?;
    let mut opt_mixed = AdamW::new(
        params.vars.clone().into_iter().collect(),
        AdamWConfig::default(),
    )?;
    accumulate_sft_gradients(&model, first, 2, &mut opt_mixed, &Device::Cpu)?;
    let mixed =
        accumulate_scaled_sft_gradients(&model, second, 2, &mut opt_mixed, &Device::Cpu, 0.3)?;
    // The reported loss is the unweighted mean NLL.
    assert!(
        (mixed.loss - unscaled.loss).abs() < 1e-6,
        "{mixed:?} vs {unscaled:?}"
    );
    for (((name, _), a), b) in params.vars.iter().zip(&want_first).zip(&want_second) {
        let want = (a.to_dtype(DType::F32)? + (b.to_dtype(DType::F32)? * 0.3)?)?;
        let got = opt_mixed
            .grad(name)
            .expect("every parameter has a gradient");
        let diff = (got - &want)?
            .abs()?
            .flatten_all()?
            .max(0)?
            .to_scalar::<f32>()?;
        let top = want.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
        assert!(diff <= 1e-5 * top, "{name}: {diff} vs {top}");
    }
    Ok(())
}

#[test]
fn a_conversation_longer_than_the_context_is_named() -> Result<()> {
    let (model, params) = model(64)?;
    let mut opt = AdamW::new(params.vars.into_iter().collect(), AdamWConfig::default())?;
    let mut rows = rows();
    // Row 1 holds conversations of 50 and 19 tokens; make the second 70 (> 64).
    let extra = 51;
    rows[1].ids.extend(std::iter::repeat_n(3, extra));
    rows[1].segments.extend(std::iter::repeat_n(2, extra));
    rows[1].weights.extend(std::iter::repeat_n(true, extra));
    let err = accumulate_sft_gradients(&model, &rows, 2, &mut opt, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("row 1")
            && err.contains("conversation 2")
            && err.contains("70 tokens")
            && err.contains("64"),
        "{err}"
    );
    Ok(())
}
