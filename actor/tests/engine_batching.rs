//! The engine's continuous batching: layout-independent draws, distinct group samples,
//! finish reasons, skipped prompts, weight swaps mid-sequence.

mod common;

use cascade_actor::engine::{Engine, Finished, GenParams, Job};
use cascade_actor::sampler::SamplingParams;
use cascade_shared::{FinishReason, Mode, VersionSpan};

fn params(max_new_tokens: usize) -> GenParams {
    GenParams {
        sampling: SamplingParams {
            temperature: 1.0,
            top_k: Some(50),
            top_p: Some(0.95),
        },
        max_new_tokens,
        seed: 7,
    }
}

fn job(prompt_id: u64, len: usize, group_size: usize, max_new: usize) -> Job {
    Job {
        tag: prompt_id,
        prompt_id,
        prompt_ids: (0..len as u32)
            .map(|i| (i * 7 + prompt_id as u32 * 13) % 250)
            .collect(),
        mode: Mode::Think,
        group_size,
        params: params(max_new),
    }
}

fn key(f: &Finished) -> (u64, usize) {
    (f.job.prompt_id, f.sample_index)
}

#[test]
fn continuous_batching_gives_the_tokens_of_generating_alone() {
    let stop = vec![3, 5, 11];
    // Batched: 5 prompts of different lengths and budgets through 3 slots (refills happen).
    let mut batched = Engine::new(common::tiny_model(1, 256), 0, 3, stop.clone()).unwrap();
    let jobs: Vec<Job> = (0..5)
        .map(|p| job(p, 3 + 4 * p as usize, 2, 6 + 5 * p as usize))
        .collect();
    for j in &jobs {
        assert!(batched.submit(j.clone()).unwrap());
    }
    let mut out = batched.run_to_completion().unwrap();
    assert_eq!(out.len(), 10);
    assert!(batched.stats().prefills > 1, "rows were refilled");
    out.sort_by_key(key);
    // Alone: each sample in a one-slot engine with the same keys.
    let mut total = 0;
    let mut same = 0;
    for f in &out {
        let mut alone = Engine::new(common::tiny_model(1, 256), 0, 1, stop.clone()).unwrap();
        let mut j = f.job.as_ref().clone();
        j.group_size = 2; // same key streams
        alone.submit(j).unwrap();
        let single: Vec<Finished> = alone.run_to_completion().unwrap();
        let s = single
            .iter()
            .find(|s| s.sample_index == f.sample_index)
            .unwrap();
        total += 1;
        if s.response_ids == f.response_ids {
            same += 1;
            assert_eq!(s.finish_reason, f.finish_reason);
            for (a, b) in s.logprobs.iter().zip(&f.logprobs) {
                assert!((a - b).abs() < 1e-4, "log-prob {a} vs {b}");
            }
        }
    }
    assert_eq!(same, total, "every sample identical to generating it alone");
}

#[test]
fn the_g_samples_of_a_prompt_differ() {
    let mut e = Engine::new(common::tiny_model(2, 256), 0, 8, vec![]).unwrap();
    e.submit(job(42, 10, 8, 12)).unwrap();
    let out = e.run_to_completion().unwrap();
    assert_eq!(out.len(), 8);
    let mut responses: Vec<&Vec<u32>> = out.iter().map(|f| &f.response_ids).collect();
    responses.sort();
    responses.dedup();
    assert_eq!(responses.len(), 8, "all G samples distinct");
}

