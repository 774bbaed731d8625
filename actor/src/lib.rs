//! cascade-actor: batched think/no-think rollout generation, samplers (CPU reference and CUDA
//! kernels), snapshot hot-reload and writing rollouts to the replay log.
//!
//! [`run`] is the actor process (start, prompt schedule, main loop); [`verifiers`] builds the
//! verifier of a stage (also used by the binary's evaluation); [`engine`] and [`sampler`]
//! generate; [`rewards`] scores finished groups off the decode thread and writes them out.
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod dataset;
pub mod engine;
pub mod error;
pub mod eval;
pub mod judge;
pub mod reward_model;
pub mod rewards;
pub mod run;
pub mod sampler;
pub mod snapshot_watch;
pub mod verifiers;
