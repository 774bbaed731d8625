//! cascade-replay: the memory-mapped, crash-safe rollout log from actors to the learner.
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]
