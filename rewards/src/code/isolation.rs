//! Kernel isolation for sandboxed runs: what this machine allows (probed once) and the steps
//! the forked child takes before `exec`.
//!
//! Everything in [`ChildPlan::apply`] runs between `fork` and `exec` of a possibly
//! multi-threaded parent, so it only makes raw, async-signal-safe syscalls and never allocates.

use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::landlock::{self, Coverage};

/// The isolation features available on this kernel, probed once per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Isolation {
    /// Running as root: the child switches to a fresh unprivileged uid (root ignores
    /// `RLIMIT_NPROC` and may signal anything).
    pub drop_uid: bool,
    /// A new user namespace is created (unprivileged callers need it for the others).
    pub user_ns: bool,
    /// A new, empty network namespace: no interface but a down loopback.
    pub net_ns: bool,
    /// A new pid namespace: the program is pid 1 of its own namespace, cannot see or signal
    /// the parent, and everything it forked dies with it.
    pub pid_ns: bool,
    /// Landlock coverage (ABI 0 = unavailable): filesystem limited to system directories
    /// (read-only) and the scratch directory.
    pub landlock: Coverage,
}

impl Isolation {
    /// Probes the kernel once; later calls return the cached answer.
    pub fn probe() -> Isolation {
        static PROBED: OnceLock<Isolation> = OnceLock::new();
        *PROBED.get_or_init(probe_uncached)
    }

    /// One line for start-up logs saying what is isolated.
    pub fn describe(&self) -> String {
        let net = if self.net_ns {
            "network isolation active (new network namespace)".to_string()
        } else if self.landlock.tcp {
            "network isolation PARTIAL (no network namespace; TCP denied by Landlock)".to_string()
        } else {
            "network isolation NOT active (no network namespace allowed)".to_string()
        };
        let fs = match self.landlock.abi {
            0 => "filesystem NOT restricted (no Landlock)".to_string(),
            abi => format!(
                "Landlock ABI {abi}: filesystem limited to system dirs + scratch{}",
                if self.landlock.scoped {
                    ", signals/abstract sockets scoped"
                } else {
                    ""
                }
            ),
        };
        format!(
            "sandbox: {net}; {fs}; pid namespace {}; {}",
            if self.pid_ns { "yes" } else { "no" },
            if self.drop_uid {
                "runs as a fresh unprivileged uid"
            } else if self.user_ns {
                "runs in a new user namespace"
            } else {
                "runs as the calling user"
            }
        )
    }
}

fn probe_uncached() -> Isolation {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let user = if root { 0 } else { libc::CLONE_NEWUSER };
    let try_flags = |flags: libc::c_int| -> bool {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "exit 0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        cmd.stderr(Stdio::null());
        // SAFETY: the closure only calls unshare(2), which is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                if libc::unshare(flags) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        matches!(cmd.status(), Ok(s) if s.success())
    };
    let user_ns = !root && try_flags(libc::CLONE_NEWUSER);
    let user = if user_ns { user } else { 0 };
    let net_ns = try_flags(user | libc::CLONE_NEWNET);
    let pid_ns = try_flags(user | libc::CLONE_NEWPID);
    Isolation {
        drop_uid: root,
        user_ns,
        net_ns,
        pid_ns,
        landlock: Coverage::for_abi(landlock::abi_version()),
    }
}

/// Resource limits applied in the child (`setrlimit`; soft = hard unless stated).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// CPU seconds (soft; hard = soft + 1 so SIGXCPU comes first, then SIGKILL).
    pub cpu_seconds: u64,
    /// Address space in bytes.
    pub address_space: u64,
    /// Processes/threads of the sandbox uid.
    pub processes: u64,
    /// Largest file the program may write, bytes.
    pub file_size: u64,
    /// Open file descriptors.
    pub open_files: u64,
}

