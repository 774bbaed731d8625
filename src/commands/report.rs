//! `cascade report DIR`: the HTML report of a run (plots and the held-out table).

use std::path::PathBuf;

use anyhow::Context;
use cascade_report::{write_report, ReportOptions};
use clap::Args;

/// Arguments of `cascade report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Another run of the same config to compare wall-clock with (e.g. the on-policy run
    /// `--max-staleness 0` against the asynchronous default).
    #[arg(long)]
    pub compare: Option<PathBuf>,
}

/// Runs `cascade report`.
pub fn run(args: ReportArgs) -> anyhow::Result<i32> {
    let summary = write_report(
        &args.run_dir,
        &ReportOptions {
            compare: args.compare.clone(),
        },
    )
    .with_context(|| format!("writing the report of {}", args.run_dir.display()))?;
    println!("report: {}", summary.index_html.display());
    if let Some(w) = summary.wall_s {
        println!("wall-clock: {w:.1} s");
    }
    if let Some(f) = summary.idle_fraction {
        println!("learner idle fraction: {:.1}%", 100.0 * f);
    }
    if let Some(c) = &summary.compare {
        println!(
            "compared with {}: {:.1} s (max_staleness {:?}); ratio other/this = {:.2}",
            args.compare
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            c.other_wall_s.unwrap_or(f64::NAN),
            c.other_max_staleness,
            c.ratio.unwrap_or(f64::NAN)
        );
    }
    Ok(0)
}
