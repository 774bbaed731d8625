//! Recomputation in backward against the plain path: activation checkpointing of decoder
//! layers and the chunked LM head with log-probs give the same log-probs and the same gradient
//! for every parameter (f32 to 1e-5 relative, bf16 to 1e-2), on batches with GQA, left and
//! right padding and packed segments; and a sequence longer than the context is an error.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use cascade_shared::model::{
    gather_logprobs, load_trainable, random_weights, trainable_from_tensors, CausalLm, ModelConfig,
    ModelError, Params,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn model_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/model")
        .join(name)
}

/// max |a - b| / max |b|.
fn relative(a: &Tensor, b: &Tensor) -> Result<f32> {
    assert_eq!(a.dims(), b.dims());
    let a = a.to_dtype(DType::F32)?;
    let b = b.to_dtype(DType::F32)?;
    let abs = (&a - &b)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()?;
    let top = b.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
    Ok(if top > 0.0 { abs / top } else { abs })
}

/// A batch of three rows of `t` tokens: row 0 left-padded, row 1 right-padded, row 2 packed
/// (segments 1, 2, padding, 3). Returns ids, mask and loss weights `(3, t - 1)`.
fn batch(vocab: u32, t: usize, seed: u64) -> Result<(Tensor, Tensor, Tensor)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let ids: Vec<u32> = (0..3 * t).map(|_| rng.random_range(0..vocab)).collect();
    let ids = Tensor::from_vec(ids, (3, t), &Device::Cpu)?;
    let mut mask = vec![0u32; 3 * t];
    let (lp, rp) = ((t / 7).min(9), (t / 5).min(13));
    mask[lp..t].fill(1);
    mask[t..2 * t - rp].fill(1);
    let (a, b) = (t / 3, 2 * t / 3);
    mask[2 * t..2 * t + a].fill(1);
    mask[2 * t + a..2 * t + b].fill(2);
    if b + 2 < t {
        mask[2 * t + b + 2..3 * t].fill(3);
    }
    let m = mask.clone();
    let mask = Tensor::from_vec(mask, (3, t), &Device::Cpu)?;
    // Random loss weights where query and target are real tokens of one segment.
    let mut w = vec![0f32; 3 * (t - 1)];
    for r in 0..3 {
        for i in 0..t - 1 {
            let (q, k) = (m[r * t + i], m[r * t + i + 1]);
            if q != 0 && q == k {
                w[r * (t - 1) + i] = 0.5 + rng.random::<f32>();
            }
        }
    }
    let w = Tensor::from_vec(w, (3, t - 1), &Device::Cpu)?;
    Ok((ids, mask, w))
}

/// The log-probs as the model computed them before chunking: full logits, then
/// `gather_logprobs` (tempered per row when `temps` is given).
fn unchunked_logprobs(
    model: &CausalLm,
    ids: &Tensor,
    mask: &Tensor,
    temps: Option<&[f32]>,
) -> Result<Tensor> {
    let t = ids.dim(1)?;
    let logits = model.forward_logits(ids, Some(mask))?.narrow(1, 0, t - 1)?;
    let logits = match temps {
        Some(temps) => {
            let inv: Vec<f32> = temps.iter().map(|x| 1.0 / x).collect();
            logits.broadcast_mul(&Tensor::from_vec(inv, (temps.len(), 1, 1), &Device::Cpu)?)?
        }
        None => logits,
    };
    Ok(gather_logprobs(&logits, &ids.narrow(1, 1, t - 1)?)?)
}

/// How the log-probs are computed.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// Full logits and `gather_logprobs`, no checkpointing.
    Plain,
    /// `token_logprobs(_at)`: chunks of this many positions, checkpointing every k layers.
    Chunked { rows: usize, checkpoint: usize },
}

/// Weighted log-probs and the gradient of their negative sum for every parameter (f32).
fn gradients(
    model: &CausalLm,
    params: &Params,
    path: Path,
    (ids, mask, w): &(Tensor, Tensor, Tensor),
    temps: Option<&[f32]>,
) -> Result<(Tensor, BTreeMap<String, Tensor>)> {
    let mut model = model.clone();
    let lp = match path {
        Path::Plain => unchunked_logprobs(&model, ids, mask, temps)?,
        Path::Chunked { rows, checkpoint } => {
            model.set_logits_chunk_rows(Some(rows));
            model.set_checkpoint_every(checkpoint);
            match temps {
                Some(temps) => model.token_logprobs_at(ids, Some(mask), temps)?,
                None => model.token_logprobs(ids, Some(mask))?,
            }
        }
    };
    let lp = lp.mul(&w.to_dtype(lp.dtype())?)?;
    let grads = lp.sum_all()?.neg()?.backward()?;
    let mut out = BTreeMap::new();
    for (name, var) in &params.vars {
        let g = grads
            .get(var.as_tensor())
            .with_context(|| format!("{path:?}: no gradient for {name}"))?;
        out.insert(name.clone(), g.to_dtype(DType::F32)?);
    }
    Ok((lp, out))
}

