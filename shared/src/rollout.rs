//! The rollout record: what an actor produces for one prompt (a GRPO group) and the learner
//! trains on. Serialised with postcard behind an explicit format version, so that a log written
//! by another build is refused with a clear error instead of being misread.

use serde::{Deserialize, Serialize};

/// Version of the [`RolloutGroup`] encoding. Bump on any change to the structs below.
pub const ROLLOUT_FORMAT_VERSION: u16 = 2;

/// Magic prefix of an encoded group ("RG"), before the little-endian format version.
const ROLLOUT_MAGIC: [u8; 2] = *b"RG";

/// The kind of a cascade stage. Its `u8` value travels in the replay record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum StageKind {
    /// Supervised fine-tuning (no rollouts; listed so a stage index is total).
    Sft = 0,
    /// RL from a reward model's scores.
    Rlhf = 1,
    /// Instruction-following RL with IFEval-style verifiable constraints.
    If = 2,
    /// Math RL with a `\boxed{}` answer checker.
    Math = 3,
    /// Code RL with sandboxed unit tests.
    Code = 4,
    /// Execution-free software-engineering RL (patch similarity).
    Swe = 5,
}

impl StageKind {
    /// Every stage kind, in cascade order.
    pub const ALL: [StageKind; 6] = [
        StageKind::Sft,
        StageKind::Rlhf,
        StageKind::If,
        StageKind::Math,
        StageKind::Code,
        StageKind::Swe,
    ];

    /// The lower-case name used in configs, metrics and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            StageKind::Sft => "sft",
            StageKind::Rlhf => "rlhf",
            StageKind::If => "if",
            StageKind::Math => "math",
            StageKind::Code => "code",
            StageKind::Swe => "swe",
        }
    }

    /// Parses a lower-case stage name.
    pub fn parse(name: &str) -> Option<StageKind> {
        StageKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// The byte stored in replay headers.
    pub fn to_u8(self) -> u8 {
        self as u8
    }

    /// Inverse of [`StageKind::to_u8`].
    pub fn from_u8(v: u8) -> Option<StageKind> {
        StageKind::ALL.get(v as usize).copied()
    }
}

impl std::fmt::Display for StageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether the model was asked to think (`/think`) or answer directly (`/no_think`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Reasoning inside `<think>…</think>` before the answer.
    Think,
    /// An empty `<think>\n\n</think>\n\n` then the answer.
    NoThink,
}

impl Mode {
    /// `"think"` or `"no_think"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Think => "think",
            Mode::NoThink => "no_think",
        }
    }

    /// Parses `"think"` / `"no_think"`.
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "think" => Some(Mode::Think),
            "no_think" => Some(Mode::NoThink),
            _ => None,
        }
    }
}

/// Why generation of a sample ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model emitted `<|im_end|>` or EOS.
    Stop,
    /// The stage's max response tokens was reached (an overlong, truncated sample).
    Length,
    /// Generation was interrupted (shutdown, prompt too long for the context).
    Abort,
}

/// From token index `start_token` on, the tokens were sampled by policy `version`.
/// A sample generated entirely by one policy has exactly one span starting at 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionSpan {
    /// First response token index produced by this version.
    pub start_token: u32,
    /// Policy (snapshot) version.
    pub version: u64,
}

/// Wall-clock timing of one sample, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct SampleTiming {
    /// From the prompt entering the batch to the last token.
    pub generate_ms: f32,
    /// Time spent in the verifier.
    pub reward_ms: f32,
}

/// One response of a group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Generated token ids (without the prompt).
    pub response_ids: Vec<u32>,
    /// log_softmax(logits / T)[token] of each response token under the behaviour policy,
    /// before top-k/top-p truncation; one per entry of `response_ids`.
    pub behaviour_logprobs: Vec<f32>,
    /// Which policy version produced which tokens (at least one span).
    pub policy_versions: Vec<VersionSpan>,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// The scalar reward used for the advantage.
    pub reward: f32,
    /// Per-verifier parts of the reward (name, value), for metrics.
    pub reward_breakdown: Vec<(String, f32)>,
    /// Timing.
    pub timing: SampleTiming,
}

impl Sample {
    /// The oldest policy version that produced any token of this sample.
    pub fn min_policy_version(&self) -> u64 {
        self.policy_versions
            .iter()
            .map(|s| s.version)
            .min()
            .unwrap_or(0)
    }
}