/// Everything the child needs, computed in the parent so that [`ChildPlan::apply`] allocates
/// nothing.
#[derive(Debug, Clone, Copy)]
pub struct ChildPlan {
    /// Features to use.
    pub isolation: Isolation,
    /// The uid/gid to switch to when `isolation.drop_uid`.
    pub uid: u32,
    /// Limits to set.
    pub limits: Limits,
    /// A Landlock ruleset descriptor to enforce, if any.
    pub landlock_fd: Option<RawFd>,
    /// A descriptor to keep open across `exec` (the harness's result pipe).
    pub keep_fd: Option<RawFd>,
}

fn check(rc: libc::c_int) -> std::io::Result<()> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl ChildPlan {
    /// Runs in the forked child before `exec`.
    ///
    /// # Safety
    /// Only call from a `pre_exec` hook: it may fork and never return in the parent half, and
    /// must not allocate. Descriptors in the plan must be open in the child.
    pub unsafe fn apply(&self) -> std::io::Result<()> {
        let iso = self.isolation;
        // SAFETY: raw syscalls with integer or stack-struct arguments only,
        // as required between fork and exec; the plan was fully built before the fork.
        unsafe {
            check(libc::setsid())?;
            let mut flags = 0;
            if iso.user_ns {
                flags |= libc::CLONE_NEWUSER;
            }
            if iso.net_ns {
                flags |= libc::CLONE_NEWNET;
            }
            if iso.pid_ns {
                flags |= libc::CLONE_NEWPID;
            }
            if flags != 0 {
                check(libc::unshare(flags))?;
            }
            if iso.pid_ns {
                // unshare(CLONE_NEWPID) puts only our children in the namespace: fork once, the
                // child becomes pid 1 and execs the program, this process just relays its exit
                // status. It closes every other descriptor first so the parent's exec-error
                // pipe and the output pipes only stay open as long as the program runs.
                let pid = libc::fork();
                check(pid)?;
                if pid > 0 {
                    relay_exit(pid);
                }
            }
            if let Some(fd) = self.keep_fd {
                check(libc::fcntl(fd, libc::F_SETFD, 0))?;
            }
            if iso.drop_uid {
                check(libc::setgroups(0, std::ptr::null()))?;
                check(libc::setresgid(self.uid, self.uid, self.uid))?;
                check(libc::setresuid(self.uid, self.uid, self.uid))?;
            }
            check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0))?;
            let l = self.limits;
            set_limit(libc::RLIMIT_CPU, l.cpu_seconds, l.cpu_seconds + 1)?;
            set_limit(libc::RLIMIT_AS, l.address_space, l.address_space)?;
            set_limit(libc::RLIMIT_NPROC, l.processes, l.processes)?;
            set_limit(libc::RLIMIT_FSIZE, l.file_size, l.file_size)?;
            set_limit(libc::RLIMIT_NOFILE, l.open_files, l.open_files)?;
            set_limit(libc::RLIMIT_CORE, 0, 0)?;
            if let Some(fd) = self.landlock_fd {
                landlock::restrict_self_raw(fd)?;
                libc::close(fd);
            }
        }
        Ok(())
    }
}

/// The relay half of the pid-namespace fork: waits for pid 1 and exits like it.
///
/// # Safety
/// Only in a forked child before exec; never returns.
unsafe fn relay_exit(pid: libc::pid_t) -> ! {
    // SAFETY: raw syscalls on integers and a stack status word; `_exit` skips all Rust/libc
    // teardown, which must not run in a forked child.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
        let mut status = 0;
        loop {
            let rc = libc::waitpid(pid, &mut status, 0);
            if rc == pid {
                break;
            }
            if rc < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(125);
            }
        }
        if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        }
        libc::_exit(128 + libc::WTERMSIG(status));
    }
}

fn set_limit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> std::io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `lim` is a valid rlimit on the stack for the duration of the call.
    check(unsafe { libc::setrlimit(resource, &lim) })
}
