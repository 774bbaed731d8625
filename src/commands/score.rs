//! `cascade score`.
use clap::Args;

/// Arguments of `cascade score`.
#[derive(Args, Debug)]
pub struct ScoreArgs {}

/// Runs `cascade score`.
pub fn run(_args: ScoreArgs) -> anyhow::Result<i32> {
    anyhow::bail!("cascade score is not built yet")
}
