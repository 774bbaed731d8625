//! `[[stages]]`: one entry per cascade stage (SFT stages first, then RL stages).
//!
//! Defaults follow RECIPE.md: AdamW betas (0.9, 0.95), cosine schedule, temperature 1.0,
//! top-p 1.0, G = 8, token-level loss aggregation, no KL, clip ε 0.2, std-normalised GRPO
//! advantages. Two guards that RECIPE.md does not name are on by default because they change
//! nothing in its strictly on-policy mode (every ratio is 1 there) and bound what one
//! off-policy batch can do: a dual clip at 3 and, for stages that add a KL term, an
//! importance-weighted k3 estimate with a bounded log-ratio (issue 19).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::dataset::DatasetEntry;
use super::error::{invalid, Result};
use crate::StageKind;

/// Learning-rate schedule after warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// Constant learning rate.
    Constant,
    /// Cosine decay to zero over the stage's steps.
    #[default]
    Cosine,
}

/// How the policy loss is averaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossAgg {
    /// Sum over all tokens of the batch / number of tokens (the paper's choice).
    #[default]
    Token,
    /// Mean over each sequence's tokens, then over sequences (used for RLHF stability).
    Sequence,
}

/// How the per-token KL to the stage's start policy is estimated (stages with `kl_coef > 0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// TRL's k3, `exp(r − lp) − (r − lp) − 1`, on the batch's tokens as they are: exponential
    /// in how far the policy has moved below the reference on a token an older policy sampled.
    K3,
    /// k3 weighted by the stop-gradient importance ratio π_θ/π_behaviour (DeepSeek-V3.2): the
    /// same as `k3` on-policy, and an unbiased estimate of the policy's KL off-policy.
    #[default]
    K3Is,
}

/// Strict or loose IFEval checking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IfStrictness {
    /// The response as is.
    #[default]
    Strict,
    /// Also accept after IFEval's loose transformations (strip markdown, first/last line).
    Loose,
}

/// Max response tokens: one number, or a length curriculum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum MaxResponseTokens {
    /// One limit for the whole stage.
    Fixed(usize),
    /// Limits in order; the stage moves to the next one at each of `curriculum_steps`.
    Curriculum(Vec<usize>),
}

impl<'de> Deserialize<'de> for MaxResponseTokens {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = MaxResponseTokens;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a token count or a list of token counts (a length curriculum)")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<Self::Value, E> {
                Ok(MaxResponseTokens::Fixed(v as usize))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<Self::Value, E> {
                usize::try_from(v)
                    .map(MaxResponseTokens::Fixed)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(v) = seq.next_element::<usize>()? {
                    out.push(v);
                }
                Ok(MaxResponseTokens::Curriculum(out))
            }
        }
        d.deserialize_any(Visit)
    }
}

/// Verifier options of a stage (`[stages.verifier]`); each verifier reads its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VerifierConfig {
    /// Math: accept `50\%` for `0.5` and the reverse.
    pub math_percent_equivalence: bool,
    /// Instruction following: strict or loose checking.
    pub if_strictness: IfStrictness,
    /// Code: wall-clock limit of one test run, in seconds.
    pub code_timeout_s: f64,
    /// Code: address-space limit of the sandboxed process, in MiB.
    pub code_memory_mb: u64,
    /// SWE: a judge model's checkpoint directory. The semantic score of a patch that is neither
    /// empty, unparsable nor identical to the gold is the judge's P(YES) to "do these two
    /// patches fix the same issue?"; without a judge it falls back to the lexical ratio.
    pub swe_judge: Option<PathBuf>,
    /// SWE: for rows that carry their repository and a test (`files`, `test_code`,
    /// `entry_point`), the semantic score is whether the patched repository passes the test
    /// (1 or 0, run in the code sandbox under `code_timeout_s` and `code_memory_mb`) instead of
    /// the judge's or the lexical ratio; other rows still go to the judge or the lexical ratio.
    pub swe_tests: bool,
    /// Reward-model checkpoint directory (RLHF; IF when `rm_weight` > 0).
    pub reward_model: Option<PathBuf>,
    /// Verifiable stages (if, math, code, swe): weight of the reward model's score of the final
    /// answer in the reward, `rule_weight × rule + rm_weight × rm` (0: the rule reward alone).
    /// RECIPE.md combines IF-RL's rule reward with the RM score. An rlhf stage's reward is the
    /// RM score alone, whatever the weights say.
    pub rm_weight: f32,
    /// Weight of the rule-based (verifiable) score in the reward when `rm_weight` > 0.
    pub rule_weight: f32,
}

