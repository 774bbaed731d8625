//! [`RmTrainer`]: a reward model under training (backbone, head and optimizer): encodes
//! preference pairs, scores them, accumulates gradients in micro-batches and takes optimizer
//! steps.

use std::collections::HashMap;

use candle_core::{Tensor, Var};
use cascade_shared::chat::Chat;
use cascade_shared::model::{trainable_from_tensors, CausalLm, ModelConfig, Params};
use cascade_shared::reward_head::{self, pair_ids, sequence_scores};

use super::config::RmTrainConfig;
use super::data::{EncodedPair, PreferencePair};
use super::head::{initial_head, HeadInit, SCORE_WEIGHT};
use super::loss::{count_correct, pairwise_loss};
use crate::error::{LearnerError, Result};
use crate::optim::{AdamW, StepOutcome};
use crate::schedule::LrSchedule;

/// What one optimizer step saw and did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmStepStats {
    /// Optimizer steps taken so far, this one included (1-based).
    pub step: u64,
    /// Mean Bradley–Terry loss of the batch (before the update).
    pub loss: f64,
    /// Pairwise accuracy on the batch before the update (ties count ½).
    pub accuracy: f64,
    /// Mean `s_chosen − s_rejected` of the batch.
    pub margin: f64,
    /// Learning rate of the step.
    pub lr: f64,
    /// Global gradient norm before clipping (`None` when the step was skipped).
    pub grad_norm: Option<f64>,
    /// Whether the optimizer skipped the step (NaN/inf loss or gradient).
    pub skipped: bool,
    /// Pairs in the batch.
    pub pairs: usize,
}

/// A reward model under training.
pub struct RmTrainer {
    model: CausalLm,
    params: Params,
    /// `score.weight`, `(1, hidden)`, in the model's dtype.
    head: Var,
    chat: Chat,
    cfg: RmTrainConfig,
    opt: AdamW,
    schedule: LrSchedule,
    /// Steps attempted (applied or skipped); drives the schedule.
    steps_done: u64,
}

impl std::fmt::Debug for RmTrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RmTrainer")
            .field("cfg", &self.cfg)
            .field("steps_done", &self.steps_done)
            .finish()
    }
}

impl RmTrainer {
    /// A trainer over `model`, whose parameters are `params` (as from
    /// `cascade_shared::model::load_trainable` or `trainable_from_tensors`), with a new head.
    pub fn new(
        model: CausalLm,
        params: Params,
        head: HeadInit,
        chat: Chat,
        cfg: RmTrainConfig,
    ) -> Result<RmTrainer> {
        cfg.validate()?;
        if params.vars.contains_key(SCORE_WEIGHT) {
            return Err(LearnerError::InvalidCall(format!(
                "reward model: the backbone parameters already hold {SCORE_WEIGHT}; pass it as \
                 HeadInit::Tensor"
            )));
        }
        let hidden = model.config().hidden_size;
        let (dtype, device) = (model.dtype(), model.device().clone());
        let head = initial_head(head, hidden, &device)?;
        let head = Var::from_tensor(&head.to_dtype(dtype)?)?;
        let mut vars: Vec<(String, Var)> = params
            .vars
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        vars.push((SCORE_WEIGHT.to_string(), head.clone()));
        let opt = AdamW::new(vars, cfg.adamw())?;
        let schedule = cfg.schedule();
        Ok(RmTrainer {
            model,
            params,
            head,
            chat,
            cfg,
            opt,
            schedule,
            steps_done: 0,
        })
    }

    /// A trainer from in-memory backbone tensors (HF names) of `model_cfg`; the dtype and device
    /// of the tensors are the model's.
    pub fn from_tensors(
        model_cfg: &ModelConfig,
        tensors: HashMap<String, Tensor>,
        head: HeadInit,
        chat: Chat,
        cfg: RmTrainConfig,
    ) -> Result<RmTrainer> {
        let (model, params) = trainable_from_tensors(model_cfg, tensors)?;
        RmTrainer::new(model, params, head, chat, cfg)
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &RmTrainConfig {
        &self.cfg
    }

    /// The backbone.
    pub fn model(&self) -> &CausalLm {
        &self.model
    }

    /// The current head, `(1, hidden)`, in the model's dtype.
    pub fn head(&self) -> &Tensor {
        self.head.as_tensor()
    }

    /// Optimizer steps attempted so far (applied or skipped).
    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }

