//! The only module that touches memory maps.
//!
//! A [`Mapping`] maps a whole segment (or doorbell) file with `MAP_SHARED`. The invariants the
//! rest of the crate relies on, and that every writer in every process keeps:
//!
//! 1. **One writer per file.** Only the process holding the actor directory's lock writes to
//!    its segments; everyone else maps them read-only.
//! 2. **Files never shrink.** Segments are preallocated to their final size before they are
//!    renamed into place and are never truncated (a truncated mapped file raises SIGBUS).
//!    Retention unlinks whole files or renames them for recycling; both leave existing
//!    mappings valid.
//! 3. **Publish last.** A record's bytes are written first; its `len` word is stored last with
//!    `Release` ordering and read with `Acquire` (a payload copied with streaming stores, which
//!    `Release` does not order on x86, ends with a store fence first, see
//!    `crc::crc32c_append_copy_nt`). Bytes of a record whose `len` was seen
//!    non-zero are not written again while the file is that segment (crash recovery only
//!    zeroes bytes after the last CRC-valid record, which were never handed out).
//! 4. **Recycling changes the index first.** A segment's file is reused for a later segment
//!    only once every registered consumer has published a consumed position past all its
//!    records, and the first change to the file is its header's index word (an `AtomicU64`,
//!    followed by a fence), before any other byte. A reader that still maps it checks that word
//!    (after an `Acquire` fence) after reading a record and before trusting it, so what it
//!    hands out was the segment's own; see `segment::recycled`.
//!
//! Offsets of `len` words are 4-byte aligned (records start at 8-byte aligned offsets and the
//! mapping is page aligned), which is what `AtomicU32` needs. The other shared words of a
//! segment, `published_end` and `index` in its header, are 8-byte aligned and accessed as
//! `AtomicU64` wherever they can change under a reader; `published_end` is rewritten after
//! publication and is outside every CRC.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use memmap2::{Advice, MmapOptions, MmapRaw};

use crate::error::{IoContext, Result};

/// Smallest payload [`Mapping::write_crc`] copies with streaming (non-temporal) stores: large
/// records go to memory without first reading the destination lines in (see
/// `crc::crc32c_append_copy_nt`); smaller ones are left in the cache, where the fence and the
/// unaligned head would cost more than they save.
const STREAM_MIN: usize = 32 << 10;

/// Smallest mapping worth asking for huge pages (one PMD on x86-64).
const HUGE: usize = 2 << 20;

/// Asks for large page-cache folios mapped by PMD for a large mapping. On kernels and
/// filesystems with large folios (ext4, xfs, tmpfs with `huge=`) this cuts the page faults of
/// a fresh segment by up to 512×; elsewhere it is a no-op. Purely advisory: errors are ignored.
fn advise_huge(raw: &MmapRaw) {
    if raw.len() >= HUGE {
        let _ = raw.advise(Advice::HugePage);
    }
}

/// A shared memory map of a whole file. See the module docs for the invariants.
pub(crate) struct Mapping {
    raw: MmapRaw,
    /// Usable length (0 for an empty file, whose stand-in map is one byte).
    len: u64,
    path: PathBuf,
    writable: bool,
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("path", &self.path)
            .field("len", &self.len)
            .finish()
    }
}

impl Mapping {
    /// Maps `path` read-only (readers, `inspect`). An empty file yields an empty mapping.
    pub(crate) fn open_read(path: &Path) -> Result<Mapping> {
        let file = File::open(path).at(path)?;
        Mapping::open_read_file(&file, path)
    }

    /// Maps `file` (opened for reading, at `path`) read-only, as [`Mapping::open_read`].
    pub(crate) fn open_read_file(file: &File, path: &Path) -> Result<Mapping> {
        let len = file.metadata().at(path)?.len();
        if len == 0 {
            // mmap of zero bytes is EINVAL; a one-byte anonymous map stands in, with length 0.
            let raw = MmapOptions::new().len(1).map_anon().at(path)?.into();
            return Ok(Mapping {
                raw,
                len: 0,
                path: path.to_path_buf(),
                writable: false,
            });
        }
        let raw = MmapOptions::new().map_raw_read_only(file).at(path)?;
        advise_huge(&raw);
        Ok(Mapping {
            len: raw.len() as u64,
            raw,
            path: path.to_path_buf(),
            writable: false,
        })
    }

    /// Maps `file` (opened read-write) for writing. Only the directory's lock holder calls this.
    pub(crate) fn open_write(file: &File, path: &Path) -> Result<Mapping> {
        let raw = MmapOptions::new().map_raw(file).at(path)?;
        advise_huge(&raw);
        Ok(Mapping {
            len: raw.len() as u64,
            raw,
            path: path.to_path_buf(),
            writable: true,
        })
    }

