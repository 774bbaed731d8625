//! One file per subcommand. Each exposes clap args and `run(args) -> anyhow::Result<i32>`
//! returning the process exit code.

pub mod actor;
pub mod data;
pub mod eval;
pub mod init_model;
pub mod inspect;
pub mod learner;
pub mod plan;
pub mod replay;
pub mod report;
pub mod run;
pub mod score;
