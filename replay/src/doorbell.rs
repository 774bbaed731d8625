//! A shared wake-up word so the reader sleeps in the kernel instead of spinning, and wakes
//! within microseconds of an append in another process.
//!
//! `RUN_DIR/replay/doorbell` is a small file every writer and the reader map. Writers bump a
//! counter after each publication and, only when a reader has announced that it sleeps, wake
//! it with a futex on that counter. The reader reads the counter, looks for records, and if
//! there are none, announces itself and waits for the counter to change (with a timeout, so a
//! lost wake-up only costs latency).

use std::fs::OpenOptions;
use std::path::Path;
use std::time::Duration;

use crate::error::{IoContext, Result};
use crate::mmap::Mapping;

/// Name of the doorbell file in the replay root.
pub const DOORBELL_FILE: &str = "doorbell";
const SIZE: u64 = 4096;
const COUNTER: u64 = 0;
/// On its own cache line, away from the counter the writers bump.
const SLEEPERS: u64 = 64;

/// A mapped doorbell file.
#[derive(Debug)]
pub(crate) struct Doorbell {
    map: Mapping,
}

impl Doorbell {
    /// Opens the doorbell in `root`, creating it when `create` (writers) — atomically, through a
    /// unique temporary file hard-linked into place, so concurrent creators agree on one inode.
    pub(crate) fn open(root: &Path, create: bool) -> Result<Option<Doorbell>> {
        let path = root.join(DOORBELL_FILE);
        if !path.exists() {
            if !create {
                return Ok(None);
            }
            let tmp = root.join(format!(".doorbell.{}.tmp", std::process::id()));
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)
                .at(&tmp)?;
            f.set_len(SIZE).at(&tmp)?;
            f.sync_all().at(&tmp)?;
            drop(f);
            let linked = std::fs::hard_link(&tmp, &path);
            let _ = std::fs::remove_file(&tmp);
            match linked {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e).at(&path),
            }
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .at(&path)?;
        if file.metadata().at(&path)?.len() < SIZE {
            return Ok(None);
        }
        Ok(Some(Doorbell {
            map: Mapping::open_write(&file, &path)?,
        }))
    }

    /// Called by a writer after publishing.
    pub(crate) fn ring(&self) {
        self.map.fetch_add(COUNTER);
        if self.map.load_seqcst(SLEEPERS) > 0 {
            self.map.futex_wake(COUNTER);
        }
    }

    /// The counter, read before looking for records.
    pub(crate) fn counter(&self) -> u32 {
        self.map.load_seqcst(COUNTER)
    }

    /// Sleeps until the counter differs from `seen` or `timeout` passes.
    pub(crate) fn wait(&self, seen: u32, timeout: Duration) {
        self.map.fetch_add(SLEEPERS);
        if self.map.load_seqcst(COUNTER) == seen {
            self.map.futex_wait(COUNTER, seen, timeout);
        }
        self.map.fetch_sub(SLEEPERS);
    }
}
