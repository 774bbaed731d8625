//! The writer's helper thread: keeps the slow, page-cache-heavy work off `append`.
//!
//! Writing a fresh segment costs far more than copying the records into it: every page of a new
//! file has to be allocated, zeroed, and (on ext4/xfs, for preallocated blocks) marked written,
//! and freeing a deleted segment's pages costs again. The helper does both in the background:
//!
//! - **Prepare** segment N+1 while N is being written: create `seg-…log.tmp`, preallocate and
//!   fsync it, map it (with huge pages where the filesystem has large folios) and prefault the
//!   whole mapping writable. The file keeps its temporary name, invisible to readers, until
//!   the writer rolls: then it writes the header, msyncs it and renames the file into place
//!   ([`crate::segment::finish_segment`]), exactly as a segment created on the spot.
//!   **Recycle** instead when the writer hands over a consumed segment's file (and its
//!   mapping): rename `seg-<old>.log` to `seg-<N+1>.log.tmp`, store the new index in its
//!   header, re-fault any page written back since (`crate::segment::recycle_segment`). No
//!   page is allocated, zeroed or freed, which is most of what a fresh segment costs.
//! - **Release** the writer's mappings of deleted segments, so that the kernel frees their
//!   pages here rather than in `append`.
//!
//! Nothing the helper does is needed for crash safety: a spare left behind by a crash is a
//! `.tmp` file, removed when the next writer opens the directory (a recycled one had been
//! consumed, so removing it is what retention would have done).

use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

use crate::error::Result;
use crate::mmap::Mapping;
use crate::segment::{prepare_segment, recycle_segment, Spare};

enum Job {
    Prepare {
        dir: PathBuf,
        index: u64,
        size: u64,
        /// A consumed segment's file to reuse: (its index, this writer's mapping of it).
        reuse: Option<(u64, Mapping)>,
    },
    Release(Mapping),
}

/// Prepares spare `index`: recycles `reuse` when given (falling back to a new file if that
/// fails, e.g. the file is gone), else creates a new file.
pub(crate) fn make_spare(
    dir: &std::path::Path,
    index: u64,
    size: u64,
    reuse: Option<(u64, Mapping)>,
    populate: bool,
) -> Result<Spare> {
    if let Some((old, map)) = reuse {
        if map.len() == size {
            if let Ok(spare) = recycle_segment(dir, old, map, index, populate) {
                return Ok(spare);
            }
        } else {
            drop(map);
            let path = dir.join(crate::segment::segment_file_name(old));
            let _ = std::fs::remove_file(path);
        }
    }
    prepare_segment(dir, index, size, populate)
}

/// Handle of the helper thread of one writer. Without a thread (spawning failed) every job
/// runs inline.
#[derive(Debug, Default)]
pub(crate) struct Helper {
    jobs: Option<Sender<Job>>,
    done: Option<Receiver<Result<Spare>>>,
    thread: Option<JoinHandle<()>>,
    /// Index of the segment being prepared, if any.
    pending: Option<u64>,
    spawn_failed: bool,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Job::Prepare { index, .. } => write!(f, "Prepare({index})"),
            Job::Release(m) => write!(f, "Release({})", m.path().display()),
        }
    }
}

impl Helper {
    fn send(&mut self, job: Job) -> std::result::Result<(), Job> {
        if self.jobs.is_none() && !self.spawn_failed {
            let (jobs, rx) = channel::<Job>();
            let (tx, done) = channel();
            let spawned = std::thread::Builder::new()
                .name("replay-segments".into())
                .spawn(move || {
                    for job in rx {
                        match job {
                            Job::Prepare {
                                dir,
                                index,
                                size,
                                reuse,
                            } => {
                                if tx.send(make_spare(&dir, index, size, reuse, true)).is_err() {
                                    return;
                                }
                            }
                            Job::Release(map) => drop(map),
                        }
                    }
                });
            match spawned {
                Ok(handle) => {
                    self.jobs = Some(jobs);
                    self.done = Some(done);
                    self.thread = Some(handle);
                }
                Err(_) => self.spawn_failed = true,
            }
        }
        match &self.jobs {
            Some(jobs) => jobs.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }

    /// Whether a segment is being prepared (or prepared and not taken yet).
    pub(crate) fn is_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Starts preparing segment `index` unless one is already pending, from the file of
    /// `reuse` when given. Gives `reuse` back when the job was not started.
    pub(crate) fn prepare(
        &mut self,
        dir: PathBuf,
        index: u64,
        size: u64,
        reuse: Option<(u64, Mapping)>,
    ) -> Option<(u64, Mapping)> {
        if self.pending.is_some() {
            return reuse;
        }
        // Without a thread there is nothing to overlap with: the writer creates the segment
        // when it needs it, as `take` then returns `None`.
        match self.send(Job::Prepare {
            dir,
            index,
            size,
            reuse,
        }) {
            Ok(()) => {
                self.pending = Some(index);
                None
            }
            Err(Job::Prepare { reuse, .. }) => reuse,
            Err(Job::Release(_)) => None,
        }
    }

    /// The prepared segment `index`: `None` when none was asked for (or a different one was,
    /// which is then discarded). Waits for a preparation in progress.
    pub(crate) fn take(&mut self, index: u64) -> Option<Result<Spare>> {
        let pending = self.pending.take()?;
        let result = match self.done.as_ref().map(|d| d.recv()) {
            Some(Ok(r)) => r,
            // The thread is gone (it cannot panic short of a bug): create the segment inline.
            _ => return None,
        };
        if pending != index {
            if let Ok(spare) = result {
                spare.discard();
            }
            return None;
        }
        Some(result)
    }

    /// Unmaps `map` on the helper thread (inline without one).
    pub(crate) fn release(&mut self, map: Mapping) {
        if let Err(Job::Release(map)) = self.send(Job::Release(map)) {
            drop(map);
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        // Close the job queue, let the thread finish what it has, and remove an unused spare.
        self.jobs = None;
        if self.pending.take().is_some() {
            if let Some(Ok(Ok(spare))) = self.done.as_ref().map(|d| d.recv()) {
                spare.discard();
            }
        }
        if let Some(handle) = self.thread.take() {
            let _ = handle.join();
        }
    }
}
