//! `cascade init-model`.
use clap::Args;

/// Arguments of `cascade init-model`.
#[derive(Args, Debug)]
pub struct InitModelArgs {}

/// Runs `cascade init-model`.
pub fn run(_args: InitModelArgs) -> anyhow::Result<i32> {
    anyhow::bail!("cascade init-model is not built yet")
}
