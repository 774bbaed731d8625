//! The behaviour log-probs an actor records are the ones the learner recomputes: for a sample
//! drawn at temperature T (with top-p/top-k truncation), `log_softmax(logits / T)[token]` of
//! the full-sequence forward at that temperature, so an on-policy importance ratio is 1.

mod common;

use candle_core::{Device, Tensor};
use cascade_actor::engine::{Engine, GenParams, Job};
use cascade_actor::sampler::SamplingParams;
use cascade_shared::Mode;

fn generate(sampling: SamplingParams) -> Vec<cascade_actor::engine::Finished> {
    let mut engine = Engine::new(common::tiny_model(8, 256), 4, 3, vec![7, 9, 13, 20, 40]).unwrap();
    for p in 0..3u64 {
        engine
            .submit(Job {
                tag: p,
                prompt_id: 10 + p,
                prompt_ids: vec![1, 2 + p as u32, 30, 31 + p as u32],
                mode: Mode::NoThink,
                group_size: 3,
                params: GenParams {
                    sampling,
                    max_new_tokens: 12,
                    seed: 11,
                },
            })
            .unwrap();
    }
    engine.run_to_completion().unwrap()
}

/// Largest |behaviour − recomputed| over all response tokens, recomputing at `temperature`.
fn max_gap(finished: &[cascade_actor::engine::Finished], temperature: f32) -> f32 {
    let model = common::tiny_model(8, 256);
    let mut worst = 0f32;
    for f in finished {
        let mut ids = f.job.prompt_ids.clone();
        ids.extend_from_slice(&f.response_ids);
        let t = ids.len();
        let input = Tensor::from_vec(ids, (1, t), &Device::Cpu).unwrap();
        let mask = Tensor::ones((1, t), candle_core::DType::U8, &Device::Cpu).unwrap();
        let lp: Vec<f32> = model
            .token_logprobs_at(&input, Some(&mask), &[temperature])
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec1()
            .unwrap();
        let p = f.job.prompt_ids.len();
        for (j, &b) in f.logprobs.iter().enumerate() {
            worst = worst.max((lp[p + j - 1] - b).abs());
        }
    }
    worst
}

#[test]
fn tempered_truncated_samples_have_the_learners_tempered_logprobs() {
    let sampling = SamplingParams {
        temperature: 0.6,
        top_k: Some(50),
        top_p: Some(0.9),
    };
    assert_eq!(sampling.logprob_temperature(), 0.6);
    let finished = generate(sampling);
    assert_eq!(finished.len(), 9);
    let gap = max_gap(&finished, 0.6);
    assert!(gap < 1e-4, "tempered log-probs differ by {gap}");
    // At T = 1 the same tokens have other log-probs: the temperature is what makes them agree.
    assert!(max_gap(&finished, 1.0) > 1e-2);
}

#[test]
fn plain_and_greedy_samples_have_untempered_logprobs() {
    let plain = generate(SamplingParams::plain());
    assert!(max_gap(&plain, 1.0) < 1e-4);
    let greedy = SamplingParams::greedy();
    assert_eq!(greedy.logprob_temperature(), 1.0);
    assert!(max_gap(&generate(greedy), 1.0) < 1e-4);
}
