//! The fused attention op against the unfused path it replaces (scores, an explicit mask and a
//! softmax as candle ops), forward and gradients, on seeded inputs; the model's gradients
//! through both paths; PyTorch eager attention (`scripts/gen-flash-attn-fixtures.py`); bad input.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor, Var, D};
use cascade_shared::model::flash_attn::{flash_attn, SegmentError, Segments};
use cascade_shared::model::{load_trainable, AttentionImpl};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn randn(rng: &mut ChaCha8Rng, shape: &[usize], scale: f32) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    // Sum of uniforms: roughly normal, seeded, no extra dependency.
    let data: Vec<f32> = (0..n)
        .map(|_| (0..4).map(|_| rng.random::<f32>() - 0.5).sum::<f32>() * scale)
        .collect();
    Ok(Tensor::from_vec(data, shape, &Device::Cpu)?)
}

/// Reference attention with an explicit `(b, 1, t, t)` mask; rows outside every segment are
/// zeroed (output and, through the product, gradients).
fn naive(q: &Tensor, k: &Tensor, v: &Tensor, segments: &Segments, scale: f32) -> Result<Tensor> {
    let (b, nh, t, d) = q.dims4()?;
    let nkv = k.dim(1)?;
    let rep = nh / nkv;
    let mut bias = vec![f32::NEG_INFINITY; b * t * t];
    let mut keep = vec![0f32; b * t];
    for (r, segs) in segments.rows().iter().enumerate() {
        for &(s, e) in segs {
            for i in s..e {
                keep[r * t + i] = 1.0;
                for j in s..=i {
                    bias[(r * t + i) * t + j] = 0.0;
                }
            }
        }
        // A row that sees nothing gets a uniform softmax (finite), zeroed below.
        for i in 0..t {
            if keep[r * t + i] == 0.0 {
                bias[(r * t + i) * t..(r * t + i + 1) * t].fill(0.0);
            }
        }
    }
    let bias = Tensor::from_vec(bias, (b, 1, t, t), &Device::Cpu)?;
    let keep = Tensor::from_vec(keep, (b, 1, t, 1), &Device::Cpu)?;
    let dtype = q.dtype();
    let (q, k, v) = (
        q.to_dtype(DType::F32)?,
        k.to_dtype(DType::F32)?,
        v.to_dtype(DType::F32)?,
    );
    // GQA by grouping query heads as rows, as the model's unfused path does.
    let qg = q.reshape((b, nkv, rep * t, d))?;
    let scores = (qg.matmul(&k.t()?)? * scale as f64)?
        .reshape((b, nkv, rep, t, t))?
        .broadcast_add(&bias.unsqueeze(1)?)?;
    let max = scores.max_keepdim(D::Minus1)?.detach();
    let e = scores.broadcast_sub(&max)?.exp()?;
    let probs = e
        .broadcast_div(&e.sum_keepdim(D::Minus1)?)?
        .reshape((b, nkv, rep * t, t))?;
    let out = probs.matmul(&v)?.reshape((b, nh, t, d))?;
    Ok(out.broadcast_mul(&keep)?.to_dtype(dtype)?)
}

/// max |a - b| and that divided by max |b|.
fn errors(a: &Tensor, b: &Tensor) -> Result<(f32, f32)> {
    assert_eq!(a.dims(), b.dims());
    let a = a.to_dtype(DType::F32)?;
    let b = b.to_dtype(DType::F32)?;
    let abs = (&a - &b)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()?;
    let top = b.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
    Ok((abs, if top > 0.0 { abs / top } else { abs }))
}

struct Case {
    name: &'static str,
    b: usize,
    heads: usize,
    kv_heads: usize,
    t: usize,
    d: usize,
    segments: Vec<Vec<(usize, usize)>>,
}

fn causal(name: &'static str, heads: usize, kv_heads: usize, t: usize, d: usize) -> Case {
    Case {
        name,
        b: 1,
        heads,
        kv_heads,
        t,
        d,
        segments: vec![vec![(0, t)]],
    }
}