    /// The longest conversation accepted: `max_len` capped by the model's context.
    pub fn max_len(&self) -> usize {
        self.cfg
            .max_len
            .min(self.model.config().max_position_embeddings)
    }

    /// Token ids of a (prompt, response) conversation, as the actor's `RewardModel` makes them.
    pub fn encode_pair(&self, prompt: &str, response: &str) -> Result<Vec<u32>> {
        Ok(pair_ids(&self.chat, prompt, response)?)
    }

    /// Whether an encoded conversation can be scored: not empty and at most `max_len` tokens.
    fn fits(&self, ids: &[u32]) -> bool {
        !ids.is_empty() && ids.len() <= self.max_len()
    }

    /// Encodes preference pairs; returns the pairs that fit in [`RmTrainer::max_len`] and the
    /// number skipped because a conversation is longer (or empty).
    pub fn encode_pairs(&self, pairs: &[PreferencePair]) -> Result<(Vec<EncodedPair>, usize)> {
        let mut out = Vec::with_capacity(pairs.len());
        let mut skipped = 0;
        for p in pairs {
            let chosen = self.encode_pair(&p.prompt, &p.chosen)?;
            let rejected = self.encode_pair(&p.prompt, &p.rejected)?;
            if self.fits(&chosen) && self.fits(&rejected) {
                out.push(EncodedPair { chosen, rejected });
            } else {
                skipped += 1;
            }
        }
        Ok((out, skipped))
    }

    /// Scores of whole sequences, `(n,)` f32, differentiable: right-padded batch,
    /// `forward_hidden`, hidden state of each sequence's last token, dot the head.
    fn scores_of(&self, seqs: &[&[u32]]) -> Result<Tensor> {
        Ok(sequence_scores(&self.model, self.head.as_tensor(), seqs)?)
    }

    /// Chosen and rejected scores `(m,)` of a micro-batch, from one forward pass.
    fn pair_scores(&self, pairs: &[EncodedPair]) -> Result<(Tensor, Tensor)> {
        let m = pairs.len();
        let seqs: Vec<&[u32]> = pairs
            .iter()
            .map(|p| p.chosen.as_slice())
            .chain(pairs.iter().map(|p| p.rejected.as_slice()))
            .collect();
        let scores = self.scores_of(&seqs)?;
        Ok((scores.narrow(0, 0, m)?, scores.narrow(0, m, m)?))
    }

    /// Scores token sequences (whole conversations), `2 · micro_batch` at a time.
    pub fn score_ids(&self, seqs: &[Vec<u32>]) -> Result<Vec<f32>> {
        Ok(reward_head::score_ids(
            &self.model,
            self.head.as_tensor(),
            seqs,
            2 * self.cfg.micro_batch,
        )?)
    }

    /// Scores (prompt, response) pairs, as the actor's `RewardModel::score_pairs` does.
    pub fn score_pairs(&self, pairs: &[(&str, &str)]) -> Result<Vec<f32>> {
        Ok(reward_head::score_pairs(
            &self.model,
            self.head.as_tensor(),
            &self.chat,
            pairs,
            2 * self.cfg.micro_batch,
        )?)
    }

    /// Pairwise accuracy of encoded pairs: the fraction with `s_chosen > s_rejected`, a tie
    /// counting ½ (so a constant model scores 0.5).
    pub fn accuracy_encoded(&self, pairs: &[EncodedPair]) -> Result<f64> {
        if pairs.is_empty() {
            return Err(LearnerError::InvalidBatch(
                "reward model: accuracy of no pairs".into(),
            ));
        }
        let mut correct = 0.0;
        for chunk in pairs.chunks(self.cfg.micro_batch) {
            let (c, r) = self.pair_scores(chunk)?;
            correct += count_correct(&c.to_vec1()?, &r.to_vec1()?);
        }
        Ok(correct / pairs.len() as f64)
    }

