//! Learning-rate schedules: linear warm-up, then constant or cosine decay.

use serde::{Deserialize, Serialize};

use crate::error::{LearnerError, Result};

/// The shape after warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleKind {
    /// Peak LR until the end.
    #[default]
    Constant,
    /// Half-cosine from the peak down to `min_lr_ratio · peak` at `total_steps`.
    Cosine,
}

/// A warm-up + constant/cosine schedule (the formula of Hugging Face's
/// `get_cosine_schedule_with_warmup`, with a floor): for optimizer step `s` (0-based),
/// `s < warmup`: `peak · (s + 1) / warmup`; afterwards constant `peak`, or
/// `peak · (r + (1 − r) · ½(1 + cos(π · p)))` with `p = (s − warmup) / (total − warmup)`
/// clamped to `[0, 1]` and `r = min_lr_ratio`. Warm-up counts from 1 so that the first step
/// already learns.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LrSchedule {
    /// Peak learning rate.
    pub peak_lr: f64,
    /// Warm-up steps (0 = none).
    pub warmup_steps: u64,
    /// Total optimizer steps of the stage (the cosine reaches its floor here).
    pub total_steps: u64,
    /// Constant or cosine.
    pub kind: ScheduleKind,
    /// Floor of the cosine, as a fraction of the peak.
    pub min_lr_ratio: f64,
}

impl Default for LrSchedule {
    fn default() -> Self {
        LrSchedule {
            peak_lr: 1e-6,
            warmup_steps: 0,
            total_steps: 1,
            kind: ScheduleKind::Constant,
            min_lr_ratio: 0.0,
        }
    }
}

impl LrSchedule {
    /// Checks ranges; call once at start-up.
    pub fn validate(&self) -> Result<()> {
        if !(self.peak_lr >= 0.0 && self.peak_lr.is_finite()) {
            return Err(LearnerError::InvalidConfig(format!(
                "peak_lr {} must be ≥ 0",
                self.peak_lr
            )));
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return Err(LearnerError::InvalidConfig(format!(
                "min_lr_ratio {} must be in [0, 1]",
                self.min_lr_ratio
            )));
        }
        if self.kind == ScheduleKind::Cosine && self.total_steps <= self.warmup_steps {
            return Err(LearnerError::InvalidConfig(format!(
                "cosine schedule: total_steps {} must exceed warmup_steps {}",
                self.total_steps, self.warmup_steps
            )));
        }
        Ok(())
    }

    /// The learning rate of optimizer step `step` (0-based).
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.peak_lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        match self.kind {
            ScheduleKind::Constant => self.peak_lr,
            ScheduleKind::Cosine => {
                let span = self.total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
                let progress = ((step - self.warmup_steps) as f64 / span).clamp(0.0, 1.0);
                let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
                self.peak_lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine() {
        let s = LrSchedule {
            peak_lr: 1.0,
            warmup_steps: 4,
            total_steps: 14,
            kind: ScheduleKind::Cosine,
            min_lr_ratio: 0.1,
        };
        s.validate().unwrap();
        assert_eq!(s.lr(0), 0.25);
        assert_eq!(s.lr(3), 1.0);
        assert_eq!(s.lr(4), 1.0);
        // Half-way through the decay: 0.1 + 0.9 · 0.5.
        assert!((s.lr(9) - 0.55).abs() < 1e-12);
        assert!((s.lr(14) - 0.1).abs() < 1e-12);
        assert!((s.lr(100) - 0.1).abs() < 1e-12);
        // Monotone non-increasing after warm-up.
        assert!((4..20).all(|i| s.lr(i + 1) <= s.lr(i)));
    }

    #[test]
    fn constant_and_validation() {
        let s = LrSchedule {
            peak_lr: 2e-6,
            warmup_steps: 2,
            ..LrSchedule::default()
        };
        assert_eq!(s.lr(0), 1e-6);
        assert_eq!(s.lr(1000), 2e-6);
        let bad = LrSchedule {
            kind: ScheduleKind::Cosine,
            warmup_steps: 5,
            total_steps: 5,
            ..LrSchedule::default()
        };
        assert!(bad.validate().is_err());
    }
}
