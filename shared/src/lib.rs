//! cascade-shared: what every cascade process needs — the run configuration, the Qwen3-family
//! model in candle (training and decode paths), the tokenizer and chat template, the rollout
//! record schema and the transport traits, the snapshot format that the learner publishes and
//! the actors read, the published learner state and the prompt tracker both sides keep, and
//! the schemas of the run's metric files (`metrics.jsonl` events and `heldout.json`, in
//! [`metrics`]).
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod chat;
pub mod collective;
pub mod config;
pub mod data;
pub mod device;
pub mod intake;
pub mod metrics;
pub mod model;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod outcomes;
pub mod plan;
pub mod reward_head;
pub mod rng;
pub mod rollout;
pub mod snapshot;
pub mod tokenizer;
pub mod transport;

pub use rollout::{FinishReason, Mode, RolloutGroup, Sample, SampleTiming, StageKind, VersionSpan};
