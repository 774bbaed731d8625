//! `cascade`: the one binary. Each subcommand lives in its own file under `commands/`.

mod commands;

use clap::{Parser, Subcommand};

/// Cascade RL: train reasoning language models one domain after another, with separate actor
/// and learner processes connected by a memory-mapped replay log.
#[derive(Parser, Debug)]
#[command(name = "cascade", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Look at a model: per-token log-probs or a greedy/sampled generation.
    #[command(subcommand)]
    Inspect(commands::inspect::InspectCommand),
    /// Create a randomly initialised checkpoint (Hugging Face layout) from a config.
    InitModel(commands::init_model::InitModelArgs),
    /// Tools for the replay log.
    #[command(subcommand)]
    Replay(commands::replay::ReplayCommand),
    /// Run a rollout actor: generate, score and log groups until SIGTERM.
    Actor(commands::actor::ActorArgs),
    /// Score responses with the verifiers (one JSON line in, one JSON line out).
    Score(commands::score::ScoreArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(cmd) => commands::inspect::run(cmd),
        Command::InitModel(args) => commands::init_model::run(args),
        Command::Replay(cmd) => commands::replay::run(cmd),
        Command::Score(args) => commands::score::run(args),
        Command::Actor(args) => commands::actor::run(args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::exit(1);
        }
    }
}