/// Worst relative difference of the log-probs and over every parameter's gradient.
fn compare(
    a: &(Tensor, BTreeMap<String, Tensor>),
    b: &(Tensor, BTreeMap<String, Tensor>),
) -> Result<(f32, f32, String)> {
    let lp = relative(&a.0, &b.0)?;
    let (mut worst, mut which) = (0f32, String::new());
    assert_eq!(a.1.len(), b.1.len());
    for (name, g) in &a.1 {
        let r = relative(g, &b.1[name])?;
        if r >= worst {
            (worst, which) = (r, name.clone());
        }
    }
    Ok((lp, worst, which))
}

#[test]
fn checkpointing_gives_the_same_gradients() -> Result<()> {
    for name in ["qwen3-untied", "qwen3-tied", "qwen2-bf16", "llama"] {
        let (model, params) = load_trainable(&model_fixture(name), DType::F32, &Device::Cpu)?;
        let data = batch(model.config().vocab_size as u32, 70, 7)?;
        let plain = gradients(&model, &params, Path::Plain, &data, None)?;
        for checkpoint in [0, 1, 2] {
            let got = gradients(
                &model,
                &params,
                Path::Chunked {
                    rows: 64,
                    checkpoint,
                },
                &data,
                None,
            )?;
            let (lp, grad, which) = compare(&got, &plain)?;
            eprintln!(
                "{name} checkpoint every {checkpoint}: logprobs {lp}, grads {grad} ({which})"
            );
            assert!(
                lp < 1e-5 && grad < 1e-5,
                "{name} k={checkpoint}: {lp} / {grad} {which}"
            );
        }
    }
    Ok(())
}

/// A Qwen3-shaped random model (GQA, tied or untied embeddings) with a context of 2048.
fn random_model(tied: bool, dtype: DType) -> Result<(CausalLm, Params)> {
    let cfg = ModelConfig::from_json_str(&format!(
        r#"{{"model_type": "qwen3", "vocab_size": 300, "hidden_size": 32,
            "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 2048,
            "initializer_range": 0.2, "tie_word_embeddings": {tied}}}"#
    ))?;
    let tensors = random_weights(&cfg, 11, &Device::Cpu)?
        .into_iter()
        .map(|(k, t)| Ok((k, t.to_dtype(dtype)?)))
        .collect::<Result<_>>()?;
    Ok(trainable_from_tensors(&cfg, tensors)?)
}

#[test]
fn chunked_logprobs_equal_full_logits_at_every_length() -> Result<()> {
    // Positions per row (t - 1): 1, 63, 64, 65, 1000 with chunks of 64 positions (the batch
    // has 3 rows, so chunks also straddle rows); tempered rows included.
    for (tied, temps) in [(true, None), (false, Some([0.7f32, 1.0, 1.6]))] {
        let (model, params) = random_model(tied, DType::F32)?;
        for t in [2usize, 64, 65, 66, 1001] {
            let data = batch(300, t, t as u64)?;
            let temps = temps.as_ref().map(|x| x.as_slice());
            let plain = gradients(&model, &params, Path::Plain, &data, temps)?;
            let got = gradients(
                &model,
                &params,
                Path::Chunked {
                    rows: 64,
                    checkpoint: 1,
                },
                &data,
                temps,
            )?;
            let (lp, grad, which) = compare(&got, &plain)?;
            eprintln!("tied {tied}, t {t}: logprobs {lp}, grads {grad} ({which})");
            assert!(lp < 1e-5 && grad < 1e-5, "t {t}: {lp} / {grad} {which}");
        }
    }
    Ok(())
}

