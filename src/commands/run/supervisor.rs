//! The children of `cascade run`: the learner and the actors as processes of this executable.
//! An actor that dies is restarted (at most `--max-restarts` times each); the learner exiting
//! ends supervision; starts, exits and restarts go to `metrics.jsonl` as `process` events with
//! the child's peak RSS.

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use cascade_shared::config::RunConfig;
use cascade_shared::metrics::{MetricsLog, ProcessEvent};

use super::progress::Progress;

/// How supervision ended.
pub(super) enum Outcome {
    /// SIGINT/SIGTERM: every child was stopped (the learner with a final snapshot).
    Interrupted,
    /// The learner exited: `Err(status)` unless it completed. Actors still running are left to
    /// [`Supervisor::stop_actors`].
    LearnerExited(Result<(), String>),
}

/// The learner and the actors of one run.
pub(super) struct Supervisor<'a> {
    run_dir: PathBuf,
    metrics: &'a MetricsLog,
    max_restarts: u32,
    /// The learner's ranks, rank 0 (named `learner`) first.
    learners: Vec<Child>,
    actors: Vec<Child>,
}

impl<'a> Supervisor<'a> {
    /// Starts the learner (resuming when the run has a snapshot) and one actor per actor device
    /// of `config`; the children read `config_path`.
    pub(super) fn start(
        config: &RunConfig,
        config_path: &Path,
        run_dir: &Path,
        metrics: &'a MetricsLog,
        max_restarts: u32,
    ) -> anyhow::Result<Self> {
        let config_arg = config_path.display().to_string();
        let run_dir_arg = run_dir.display().to_string();
        let resume = run_dir.join("snapshots").join("LATEST").exists();
        if resume {
            // Before any actor reads LATEST: back to the newest checkpoint, without the
            // weights-only snapshots after it (`learner.checkpoint_every`), which the learner
            // recomputes under the same versions. The learner verifies and does the same at its
            // start; here only markers and states are read.
            cascade_learner::snapshot::drop_after_newest_checkpoint(&run_dir.join("snapshots"))
                .context("finding the checkpoint to resume from")?;
        }
        let devices = config.devices.learner_devices();
        let world = devices.len();
        // Rank 0 listens on a free local port (the ranks of `cascade run` share this node).
        let rendezvous = if world > 1 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .context("finding a free port for the learner ranks' rendezvous")?
                .port();
            format!("127.0.0.1:{port}")
        } else {
            String::new()
        };
        let learners = devices
            .iter()
            .enumerate()
            .map(|(rank, device)| {
                let mut args = vec![
                    "learner".to_string(),
                    "--run-dir".into(),
                    run_dir_arg.clone(),
                    "--config".into(),
                    config_arg.clone(),
                    "--device".into(),
                    device.to_string(),
                ];
                if resume {
                    args.push("--resume".into());
                }
                if world > 1 {
                    args.extend([
                        "--rank".into(),
                        rank.to_string(),
                        "--world-size".into(),
                        world.to_string(),
                        "--rendezvous".into(),
                        rendezvous.clone(),
                    ]);
                }
                let name = if rank == 0 {
                    "learner".to_string()
                } else {
                    format!("learner-{rank}")
                };
                Child::new(name, args)
            })
            .collect();
        let actors = config
            .devices
            .actor_assignment()
            .iter()
            .enumerate()
            .map(|(i, d)| {
                Child::new(
                    format!("actor-{i}"),
                    vec![
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
                )
            })
            .collect();
        let mut supervisor = Supervisor {
            run_dir: run_dir.to_path_buf(),
            metrics,
            max_restarts,
            learners,
            actors,
        };
        for l in &mut supervisor.learners {
            l.spawn(run_dir, metrics)?;
        }
        for a in &mut supervisor.actors {
            a.spawn(run_dir, metrics)?;
        }
        Ok(supervisor)
    }

