//! A minimal Landlock ruleset for the sandbox, built with raw syscalls.
//!
//! The ruleset is created in the parent (where allocating and opening paths is safe) and only
//! `prctl(PR_SET_NO_NEW_PRIVS)` + `landlock_restrict_self` run in the forked child, both
//! async-signal-safe. That split is why this module talks to the kernel directly instead of
//! through the `landlock` crate, whose builder is meant to run in the process it restricts.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

// Filesystem access rights (include/uapi/linux/landlock.h).
const FS_EXECUTE: u64 = 1 << 0;
const FS_WRITE_FILE: u64 = 1 << 1;
const FS_READ_FILE: u64 = 1 << 2;
const FS_READ_DIR: u64 = 1 << 3;
const FS_ABI1_ALL: u64 = (1 << 13) - 1;
const FS_REFER: u64 = 1 << 13;
const FS_TRUNCATE: u64 = 1 << 14;
const FS_IOCTL_DEV: u64 = 1 << 15;
// Network access rights (ABI >= 4).
const NET_BIND_TCP: u64 = 1 << 0;
const NET_CONNECT_TCP: u64 = 1 << 1;
// Scopes (ABI >= 6).
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
const SCOPE_SIGNAL: u64 = 1 << 1;

const CREATE_RULESET_VERSION: u32 = 1 << 0;
const RULE_PATH_BENEATH: libc::c_int = 1;

/// Read-only access to a directory tree (read, list, execute).
pub const READ_EXEC: u64 = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR;
/// Read and write an existing file (for device nodes such as `/dev/null`).
pub const READ_WRITE_FILE: u64 = FS_READ_FILE | FS_WRITE_FILE;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// The Landlock ABI version of the running kernel, 0 when Landlock is unavailable.
pub fn abi_version() -> u32 {
    // SAFETY: with LANDLOCK_CREATE_RULESET_VERSION the kernel reads no attribute (null, size 0)
    // and returns the ABI version or -1; no memory is shared.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        0
    } else {
        v as u32
    }
}

/// What a ruleset restricts on a kernel of a given ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coverage {
    /// The kernel's Landlock ABI version.
    pub abi: u32,
    /// TCP bind/connect are denied (ABI >= 4).
    pub tcp: bool,
    /// Signals to processes outside the sandbox and abstract unix sockets are denied (ABI >= 6).
    pub scoped: bool,
}

impl Coverage {
    /// The coverage for `abi`.
    pub fn for_abi(abi: u32) -> Self {
        Self {
            abi,
            tcp: abi >= 4,
            scoped: abi >= 6,
        }
    }
}

fn handled_fs(abi: u32) -> u64 {
    let mut fs = FS_ABI1_ALL;
    if abi >= 2 {
        fs |= FS_REFER;
    }
    if abi >= 3 {
        fs |= FS_TRUNCATE;
    }
    if abi >= 5 {
        fs |= FS_IOCTL_DEV;
    }
    fs
}

/// A created ruleset: deny everything handled except the added paths.
#[derive(Debug)]
pub struct Ruleset {
    fd: OwnedFd,
    abi: u32,
}

impl Ruleset {
    /// Creates a ruleset handling every filesystem right the kernel knows, TCP bind/connect and
    /// the signal/abstract-socket scopes where supported. `None` when Landlock is unavailable.
    pub fn new(abi: u32) -> std::io::Result<Option<Self>> {
        if abi == 0 {
            return Ok(None);
        }
        let cov = Coverage::for_abi(abi);
        let attr = RulesetAttr {
            handled_access_fs: handled_fs(abi),
            handled_access_net: if cov.tcp {
                NET_BIND_TCP | NET_CONNECT_TCP
            } else {
                0
            },
            scoped: if cov.scoped {
                SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
            } else {
                0
            },
        };
        // Older kernels accept a larger struct as long as the unknown tail is zero, which it
        // is because unsupported fields are left 0 above.
        // SAFETY: `attr` is a live, properly laid out landlock_ruleset_attr and the size passed
        // is its size; the kernel only reads it during the call.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                &attr as *const RulesetAttr,
                std::mem::size_of::<RulesetAttr>(),
                0u32,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the syscall returned a fresh file descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        Ok(Some(Self { fd, abi }))
    }

    /// Allows `access` beneath `path`. A path that does not exist is skipped (`Ok(false)`), so
    /// a fixed list of system directories works across distributions.
    pub fn allow(&mut self, path: &Path, access: u64) -> std::io::Result<bool> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        // SAFETY: `c` is a valid NUL-terminated path; O_PATH|O_CLOEXEC opens no data.
        let raw = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if raw < 0 {
            let err = std::io::Error::last_os_error();
            return match err.kind() {
                std::io::ErrorKind::NotFound => Ok(false),
                _ => Err(err),
            };
        }
        // SAFETY: `raw` was just returned by open and is owned here only.
        let parent = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut access = access & handled_fs(self.abi);
        let is_dir = std::fs::metadata(path).map(|m| m.is_dir()).unwrap_or(false);
        if !is_dir {
            // Directory-only rights on a file make the kernel reject the rule.
            access &= FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV;
        }
        let attr = PathBeneathAttr {
            allowed_access: access,
            parent_fd: parent.as_raw_fd(),
        };
        // SAFETY: `attr` is a live packed landlock_path_beneath_attr, both fds are open for the
        // duration of the call, and the kernel only reads `attr`.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                self.fd.as_raw_fd(),
                RULE_PATH_BENEATH,
                &attr as *const PathBeneathAttr,
                0u32,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(true)
    }

    /// Allows every right beneath `path` (the sandbox's scratch directory).
    pub fn allow_all(&mut self, path: &Path) -> std::io::Result<bool> {
        self.allow(path, handled_fs(self.abi))
    }

    /// The raw descriptor, for [`restrict_self_raw`] in the forked child.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Enforces the ruleset `fd` on the calling process. Async-signal-safe: two syscalls.
///
/// # Safety
/// Must only be called in a forked child before `exec` (or in a process that wants to restrict
/// itself); `fd` must be a ruleset descriptor that stays open for the call.
pub unsafe fn restrict_self_raw(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: plain prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: integer arguments only; the caller guarantees `fd` is an open ruleset.
    if unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
