//! `cascade inspect logprobs|generate`.
use clap::Subcommand;

/// Inspect subcommands.
#[derive(Subcommand, Debug)]
pub enum InspectCommand {}

/// Runs an inspect subcommand.
pub fn run(cmd: InspectCommand) -> anyhow::Result<i32> {
    match cmd {}
}
