//! Bradley–Terry reward-model training on preference pairs.
//!
//! The reward model is the shared architecture ([`CausalLm`]) plus a scalar head
//! `score.weight`, shape `(1, hidden)`. The score of a (prompt, response) pair is
//! `score.weight · h`, where `h` is the final hidden state of the last real token of the
//! conversation `[user: prompt, assistant: response]` rendered with
//! `Chat::encode_chat(.., add_generation_prompt = false, Mode::Think)`: exactly what the actor's
//! `RewardModel` computes at inference (right-padded batches, same gather, same dtype path).
//!
//! Training minimises the Bradley–Terry loss, the mean over pairs of
//! `−log σ(s_chosen − s_rejected) = softplus(s_rejected − s_chosen)`, computed in a form that
//! neither overflows nor has a wrong gradient at a tie (see [`pairwise_loss`]). A step covers
//! `batch_pairs` pairs in micro-batches of `micro_batch` pairs (the gradients are summed, so
//! memory follows the micro-batch and the result does not depend on it), then applies
//! [`AdamW`] with a linear warm-up + cosine [`LrSchedule`]. Every backbone tensor and the head
//! are trained.
//!
//! Data: JSONL, one `{"prompt": str, "chosen": str, "rejected": str}` per line (other keys are
//! ignored, blank lines skipped); [`load_pairs`] names the file and the 1-based line of a
//! malformed one. A pair whose chosen or rejected conversation is longer than `max_len` tokens
//! (or the model's context) is **skipped**, not truncated, and counted.
//!
//! [`RmTrainer::save`] writes a Hugging Face directory that the actor's
//! `RewardModel::load` reads: `config.json`, `model.safetensors` (every backbone tensor under
//! its HF name plus `score.weight`), `tokenizer.json`, optionally `tokenizer_config.json`, and
//! the marker `COMPLETE` last; it is written as `DIR.tmp`, each file fsynced, renamed to `DIR`,
//! and the parent fsynced.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use candle_core::{DType, Tensor, Var};
use cascade_shared::chat::{Chat, Message};
use cascade_shared::model::{trainable_from_tensors, CausalLm, ModelConfig, Params};
use cascade_shared::Mode;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::error::{LearnerError, Result};
use crate::optim::{AdamW, AdamWConfig, StepOutcome};
use crate::schedule::{LrSchedule, ScheduleKind};
use cascade_shared::rng;
use cascade_shared::snapshot::tensors::write_safetensors;

/// Name of the scalar head tensor (as the actor's `RewardModel` and transformers'
/// `*ForSequenceClassification` call it).
pub const SCORE_WEIGHT: &str = "score.weight";

/// The completion marker written last into a saved reward model.
pub const COMPLETE_FILE: &str = "COMPLETE";

/// One preference pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreferencePair {
    /// The user prompt.
    pub prompt: String,
    /// The preferred response.
    pub chosen: String,
    /// The dispreferred response.
    pub rejected: String,
}

/// Reads preference pairs from a JSONL file. Blank lines are skipped; unknown keys ignored. A
/// line that is not a JSON object with string `prompt`, `chosen` and `rejected` is an error
/// naming the file and the 1-based line.
pub fn load_pairs(path: &Path) -> Result<Vec<PreferencePair>> {
    let file = File::open(path).map_err(|e| LearnerError::io(path, e))?;
    let bad_line = |line: usize, reason: String| {
        LearnerError::io(
            path,
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("line {line}: {reason}"),
            ),
        )
    };
    let mut out = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line_no = i + 1;
        let line = line.map_err(|e| bad_line(line_no, e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let pair: PreferencePair = serde_json::from_str(&line).map_err(|e| {
            bad_line(
                line_no,
                format!("not a {{\"prompt\", \"chosen\", \"rejected\"}} object: {e}"),
            )
        })?;
        out.push(pair);
    }
    Ok(out)
}

/// Hyper-parameters of reward-model training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RmTrainConfig {
    /// Optimizer steps.
    pub steps: usize,
    /// Pairs per optimizer step.
    pub batch_pairs: usize,
    /// Pairs per forward/backward pass (gradient accumulation); `2 · micro_batch` sequences go
    /// through the model at once. Also the pairs per forward when scoring.
    pub micro_batch: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warm-up steps; a cosine decay to `min_lr_ratio · lr` follows (constant LR when
    /// the warm-up covers every step).
    pub warmup_steps: usize,
    /// Floor of the cosine as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f64,
    /// Global gradient-norm clipping threshold; `None` = no clipping.
    pub grad_clip: Option<f64>,
    /// Seed of the per-epoch shuffling.
    pub seed: u64,
    /// Longest conversation in tokens; a pair with a longer chosen or rejected conversation is
    /// skipped (the model's `max_position_embeddings` caps it too).
    pub max_len: usize,
}