impl Default for VerifierConfig {
    fn default() -> Self {
        VerifierConfig {
            math_percent_equivalence: true,
            if_strictness: IfStrictness::Strict,
            code_timeout_s: 10.0,
            code_memory_mb: 1024,
            swe_judge: None,
            swe_tests: true,
            reward_model: None,
            rm_weight: 0.0,
            rule_weight: 1.0,
        }
    }
}

/// One cascade stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageConfig {
    /// Unique name (used in metrics, snapshots and `--set stages.NAME.key=...`).
    pub name: String,
    /// sft | rlhf | if | math | code | swe.
    pub kind: StageKind,
    /// Training data: a file, a glob or a directory of JSONL / Parquet shards (relative to the
    /// config file), optionally with its schema (see [`DatasetEntry`]).
    pub dataset: DatasetEntry,
    /// Held-out evaluation data, as `dataset`.
    #[serde(default)]
    pub heldout: Option<DatasetEntry>,
    /// Optimizer steps of the stage.
    pub steps: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warm-up steps.
    #[serde(default)]
    pub warmup_steps: usize,
    /// Schedule after warm-up.
    #[serde(default)]
    pub schedule: Schedule,
    /// AdamW betas.
    #[serde(default = "default_betas")]
    pub betas: [f64; 2],
    /// AdamW decoupled weight decay.
    #[serde(default)]
    pub weight_decay: f64,
    /// Global gradient-norm clip.
    #[serde(default = "default_grad_clip")]
    pub grad_clip: f64,
    /// Prompts per optimizer step (SFT: sequences per step).
    #[serde(default = "default_batch_prompts")]
    pub batch_prompts: usize,
    /// Responses per prompt (GRPO group size G); RL only.
    #[serde(default = "default_group_size")]
    pub group_size: usize,
    /// Fraction of prompts rendered in thinking mode (the rest `/no_think`).
    #[serde(default = "default_mode_mix")]
    pub mode_mix: f64,
    /// Max response tokens, or a list for a length curriculum; default `actor.max_new_tokens`.
    #[serde(default)]
    pub max_response_tokens: Option<MaxResponseTokens>,
    /// Stage steps at which the curriculum moves to its next length (one fewer than lengths).
    #[serde(default)]
    pub curriculum_steps: Vec<usize>,
    /// Sampling temperature of rollouts.
    #[serde(default = "default_temperature")]
    pub temperature: f32,
    /// Nucleus threshold of rollouts.
    #[serde(default = "default_top_p")]
    pub top_p: f32,
    /// KL penalty coefficient against the stage's starting policy (0 = none).
    #[serde(default)]
    pub kl_coef: f64,
    /// KL estimator: `k3_is` (k3 weighted by π_θ/π_behaviour) or `k3` (TRL, unweighted).
    #[serde(default)]
    pub kl_estimator: KlEstimator,
    /// Bound δ on the log-ratio `log π_ref − log π_θ` inside the KL estimate: past it the
    /// estimate grows linearly (slope e^δ − 1) instead of exponentially, and the `k3_is`
    /// weight is at most e^δ, so no token's KL gradient exceeds `kl_coef·e^δ·(e^δ − 1)`.
    /// 0 = unbounded.
    #[serde(default = "default_kl_log_ratio_max")]
    pub kl_log_ratio_max: f64,
    /// Dual clip c (> 1): for a negative advantage, a token's surrogate loss is at most
    /// c·|A| however large π_θ/π_behaviour is (no effect on-policy, where the ratio is 1).
    /// 0 = off (plain PPO clipping).
    #[serde(default = "default_dual_clip")]
    pub dual_clip: f64,
    /// Loss aggregation.
    #[serde(default)]
    pub loss_agg: LossAgg,
    /// Lower clip ε of the importance ratio (1 − ε_low).
    #[serde(default = "default_eps")]
    pub eps_low: f64,
    /// Upper clip ε of the importance ratio (1 + ε_high).
    #[serde(default = "default_eps")]
    pub eps_high: f64,
    /// Truncated importance-sampling cap on π_old/π_behaviour (none = no correction).
    #[serde(default)]
    pub tis_cap: Option<f64>,
    /// Mask truncated (overlong) samples out of the loss.
    #[serde(default)]
    pub overlong_mask: bool,
    /// Override of `learner.max_staleness` for this stage.
    #[serde(default)]
    pub max_staleness: Option<u64>,
    /// Divide group advantages by the group's reward std.
    #[serde(default = "default_true")]
    pub std_normalize: bool,
    /// SFT only: max packed sequence length in tokens.
    #[serde(default)]
    pub token_budget: Option<usize>,
    /// Verifier options.
    #[serde(default)]
    pub verifier: VerifierConfig,
    /// RL only: an SFT term added to every step's loss (InstructGPT's "PPO-ptx"; not in
    /// RECIPE.md), which keeps the answer formats of every domain while one domain's reward
    /// moves the policy.
    #[serde(default)]
    pub sft_mix: Option<SftMix>,
}

