//! The run's configuration: where the run lives, the config loaded with the command line's
//! overrides and validated before anything is created, made absolute and saved as
//! `RUN_DIR/config.toml` (which the children read).

use std::path::{Path, PathBuf};

use anyhow::Context;
use cascade_shared::config::{DatasetEntry, DeviceSpec, RunConfig};
use cascade_shared::data::{scan, DataReader, DataSpec, Kind};
use cascade_shared::StageKind;

use super::RunArgs;

/// The embedded tiny default.
pub const TINY_TOML: &str = include_str!("../../../configs/tiny.toml");
/// Its model config.
pub const TINY_MODEL_JSON: &str = include_str!("../../../configs/tiny-model.json");

/// A configuration problem, as one line: `cascade run` prints it and exits with code 2, having
/// created nothing.
pub(super) struct ConfigProblem(pub(super) String);

/// The run directory and whether the run resumes.
pub(super) fn run_dir(args: &RunArgs) -> Result<(PathBuf, bool), ConfigProblem> {
    let (run_dir, resuming) = match (&args.resume, &args.run_dir) {
        (Some(d), _) => (d.clone(), true),
        (None, Some(d)) => (d.clone(), false),
        (None, None) if args.config.config.is_none() => (PathBuf::from("runs/tiny"), false),
        (None, None) => {
            return Err(ConfigProblem(
                "--run-dir: a run with --config needs a run directory".into(),
            ));
        }
    };
    if resuming && !run_dir.join("config.toml").exists() && args.config.config.is_none() {
        return Err(ConfigProblem(format!(
            "--resume {}: not a run directory (no config.toml)",
            run_dir.display()
        )));
    }
    if !resuming && run_dir.join("snapshots").exists() {
        return Err(ConfigProblem(format!(
            "--run-dir {}: already holds a run; continue it with `cascade run --resume {}` or choose a new directory",
            run_dir.display(),
            run_dir.display()
        )));
    }
    Ok((run_dir, resuming))
}

