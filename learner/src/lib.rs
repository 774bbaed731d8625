//! cascade-learner: GRPO, SFT and reward-model training, AdamW, snapshot publishing and resume.
//!
//! The pieces, in the order a GRPO step uses them:
//! [`filter::GroupFilter`] (bad input, staleness, dynamic filtering) →
//! [`batch::GrpoBatch`] (advantages, padding, micro-batches) →
//! [`train_step::accumulate_grpo_gradients`] ([`grpo::grpo_loss`] per micro-batch on a
//! [`PolicyModel`]) → [`optim::AdamW::step`] with [`schedule::LrSchedule`] →
//! [`snapshot::publish`] every `publish_every` steps.
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod batch;
pub mod error;
pub mod filter;
pub mod grpo;
pub mod optim;
pub mod outcomes;
pub mod policy;
pub mod reward_run;
pub mod reward_train;
pub mod rng;
pub mod run;
pub mod schedule;
pub mod sft;
pub mod snapshot;
pub mod state;
pub mod tensor_io;
pub mod train_step;

pub use batch::{GrpoBatch, LossNormaliser, MicroBatch};
pub use error::{LearnerError, Result};
pub use filter::{DropReason, FilterConfig, FilterMetrics, GroupFilter};
pub use grpo::{GrpoConfig, GrpoStats, KlEstimator, LossAggregation};
pub use optim::{AdamW, AdamWConfig, StepOutcome};
pub use outcomes::{OutcomeConfig, PromptTracker};
pub use policy::PolicyModel;
pub use schedule::{LrSchedule, ScheduleKind};
pub use state::LearnerState;