impl Default for RmTrainConfig {
    fn default() -> Self {
        RmTrainConfig {
            steps: 100,
            batch_pairs: 16,
            micro_batch: 4,
            lr: 1e-5,
            warmup_steps: 0,
            min_lr_ratio: 0.0,
            weight_decay: 0.0,
            grad_clip: Some(1.0),
            seed: 0,
            max_len: 1024,
        }
    }
}

impl RmTrainConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(LearnerError::InvalidConfig(format!("reward model: {m}")));
        if self.steps == 0 || self.batch_pairs == 0 || self.micro_batch == 0 {
            return bad(format!(
                "steps {}, batch_pairs {} and micro_batch {} must be ≥ 1",
                self.steps, self.batch_pairs, self.micro_batch
            ));
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return bad(format!("lr {} must be > 0", self.lr));
        }
        if self.max_len < 2 {
            return bad(format!("max_len {} must be ≥ 2", self.max_len));
        }
        self.schedule().validate()?;
        self.adamw().validate()
    }

    /// The learning-rate schedule: warm-up, then cosine over the remaining steps.
    pub fn schedule(&self) -> LrSchedule {
        LrSchedule {
            peak_lr: self.lr,
            warmup_steps: self.warmup_steps as u64,
            total_steps: self.steps as u64,
            kind: if self.steps > self.warmup_steps {
                ScheduleKind::Cosine
            } else {
                ScheduleKind::Constant
            },
            min_lr_ratio: self.min_lr_ratio,
        }
    }

    /// The optimizer settings.
    pub fn adamw(&self) -> AdamWConfig {
        AdamWConfig {
            weight_decay: self.weight_decay,
            max_grad_norm: self.grad_clip,
            ..AdamWConfig::default()
        }
    }
}

/// How the scalar head starts.
#[derive(Debug, Clone)]
pub enum HeadInit {
    /// All zeros: every score starts at 0 (held-out accuracy exactly 0.5); the first step
    /// trains only the head, since the backbone gets no gradient through a zero head.
    Zeros,
    /// Seeded normal(0, `std`) draws (transformers uses `initializer_range`).
    Normal {
        /// Standard deviation.
        std: f64,
        /// Seed.
        seed: u64,
    },
    /// A given `(1, hidden)` tensor (e.g. to continue from a saved reward model).
    Tensor(Tensor),
}

/// The token ids of a pair's two conversations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedPair {
    /// `[user: prompt, assistant: chosen]`.
    pub chosen: Vec<u32>,
    /// `[user: prompt, assistant: rejected]`.
    pub rejected: Vec<u32>,
}

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

/// Per-pair Bradley–Terry loss `−log σ(c − r) = softplus(r − c)`, `(n,)` f32, for chosen and
/// rejected scores `(n,)`.
///
/// `softplus(x)` is computed as `(x + |x|)/2 + ln(1 + e^{−|x|})`: no overflow for any `x`, and,
/// unlike `relu(x) + ln(1 + e^{−|x|})`, the right derivative (½) at `x = 0` whatever sign the
/// backward pass gives `|x|` there — which matters, because a zero head ties every pair.
pub fn pairwise_loss(chosen: &Tensor, rejected: &Tensor) -> Result<Tensor> {
    let x = (rejected.to_dtype(DType::F32)? - chosen.to_dtype(DType::F32)?)?;
    let abs = x.abs()?;
    let pos_part = ((&x + &abs)? * 0.5)?;
    let log_term = (abs.neg()?.exp()? + 1.0)?.log()?;
    Ok((pos_part + log_term)?)
}

