//! Running untrusted Python in a sandbox: own session and process group, fresh scratch
//! directory as cwd, cleared environment, rlimits, wall-clock timeout that kills the whole group,
//! capped output, and the kernel isolation of [`Isolation`].

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::isolation::{ChildPlan, Isolation, Limits};
use super::landlock::{self, Ruleset};
use crate::VerifyError;

/// Sandbox settings. Defaults suit HumanEval-sized programs.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct SandboxConfig {
    /// Interpreter; default `/usr/bin/python3` if present, else `python3` on `PATH` (resolved
    /// to the real executable once).
    pub python: Option<PathBuf>,
    /// CPU seconds per run.
    pub cpu_seconds: u64,
    /// Address-space limit per process, bytes.
    pub address_space_bytes: u64,
    /// Process/thread limit for the sandbox uid.
    pub max_processes: u64,
    /// Largest file the program may write, bytes.
    pub max_file_bytes: u64,
    /// Open descriptor limit.
    pub max_open_files: u64,
    /// Cap on stdout and on stderr each; the run is killed when exceeded.
    pub max_output_bytes: usize,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            python: None,
            cpu_seconds: 10,
            address_space_bytes: 2 << 30,
            max_processes: 32,
            max_file_bytes: 16 << 20,
            max_open_files: 64,
            max_output_bytes: 4 << 20,
        }
    }
}

/// One program run.
#[derive(Debug, Clone)]
pub struct Job<'a> {
    /// Files written into the scratch directory before the run: (name, contents).
    pub files: Vec<(&'a str, &'a [u8])>,
    /// Arguments after `python3 -I -S -B`. The literal `{result_fd}` is replaced by the number
    /// of the result pipe when `result_pipe` is set.
    pub args: Vec<String>,
    /// Bytes fed to stdin.
    pub stdin: &'a [u8],
    /// Wall-clock limit.
    pub timeout: Duration,
    /// Open a pipe whose write end the program inherits (for the harness's verdict).
    pub result_pipe: bool,
}

/// How a run ended.
#[derive(Debug, Clone, Default)]
pub struct RunOutput {
    /// Exit code, if it exited.
    pub code: Option<i32>,
    /// Terminating signal, if killed.
    pub signal: Option<i32>,
    /// Captured stdout (at most the cap).
    pub stdout: Vec<u8>,
    /// Captured stderr (at most the cap).
    pub stderr: Vec<u8>,
    /// Bytes written to the result pipe (at most 4 KiB).
    pub result: Vec<u8>,
    /// Killed by the wall-clock timeout.
    pub timed_out: bool,
    /// Killed because stdout or stderr exceeded the cap.
    pub output_overflow: bool,
    /// Wall-clock time of the run.
    pub elapsed: Duration,
}

impl RunOutput {
    /// Exited normally with status 0, not killed.
    pub fn success(&self) -> bool {
        self.code == Some(0) && !self.timed_out && !self.output_overflow
    }
}

/// A configured sandbox; cheap to share across threads.
#[derive(Debug)]
pub struct Sandbox {
    cfg: SandboxConfig,
    python: PathBuf,
    read_dirs: Vec<PathBuf>,
    scratch_root: PathBuf,
    isolation: Isolation,
}

const SYSTEM_DIRS: [&str; 7] = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc"];
const DEVICES: [&str; 4] = ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"];
const RESULT_CAP: usize = 4096;

static RUN_COUNTER: AtomicU32 = AtomicU32::new(0);

fn env_err(what: impl std::fmt::Display) -> VerifyError {
    VerifyError::Environment(what.to_string())
}

