//! A whole reward-model training run: read the pairs, train for the configured steps on
//! seeded shuffled batches, measure held-out accuracy before and after, save.

use std::path::{Path, PathBuf};

use cascade_shared::chat::Chat;
use cascade_shared::model::{CausalLm, Params};
use rand::seq::SliceRandom;
use serde::Serialize;

use super::config::RmTrainConfig;
use super::data::load_pairs_from;
use super::head::HeadInit;
use super::trainer::{RmStepStats, RmTrainer};
use crate::error::{LearnerError, Result};
use cascade_shared::data::DataSpec;
use cascade_shared::rng;

/// Draws batches from a shuffled order, reshuffling (seeded) at each epoch.
struct PairSampler {
    order: Vec<usize>,
    pos: usize,
    rng: rand_chacha::ChaCha8Rng,
}

impl PairSampler {
    fn new(n: usize, seed: u64) -> PairSampler {
        let mut rng = rng::seeded(seed);
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut rng);
        PairSampler { order, pos: 0, rng }
    }

    fn next_batch(&mut self, size: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(size);
        while out.len() < size {
            if self.pos == self.order.len() {
                self.order.shuffle(&mut self.rng);
                self.pos = 0;
            }
            out.push(self.order[self.pos]);
            self.pos += 1;
        }
        out
    }
}

/// Everything [`train_reward_model`] starts from.
pub struct RmInputs {
    /// The backbone (e.g. the policy's current weights), built over `params`.
    pub model: CausalLm,
    /// The backbone's parameters.
    pub params: Params,
    /// How the head starts.
    pub head: HeadInit,
    /// Tokenizer and chat template.
    pub chat: Chat,
    /// `tokenizer.json` bytes, copied into the saved model.
    pub tokenizer_json: Vec<u8>,
    /// `tokenizer_config.json` bytes, copied into the saved model when given.
    pub tokenizer_config_json: Option<Vec<u8>>,
}

/// The outcome of [`train_reward_model`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RmReport {
    /// Optimizer steps run.
    pub steps: usize,
    /// Of which skipped because of a NaN/inf loss or gradient.
    pub skipped_steps: usize,
    /// Mean loss of the first step's batch.
    pub first_loss: f64,
    /// Mean loss of the last step's batch.
    pub final_loss: f64,
    /// Training pairs used.
    pub train_pairs: usize,
    /// Held-out pairs evaluated (0 without a held-out file).
    pub heldout_pairs: usize,
    /// Training and held-out pairs left out for exceeding `max_len`.
    pub skipped_too_long: usize,
    /// Held-out accuracy before training.
    pub heldout_accuracy_before: Option<f64>,
    /// Held-out accuracy after training (ties count ½).
    pub heldout_accuracy: Option<f64>,
    /// After training, how often a held-out chosen answer scores higher under its own prompt
    /// than under another pair's ([`RmTrainer::prompt_match`]; 0.5: the prompt is ignored).
    pub heldout_prompt_match: Option<f64>,
    /// Where the model was saved.
    pub out_dir: PathBuf,
}

