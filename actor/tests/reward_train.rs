//! Round trip of a trained reward model: the learner trains and saves it, the actor's
//! `RewardModel::load` reads it and scores exactly as the trainer did.

use candle_core::Device;
use cascade_actor::reward_model::RewardModel;
use cascade_learner::reward_train::{
    is_complete, HeadInit, PreferencePair, RmTrainConfig, RmTrainer,
};
use cascade_shared::chat::Chat;
use cascade_shared::model::{random_weights, ModelConfig};

fn tiny_config() -> ModelConfig {
    ModelConfig::from_json_str(
        r#"{"model_type": "qwen3", "vocab_size": 264, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 256,
            "initializer_range": 0.2, "eos_token_id": 258}"#,
    )
    .expect("valid config")
}

fn pairs() -> Vec<PreferencePair> {
    (0..12)
        .map(|i| PreferencePair {
            prompt: format!("What is {i} times two?"),
            chosen: format!("{}.", 2 * i),
            rejected: format!("hmm hmm {i} {i} {i} hmm maybe {} hmm", i + 1),
        })
        .collect()
}

#[test]
fn saved_reward_model_loads_and_scores_like_the_trainer() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let tok_dir = dir.path().join("tok");
    cascade_shared::tokenizer::write_tiny_tokenizer(&tok_dir)?;
    let tokenizer_json = std::fs::read(tok_dir.join("tokenizer.json"))?;
    let tokenizer_config_json = std::fs::read(tok_dir.join("tokenizer_config.json"))?;

    let cfg = tiny_config();
    let weights = random_weights(&cfg, 11, &Device::Cpu)?;
    let train_cfg = RmTrainConfig {
        steps: 5,
        batch_pairs: 6,
        micro_batch: 3,
        lr: 1e-3,
        ..RmTrainConfig::default()
    };
    let mut trainer = RmTrainer::from_tensors(
        &cfg,
        weights,
        HeadInit::Normal { std: 0.2, seed: 5 },
        Chat::from_dir(&tok_dir)?,
        train_cfg,
    )?;
    let data = pairs();
    for batch in data.chunks(6).cycle().take(5) {
        let stats = trainer.step(batch)?;
        assert!(stats.loss.is_finite() && !stats.skipped);
    }

    let out = dir.path().join("rm");
    trainer.save(&out, &tokenizer_json, Some(&tokenizer_config_json))?;
    assert!(is_complete(&out));

    let rm = RewardModel::load(&out, &Device::Cpu)?;
    let queries: Vec<(&str, &str)> = data
        .iter()
        .take(5)
        .flat_map(|p| {
            [
                (p.prompt.as_str(), p.chosen.as_str()),
                (p.prompt.as_str(), p.rejected.as_str()),
            ]
        })
        .chain([("an unseen prompt", "an unseen answer")])
        .collect();
    let ours = trainer.score_pairs(&queries)?;
    let theirs = rm.score_pairs(&queries)?;
    assert_eq!(ours.len(), theirs.len());
    let max_diff = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    eprintln!(
        "max |trainer − loaded| = {max_diff:e} over {} scores",
        ours.len()
    );
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert!((a - b).abs() <= 1e-5, "pair {i}: trainer {a}, loaded {b}");
    }
    // The scores are not all the same (the head is not degenerate).
    assert!(ours.iter().any(|s| (s - ours[0]).abs() > 1e-4));
    // Token ids agree too.
    for (p, r) in &queries {
        assert_eq!(trainer.encode_pair(p, r)?, rm.encode_pair(p, r)?);
    }
    Ok(())
}