/// Correct pairs of a batch, ties counting ½.
fn count_correct(chosen: &[f32], rejected: &[f32]) -> f64 {
    chosen
        .iter()
        .zip(rejected)
        .map(|(c, r)| {
            if c > r {
                1.0
            } else if c == r {
                0.5
            } else {
                0.0
            }
        })
        .sum()
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

fn shared_err(e: impl std::fmt::Display) -> LearnerError {
    LearnerError::InvalidConfig(format!("reward model: {e}"))
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
            return Err(LearnerError::InvalidConfig(format!(
                "reward model: the backbone parameters already hold {SCORE_WEIGHT}; pass it as \
                 HeadInit::Tensor"
            )));
        }
        let hidden = model.config().hidden_size;
        let (dtype, device) = (model.dtype(), model.device().clone());
        let head = match head {
            HeadInit::Zeros => Tensor::zeros((1, hidden), DType::F32, &device)?,
            HeadInit::Normal { std, seed } => {
                let mut r = rng::seeded(seed);
                let data: Vec<f32> = (0..hidden)
                    .map(|_| {
                        // Box–Muller.
                        let u1 = rng::uniform(&mut r).max(f64::MIN_POSITIVE);
                        let u2 = rng::uniform(&mut r);
                        (std * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
                    })
                    .collect();
                Tensor::from_vec(data, (1, hidden), &device)?
            }
            HeadInit::Tensor(t) => {
                if t.dims() != [1, hidden] {
                    return Err(LearnerError::InvalidConfig(format!(
                        "reward model: {SCORE_WEIGHT} must be (1, {hidden}), got {:?}",
                        t.dims()
                    )));
                }
                t.to_device(&device)?
            }
        };
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
        let (model, params) = trainable_from_tensors(model_cfg, tensors).map_err(shared_err)?;
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
        let messages = [Message::user(prompt), Message::assistant(response)];
        self.chat
            .encode_chat(&messages, false, Mode::Think)
            .map_err(shared_err)
    }

    /// Encodes preference pairs; returns the pairs that fit in [`RmTrainer::max_len`] and the
    /// number skipped because a conversation is longer (or empty).
    pub fn encode_pairs(&self, pairs: &[PreferencePair]) -> Result<(Vec<EncodedPair>, usize)> {
        let max = self.max_len();
        let mut out = Vec::with_capacity(pairs.len());
        let mut skipped = 0;
        for p in pairs {
            let chosen = self.encode_pair(&p.prompt, &p.chosen)?;
            let rejected = self.encode_pair(&p.prompt, &p.rejected)?;
            let fits = |s: &Vec<u32>| !s.is_empty() && s.len() <= max;
            if fits(&chosen) && fits(&rejected) {
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
        let n = seqs.len();
        let width = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
        if n == 0 || seqs.iter().any(|s| s.is_empty()) {
            return Err(LearnerError::InvalidBatch(
                "reward model: empty batch or sequence".into(),
            ));
        }
        let max_pos = self.model.config().max_position_embeddings;
        if width > max_pos {
            return Err(LearnerError::InvalidBatch(format!(
                "reward model: sequence of {width} tokens exceeds the context of {max_pos}"
            )));
        }
        let mut ids = vec![0u32; n * width];
        let mut mask = vec![0u8; n * width];
        for (r, s) in seqs.iter().enumerate() {
            ids[r * width..r * width + s.len()].copy_from_slice(s);
            mask[r * width..r * width + s.len()].fill(1);
        }
        let dev = self.model.device();
        let ids = Tensor::from_vec(ids, (n, width), dev)?;
        let mask = Tensor::from_vec(mask, (n, width), dev)?;
        let hidden = self
            .model
            .forward_hidden(&ids, Some(&mask))
            .map_err(shared_err)?; // (n, width, h)
        let h = self.model.config().hidden_size;
        let last: Vec<u32> = seqs
            .iter()
            .enumerate()
            .map(|(r, s)| (r * width + s.len() - 1) as u32)
            .collect();
        let last = Tensor::from_vec(last, n, dev)?;
        let last_hidden = hidden.reshape((n * width, h))?.index_select(&last, 0)?; // (n, h)
        let scores = last_hidden
            .matmul(&self.head.as_tensor().t()?.contiguous()?)?
            .squeeze(1)?
            .to_dtype(DType::F32)?;
        Ok(scores)
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
        let mut out = Vec::with_capacity(seqs.len());
        for chunk in seqs.chunks(2 * self.cfg.micro_batch) {
            let chunk: Vec<&[u32]> = chunk.iter().map(Vec::as_slice).collect();
            out.extend(self.scores_of(&chunk)?.to_vec1::<f32>()?);
        }
        Ok(out)
    }

    /// Scores (prompt, response) pairs, like the actor's `RewardModel::score_pairs`.
    pub fn score_pairs(&self, pairs: &[(&str, &str)]) -> Result<Vec<f32>> {
        let seqs = pairs
            .iter()
            .map(|(p, r)| self.encode_pair(p, r))
            .collect::<Result<Vec<_>>>()?;
        self.score_ids(&seqs)
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

    /// Writes the reward model into `dir` (which must not exist yet) atomically: `config.json`,
    /// `model.safetensors` (all tensors in the model's dtype), `tokenizer.json`, the optional
    /// `tokenizer_config.json` (give it whenever the chat template is not the built-in ChatML,
    /// or the loaded model will render conversations differently), then `COMPLETE`.
    pub fn save(
        &self,
        dir: &Path,
        tokenizer_json: &[u8],
        tokenizer_config_json: Option<&[u8]>,
    ) -> Result<()> {
        if dir.exists() {
            return Err(LearnerError::io(
                dir,
                std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "a reward model is never overwritten; remove it first",
                ),
            ));
        }
        let name = dir
            .file_name()
            .ok_or_else(|| {
                LearnerError::InvalidConfig(format!("{}: not a directory name", dir.display()))
            })?
            .to_string_lossy()
            .into_owned();
        let parent = match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&parent).map_err(|e| LearnerError::io(&parent, e))?;
        let tmp = parent.join(format!("{name}.tmp"));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(|e| LearnerError::io(&tmp, e))?;
        }
        fs::create_dir(&tmp).map_err(|e| LearnerError::io(&tmp, e))?;

        let torch_dtype = match self.model.dtype() {
            DType::BF16 => "bfloat16",
            DType::F16 => "float16",
            _ => "float32",
        };
        let config_path = tmp.join("config.json");
        let config = serde_json::to_vec_pretty(&self.model.config().to_hf_json(torch_dtype))
            .map_err(|e| LearnerError::json(&config_path, e))?;
        write_synced(&config_path, &config)?;
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        let digest = write_safetensors(&tmp.join("model.safetensors"), &self.tensors(), &meta)?;
        write_synced(&tmp.join("tokenizer.json"), tokenizer_json)?;
        if let Some(bytes) = tokenizer_config_json {
            write_synced(&tmp.join("tokenizer_config.json"), bytes)?;
        }
        write_synced(
            &tmp.join(COMPLETE_FILE),
            format!("{:08x}\n", digest.crc32c).as_bytes(),
        )?;
        fsync_dir(&tmp)?;
        fs::rename(&tmp, dir).map_err(|e| LearnerError::io(dir, e))?;
        fsync_dir(&parent)
    }
}

fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| LearnerError::io(dir, e))
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |e| LearnerError::io(path, e);
    let mut file = File::create(path).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)
}

/// Whether `dir` holds a completely saved reward model (its `COMPLETE` marker exists).
pub fn is_complete(dir: &Path) -> bool {
    dir.join(COMPLETE_FILE).is_file()
}

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
    /// Where the model was saved.
    pub out_dir: PathBuf,
}

/// Trains a reward model on the pairs of `train` for `cfg.steps` steps, reports held-out
/// accuracy before and after when `heldout` is given, saves the model into `out_dir` (see
/// [`RmTrainer::save`]) and returns the report. `on_step` sees every step's statistics.
pub fn train_reward_model(
    inputs: RmInputs,
    train: &Path,
    heldout: Option<&Path>,
    out_dir: &Path,
    cfg: &RmTrainConfig,
    mut on_step: impl FnMut(&RmStepStats),
) -> Result<RmReport> {
    cfg.validate()?;
    let train_raw = load_pairs(train)?;
    let heldout_raw = heldout.map(load_pairs).transpose()?;
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
            train.display(),
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
                    path.display(),
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
        out_dir: out_dir.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use cascade_shared::chat::ChatTemplate;
    use cascade_shared::model::{random_weights, Checkpoint};
    use cascade_shared::tokenizer::{tiny_tokenizer, Tokenizer, TokenizerConfig};

    fn tiny_chat() -> Chat {
        let tokenizer =
            Tokenizer::new(tiny_tokenizer(), TokenizerConfig::default(), "tiny").unwrap();
        Chat::new(tokenizer, ChatTemplate::chatml())
    }

    fn tiny_config() -> ModelConfig {
        ModelConfig::from_json_str(
            r#"{"model_type": "qwen3", "vocab_size": 264, "hidden_size": 32,
                "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 256,
                "initializer_range": 0.2}"#,
        )
        .unwrap()
    }

    fn tiny_trainer(head: HeadInit, cfg: RmTrainConfig) -> RmTrainer {
        let mcfg = tiny_config();
        let w = random_weights(&mcfg, 7, &Device::Cpu).unwrap();
        RmTrainer::from_tensors(&mcfg, w, head, tiny_chat(), cfg).unwrap()
    }

    /// Separable synthetic pairs: a short concise answer beats a long repetitive one.
    fn synthetic_pairs(n: usize, offset: usize) -> Vec<PreferencePair> {
        let words = ["cat", "blue", "seven", "river", "tree", "moon"];
        (offset..offset + n)
            .map(|i| {
                let (a, b) = (i % 13, (i * 7) % 11);
                let w = words[i % words.len()];
                PreferencePair {
                    prompt: format!("Q{i}: what is {a} plus {b}?"),
                    chosen: format!("{}.", a + b),
                    rejected: format!("{w} {w} {w} {w} {w} {w} {w} {w} so {w} {w} {w}"),
                }
            })
            .collect()
    }

    fn softplus_f64(x: f64) -> f64 {
        x.max(0.0) + (-x.abs()).exp().ln_1p()
    }

    #[test]
    fn bt_loss_matches_the_formula() {
        let d = Device::Cpu;
        let c = [0.3f32, -1.2, 2.0, 0.0, 50.0, -60.0, 100.0];
        let r = [0.1f32, 0.4, 2.0, 0.0, -40.0, 60.0, -100.0];
        let ct = Tensor::new(&c, &d).unwrap();
        let rt = Tensor::new(&r, &d).unwrap();
        let loss = pairwise_loss(&ct, &rt).unwrap().to_vec1::<f32>().unwrap();
        for i in 0..c.len() {
            let dlt = c[i] as f64 - r[i] as f64;
            let expected = -(1.0 / (1.0 + (-dlt).exp())).ln();
            // −log σ(d) = softplus(−d), checked against the plain formula where it is exact.
            let expected = if expected.is_finite() {
                expected
            } else {
                softplus_f64(-dlt)
            };
            assert!(
                (loss[i] as f64 - expected).abs() <= 1e-6 * expected.max(1.0),
                "pair {i}: {} vs {expected}",
                loss[i]
            );
        }
        // Gradient wrt the chosen score: −σ(−d); at a tie exactly −½.
        let cv = Var::new(&c, &d).unwrap();
        let l = pairwise_loss(cv.as_tensor(), &rt)
            .unwrap()
            .sum_all()
            .unwrap();
        let g = l.backward().unwrap();
        let g = g.get(cv.as_tensor()).unwrap().to_vec1::<f32>().unwrap();
        for i in 0..c.len() {
            let dlt = c[i] as f64 - r[i] as f64;
            let expected = -1.0 / (1.0 + dlt.exp());
            assert!((g[i] as f64 - expected).abs() < 1e-6, "grad {i}: {}", g[i]);
        }
        assert_eq!(g[3], -0.5);
    }

    #[test]
    fn malformed_line_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pairs.jsonl");
        fs::write(
            &path,
            "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\", \"id\": 3}\n\n\
             {\"prompt\": \"p\", \"chosen\": \"a\"}\n",
        )
        .unwrap();
        let err = load_pairs(&path).unwrap_err().to_string();
        assert!(err.contains("pairs.jsonl"), "{err}");
        assert!(err.contains("line 3"), "{err}");
        assert!(err.contains("rejected"), "{err}");
        fs::write(
            &path,
            "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\nnope\n",
        )
        .unwrap();
        let err = load_pairs(&path).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
        fs::write(
            &path,
            "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n",
        )
        .unwrap();
        assert_eq!(load_pairs(&path).unwrap().len(), 1);
    }

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
        let grad = grad.to_vec1::<f32>().unwrap();
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
        let report = train_reward_model(inputs, &train, Some(&heldout), &out, &cfg, |s| {
            losses.push(s.loss)
        })
        .unwrap();
        eprintln!("{report:?}\nlosses {losses:?}");
        assert_eq!(losses.len(), 40);
        assert_eq!(report.heldout_accuracy_before, Some(0.5));
        assert!(report.heldout_accuracy.unwrap() >= 0.9, "{report:?}");
        let head: f64 = losses[..5].iter().sum::<f64>() / 5.0;
        let tail: f64 = losses[35..].iter().sum::<f64>() / 5.0;
        assert!(tail < 0.5 * head, "loss {head} → {tail}");
        assert_eq!(report.skipped_too_long, 0);

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
}