fn cases() -> Vec<Case> {
    vec![
        causal("t=1", 4, 2, 1, 16),
        causal("t=2 d=8", 4, 2, 2, 8),
        causal("t=3 d=8", 4, 2, 3, 8),
        causal("t=63", 4, 2, 63, 16),
        causal("t=64", 4, 2, 64, 16),
        causal("t=65", 4, 2, 65, 16),
        causal("mha t=130 d=12", 3, 3, 130, 12),
        causal("t=1000 d=64", 4, 2, 1000, 64),
        causal("8 heads 1 kv t=70 d=128", 8, 1, 70, 128),
        Case {
            name: "left pad, right pad, packed with a gap",
            b: 3,
            heads: 4,
            kv_heads: 2,
            t: 150,
            d: 16,
            segments: vec![
                vec![(37, 150)],
                vec![(0, 81)],
                vec![(0, 20), (20, 65), (70, 71), (72, 140)],
            ],
        },
        Case {
            name: "packed rows across tile edges",
            b: 2,
            heads: 2,
            kv_heads: 1,
            t: 200,
            d: 8,
            segments: vec![
                vec![(0, 63), (63, 129), (129, 200)],
                vec![(1, 64), (65, 66)],
            ],
        },
    ]
}

/// Forward and the gradients of `sum(O ∘ W)` for q, k, v by both paths.
fn run_case(c: &Case, dtype: DType, seed: u64) -> Result<[(f32, f32); 4]> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let q = randn(&mut rng, &[c.b, c.heads, c.t, c.d], 1.0)?.to_dtype(dtype)?;
    let k = randn(&mut rng, &[c.b, c.kv_heads, c.t, c.d], 1.0)?.to_dtype(dtype)?;
    let v = randn(&mut rng, &[c.b, c.kv_heads, c.t, c.d], 1.0)?.to_dtype(dtype)?;
    let w = randn(&mut rng, &[c.b, c.heads, c.t, c.d], 1.0)?;
    let segments = Arc::new(Segments::new(c.t, c.segments.clone())?);
    let scale = 1.0 / (c.d as f32).sqrt();
    let mut results = Vec::new();
    for fused in [true, false] {
        let (qv, kv, vv) = (
            Var::from_tensor(&q)?,
            Var::from_tensor(&k)?,
            Var::from_tensor(&v)?,
        );
        let out = if fused {
            flash_attn(&qv, &kv, &vv, &segments, None)?
        } else {
            naive(&qv, &kv, &vv, &segments, scale)?
        };
        let loss = out.to_dtype(DType::F32)?.mul(&w)?.sum_all()?;
        let grads = loss.backward()?;
        let g = |x: &Var| -> Result<Tensor> {
            grads
                .get(x.as_tensor())
                .cloned()
                .with_context(|| format!("{}: no gradient", c.name))
        };
        results.push([out, g(&qv)?, g(&kv)?, g(&vv)?]);
    }
    let mut errs = [(0f32, 0f32); 4];
    for (i, e) in errs.iter_mut().enumerate() {
        *e = errors(&results[0][i], &results[1][i])?;
    }
    Ok(errs)
}

#[test]
fn forward_and_gradients_equal_the_unfused_path_f32() -> Result<()> {
    for (i, c) in cases().iter().enumerate() {
        let errs = run_case(c, DType::F32, 10 + i as u64)?;
        eprintln!("f32 {}: (max abs, rel) out/dq/dk/dv {errs:?}", c.name);
        for (what, (_, rel)) in ["out", "dq", "dk", "dv"].iter().zip(errs) {
            assert!(rel < 1e-5, "{} {what}: relative error {rel}", c.name);
        }
    }
    Ok(())
}

#[test]
fn forward_and_gradients_equal_the_unfused_path_bf16_f16() -> Result<()> {
    for (i, c) in cases().iter().enumerate() {
        if c.t > 200 {
            continue;
        }
        for dtype in [DType::BF16, DType::F16] {
            let errs = run_case(c, dtype, 100 + i as u64)?;
            eprintln!("{dtype:?} {}: (max abs, rel) out/dq/dk/dv {errs:?}", c.name);
            for (what, (_, rel)) in ["out", "dq", "dk", "dv"].iter().zip(errs) {
                assert!(
                    rel < 1e-2,
                    "{dtype:?} {} {what}: relative error {rel}",
                    c.name
                );
            }
        }
    }
    Ok(())
}