/// `[stages.sft_mix]`: supervised rows mixed into an RL stage's steps. Each step adds
/// `coef` × the mean negative log-likelihood per trained token of `rows` packed rows of
/// `dataset` (SFT conversations) to the GRPO loss; the rows follow on from step to step in a
/// seeded order (resumable: row `k` of step `s` is row `s·rows + k`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftMix {
    /// SFT conversations, as an SFT stage's `dataset`.
    pub dataset: DatasetEntry,
    /// Weight of the SFT loss against the GRPO loss (> 0).
    pub coef: f64,
    /// Packed rows per step.
    #[serde(default = "default_sft_mix_rows")]
    pub rows: usize,
    /// Max packed row length in tokens (default 2048, as SFT stages).
    #[serde(default)]
    pub token_budget: Option<usize>,
    /// Earlier RL stages (by name) whose best responses join the mix: of every group such a
    /// stage trained on, the response with the highest reward, when it is above the group's
    /// mean, as the policy sampled it (prompt and response tokens). What an RL stage taught
    /// has no gold answer in `dataset` (the rlhf stage's answers are the ones its reward
    /// model ranks higher, not the SFT ones), so replaying them holds it while later stages
    /// train (experience replay).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replay: Vec<String>,
    /// Packed rows per step from the `replay` stages' best responses, on top of `rows`
    /// (default 1 when `replay` names a stage).
    #[serde(default = "default_sft_mix_replay_rows")]
    pub replay_rows: usize,
}

fn default_sft_mix_rows() -> usize {
    2
}

fn default_sft_mix_replay_rows() -> usize {
    1
}

fn default_betas() -> [f64; 2] {
    [0.9, 0.95]
}
fn default_grad_clip() -> f64 {
    1.0
}
fn default_batch_prompts() -> usize {
    128
}
fn default_group_size() -> usize {
    8
}
fn default_mode_mix() -> f64 {
    0.5
}
fn default_temperature() -> f32 {
    1.0
}
fn default_top_p() -> f32 {
    1.0
}
fn default_eps() -> f64 {
    0.2
}
fn default_kl_log_ratio_max() -> f64 {
    2.0
}
fn default_dual_clip() -> f64 {
    3.0
}
fn default_true() -> bool {
    true
}

/// `x ≥ 0`, false for NaN.
fn non_negative(x: f64) -> bool {
    x >= 0.0
}

/// `x > 0`, false for NaN.
fn positive(x: f64) -> bool {
    x > 0.0
}

/// Checks 0 < top_p ≤ 1.
pub(crate) fn check_top_p(key: &str, top_p: f32) -> Result<()> {
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(invalid(
            key,
            format!("must satisfy 0 < top_p ≤ 1, got {top_p}"),
        ));
    }
    Ok(())
}

impl StageConfig {
    /// Whether this is an RL stage (anything but SFT).
    pub fn is_rl(&self) -> bool {
        self.kind != StageKind::Sft
    }

    /// Max response tokens at `step` of this stage (`default` when the stage sets none).
    pub fn max_response_tokens_at(&self, step: usize, default: usize) -> usize {
        match &self.max_response_tokens {
            None => default,
            Some(MaxResponseTokens::Fixed(n)) => *n,
            Some(MaxResponseTokens::Curriculum(lengths)) => {
                let phase = self.curriculum_steps.iter().filter(|&&s| step >= s).count();
                lengths[phase.min(lengths.len() - 1)]
            }
        }
    }

    /// The longest `max_response_tokens` of this stage over its curriculum (`default` when
    /// it sets none).
    pub fn longest_response(&self, default: usize) -> usize {
        match &self.max_response_tokens {
            None => default,
            Some(MaxResponseTokens::Fixed(n)) => *n,
            Some(MaxResponseTokens::Curriculum(lengths)) => {
                lengths.iter().copied().max().unwrap_or(0)
            }
        }
    }

    /// Staleness bound of this stage.
    pub fn max_staleness_or(&self, learner_default: u64) -> u64 {
        self.max_staleness.unwrap_or(learner_default)
    }

