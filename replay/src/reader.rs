//! The reader (the learner): follows every actor directory under the replay root.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cursor::{write_consumed, Cursor, Cursors};
use crate::doorbell::Doorbell;
use crate::error::{ReplayError, Result};
use crate::header::{RecordMeta, PUBLISHED_END_OFFSET, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN};
use crate::mmap::Mapping;
use crate::segment::{
    check_header, list_segments, read_slot, recycled, resync, resync_range, segment_file_name,
    Corruption, Slot,
};

/// Reader settings.
#[derive(Debug, Clone)]
pub struct ReaderOptions {
    /// Name of this consumer's consumed-position file (`consumed/<name>.json` per actor).
    pub consumer: String,
    /// Most records one `poll` returns.
    pub max_batch: usize,
    /// How often `poll` looks for new actor directories.
    pub rescan_interval: Duration,
}

impl Default for ReaderOptions {
    fn default() -> Self {
        ReaderOptions {
            consumer: "learner".into(),
            max_batch: 256,
            rescan_interval: Duration::from_millis(200),
        }
    }
}

/// A validated record's payload, borrowed zero-copy from the mapped segment.
///
/// The bytes stay as validated until every consumer registered with the writer (through its
/// consumed-position file, [`ReplayReader::publish_consumed`]) has published a position past
/// this record: then the writer may recycle the segment's file for a later segment and
/// overwrite them (the mapping itself stays valid; nothing is truncated). A registered consumer
/// therefore must not use a payload after publishing a position past it; the reader never hands
/// one out from a recycled file. A reader that publishes no position has no such guarantee
/// once the registered consumers are past the record: copy the payload, or check
/// [`Payload::is_intact`] after using it.
#[derive(Clone)]
pub struct Payload {
    map: Arc<Mapping>,
    /// The segment the record was validated in.
    segment: u64,
    offset: u64,
    len: u64,
}

impl Payload {
    /// Whether the segment file still holds this record, i.e. has not been recycled since it
    /// was validated. `true` after reading the bytes means they were the record's.
    pub fn is_intact(&self) -> bool {
        !recycled(&self.map, self.segment)
    }
}

impl std::ops::Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.map
            .bytes(self.offset, self.len)
            .expect("payload bounds were validated")
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Payload({} bytes)", self.len)
    }
}

/// One record handed to the learner.
#[derive(Debug, Clone)]
pub struct Record {
    /// Actor directory name.
    pub actor: Arc<str>,
    /// Seq within that actor's log.
    pub seq: u64,
    /// Header metadata.
    pub meta: RecordMeta,
    /// The CRC-checked payload.
    pub payload: Payload,
    /// The actor's cursor just after this record.
    pub cursor_after: Cursor,
}

/// One actor directory being followed.
struct Stream {
    name: Arc<str>,
    dir: PathBuf,
    /// `None` until the first segment is found (then: its start).
    cursor: Option<Cursor>,
    map: Option<Arc<Mapping>>,
    /// The file `map` was opened as (a mapping from `maps` may carry an earlier name).
    map_path: PathBuf,
    /// Mappings of this actor's recent segment files, reused when a file comes back recycled.
    maps: MapCache,
    /// Segment whose damaged header was already reported.
    bad_segment: Option<u64>,
    /// A search past a bad slot of the active segment that found nothing yet: (segment, bad
    /// offset, searched up to). The next poll resumes there instead of searching again.
    searched: Option<(u64, u64, u64)>,
}

/// Segment files a reader keeps mapped per actor (the default `max_segments`).
const MAP_CACHE: usize = 16;

/// The reader's mappings of an actor's recent segment files, by inode. A writer recycles its
/// consumed segment files (see the crate docs): the file that comes back as a later segment is
/// the same inode, with the same page-cache pages, so the mapping the reader already has shows
/// exactly what a new one would. Reusing it saves mapping the file again, faulting its pages
/// in and, when the segment is done, unmapping it (up to 16 K page-table entries per 64 MiB):
/// the serial bench's 256 KiB figure without publishing went from 14.3-15.5 to 17.0-18.4 GB/s.
/// Files are never truncated, so a kept mapping stays valid; one of a file that was deleted is
/// dropped at the next look-up, so that it does not keep the disk space. Each kept file holds
/// a descriptor (at most [`MAP_CACHE`] per actor).
#[derive(Default)]
struct MapCache {
    /// Most recently used last.
    entries: std::collections::VecDeque<CachedMap>,
}

