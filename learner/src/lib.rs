//! cascade-learner: GRPO, SFT and reward-model training, AdamW, snapshot publishing and resume.
//!
//! The pieces, in the order a GRPO step uses them:
//! [`filter::GroupFilter`] (the one place that decides admission: stage, bad input,
//! duplicates, staleness, dynamic filtering, no-signal steps) →
//! [`batch::GrpoBatch`] (advantages, padded or packed rows, micro-batches) →
//! [`train_step::accumulate_grpo_gradients`] ([`grpo::grpo_loss`] per micro-batch on a
//! [`PolicyModel`]) → [`optim::AdamW::step`] with [`schedule::LrSchedule`] →
//! [`snapshot::publish`] every `publish_every` steps. [`run`] is the stage controller of the
//! learner process; the snapshot format itself (layout, verification, the published
//! [`cascade_shared::snapshot::LearnerState`]) is in `cascade-shared`, shared with the actors.
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod batch;
pub mod error;
pub mod filter;
mod grad_sum;
pub mod grpo;
pub mod optim;
pub mod policy;
pub mod reward_run;
pub mod reward_train;
pub mod run;
pub mod schedule;
pub mod sft;
pub mod snapshot;
pub mod train_step;
pub mod zero;

pub use batch::{BatchConfig, GrpoBatch, LossNormaliser, MicroBatch};
pub use error::{LearnerError, Result};
pub use filter::{DropReason, FilterConfig, FilterMetrics, GroupFilter};
pub use grpo::{GrpoConfig, GrpoStats, KlEstimator, LossAggregation};
pub use optim::{AdamW, AdamWConfig, StepOutcome};
pub use policy::PolicyModel;
pub use schedule::{LrSchedule, ScheduleKind};