    /// Checks this stage alone; `at` is its key prefix (`stages[2]`).
    pub(crate) fn validate(&self, at: &str, trained_rm: bool) -> Result<()> {
        let key = |k: &str| format!("{at}.{k}");
        if self.name.trim().is_empty() {
            return Err(invalid(key("name"), "must not be empty"));
        }
        if self.steps == 0 {
            return Err(invalid(key("steps"), "must be at least 1"));
        }
        self.dataset.validate(&key("dataset"))?;
        if let Some(h) = &self.heldout {
            h.validate(&key("heldout"))?;
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return Err(invalid(key("lr"), format!("must be > 0, got {}", self.lr)));
        }
        if self.warmup_steps > self.steps {
            return Err(invalid(
                key("warmup_steps"),
                format!(
                    "{} exceeds the stage's {} steps",
                    self.warmup_steps, self.steps
                ),
            ));
        }
        for (i, b) in self.betas.iter().enumerate() {
            if !(0.0..1.0).contains(b) {
                return Err(invalid(
                    format!("{at}.betas[{i}]"),
                    format!("must be in [0, 1), got {b}"),
                ));
            }
        }
        if !non_negative(self.weight_decay) {
            return Err(invalid(key("weight_decay"), "must be ≥ 0"));
        }
        if !positive(self.grad_clip) {
            return Err(invalid(key("grad_clip"), "must be > 0"));
        }
        if self.batch_prompts == 0 {
            return Err(invalid(key("batch_prompts"), "must be at least 1"));
        }
        if !(0.0..=1.0).contains(&self.mode_mix) {
            return Err(invalid(
                key("mode_mix"),
                format!(
                    "is the fraction of thinking prompts, in [0, 1]; got {}",
                    self.mode_mix
                ),
            ));
        }
        check_top_p(&key("top_p"), self.top_p)?;
        if !(self.temperature > 0.0 && self.temperature.is_finite()) {
            return Err(invalid(
                key("temperature"),
                format!(
                    "must be > 0 for training rollouts, got {}",
                    self.temperature
                ),
            ));
        }
        if !non_negative(self.kl_coef) {
            return Err(invalid(key("kl_coef"), "must be ≥ 0"));
        }
        if !(non_negative(self.kl_log_ratio_max) && self.kl_log_ratio_max.is_finite()) {
            return Err(invalid(
                key("kl_log_ratio_max"),
                format!("must be ≥ 0 (0 = unbounded), got {}", self.kl_log_ratio_max),
            ));
        }
        if !(self.dual_clip == 0.0 || (self.dual_clip > 1.0 && self.dual_clip.is_finite())) {
            return Err(invalid(
                key("dual_clip"),
                format!("must be > 1 (or 0 = off), got {}", self.dual_clip),
            ));
        }
        if !(self.eps_low >= 0.0 && self.eps_low < 1.0) {
            return Err(invalid(key("eps_low"), "must be in [0, 1)"));
        }
        if !non_negative(self.eps_high) {
            return Err(invalid(key("eps_high"), "must be ≥ 0"));
        }
        if let Some(cap) = self.tis_cap {
            if !positive(cap) {
                return Err(invalid(key("tis_cap"), format!("must be > 0, got {cap}")));
            }
        }
        if self.is_rl() {
            if self.group_size < 2 {
                return Err(invalid(
                    key("group_size"),
                    format!(
                        "GRPO needs at least 2 responses per prompt, got {}",
                        self.group_size
                    ),
                ));
            }
            if self.token_budget.is_some() {
                return Err(invalid(
                    key("token_budget"),
                    "applies to SFT stages only (RL rows are packed by learner.token_budget)",
                ));
            }
        } else if self.token_budget == Some(0) {
            return Err(invalid(key("token_budget"), "must be at least 1"));
        }
        if let Some(mix) = &self.sft_mix {
            if !self.is_rl() {
                return Err(invalid(
                    key("sft_mix"),
                    "applies to RL stages only (an SFT stage is all SFT)",
                ));
            }
            mix.dataset.validate(&key("sft_mix.dataset"))?;
            if !(mix.coef > 0.0 && mix.coef.is_finite()) {
                return Err(invalid(
                    key("sft_mix.coef"),
                    format!("must be > 0 (leave sft_mix out for none), got {}", mix.coef),
                ));
            }
            if mix.rows == 0 {
                return Err(invalid(key("sft_mix.rows"), "must be at least 1"));
            }
            if mix.token_budget == Some(0) {
                return Err(invalid(key("sft_mix.token_budget"), "must be at least 1"));
            }
            if !mix.replay.is_empty() && mix.replay_rows == 0 {
                return Err(invalid(
                    key("sft_mix.replay_rows"),
                    "must be at least 1 when sft_mix.replay names a stage",
                ));
            }
        }
        self.validate_lengths(at)?;
        self.validate_verifier(at, trained_rm)
    }