#[test]
fn chunked_and_checkpointed_in_bf16() -> Result<()> {
    // Two bf16 runs differ wherever they round differently, so both are measured against the
    // f32 gradients of the same (bf16-rounded) weights, as `flash_attn.rs` does: the log-probs
    // to 1e-2, and the chunked, checkpointed path no further from f32 than the plain bf16 path
    // (whose worst parameter, a q/k-norm weight summed over every position and head, is
    // itself ~0.13 off here).
    let (model, params) = random_model(true, DType::BF16)?;
    let rounded = params
        .vars
        .iter()
        .map(|(k, v)| Ok((k.clone(), v.as_tensor().to_dtype(DType::F32)?)))
        .collect::<Result<_>>()?;
    let (model32, params32) = trainable_from_tensors(model.config(), rounded)?;
    let data = batch(300, 130, 3)?;
    let reference = gradients(&model32, &params32, Path::Plain, &data, None)?;
    let plain = gradients(&model, &params, Path::Plain, &data, None)?;
    let got = gradients(
        &model,
        &params,
        Path::Chunked {
            rows: 64,
            checkpoint: 1,
        },
        &data,
        None,
    )?;
    let (lp, grad, which) = compare(&got, &reference)?;
    let (lp_plain, grad_plain, _) = compare(&plain, &reference)?;
    eprintln!("bf16 vs f32: chunked logprobs {lp}, grads {grad} ({which}); plain {lp_plain} / {grad_plain}");
    assert!(lp < 1e-2, "logprobs {lp}");
    assert!(
        grad <= grad_plain * 1.1 + 1e-3 && grad < 0.2,
        "{grad} vs {grad_plain} {which}"
    );
    Ok(())
}

#[test]
fn selected_positions_give_the_same_logprobs_and_gradients() -> Result<()> {
    let (model, params) = random_model(true, DType::F32)?;
    let (ids, mask, w) = batch(300, 90, 5)?;
    let wv = w.flatten_all()?.to_vec1::<f32>()?;
    let selected: Vec<u32> = (0..wv.len() as u32)
        .filter(|&i| wv[i as usize] > 0.0)
        .collect();
    let weights: Vec<f32> = selected.iter().map(|&i| wv[i as usize]).collect();
    let n = selected.len();
    let mut m = model.clone();
    m.set_logits_chunk_rows(Some(16));
    m.set_checkpoint_every(1);
    let lp = m
        .token_logprobs_selected(
            &ids,
            Some(&mask),
            &Tensor::new(selected.as_slice(), &Device::Cpu)?,
        )?
        .mul(&Tensor::from_vec(weights, n, &Device::Cpu)?)?;
    let grads = lp.sum_all()?.neg()?.backward()?;
    let plain = gradients(&model, &params, Path::Plain, &(ids.clone(), mask, w), None)?;
    let all = plain
        .0
        .flatten_all()?
        .index_select(&Tensor::new(selected.as_slice(), &Device::Cpu)?, 0)?;
    assert!(relative(&lp, &all)? < 1e-5);
    for (name, var) in &params.vars {
        let r = relative(
            grads.get(var.as_tensor()).context("gradient")?,
            &plain.1[name],
        )?;
        assert!(r < 1e-5, "{name}: {r}");
    }
    // An index outside the grid is an error, not a panic.
    let bad = Tensor::new(&[3 * 89u32], &Device::Cpu)?;
    assert!(model.token_logprobs_selected(&ids, None, &bad).is_err());
    Ok(())
}

