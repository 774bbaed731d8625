//! `cascade plan`: whether a run fits its devices, before anything is launched.
//!
//! For every stage, each process (the learner, every actor) and what it holds on its device —
//! weights, gradients, optimizer state, activations at the stage's largest micro-batch, the KL
//! reference model, the actors' KV caches — summed per device against the device's memory
//! (queried: `nvidia-smi` for CUDA devices, `/proc/meminfo` and the cgroup limit for the CPU; or
//! `--device-memory` for every device). Exits 0 when every stage fits, 2 when one does not (or a
//! device's memory is unknown), 1 on a bad config. `cascade run` runs the same check at start.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::Context;
use cascade_shared::config::{ConfigArgs, Device, RunConfig};
use cascade_shared::model::ModelConfig;
use cascade_shared::plan::{format_bytes, parse_bytes, plan, Plan, PlanOptions};
use clap::Args;

use super::run::{TINY_MODEL_JSON, TINY_TOML};

/// Default of `--prompt-tokens`.
pub const DEFAULT_PROMPT_TOKENS: usize = 2048;
/// Default of `--headroom`.
pub const DEFAULT_HEADROOM: f64 = 0.05;

/// Arguments of `cascade plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// The run configuration and overrides (default: the embedded tiny default).
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Memory of every device, e.g. `80GB`, `141GB`, `96GiB` (default: queried from the devices
    /// of this machine). Plans for other devices than the ones present.
    #[arg(long, value_parser = parse_bytes)]
    pub device_memory: Option<u64>,
    /// The longest prompt the run will see, in tokens (RL prompts are not tokenized to plan).
    #[arg(long, default_value_t = DEFAULT_PROMPT_TOKENS)]
    pub prompt_tokens: usize,
    /// Fraction of each device's memory kept free for what the plan does not count.
    #[arg(long, default_value_t = DEFAULT_HEADROOM, value_parser = parse_headroom)]
    pub headroom: f64,
}

fn parse_headroom(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(x) if (0.0..1.0).contains(&x) => Ok(x),
        _ => Err(format!("{text:?} is not a fraction in [0, 1)")),
    }
}

/// Runs `cascade plan`.
pub fn run(args: PlanArgs) -> anyhow::Result<i32> {
    let embedded = args.config.config.is_none();
    let config = match args.config.load(TINY_TOML, Path::new(".")) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(1);
        }
    };
    let model = match policy_architecture(&config, embedded) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e:#}");
            return Ok(1);
        }
    };
    let opts = PlanOptions {
        prompt_tokens: args.prompt_tokens,
        capacity: capacities(&config, args.device_memory),
        headroom: args.headroom,
    };
    let plan = plan(&config, &model, &reward_models(&config), &opts);
    let text = format!(
        "cascade plan: {} parameters ({} layers, hidden {}, vocabulary {}); learner on {}; \
         actors on {}\n{}",
        plan.parameters,
        model.num_hidden_layers,
        model.hidden_size,
        model.vocab_size,
        device_list(&config.devices.learner_devices()),
        device_list(&config.devices.actor_assignment()),
        plan.render()
    );
    // A reader that stops early (`cascade plan | head`) is not an error; the exit code still
    // says whether the run fits.
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    let unknown = plan.unknown_devices();
    if !unknown.is_empty() {
        eprintln!(
            "error: the memory of {} could not be queried; give --device-memory",
            device_list(&unknown)
        );
    }
    Ok(if plan.fits() { 0 } else { 2 })
}