impl Sandbox {
    /// Probes the kernel, resolves the interpreter and checks that a trivial program runs.
    pub fn new(cfg: SandboxConfig) -> Result<Self, VerifyError> {
        let requested = cfg.python.clone().unwrap_or_else(|| {
            if Path::new("/usr/bin/python3").exists() {
                PathBuf::from("/usr/bin/python3")
            } else {
                PathBuf::from("python3")
            }
        });
        // Ask the interpreter (outside the sandbox, it is trusted) where it really lives, so a
        // pyenv shim resolves to the binary and its prefix can be allowed read-only.
        let out = Command::new(&requested)
            .args([
                "-I",
                "-S",
                "-c",
                "import sys; print(sys.executable); print(sys.base_prefix)",
            ])
            .output()
            .map_err(|e| env_err(format!("cannot run {}: {e}", requested.display())))?;
        if !out.status.success() {
            return Err(env_err(format!(
                "{} failed: {:?}",
                requested.display(),
                out.status
            )));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut lines = text.lines();
        let python = PathBuf::from(lines.next().unwrap_or_default());
        let prefix = PathBuf::from(lines.next().unwrap_or_default());
        let mut read_dirs: Vec<PathBuf> = SYSTEM_DIRS.iter().map(PathBuf::from).collect();
        for dir in [
            prefix,
            python.parent().map(Path::to_path_buf).unwrap_or_default(),
        ] {
            if let Ok(dir) = dir.canonicalize() {
                read_dirs.push(dir);
            }
        }
        let scratch_root = scratch_root();
        let sandbox = Self {
            cfg,
            python,
            read_dirs,
            scratch_root,
            isolation: Isolation::probe(),
        };
        let probe = sandbox.run(&Job {
            files: vec![("probe.py", b"print(6 * 7)")],
            args: vec!["probe.py".into()],
            stdin: b"",
            timeout: Duration::from_secs(20),
            result_pipe: false,
        })?;
        if !probe.success() || probe.stdout != b"42\n" {
            return Err(env_err(format!(
                "a trivial program fails in the sandbox ({}; {:?}): {}",
                sandbox.python.display(),
                sandbox.isolation,
                String::from_utf8_lossy(&probe.stderr)
            )));
        }
        Ok(sandbox)
    }

    /// What is isolated on this machine.
    pub fn isolation(&self) -> &Isolation {
        &self.isolation
    }

    /// The resolved interpreter.
    pub fn python(&self) -> &Path {
        &self.python
    }

    /// Runs one job in a fresh scratch directory that is removed afterwards.
    pub fn run(&self, job: &Job<'_>) -> Result<RunOutput, VerifyError> {
        let scratch = tempfile::Builder::new()
            .prefix("cascade-sbx-")
            .tempdir_in(&self.scratch_root)
            .map_err(|e| env_err(format!("scratch dir: {e}")))?;
        let n = RUN_COUNTER.fetch_add(1, Ordering::Relaxed);
        // A uid nobody else uses, so RLIMIT_NPROC counts only this run's processes.
        let uid = 0x5A00_0000 | ((std::process::id() & 0xffff) << 8) | (n & 0xff);
        for (name, contents) in &job.files {
            std::fs::write(scratch.path().join(name), contents)
                .map_err(|e| env_err(format!("writing {name}: {e}")))?;
        }
        if self.isolation.drop_uid {
            chown_tree(scratch.path(), uid)?;
        }
        let ruleset = self.ruleset(scratch.path())?;
        let (result_r, result_w) = if job.result_pipe {
            let (r, w) = pipe()?;
            (Some(r), Some(w))
        } else {
            (None, None)
        };
        let result_fd = result_w.as_ref().map(|w| w.as_raw_fd());
        let plan = ChildPlan {
            isolation: self.isolation,
            uid,
            limits: Limits {
                cpu_seconds: self.cfg.cpu_seconds,
                address_space: self.cfg.address_space_bytes,
                processes: self.cfg.max_processes,
                file_size: self.cfg.max_file_bytes,
                open_files: self.cfg.max_open_files,
            },
            landlock_fd: ruleset.as_ref().map(Ruleset::raw_fd),
            keep_fd: result_fd,
        };
        let mut cmd = Command::new(&self.python);
        cmd.args(["-I", "-S", "-B"]);
        for arg in &job.args {
            match result_fd {
                Some(fd) => cmd.arg(arg.replace("{result_fd}", &fd.to_string())),
                None => cmd.arg(arg),
            };
        }
        cmd.current_dir(scratch.path())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", scratch.path())
            .env("TMPDIR", scratch.path())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("PYTHONIOENCODING", "utf-8")
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: `apply` only makes async-signal-safe syscalls and does not allocate; the
        // plan is `Copy` and was built before the fork.
        unsafe {
            cmd.pre_exec(move || plan.apply());
        }
        let start = Instant::now();
        let mut child = cmd.spawn().map_err(|e| env_err(format!("spawn: {e}")))?;
        drop(result_w);
        drop(ruleset);
        let pgid = child.id() as libc::pid_t;
        let mut out = RunOutput::default();
        let io = Pipes {
            stdin: child.stdin.take().map(OwnedFd::from),
            stdout: child.stdout.take().map(OwnedFd::from),
            stderr: child.stderr.take().map(OwnedFd::from),
            result: result_r,
        };
        let pumped = io.pump(job, self.cfg.max_output_bytes, start, &mut out);
        // Always kill the group: leftovers of a finished program, or the runaway one.
        // SAFETY: killpg with the pid of our unreaped child (so it cannot have been reused).
        unsafe { libc::killpg(pgid, libc::SIGKILL) };
        let status = child.wait().map_err(|e| env_err(format!("wait: {e}")))?;
        out.elapsed = start.elapsed();
        out.code = status.code();
        out.signal = status.signal();
        if let (Some(code), true) = (out.code, self.isolation.pid_ns) {
            // The pid-namespace relay encodes a signal death of pid 1 as 128 + signal.
            if code > 128 {
                out.code = None;
                out.signal = Some(code - 128);
            }
        }
        pumped?;
        Ok(out)
    }

    fn ruleset(&self, scratch: &Path) -> Result<Option<Ruleset>, VerifyError> {
        let fail = |e: std::io::Error| env_err(format!("landlock: {e}"));
        let Some(mut rs) = Ruleset::new(self.isolation.landlock.abi).map_err(fail)? else {
            return Ok(None);
        };
        for dir in &self.read_dirs {
            rs.allow(dir, landlock::READ_EXEC).map_err(fail)?;
        }
        for dev in DEVICES {
            rs.allow(Path::new(dev), landlock::READ_WRITE_FILE)
                .map_err(fail)?;
        }
        rs.allow_all(scratch).map_err(fail)?;
        Ok(Some(rs))
    }
}

/// The scratch root: the system temp dir, unless it lies inside the current (run) directory.
fn scratch_root() -> PathBuf {
    let tmp = std::env::temp_dir();
    let cwd = std::env::current_dir()
        .ok()
        .and_then(|c| c.canonicalize().ok());
    match (tmp.canonicalize(), cwd) {
        (Ok(t), Some(c)) if t.starts_with(&c) => PathBuf::from("/tmp"),
        (Ok(t), _) => t,
        _ => PathBuf::from("/tmp"),
    }
}

fn chown_tree(dir: &Path, uid: u32) -> Result<(), VerifyError> {
    let own = |p: &Path| {
        std::os::unix::fs::chown(p, Some(uid), Some(uid))
            .map_err(|e| env_err(format!("chown {}: {e}", p.display())))
    };
    own(dir)?;
    for entry in std::fs::read_dir(dir).map_err(|e| env_err(format!("scratch: {e}")))? {
        let entry = entry.map_err(|e| env_err(format!("scratch: {e}")))?;
        own(&entry.path())?;
    }
    Ok(())
}

fn pipe() -> Result<(OwnedFd, OwnedFd), VerifyError> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(env_err(format!(
            "pipe: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: pipe2 succeeded, so both descriptors are fresh and owned only here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on a descriptor we own, integer arguments.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

/// The parent's ends of the child's pipes.
struct Pipes {
    stdin: Option<OwnedFd>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    result: Option<OwnedFd>,
}

impl Pipes {
    /// Feeds stdin and collects output until every output pipe is closed, the deadline passes
    /// or an output exceeds its cap.
    fn pump(
        mut self,
        job: &Job<'_>,
        cap: usize,
        start: Instant,
        out: &mut RunOutput,
    ) -> Result<(), VerifyError> {
        for fd in [&self.stdin, &self.stdout, &self.stderr, &self.result]
            .into_iter()
            .flatten()
        {
            set_nonblocking(fd.as_raw_fd());
        }
        let mut written = 0usize;
        if job.stdin.is_empty() {
            self.stdin = None;
        }
        let deadline = start + job.timeout;
        let mut buf = vec![0u8; 64 * 1024];
        while self.stdout.is_some() || self.stderr.is_some() || self.result.is_some() {
            let now = Instant::now();
            if now >= deadline {
                out.timed_out = true;
                return Ok(());
            }
            let wait_ms = (deadline - now).as_millis().clamp(1, i32::MAX as u128) as i32;
            let slots: [(Option<RawFd>, libc::c_short); 4] = [
                (self.stdin.as_ref().map(|f| f.as_raw_fd()), libc::POLLOUT),
                (self.stdout.as_ref().map(|f| f.as_raw_fd()), libc::POLLIN),
                (self.stderr.as_ref().map(|f| f.as_raw_fd()), libc::POLLIN),
                (self.result.as_ref().map(|f| f.as_raw_fd()), libc::POLLIN),
            ];
            let mut pfds: Vec<libc::pollfd> = slots
                .iter()
                .map(|(fd, ev)| libc::pollfd {
                    fd: fd.unwrap_or(-1),
                    events: *ev,
                    revents: 0,
                })
                .collect();
            // SAFETY: `pfds` is a live array of pollfd of the length passed; fd -1 is ignored.
            let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, wait_ms) };
            if rc < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return Err(env_err(format!("poll: {err}")));
            }
            if pfds[0].revents != 0 {
                if let Some(fd) = self.stdin.take() {
                    let mut file = std::fs::File::from(fd);
                    match file.write(&job.stdin[written..]) {
                        Ok(n) => written += n,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        Err(_) => written = job.stdin.len(),
                    }
                    if written < job.stdin.len() {
                        self.stdin = Some(OwnedFd::from(file));
                    }
                }
            }
            let sinks: [(&mut Option<OwnedFd>, &mut Vec<u8>, usize); 3] = [
                (&mut self.stdout, &mut out.stdout, cap),
                (&mut self.stderr, &mut out.stderr, cap),
                (&mut self.result, &mut out.result, RESULT_CAP),
            ];
            for (i, (slot, sink, limit)) in sinks.into_iter().enumerate() {
                if pfds[i + 1].revents == 0 {
                    continue;
                }
                if let Some(fd) = slot.take() {
                    let mut file = std::fs::File::from(fd);
                    match file.read(&mut buf) {
                        Ok(0) => continue, // EOF: leave the slot empty
                        Ok(n) => {
                            let room = limit.saturating_sub(sink.len());
                            sink.extend_from_slice(&buf[..n.min(room)]);
                            if n > room {
                                out.output_overflow = true;
                                return Ok(());
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(_) => continue,
                    }
                    *slot = Some(OwnedFd::from(file));
                }
            }
        }
        Ok(())
    }
}