#[test]
fn the_logprob_sum_has_the_summed_logprobs_value_and_gradients() -> Result<()> {
    // `token_logprob_sum(_selected)` computes the LM head's gradients in the forward (fused
    // CPU path) and scales them in backward: against the plain path's summed log-probs, with a
    // loss scale that is not 1, chunks that straddle rows, a tied and an untied head, and
    // bf16 (the unfused fallback).
    for (tied, dtype, chunk) in [
        (true, DType::F32, 16usize),
        (false, DType::F32, 7),
        (true, DType::F32, 100_000),
        (true, DType::BF16, 16),
    ] {
        let (model, params) = random_model(tied, dtype)?;
        let (ids, mask, w) = batch(300, 65, 9)?;
        let wv = w.flatten_all()?.to_vec1::<f32>()?;
        let selected: Vec<u32> = (0..wv.len() as u32)
            .filter(|&i| wv[i as usize] > 0.0)
            .collect();
        let selected = Tensor::new(selected.as_slice(), &Device::Cpu)?;
        let mut m = model.clone();
        m.set_logits_chunk_rows(Some(chunk));
        m.set_checkpoint_every(1);
        let scale = -0.37f64;
        let run = |sum: Tensor| -> Result<(f32, Vec<(String, Tensor)>)> {
            let value = sum.to_dtype(DType::F32)?.to_scalar::<f32>()?;
            let grads = (sum * scale)?.backward()?;
            let g = params
                .vars
                .iter()
                .map(|(k, v)| {
                    Ok((
                        k.clone(),
                        grads.get(v.as_tensor()).context("gradient")?.clone(),
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((value, g))
        };
        // bf16 takes the unfused path: against the same chunking and checkpointing (two bf16
        // configurations differ by their rounding, see `chunked_and_checkpointed_in_bf16`).
        let (tol, reference_model) = if dtype == DType::F32 {
            (1e-5, &model)
        } else {
            (1e-6, &m)
        };
        for selected in [Some(&selected), None] {
            let (got, reference) = match selected {
                Some(sel) => (
                    m.token_logprob_sum_selected(&ids, Some(&mask), sel)?,
                    reference_model
                        .token_logprobs_selected(&ids, Some(&mask), sel)?
                        .sum_all()?,
                ),
                None => (
                    m.token_logprob_sum(&ids, Some(&mask))?,
                    reference_model
                        .token_logprobs(&ids, Some(&mask))?
                        .sum_all()?,
                ),
            };
            let (v_got, g_got) = run(got)?;
            let (v_ref, g_ref) = run(reference)?;
            assert!(
                ((v_got - v_ref) / v_ref).abs() < tol as f32,
                "{tied} {dtype:?} {chunk}: {v_got} vs {v_ref}"
            );
            for ((name, a), (_, b)) in g_got.iter().zip(&g_ref) {
                let r = relative(a, b)?;
                assert!(r < tol as f32, "{tied} {dtype:?} {chunk} {name}: {r}");
            }
        }
    }
    Ok(())
}

#[test]
fn a_sequence_longer_than_the_context_names_its_row() -> Result<()> {
    let (model, _) = load_trainable(&model_fixture("qwen3-untied"), DType::F32, &Device::Cpu)?;
    let max = model.config().max_position_embeddings;
    // Row 1 packs a sequence of max tokens (fits) and one of max + 1 (does not).
    let t = 2 * max + 1;
    let ids = Tensor::zeros((2, t), DType::U32, &Device::Cpu)?;
    let mut mask = vec![0u32; 2 * t];
    mask[..10].fill(1);
    mask[t..t + max].fill(1);
    mask[t + max..].fill(2);
    let mask = Tensor::from_vec(mask, (2, t), &Device::Cpu)?;
    let err = model.token_logprobs(&ids, Some(&mask)).unwrap_err();
    match &err {
        ModelError::RowTooLong {
            row,
            segment,
            len,
            max: m,
        } => assert_eq!((*row, *segment, *len, *m), (1, 2, max + 1, max)),
        other => panic!("{other}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("row 1") && text.contains(&format!("{}", max + 1)),
        "{text}"
    );
    Ok(())
}

/// The GRPO path (issue 16): the LM head at the trained positions only, each at its row's
/// temperature, gives the full grid's tempered log-probs there, and their gradients.
#[test]
fn selected_positions_at_row_temperatures_match_the_full_tempered_grid() -> Result<()> {
    let (model, params) = random_model(false, DType::F32)?;
    let (ids, mask, w) = batch(300, 60, 9)?;
    let b = ids.dim(0)?;
    let temps: Vec<f32> = (0..b).map(|r| 0.6 + 0.3 * r as f32).collect();
    let wv = w.flatten_all()?.to_vec1::<f32>()?;
    let selected: Vec<u32> = (0..wv.len() as u32)
        .filter(|&i| wv[i as usize] > 0.0)
        .collect();
    let sel = Tensor::new(selected.as_slice(), &Device::Cpu)?;
    let mut m = model.clone();
    m.set_logits_chunk_rows(Some(7));
    let lp = m.token_logprobs_at_selected(&ids, Some(&mask), &temps, &sel)?;
    let full = model
        .token_logprobs_at(&ids, Some(&mask), &temps)?
        .flatten_all()?
        .index_select(&sel, 0)?;
    assert!(relative(&lp, &full)? < 1e-5);
    let g_sel = lp.sum_all()?.backward()?;
    let g_full = full.sum_all()?.backward()?;
    for (name, var) in &params.vars {
        let r = relative(
            g_sel.get(var.as_tensor()).context("gradient")?,
            g_full.get(var.as_tensor()).context("gradient")?,
        )?;
        assert!(r < 1e-5, "{name}: {r}");
    }
    // Rows at temperature 1 take the untempered path; a bad temperature or position is refused.
    let ones = vec![1.0; b];
    let lp1 = model.token_logprobs_at_selected(&ids, Some(&mask), &ones, &sel)?;
    let plain = model.token_logprobs_selected(&ids, Some(&mask), &sel)?;
    assert!(relative(&lp1, &plain)? < 1e-6);
    let mut bad = temps.clone();
    bad[0] = 0.0;
    assert!(model
        .token_logprobs_at_selected(&ids, Some(&mask), &bad, &sel)
        .is_err());
    let t = ids.dim(1)?;
    let outside = Tensor::new(&[(b * (t - 1)) as u32], &Device::Cpu)?;
    assert!(model
        .token_logprobs_at_selected(&ids, Some(&mask), &temps, &outside)
        .is_err());
    Ok(())
}
