//! cascade-learner: GRPO, SFT and reward-model training, AdamW, snapshot publishing and resume.
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]