#[test]
fn finish_reasons_and_lengths() {
    // No stop tokens: every sample runs to its budget.
    let mut e = Engine::new(common::tiny_model(3, 256), 0, 4, vec![]).unwrap();
    e.submit(job(0, 5, 4, 9)).unwrap();
    for f in e.run_to_completion().unwrap() {
        assert_eq!(f.finish_reason, FinishReason::Length);
        assert_eq!(f.response_ids.len(), 9);
        assert_eq!(f.logprobs.len(), 9);
        assert!(f.logprobs.iter().all(|l| *l <= 0.0 && l.is_finite()));
        assert_eq!(
            f.versions,
            vec![VersionSpan {
                start_token: 0,
                version: 0
            }]
        );
    }
    // Half the vocabulary stops: samples end early at a stop token, which is kept.
    let stop: Vec<u32> = (0..132).collect();
    let mut e = Engine::new(common::tiny_model(3, 256), 0, 4, stop.clone()).unwrap();
    e.submit(job(1, 5, 16, 40)).unwrap();
    let out = e.run_to_completion().unwrap();
    let stopped: Vec<&Finished> = out
        .iter()
        .filter(|f| f.finish_reason == FinishReason::Stop)
        .collect();
    assert!(
        stopped.len() >= 12,
        "most samples stop early ({} of 16)",
        stopped.len()
    );
    for f in stopped {
        let last = *f.response_ids.last().unwrap();
        assert!(stop.contains(&last));
        assert!(f.response_ids[..f.response_ids.len() - 1]
            .iter()
            .all(|t| !stop.contains(t)));
    }
    // The end of the context stops a sample too (finish reason Length).
    let mut e = Engine::new(common::tiny_model(3, 24), 0, 2, vec![]).unwrap();
    e.submit(job(2, 20, 2, 100)).unwrap();
    for f in e.run_to_completion().unwrap() {
        assert_eq!(f.finish_reason, FinishReason::Length);
        assert_eq!(f.response_ids.len(), 4);
    }
}

#[test]
fn prompts_longer_than_the_context_are_skipped_and_counted() {
    let mut e = Engine::new(common::tiny_model(4, 32), 0, 2, vec![]).unwrap();
    assert!(!e.submit(job(0, 40, 2, 4)).unwrap());
    assert!(!e.submit(job(1, 32, 2, 4)).unwrap());
    assert!(e.submit(job(2, 8, 2, 4)).unwrap());
    assert_eq!(e.stats().skipped_prompts, 2);
    let skipped = e.take_skipped();
    assert_eq!(
        skipped.iter().map(|s| s.prompt_id).collect::<Vec<_>>(),
        vec![0, 1]
    );
    let out = e.run_to_completion().unwrap();
    assert_eq!(out.len(), 2);
}

#[test]
fn a_weight_swap_mid_sequence_is_recorded_per_token() {
    let mut e = Engine::new(common::tiny_model(5, 256), 3, 2, vec![]).unwrap();
    e.submit(job(0, 6, 2, 10)).unwrap();
    let mut out = Vec::new();
    for _ in 0..3 {
        out.extend(e.step().unwrap());
    }
    e.swap_model(common::tiny_model(6, 256), 4).unwrap();
    out.extend(e.run_to_completion().unwrap());
    assert_eq!(out.len(), 2);
    for f in out {
        // Step 1 drew tokens 0 and 1 (prefill + decode), steps 2-3 tokens 2 and 3.
        assert_eq!(
            f.versions,
            vec![
                VersionSpan {
                    start_token: 0,
                    version: 3
                },
                VersionSpan {
                    start_token: 4,
                    version: 4
                }
            ]
        );
        assert_eq!(f.response_ids.len(), 10);
    }
    // Weights of another shape are refused.
    let other = {
        let mut cfg = common::tiny_config(256);
        cfg.num_hidden_layers = 3;
        let w = cascade_shared::model::random_weights(&cfg, 0, &candle_core::Device::Cpu).unwrap();
        cascade_shared::model::CausalLm::from_tensors(&cfg, &w).unwrap()
    };
    assert!(e.swap_model(other, 9).is_err());
    assert_eq!(e.version(), 4);
}

