//! The SWE judge scorer against Hugging Face transformers: same prompt token ids (transformers'
//! `apply_chat_template` + tokenizer), same next-token log P(YES) / log P(NO) at the answer
//! position (transformers' `Qwen3ForCausalLM` on the same weights), same score
//! `p_yes / (p_yes + p_no)`; then the whole SWE verifier with the judge plugged in.
//! Fixture: tests/fixtures/judge/, made by scripts/gen-judge-fixtures.py.

use std::path::PathBuf;

use candle_core::Device;
use cascade_actor::judge::{issue_text, JudgeScorer, Verdict};
use cascade_rewards::swe::{PatchPair, SemanticScorer};
use cascade_rewards::{SweVerifier, Verifier, VerifyError};
use cascade_shared::chat::split_response;
use serde_json::{json, Value};

const TOL: f64 = 1e-4;

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/judge/model")
}

struct Case {
    issue: Option<String>,
    gold: String,
    candidate: String,
    ids: Vec<u32>,
    logp_yes: f64,
    logp_no: f64,
    p_yes: f64,
    p_no: f64,
    score: f64,
}

fn fixture() -> (u32, u32, Vec<Case>) {
    let path = model_dir().join("../cases.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let f = |c: &Value, k: &str| c[k].as_f64().unwrap();
    let cases = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            issue: c["issue"].as_str().map(str::to_string),
            gold: c["gold"].as_str().unwrap().to_string(),
            candidate: c["candidate"].as_str().unwrap().to_string(),
            ids: c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect(),
            logp_yes: f(c, "logp_yes"),
            logp_no: f(c, "logp_no"),
            p_yes: f(c, "p_yes"),
            p_no: f(c, "p_no"),
            score: f(c, "score"),
        })
        .collect();
    (
        v["yes_id"].as_u64().unwrap() as u32,
        v["no_id"].as_u64().unwrap() as u32,
        cases,
    )
}

fn judge() -> JudgeScorer {
    JudgeScorer::load(&model_dir(), &Device::Cpu).expect("judge loads")
}

fn assert_verdict(got: &Verdict, want: &Case, what: &str) {
    let close = |a: f64, b: f64| (a - b).abs() < TOL;
    let rel = |a: f64, b: f64| (a - b).abs() <= TOL * b.abs();
    assert!(
        close(got.logp_yes, want.logp_yes) && close(got.logp_no, want.logp_no),
        "{what}: log-probs ours ({}, {}) vs transformers ({}, {})",
        got.logp_yes,
        got.logp_no,
        want.logp_yes,
        want.logp_no
    );
    assert!(
        rel(got.p_yes, want.p_yes) && rel(got.p_no, want.p_no),
        "{what}: p ours ({}, {}) vs transformers ({}, {})",
        got.p_yes,
        got.p_no,
        want.p_yes,
        want.p_no
    );
    assert!(
        close(got.score, want.score),
        "{what}: score ours {} vs transformers {}",
        got.score,
        want.score
    );
}

#[test]
fn judge_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<JudgeScorer>();
}

#[test]
fn answer_tokens_and_prompt_ids_match_transformers() {
    let (yes, no, cases) = fixture();
    let j = judge();
    assert_eq!(j.answer_ids(), (yes, no));
    for (i, c) in cases.iter().enumerate() {
        let ids = j.encode(c.issue.as_deref(), &c.gold, &c.candidate).unwrap();
        assert_eq!(ids, c.ids, "case {i}");
    }
}

#[test]
fn verdicts_match_transformers_single_and_batched() {
    let (_, _, cases) = fixture();
    let scores: Vec<f64> = cases.iter().map(|c| c.score).collect();
    let spread = scores.iter().cloned().fold(f64::MIN, f64::max)
        - scores.iter().cloned().fold(f64::MAX, f64::min);
    assert!(spread > 0.2, "the fixture's scores differ: {scores:?}");
    // Any two reference scores are far apart at TOL, so the per-case comparisons below also
    // catch verdicts that batching or padding assigns to the wrong case.
    for (i, a) in scores.iter().enumerate() {
        for (j, b) in scores.iter().enumerate().skip(i + 1) {
            assert!(
                (a - b).abs() > 100.0 * TOL,
                "the fixture's scores of cases {i} and {j} are too close: {scores:?}"
            );
        }
    }
    let ids: Vec<Vec<u32>> = cases.iter().map(|c| c.ids.clone()).collect();
    for max_batch in [1, 3, 8] {
        let j = judge().with_max_batch(max_batch);
        let got = j.judge_ids(&ids).unwrap();
        for (i, (g, c)) in got.iter().zip(&cases).enumerate() {
            assert_verdict(g, c, &format!("max_batch {max_batch}, case {i}"));
        }
        let worst = |f: fn(&Verdict) -> f64, h: fn(&Case) -> f64| {
            got.iter()
                .zip(&cases)
                .map(|(g, c)| (f(g) - h(c)).abs())
                .fold(0.0, f64::max)
        };
        eprintln!(
            "max_batch {max_batch}: max |Δ logp_yes| {:.2e}, |Δ logp_no| {:.2e}, |Δ score| {:.2e}",
            worst(|g| g.logp_yes, |c| c.logp_yes),
            worst(|g| g.logp_no, |c| c.logp_no),
            worst(|g| g.score, |c| c.score)
        );
    }
    // From text, through our own prompt rendering.
    let j = judge();
    let triples: Vec<(Option<&str>, &str, &str)> = cases
        .iter()
        .map(|c| (c.issue.as_deref(), c.gold.as_str(), c.candidate.as_str()))
        .collect();
    for (i, (g, c)) in j.judge(&triples).unwrap().iter().zip(&cases).enumerate() {
        assert_verdict(g, c, &format!("from text, case {i}"));
    }
}

