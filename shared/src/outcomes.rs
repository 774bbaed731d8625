//! Per-prompt outcome tracking: prompts the policy always solves or never solves carry no
//! learning signal, so they are retired for later epochs and come back with a small,
//! configurable probability (the policy may have changed).
//!
//! A prompt's group is *all solved* when every sample's reward is ≥ `solved_threshold`, *none
//! solved* when every reward is below it. After `retire_after` consecutive all-solved (resp.
//! none-solved) observations the prompt is retired; any mixed observation makes it active again.
//! [`PromptTracker::should_draw`] is the sampler's question: active prompts are always drawn,
//! retired ones with `return_prob_solved` / `return_prob_unsolved`. The RNG is seeded and its
//! position is part of the saved state.

use std::collections::BTreeMap;

use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

pub use crate::config::OutcomeConfig;
use crate::rng::{seeded, uniform, BadRngState, RngState};

/// Where a prompt stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptStatus {
    /// Drawn normally.
    Active,
    /// Always solved lately.
    RetiredSolved,
    /// Never solved lately.
    RetiredUnsolved,
}

/// What is remembered about one prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptRecord {
    /// Groups observed.
    pub observations: u32,
    /// Consecutive all-solved observations up to the latest.
    pub solved_streak: u32,
    /// Consecutive none-solved observations up to the latest.
    pub unsolved_streak: u32,
}

/// The serialisable state of a [`PromptTracker`] (goes into `state.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrackerState {
    /// Per-prompt records (JSON object keys are the prompt ids as strings).
    pub records: BTreeMap<u64, PromptRecord>,
    /// The RNG position.
    pub rng: RngState,
    /// Retired prompts that were drawn again.
    pub returned: u64,
}

/// Tracks outcomes and answers "draw this prompt?".
#[derive(Debug, Clone)]
pub struct PromptTracker {
    cfg: OutcomeConfig,
    records: BTreeMap<u64, PromptRecord>,
    rng: ChaCha8Rng,
    returned: u64,
}

impl PromptTracker {
    /// An empty tracker with a seeded RNG. `cfg` is validated with the run config
    /// ([`crate::config::RunConfig::validate`]).
    pub fn new(cfg: OutcomeConfig, seed: u64) -> Self {
        PromptTracker {
            cfg,
            records: BTreeMap::new(),
            rng: seeded(seed),
            returned: 0,
        }
    }

    /// A tracker continuing from saved state.
    pub fn from_state(cfg: OutcomeConfig, state: &TrackerState) -> Result<Self, BadRngState> {
        Ok(PromptTracker {
            cfg,
            records: state.records.clone(),
            rng: state.rng.restore()?,
            returned: state.returned,
        })
    }

    /// The state to save.
    pub fn state(&self) -> TrackerState {
        TrackerState {
            records: self.records.clone(),
            rng: RngState::capture(&self.rng),
            returned: self.returned,
        }
    }

    /// Records a group's rewards for `prompt_id` and returns the prompt's new status.
    pub fn record(&mut self, prompt_id: u64, rewards: &[f32]) -> PromptStatus {
        if !self.cfg.enabled || rewards.is_empty() {
            return self.status(prompt_id);
        }
        let solved = rewards
            .iter()
            .filter(|&&r| r >= self.cfg.solved_threshold)
            .count();
        let rec = self.records.entry(prompt_id).or_default();
        rec.observations += 1;
        if solved == rewards.len() {
            rec.solved_streak += 1;
            rec.unsolved_streak = 0;
        } else if solved == 0 {
            rec.unsolved_streak += 1;
            rec.solved_streak = 0;
        } else {
            rec.solved_streak = 0;
            rec.unsolved_streak = 0;
        }
        self.status(prompt_id)
    }

