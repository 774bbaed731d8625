//! The reward-model verifier against Hugging Face transformers: `RewardModel::load` reads a
//! `Qwen3ForSequenceClassification` (`num_labels = 1`) checkpoint saved by transformers (no
//! `lm_head.weight`, untied config) and scores (prompt, response) pairs like transformers does.
//! Fixture: tests/fixtures/rm/, made by scripts/gen-rm-fixtures.py.

use std::path::PathBuf;

use candle_core::Device;
use cascade_actor::reward_model::RewardModel;
use cascade_rewards::Verifier;
use cascade_shared::chat::split_response;
use serde_json::{json, Value};

const TOL: f32 = 1e-4;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/rm")
}

struct Case {
    prompt: String,
    response: String,
    ids: Vec<u32>,
    score: f32,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(fixture().join("cases.json")).expect("cases.json");
    let v: Value = serde_json::from_str(&text).expect("valid JSON");
    v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| Case {
            prompt: c["prompt"].as_str().unwrap().to_string(),
            response: c["response"].as_str().unwrap().to_string(),
            ids: c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect(),
            score: c["score"].as_f64().unwrap() as f32,
        })
        .collect()
}

fn load() -> RewardModel {
    RewardModel::load(&fixture().join("model"), &Device::Cpu).expect("the HF checkpoint loads")
}

#[test]
fn encodes_pairs_like_transformers_chat_template() {
    let rm = load();
    for c in cases() {
        assert_eq!(
            rm.encode_pair(&c.prompt, &c.response).unwrap(),
            c.ids,
            "ids of {:?}",
            c.prompt
        );
    }
}

#[test]
fn scores_equal_transformers_single_and_batched() {
    let cases = cases();
    assert!(cases.len() >= 3);
    let lengths: std::collections::BTreeSet<usize> = cases.iter().map(|c| c.ids.len()).collect();
    assert_eq!(
        lengths.len(),
        cases.len(),
        "lengths differ, so padding is exercised"
    );
    let spread = cases.iter().map(|c| c.score).fold(f32::MIN, f32::max)
        - cases.iter().map(|c| c.score).fold(f32::MAX, f32::min);
    assert!(spread > 1.0, "scores differ between pairs: {spread}");
    // Any two reference scores are far apart at TOL, so the per-case comparisons below also
    // catch rows that batching or padding mixes up.
    for (i, a) in cases.iter().enumerate() {
        for b in &cases[i + 1..] {
            assert!(
                (a.score - b.score).abs() > 100.0 * TOL,
                "the fixture's scores of {:?} and {:?} are too close: {} vs {}",
                a.prompt,
                b.prompt,
                a.score,
                b.score
            );
        }
    }
    for max_batch in [1, 2, 16] {
        let rm = load().with_max_batch(max_batch);
        let pairs: Vec<(&str, &str)> = cases
            .iter()
            .map(|c| (c.prompt.as_str(), c.response.as_str()))
            .collect();
        let ours = rm.score_pairs(&pairs).unwrap();
        let worst = ours
            .iter()
            .zip(&cases)
            .map(|(s, c)| (s - c.score).abs())
            .fold(0.0, f32::max);
        eprintln!("max_batch {max_batch}: max |Δ score| {worst:.2e}");
        for (c, s) in cases.iter().zip(&ours) {
            assert!(
                (s - c.score).abs() < TOL,
                "max_batch {max_batch}, {:?}: ours {s}, transformers {}",
                c.prompt,
                c.score
            );
        }
        // The same from the fixture's ids (transformers' tokenization).
        let ids: Vec<Vec<u32>> = cases.iter().map(|c| c.ids.clone()).collect();
        let from_ids = rm.score_ids(&ids).unwrap();
        for (a, b) in ours.iter().zip(&from_ids) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }
}

#[test]
fn verifier_reward_is_the_score_of_the_final_answer() {
    let rm = load();
    let c = &cases()[2];
    let response = format!("<think>\nsome reasoning\n</think>\n\n{}", c.response);
    let reward = rm
        .verify(&json!({"prompt": c.prompt}), &split_response(&response))
        .unwrap();
    assert!(
        (reward.reward - c.score).abs() < TOL,
        "{} vs {}",
        reward.reward,
        c.score
    );
    assert_eq!(reward.details["has_answer"], json!(true));
}

/// An IF stage with `rm_weight > 0` scores `rule_weight × rule + rm_weight × rm`, the RM part
/// being transformers' score of the final answer; the rule part and the RM score are in the
/// details (the stage's reward breakdown). Without `rm_weight` the reward is the rule alone.
#[test]
fn if_stage_blends_the_rule_reward_with_the_reward_model_score() {
    use cascade_actor::verifiers::verifier_for;
    use cascade_shared::config::VerifierConfig;
    use cascade_shared::StageKind;
    let model = fixture().join("model");
    let blended = verifier_for(
        StageKind::If,
        &VerifierConfig {
            rm_weight: 0.25,
            rule_weight: 2.0,
            ..VerifierConfig::default()
        },
        Some(&model),
        None,
        &Device::Cpu,
    )
    .unwrap();
    let rule_only = verifier_for(
        StageKind::If,
        &VerifierConfig::default(),
        Some(&model),
        None,
        &Device::Cpu,
    )
    .unwrap();
    assert_eq!(blended.name(), "if");
    let mut rules = std::collections::BTreeSet::new();
    for c in cases() {
        let reference = json!({
            "prompt": c.prompt,
            "instruction_id_list": ["punctuation:no_comma"],
            "kwargs": [{}],
        });
        let response = split_response(&c.response);
        let rule = rule_only.verify(&reference, &response).unwrap().reward;
        rules.insert((rule * 4.0) as i32);
        let got = blended.verify(&reference, &response).unwrap();
        let want = 2.0 * rule + 0.25 * c.score;
        assert!(
            (got.reward - want).abs() < TOL,
            "{:?}: {} vs 2 × {rule} + 0.25 × {}",
            c.prompt,
            got.reward,
            c.score
        );
        assert_eq!(got.details["rule_reward"], json!(rule));
        assert!((got.details["rm_score"].as_f64().unwrap() as f32 - c.score).abs() < TOL);
        assert!(got.details["follow"].is_array(), "{}", got.details);
    }
    // A blend needs a reward model.
    let missing = verifier_for(
        StageKind::If,
        &VerifierConfig {
            rm_weight: 0.25,
            ..VerifierConfig::default()
        },
        None,
        None,
        &Device::Cpu,
    );
    assert!(
        missing.is_err_and(|e| e.to_string().contains("rm_weight")),
        "rm_weight without a reward model must be refused"
    );
    assert_eq!(rules.len(), 2, "the cases both follow and break the rule");
}
