//! `cascade`: the one binary. Each subcommand lives in its own file under `commands/`.

mod commands;
mod heldout;

use clap::{Parser, Subcommand};

/// The allocator. Candle allocates a fresh buffer for every tensor op; with glibc's malloc each
/// large one is a new mmap that the kernel zero-fills page by page and unmaps on drop. On the
/// tiny default's SFT steps that was a third of all CPU time, in the kernel. mimalloc with
/// purging off (`cascade_shared::device::keep_freed_memory`) keeps freed pages for reuse. The
/// counting wrapper gives the heap's peak (`peak_heap_mb` in the metrics) beside the RSS, which
/// also holds the pages kept.
#[global_allocator]
static GLOBAL: cascade_shared::metrics::CountingAlloc<mimalloc::MiMalloc> =
    cascade_shared::metrics::CountingAlloc(mimalloc::MiMalloc);

/// Cascade RL: train reasoning language models one domain after another, with separate actor
/// and learner processes connected by a memory-mapped replay log.
#[derive(Parser, Debug)]
#[command(name = "cascade", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of the largest variant (`run`, with every config flag)
// costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
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
    /// Run the learner: SFT, reward-model training and GRPO stage after stage.
    Learner(commands::learner::LearnerCmdArgs),
    /// Run the whole cascade: learner + actors as supervised child processes, held-out table,
    /// report.
    Run(commands::run::RunArgs),
    /// Evaluate a model on a prompt file with the training verifiers (pass@1, pass@k).
    Eval(commands::eval::EvalArgs),
    /// Dataset tools (`cascade data tiny`).
    #[command(subcommand)]
    Data(commands::data::DataCommand),
    /// Whether a run fits its devices: memory per process, device and stage, before launch.
    Plan(commands::plan::PlanArgs),
    /// Write the HTML report of a run.
    Report(commands::report::ReportArgs),
}

/// Raises the soft limit on open files to the hard one: a dataset given as a directory or glob
/// of shards keeps each file open from its indexing on (read by position, never reopened), and
/// distributions start processes at a soft limit of 1024 under a much higher hard one. The
/// sandbox of model-written code sets its own, low, limit in the child.
fn raise_open_file_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn main() {
    cascade_shared::device::set_cpu_pool_defaults();
    raise_open_file_limit();
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        cascade_shared::device::keep_freed_memory();
    }
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Inspect(cmd) => commands::inspect::run(cmd),
        Command::InitModel(args) => commands::init_model::run(args),
        Command::Replay(cmd) => commands::replay::run(cmd),
        Command::Score(args) => commands::score::run(args),
        Command::Actor(args) => commands::actor::run(args),
        Command::Learner(args) => commands::learner::run(args),
        Command::Run(args) => commands::run::run(args),
        Command::Plan(args) => commands::plan::run(args),
        Command::Eval(args) => commands::eval::run(args),
        Command::Data(cmd) => commands::data::run(cmd),
        Command::Report(args) => commands::report::run(args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::exit(1);
        }
    }
}