    /// The prompt's status (unknown prompts are active).
    pub fn status(&self, prompt_id: u64) -> PromptStatus {
        if !self.cfg.enabled {
            return PromptStatus::Active;
        }
        match self.records.get(&prompt_id) {
            Some(r) if r.solved_streak >= self.cfg.retire_after => PromptStatus::RetiredSolved,
            Some(r) if r.unsolved_streak >= self.cfg.retire_after => PromptStatus::RetiredUnsolved,
            _ => PromptStatus::Active,
        }
    }

    /// Whether the sampler should use `prompt_id` now. Consumes one RNG draw per retired prompt
    /// asked about (none for active ones), so the answer sequence is reproducible.
    pub fn should_draw(&mut self, prompt_id: u64) -> bool {
        let p = match self.status(prompt_id) {
            PromptStatus::Active => return true,
            PromptStatus::RetiredSolved => self.cfg.return_prob_solved,
            PromptStatus::RetiredUnsolved => self.cfg.return_prob_unsolved,
        };
        let back = uniform(&mut self.rng) < p;
        if back {
            self.returned += 1;
        }
        back
    }

    /// Numbers of (retired-solved, retired-unsolved) prompts.
    pub fn retired_counts(&self) -> (usize, usize) {
        let mut counts = (0, 0);
        for id in self.records.keys() {
            match self.status(*id) {
                PromptStatus::RetiredSolved => counts.0 += 1,
                PromptStatus::RetiredUnsolved => counts.1 += 1,
                PromptStatus::Active => {}
            }
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker(retire_after: u32) -> PromptTracker {
        PromptTracker::new(
            OutcomeConfig {
                retire_after,
                return_prob_solved: 0.25,
                return_prob_unsolved: 0.0,
                ..OutcomeConfig::default()
            },
            7,
        )
    }

    #[test]
    fn retire_and_reactivate() {
        let mut t = tracker(2);
        assert_eq!(t.record(1, &[1.0, 1.0]), PromptStatus::Active);
        assert_eq!(t.record(1, &[1.0, 1.0]), PromptStatus::RetiredSolved);
        assert_eq!(t.record(2, &[0.0, 0.5]), PromptStatus::Active);
        assert_eq!(t.record(2, &[0.0, 0.0]), PromptStatus::RetiredUnsolved);
        assert_eq!(t.retired_counts(), (1, 1));
        // A mixed outcome brings it back.
        assert_eq!(t.record(1, &[1.0, 0.0]), PromptStatus::Active);
        assert!(t.should_draw(1));
        // Never-solved with return probability 0 is never drawn.
        assert!((0..100).all(|_| !t.should_draw(2)));
    }

    #[test]
    fn return_probability_and_reproducible_state() {
        let mut t = tracker(1);
        t.record(5, &[1.0]);
        let saved = t.state();
        let draws: Vec<bool> = (0..4000).map(|_| t.should_draw(5)).collect();
        // Seeded (7): the exact number of returns is known; that it is near 4000 · 0.25 (within
        // 0.03 · 4000 = 120, about 4.4 binomial standard deviations) says the rate is right.
        let returned = draws.iter().filter(|&&d| d).count();
        assert_eq!(
            returned, 984,
            "returns of a retired-solved prompt in 4000 draws"
        );
        let rate = returned as f64 / draws.len() as f64;
        assert!((rate - 0.25).abs() < 0.03, "{rate}");

        let json = serde_json::to_string(&saved).unwrap();
        let state: TrackerState = serde_json::from_str(&json).unwrap();
        let mut resumed = PromptTracker::from_state(t.cfg.clone(), &state).unwrap();
        let again: Vec<bool> = (0..4000).map(|_| resumed.should_draw(5)).collect();
        assert_eq!(draws, again);
    }

    #[test]
    fn disabled_tracker_keeps_everything_active() {
        let mut t = PromptTracker::new(
            OutcomeConfig {
                enabled: false,
                ..OutcomeConfig::default()
            },
            1,
        );
        t.record(1, &[1.0, 1.0]);
        assert_eq!(t.status(1), PromptStatus::Active);
        assert!(t.should_draw(1));
    }
}