/// The check `cascade run` makes at start: `Err` with the plan's lines when a stage does not
/// fit a device whose memory is known. Devices whose memory cannot be queried are not held
/// against the run (a warning says so).
pub fn check_run(config: &RunConfig, embedded: bool) -> anyhow::Result<Result<(), String>> {
    let model = policy_architecture(config, embedded)?;
    let opts = PlanOptions {
        prompt_tokens: DEFAULT_PROMPT_TOKENS,
        capacity: capacities(config, None),
        headroom: DEFAULT_HEADROOM,
    };
    let plan = plan(config, &model, &reward_models(config), &opts);
    let unknown = plan.unknown_devices();
    if !unknown.is_empty() {
        tracing::warn!(
            "memory of {} unknown: the run's memory plan is not checked there (`cascade plan \
             --device-memory` plans it)",
            device_list(&unknown)
        );
    }
    let over = plan
        .stages
        .iter()
        .any(|s| s.devices.iter().any(|d| d.fits == Some(false)));
    Ok(if over {
        Err(failing_lines(&plan))
    } else {
        Ok(())
    })
}

/// The stages that do not fit, with their devices' lines and advice.
fn failing_lines(plan: &Plan) -> String {
    let mut out = String::from(
        "the run does not fit its devices (cascade plan --config ... shows every item):\n",
    );
    for stage in &plan.stages {
        for d in stage.devices.iter().filter(|d| d.fits == Some(false)) {
            out.push_str(&format!(
                "  stage {}: {} needs {} of {} usable\n",
                stage.stage,
                d.device,
                format_bytes(d.used),
                format_bytes(d.usable.unwrap_or(0))
            ));
            for a in &d.advice {
                out.push_str(&format!("    → {a}\n"));
            }
        }
    }
    out
}

fn device_list(devices: &[Device]) -> String {
    let mut names: Vec<String> = devices.iter().map(Device::to_string).collect();
    names.dedup();
    names.join(", ")
}

/// The policy's architecture: the embedded tiny model, the checkpoint's `config.json`, or the
/// `init.config` file.
fn policy_architecture(config: &RunConfig, embedded: bool) -> anyhow::Result<ModelConfig> {
    if embedded {
        return ModelConfig::from_json_str(TINY_MODEL_JSON)
            .context("the embedded tiny model config");
    }
    let path = match (&config.model.path, &config.model.init) {
        (Some(dir), _) => config.resolve(dir).join("config.json"),
        (None, Some(init)) => config.resolve(&init.config),
        (None, None) => anyhow::bail!("[model] names neither `path` nor `init`"),
    };
    ModelConfig::from_file(&path).with_context(|| format!("reading {}", path.display()))
}

/// The architectures of the stages' own reward models, where their `config.json` can be read.
fn reward_models(config: &RunConfig) -> BTreeMap<usize, ModelConfig> {
    config
        .stages
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let dir = config.resolve(s.verifier.reward_model.as_ref()?);
            ModelConfig::from_file(&dir.join("config.json"))
                .ok()
                .map(|m| (i, m))
        })
        .collect()
}

/// The memory of every device of the run: `given` for all, or queried.
fn capacities(config: &RunConfig, given: Option<u64>) -> BTreeMap<Device, u64> {
    let mut devices = config.devices.learner_devices();
    devices.extend(config.devices.actor_assignment());
    devices
        .into_iter()
        .filter_map(|d| Some((d, given.or_else(|| query_memory(d))?)))
        .collect()
}

/// A device's memory: for the CPU the smaller of `MemTotal` and the cgroup's `memory.max`;
/// for a CUDA device `nvidia-smi`'s `memory.total`.
fn query_memory(device: Device) -> Option<u64> {
    match device {
        Device::Cpu => {
            let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
            let total = meminfo
                .lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse::<u64>()
                .ok()?
                * 1024;
            let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok());
            Some(cgroup.map_or(total, |c| c.min(total)))
        }
        Device::Cuda(n) => {
            let out = Command::new("nvidia-smi")
                .args([
                    "--query-gpu=memory.total",
                    "--format=csv,noheader,nounits",
                    "-i",
                    &n.to_string(),
                ])
                .output()
                .ok()?;
            if !out.status.success() {
                return None;
            }
            let mib: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
            Some(mib * 1024 * 1024)
        }
    }
}