struct CachedMap {
    /// Kept open to see whether the file still has a name (`nlink`).
    file: std::fs::File,
    dev: u64,
    ino: u64,
    map: Arc<Mapping>,
}

impl MapCache {
    /// A read-only mapping of the file at `path`: the kept one when it is the same file (and
    /// size), else a new one.
    fn open(&mut self, path: &Path) -> Result<Arc<Mapping>> {
        use std::os::unix::fs::MetadataExt;
        let file = std::fs::File::open(path).map_err(|source| ReplayError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let meta = file.metadata().map_err(|source| ReplayError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        self.entries
            .retain(|e| e.file.metadata().is_ok_and(|m| m.nlink() > 0));
        if let Some(i) = self
            .entries
            .iter()
            .position(|e| e.dev == meta.dev() && e.ino == meta.ino())
        {
            let entry = self.entries.remove(i).expect("found");
            if entry.map.len() == meta.len() {
                let map = entry.map.clone();
                self.entries.push_back(entry);
                return Ok(map);
            }
        }
        let map = Arc::new(Mapping::open_read_file(&file, path)?);
        if map.len() > 0 {
            if self.entries.len() == MAP_CACHE {
                self.entries.pop_front();
            }
            self.entries.push_back(CachedMap {
                file,
                dev: meta.dev(),
                ino: meta.ino(),
                map: map.clone(),
            });
        }
        Ok(map)
    }
}

impl Stream {
    fn report(&self, corruptions: &mut Vec<Corruption>, path: &Path, offset: u64, reason: &str) {
        corruptions.push(Corruption {
            actor: self.name.to_string(),
            path: path.to_path_buf(),
            offset,
            reason: reason.to_string(),
        });
    }

    /// Maps the cursor's segment. `Ok(false)`: nothing to read yet. A segment whose header
    /// is damaged is reported once and skipped when a later one exists.
    fn open_current(&mut self, corruptions: &mut Vec<Corruption>) -> Result<bool> {
        let segments = match self.cursor {
            Some(c) if self.dir.join(segment_file_name(c.segment)).exists() => {
                vec![(c.segment, self.dir.join(segment_file_name(c.segment)))]
            }
            _ => list_segments(&self.dir)?,
        };
        let Some((index, path)) = (match self.cursor {
            None => segments.first().cloned(),
            Some(c) => segments.into_iter().find(|(i, _)| *i >= c.segment),
        }) else {
            return Ok(false);
        };
        let map = match self.maps.open(&path) {
            Ok(m) => m,
            // Deleted by retention between listing and opening: look again next time.
            Err(ReplayError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(false)
            }
            Err(e) => return Err(e),
        };
        let header = match check_header(&map, &path, index) {
            Ok(h) => h,
            // Recycled between opening and checking (the rename comes first): it was consumed;
            // look again next time.
            Err(_) if !path.exists() => return Ok(false),
            Err(e) => {
                if self.bad_segment != Some(index) {
                    self.bad_segment = Some(index);
                    self.report(corruptions, &path, 0, &e.to_string());
                }
                if !self.next_exists(index) {
                    return Ok(false);
                }
                let next_seq = self.cursor.map_or(0, |c| c.next_seq);
                self.cursor = Some(Cursor {
                    segment: index + 1,
                    offset: SEGMENT_HEADER_LEN as u64,
                    next_seq,
                });
                return self.open_current(corruptions);
            }
        };
        match &mut self.cursor {
            None => {
                self.cursor = Some(Cursor {
                    segment: index,
                    offset: SEGMENT_HEADER_LEN as u64,
                    next_seq: header.first_seq,
                })
            }
            Some(c) if c.segment != index => {
                // The cursor's segment is gone: fine only if nothing of it was left to read.
                if header.first_seq > c.next_seq {
                    return Err(ReplayError::CursorLost {
                        actor: self.name.to_string(),
                        segment: c.segment,
                        next_seq: c.next_seq,
                        oldest_seq: header.first_seq,
                    });
                }
                *c = Cursor {
                    segment: index,
                    offset: SEGMENT_HEADER_LEN as u64,
                    next_seq: c.next_seq,
                };
            }
            // Records of this segment have seqs from `first_seq` on: a lower bound keeps stale
            // bytes of a recycled file from ever being taken for records.
            Some(c) => c.next_seq = c.next_seq.max(header.first_seq),
        }
        self.map = Some(map);
        self.map_path = path;
        Ok(true)
    }

    fn next_exists(&self, index: u64) -> bool {
        self.dir.join(segment_file_name(index + 1)).exists()
    }

    /// For a bad slot at the cursor in the active segment: the first valid record after it
    /// among those the writer has published (below `published_end`). Remembers how far it
    /// looked, so that polls waiting for the writer do not search the same bytes again.
    fn search_published(&mut self, map: &Mapping, cur: Cursor, end: u64) -> Option<u64> {
        let from = match self.searched {
            Some((segment, bad, upto)) if segment == cur.segment && bad == cur.offset => upto,
            _ => cur.offset + 8,
        };
        let (found, upto) = resync_range(map, from, end, cur.next_seq);
        self.searched = match found {
            Some(_) => None,
            None => Some((cur.segment, cur.offset, upto)),
        };
        found
    }

    /// Whether the mapped segment was recycled under us (only a reader that publishes no
    /// consumed position, or one still at the end of a segment it has published past, sees
    /// this). Drops the mapping: the next look finds the cursor's segment gone, which is fine
    /// when nothing of it was left to read and [`ReplayError::CursorLost`] otherwise.
    fn gone(&mut self, map: &Mapping, segment: u64) -> bool {
        if recycled(map, segment) {
            self.map = None;
            self.searched = None;
            return true;
        }
        false
    }

    /// Moves to the next segment if it exists.
    fn advance(&mut self) -> Result<bool> {
        let c = self.cursor.expect("advance with a cursor");
        if !self.next_exists(c.segment) {
            return Ok(false);
        }
        self.cursor = Some(Cursor {
            segment: c.segment + 1,
            offset: SEGMENT_HEADER_LEN as u64,
            next_seq: c.next_seq,
        });
        self.map = None;
        Ok(true)
    }

    /// The next valid record, skipping (and reporting once) corrupt ones.
    fn next(&mut self, corruptions: &mut Vec<Corruption>) -> Result<Option<Record>> {
        loop {
            if self.map.is_none() && !self.open_current(corruptions)? {
                return Ok(None);
            }
            let map = self.map.clone().expect("mapped");
            let cur = self.cursor.expect("cursor");
            // Nothing at or past the writer's high-water mark is read while the writer may be
            // writing there: in a recycled file those bytes are the previous life's, being
            // overwritten. (0: a segment older than the mark, whose unwritten space is zero.)
            let end = map.load_acquire_u64(PUBLISHED_END_OFFSET as u64);
            if end != 0 && cur.offset >= end && !self.next_exists(cur.segment) {
                if self.gone(&map, cur.segment) {
                    continue;
                }
                return Ok(None);
            }
            let slot = read_slot(&map, cur.offset);
            if self.gone(&map, cur.segment) {
                continue;
            }
            match slot {
                Slot::Record(h) if h.seq >= cur.next_seq => {
                    let after = Cursor {
                        segment: cur.segment,
                        offset: cur.offset + h.padded_len(),
                        next_seq: h.seq + 1,
                    };
                    self.cursor = Some(after);
                    let payload = Payload {
                        map,
                        segment: cur.segment,
                        offset: cur.offset + RECORD_HEADER_LEN as u64,
                        len: h.len as u64 - RECORD_HEADER_LEN as u64,
                    };
                    return Ok(Some(Record {
                        actor: self.name.clone(),
                        seq: h.seq,
                        meta: h.meta,
                        payload,
                        cursor_after: after,
                    }));
                }
                Slot::Seal(h) if h.seq >= cur.next_seq => {
                    if !self.advance()? {
                        return Ok(None);
                    }
                    if let Some(c) = &mut self.cursor {
                        c.next_seq = c.next_seq.max(h.seq);
                    }
                }
                Slot::End => {
                    if !self.advance()? {
                        return Ok(None);
                    }
                }
                Slot::Empty => {
                    // Normal end of data, unless the writer has already moved on...
                    if !self.next_exists(cur.segment) {
                        // ...or has published beyond this offset: then the zero length is
                        // damage, and the records after it are not held back by it. (Read
                        // the high-water mark first, then look at the slot again: a record
                        // published in between is seen then.)
                        let end = map.load_acquire_u64(PUBLISHED_END_OFFSET as u64);
                        if end <= cur.offset {
                            return Ok(None);
                        }
                        if read_slot(&map, cur.offset) != Slot::Empty {
                            continue;
                        }
                        match self.search_published(&map, cur, end) {
                            Some(_) if self.gone(&map, cur.segment) => continue,
                            Some(at) => {
                                self.report(
                                    corruptions,
                                    &self.map_path,
                                    cur.offset,
                                    "zeroed record length before published records",
                                );
                                self.cursor = Some(Cursor { offset: at, ..cur });
                                continue;
                            }
                            // The damaged record is the last one published so far: the next
                            // one will be found past it.
                            None => return Ok(None),
                        }
                    }
                    // The end marker may have landed after the first look.
                    if read_slot(&map, cur.offset) != Slot::Empty {
                        continue;
                    }
                    let found = resync(&map, cur.offset, cur.next_seq);
                    if self.gone(&map, cur.segment) {
                        continue;
                    }
                    match found {
                        Some(at) => {
                            self.report(
                                corruptions,
                                &self.map_path,
                                cur.offset,
                                "zeroed record length before valid records",
                            );
                            self.cursor = Some(Cursor { offset: at, ..cur });
                        }
                        None => {
                            self.report(
                                corruptions,
                                &self.map_path,
                                cur.offset,
                                "segment ends without an end marker",
                            );
                            self.advance()?;
                        }
                    }
                }
                Slot::Record(_) | Slot::Seal(_) | Slot::Corrupt(_) => {
                    let reason = match slot {
                        Slot::Corrupt(r) => r,
                        _ => "sequence number goes backwards",
                    };
                    let active = !self.next_exists(cur.segment);
                    let end = map.load_acquire_u64(PUBLISHED_END_OFFSET as u64);
                    let found = if active && end > cur.offset {
                        self.search_published(&map, cur, end)
                    } else {
                        resync(&map, cur.offset, cur.next_seq)
                    };
                    if self.gone(&map, cur.segment) {
                        continue;
                    }
                    match found {
                        Some(at) => {
                            self.report(corruptions, &self.map_path, cur.offset, reason);
                            self.cursor = Some(Cursor { offset: at, ..cur });
                        }
                        // Possibly a live writer's next records are still to come; decide later.
                        None if active => return Ok(None),
                        None => {
                            self.report(corruptions, &self.map_path, cur.offset, reason);
                            self.advance()?;
                        }
                    }
                }
            }
        }
    }
}

/// Follows all actor directories under a replay root.
pub struct ReplayReader {
    root: PathBuf,
    opts: ReaderOptions,
    streams: Vec<Stream>,
    /// Saved cursors of actors whose directory has not been seen yet.
    saved: BTreeMap<String, Cursor>,
    next_stream: usize,
    last_rescan: Option<Instant>,
    corruptions: Vec<Corruption>,
    doorbell: Option<Doorbell>,
}

impl ReplayReader {
    /// Opens a reader on `root` (e.g. `RUN_DIR/replay`), resuming from `cursors` when given.
    /// Actors without a saved cursor are read from their oldest segment.
    pub fn open(
        root: impl AsRef<Path>,
        opts: ReaderOptions,
        cursors: Option<Cursors>,
    ) -> Result<ReplayReader> {
        if opts.max_batch == 0 {
            return Err(ReplayError::InvalidOptions(
                "max_batch must be at least 1".into(),
            ));
        }
        let mut reader = ReplayReader {
            root: root.as_ref().to_path_buf(),
            opts,
            streams: Vec::new(),
            saved: cursors.map(|c| c.actors).unwrap_or_default(),
            next_stream: 0,
            last_rescan: None,
            corruptions: Vec::new(),
            doorbell: None,
        };
        reader.discover()?;
        Ok(reader)
    }

    /// Looks for new actor directories (and the doorbell).
    fn discover(&mut self) -> Result<()> {
        self.last_rescan = Some(Instant::now());
        if self.doorbell.is_none() {
            self.doorbell = Doorbell::open(&self.root, false).ok().flatten();
        }
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(ReplayError::Io {
                    path: self.root.clone(),
                    source: e,
                })
            }
        };
        let mut found = Vec::new();
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if name.starts_with('.')
                || !entry.path().is_dir()
                || self.streams.iter().any(|s| *s.name == *name)
            {
                continue;
            }
            found.push(name);
        }
        found.sort();
        for name in found {
            let cursor = self.saved.remove(&name);
            self.streams.push(Stream {
                dir: self.root.join(&name),
                name: name.into(),
                cursor,
                map: None,
                map_path: PathBuf::new(),
                maps: MapCache::default(),
                bad_segment: None,
                searched: None,
            });
        }
        Ok(())
    }

    /// Returns the next available records (at most `max_batch`), waiting up to `timeout` for
    /// at least one. Sleeps on the doorbell (or with backoff) instead of spinning. An empty
    /// result means the timeout passed.
    pub fn poll(&mut self, timeout: Duration) -> Result<Vec<Record>> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(20);
        loop {
            let seen = self.doorbell.as_ref().map(Doorbell::counter);
            if self
                .last_rescan
                .is_none_or(|t| t.elapsed() >= self.opts.rescan_interval)
            {
                self.discover()?;
            }
            let out = self.collect()?;
            let now = Instant::now();
            if !out.is_empty() || now >= deadline {
                return Ok(out);
            }
            let slice = (deadline - now).min(self.opts.rescan_interval);
            match (&self.doorbell, seen) {
                (Some(bell), Some(seen)) => bell.wait(seen, slice),
                _ => {
                    std::thread::sleep(pause.min(slice));
                    pause = (pause * 2).min(Duration::from_millis(5));
                }
            }
        }
    }

    /// One record per actor in turn until the batch is full or nobody has more.
    fn collect(&mut self) -> Result<Vec<Record>> {
        let mut out = Vec::new();
        let n = self.streams.len();
        if n == 0 {
            return Ok(out);
        }
        let mut idle = 0;
        while out.len() < self.opts.max_batch && idle < n {
            let i = self.next_stream % n;
            self.next_stream = (i + 1) % n;
            match self.streams[i].next(&mut self.corruptions)? {
                Some(r) => {
                    out.push(r);
                    idle = 0;
                }
                None => idle += 1,
            }
        }
        Ok(out)
    }

    /// Positions just after the last record returned, per actor (store these in snapshots).
    pub fn cursors(&self) -> Cursors {
        let mut actors = self.saved.clone();
        for s in &self.streams {
            if let Some(c) = s.cursor {
                actors.insert(s.name.to_string(), c);
            }
        }
        Cursors { actors }
    }

    /// Publishes the current cursors as this consumer's consumed position, which lets writers
    /// delete older segments and release backpressure. Call it once the records are safe
    /// (e.g. after the snapshot holding these cursors is written).
    pub fn publish_consumed(&self) -> Result<()> {
        for s in &self.streams {
            if let Some(c) = &s.cursor {
                write_consumed(&s.dir, &self.opts.consumer, c)?;
            }
        }
        Ok(())
    }

    /// Every corrupt record skipped so far (each reported once, with file and offset).
    pub fn corruptions(&self) -> &[Corruption] {
        &self.corruptions
    }

    /// The replay root.
    pub fn root(&self) -> &Path {
        &self.root
    }
}