#[test]
fn padding_rows_are_zero_with_zero_gradients() -> Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (t, d) = (10, 8);
    let q = Var::from_tensor(&randn(&mut rng, &[1, 2, t, d], 1.0)?)?;
    let k = Var::from_tensor(&randn(&mut rng, &[1, 1, t, d], 1.0)?)?;
    let v = Var::from_tensor(&randn(&mut rng, &[1, 1, t, d], 1.0)?)?;
    let segments = Arc::new(Segments::new(t, vec![vec![(2, 5), (6, 9)]])?);
    let out = flash_attn(&q, &k, &v, &segments, None)?;
    let grads = out.sqr()?.sum_all()?.backward()?;
    for pad in [0usize, 1, 5, 9] {
        let o = out
            .narrow(2, pad, 1)?
            .abs()?
            .sum_all()?
            .to_scalar::<f32>()?;
        assert_eq!(o, 0.0, "output at padding {pad}");
        for (name, x) in [("q", &q), ("k", &k), ("v", &v)] {
            let g = grads.get(x.as_tensor()).context("gradient")?;
            let g = g.narrow(2, pad, 1)?.abs()?.sum_all()?.to_scalar::<f32>()?;
            assert_eq!(g, 0.0, "d{name} at padding {pad}");
        }
    }
    Ok(())
}

#[test]
fn non_contiguous_inputs_and_custom_scale() -> Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (t, d) = (70, 16);
    // (b, t, heads, d) transposed to (b, heads, t, d): strided views, as a model produces them.
    let q = randn(&mut rng, &[1, t, 4, d], 1.0)?.transpose(1, 2)?;
    let k = randn(&mut rng, &[1, t, 2, d], 1.0)?.transpose(1, 2)?;
    let v = randn(&mut rng, &[1, t, 2, d], 1.0)?.transpose(1, 2)?;
    assert!(!q.is_contiguous());
    let segments = Arc::new(Segments::causal(1, t));
    let ours = flash_attn(&q, &k, &v, &segments, Some(0.3))?;
    let want = naive(
        &q.contiguous()?,
        &k.contiguous()?,
        &v.contiguous()?,
        &segments,
        0.3,
    )?;
    let (_, rel) = errors(&ours, &want)?;
    assert!(rel < 1e-5, "relative error {rel}");
    Ok(())
}

#[test]
fn bad_segments_and_shapes_are_errors() -> Result<()> {
    assert!(matches!(
        Segments::new(10, vec![vec![(0, 5), (4, 10)]]),
        Err(SegmentError::Overlap { .. })
    ));
    assert!(matches!(
        Segments::new(10, vec![vec![(0, 11)]]),
        Err(SegmentError::OutOfRange { .. })
    ));
    assert!(matches!(
        Segments::new(10, vec![vec![(5, 5)]]),
        Err(SegmentError::Empty { .. })
    ));
    let msg = Segments::new(10, vec![vec![(6, 10), (0, 3)]])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("sorted") && msg.contains("row 0"), "{msg}");
    let q = Tensor::zeros((1, 4, 10, 8), DType::F32, &Device::Cpu)?;
    let k = Tensor::zeros((1, 2, 10, 8), DType::F32, &Device::Cpu)?;
    // Segments for another batch size / length.
    let wrong = Arc::new(Segments::causal(2, 10));
    let err = flash_attn(&q, &k, &k, &wrong, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("2 rows"), "{err}");
    let wrong = Arc::new(Segments::causal(1, 9));
    assert!(flash_attn(&q, &k, &k, &wrong, None).is_err());
    let ok = Arc::new(Segments::causal(1, 10));
    // 4 query heads over 3 kv heads; mismatched head dims; mixed and unsupported dtypes.
    let k3 = Tensor::zeros((1, 3, 10, 8), DType::F32, &Device::Cpu)?;
    assert!(flash_attn(&q, &k3, &k3, &ok, None).is_err());
    let k_d = Tensor::zeros((1, 2, 10, 4), DType::F32, &Device::Cpu)?;
    assert!(flash_attn(&q, &k_d, &k_d, &ok, None).is_err());
    let kb = k.to_dtype(DType::BF16)?;
    assert!(flash_attn(&q, &kb, &kb, &ok, None).is_err());
    let (qi, ki) = (q.to_dtype(DType::U32)?, k.to_dtype(DType::U32)?);
    assert!(flash_attn(&qi, &ki, &ki, &ok, None).is_err());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The model: every parameter's gradient through the fused path equals the unfused path.