#[test]
fn the_samples_of_a_prompt_share_its_cache_and_give_the_same_tokens() {
    // Prompts of 5, 16, 21, 32 and 40 tokens (whole blocks and partly filled ones), 4 samples
    // each; 20 slots hold every row at once, 6 slots refill, a small cache also preempts.
    let lens = [5usize, 16, 21, 32, 40];
    let jobs: Vec<Job> = lens
        .iter()
        .enumerate()
        .map(|(p, &len)| job(p as u64, len, 4, 30))
        .collect();
    let prompts: u64 = lens.iter().map(|&l| l as u64).sum();
    for (slots, kv) in [(20, None), (6, None), (6, Some(12 * 16))] {
        let (shared, s) = generate_with(&jobs, slots, kv, true);
        let (alone, a) = generate_with(&jobs, slots, kv, false);
        assert_eq!(a.shared_prompts, 0);
        assert!(
            s.shared_prompts > 0,
            "{slots} slots: nothing shared ({s:?})"
        );
        assert!(s.prefill_tokens < a.prefill_tokens, "{s:?} vs {a:?}");
        if slots == 20 {
            assert_eq!(s.prefill_tokens, prompts, "each prompt runs once");
            assert_eq!(s.shared_prompts, 15);
            assert_eq!(a.prefill_tokens, 4 * prompts);
        }
        if kv.is_some() {
            assert!(s.preemptions > 0 && a.preemptions > 0, "{s:?} {a:?}");
        }
        assert_eq!(shared.len(), 20);
        for (x, y) in shared.iter().zip(&alone) {
            assert_eq!(key(x), key(y));
            assert_eq!(
                x.response_ids,
                y.response_ids,
                "{slots} slots, sample {:?}: a shared prompt cache gives the tokens of a \
                 prefill of its own",
                key(x)
            );
            assert_eq!(x.finish_reason, y.finish_reason);
            for (p, q) in x.logprobs.iter().zip(&y.logprobs) {
                assert!((p - q).abs() < 1e-4, "log-prob {p} vs {q}");
            }
        }
    }
}

#[test]
fn a_preempted_sample_resumes_from_its_siblings_prompt_cache() {
    // 8 blocks of 16 tokens, 3 slots: prompt 1 (4 tokens, 1 sample, 44 new) and prompt 2 (20
    // tokens, 2 samples sharing the first block, 60 new). At 28 new tokens the three rows
    // need 10 blocks: the newest, prompt 2's second sample, is preempted. When prompt 1's row
    // ends it comes back while its sibling is in flight: from the sibling's prompt cache, with
    // only its response run through the model.
    let jobs = [job(1, 4, 1, 44), job(2, 20, 2, 60)];
    let run = |share: bool| {
        let mut e =
            Engine::with_kv_budget(common::tiny_model(1, 256), 0, 3, vec![], 8 * 16).unwrap();
        e.set_prompt_sharing(share);
        for j in &jobs {
            assert!(e.submit(j.clone()).unwrap());
        }
        let mut out = e.run_to_completion().unwrap();
        out.sort_by_key(key);
        (out, e.stats())
    };
    let (shared, s) = run(true);
    let (alone, a) = run(false);
    assert!(s.preemptions >= 1 && s.resumed >= 1, "{s:?}");
    assert!(a.preemptions >= 1 && a.resumed == 0, "{a:?}");
    assert!(s.prefill_tokens < a.prefill_tokens, "{s:?} vs {a:?}");
    assert_eq!(shared.len(), 3);
    for (x, y) in shared.iter().zip(&alone) {
        assert_eq!(key(x), key(y));
        assert_eq!(x.response_ids, y.response_ids, "sample {:?}", key(x));
        for (p, q) in x.logprobs.iter().zip(&y.logprobs) {
            assert!((p - q).abs() < 1e-4, "log-prob {p} vs {q}");
        }
    }
}

