//! The verifier of a stage: which [`Verifier`] scores a stage kind, built from the stage's
//! `[verifier]` options ([`verifier_for`]), and the actor's wait for a reward model that the
//! learner trains inside the run ([`build_verifier`]). Used by the actor's run loop and by the
//! binary's `eval` and held-out evaluation.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use candle_core::Device;
use cascade_rewards::code::{CodeConfig, SandboxConfig};
use cascade_rewards::ifeval::{IfEvalConfig, IfEvalMode};
use cascade_rewards::math::MathConfig;
use cascade_rewards::swe::{LexicalFallback, SemanticScorer, TestScorer};
use cascade_rewards::{
    CodeVerifier, IfEvalVerifier, MathVerifier, Reward, SplitResponse, SweVerifier, Verifier,
    VerifyError,
};
use cascade_shared::config::{IfStrictness, RunConfig, VerifierConfig};
use cascade_shared::StageKind;

use crate::error::{ActorError, Result};
use crate::judge::JudgeScorer;
use crate::reward_model::RewardModel;

/// The verifier of a stage kind with the stage's verifier options. `rm_dir` is the reward
/// model (rlhf, and any stage with `rm_weight > 0`, see [`RmBlend`]), `judge_dir` the SWE judge
/// model (resolved paths; `None`: no judge, the lexical fallback).
pub fn verifier_for(
    kind: StageKind,
    v: &VerifierConfig,
    rm_dir: Option<&Path>,
    judge_dir: Option<&Path>,
    device: &Device,
) -> Result<Arc<dyn Verifier>> {
    let rule = rule_verifier_for(kind, v, rm_dir, judge_dir, device)?;
    if v.rm_weight > 0.0 && kind != StageKind::Rlhf {
        let dir = rm_dir.ok_or_else(|| {
            ActorError::Invalid(format!(
                "verifier.rm_weight = {} needs a reward model (verifier.reward_model or a [reward_model] section)",
                v.rm_weight
            ))
        })?;
        return Ok(Arc::new(RmBlend {
            rule,
            rm: RewardModel::load(dir, device)?,
            rule_weight: v.rule_weight,
            rm_weight: v.rm_weight,
        }));
    }
    Ok(rule)
}

/// A verifiable stage's reward combined with the reward model's score of the same final answer:
/// `rule_weight × rule + rm_weight × rm` (`verifier.rule_weight`, `verifier.rm_weight`).
/// RECIPE.md combines IF-RL's rule reward with the RM score so that satisfying the constraints
/// with an answer the RM dislikes does not pay; it works for any verifiable stage. The rule
/// verifier's details are kept, with `rule_reward` and `rm_score` added (both reach the stage's
/// reward breakdown in `metrics.jsonl`).
pub struct RmBlend {
    rule: Arc<dyn Verifier>,
    rm: RewardModel,
    rule_weight: f32,
    rm_weight: f32,
}

impl Verifier for RmBlend {
    fn name(&self) -> &'static str {
        self.rule.name()
    }

    fn verify(
        &self,
        reference: &serde_json::Value,
        response: &SplitResponse<'_>,
    ) -> std::result::Result<Reward, VerifyError> {
        let rule = self.rule.verify(reference, response)?;
        let rm = self.rm.verify(reference, response)?.reward;
        let mut details = match rule.details {
            serde_json::Value::Object(o) => o,
            serde_json::Value::Null => serde_json::Map::new(),
            other => serde_json::Map::from_iter([("rule_details".to_string(), other)]),
        };
        details.insert("rule_reward".into(), rule.reward.into());
        details.insert("rm_score".into(), rm.into());
        Ok(Reward {
            reward: self.rule_weight * rule.reward + self.rm_weight * rm,
            details: serde_json::Value::Object(details),
        })
    }
}

/// The code sandbox's settings of a stage (its code verifier, and the SWE test scorer).
fn code_config(v: &VerifierConfig) -> CodeConfig {
    CodeConfig {
        default_timeout_s: v.code_timeout_s,
        sandbox: SandboxConfig {
            address_space_bytes: v.code_memory_mb.saturating_mul(1 << 20),
            ..SandboxConfig::default()
        },
    }
}

