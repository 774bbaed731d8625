//! `cascade replay inspect`.
use clap::Subcommand;

/// Replay subcommands.
#[derive(Subcommand, Debug)]
pub enum ReplayCommand {}

/// Runs a replay subcommand.
pub fn run(cmd: ReplayCommand) -> anyhow::Result<i32> {
    match cmd {}
}