    /// Pairwise accuracy of preference pairs (see [`RmTrainer::accuracy_encoded`]); pairs too
    /// long for `max_len` are left out.
    pub fn accuracy(&self, pairs: &[PreferencePair]) -> Result<f64> {
        let (encoded, _) = self.encode_pairs(pairs)?;
        self.accuracy_encoded(&encoded)
    }

    /// Whether the scores depend on the prompt at all: over `pairs` (held-out ones), the
    /// fraction whose chosen answer scores higher under its own prompt than under another
    /// pair's (the next pair, cyclically, with a different prompt text; see [`prompt_swaps`]).
    /// Ties count ½, so a reward model that ignores the prompt scores 0.5, and a policy trained
    /// on it can be paid for one answer to every prompt. `None` when no pair has a different
    /// prompt to borrow or every conversation is longer than `max_len`.
    pub fn prompt_match(&self, pairs: &[PreferencePair]) -> Result<Option<f64>> {
        let (mut own, mut borrowed) = (Vec::new(), Vec::new());
        for (pair, other) in prompt_swaps(pairs) {
            let a = self.encode_pair(&pair.prompt, &pair.chosen)?;
            let b = self.encode_pair(&other.prompt, &pair.chosen)?;
            if self.fits(&a) && self.fits(&b) {
                own.push(a);
                borrowed.push(b);
            }
        }
        if own.is_empty() {
            return Ok(None);
        }
        let (own_scores, borrowed_scores) = (self.score_ids(&own)?, self.score_ids(&borrowed)?);
        Ok(Some(
            count_correct(&own_scores, &borrowed_scores) / own.len() as f64,
        ))
    }

    /// Runs forward and backward over `pairs` in micro-batches, adding the gradients of the
    /// batch-mean loss to the optimizer. Returns (loss sum, correct, margin sum).
    fn accumulate(&mut self, pairs: &[EncodedPair]) -> Result<(f64, f64, f64)> {
        let n = pairs.len() as f64;
        let (mut loss_sum, mut correct, mut margin_sum) = (0.0, 0.0, 0.0);
        for chunk in pairs.chunks(self.cfg.micro_batch) {
            let (c, r) = self.pair_scores(chunk)?;
            let per_pair = pairwise_loss(&c, &r)?;
            let micro_sum = per_pair.sum_all()?;
            let grads = (&micro_sum / n)?.backward()?;
            self.opt.accumulate(&grads)?;
            loss_sum += micro_sum.to_scalar::<f32>()? as f64;
            let (c, r) = (c.to_vec1::<f32>()?, r.to_vec1::<f32>()?);
            correct += count_correct(&c, &r);
            margin_sum += c.iter().zip(&r).map(|(c, r)| (c - r) as f64).sum::<f64>();
        }
        Ok((loss_sum, correct, margin_sum))
    }

    /// One optimizer step on encoded pairs (the whole slice is the batch).
    pub fn step_encoded(&mut self, pairs: &[EncodedPair]) -> Result<RmStepStats> {
        if pairs.is_empty() {
            return Err(LearnerError::InvalidBatch(
                "reward model: a step needs at least one pair".into(),
            ));
        }
        let n = pairs.len() as f64;
        let lr = self.schedule.lr(self.steps_done);
        self.opt.zero_grad();
        let (loss_sum, correct, margin_sum) = match self.accumulate(pairs) {
            Ok(x) => x,
            Err(e) => {
                self.opt.zero_grad();
                return Err(e);
            }
        };
        let loss = loss_sum / n;
        let outcome = self.opt.step(lr, loss)?;
        self.steps_done += 1;
        let (grad_norm, skipped) = match outcome {
            StepOutcome::Applied { grad_norm, .. } => (Some(grad_norm), false),
            StepOutcome::Skipped { .. } => (None, true),
        };
        Ok(RmStepStats {
            step: self.steps_done,
            loss,
            accuracy: correct / n,
            margin: margin_sum / n,
            lr,
            grad_norm,
            skipped,
            pairs: pairs.len(),
        })
    }

