//! `cascade replay inspect`: what the actors wrote to the replay log, and whether it is damaged.

use std::path::PathBuf;

use anyhow::Context;
use cascade_replay::{dump, inspect, Report};
use cascade_shared::RolloutGroup;
use clap::{Args, Subcommand};

/// Replay subcommands.
#[derive(Subcommand, Debug)]
pub enum ReplayCommand {
    /// Per actor: record count, seq and policy-version ranges, bytes on disk, and every corrupt
    /// or torn record (file and offset). Exit code 1 when corruption was found.
    Inspect(InspectArgs),
}

/// Arguments of `cascade replay inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// A replay root (`RUN_DIR/replay`) or one actor directory in it.
    pub dir: PathBuf,
    /// Also print the first N records, decoded as rollout groups, one JSON object per line.
    #[arg(long, value_name = "N")]
    pub dump: Option<usize>,
    /// Print the report as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs a replay subcommand.
pub fn run(cmd: ReplayCommand) -> anyhow::Result<i32> {
    match cmd {
        ReplayCommand::Inspect(args) => run_inspect(args),
    }
}

fn run_inspect(args: InspectArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(
        args.dir.is_dir(),
        "{} is not a directory",
        args.dir.display()
    );
    let report =
        inspect(&args.dir).with_context(|| format!("inspecting {}", args.dir.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    if let Some(n) = args.dump {
        for record in dump(&args.dir, n)
            .with_context(|| format!("reading records of {}", args.dir.display()))?
        {
            // A payload that does not decode is shown as an error, never a crash.
            let group = match RolloutGroup::decode(&record.payload) {
                Ok(g) => serde_json::to_value(g)?,
                Err(e) => {
                    serde_json::json!({ "error": e.to_string(), "payload_bytes": record.payload.len() })
                }
            };
            let line = serde_json::json!({
                "actor": record.actor,
                "seq": record.seq,
                "policy_version": record.meta.policy_version,
                "stage": record.meta.stage,
                "kind": record.meta.kind,
                "file": record.path,
                "offset": record.offset,
                "group": group,
            });
            println!("{line}");
        }
    }
    Ok(if report.has_corruption() { 1 } else { 0 })
}

fn range(r: Option<(u64, u64)>) -> String {
    r.map_or_else(|| "-".to_string(), |(lo, hi)| format!("{lo}..={hi}"))
}

fn print_text(report: &Report) {
    if report.actors.is_empty() {
        println!("no actor directories");
    }
    for a in &report.actors {
        println!(
            "{}: {} records, seq {}, policy version {}, {} segments, {} bytes on disk, {} corrupt",
            a.actor,
            a.records,
            range(a.seq_range),
            range(a.policy_version_range),
            a.segments,
            a.bytes_on_disk,
            a.corruptions.len()
        );
        for c in &a.corruptions {
            println!(
                "  CORRUPT {} at offset {}: {}",
                c.path.display(),
                c.offset,
                c.reason
            );
        }
    }
}