/// The G responses to one prompt, with everything the learner needs for a GRPO update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutGroup {
    /// Stage kind the prompt belongs to.
    pub stage: StageKind,
    /// Index of the stage in the run's cascade (two math stages differ here).
    pub stage_index: u32,
    /// Stable id of the prompt within its dataset (for curriculum and filtering state).
    pub prompt_id: u64,
    /// Think or no-think.
    pub mode: Mode,
    /// The actor that generated the group.
    pub actor_id: u32,
    /// Prompt token ids (the rendered chat template up to the assistant turn).
    pub prompt_ids: Vec<u32>,
    /// The softmax temperature of the behaviour log-probs: `log_softmax(logits / T)`. The
    /// learner computes the policy's log-probs at the same temperature, so that the importance
    /// ratio compares like with like (1 for an on-policy sample). 1 for greedy decoding.
    /// In JSON (fixtures, `replay inspect --json`), an absent field reads as 1.
    #[serde(default = "unit_temperature")]
    pub temperature: f32,
    /// The G samples.
    pub samples: Vec<Sample>,
}

fn unit_temperature() -> f32 {
    1.0
}

impl RolloutGroup {
    /// The oldest policy version of any token in the group (what staleness is measured on).
    pub fn min_policy_version(&self) -> u64 {
        self.samples
            .iter()
            .map(Sample::min_policy_version)
            .min()
            .unwrap_or(0)
    }

    /// Encodes as magic + format version + postcard body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.prompt_ids.len() * 4);
        out.extend_from_slice(&ROLLOUT_MAGIC);
        out.extend_from_slice(&ROLLOUT_FORMAT_VERSION.to_le_bytes());
        // Serialising plain structs into a Vec cannot fail.
        let body = postcard::to_allocvec(self).expect("postcard encoding of RolloutGroup");
        out.extend_from_slice(&body);
        out
    }

    /// Decodes bytes written by [`RolloutGroup::encode`]; an unknown version or a malformed body
    /// is an error, never a partial value.
    pub fn decode(bytes: &[u8]) -> Result<RolloutGroup, RolloutDecodeError> {
        if bytes.len() < 4 || bytes[..2] != ROLLOUT_MAGIC {
            return Err(RolloutDecodeError::BadMagic);
        }
        let version = u16::from_le_bytes([bytes[2], bytes[3]]);
        if version != ROLLOUT_FORMAT_VERSION {
            return Err(RolloutDecodeError::UnknownVersion {
                found: version,
                supported: ROLLOUT_FORMAT_VERSION,
            });
        }
        let (group, rest): (RolloutGroup, &[u8]) = postcard::take_from_bytes(&bytes[4..])
            .map_err(|e| RolloutDecodeError::Malformed(e.to_string()))?;
        if !rest.is_empty() {
            return Err(RolloutDecodeError::Malformed(format!(
                "{} trailing bytes after the group",
                rest.len()
            )));
        }
        Ok(group)
    }
}

/// Why a payload could not be decoded as a [`RolloutGroup`].
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RolloutDecodeError {
    /// The payload does not start with the rollout magic.
    #[error("not a rollout group (bad magic)")]
    BadMagic,
    /// Written by a build with another format version.
    #[error(
        "rollout format version {found} is not supported (this build reads version {supported})"
    )]
    UnknownVersion {
        /// Version in the payload.
        found: u16,
        /// Version this build reads.
        supported: u16,
    },
    /// The body does not parse.
    #[error("malformed rollout group: {0}")]
    Malformed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group() -> RolloutGroup {
        RolloutGroup {
            stage: StageKind::Math,
            stage_index: 3,
            prompt_id: 42,
            mode: Mode::Think,
            actor_id: 1,
            prompt_ids: vec![1, 2, 3],
            temperature: 1.0,
            samples: vec![Sample {
                response_ids: vec![7, 8],
                behaviour_logprobs: vec![-0.5, -1.25],
                policy_versions: vec![
                    VersionSpan {
                        start_token: 0,
                        version: 4,
                    },
                    VersionSpan {
                        start_token: 1,
                        version: 5,
                    },
                ],
                finish_reason: FinishReason::Stop,
                reward: 1.0,
                reward_breakdown: vec![("math".into(), 1.0)],
                timing: SampleTiming {
                    generate_ms: 3.0,
                    reward_ms: 0.1,
                },
            }],
        }
    }

    #[test]
    fn round_trip() {
        let g = group();
        assert_eq!(RolloutGroup::decode(&g.encode()).unwrap(), g);
        assert_eq!(g.min_policy_version(), 4);
    }

    #[test]
    fn unknown_version_is_refused() {
        let mut bytes = group().encode();
        bytes[2] = 99;
        assert!(matches!(
            RolloutGroup::decode(&bytes),
            Err(RolloutDecodeError::UnknownVersion { found: 99, .. })
        ));
    }

    #[test]
    fn truncated_is_malformed() {
        let bytes = group().encode();
        assert!(RolloutGroup::decode(&bytes[..bytes.len() - 3]).is_err());
        assert!(RolloutGroup::decode(&[]).is_err());
    }
}
