//! The actor process: load weights, generate groups for the current stage, score them, write
//! them to the replay log, hot-reload snapshots between decode steps, stop cleanly on SIGTERM.
//!
//! - `options`: what a run is given ([`ActorOptions`]) and what it reports ([`RunSummary`]);
//! - `start`: waiting for weights (a snapshot, or the run's initial model) and the RL stage to
//!   work on;
//! - `stage`: the current stage's dataset, verifier, sampling settings and prompt schedule;
//! - `seeds`: the seeded per-prompt draws ([`choose_mode`]) and seed mixing;
//! - `actor_loop`: the main loop ([`run_actor`]).
//!
//! The verifier of a stage is built by [`crate::verifiers`].

mod actor_loop;
mod options;
mod seeds;
mod stage;
mod start;

pub use actor_loop::{run_actor, run_actor_with};
pub use options::{ActorOptions, RolloutOverrides, RunSummary};
pub use seeds::choose_mode;
