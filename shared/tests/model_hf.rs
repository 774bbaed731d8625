//! Our Qwen3 / Qwen2 / Llama against Hugging Face transformers on the same tiny random weights.
//! Fixtures: `scripts/gen-model-fixtures.py` (transformers 4.51.3, float32 eager attention).

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use cascade_shared::model::{argmax, load_model, load_trainable, CausalLm, DecodeBatch};

const TOL: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/model")
        .join(name)
}

struct Case {
    model: CausalLm,
    reference: HashMap<String, Tensor>,
    cases: serde_json::Value,
}

fn load(name: &str) -> Result<Case> {
    let dir = fixture(name);
    let model = load_model(&dir, &Device::Cpu).with_context(|| format!("loading {name}"))?;
    let reference =
        candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu)?;
    let cases = serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json"))?)?;
    Ok(Case {
        model,
        reference,
        cases,
    })
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    Ok((a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
}

fn row_tensor(v: &[u32]) -> Result<Tensor> {
    Ok(Tensor::new(v, &Device::Cpu)?.unsqueeze(0)?)
}

const MODELS: [&str; 4] = ["qwen3-tied", "qwen3-untied", "qwen2-bf16", "llama"];

#[test]
fn single_prompt_logits_match_transformers() -> Result<()> {
    for name in MODELS {
        let c = load(name)?;
        let input = row_tensor(&ids(&c.cases["single"]))?;
        let ours = c.model.forward_logits(&input, None)?.squeeze(0)?;
        let d = max_abs_diff(&ours, &c.reference["single.logits"])?;
        assert!(d < TOL, "{name}: max |Δlogit| = {d}");
    }
    Ok(())
}

#[test]
fn left_padded_batch_equals_unpadded_runs() -> Result<()> {
    for name in MODELS {
        let c = load(name)?;
        let a = ids(&c.cases["single"]);
        let b = ids(&c.cases["short"]);
        let pad = a.len() - b.len();
        let mut row0 = vec![0u32; pad];
        row0.extend(&b);
        let input = Tensor::new(vec![row0, a.clone()], &Device::Cpu)?;
        let mut mask = [vec![0u8; pad], vec![1u8; b.len()]].concat();
        mask.extend(vec![1u8; a.len()]);
        let mask = Tensor::from_vec(mask, (2, a.len()), &Device::Cpu)?;
        let ours = c.model.forward_logits(&input, Some(&mask))?;
        // Real positions of the padded row equal the unpadded run of `b`.
        let padded_b = ours.get(0)?.narrow(0, pad, b.len())?;
        let d_b = max_abs_diff(&padded_b, &c.reference["short.logits"])?;
        let d_a = max_abs_diff(&ours.get(1)?, &c.reference["single.logits"])?;
        // And transformers' own padded forward agrees on the real positions.
        let hf_padded = c.reference["padded.logits"]
            .get(0)?
            .narrow(0, pad, b.len())?;
        let d_hf = max_abs_diff(&padded_b, &hf_padded)?;
        assert!(
            d_a < TOL && d_b < TOL && d_hf < TOL,
            "{name}: Δ={d_a} / {d_b} / {d_hf}"
        );
        // Log-probs through the same path.
        let lp = c.model.token_logprobs(&input, Some(&mask))?;
        assert_eq!(lp.dims(), &[2, a.len() - 1]);
    }
    Ok(())
}

#[test]
fn twelve_greedy_steps_with_kv_cache_equal_full_forward() -> Result<()> {
    for name in MODELS {
        let c = load(name)?;
        let prompt = ids(&c.cases["greedy_prompt"]);
        let expected = ids(&c.cases["greedy_generated"]);
        let full = &c.reference["greedy.full_logits"];
        let mut batch = DecodeBatch::new(1);
        let mut logits = c.model.prefill(&mut batch, &[(0, &prompt)])?;
        let mut generated = Vec::new();
        for step in 0..12 {
            let want = full.get(prompt.len() - 1 + step)?;
            let d = max_abs_diff(&logits.squeeze(0)?, &want)?;
            assert!(d < TOL, "{name} step {step}: max |Δlogit| = {d}");
            let tok = argmax(&logits.squeeze(0)?.to_vec1::<f32>()?);
            generated.push(tok);
            logits = c.model.decode_step(&mut batch, &[(0, tok)])?;
        }
        assert_eq!(
            generated, expected,
            "{name}: greedy tokens differ from transformers"
        );
    }
    Ok(())
}

/// A decode batch with a KV budget one block above what one row's 12 steps need: the
/// transformers logits through
/// cache blocks shared with another row; a prefill or a step the free blocks cannot hold is a
/// `KvFull` error that changes nothing, and releasing a row frees its blocks for the next step.
#[test]
fn a_budgeted_kv_cache_refuses_what_it_cannot_hold_and_changes_nothing() -> Result<()> {
    let c = load("qwen3-tied")?;
    let prompt = ids(&c.cases["greedy_prompt"]);
    let full = &c.reference["greedy.full_logits"];
    let blocks = DecodeBatch::blocks_for(prompt.len() + 12) + 1;
    let mut batch = DecodeBatch::with_kv_budget(2, blocks * 16);
    assert_eq!(batch.kv_budget(), Some(blocks * 16));
    let mut logits = c.model.prefill(&mut batch, &[(0, &prompt)])?;
    assert_eq!(
        batch.capacity(),
        blocks * 16,
        "the whole budget is allocated at once"
    );
    let free = blocks - DecodeBatch::blocks_for(prompt.len());
    assert_eq!(batch.free_blocks(), Some(free));
    // A prompt longer than the free blocks: refused, nothing changes.
    let long: Vec<u32> = (0..free as u32 * 16 + 1).map(|i| i % 50 + 1).collect();
    let err = c.model.prefill(&mut batch, &[(1, &long)]).unwrap_err();
    assert!(err.to_string().contains("KV cache is full"), "{err}");
    assert!(!batch.is_active(1));
    assert_eq!(batch.free_blocks(), Some(free));
    // A second row of one full block shares the pool; its next token needs a second block.
    let other: Vec<u32> = (0..16).map(|i| i * 3 + 2).collect();
    let mut other_logits = c.model.prefill(&mut batch, &[(1, &other)])?;
    let mut step = 0;
    let tok = |l: &Tensor| -> Result<u32> { Ok(argmax(&l.squeeze(0)?.to_vec1::<f32>()?)) };
    loop {
        let want = full.get(prompt.len() - 1 + step)?;
        let d = max_abs_diff(&logits.squeeze(0)?, &want)?;
        assert!(d < TOL, "step {step}: max |Δlogit| = {d}");
        if step == 12 {
            break;
        }
        let feed = if batch.is_active(1) {
            vec![(0, tok(&logits)?), (1, tok(&other_logits)?)]
        } else {
            vec![(0, tok(&logits)?)]
        };
        match c.model.decode_step(&mut batch, &feed) {
            Ok(l) => {
                logits = l.narrow(0, 0, 1)?;
                if batch.is_active(1) {
                    other_logits = l.narrow(0, 1, 1)?;
                }
                step += 1;
            }
            Err(e) => {
                // Out of blocks: nothing was written; free the second row and retry.
                assert!(e.to_string().contains("KV cache is full"), "{e}");
                assert!(batch.is_active(1), "only a shared cache runs out");
                assert_eq!(batch.free_blocks(), Some(0));
                let len0 = batch.seq_len(0);
                batch.release(1);
                assert_eq!(batch.seq_len(0), len0);
                assert!(batch.free_blocks() > Some(0));
            }
        }
    }
    assert!(
        !batch.is_active(1),
        "the budget ran out while both rows decoded"
    );
    Ok(())
}

#[test]
fn rows_forked_from_a_prompt_share_its_full_blocks_and_decode_like_transformers() -> Result<()> {
    let c = load("qwen3-tied")?;
    let prompt = ids(&c.cases["greedy_prompt"]);
    let full = &c.reference["greedy.full_logits"];
    let (whole, part) = (
        prompt.len() / 16,
        DecodeBatch::blocks_for_fork(prompt.len()),
    );
    // Room for the prompt, two forks and 12 steps of each fork, nothing more.
    let blocks = whole + 2 * DecodeBatch::blocks_for(prompt.len() + 12 - whole * 16);
    let mut batch = DecodeBatch::with_kv_budget(3, blocks * 16);
    let first = c.model.prefill(&mut batch, &[(0, &prompt)])?;
    let used = batch.blocks_in_use();
    assert_eq!(used, DecodeBatch::blocks_for(prompt.len()));
    // Bad forks are refused and change nothing.
    assert!(
        batch.fork(&c.model, 1, 2, 1).is_err(),
        "slot 1 holds nothing"
    );
    assert!(batch.fork(&c.model, 0, 1, prompt.len() + 1).is_err());
    assert!(batch.fork(&c.model, 0, 0, 1).is_err());
    assert_eq!(batch.blocks_in_use(), used);
    batch.fork(&c.model, 0, 1, prompt.len())?;
    batch.fork(&c.model, 0, 2, prompt.len())?;
    assert_eq!(
        batch.blocks_in_use(),
        used + 2 * part,
        "the full blocks are shared, the partly filled one is copied"
    );
    // The prompt's own row ends; its full blocks stay with the forks.
    batch.release(0);
    assert_eq!(batch.blocks_in_use(), whole + 2 * part);
    assert_eq!(batch.seq_len(1), prompt.len());
    let tok = |l: &Tensor| -> Result<u32> { Ok(argmax(&l.squeeze(0)?.to_vec1::<f32>()?)) };
    let mut logits = (first.clone(), first);
    for step in 0..=12 {
        let want = full.get(prompt.len() - 1 + step)?;
        for (row, l) in [&logits.0, &logits.1].into_iter().enumerate() {
            let d = max_abs_diff(&l.squeeze(0)?, &want)?;
            assert!(d < TOL, "fork {row}, step {step}: max |Δlogit| = {d}");
        }
        if step == 12 {
            break;
        }
        let l = c
            .model
            .decode_step(&mut batch, &[(1, tok(&logits.0)?), (2, tok(&logits.1)?)])?;
        logits = (l.narrow(0, 0, 1)?, l.narrow(0, 1, 1)?);
    }
    assert_eq!(batch.free_blocks(), Some(0), "the budget was exact");
    // With no free block, a fork that needs one is refused.
    if part > 0 {
        let err = batch.fork(&c.model, 1, 0, prompt.len()).unwrap_err();
        assert!(err.to_string().contains("KV cache is full"), "{err}");
        assert!(!batch.is_active(0));
    }
    batch.release(1);
    batch.release(2);
    assert_eq!(batch.blocks_in_use(), 0);
    assert_eq!(batch.free_blocks(), Some(blocks));
    Ok(())
}

#[test]
fn three_hundred_token_sequence() -> Result<()> {
    for name in ["qwen3-tied", "qwen2-bf16"] {
        let c = load(name)?;
        let seq = ids(&c.cases["long"]);
        let input = row_tensor(&seq)?;
        let lp = c.model.token_logprobs(&input, None)?.squeeze(0)?;
        let d = max_abs_diff(&lp, &c.reference["long.next_logprobs"])?;
        assert!(d < TOL, "{name}: max |Δlogprob| = {d}");
        let logits = c.model.forward_logits(&input, None)?.squeeze(0)?;
        let rows = logits.index_select(&Tensor::new(&[0u32, 150, 299], &Device::Cpu)?, 0)?;
        let d = max_abs_diff(&rows, &c.reference["long.rows"])?;
        assert!(d < TOL, "{name}: max |Δlogit| = {d}");
    }
    Ok(())
}

#[test]
fn long_prompts_prefilled_in_chunks_match_transformers() -> Result<()> {
    for name in ["qwen3-tied", "qwen2-bf16"] {
        let c = load(name)?;
        let seq = ids(&c.cases["long"]);
        let want = &c.reference["long.rows"]; // the logits after tokens 0, 150 and 299
        for chunk in [1usize, 16, 64, 151, 300] {
            let mut batch = DecodeBatch::new(2);
            batch.set_prefill_chunk(chunk);
            let both = c
                .model
                .prefill(&mut batch, &[(0, &seq[..151]), (1, &seq[..300])])?;
            for (row, at) in [(0usize, 1usize), (1, 2)] {
                let d = max_abs_diff(&both.get(row)?, &want.get(at)?)?;
                assert!(
                    d < TOL,
                    "{name}, chunks of {chunk}, row {row}: max |Δlogit| = {d}"
                );
            }
            assert_eq!((batch.seq_len(0), batch.seq_len(1)), (151, 300));
            // The first row goes on from its cache: the rest of the sequence in one call.
            let rest = c.model.extend(&mut batch, &[(0, &seq[151..300])])?;
            let d = max_abs_diff(&rest.squeeze(0)?, &want.get(2)?)?;
            assert!(
                d < TOL,
                "{name}, extended after chunks of {chunk}: max |Δlogit| = {d}"
            );
        }
        // Extend refuses what it cannot do, and changes nothing.
        let mut batch = DecodeBatch::with_kv_budget(2, 160);
        c.model.prefill(&mut batch, &[(0, &seq[..1])])?;
        assert!(
            c.model.extend(&mut batch, &[(1, &seq[..2])]).is_err(),
            "slot 1 is empty"
        );
        assert!(c.model.extend(&mut batch, &[(0, &[])]).is_err());
        let err = c
            .model
            .extend(&mut batch, &[(0, &seq[1..200])])
            .unwrap_err();
        assert!(err.to_string().contains("KV cache is full"), "{err}");
        assert_eq!(batch.seq_len(0), 1);
        assert_eq!(batch.blocks_in_use(), 1);
    }
    // Greedy decoding after a prompt prefilled 5 tokens at a time.
    let c = load("qwen3-tied")?;
    let prompt = ids(&c.cases["greedy_prompt"]);
    let full = &c.reference["greedy.full_logits"];
    let mut batch = DecodeBatch::new(1);
    batch.set_prefill_chunk(5);
    let mut logits = c.model.prefill(&mut batch, &[(0, &prompt)])?;
    for step in 0..=8 {
        let d = max_abs_diff(&logits.squeeze(0)?, &full.get(prompt.len() - 1 + step)?)?;
        assert!(d < TOL, "step {step}: max |Δlogit| = {d}");
        let tok = argmax(&logits.squeeze(0)?.to_vec1::<f32>()?);
        logits = c.model.decode_step(&mut batch, &[(0, tok)])?;
    }
    Ok(())
}

#[test]
fn ragged_batch_decoding_with_refill_matches_single_runs() -> Result<()> {
    // Three sequences of different lengths in a 2-slot batch: the third enters when the first
    // finishes (continuous batching). Each must produce exactly its single-sequence logits.
    let c = load("qwen3-untied")?;
    let prompts = [
        ids(&c.cases["single"]),
        ids(&c.cases["short"]),
        ids(&c.cases["greedy_prompt"]),
    ];
    let steps = [3usize, 40, 7];
    let single = |p: &[u32], n: usize| -> Result<Vec<Vec<f32>>> {
        let mut b = DecodeBatch::new(1);
        let mut l = c.model.prefill(&mut b, &[(0, p)])?;
        let mut rows = vec![l.squeeze(0)?.to_vec1::<f32>()?];
        for _ in 0..n {
            let t = argmax(rows.last().unwrap());
            l = c.model.decode_step(&mut b, &[(0, t)])?;
            rows.push(l.squeeze(0)?.to_vec1::<f32>()?);
        }
        Ok(rows)
    };
    let expected: Vec<_> = (0..3)
        .map(|i| single(&prompts[i], steps[i]))
        .collect::<Result<_>>()?;
    let mut batch = DecodeBatch::new(2);
    let first = c
        .model
        .prefill(&mut batch, &[(0, &prompts[0]), (1, &prompts[1])])?;
    let mut got: Vec<Vec<Vec<f32>>> = vec![
        vec![first.get(0)?.to_vec1()?],
        vec![first.get(1)?.to_vec1()?],
        vec![],
    ];
    let mut slot_seq = [Some(0usize), Some(1)];
    loop {
        // Retire finished sequences and refill their slot with the waiting one.
        for (slot, occupant) in slot_seq.iter_mut().enumerate() {
            if let Some(seq) = *occupant {
                if got[seq].len() == steps[seq] + 1 {
                    batch.release(slot);
                    *occupant = None;
                    if got[2].is_empty() {
                        let l = c.model.prefill(&mut batch, &[(slot, &prompts[2])])?;
                        got[2].push(l.squeeze(0)?.to_vec1()?);
                        *occupant = Some(2);
                    }
                }
            }
        }
        let feed: Vec<(usize, u32)> = (0..2)
            .filter_map(|s| slot_seq[s].map(|q| (s, argmax(got[q].last().unwrap()))))
            .collect();
        if feed.is_empty() {
            break;
        }
        let l = c.model.decode_step(&mut batch, &feed)?;
        for (i, (slot, _)) in feed.iter().enumerate() {
            got[slot_seq[*slot].unwrap()].push(l.get(i)?.to_vec1()?);
        }
    }
    for q in 0..3 {
        assert_eq!(got[q].len(), expected[q].len());
        for (a, b) in got[q].iter().zip(&expected[q]) {
            let d = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(d < TOL, "sequence {q}: {d}");
        }
    }
    Ok(())
}

#[test]
fn every_parameter_receives_a_gradient() -> Result<()> {
    for name in ["qwen3-untied", "qwen2-bf16", "llama"] {
        let (model, params) = load_trainable(&fixture(name), DType::F32, &Device::Cpu)?;
        let input = Tensor::new(
            &[[3u32, 17, 99, 5, 42, 7], [0, 0, 8, 9, 10, 11]],
            &Device::Cpu,
        )?;
        let mask = Tensor::new(&[[1u8, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], &Device::Cpu)?;
        let loss = model
            .token_logprobs(&input, Some(&mask))?
            .sum_all()?
            .neg()?;
        let grads = loss.backward()?;
        for (pname, var) in &params.vars {
            let g = grads
                .get(var.as_tensor())
                .with_context(|| format!("{name}: no gradient for {pname}"))?;
            let norm = g.sqr()?.sum_all()?.to_scalar::<f32>()?;
            assert!(
                norm > 0.0 && norm.is_finite(),
                "{name}: gradient of {pname} is {norm}"
            );
        }
    }
    Ok(())
}

#[test]
fn too_long_is_an_error_not_a_panic() -> Result<()> {
    let c = load("llama")?;
    let seq = vec![1u32; 513];
    let err = c
        .model
        .forward_logits(&row_tensor(&seq)?, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("513") && err.contains("512"), "{err}");
    let mut batch = DecodeBatch::new(1);
    let err = c
        .model
        .prefill(&mut batch, &[(0, &seq)])
        .unwrap_err()
        .to_string();
    assert!(err.contains("context"), "{err}");
    let bad = c
        .model
        .forward_logits(&row_tensor(&[1, 5000])?, None)
        .unwrap_err()
        .to_string();
    assert!(bad.contains("5000"), "{bad}");
    Ok(())
}
