//! `[outcomes]`: per-prompt outcome tracking and retirement (see [`crate::outcomes`]). The
//! learner records outcomes and publishes the tracker in every snapshot; actors skip retired
//! prompts with the same settings, so both sides read them from here.

use serde::{Deserialize, Serialize};

use super::error::{invalid, Result};

/// Retirement settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutcomeConfig {
    /// Track and retire at all.
    pub enabled: bool,
    /// A sample with reward ≥ this counts as solved.
    pub solved_threshold: f32,
    /// Consecutive uniform observations before a prompt is retired (≥ 1).
    pub retire_after: u32,
    /// Probability that a retired always-solved prompt is drawn anyway.
    pub return_prob_solved: f64,
    /// Probability that a retired never-solved prompt is drawn anyway.
    pub return_prob_unsolved: f64,
}

impl Default for OutcomeConfig {
    fn default() -> Self {
        OutcomeConfig {
            enabled: true,
            solved_threshold: 1.0,
            retire_after: 1,
            return_prob_solved: 0.05,
            return_prob_unsolved: 0.1,
        }
    }
}

impl OutcomeConfig {
    /// Checks ranges; part of [`super::RunConfig::validate`].
    pub fn validate(&self) -> Result<()> {
        let prob = |p: f64| (0.0..=1.0).contains(&p);
        for (key, p) in [
            ("outcomes.return_prob_solved", self.return_prob_solved),
            ("outcomes.return_prob_unsolved", self.return_prob_unsolved),
        ] {
            if !prob(p) {
                return Err(invalid(key, format!("must be in [0, 1], got {p}")));
            }
        }
        if self.retire_after == 0 {
            return Err(invalid("outcomes.retire_after", "must be ≥ 1"));
        }
        if !self.solved_threshold.is_finite() {
            return Err(invalid("outcomes.solved_threshold", "must be finite"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_values_name_their_key() {
        assert!(OutcomeConfig::default().validate().is_ok());
        let e = OutcomeConfig {
            return_prob_unsolved: 1.5,
            ..OutcomeConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(
            e.to_string().contains("outcomes.return_prob_unsolved"),
            "{e}"
        );
        let e = OutcomeConfig {
            retire_after: 0,
            ..OutcomeConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("outcomes.retire_after"), "{e}");
    }
}