/// Trains a reward model on the pairs of `train` for `cfg.steps` steps, reports held-out
/// accuracy before and after when `heldout` is given, saves the model into `out_dir` (see
/// [`RmTrainer::save`]) and returns the report. `on_step` sees every step's statistics.
pub fn train_reward_model(
    inputs: RmInputs,
    train: &DataSpec,
    heldout: Option<&DataSpec>,
    out_dir: &Path,
    cfg: &RmTrainConfig,
    mut on_step: impl FnMut(&RmStepStats),
) -> Result<RmReport> {
    cfg.validate()?;
    let train_raw = load_pairs_from(train)?;
    let heldout_raw = heldout.map(load_pairs_from).transpose()?;
    let RmInputs {
        model,
        params,
        head,
        chat,
        tokenizer_json,
        tokenizer_config_json,
    } = inputs;
    let mut trainer = RmTrainer::new(model, params, head, chat, cfg.clone())?;

    let (train_pairs, mut skipped_too_long) = trainer.encode_pairs(&train_raw)?;
    if train_pairs.is_empty() {
        return Err(LearnerError::InvalidBatch(format!(
            "{}: no usable preference pair ({} read, {skipped_too_long} longer than {} tokens)",
            train.path,
            train_raw.len(),
            trainer.max_len()
        )));
    }
    let heldout_pairs = match (&heldout_raw, heldout) {
        (Some(raw), Some(path)) => {
            let (pairs, skipped) = trainer.encode_pairs(raw)?;
            skipped_too_long += skipped;
            if pairs.is_empty() {
                return Err(LearnerError::InvalidBatch(format!(
                    "{}: no usable preference pair ({} read, {skipped} longer than {} tokens)",
                    path.path,
                    raw.len(),
                    trainer.max_len()
                )));
            }
            pairs
        }
        _ => Vec::new(),
    };
    if skipped_too_long > 0 {
        tracing::warn!(
            skipped_too_long,
            max_len = trainer.max_len(),
            "reward model: pairs longer than max_len left out"
        );
    }
    let evaluate = |t: &RmTrainer| -> Result<Option<f64>> {
        if heldout_pairs.is_empty() {
            Ok(None)
        } else {
            t.accuracy_encoded(&heldout_pairs).map(Some)
        }
    };
    let heldout_accuracy_before = evaluate(&trainer)?;

    // A seed distinct from other users of `cfg.seed`.
    let mut sampler = PairSampler::new(train_pairs.len(), cfg.seed ^ 0x5245_5741_5244);
    let (mut first_loss, mut final_loss, mut skipped_steps) = (f64::NAN, f64::NAN, 0);
    let mut batch = Vec::with_capacity(cfg.batch_pairs);
    for step in 0..cfg.steps {
        batch.clear();
        batch.extend(
            sampler
                .next_batch(cfg.batch_pairs)
                .into_iter()
                .map(|i| train_pairs[i].clone()),
        );
        let stats = trainer.step_encoded(&batch)?;
        if step == 0 {
            first_loss = stats.loss;
        }
        final_loss = stats.loss;
        skipped_steps += usize::from(stats.skipped);
        on_step(&stats);
    }
    let heldout_accuracy = evaluate(&trainer)?;
    let heldout_prompt_match = match &heldout_raw {
        Some(raw) if !heldout_pairs.is_empty() => trainer.prompt_match(raw)?,
        _ => None,
    };
    trainer.save(out_dir, &tokenizer_json, tokenizer_config_json.as_deref())?;
    Ok(RmReport {
        steps: cfg.steps,
        skipped_steps,
        first_loss,
        final_loss,
        train_pairs: train_pairs.len(),
        heldout_pairs: heldout_pairs.len(),
        skipped_too_long,
        heldout_accuracy_before,
        heldout_accuracy,
        heldout_prompt_match,
        out_dir: out_dir.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{synthetic_pairs, tiny_chat, tiny_config, tiny_trainer};
    use super::super::{is_complete, PreferencePair, SCORE_WEIGHT};
    use super::*;
    use candle_core::Device;
    use cascade_shared::data::Kind;
    use cascade_shared::model::{random_weights, trainable_from_tensors, Checkpoint};
    use cascade_shared::tokenizer::tiny_tokenizer;
    use std::fs;

    #[test]
    fn training_separates_synthetic_pairs() {
        let cfg = RmTrainConfig {
            steps: 40,
            batch_pairs: 16,
            micro_batch: 8,
            lr: 3e-3,
            warmup_steps: 4,
            seed: 1,
            ..RmTrainConfig::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, pairs: &[PreferencePair]| {
            let path = dir.path().join(name);
            let text: String = pairs
                .iter()
                .map(|p| serde_json::to_string(p).unwrap() + "\n")
                .collect();
            fs::write(&path, text).unwrap();
            path
        };
        let train = write("train.jsonl", &synthetic_pairs(64, 0));
        let heldout = write("heldout.jsonl", &synthetic_pairs(32, 1000));
        let mcfg = tiny_config();
        let w = random_weights(&mcfg, 7, &Device::Cpu).unwrap();
        let (model, params) = trainable_from_tensors(&mcfg, w).unwrap();
        let inputs = RmInputs {
            model,
            params,
            head: HeadInit::Zeros,
            chat: tiny_chat(),
            tokenizer_json: tiny_tokenizer().to_string(false).unwrap().into_bytes(),
            tokenizer_config_json: None,
        };
        let out = dir.path().join("rm");
        let mut losses = Vec::new();
        let report = train_reward_model(
            inputs,
            &DataSpec::of_kind(&train, Kind::Pairs),
            Some(&DataSpec::of_kind(&heldout, Kind::Pairs)),
            &out,
            &cfg,
            |s| losses.push(s.loss),
        )
        .unwrap();
        eprintln!("{report:?}\nlosses {losses:?}");
        assert_eq!(losses.len(), 40);
        assert_eq!(report.heldout_accuracy_before, Some(0.5));
        assert!(report.heldout_accuracy.unwrap() >= 0.9, "{report:?}");
        let head: f64 = losses[..5].iter().sum::<f64>() / 5.0;
        let tail: f64 = losses[35..].iter().sum::<f64>() / 5.0;
        assert!(tail < 0.5 * head, "loss {head} → {tail}");
        assert_eq!(report.skipped_too_long, 0);
        // These answers do not depend on the prompt; the measure is there and a fraction.
        let matched = report.heldout_prompt_match.expect("held-out pairs");
        assert!((0.0..=1.0).contains(&matched), "{matched}");

        // The saved directory: complete, no temporary left, every tensor plus the head.
        assert!(is_complete(&out));
        assert!(!dir.path().join("rm.tmp").exists());
        let ckpt = Checkpoint::open_dir(&out).unwrap();
        assert!(ckpt.contains(SCORE_WEIGHT));
        for (name, _) in cascade_shared::model::parameter_shapes(&mcfg) {
            assert!(ckpt.contains(&name), "{name}");
        }
        assert!(out.join("config.json").is_file() && out.join("tokenizer.json").is_file());
        // Never overwritten.
        let t = tiny_trainer(HeadInit::Zeros, RmTrainConfig::default());
        assert!(t.save(&out, b"{}", None).is_err());
    }
}
