//! `cascade run`: the whole cascade. Starts the learner and N actors as child processes of this
//! executable, supervises them, shows progress, evaluates every stage on the held-out sets and
//! writes the report.
//!
//! - **Fresh run**: the config (a file, or the embedded tiny default, whose model config and
//!   synthetic data are written into `RUN_DIR/inputs/`) is validated before anything is created,
//!   then saved with absolute paths and every command-line override as `RUN_DIR/config.toml`;
//!   the children read that file.
//! - **Supervision**: an actor that dies is restarted (at most `--max-restarts` times each); the
//!   learner dying stops the run with the command that resumes it; SIGINT/SIGTERM is forwarded
//!   (the learner publishes a final snapshot) and everything stops. Each child logs to
//!   `RUN_DIR/logs/NAME.log`; starts, exits and restarts go to `metrics.jsonl` as `process`
//!   events with the child's peak RSS.
//! - **Resume**: `--resume RUN_DIR` continues from the newest complete snapshot.
//! - **End**: the held-out table (`heldout.json`), a `run_end` event and `report/index.html`.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use cascade_shared::config::{ConfigArgs, Device, DeviceSpec, RunConfig};
use cascade_shared::metrics::{unix_now, MetricsLog, METRICS_FILE};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

use crate::heldout;

/// The embedded tiny default.
pub const TINY_TOML: &str = include_str!("../../configs/tiny.toml");
/// Its model config.
pub const TINY_MODEL_JSON: &str = include_str!("../../configs/tiny-model.json");

/// Arguments of `cascade run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The run configuration and overrides (default: the embedded tiny default).
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The run directory (default `runs/tiny` for the embedded default).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Continue the run in this directory from its newest complete snapshot.
    #[arg(long, value_name = "RUN_DIR", conflicts_with = "run_dir")]
    pub resume: Option<PathBuf>,
    /// Number of actor processes (default: `devices.num_actors` or one per actor device).
    #[arg(long)]
    pub actors: Option<usize>,
    /// Learner device: `cpu` or `cuda:N`.
    #[arg(long)]
    pub learner_device: Option<String>,
    /// Actor devices: `cpu`, `cuda:N` or a range `cuda:A-B` (actors are assigned round-robin).
    #[arg(long)]
    pub actor_devices: Option<String>,
    /// Restarts allowed per actor before the run gives up on it.
    #[arg(long, default_value_t = 10)]
    pub max_restarts: u32,
    /// Skip the held-out evaluation at the end.
    #[arg(long)]
    pub no_eval: bool,
}

/// A configuration problem: one line, exit code 2, nothing created.
struct ConfigProblem(String);

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
        config.devices.learner =
            Device::parse(d).map_err(|e| ConfigProblem(format!("--learner-device: {e}")))?;
    }
    if let Some(d) = &args.actor_devices {
        config.devices.actors = vec![DeviceSpec::try_from(d.clone())
            .map_err(|e| ConfigProblem(format!("--actor-devices: {e}")))?];
    }
    config.validate().map_err(|e| bad(&e))?;
    // Devices must exist in this build / on this machine.
    let mut devices = vec![config.devices.learner];
    devices.extend(config.devices.actor_assignment());
    for d in devices {
        cascade_shared::device::parse_device(&d.to_string())
            .map_err(|e| ConfigProblem(format!("devices: {e}")))?;
    }
    Ok(config)
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
        s.dataset = abs(&snapshot, &s.dataset);
        if let Some(h) = &mut s.heldout {
            *h = abs(&snapshot, h);
        }
        if let Some(rm) = &mut s.verifier.reward_model {
            *rm = abs(&snapshot, rm);
        }
        if let Some(judge) = &mut s.verifier.swe_judge {
            *judge = abs(&snapshot, judge);
        }
    }
    if let Some(rm) = &mut config.reward_model {
        rm.dataset = abs(&snapshot, &rm.dataset);
        if let Some(h) = &mut rm.heldout {
            *h = abs(&snapshot, h);
        }
    }
}

