//! The writer: one per actor process and directory.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cursor::{read_min_consumed, read_min_progress};
use crate::doorbell::Doorbell;
use crate::error::{IoContext, ReplayError, Result};
use crate::header::{
    RecordHeader, RecordMeta, SegmentHeader, LEN_OFFSET, PUBLISHED_END_OFFSET, RECORD_HEADER_LEN,
    RECORD_MAGIC, SEAL_MAGIC, SEGMENT_HEADER_LEN,
};
use crate::helper::{make_spare, Helper};
use crate::mmap::Mapping;
use crate::segment::{
    create_segment, finish_segment, fsync_dir, list_segments, max_payload, never_created,
    prepare_segment, record_size, scan_segment, segment_file_name,
};

/// Name of the lock file that makes each actor directory single-writer.
pub const LOCK_FILE: &str = "writer.lock";

/// Writer settings.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// Size of each preallocated segment file in bytes (multiple of 8, at least 4096).
    pub segment_size: u64,
    /// Segments kept on disk per actor; rolling to a new one waits for the consumers when
    /// this many exist and none can be deleted.
    pub max_segments: usize,
    /// Records the writer may be ahead of the slowest consumer's published position before
    /// `append` waits; `None` bounds only by `max_segments`.
    pub max_inflight: Option<u64>,
    /// How long a backpressure wait may last before `append` fails.
    pub backpressure_timeout: Duration,
    /// Raised by the caller to abort a backpressure wait ([`ReplayError::Cancelled`]).
    pub cancel: Option<Arc<AtomicBool>>,
    /// Ring the shared doorbell in the parent directory after each append (low-latency wake-up
    /// of a sleeping reader).
    pub doorbell: bool,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            segment_size: 64 << 20,
            max_segments: 16,
            max_inflight: None,
            backpressure_timeout: Duration::from_secs(600),
            cancel: None,
            doorbell: true,
        }
    }
}