    /// Watches the children until the learner exits or `stop` is raised, restarting actors that
    /// die and showing `progress`.
    pub(super) fn supervise(
        &mut self,
        stop: &AtomicBool,
        progress: &mut Progress,
    ) -> anyhow::Result<Outcome> {
        let mut gave_up = 0usize;
        loop {
            progress.update();
            if stop.load(Ordering::Relaxed) {
                progress.finish();
                eprintln!("stopping: the learner publishes a final snapshot...");
                let mut all: Vec<&mut Child> = self.learners.iter_mut().collect();
                all.extend(self.actors.iter_mut());
                stop_children(&mut all, Duration::from_secs(120), self.metrics);
                return Ok(Outcome::Interrupted);
            }
            if let Some(result) = self.poll_learners() {
                return Ok(Outcome::LearnerExited(result));
            }
            for a in &mut self.actors {
                if a.done {
                    continue;
                }
                let Some(exit) = a.poll() else { continue };
                if exit.ok {
                    // Finished on its own (no RL stage left).
                    self.metrics
                        .record(&exit.event("exit", &a.name, a.restarts));
                    a.done = true;
                } else if a.restarts < self.max_restarts {
                    a.restarts += 1;
                    self.metrics
                        .record(&exit.event("restart", &a.name, a.restarts));
                    tracing::warn!("{} died ({}); restart {}", a.name, exit.status, a.restarts);
                    a.spawn(&self.run_dir, self.metrics)?;
                } else {
                    self.metrics
                        .record(&exit.event("give_up", &a.name, a.restarts));
                    eprintln!(
                        "warning: {} died ({}) after {} restarts; continuing without it (see {})",
                        a.name,
                        exit.status,
                        a.restarts,
                        self.run_dir
                            .join("logs")
                            .join(format!("{}.log", a.name))
                            .display()
                    );
                    a.done = true;
                    gave_up += 1;
                }
            }
            if gave_up > 0 && self.actors.iter().all(|a| a.done) {
                // Every actor is gone and at least one gave up, so the RL stages are not
                // finished (an actor exits on its own only past the last RL stage): the learner
                // would wait forever for rollouts.
                let mut all: Vec<&mut Child> = self.learners.iter_mut().collect();
                stop_children(&mut all, Duration::from_secs(120), self.metrics);
                progress.finish();
                return Ok(Outcome::LearnerExited(Err(
                    "every actor gave up; the learner was stopped with a final snapshot".into(),
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `Some` once the learner has ended: every rank completed (`Ok`), or one failed, in which
    /// case the other ranks (which stop on their own within the group's timeout) are stopped
    /// and the first failure is returned, naming the rank.
    fn poll_learners(&mut self) -> Option<Result<(), String>> {
        // Every rank that ended now, the ones killed by a signal first: when one rank dies the
        // others fail after it, and the report should name the one that died.
        let mut failed: Vec<(bool, String)> = Vec::new();
        let many = self.learners.len() > 1;
        for l in &mut self.learners {
            if l.done {
                continue;
            }
            if let Some(exit) = l.poll() {
                self.metrics
                    .record(&exit.event("exit", &l.name, l.restarts));
                l.done = true;
                if !exit.ok {
                    let what = if many {
                        format!("{}: {}", l.name, exit.status)
                    } else {
                        exit.status.clone()
                    };
                    failed.push((!exit.status.starts_with("killed"), what));
                }
            }
        }
        if failed.is_empty() {
            return self.learners.iter().all(|l| l.done).then_some(Ok(()));
        }
        let mut rest: Vec<&mut Child> = self.learners.iter_mut().filter(|l| !l.done).collect();
        stop_children(&mut rest, Duration::from_secs(60), self.metrics);
        failed.sort();
        Some(Err(failed
            .into_iter()
            .map(|(_, w)| w)
            .collect::<Vec<_>>()
            .join("; ")))
    }

    /// Stops the actors still running (SIGTERM, then SIGKILL after `grace`).
    pub(super) fn stop_actors(&mut self, grace: Duration) {
        let mut running: Vec<&mut Child> = self.actors.iter_mut().filter(|a| !a.done).collect();
        stop_children(&mut running, grace, self.metrics);
    }
}

/// How a child ended.
struct Exit {
    /// `exit code N`, `killed by signal N` or `stopped`.
    status: String,
    /// Exit code 0.
    ok: bool,
    /// Peak resident set size in MiB.
    peak_rss_mb: f64,
}

impl Exit {
    /// The `process` event of this exit.
    fn event(&self, what: &str, name: &str, restarts: u32) -> ProcessEvent {
        ProcessEvent {
            what: Some(what.into()),
            name: Some(name.into()),
            pid: None,
            status: Some(self.status.clone()),
            peak_rss_mb: Some(self.peak_rss_mb),
            restarts: Some(restarts.into()),
        }
    }
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
    fn new(name: String, args: Vec<String>) -> Self {
        Child {
            name,
            args,
            pid: None,
            restarts: 0,
            done: false,
        }
    }

    fn spawn(&mut self, run_dir: &Path, metrics: &MetricsLog) -> anyhow::Result<()> {
        let log_path = run_dir.join("logs").join(format!("{}.log", self.name));
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let (exe, arg0) = child_exe()?;
        let mut cmd = Command::new(exe);
        cmd.arg0(arg0)
            .args(&self.args)
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
        metrics.record(&ProcessEvent {
            what: Some("start".into()),
            name: Some(self.name.clone()),
            pid: self.pid.map(|p| p as u64),
            restarts: Some(self.restarts.into()),
            ..ProcessEvent::default()
        });
        Ok(())
    }

    /// `Some` once the child has exited.
    fn poll(&mut self) -> Option<Exit> {
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
        let peak_rss_mb = usage.ru_maxrss as f64 / 1024.0;
        let (status, ok) = if libc::WIFEXITED(status) {
            let code = libc::WEXITSTATUS(status);
            (format!("exit code {code}"), code == 0)
        } else if libc::WIFSIGNALED(status) {
            (
                format!("killed by signal {}", libc::WTERMSIG(status)),
                false,
            )
        } else {
            ("stopped".into(), false)
        };
        Some(Exit {
            status,
            ok,
            peak_rss_mb,
        })
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

/// Sends SIGTERM, waits up to `grace`, then SIGKILLs; records each exit.
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
                    Some(exit) => {
                        metrics.record(&exit.event("exit", &c.name, c.restarts));
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

/// The program the supervisor's children run, and the name they show (`argv[0]`): the
/// supervisor's own image. On Linux that is `/proc/self/exe`, which still runs the binary this
/// process started from after the file at its path has been replaced or removed (a rebuild or an
/// upgrade during a run), so that a restarted or next-stage child is the same version, and
/// starts at all: `current_exe` then names `… (deleted)`. Elsewhere, `current_exe`.
fn child_exe() -> anyhow::Result<(PathBuf, std::ffi::OsString)> {
    let path = std::env::current_exe().context("locating the cascade executable")?;
    let name = path.as_os_str().to_os_string();
    let proc_exe = Path::new("/proc/self/exe");
    if cfg!(target_os = "linux") && proc_exe.exists() {
        return Ok((proc_exe.to_path_buf(), name));
    }
    Ok((path, name))
}