    /// Checks that `learner.token_budget` (`budget`, 0 = no packing) holds the longest sample
    /// this RL stage can produce: its longest `max_response_tokens` (`default_max_new` when it
    /// sets none) and at least one prompt token. Prompt lengths are known only at batching,
    /// where a longer sample is refused by name.
    pub(crate) fn check_token_budget(
        &self,
        at: &str,
        budget: usize,
        default_max_new: usize,
    ) -> Result<()> {
        if budget == 0 || !self.is_rl() {
            return Ok(());
        }
        let longest = self.longest_response(default_max_new);
        if budget <= longest {
            return Err(invalid(
                "learner.token_budget",
                format!(
                    "{budget} tokens cannot hold a sample of {at} ({:?}): up to {longest} \
                     response tokens (max_response_tokens) + at least 1 prompt token",
                    self.name
                ),
            ));
        }
        Ok(())
    }

    fn validate_lengths(&self, at: &str) -> Result<()> {
        let steps_key = format!("{at}.curriculum_steps");
        match &self.max_response_tokens {
            None | Some(MaxResponseTokens::Fixed(_)) => {
                if let Some(MaxResponseTokens::Fixed(0)) = self.max_response_tokens {
                    return Err(invalid(
                        format!("{at}.max_response_tokens"),
                        "must be at least 1",
                    ));
                }
                if !self.curriculum_steps.is_empty() {
                    return Err(invalid(
                        steps_key,
                        "needs max_response_tokens to be a list (a length curriculum)",
                    ));
                }
            }
            Some(MaxResponseTokens::Curriculum(lengths)) => {
                if lengths.is_empty() || lengths.contains(&0) {
                    return Err(invalid(
                        format!("{at}.max_response_tokens"),
                        "a curriculum needs one or more lengths, each at least 1",
                    ));
                }
                if self.curriculum_steps.len() + 1 != lengths.len() {
                    return Err(invalid(
                        steps_key,
                        format!(
                            "needs {} step(s) for {} lengths, got {}",
                            lengths.len() - 1,
                            lengths.len(),
                            self.curriculum_steps.len()
                        ),
                    ));
                }
                let increasing = self.curriculum_steps.windows(2).all(|w| w[0] < w[1]);
                let inside = self
                    .curriculum_steps
                    .iter()
                    .all(|&s| s > 0 && s < self.steps);
                if !increasing || !inside {
                    return Err(invalid(
                        steps_key,
                        format!("must increase strictly within (0, {})", self.steps),
                    ));
                }
            }
        }
        Ok(())
    }

    fn validate_verifier(&self, at: &str, trained_rm: bool) -> Result<()> {
        let v = &self.verifier;
        let key = |k: &str| format!("{at}.verifier.{k}");
        if !(v.code_timeout_s > 0.0 && v.code_timeout_s.is_finite()) {
            return Err(invalid(key("code_timeout_s"), "must be > 0"));
        }
        if v.code_memory_mb < 64 {
            return Err(invalid(
                key("code_memory_mb"),
                "must be ≥ 64 (the Python interpreter alone needs tens of MiB)",
            ));
        }
        if !non_negative(v.rm_weight.into()) || !non_negative(v.rule_weight.into()) {
            return Err(invalid(key("rm_weight"), "reward weights must be ≥ 0"));
        }
        if self.kind == StageKind::Rlhf && v.reward_model.is_none() && !trained_rm {
            return Err(invalid(
                key("reward_model"),
                "an rlhf stage needs a reward model (this key, or a [reward_model] section that trains one)",
            ));
        }
        if self.kind != StageKind::Rlhf && v.rm_weight == 0.0 && v.rule_weight != 1.0 {
            return Err(invalid(
                key("rule_weight"),
                "only weighs the rule reward against rm_weight; with rm_weight = 0 it would only rescale the reward, which the group advantage undoes",
            ));
        }
        if v.rm_weight > 0.0 && v.reward_model.is_none() && !trained_rm {
            return Err(invalid(
                key("reward_model"),
                "rm_weight > 0 needs a reward model",
            ));
        }
        Ok(())
    }
}