    /// The mapped file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Records that the mapped file was renamed (error messages name the file).
    pub(crate) fn set_path(&mut self, path: PathBuf) {
        self.path = path;
    }

    /// Faults every page in writable ahead of use (`MADV_POPULATE_WRITE`, Linux 5.14+), so the
    /// writer later copies into mapped memory instead of taking a page fault per page or huge
    /// page. Advisory: on older kernels, or when it fails, pages fault in on first write as
    /// usual. It changes no byte of the file.
    pub(crate) fn populate_write(&self) {
        if self.writable && self.len > 0 {
            let _ = self.raw.advise(Advice::PopulateWrite);
        }
    }

    /// Mapped length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// `len` bytes at `offset`, or `None` when out of bounds.
    ///
    /// Bytes of published records do not change while the file is their segment (invariants 3
    /// and 4). Callers that look at bytes not yet published (resynchronising after corruption,
    /// or a recycled file's stale bytes) must treat them as untrusted: they are validated by
    /// CRC and sequence number before any use, and a concurrent writer can only turn them into
    /// a valid record, never make a validated one invalid short of recycling the file, which
    /// readers detect (invariant 4).
    pub(crate) fn bytes(&self, offset: u64, len: u64) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        if end > self.len() {
            return None;
        }
        // SAFETY: `offset..end` lies inside the mapping (checked above), which stays mapped as
        // long as `self` lives (the file is never truncated, invariant 2), and the returned
        // slice borrows `self`. The memory is initialised (file-backed).
        Some(unsafe {
            std::slice::from_raw_parts(self.raw.as_ptr().add(offset as usize), len as usize)
        })
    }

    /// Asks the CPU to start loading the cache lines of `offset..offset + len` (clipped to the
    /// mapping). A hint only: it reads nothing, never faults, and changes no result.
    pub(crate) fn prefetch(&self, offset: u64, len: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let end = offset.saturating_add(len).min(self.len());
            let mut at = offset & !63;
            while at < end {
                // SAFETY: `at` is below `end`, at most the mapping's length, so the pointer
                // stays inside the mapping; a prefetch reads no memory architecturally.
                unsafe {
                    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                    _mm_prefetch::<_MM_HINT_T0>(self.raw.as_ptr().add(at as usize).cast());
                }
                at += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (offset, len);
    }

    fn atomic_u32(&self, offset: u64) -> Option<&AtomicU32> {
        if !offset.is_multiple_of(4) || offset.checked_add(4)? > self.len() {
            return None;
        }
        // SAFETY: in bounds and 4-byte aligned (checked above; the mapping base is page
        // aligned). The word lives as long as `&self`. All concurrent access to these words,
        // in any process, goes through atomics (invariant 3), so there is no non-atomic race.
        Some(unsafe { &*(self.raw.as_ptr().add(offset as usize) as *const AtomicU32) })
    }

    fn atomic_u64(&self, offset: u64) -> Option<&AtomicU64> {
        if !offset.is_multiple_of(8) || offset.checked_add(8)? > self.len() {
            return None;
        }
        // SAFETY: in bounds and 8-byte aligned (checked above; the mapping base is page
        // aligned). The word lives as long as `&self`. The only such word is a segment's
        // `published_end`, which every process accesses only through atomics.
        Some(unsafe { &*(self.raw.as_ptr().add(offset as usize) as *const AtomicU64) })
    }

    /// Loads the `u64` at `offset` with `Acquire` ordering (0 when out of bounds or unaligned).
    pub(crate) fn load_acquire_u64(&self, offset: u64) -> u64 {
        self.atomic_u64(offset)
            .map_or(0, |a| a.load(Ordering::Acquire))
    }

    /// Stores the `u64` at `offset` with `Release` ordering. Panics on an out-of-bounds or
    /// unaligned offset (a writer bug).
    pub(crate) fn store_release_u64(&mut self, offset: u64, value: u64) {
        assert!(self.writable, "store on a read-only mapping");
        self.atomic_u64(offset)
            .expect("aligned in-bounds u64 word")
            .store(value, Ordering::Release);
    }

    /// Loads the `u32` at `offset` with `Acquire` ordering (0 when out of bounds or unaligned,
    /// which readers treat as "nothing published").
    pub(crate) fn load_acquire(&self, offset: u64) -> u32 {
        self.atomic_u32(offset)
            .map_or(0, |a| a.load(Ordering::Acquire))
    }

    /// Stores `value` at `offset` with `Release` ordering: the publication of a record.
    /// Panics on an out-of-bounds or unaligned offset (a writer bug).
    pub(crate) fn store_release(&mut self, offset: u64, value: u32) {
        assert!(self.writable, "store on a read-only mapping");
        self.atomic_u32(offset)
            .expect("aligned in-bounds len word")
            .store(value, Ordering::Release);
    }

    /// Adds 1 to the shared counter at `offset` (`SeqCst`), returning the previous value.
    pub(crate) fn fetch_add(&self, offset: u64) -> u32 {
        assert!(self.writable, "fetch_add on a read-only mapping");
        self.atomic_u32(offset)
            .expect("aligned counter")
            .fetch_add(1, Ordering::SeqCst)
    }

    /// Subtracts 1 from the shared counter at `offset` (`SeqCst`).
    pub(crate) fn fetch_sub(&self, offset: u64) {
        assert!(self.writable, "fetch_sub on a read-only mapping");
        self.atomic_u32(offset)
            .expect("aligned counter")
            .fetch_sub(1, Ordering::SeqCst);
    }

    /// Loads the counter at `offset` with `SeqCst`.
    pub(crate) fn load_seqcst(&self, offset: u64) -> u32 {
        self.atomic_u32(offset)
            .map_or(0, |a| a.load(Ordering::SeqCst))
    }

    /// Panics unless this mapping is writable and `offset..offset + len` lies inside it (a
    /// writer bug otherwise).
    fn assert_writable_range(&self, offset: u64, len: usize) {
        assert!(self.writable, "write on a read-only mapping");
        let end = offset.checked_add(len as u64).expect("offset overflow");
        assert!(
            end <= self.len(),
            "write past the end of {}",
            self.path.display()
        );
    }

    /// Copies `data` to `offset`. Panics when out of bounds (a writer bug).
    pub(crate) fn write(&mut self, offset: u64, data: &[u8]) {
        self.assert_writable_range(offset, data.len());
        // SAFETY: the destination is inside the mapping (checked above) and `data` is a
        // separate Rust slice, so the ranges do not overlap. Only this process writes the file
        // (invariant 1, enforced by the directory lock) and it only writes bytes that are not
        // published yet (invariant 3) or belong to a recycled file every registered reader is
        // done with, whose index word changed first (invariant 4), so no reader trusts a view
        // of them.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.raw.as_mut_ptr().add(offset as usize),
                data.len(),
            )
        };
    }

    /// Copies `data` to `offset` like [`Mapping::write`] and returns the CRC32C of `data`
    /// appended to `crc`, in one pass over `data` where the CPU allows (see `crc`).
    pub(crate) fn write_crc(&mut self, offset: u64, data: &[u8], crc: u32) -> u32 {
        self.assert_writable_range(offset, data.len());
        // SAFETY: as in `write`: the destination is inside the mapping (checked above), does not
        // overlap `data` (a separate Rust slice), and holds no published bytes (invariants 1, 3
        // and 4).
        unsafe {
            let dst = self.raw.as_mut_ptr().add(offset as usize);
            if data.len() >= STREAM_MIN {
                crate::crc::crc32c_append_copy_nt(crc, data, dst)
            } else {
                crate::crc::crc32c_append_copy(crc, data, dst)
            }
        }
    }

    /// `msync(MS_SYNC)` of a byte range.
    pub(crate) fn flush(&self, offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.raw
            .flush_range(offset as usize, len as usize)
            .at(&self.path)
    }

    /// Blocks while the `u32` at `offset` equals `expected`, at most `timeout`, or until woken
    /// by [`Mapping::futex_wake`] from any process mapping the same file. Spurious wake-ups
    /// happen; callers re-check their condition.
    pub(crate) fn futex_wait(&self, offset: u64, expected: u32, timeout: Duration) {
        let Some(word) = self.atomic_u32(offset) else {
            return;
        };
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `word` points to a live, aligned u32 in a MAP_SHARED mapping (the non-private
        // futex op is what makes the wait visible across processes); `ts` outlives the call;
        // the unused arguments are ignored by FUTEX_WAIT. Errors (EAGAIN, ETIMEDOUT, EINTR)
        // only mean "return and re-check".
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT,
                expected,
                &ts as *const libc::timespec,
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }

    /// Wakes every process waiting in [`Mapping::futex_wait`] on `offset`.
    pub(crate) fn futex_wake(&self, offset: u64) {
        let Some(word) = self.atomic_u32(offset) else {
            return;
        };
        // SAFETY: `word` is a live, aligned u32 of the shared mapping; FUTEX_WAKE only uses the
        // address as a key and never dereferences the null pointers.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }
}
