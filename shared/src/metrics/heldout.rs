//! `RUN_DIR/heldout.json`: the held-out table of a run (written by `cascade run` at the end,
//! read by the report).
//!
//! Every RL domain's held-out score after the SFT stages (row `sft`) and after each RL stage,
//! measured on the stage-final snapshots. The score of a domain is the mean reward of
//! `[eval] samples` sampled responses per held-out prompt, with the domain's training verifier.
//! Each row also keeps every prompt's mean reward (`prompt_scores`) and the standard error of
//! each score over prompts (`stderr`). Rows are evaluated on the same prompts with the same
//! sampler seeds, so the change a stage makes to its own domain is measured as a paired
//! difference over prompts (`gains`), which is much less noisy than the difference of two
//! means.
//!
//! A score that is not a number is written as `null` (JSON has no NaN) and reads back as NaN.
//! Fields added after the first tables (`stderr`, `prompt_scores`, `gains`, and `policy_version`
//! in hand-written tables) may be absent.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// File name of the held-out table inside a run directory.
pub const HELDOUT_FILE: &str = "heldout.json";

/// The whole table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HeldoutTable {
    /// The RL domains with a held-out set, in cascade order.
    #[serde(default)]
    pub domains: Vec<String>,
    /// Rows in cascade order.
    #[serde(default)]
    pub rows: Vec<HeldoutRow>,
    /// Each RL stage's change to its own domain's score.
    #[serde(default)]
    pub gains: Vec<StageGain>,
}

/// One row: the scores after a stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldoutRow {
    /// `sft` or the RL stage's name.
    pub after_stage: String,
    /// Domain → score.
    #[serde(default, deserialize_with = "nan_for_null_values")]
    pub scores: BTreeMap<String, f64>,
    /// The snapshot evaluated (`cascade run` always writes it).
    #[serde(default)]
    pub policy_version: Option<u64>,
    /// Domain → standard error of the score over prompts.
    #[serde(default, deserialize_with = "nan_for_null_values")]
    pub stderr: BTreeMap<String, f64>,
    /// Domain → prompt id → that prompt's mean reward.
    #[serde(default)]
    pub prompt_scores: BTreeMap<String, BTreeMap<u64, f64>>,
}

/// What an RL stage did to its own domain: the paired difference against the previous row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageGain {
    /// The RL stage (its row's `after_stage`).
    pub stage: String,
    /// Its domain.
    pub domain: String,
    /// The previous row's score.
    #[serde(default = "nan", deserialize_with = "nan_for_null")]
    pub before: f64,
    /// This row's score.
    #[serde(default = "nan", deserialize_with = "nan_for_null")]
    pub after: f64,
    /// Mean over the prompts scored in both rows of (after − before).
    #[serde(deserialize_with = "nan_for_null")]
    pub diff: f64,
    /// Standard error of `diff` (paired over prompts).
    #[serde(deserialize_with = "nan_for_null")]
    pub se: f64,
    /// Prompts in the comparison.
    #[serde(default)]
    pub prompts: usize,
}

fn nan() -> f64 {
    f64::NAN
}

/// A number written as `null` (a NaN when it was written) reads as NaN.
pub(super) fn nan_for_null<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// A map of numbers where `null` (a NaN when it was written) reads as NaN.
fn nan_for_null_values<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, f64>, D::Error> {
    let map = BTreeMap::<String, Option<f64>>::deserialize(d)?;
    Ok(map
        .into_iter()
        .map(|(k, v)| (k, v.unwrap_or(f64::NAN)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_written_before_gains_existed_still_parse() {
        let old = r#"{"domains":["math"],"rows":[{"after_stage":"sft","scores":{"math":0.5},"policy_version":3}]}"#;
        let t: HeldoutTable = serde_json::from_str(old).unwrap();
        assert!(t.gains.is_empty() && t.rows[0].prompt_scores.is_empty());
        assert_eq!(t.rows[0].policy_version, Some(3));
    }

    #[test]
    fn a_nan_score_round_trips_as_null() {
        let row = HeldoutRow {
            after_stage: "sft".into(),
            scores: [("math".to_string(), f64::NAN), ("code".to_string(), 0.25)].into(),
            policy_version: Some(1),
            stderr: BTreeMap::new(),
            prompt_scores: [("code".to_string(), [(7, 0.25)].into())].into(),
        };
        let text = serde_json::to_string(&row).unwrap();
        assert!(text.contains(r#""math":null"#), "{text}");
        assert!(
            text.contains(r#""prompt_scores":{"code":{"7":0.25}}"#),
            "{text}"
        );
        let back: HeldoutRow = serde_json::from_str(&text).unwrap();
        assert!(back.scores["math"].is_nan());
        assert_eq!(back.scores["code"], 0.25);
        assert_eq!(back.prompt_scores, row.prompt_scores);
    }

    #[test]
    fn gains_without_the_scores_read() {
        let g: StageGain =
            serde_json::from_str(r#"{"stage":"m","domain":"math","diff":0.03,"se":0.01}"#).unwrap();
        assert!(g.before.is_nan() && g.after.is_nan());
        assert_eq!((g.diff, g.se, g.prompts), (0.03, 0.01, 0));
    }
}