#[test]
fn semantic_scorer_reports_probabilities_and_provenance() {
    let (_, _, cases) = fixture();
    let j = judge();
    for (i, c) in cases.iter().enumerate() {
        let reference = match &c.issue {
            Some(issue) => json!({"gold_patch": c.gold, "prompt": issue}),
            None => json!({"gold_patch": c.gold}),
        };
        assert_eq!(issue_text(&reference), c.issue.as_deref());
        let s = j
            .score(&PatchPair {
                predicted: &c.candidate,
                gold: &c.gold,
                lexical: 0.5,
                reference: &reference,
            })
            .unwrap();
        assert!((s.score - c.score).abs() < TOL, "case {i}: {}", s.score);
        assert_eq!(s.details["scorer"], json!("judge"));
        assert_eq!(s.details["judge"], json!(model_dir().display().to_string()));
        let p_yes = s.details["p_yes"].as_f64().unwrap();
        let p_no = s.details["p_no"].as_f64().unwrap();
        assert!((p_yes - c.p_yes).abs() <= TOL * c.p_yes, "case {i}");
        assert!((p_no - c.p_no).abs() <= TOL * c.p_no, "case {i}");
    }
}

#[test]
fn issue_text_falls_back_to_the_last_user_turn() {
    let r = json!({"messages": [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": "second"}]});
    assert_eq!(issue_text(&r), Some("second"));
    let r = json!({"problem_statement": "ps", "prompt": "p"});
    assert_eq!(issue_text(&r), Some("ps"));
    assert_eq!(issue_text(&json!({"gold_patch": "x"})), None);
}

#[test]
fn swe_verifier_with_the_judge() {
    let (_, _, cases) = fixture();
    let v = SweVerifier::new(Box::new(judge()));
    let c = &cases[0];
    let reference =
        json!({"gold_patch": c.gold, "prompt": c.issue.as_deref().expect("case 0 has an issue")});
    let run = |response: &str| v.verify(&reference, &split_response(response)).unwrap();

    let identical = run(&format!("<think>\nok\n</think>\n\n```diff\n{}```", c.gold));
    assert_eq!(identical.reward, 1.0);
    assert_eq!(identical.details["outcome"], json!("identical"));

    let empty = run("<think>\nno idea\n</think>\n\n");
    assert_eq!(empty.reward, 0.0);
    assert_eq!(empty.details["outcome"], json!("empty"));

    let unparsable = run("I would change the return value.");
    assert_eq!(unparsable.reward, -1.0);
    assert_eq!(unparsable.details["outcome"], json!("unparsable"));

    let judged = run(&format!("```diff\n{}```", c.candidate));
    assert_eq!(judged.details["outcome"], json!("semantic"));
    assert!(
        (judged.reward as f64 - c.score).abs() < TOL,
        "reward {} vs transformers {}",
        judged.reward,
        c.score
    );
    assert_eq!(judged.details["scorer"]["scorer"], json!("judge"));
    let lexical = judged.details["lexical"].as_f64().unwrap();
    assert!(lexical > 0.0 && lexical < 1.0, "{lexical}");
}

#[test]
fn prompt_longer_than_the_context_is_an_environment_error() {
    let (_, _, cases) = fixture();
    let c = &cases[0];
    let reference = json!({"gold_patch": c.gold, "prompt": "x".repeat(2000)});
    let v = SweVerifier::new(Box::new(judge()));
    let err = v
        .verify(
            &reference,
            &split_response(&format!("```diff\n{}```", c.candidate)),
        )
        .unwrap_err();
    match err {
        VerifyError::Environment(msg) => {
            assert!(msg.contains("exceeds the judge's context of 1024"), "{msg}")
        }
        other => panic!("expected an environment error, got {other:?}"),
    }
}

/// Throughput of the judge on the fixture model (prints pairs/s; asserts nothing about time).
/// `RAYON_NUM_THREADS=1 cargo test -p cascade-actor --test judge_hf -- --ignored --nocapture`
#[test]
#[ignore]
fn throughput() {
    let (_, _, cases) = fixture();
    let prompts: Vec<Vec<u32>> = (0..64)
        .map(|i| cases[i % cases.len()].ids.clone())
        .collect();
    let tokens: usize = prompts.iter().map(Vec::len).sum();
    for max_batch in [1, 4, 8] {
        let j = judge().with_max_batch(max_batch);
        j.judge_ids(&prompts[..max_batch]).unwrap(); // warm-up
        let start = std::time::Instant::now();
        let verdicts = j.judge_ids(&prompts).unwrap();
        let secs = start.elapsed().as_secs_f64();
        assert_eq!(verdicts.len(), prompts.len());
        eprintln!(
            "max_batch {max_batch}: {} pairs ({tokens} prompt tokens) in {secs:.3} s = {:.1} pairs/s, {:.0} tokens/s",
            prompts.len(),
            prompts.len() as f64 / secs,
            tokens as f64 / secs
        );
    }
}