#[test]
fn after_a_weight_swap_queued_samples_do_not_start_from_the_old_prompt_cache() {
    let mut e = Engine::new(common::tiny_model(1, 256), 0, 2, vec![]).unwrap();
    assert!(e.submit(job(1, 21, 4, 6)).unwrap());
    e.step().unwrap(); // samples 0 and 1 in flight, the second from the first's prompt cache
    assert_eq!(e.stats().prefill_tokens, 21);
    assert_eq!(e.stats().shared_prompts, 1);
    e.swap_model(common::tiny_model(2, 256), 1).unwrap();
    let out = e.run_to_completion().unwrap();
    assert_eq!(out.len(), 4);
    // Samples 2 and 3 enter under version 1: one more prefill, shared by the other.
    assert_eq!(e.stats().prefill_tokens, 42, "{:?}", e.stats());
    assert_eq!(e.stats().shared_prompts, 2);
    for f in out.iter().filter(|f| f.sample_index >= 2) {
        assert_eq!(f.versions.len(), 1);
        assert_eq!(f.versions[0].version, 1);
    }
}

/// Runs `jobs` through an engine of `slots` rows with a KV cache of `kv_tokens` (`None`: grows
/// as needed); the samples sorted by key, and the engine's counters.
fn generate(
    jobs: &[Job],
    slots: usize,
    kv_tokens: Option<usize>,
) -> (Vec<Finished>, cascade_actor::engine::EngineStats) {
    generate_with(jobs, slots, kv_tokens, true)
}

/// [`generate`], the samples of a prompt sharing its cache or each prefilled on its own.
fn generate_with(
    jobs: &[Job],
    slots: usize,
    kv_tokens: Option<usize>,
    share_prompts: bool,
) -> (Vec<Finished>, cascade_actor::engine::EngineStats) {
    let stop = vec![3, 5, 11];
    let model = common::tiny_model(1, 256);
    let mut e = match kv_tokens {
        Some(t) => Engine::with_kv_budget(model, 0, slots, stop, t).unwrap(),
        None => Engine::new(model, 0, slots, stop).unwrap(),
    };
    e.set_prompt_sharing(share_prompts);
    for j in jobs {
        assert!(e.submit(j.clone()).unwrap());
    }
    let mut out = e.run_to_completion().unwrap();
    out.sort_by_key(key);
    (out, e.stats())
}

#[test]
fn a_kv_cache_too_small_for_every_row_preempts_and_gives_the_same_tokens() {
    // 6 prompts × 2 samples, prompts of 3..23 tokens, up to 40 new tokens, through 6 slots:
    // at their longest the rows need far more than 8 blocks of 16 tokens.
    let jobs: Vec<Job> = (0..6).map(|p| job(p, 3 + 4 * p as usize, 2, 40)).collect();
    let (ample, ample_stats) = generate(&jobs, 6, None);
    let (small, small_stats) = generate(&jobs, 6, Some(8 * 16));
    assert_eq!(ample_stats.preemptions, 0);
    assert!(
        small_stats.preemptions > 0,
        "the small cache preempted no row ({small_stats:?})"
    );
    assert_eq!(ample.len(), 12);
    assert_eq!(small.len(), 12);
    for (a, b) in ample.iter().zip(&small) {
        assert_eq!(key(a), key(b));
        assert_eq!(
            a.response_ids,
            b.response_ids,
            "sample {:?}: a preempted row is prefilled again with what it generated and goes \
             on with the same keys",
            key(a)
        );
        assert_eq!(a.finish_reason, b.finish_reason);
        assert_eq!(a.versions, b.versions);
        for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
            assert!((x - y).abs() < 1e-4, "log-prob {x} vs {y}");
        }
    }
}

#[test]
fn a_row_that_cannot_fit_the_kv_cache_alone_is_refused_by_name() {
    let model = common::tiny_model(1, 256);
    let mut e = Engine::with_kv_budget(model, 0, 2, vec![], 64).unwrap();
    // 20 prompt + 40 response tokens fit 64; 30 + 40 do not.
    assert!(e.submit(job(1, 20, 2, 40)).unwrap());
    let err = e.submit(job(2, 30, 2, 40)).unwrap_err().to_string();
    assert!(
        err.contains("prompt 2")
            && err.contains("30 prompt + 40 response tokens")
            && err.contains("actor.kv_cache_tokens"),
        "{err}"
    );
    assert!(Engine::with_kv_budget(common::tiny_model(1, 256), 0, 2, vec![], 0).is_err());
}