/// The stage kind's own verifier, without the reward-model blend.
fn rule_verifier_for(
    kind: StageKind,
    v: &VerifierConfig,
    rm_dir: Option<&Path>,
    judge_dir: Option<&Path>,
    device: &Device,
) -> Result<Arc<dyn Verifier>> {
    Ok(match kind {
        StageKind::Math => Arc::new(MathVerifier::new(MathConfig {
            percent_equivalence: v.math_percent_equivalence,
            ..MathConfig::default()
        })),
        StageKind::If => Arc::new(IfEvalVerifier::new(IfEvalConfig {
            mode: if v.if_strictness == IfStrictness::Loose {
                IfEvalMode::Loose
            } else {
                IfEvalMode::Strict
            },
            ..IfEvalConfig::default()
        })),
        StageKind::Code => Arc::new(
            CodeVerifier::new(code_config(v))
                .map_err(|e| ActorError::Invalid(format!("code verifier: {e}")))?,
        ),
        StageKind::Swe => {
            let semantic: Box<dyn SemanticScorer> = match judge_dir {
                Some(dir) => Box::new(JudgeScorer::load(dir, device)?),
                None => Box::new(LexicalFallback),
            };
            Arc::new(SweVerifier::new(if v.swe_tests {
                Box::new(TestScorer::new(code_config(v), semantic))
            } else {
                semantic
            }))
        }
        StageKind::Rlhf => {
            let dir = rm_dir.ok_or_else(|| {
                ActorError::Invalid("the rlhf verifier needs a reward model".into())
            })?;
            Arc::new(RewardModel::load(dir, device)?)
        }
        StageKind::Sft => {
            return Err(ActorError::Invalid(
                "SFT data has no verifier (no rollouts)".into(),
            ))
        }
    })
}

/// The verifier of stage `index`. A reward model that the learner trains inside the run
/// (`[reward_model]`) is waited for (until its `COMPLETE` marker appears or `stop` is set).
pub fn build_verifier(
    index: usize,
    config: &RunConfig,
    run_dir: &Path,
    device: &Device,
    stop: &AtomicBool,
) -> Result<Arc<dyn Verifier>> {
    let stage = config.stages.get(index).ok_or_else(|| {
        ActorError::Invalid(format!("stage index {index} is not in the run config"))
    })?;
    let rm_dir = config.reward_model_dir(index, run_dir);
    if stage.kind == StageKind::Rlhf && rm_dir.is_none() {
        return Err(ActorError::Invalid(format!(
            "stage {}: rlhf needs verifier.reward_model or a [reward_model] section",
            stage.name
        )));
    }
    if let (true, Some(dir)) = (config.uses_trained_reward_model(index), &rm_dir) {
        let mut logged = false;
        while !dir.join("COMPLETE").exists() {
            if stop.load(Ordering::Relaxed) {
                return Err(ActorError::Invalid(
                    "stopped while waiting for the reward model".into(),
                ));
            }
            if !logged {
                tracing::info!("waiting for the learner to train {}", dir.display());
                logged = true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let judge = stage.verifier.swe_judge.as_ref().map(|p| config.resolve(p));
    verifier_for(
        stage.kind,
        &stage.verifier,
        rm_dir.as_deref(),
        judge.as_deref(),
        device,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cascade_shared::chat::split_response;
    use cascade_shared::data::presets::Mapped;
    use cascade_shared::data::{MapOptions, Preset};

    /// A LiveCodeBench LeetCode row and an APPS `fn_name` row, mapped by their presets, are
    /// scored by the code stage's verifier from their call-based fields.
    #[test]
    fn code_stage_scores_call_based_rows_as_the_presets_emit_them() {
        let v = verifier_for(
            StageKind::Code,
            &VerifierConfig::default(),
            None,
            None,
            &Device::Cpu,
        )
        .expect("sandbox available");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/rewards/code");
        let cases = [
            (
                "livecodebench_real.jsonl",
                Preset::LiveCodeBench,
                "class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n        for i, x in enumerate(nums):\n            if target - x in seen:\n                return [seen[target - x], i]\n            seen[x] = i\n",
            ),
            (
                "apps_real.jsonl",
                Preset::Apps,
                "def even_or_odd(number):\n    return 'Odd' if number % 2 else 'Even'\n",
            ),
        ];
        for (file, preset, solution) in cases {
            // `Preset::map` directly: the reader's per-domain check (record.rs) still rejects
            // rows with only call-based tests.
            let text = std::fs::read_to_string(dir.join(file)).unwrap();
            let first = serde_json::from_str(text.lines().next().unwrap()).unwrap();
            let Mapped::Row(obj) = preset.map(first, &MapOptions::default()).unwrap() else {
                panic!("{file}: skipped");
            };
            let reference = serde_json::Value::Object(obj);
            assert!(reference.get("call_tests").is_some(), "{file}");
            for (answer, want) in [(solution, 1.0), ("def nothing():\n    pass\n", 0.0)] {
                let response = format!("```python\n{answer}```");
                let r = v.verify(&reference, &split_response(&response)).unwrap();
                assert_eq!(r.reward, want, "{file}: {}", r.details);
            }
        }
    }
}