fn model_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/model")
        .join(name)
}

/// Gradients of `-sum(logprobs ∘ weights)` for every parameter (as f32, by name) and the
/// weighted logprobs, through one attention path, on a batch with a left-padded, a
/// right-padded and a packed row of `t` tokens.
fn model_gradients(
    name: &str,
    dtype: DType,
    t: usize,
    attention: AttentionImpl,
) -> Result<(BTreeMap<String, Tensor>, Tensor)> {
    let (model, params) = load_trainable(&model_fixture(name), dtype, &Device::Cpu)?;
    let model = model.with_attention(attention);
    let vocab = model.config().vocab_size as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let ids: Vec<u32> = (0..3 * t).map(|_| rng.random_range(0..vocab)).collect();
    let ids = Tensor::from_vec(ids, (3, t), &Device::Cpu)?;
    // Row 0 left-padded by 9, row 1 right-padded by 13, row 2 packed 1,1,..,2,2,..,0,0,3,3,..
    let mut mask = vec![0u32; 3 * t];
    mask[9..t].fill(1);
    mask[t..2 * t - 13].fill(1);
    let (a, b) = (t / 3, 2 * t / 3);
    mask[2 * t..2 * t + a].fill(1);
    mask[2 * t + a..2 * t + b].fill(2);
    mask[2 * t + b + 2..3 * t].fill(3);
    let mask = Tensor::from_vec(mask, (3, t), &Device::Cpu)?;
    // Loss weights: target positions whose query and target are real tokens of one segment.
    let m = mask.to_vec2::<u32>()?;
    let mut w = vec![0f32; 3 * (t - 1)];
    for r in 0..3 {
        for i in 0..t - 1 {
            if m[r][i] != 0 && m[r][i] == m[r][i + 1] {
                w[r * (t - 1) + i] = 1.0;
            }
        }
    }
    let w = Tensor::from_vec(w, (3, t - 1), &Device::Cpu)?;
    let lp = model.token_logprobs(&ids, Some(&mask))?.mul(&w)?;
    let grads = lp.sum_all()?.neg()?.backward()?;
    let mut out = BTreeMap::new();
    for (pname, var) in &params.vars {
        let g = grads
            .get(var.as_tensor())
            .with_context(|| format!("{name}: no gradient for {pname}"))?;
        out.insert(pname.clone(), g.to_dtype(DType::F32)?);
    }
    Ok((out, lp))
}

/// The worst over parameters of max |a - b| / max |b|.
fn worst_relative(a: &BTreeMap<String, Tensor>, b: &BTreeMap<String, Tensor>) -> Result<f32> {
    let mut worst = 0f32;
    for (pname, g) in a {
        let (_, rel) = errors(g, &b[pname])?;
        worst = worst.max(rel);
    }
    Ok(worst)
}

#[test]
fn model_gradients_equal_the_unfused_path() -> Result<()> {
    for name in ["qwen3-untied", "qwen2-bf16", "llama"] {
        let (fused, lp_fused) = model_gradients(name, DType::F32, 70, AttentionImpl::Fused)?;
        let (unfused, lp_unfused) = model_gradients(name, DType::F32, 70, AttentionImpl::Unfused)?;
        let grad = worst_relative(&fused, &unfused)?;
        let (_, lp) = errors(&lp_fused, &lp_unfused)?;
        eprintln!("{name} f32: worst parameter gradient rel {grad}, logprobs rel {lp}");
        assert!(grad < 1e-5 && lp < 1e-5, "{name}: {grad} / {lp}");
    }
    Ok(())
}