impl WriterOptions {
    /// Checks the options.
    pub fn validate(&self) -> Result<()> {
        if !self.segment_size.is_multiple_of(8) || self.segment_size < 4096 {
            return Err(ReplayError::InvalidOptions(format!(
                "segment_size must be a multiple of 8 and at least 4096, got {}",
                self.segment_size
            )));
        }
        if self.max_segments < 2 {
            return Err(ReplayError::InvalidOptions(
                "max_segments must be at least 2".into(),
            ));
        }
        if self.max_inflight == Some(0) {
            return Err(ReplayError::InvalidOptions(
                "max_inflight must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// Appends records to one actor directory. Holds the directory's lock for its lifetime.
#[derive(Debug)]
pub struct ReplayWriter {
    dir: PathBuf,
    opts: WriterOptions,
    _lock: File,
    map: Mapping,
    /// Index of the active segment.
    index: u64,
    /// Where the next record goes.
    offset: u64,
    /// Bytes of the active segment up to here are msynced.
    synced_to: u64,
    next_seq: u64,
    /// The active segment has its end marker (rolling to the next one failed, e.g. disk full).
    sealed: bool,
    /// The active segment's header and name are durable (see `sync`).
    header_synced: bool,
    /// Live segments, oldest first: (index, first seq).
    segments: VecDeque<(u64, u64)>,
    /// This writer's mappings of its earlier, still live (sealed) segments, oldest first. Kept
    /// until retention retires the segment, then moved to the pool for recycling, or unmapped
    /// on the helper thread, so that freeing the pages never happens in `append`.
    old: VecDeque<OldSegment>,
    /// Consumed segments waiting to be recycled, oldest first: (index, writable mapping). Their
    /// files keep their names until the helper (or `roll`) renames them.
    pool: VecDeque<(u64, Mapping)>,
    /// Prepares the next segment and releases old mappings in the background.
    helper: Helper,
    /// Last consumed position read from disk (retention follows it).
    consumed: u64,
    /// Last progress position read from disk (backpressure follows it).
    progress: u64,
    doorbell: Option<Doorbell>,
}

/// A sealed segment this writer still maps.
#[derive(Debug)]
struct OldSegment {
    index: u64,
    map: Mapping,
    /// Bytes up to here are msynced.
    synced_to: u64,
    /// End of the written bytes.
    end: u64,
    /// Its header and name are durable.
    header_synced: bool,
}

fn lock(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .at(&path)?;
    // SAFETY: flock on a descriptor we own; released when the file is closed (or the process dies).
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(ReplayError::Locked { path });
        }
        return Err(err).at(&path);
    }
    Ok(file)
}

impl ReplayWriter {
    /// Opens (or creates) the actor directory `dir`. After a crash it resumes right after the
    /// last CRC-valid record of the newest segment and zeroes whatever follows; nothing that
    /// was published is overwritten.
    pub fn open(dir: impl AsRef<Path>, opts: WriterOptions) -> Result<ReplayWriter> {
        opts.validate()?;
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).at(&dir)?;
        let lock = lock(&dir)?;
        for entry in std::fs::read_dir(&dir).at(&dir)? {
            let path = entry.at(&dir)?.path();
            if path.extension().and_then(|e| e.to_str()) == Some("tmp") {
                std::fs::remove_file(&path).at(&path)?;
            }
        }
        let doorbell = match (opts.doorbell, dir.parent()) {
            (true, Some(root)) if !root.as_os_str().is_empty() => Doorbell::open(root, true)?,
            _ => None,
        };
        let mut segments = VecDeque::new();
        // The first segment whose creation never became durable (only after a power loss):
        // it and every later one are removed; none holds a synced record (see `sync`).
        let mut lost: Option<u64> = None;
        let listed = list_segments(&dir)?;
        let newest = listed.last().map(|(i, _)| *i);
        for (index, path) in listed {
            if lost.is_some() {
                std::fs::remove_file(&path).at(&path)?;
                continue;
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .at(&path)?;
            let mut head = [0u8; SEGMENT_HEADER_LEN];
            file.read_exact_at(&mut head, 0).at(&path)?;
            if never_created(&head, index, Some(index) == newest) {
                lost = Some(index);
                std::fs::remove_file(&path).at(&path)?;
                continue;
            }
            let h = SegmentHeader::from_bytes(&head).map_err(|reason| ReplayError::BadSegment {
                path: path.clone(),
                reason,
            })?;
            if h.index > index {
                return Err(ReplayError::BadSegment {
                    path,
                    reason: format!("header says segment {}, file name says {index}", h.index),
                });
            }
            // The previous writer may have rolled to it without syncing since: make its header
            // durable now, so that a power loss cannot take it back once this writer syncs
            // records in a later segment.
            Mapping::open_write(&file, &path)?.flush(0, SEGMENT_HEADER_LEN as u64)?;
            segments.push_back((index, h.first_seq));
        }
        fsync_dir(&dir)?;
        let Some(&(last, _)) = segments.back() else {
            // A fresh directory; or, after a power loss, only segments that never became
            // durable were left: start over at the first of them, after every seq a consumer
            // has already taken (nothing before it can come back).
            let (index, first_seq) = match lost {
                Some(index) => (index, read_min_consumed(&dir)?.unwrap_or(0)),
                None => (0, 0),
            };
            let map = create_segment(&dir, index, first_seq, opts.segment_size)?;
            segments.push_back((index, first_seq));
            return Ok(ReplayWriter {
                dir,
                opts,
                _lock: lock,
                map,
                index,
                offset: SEGMENT_HEADER_LEN as u64,
                synced_to: SEGMENT_HEADER_LEN as u64,
                next_seq: first_seq,
                sealed: false,
                header_synced: true,
                segments,
                old: VecDeque::new(),
                pool: VecDeque::new(),
                helper: Helper::default(),
                consumed: 0,
                progress: 0,
                doorbell,
            });
        };
        let path = dir.join(segment_file_name(last));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .at(&path)?;
        let mut map = Mapping::open_write(&file, &path)?;
        let scan = scan_segment(&map);
        let header = scan.header.ok_or_else(|| ReplayError::BadSegment {
            path: path.clone(),
            reason: scan.header_error.clone().unwrap_or_default(),
        })?;
        let next_seq = scan
            .records
            .last()
            .map_or(header.first_seq, |(_, h)| h.seq + 1);
        // A segment whose file size differs from its header (truncated or extended), or with no
        // room left for an end marker, is not written to again: the writer moves on to a new
        // one, and readers see this one end without a marker.
        let damaged = header.size != map.len() || scan.end + RECORD_HEADER_LEN as u64 > map.len();
        zero_from(&mut map, scan.end);
        map.flush(scan.end, map.len() - scan.end)?;
        // The high-water mark of the crashed writer may be ahead of what survived.
        map.store_release_u64(PUBLISHED_END_OFFSET as u64, scan.end);
        let mut writer = ReplayWriter {
            dir,
            opts,
            _lock: lock,
            map,
            index: last,
            offset: scan.end,
            synced_to: scan.end,
            next_seq,
            sealed: scan.sealed || damaged,
            header_synced: true,
            segments,
            old: VecDeque::new(),
            pool: VecDeque::new(),
            helper: Helper::default(),
            consumed: 0,
            progress: 0,
            doorbell,
        };
        if writer.sealed {
            writer.roll()?;
        }
        Ok(writer)
    }

    /// The actor directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Seq the next append will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Appends one record and returns its seq once readers can see it. Waits (backpressure)
    /// when the consumers are too far behind. Durable only after [`ReplayWriter::sync`].
    pub fn append(&mut self, meta: RecordMeta, payload: &[u8]) -> Result<u64> {
        let max = max_payload(self.opts.segment_size);
        if payload.len() > max {
            return Err(ReplayError::RecordTooLarge {
                payload: payload.len(),
                segment_size: self.opts.segment_size,
                max_payload: max,
            });
        }
        if let Some(limit) = self.opts.max_inflight {
            self.wait_until(
                |w| w.next_seq < w.progress + limit,
                || format!("max_inflight = {limit}"),
            )?;
        }
        if self.next_seq == u64::MAX {
            // Only a damaged (or forged) log resumes this far; readers reject this seq.
            return Err(ReplayError::BadSegment {
                path: self.map.path().to_path_buf(),
                reason: "sequence numbers exhausted".into(),
            });
        }
        let size = record_size(payload.len());
        if self.sealed || self.offset + size + RECORD_HEADER_LEN as u64 > self.map.len() {
            if !self.sealed {
                self.seal();
            }
            self.roll()?;
        }
        if !self.helper.is_pending() && (!self.pool.is_empty() || self.offset >= self.map.len() / 4)
        {
            self.prepare_next();
        }
        let seq = self.next_seq;
        let header = RecordHeader {
            magic: RECORD_MAGIC,
            len: (RECORD_HEADER_LEN + payload.len()) as u32,
            crc: 0,
            seq,
            meta,
        };
        self.publish(header, payload);
        self.next_seq += 1;
        Ok(seq)
    }

    /// Writes the payload (computing the record's CRC on the way) and the header except `len`,
    /// then stores `len` with release ordering, then the segment's `published_end`.
    fn publish(&mut self, mut header: RecordHeader, payload: &[u8]) {
        let at = self.offset;
        header.crc =
            self.map
                .write_crc(at + RECORD_HEADER_LEN as u64, payload, header.header_crc());
        let bytes = header.to_bytes();
        self.map.write(at, &bytes[..LEN_OFFSET]);
        self.map.write(at + 8, &bytes[8..]);
        self.map.store_release(at + LEN_OFFSET as u64, header.len);
        self.offset += header.padded_len();
        self.map
            .store_release_u64(PUBLISHED_END_OFFSET as u64, self.offset);
        if let Some(bell) = &self.doorbell {
            bell.ring();
        }
    }

    /// Makes every appended record durable: msync of the written ranges, and of the headers
    /// of the segments started since the last sync, then an fsync of the directory for their
    /// names (rolling to a new segment defers both to here, off `append`).
    pub fn sync(&mut self) -> Result<()> {
        let mut rolled = false;
        for old in &mut self.old {
            old.map.flush(old.synced_to, old.end - old.synced_to)?;
            old.synced_to = old.end;
            if !old.header_synced {
                old.map.flush(0, SEGMENT_HEADER_LEN as u64)?;
                old.header_synced = true;
                rolled = true;
            }
        }
        self.map
            .flush(self.synced_to, self.offset - self.synced_to)?;
        self.synced_to = self.offset;
        if !self.header_synced {
            self.map.flush(0, SEGMENT_HEADER_LEN as u64)?;
            self.header_synced = true;
            rolled = true;
        }
        if rolled {
            fsync_dir(&self.dir)?;
        }
        Ok(())
    }

    fn seal(&mut self) {
        let header = RecordHeader::new(SEAL_MAGIC, self.next_seq, RecordMeta::default(), &[]);
        self.publish(header, &[]);
        self.sealed = true;
    }

    /// Asks the helper to prepare the segment after the active one: from a consumed segment's
    /// file when one waits in the pool, else as a new file when one more fits within
    /// `max_segments` (spares and pooled files count). Called as soon as a consumed file waits
    /// in the pool (recycling allocates nothing, and the helper gets a whole segment's time
    /// for the rename, the directory fsync and re-faulting: at 30 GB/s a 64 MiB segment lasts
    /// 2 ms, less than one fsync on a busy disk, and `roll` would wait for it), else once the
    /// active segment is a quarter full: a writer that stops early never pays for a new file,
    /// and its prefaulted (dirty, zero) pages wait less long for the records.
    fn prepare_next(&mut self) {
        let (dir, index, size) = (self.dir.clone(), self.index + 1, self.opts.segment_size);
        if let Some(reuse) = self.pool.pop_front() {
            if let Some(back) = self.helper.prepare(dir, index, size, Some(reuse)) {
                self.pool.push_front(back);
            }
        } else if self.segments.len() + self.pool.len() < self.opts.max_segments {
            self.helper.prepare(dir, index, size, None);
        }
    }

    /// Starts the next segment, deleting consumed ones and waiting while `max_segments` are live.
    fn roll(&mut self) -> Result<()> {
        let max = self.opts.max_segments;
        self.refresh_consumed()?;
        self.wait_until(
            |w| w.segments.len() < max,
            || format!("max_segments = {max}"),
        )?;
        let index = self.index + 1;
        let size = self.opts.segment_size;
        let spare = match self.helper.take(index) {
            Some(Ok(spare)) => spare,
            // Without a spare, or when preparing it failed (a full disk then may have room now
            // that retention ran), recycle a pooled file or create the segment here; its error
            // is the one reported.
            Some(Err(_)) | None => match self.pool.pop_front() {
                Some(reuse) => make_spare(&self.dir, index, size, Some(reuse), false)?,
                None => prepare_segment(&self.dir, index, size, false)?,
            },
        };
        // Header and name become durable in `sync` (no record in it is durable before then).
        let map = finish_segment(&self.dir, spare, self.next_seq, false)?;
        let old = std::mem::replace(&mut self.map, map);
        self.old.push_back(OldSegment {
            index: self.index,
            map: old,
            synced_to: self.synced_to,
            end: self.offset,
            header_synced: self.header_synced,
        });
        self.segments.push_back((index, self.next_seq));
        self.index = index;
        self.offset = SEGMENT_HEADER_LEN as u64;
        self.synced_to = self.offset;
        self.sealed = false;
        self.header_synced = false;
        Ok(())
    }

    /// Re-reads the consumed position and retires every segment whose records all precede it
    /// (never the active one): each goes to the pool to be recycled while the live segments,
    /// the pool and a spare being prepared stay within `max_segments`; beyond that (a writer
    /// reopened with a smaller `max_segments`) it is deleted.
    ///
    /// Keeping every retired file (rather than a couple) is what makes recycling work when the
    /// writer runs ahead of the consumed position, as it does whenever the consumer publishes
    /// rarely (the learner, after snapshots) or lags by a few segments (a reader in another
    /// process at memory speed): otherwise each burst of retirements deletes files that the
    /// next segments then create again, at about 10-60 ms of kernel work per 64 MiB
    /// (allocating, zeroing and later freeing page-cache pages) against about 2 ms of copying.
    /// The price: the directory stays at its high-water mark (at most `max_segments` files)
    /// after the consumer catches up.
    fn refresh_consumed(&mut self) -> Result<()> {
        self.consumed = read_min_consumed(&self.dir)?.unwrap_or(0);
        self.progress = read_min_progress(&self.dir)?
            .unwrap_or(0)
            .max(self.consumed);
        while self.segments.len() > 1 {
            let (index, _) = self.segments[0];
            let (_, next_first) = self.segments[1];
            if next_first > self.consumed || index == self.index {
                break;
            }
            let path = self.dir.join(segment_file_name(index));
            self.segments.pop_front();
            let mut mapped = None;
            while self.old.front().is_some_and(|o| o.index <= index) {
                let old = self.old.pop_front().expect("checked");
                if old.index == index {
                    mapped = Some(old.map);
                } else {
                    self.helper.release(old.map);
                }
            }
            let spare = usize::from(self.helper.is_pending());
            if self.segments.len() + self.pool.len() + spare < self.opts.max_segments {
                // A segment written before this writer started is mapped now (cheap: its
                // pages, if still cached, are reused all the same).
                let map = mapped.or_else(|| {
                    let file = OpenOptions::new().read(true).write(true).open(&path).ok()?;
                    Mapping::open_write(&file, &path).ok()
                });
                if let Some(map) = map {
                    self.pool.push_back((index, map));
                    continue;
                }
            } else if let Some(map) = mapped {
                // Our mapping still holds the pages; dropping it frees them, off the append
                // path.
                self.helper.release(map);
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).at(&path),
            }
        }
        Ok(())
    }

    /// Waits until `ready`, re-reading the consumed position with backoff, up to the timeout
    /// or until the cancel flag is raised.
    fn wait_until(
        &mut self,
        ready: impl Fn(&Self) -> bool,
        limit: impl Fn() -> String,
    ) -> Result<()> {
        if ready(self) {
            return Ok(());
        }
        let start = Instant::now();
        let mut pause = Duration::from_micros(50);
        loop {
            self.refresh_consumed()?;
            if ready(self) {
                return Ok(());
            }
            if self
                .opts
                .cancel
                .as_ref()
                .is_some_and(|c| c.load(Ordering::Relaxed))
            {
                return Err(ReplayError::Cancelled);
            }
            let waited = start.elapsed();
            if waited >= self.opts.backpressure_timeout {
                return Err(ReplayError::BackpressureTimeout {
                    waited,
                    next_seq: self.next_seq,
                    consumed: self.consumed,
                    limit: limit(),
                });
            }
            std::thread::sleep(pause.min(self.opts.backpressure_timeout - waited));
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }
}

/// Zeroes every non-zero 4 KiB block from `from` to the end (a torn tail after a crash), so a
/// resumed writer never leaves stale bytes that could look like a record.
fn zero_from(map: &mut Mapping, from: u64) {
    let zeros = [0u8; 4096];
    let mut at = from;
    while at < map.len() {
        let end = ((at / 4096) + 1) * 4096;
        let n = end.min(map.len()) - at;
        if map.bytes(at, n).is_some_and(|b| b.iter().any(|&x| x != 0)) {
            map.write(at, &zeros[..n as usize]);
        }
        at += n;
    }
}