/// Loads and checks the config (nothing is created before it passes), creates the run
/// directory, and saves the config with absolute paths as `RUN_DIR/config.toml`, whose path it
/// returns. The outer error is an I/O failure, the inner one a configuration problem.
pub(super) fn prepare(
    args: &RunArgs,
    run_dir: &Path,
    resuming: bool,
) -> anyhow::Result<Result<(RunConfig, PathBuf), ConfigProblem>> {
    let embedded = args.config.config.is_none() && !resuming;
    let mut config = match load_config(args, run_dir, resuming) {
        Ok(c) => c,
        Err(ConfigProblem(msg)) => return Ok(Err(ConfigProblem(one_line(&msg)))),
    };
    if !embedded {
        if let Err(e) = config.check_files() {
            return Ok(Err(ConfigProblem(one_line(&e.to_string()))));
        }
        if let Err(msg) = check_datasets(&config) {
            return Ok(Err(ConfigProblem(one_line(&msg))));
        }
    }
    if !args.skip_memory_check {
        match crate::commands::plan::check_run(&config, embedded) {
            Ok(Ok(())) => {}
            Ok(Err(lines)) => {
                return Ok(Err(ConfigProblem(format!(
                    "{lines}  (--skip-memory-check starts it anyway)"
                ))))
            }
            Err(e) => tracing::warn!("memory plan skipped: {e:#}"),
        }
    }
    std::fs::create_dir_all(run_dir.join("logs"))
        .with_context(|| format!("creating {}", run_dir.display()))?;
    if embedded {
        materialize_tiny(run_dir)?;
        config.check_files()?;
    }
    absolutize(&mut config);
    let config_path = run_dir.join("config.toml");
    let text = toml::to_string(&config).context("serialising the run config")?;
    let tmp = run_dir.join("config.toml.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &config_path)?;
    Ok(Ok((config, config_path)))
}

fn load_config(args: &RunArgs, run_dir: &Path, resuming: bool) -> Result<RunConfig, ConfigProblem> {
    let bad = |e: &dyn std::fmt::Display| ConfigProblem(e.to_string());
    let mut cargs = args.config.clone();
    if resuming && cargs.config.is_none() {
        cargs.config = Some(run_dir.join("config.toml"));
    }
    let mut config = cargs
        .load(TINY_TOML, &run_dir.join("inputs"))
        .map_err(|e| bad(&e))?;
    if let Some(n) = args.actors {
        if n == 0 {
            return Err(ConfigProblem("--actors: must be at least 1".into()));
        }
        config.devices.num_actors = Some(n);
    }
    if let Some(d) = &args.learner_device {
        let entries: Vec<String> = d.split(',').map(|e| e.trim().to_string()).collect();
        config
            .devices
            .set_learner(&entries)
            .map_err(|e| ConfigProblem(format!("--learner-device: {e}")))?;
    }
    if let Some(n) = args.learner_ranks {
        if n == 0 {
            return Err(ConfigProblem("--learner-ranks: must be at least 1".into()));
        }
        config.devices.learner_ranks = Some(n);
    }
    if let Some(d) = &args.actor_devices {
        config.devices.actors = vec![DeviceSpec::try_from(d.clone())
            .map_err(|e| ConfigProblem(format!("--actor-devices: {e}")))?];
    }
    config.validate().map_err(|e| bad(&e))?;
    // Devices must exist in this build / on this machine.
    let mut devices = config.devices.learner_devices();
    devices.extend(config.devices.actor_assignment());
    for d in devices {
        cascade_shared::device::parse_device(&d.to_string())
            .map_err(|e| ConfigProblem(format!("devices: {e}")))?;
    }
    Ok(config)
}

/// Reads every dataset the config names once through, as the learner and the actors will
/// read them (schema, kind, RL domain): rejected rows are counted and logged with file, row and
/// column, and a dataset with no usable row stops the run here, before anything is created,
/// with its first reasons (rather than when a later stage reaches it).
fn check_datasets(config: &RunConfig) -> Result<(), String> {
    let mut entries: Vec<(String, &DatasetEntry, Kind, Option<StageKind>)> = Vec::new();
    for s in &config.stages {
        let (kind, domain) = s.data_kind();
        entries.push((
            format!("stages.{}.dataset", s.name),
            &s.dataset,
            kind,
            domain,
        ));
        if let (Some(h), true) = (&s.heldout, s.is_rl()) {
            entries.push((format!("stages.{}.heldout", s.name), h, kind, domain));
        }
        if let Some(mix) = &s.sft_mix {
            entries.push((
                format!("stages.{}.sft_mix.dataset", s.name),
                &mix.dataset,
                Kind::Sft,
                None,
            ));
        }
    }
    if let Some(rm) = &config.reward_model {
        entries.push((
            "reward_model.dataset".into(),
            &rm.dataset,
            Kind::Pairs,
            None,
        ));
        if let Some(h) = &rm.heldout {
            entries.push(("reward_model.heldout".into(), h, Kind::Pairs, None));
        }
    }
    let mut checked: Vec<DataSpec> = Vec::new();
    for (key, entry, kind, domain) in entries {
        let spec = config
            .data_spec(entry, kind, domain)
            .map_err(|e| format!("{key}: {e}"))?;
        if checked.contains(&spec) {
            continue;
        }
        let reader = DataReader::open(&spec).map_err(|e| format!("{key}: {e}"))?;
        scan(&reader, |_, _| Ok(())).map_err(|e| format!("{key}: {e}"))?;
        checked.push(spec);
    }
    Ok(())
}

/// A multi-line message (some parsers add context lines) as one line.
fn one_line(msg: &str) -> String {
    msg.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Makes every path of the config absolute (so the saved copy works from any directory).
fn absolutize(config: &mut RunConfig) {
    let abs = |c: &RunConfig, p: &Path| -> PathBuf {
        let r = c.resolve(p);
        std::path::absolute(&r).unwrap_or(r)
    };
    let snapshot = config.clone();
    if let Some(p) = &mut config.model.path {
        *p = abs(&snapshot, p);
    }
    if let Some(init) = &mut config.model.init {
        init.config = abs(&snapshot, &init.config);
        if let Some(t) = &mut init.tokenizer {
            *t = abs(&snapshot, t);
        }
    }
    for s in &mut config.stages {
        s.dataset.path = abs(&snapshot, &s.dataset.path);
        if let Some(h) = &mut s.heldout {
            h.path = abs(&snapshot, &h.path);
        }
        if let Some(mix) = &mut s.sft_mix {
            mix.dataset.path = abs(&snapshot, &mix.dataset.path);
        }
        if let Some(rm) = &mut s.verifier.reward_model {
            *rm = abs(&snapshot, rm);
        }
        if let Some(judge) = &mut s.verifier.swe_judge {
            *judge = abs(&snapshot, judge);
        }
    }
    if let Some(rm) = &mut config.reward_model {
        rm.dataset.path = abs(&snapshot, &rm.dataset.path);
        if let Some(h) = &mut rm.heldout {
            h.path = abs(&snapshot, &h.path);
        }
    }
}

/// Writes the embedded default's model config and synthetic data into `RUN_DIR/inputs/`.
fn materialize_tiny(run_dir: &Path) -> anyhow::Result<()> {
    let inputs = run_dir.join("inputs");
    std::fs::create_dir_all(&inputs).with_context(|| format!("creating {}", inputs.display()))?;
    std::fs::write(inputs.join("tiny-model.json"), TINY_MODEL_JSON)?;
    std::fs::write(inputs.join("tiny.toml"), TINY_TOML)?;
    crate::commands::data::write_tiny_data(
        &inputs.join("data"),
        0,
        &cascade_datagen::TinySizes::default(),
    )
    .context("writing the tiny datasets")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_saved_config_has_every_dataset_path_absolute() {
        // The tiny default names every kind of dataset entry, sft_mix included.
        let mut config = RunConfig::parse(TINY_TOML, "tiny", Path::new("inputs"), &[]).unwrap();
        absolutize(&mut config);
        let mut paths = vec![];
        for s in &config.stages {
            paths.push(&s.dataset.path);
            paths.extend(s.heldout.iter().map(|h| &h.path));
            paths.extend(s.sft_mix.iter().map(|m| &m.dataset.path));
        }
        let rm = config.reward_model.as_ref().unwrap();
        paths.push(&rm.dataset.path);
        paths.extend(rm.heldout.iter().map(|h| &h.path));
        // 7 stage datasets, 5 held-out sets and 5 sft_mix datasets, the reward model's 2.
        assert_eq!(paths.len(), 7 + 5 + 5 + 2);
        for p in paths {
            assert!(p.is_absolute(), "{}", p.display());
            assert!(
                p.to_string_lossy().contains("inputs/data/"),
                "{}",
                p.display()
            );
        }
    }
}