/// Writes the embedded default's model config and synthetic data into `RUN_DIR/inputs/`.
fn materialize_tiny(run_dir: &Path) -> anyhow::Result<()> {
    let inputs = run_dir.join("inputs");
    std::fs::create_dir_all(&inputs).with_context(|| format!("creating {}", inputs.display()))?;
    std::fs::write(inputs.join("tiny-model.json"), TINY_MODEL_JSON)?;
    std::fs::write(inputs.join("tiny.toml"), TINY_TOML)?;
    super::data::write_tiny_data(
        &inputs.join("data"),
        0,
        &cascade_datagen::TinySizes::default(),
    )
    .context("writing the tiny datasets")?;
    Ok(())
}

/// One supervised child process.
struct Child {
    name: String,
    args: Vec<String>,
    pid: Option<i32>,
    restarts: u32,
    done: bool,
}

impl Child {
    fn spawn(&mut self, run_dir: &Path, metrics: &MetricsLog) -> anyhow::Result<()> {
        let log_path = run_dir.join("logs").join(format!("{}.log", self.name));
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let exe = std::env::current_exe().context("locating the cascade executable")?;
        let mut cmd = Command::new(exe);
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.name))?;
        self.pid = Some(child.id() as i32);
        // The child is reaped with wait4 below (for its resource usage), not through `child`.
        drop(child);
        metrics.emit(
            "process",
            json!({ "what": "start", "name": self.name, "pid": self.pid, "restarts": self.restarts }),
        );
        Ok(())
    }

    /// `Some((status text, success, peak RSS MiB))` once the child has exited.
    fn poll(&mut self) -> Option<(String, bool, f64)> {
        let pid = self.pid?;
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value of this plain C struct.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `status` and `usage` are valid for writes; `pid` is our own child.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r != pid {
            return None;
        }
        self.pid = None;
        let rss_mb = usage.ru_maxrss as f64 / 1024.0;
        if libc::WIFEXITED(status) {
            let code = libc::WEXITSTATUS(status);
            Some((format!("exit code {code}"), code == 0, rss_mb))
        } else if libc::WIFSIGNALED(status) {
            Some((
                format!("killed by signal {}", libc::WTERMSIG(status)),
                false,
                rss_mb,
            ))
        } else {
            Some(("stopped".into(), false, rss_mb))
        }
    }

    fn signal(&self, sig: i32) {
        if let Some(pid) = self.pid {
            // SAFETY: kill(2) with our own child's pid.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }
}

/// Sends SIGTERM, waits up to `grace`, then SIGKILLs; returns the exit descriptions.
fn stop_children(children: &mut [&mut Child], grace: Duration, metrics: &MetricsLog) {
    for c in children.iter() {
        c.signal(libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    loop {
        let mut running = false;
        for c in children.iter_mut() {
            if c.pid.is_some() {
                match c.poll() {
                    Some((status, _, rss)) => {
                        metrics.emit(
                            "process",
                            json!({ "what": "exit", "name": c.name, "status": status, "peak_rss_mb": rss, "restarts": c.restarts }),
                        );
                        c.done = true;
                    }
                    None => running = true,
                }
            }
        }
        if !running {
            return;
        }
        if Instant::now() >= deadline {
            for c in children.iter() {
                c.signal(libc::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Live view of the run from `metrics.jsonl`.
struct Progress {
    file: Option<File>,
    path: PathBuf,
    offset: u64,
    partial: String,
    bar: ProgressBar,
    stage: Option<(usize, String)>,
    actor_rate: BTreeMap<String, f64>,
    last_plain: Instant,
    tty: bool,
    last_line: String,
    printed: String,
}

impl Progress {
    fn new(run_dir: &Path) -> Self {
        let tty = std::io::stderr().is_terminal();
        let bar = if tty {
            ProgressBar::new(1)
        } else {
            ProgressBar::hidden()
        };
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:>8} [{bar:30}] {pos}/{len} {elapsed_precise} {msg}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        Progress {
            file: None,
            path: run_dir.join(METRICS_FILE),
            offset: 0,
            partial: String::new(),
            bar,
            stage: None,
            actor_rate: BTreeMap::new(),
            last_plain: Instant::now(),
            tty,
            last_line: String::new(),
            printed: String::new(),
        }
    }

    fn update(&mut self) {
        if self.file.is_none() {
            self.file = File::open(&self.path).ok();
        }
        let Some(f) = self.file.as_mut() else { return };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut buf = String::new();
        if let Ok(n) = f.read_to_string(&mut buf) {
            self.offset += n as u64;
        }
        self.partial.push_str(&buf);
        let Some(end) = self.partial.rfind('\n') else {
            return;
        };
        let lines: Vec<String> = self.partial[..end].lines().map(str::to_string).collect();
        self.partial = self.partial[end + 1..].to_string();
        for line in lines {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                self.event(&v);
            }
        }
        if !self.tty
            && self.last_plain.elapsed() > Duration::from_secs(10)
            && !self.last_line.is_empty()
        {
            eprintln!("{}", self.last_line);
            self.last_plain = Instant::now();
        }
    }

    fn event(&mut self, v: &Value) {
        let event = v["event"].as_str().unwrap_or("");
        match event {
            "sft_step" | "learner_step" => {
                let index = v["stage_index"].as_u64().unwrap_or(0) as usize;
                let name = v["stage"].as_str().unwrap_or("?").to_string();
                if self.stage.as_ref().map(|s| s.0) != Some(index) {
                    self.bar.set_length(v["stage_steps"].as_u64().unwrap_or(1));
                    self.bar.reset();
                    self.bar.set_prefix(name.clone());
                    self.stage = Some((index, name.clone()));
                }
                self.bar.set_position(v["stage_step"].as_u64().unwrap_or(0));
                let tok = v["tokens_per_s"].as_f64().unwrap_or(0.0);
                let msg = if event == "sft_step" {
                    format!(
                        "loss {:.3} | learner {:.0} tok/s",
                        v["loss"].as_f64().unwrap_or(f64::NAN),
                        tok
                    )
                } else {
                    let mode = |m: &str| {
                        let b = &v["by_mode"][m];
                        if b.is_null() {
                            "-".to_string()
                        } else {
                            format!(
                                "{:.2}/{:.0}%",
                                b["reward_mean"].as_f64().unwrap_or(f64::NAN),
                                100.0 * b["pass_rate"].as_f64().unwrap_or(f64::NAN)
                            )
                        }
                    };
                    let lags: Vec<f64> = v["policy_lag"]
                        .as_array()
                        .map(|a| a.iter().filter_map(Value::as_f64).collect())
                        .unwrap_or_default();
                    let lag = lags.iter().sum::<f64>() / lags.len().max(1) as f64;
                    format!(
                        "reward {:.3} | think {} no_think {} | learner {:.0} tok/s, actors {:.0} tok/s | lag {:.1} | queue {}",
                        v["reward_mean"].as_f64().unwrap_or(f64::NAN),
                        mode("think"),
                        mode("no_think"),
                        tok,
                        self.actor_rate.values().sum::<f64>(),
                        lag,
                        v["queue_depth"].as_u64().unwrap_or(0)
                    )
                };
                self.last_line = format!(
                    "{name} {}/{}: {msg}",
                    v["stage_step"].as_u64().unwrap_or(0),
                    v["stage_steps"].as_u64().unwrap_or(0)
                );
                self.bar.set_message(msg);
            }
            "actor" => {
                if let (Some(p), Some(r)) = (v["proc"].as_str(), v["tokens_per_s"].as_f64()) {
                    self.actor_rate.insert(p.to_string(), r);
                }
            }
            "stage_end" => {
                let line = format!(
                    "stage {} done at step {}",
                    v["stage"].as_str().unwrap_or("?"),
                    v["step"].as_u64().unwrap_or(0)
                );
                self.bar.println(&line);
                if !self.tty {
                    if self.last_line != self.printed {
                        eprintln!("{}", self.last_line);
                        self.printed = self.last_line.clone();
                    }
                    eprintln!("{line}");
                }
            }
            "rm_done" => {
                let line = format!(
                    "reward model trained: held-out pairwise accuracy {:.3}",
                    v["heldout_accuracy"].as_f64().unwrap_or(f64::NAN)
                );
                self.bar.println(&line);
                if !self.tty {
                    eprintln!("{line}");
                }
            }
            "process" if v["what"] == "restart" || v["what"] == "give_up" => {
                let line = format!(
                    "{} {} ({}), restarts {}",
                    v["name"].as_str().unwrap_or("?"),
                    if v["what"] == "restart" {
                        "restarted"
                    } else {
                        "given up"
                    },
                    v["status"].as_str().unwrap_or(""),
                    v["restarts"]
                );
                self.bar.println(&line);
                if !self.tty {
                    eprintln!("{line}");
                }
            }
            _ => {}
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Runs `cascade run`.
pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    let started = Instant::now();
    let (run_dir, resuming) = match (&args.resume, &args.run_dir) {
        (Some(d), _) => (d.clone(), true),
        (None, Some(d)) => (d.clone(), false),
        (None, None) if args.config.config.is_none() => (PathBuf::from("runs/tiny"), false),
        (None, None) => {
            eprintln!("error: --run-dir: a run with --config needs a run directory");
            return Ok(2);
        }
    };
    if resuming && !run_dir.join("config.toml").exists() && args.config.config.is_none() {
        eprintln!(
            "error: --resume {}: not a run directory (no config.toml)",
            run_dir.display()
        );
        return Ok(2);
    }
    if !resuming && run_dir.join("snapshots").exists() {
        eprintln!(
            "error: --run-dir {}: already holds a run; continue it with `cascade run --resume {}` or choose a new directory",
            run_dir.display(),
            run_dir.display()
        );
        return Ok(2);
    }
    // 1. The config, validated before anything is created.
    let embedded = args.config.config.is_none() && !resuming;
    let mut config = match load_config(&args, &run_dir, resuming) {
        Ok(c) => c,
        Err(ConfigProblem(msg)) => {
            eprintln!("error: {}", one_line(&msg));
            return Ok(2);
        }
    };
    if !embedded {
        if let Err(e) = config.check_files() {
            eprintln!("error: {}", one_line(&e.to_string()));
            return Ok(2);
        }
    }
    std::fs::create_dir_all(run_dir.join("logs"))
        .with_context(|| format!("creating {}", run_dir.display()))?;
    if embedded {
        materialize_tiny(&run_dir)?;
        config.check_files()?;
    }
    absolutize(&mut config);
    let config_path = run_dir.join("config.toml");
    let text = toml::to_string(&config).context("serialising the run config")?;
    let tmp = run_dir.join("config.toml.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &config_path)?;
    let config_arg = config_path.display().to_string();
    let run_dir_arg = run_dir.display().to_string();

    let metrics = MetricsLog::open(run_dir.join(METRICS_FILE), "supervisor")?;
    let actors = config.devices.actor_assignment();
    let max_staleness = config.learner.max_staleness;
    metrics.emit(
        "run_start",
        json!({
            "config": config_arg,
            "max_staleness": max_staleness,
            "actors": actors.len(),
            "resume": resuming,
        }),
    );
    eprintln!(
        "cascade run: {} stages, learner on {}, {} actor(s), run directory {}",
        config.stages.len(),
        config.devices.learner,
        actors.len(),
        run_dir.display()
    );

    // 2. The children.
    let mut learner_args = vec![
        "learner".to_string(),
        "--run-dir".into(),
        run_dir_arg.clone(),
        "--config".into(),
        config_arg.clone(),
        "--device".into(),
        config.devices.learner.to_string(),
    ];
    if run_dir.join("snapshots").join("LATEST").exists() {
        learner_args.push("--resume".into());
    }
    let mut learner = Child {
        name: "learner".into(),
        args: learner_args,
        pid: None,
        restarts: 0,
        done: false,
    };
    let mut actor_children: Vec<Child> = actors
        .iter()
        .enumerate()
        .map(|(i, d)| Child {
            name: format!("actor-{i}"),
            args: vec![
                "actor".into(),
                "--run-dir".into(),
                run_dir_arg.clone(),
                "--config".into(),
                config_arg.clone(),
                "--actor-id".into(),
                i.to_string(),
                "--device".into(),
                d.to_string(),
            ],
            pid: None,
            restarts: 0,
            done: false,
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing a signal handler")?;
    }
    learner.spawn(&run_dir, &metrics)?;
    for a in &mut actor_children {
        a.spawn(&run_dir, &metrics)?;
    }
    let mut progress = Progress::new(&run_dir);

    // 3. Supervise.
    let mut gave_up = 0usize;
    let learner_result: Result<(), String> = loop {
        progress.update();
        if stop.load(Ordering::Relaxed) {
            progress.finish();
            eprintln!("stopping: the learner publishes a final snapshot...");
            let mut all: Vec<&mut Child> = vec![&mut learner];
            all.extend(actor_children.iter_mut());
            stop_children(&mut all, Duration::from_secs(120), &metrics);
            metrics.emit(
                "run_end",
                json!({ "wall_s": started.elapsed().as_secs_f64(), "status": "stopped", "max_staleness": max_staleness }),
            );
            eprintln!(
                "stopped. Resume with: cascade run --resume {}",
                run_dir.display()
            );
            return Ok(130);
        }
        if let Some((status, ok, rss)) = learner.poll() {
            metrics.emit(
                "process",
                json!({ "what": "exit", "name": "learner", "status": status, "peak_rss_mb": rss, "restarts": 0 }),
            );
            break if ok { Ok(()) } else { Err(status) };
        }
        for a in &mut actor_children {
            if a.done {
                continue;
            }
            if let Some((status, ok, rss)) = a.poll() {
                if ok {
                    // Finished on its own (no RL stage left).
                    metrics.emit(
                        "process",
                        json!({ "what": "exit", "name": a.name, "status": status, "peak_rss_mb": rss, "restarts": a.restarts }),
                    );
                    a.done = true;
                } else if a.restarts < args.max_restarts {
                    a.restarts += 1;
                    metrics.emit(
                        "process",
                        json!({ "what": "restart", "name": a.name, "status": status, "peak_rss_mb": rss, "restarts": a.restarts }),
                    );
                    tracing::warn!("{} died ({status}); restart {}", a.name, a.restarts);
                    a.spawn(&run_dir, &metrics)?;
                } else {
                    metrics.emit(
                        "process",
                        json!({ "what": "give_up", "name": a.name, "status": status, "peak_rss_mb": rss, "restarts": a.restarts }),
                    );
                    eprintln!(
                        "warning: {} died ({status}) after {} restarts; continuing without it (see {})",
                        a.name,
                        a.restarts,
                        run_dir.join("logs").join(format!("{}.log", a.name)).display()
                    );
                    a.done = true;
                    gave_up += 1;
                }
            }
        }
        if gave_up > 0 && actor_children.iter().all(|a| a.done) {
            // Every actor is gone and at least one gave up, so the RL stages are not finished
            // (an actor exits on its own only past the last RL stage): the learner would wait
            // forever for rollouts.
            let mut all: Vec<&mut Child> = vec![&mut learner];
            stop_children(&mut all, Duration::from_secs(120), &metrics);
            progress.finish();
            break Err("every actor gave up; the learner was stopped with a final snapshot".into());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    progress.update();
    progress.finish();
    let mut actor_refs: Vec<&mut Child> = actor_children.iter_mut().filter(|a| !a.done).collect();
    stop_children(&mut actor_refs, Duration::from_secs(30), &metrics);
    if let Err(status) = learner_result {
        metrics.emit(
            "run_end",
            json!({ "wall_s": started.elapsed().as_secs_f64(), "status": "failed", "max_staleness": max_staleness }),
        );
        eprintln!(
            "error: the learner stopped ({status}); see {}. Resume with: cascade run --resume {}",
            run_dir.join("logs").join("learner.log").display(),
            run_dir.display()
        );
        return Ok(1);
    }
    let train_s = started.elapsed().as_secs_f64();
    eprintln!("training done in {train_s:.1} s");

    // 4. Held-out table, run_end, report.
    if config.eval.enabled && !args.no_eval {
        let t0 = Instant::now();
        let table = heldout::evaluate_run(&config, &run_dir, &metrics)?;
        if let Some(table) = table {
            eprintln!("{}", heldout::format_table(&table));
            eprintln!(
                "held-out evaluation: {:.1} s; written to {}",
                t0.elapsed().as_secs_f64(),
                run_dir.join("heldout.json").display()
            );
        }
    }
    metrics.emit(
        "run_end",
        json!({
            "wall_s": started.elapsed().as_secs_f64(),
            "train_s": train_s,
            "status": "completed",
            "max_staleness": max_staleness,
            "t_end": unix_now(),
        }),
    );
    match cascade_report::write_report(&run_dir, &cascade_report::ReportOptions { compare: None }) {
        Ok(s) => eprintln!("report: {}", s.index_html.display()),
        Err(e) => eprintln!("warning: the report could not be written: {e}"),
    }
    eprintln!(
        "run completed in {:.1} s ({})",
        started.elapsed().as_secs_f64(),
        run_dir.display()
    );
    Ok(0)
}