#[test]
fn model_gradients_in_bf16() -> Result<()> {
    // Two bf16 runs of the model differ by bf16 rounding wherever they round differently (the
    // unfused path rounds its scores and probabilities to bf16, the fused op keeps them in f32),
    // so both are measured against the f32 gradients. The rest of the model in bf16 (weights,
    // projections, norms) already puts the unfused path ~5e-2 from them on the worst parameter
    // (a norm weight: a sum over every position), so 1e-2 holds for the log-probs and the op
    // itself (`forward_and_gradients_equal_the_unfused_path_bf16`), and for the gradients the
    // fused path must be no further from f32 than the unfused one.
    let name = "qwen3-tied";
    let t = 40;
    let (reference, lp_ref) = model_gradients(name, DType::F32, t, AttentionImpl::Unfused)?;
    let (fused, lp_fused) = model_gradients(name, DType::BF16, t, AttentionImpl::Fused)?;
    let (unfused, lp_unfused) = model_gradients(name, DType::BF16, t, AttentionImpl::Unfused)?;
    let (fused_err, unfused_err) = (
        worst_relative(&fused, &reference)?,
        worst_relative(&unfused, &reference)?,
    );
    let (_, lp_fused_err) = errors(&lp_fused, &lp_ref)?;
    let (_, lp_unfused_err) = errors(&lp_unfused, &lp_ref)?;
    eprintln!(
        "{name} bf16 vs f32: worst parameter gradient rel fused {fused_err} / unfused \
         {unfused_err}; logprobs rel fused {lp_fused_err} / unfused {lp_unfused_err}"
    );
    assert!(lp_fused_err < 1e-2, "logprobs {lp_fused_err}");
    assert!(
        fused_err <= unfused_err * 1.1 && fused_err < 0.1,
        "{fused_err} vs {unfused_err}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// PyTorch eager attention (scripts/gen-flash-attn-fixtures.py, torch 1.13, float32).

#[test]
fn matches_torch_eager_attention() -> Result<()> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/flash_attn");
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json"))?)?;
    let tensors = candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu)?;
    let cases = cases.as_object().context("cases.json is an object")?;
    assert!(cases.len() >= 2);
    for (name, case) in cases {
        let get = |what: &str| -> Result<Tensor> {
            tensors
                .get(&format!("{name}.{what}"))
                .cloned()
                .with_context(|| format!("{name}.{what}"))
        };
        let t = case["t"].as_u64().context("t")? as usize;
        let rows: Vec<Vec<(usize, usize)>> = serde_json::from_value(case["segments"].clone())?;
        let segments = Arc::new(Segments::new(t, rows)?);
        let (q, k, v) = (
            Var::from_tensor(&get("q")?)?,
            Var::from_tensor(&get("k")?)?,
            Var::from_tensor(&get("v")?)?,
        );
        let out = flash_attn(&q, &k, &v, &segments, None)?;
        let grads = out.mul(&get("grad_out")?)?.sum_all()?.backward()?;
        let mut report = Vec::new();
        for (what, ours) in [
            ("out", out.clone()),
            ("dq", grads.get(q.as_tensor()).context("dq")?.clone()),
            ("dk", grads.get(k.as_tensor()).context("dk")?.clone()),
            ("dv", grads.get(v.as_tensor()).context("dv")?.clone()),
        ] {
            let (abs, rel) = errors(&ours, &get(what)?)?;
            report.push((what, abs, rel));
            assert!(rel < 1e-5, "{name} {what}: max abs {abs}, rel {rel}");
        }
        eprintln!("torch {name}: {report:?}");
    }
    Ok(())
}

#[test]
fn masks_that_are_not_segments_take_the_unfused_path() -> Result<()> {
    // Segment 1 resumes after a gap: its last tokens attend across the gap, which segments
    // cannot express; the model must fall back and give the unfused result.
    let (model, _) = load_trainable(&model_fixture("qwen3-untied"), DType::F32, &Device::Cpu)?;
    let ids = Tensor::new(&[[5u32, 9, 0, 17, 33, 2, 8]], &Device::Cpu)?;
    let mask = Tensor::new(&[[1u32, 1, 0, 1, 1, 2, 2]], &Device::Cpu)?;
    let fused = model.forward_logits(&ids, Some(&mask))?;
    let unfused = model
        .clone()
        .with_attention(AttentionImpl::Unfused)
        .forward_logits(&ids, Some(&mask))?;
    let (abs, _) = errors(&fused, &unfused)?;
    assert_eq!(abs, 0.0);
    Ok(())
}