    /// One optimizer step on preference pairs; pairs too long for `max_len` are left out (an
    /// error if none is left).
    pub fn step(&mut self, pairs: &[PreferencePair]) -> Result<RmStepStats> {
        let (encoded, _) = self.encode_pairs(pairs)?;
        if encoded.is_empty() {
            return Err(LearnerError::InvalidBatch(format!(
                "reward model: none of {} pairs fits in {} tokens",
                pairs.len(),
                self.max_len()
            )));
        }
        self.step_encoded(&encoded)
    }

    /// Every tensor of the reward model by HF name (backbone and `score.weight`), sorted.
    pub fn tensors(&self) -> Vec<(String, Tensor)> {
        let mut out: Vec<(String, Tensor)> = self
            .params
            .vars
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
            .collect();
        out.push((SCORE_WEIGHT.to_string(), self.head.as_tensor().clone()));
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// Each pair with the prompt it borrows in [`RmTrainer::prompt_match`]: the first pair after
/// it (cyclically) whose prompt text differs. Pairs with no such pair are left out.
pub(super) fn prompt_swaps(pairs: &[PreferencePair]) -> Vec<(&PreferencePair, &PreferencePair)> {
    let n = pairs.len();
    (0..n)
        .filter_map(|i| {
            (1..n)
                .map(|k| &pairs[(i + k) % n])
                .find(|q| q.prompt != pairs[i].prompt)
                .map(|q| (&pairs[i], q))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{synthetic_pairs, tiny_trainer};
    use super::*;
    use candle_core::{DType, Device};

    /// The mean loss of `pairs` at the current weights, as a plain number.
    fn mean_loss(t: &RmTrainer, pairs: &[EncodedPair]) -> f64 {
        let (c, r) = t.pair_scores(pairs).unwrap();
        pairwise_loss(&c, &r)
            .unwrap()
            .mean_all()
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    }

    /// Central finite differences of the mean loss wrt a few entries of `var`, against the
    /// accumulated (backward) gradient.
    fn check_grad(t: &RmTrainer, pairs: &[EncodedPair], name: &str, var: &Var, eps: f64) {
        let grad = t.opt.grad(name).expect("a gradient").flatten_all().unwrap();
        let grad = grad.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
        let base = var
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let shape = var.shape().clone();
        let n = base.len();
        let mut max_err = 0f64;
        let mut max_g = 0f64;
        for i in (0..n).step_by((n / 8).max(1)) {
            let at = |delta: f64| {
                let mut w = base.clone();
                w[i] = (w[i] as f64 + delta) as f32;
                var.set(&Tensor::from_vec(w, &shape, &Device::Cpu).unwrap())
                    .unwrap();
                mean_loss(t, pairs)
            };
            let fd = (at(eps) - at(-eps)) / (2.0 * eps);
            max_err = max_err.max((fd - grad[i] as f64).abs());
            max_g = max_g.max((grad[i] as f64).abs());
        }
        var.set(&Tensor::from_vec(base, &shape, &Device::Cpu).unwrap())
            .unwrap();
        eprintln!("{name}: max |fd - backward| = {max_err:.3e}, max |grad| = {max_g:.3e}");
        assert!(max_g > 1e-4, "{name}: gradient too small to test ({max_g})");
        assert!(
            max_err <= 2e-3 * max_g.max(1e-2),
            "{name}: finite differences disagree by {max_err} (largest gradient {max_g})"
        );
    }

    #[test]
    fn head_and_backbone_gradients_match_finite_differences() {
        let cfg = RmTrainConfig {
            micro_batch: 2,
            ..RmTrainConfig::default()
        };
        let mut t = tiny_trainer(HeadInit::Normal { std: 0.5, seed: 3 }, cfg);
        let (pairs, _) = t.encode_pairs(&synthetic_pairs(5, 0)).unwrap();
        t.opt.zero_grad();
        t.accumulate(&pairs).unwrap();
        // The accumulated gradient is the mean-loss gradient whatever the micro-batching.
        let head = t.head.clone();
        check_grad(&t, &pairs, SCORE_WEIGHT, &head, 1e-2);
        let norm = t.params.vars["model.norm.weight"].clone();
        check_grad(&t, &pairs, "model.norm.weight", &norm, 1e-2);
        let a = t.opt.grad(SCORE_WEIGHT).unwrap().clone();
        t.cfg.micro_batch = 5;
        t.opt.zero_grad();
        t.accumulate(&pairs).unwrap();
        let b = t.opt.grad(SCORE_WEIGHT).unwrap();
        let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap();
        assert!(diff.to_scalar::<f32>().unwrap() < 1e-5);
    }

    #[test]
    fn overlong_pairs_are_skipped() {
        let cfg = RmTrainConfig {
            max_len: 150,
            ..RmTrainConfig::default()
        };
        let mut t = tiny_trainer(HeadInit::Zeros, cfg);
        let mut pairs = synthetic_pairs(3, 0);
        pairs[1].rejected = "x".repeat(200);
        let (enc, skipped) = t.encode_pairs(&pairs).unwrap();
        assert_eq!((enc.len(), skipped), (2, 1));
        assert!(enc
            .iter()
            .all(|p| p.chosen.len() <= 150 && p.rejected.len() <= 150));
        let stats = t.step(&pairs).unwrap();
        assert_eq!(stats.pairs, 2);
        assert!(t.step(&pairs[1..2]).is_err());
    }

    fn pair(prompt: &str, chosen: &str, rejected: &str) -> PreferencePair {
        PreferencePair {
            prompt: prompt.into(),
            chosen: chosen.into(),
            rejected: rejected.into(),
        }
    }

    #[test]
    fn each_pair_borrows_the_next_different_prompt() {
        let pairs = [
            pair("a", "1", "x"),
            pair("a", "2", "x"),
            pair("b", "3", "x"),
        ];
        let swaps: Vec<(&str, &str)> = prompt_swaps(&pairs)
            .into_iter()
            .map(|(p, q)| (p.chosen.as_str(), q.prompt.as_str()))
            .collect();
        assert_eq!(swaps, [("1", "b"), ("2", "b"), ("3", "a")]);
        assert!(prompt_swaps(&pairs[..2]).is_empty());
        assert!(prompt_swaps(&[]).is_empty());
    }

    /// Pairs whose preference is decided by the prompt alone: the same two answers swap
    /// places, so an answer-only score separates none of them.
    fn prompt_decides(n: usize) -> Vec<PreferencePair> {
        (0..n)
            .map(|i| {
                if i % 2 == 0 {
                    pair(&format!("Say yes. ({i})"), "yes", "no")
                } else {
                    pair(&format!("Say no. ({i})"), "no", "yes")
                }
            })
            .collect()
    }

    #[test]
    fn prompt_match_is_one_half_for_a_score_that_ignores_the_prompt() {
        // A zero head scores everything 0: every comparison is a tie.
        let t = tiny_trainer(HeadInit::Zeros, RmTrainConfig::default());
        assert_eq!(t.prompt_match(&synthetic_pairs(12, 0)).unwrap(), Some(0.5));
        assert_eq!(t.prompt_match(&prompt_decides(2)[..1]).unwrap(), None);
    }

    #[test]
    fn prompt_match_rises_when_the_preference_depends_on_the_prompt() {
        let cfg = RmTrainConfig {
            micro_batch: 8,
            lr: 1e-2,
            warmup_steps: 0,
            seed: 5,
            ..RmTrainConfig::default()
        };
        let mut t = tiny_trainer(HeadInit::Normal { std: 0.1, seed: 3 }, cfg);
        let train = prompt_decides(32);
        let heldout: Vec<_> = prompt_decides(16)
            .into_iter()
            .map(|mut p| {
                p.prompt = p.prompt.replace('(', "[").replace(')', "]");
                p
            })
            .collect();
        for _ in 0..60 {
            t.step(&train).unwrap();
        }
        let accuracy = t.accuracy(&heldout).unwrap();
        let matched = t.prompt_match(&heldout).unwrap().unwrap();
        eprintln!("accuracy {accuracy}, prompt match {matched}");
        assert!(accuracy >= 0.9, "accuracy {accuracy}");
        // Each held-out chosen answer scores higher under its own prompt than under the next
        // pair's, which asks for the other answer.
        assert!(matched >= 0.9, "prompt match {matched}");
    }
}
