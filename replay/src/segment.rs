//! Segment files: naming, creation (preallocate, header, fsync, rename) and record validation.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{IoContext, ReplayError, Result};
use crate::header::{
    align8, RecordHeader, SegmentHeader, INDEX_OFFSET, LEN_OFFSET, PUBLISHED_END_OFFSET,
    RECORD_HEADER_LEN, RECORD_MAGIC, SEAL_MAGIC, SEGMENT_HEADER_LEN,
};
use crate::mmap::Mapping;

/// File name of segment `index`.
pub fn segment_file_name(index: u64) -> String {
    format!("seg-{index:010}.log")
}

/// Parses a segment file name back to its index.
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("seg-")?.strip_suffix(".log")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The segments of an actor directory, sorted by index.
pub fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).at(dir),
    };
    for entry in entries {
        let entry = entry.at(dir)?;
        if let Some(index) = entry.file_name().to_str().and_then(parse_segment_file_name) {
            out.push((index, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// fsyncs a directory so a rename or unlink in it is durable.
pub(crate) fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir).at(dir)?.sync_all().at(dir)
}

/// A segment file under its temporary name (`seg-N.log.tmp`, invisible to readers):
/// preallocated, fsynced and mapped, without a header for `index` yet (a fresh file's header
/// is zero; a recycled file still holds its previous header, except the index word, see
/// [`recycle_segment`]). [`finish_segment`] turns it into segment `index`.
#[derive(Debug)]
pub(crate) struct Spare {
    /// Its future index.
    pub index: u64,
    /// The writable mapping of the whole file.
    pub map: Mapping,
    /// The temporary path.
    pub tmp: PathBuf,
}

impl Spare {
    /// Removes an unused spare.
    pub(crate) fn discard(self) {
        drop(self.map);
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// Creates `seg-<index>.log.tmp` of `size` bytes in `dir`, fully preallocated (so a full disk
/// fails here with [`ReplayError::Preallocate`], never later as SIGBUS on a mapped page),
/// fsynced and mapped. With `populate`, every page is also faulted in writable ahead of use
/// (the helper thread does this; see `helper`).
pub(crate) fn prepare_segment(dir: &Path, index: u64, size: u64, populate: bool) -> Result<Spare> {
    let path = dir.join(segment_file_name(index));
    let tmp = dir.join(format!("{}.tmp", segment_file_name(index)));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .at(&tmp)?;
    let fail = |e: ReplayError| {
        let _ = std::fs::remove_file(&tmp);
        Err(e)
    };
    // SAFETY: plain syscall on a file descriptor we own for the duration of the call.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size as libc::off_t) };
    if rc != 0 {
        return fail(ReplayError::Preallocate {
            path,
            size,
            source: std::io::Error::from_raw_os_error(rc),
        });
    }
    // The header page gets its own small page-cache folio (a 4 KiB write allocates one), so
    // that msyncing the header when the segment starts writes 4 KiB, not a 2 MiB huge folio.
    let zeros = [0u8; 4096];
    let head = zeros.len().min(size as usize);
    if let Err(source) = file
        .write_all_at(&zeros[..head], 0)
        .and_then(|_| file.sync_all())
    {
        return fail(ReplayError::Io {
            path: tmp.clone(),
            source,
        });
    }
    let map = match Mapping::open_write(&file, &tmp) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    if populate {
        map.populate_write();
    }
    Ok(Spare { index, map, tmp })
}

/// Reuses the file of consumed segment `old_index` (mapped writable by this writer as `map`)
/// as the spare for segment `index`: renames `seg-<old_index>.log` to `seg-<index>.log.tmp`
/// (atomic: readers that look the segment up by name no longer find it), then stores `index`
/// in the header's index word, which tells every process still mapping the file that it is
/// not segment `old_index` any more, before any byte of the new life is written. The body is
/// left as it is: the page-cache pages stay resident and mapped, and stale records are never
/// accepted (see `header`, "Recycled files"). The file keeps its size: nothing is truncated
/// under a mapping. With `populate`, pages written back since are faulted in writable again.
pub(crate) fn recycle_segment(
    dir: &Path,
    old_index: u64,
    mut map: Mapping,
    index: u64,
    populate: bool,
) -> Result<Spare> {
    let old = dir.join(segment_file_name(old_index));
    let tmp = dir.join(format!("{}.tmp", segment_file_name(index)));
    std::fs::rename(&old, &tmp).at(&old)?;
    // Durable before the file changes: after a power loss the old name never comes back with
    // bytes of the new life in it.
    fsync_dir(dir)?;
    map.store_release_u64(INDEX_OFFSET as u64, index);
    // Later writes (the rest of the header, then the body, by the writer thread after the
    // spare is handed over) must not become visible before the new index does.
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    // A placeholder header (valid, `first_seq` = `u64::MAX`): should it reach the disk under
    // the final name without the real header (power loss), recovery knows it for what it is.
    let placeholder = SegmentHeader {
        index,
        first_seq: u64::MAX,
        size: map.len(),
    }
    .to_bytes();
    map.write(0, &placeholder[..INDEX_OFFSET]);
    map.write(
        INDEX_OFFSET as u64 + 8,
        &placeholder[INDEX_OFFSET + 8..PUBLISHED_END_OFFSET],
    );
    map.set_path(tmp.clone());
    if populate {
        map.populate_write();
    }
    Ok(Spare { index, map, tmp })
}

/// Whether `map`, opened as segment `index`, has been recycled for a later segment since: its
/// header's index word changed. Call it after reading bytes of the segment and before trusting
/// them: when it returns `false`, every byte read before the call was the segment's own.
pub(crate) fn recycled(map: &Mapping, index: u64) -> bool {
    std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
    map.len() >= SEGMENT_HEADER_LEN as u64 && map.load_acquire_u64(INDEX_OFFSET as u64) != index
}

/// Whether a segment file's header says that its creation never became durable: a recycled
/// file's header other than the final one (its previous life's, with a smaller index, or the
/// placeholder of [`recycle_segment`]), or, for the newest segment (`last`) only, all zeros (a
/// new file's). Only a power loss leaves such a file under a segment name (the final header is
/// written before the rename, and [`crate::ReplayWriter::sync`] makes it durable before it
/// returns), so it holds no record that was synced. (A zeroed header of an older segment is
/// damage, not this: the writer refuses it, as any bad header.)
pub(crate) fn never_created(head: &[u8], index: u64, last: bool) -> bool {
    if last
        && head.len() >= SEGMENT_HEADER_LEN
        && head[..SEGMENT_HEADER_LEN].iter().all(|&b| b == 0)
    {
        return true;
    }
    match SegmentHeader::from_bytes(head) {
        Ok(h) => h.index < index || (h.index == index && h.first_seq == u64::MAX),
        Err(_) => false,
    }
}

/// Turns a spare into segment `spare.index` starting at `first_seq`: writes the header (with
/// `published_end` at the end of the header: nothing published yet, whatever the body holds),
/// then renames the file into place. With `durable`, the header is msynced before the rename
/// and the directory fsynced after it; without, the caller makes both durable later (the
/// writer does in `sync`, see [`never_created`] for what a power loss in between leaves).
/// Either way a process killed at any point leaves either the temporary name or the segment
/// name with its complete header, as the header is written before the rename.
pub(crate) fn finish_segment(
    dir: &Path,
    spare: Spare,
    first_seq: u64,
    durable: bool,
) -> Result<Mapping> {
    let Spare {
        index,
        mut map,
        tmp,
    } = spare;
    let header = SegmentHeader {
        index,
        first_seq,
        size: map.len(),
    };
    let path = dir.join(segment_file_name(index));
    let bytes = header.to_bytes();
    // The index word first (a recycled spare already holds it), the rest of the header after.
    map.store_release_u64(INDEX_OFFSET as u64, index);
    map.write(0, &bytes[..INDEX_OFFSET]);
    map.write(
        INDEX_OFFSET as u64 + 8,
        &bytes[INDEX_OFFSET + 8..PUBLISHED_END_OFFSET],
    );
    map.store_release_u64(PUBLISHED_END_OFFSET as u64, SEGMENT_HEADER_LEN as u64);
    map.write(
        PUBLISHED_END_OFFSET as u64 + 8,
        &bytes[PUBLISHED_END_OFFSET + 8..],
    );
    if durable {
        if let Err(e) = map.flush(0, SEGMENT_HEADER_LEN as u64) {
            drop(map);
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    }
    std::fs::rename(&tmp, &path).at(&path)?;
    if durable {
        fsync_dir(dir)?;
    }
    map.set_path(path);
    Ok(map)
}

/// Creates segment `index` of `size` bytes in `dir` on the spot: [`prepare_segment`] without
/// prefaulting, then [`finish_segment`].
pub(crate) fn create_segment(dir: &Path, index: u64, first_seq: u64, size: u64) -> Result<Mapping> {
    let spare = prepare_segment(dir, index, size, false)?;
    finish_segment(dir, spare, first_seq, true)
}

/// Writes `bytes` to `path` through `path.tmp` + fsync + rename + directory fsync, so readers
/// see either the old or the new content, never a mix.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = File::create(&tmp).at(&tmp)?;
        f.write_all(bytes).at(&tmp)?;
        f.sync_all().at(&tmp)?;
    }
    std::fs::rename(&tmp, path).at(path)?;
    if let Some(dir) = path.parent() {
        fsync_dir(dir)?;
    }
    Ok(())
}

/// What lies at one record offset of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// No room for another header: the segment is full.
    End,
    /// `len` is zero: nothing published here (yet).
    Empty,
    /// A valid record; its payload is `payload_len` bytes after the header.
    Record(RecordHeader),
    /// A valid end-of-segment marker; the writer continues in the next segment.
    Seal(RecordHeader),
    /// Something published (non-zero `len`) that does not validate.
    Corrupt(&'static str),
}

/// How far ahead of the record being checked `read_slot` prefetches.
const READ_AHEAD: u64 = 8 << 10;

/// Largest payload for which `read_slot` prefetches past the record: small records cross
/// 4 KiB pages every few records, where the hardware prefetcher stops (4 KiB records: the
/// reader's pass 14-15 -> 17-19 GB/s, serial bench). Larger ones are prefetched inside the
/// CRC kernel.
const CROSS_PREFETCH_MAX: u64 = 16 << 10;

/// Validates the slot at `offset` (8-byte aligned, at or after the segment header). Reads the
/// `len` word with acquire ordering first and nothing else when it is zero; otherwise checks
/// magic, bounds and CRC. Never reads out of bounds, whatever the bytes.
pub(crate) fn read_slot(map: &Mapping, offset: u64) -> Slot {
    let size = map.len();
    if !offset.is_multiple_of(8) || offset < SEGMENT_HEADER_LEN as u64 {
        return Slot::Corrupt("misaligned offset");
    }
    if offset.saturating_add(RECORD_HEADER_LEN as u64) > size {
        return Slot::End;
    }
    let len = map.load_acquire(offset + LEN_OFFSET as u64);
    if len == 0 {
        return Slot::Empty;
    }
    let Some(raw) = map.bytes(offset, RECORD_HEADER_LEN as u64) else {
        return Slot::End;
    };
    let mut buf = [0u8; RECORD_HEADER_LEN];
    buf.copy_from_slice(raw);
    // Use the len we loaded with acquire, not a second plain read.
    buf[4..8].copy_from_slice(&len.to_le_bytes());
    let Some(header) = RecordHeader::from_bytes(&buf) else {
        return Slot::Corrupt("reserved header bytes are not zero");
    };
    if header.magic != RECORD_MAGIC && header.magic != SEAL_MAGIC {
        return Slot::Corrupt("bad record magic");
    }
    if (header.len as usize) < RECORD_HEADER_LEN {
        return Slot::Corrupt("record length shorter than its header");
    }
    if header.seq == u64::MAX {
        // Never written (a writer stops before), and `seq + 1` must not overflow.
        return Slot::Corrupt("sequence number out of range");
    }
    if header.magic == SEAL_MAGIC && header.len as usize != RECORD_HEADER_LEN {
        return Slot::Corrupt("end marker with a payload");
    }
    if offset + header.padded_len() > size {
        return Slot::Corrupt("record length runs past the end of the segment");
    }
    let payload_len = header.len as u64 - RECORD_HEADER_LEN as u64;
    let Some(payload) = map.bytes(offset + RECORD_HEADER_LEN as u64, payload_len) else {
        return Slot::Corrupt("record length runs past the end of the segment");
    };
    if payload_len <= CROSS_PREFETCH_MAX {
        // Records are read in order: keep the lines `READ_AHEAD` bytes ahead of this record
        // (the next ones) coming, a window that slides by one record per record. The CRC
        // kernel prefetches inside large records itself.
        map.prefetch(offset + READ_AHEAD, header.padded_len());
    }
    if header.compute_crc(payload) != header.crc {
        return Slot::Corrupt("CRC mismatch");
    }
    if header.magic == SEAL_MAGIC {
        Slot::Seal(header)
    } else {
        Slot::Record(header)
    }
}

/// After a corrupt slot at `offset`, the next 8-byte aligned offset holding a valid record or
/// seal whose seq is at least `min_seq`, if any.
pub(crate) fn resync(map: &Mapping, offset: u64, min_seq: u64) -> Option<u64> {
    resync_range(map, offset + 8, map.len(), min_seq).0
}

/// The first 8-byte aligned offset in `from..end` (a record header must fit before `end`)
/// holding a valid record or seal whose seq is at least `min_seq`; otherwise `None` and the
/// offset where the search stopped (to resume it there once `end` grows).
pub(crate) fn resync_range(map: &Mapping, from: u64, end: u64, min_seq: u64) -> (Option<u64>, u64) {
    let end = end.min(map.len());
    let mut at = from;
    while at + RECORD_HEADER_LEN as u64 <= end {
        match read_slot(map, at) {
            Slot::Record(h) | Slot::Seal(h) if h.seq >= min_seq => return (Some(at), at),
            _ => at += 8,
        }
    }
    (None, at)
}

/// A corrupt or torn region found in a segment.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Corruption {
    /// Actor directory name.
    pub actor: String,
    /// The segment file.
    pub path: PathBuf,
    /// Byte offset of the bad record in the file.
    pub offset: u64,
    /// What is wrong.
    pub reason: String,
}

/// The result of scanning one segment from start to end.
#[derive(Debug, Clone, Default)]
pub(crate) struct SegmentScan {
    /// Decoded header, when valid.
    pub header: Option<SegmentHeader>,
    /// Valid records: (offset, header).
    pub records: Vec<(u64, RecordHeader)>,
    /// Offset just after the last valid record or seal (where a writer resumes).
    pub end: u64,
    /// A valid seal was found.
    pub sealed: bool,
    /// Corrupt regions (offset, reason), including a torn tail.
    pub corruptions: Vec<(u64, &'static str)>,
    /// The bad header's reason when `header` is `None`.
    pub header_error: Option<String>,
}

/// Scans a whole segment: every valid record, corrupt regions (skipped by resync), the end of
/// valid data. Used by the writer's crash recovery and by `inspect`.
///
/// Below the writer's high-water mark (`published_end`, when set) everything was published,
/// so anything invalid there is damage. At and past it lies space the writer had not published
/// (a record being written at a crash, or a recycled file's stale records, see `header`): only
/// records continuing the sequence exactly are taken there (a record whose `len` was stored
/// just before a crash, or records synced while the header's mark was not), and the first
/// anything else ends the data, without a report.
pub(crate) fn scan_segment(map: &Mapping) -> SegmentScan {
    let mut scan = SegmentScan {
        end: SEGMENT_HEADER_LEN as u64,
        ..Default::default()
    };
    let head = map.bytes(0, SEGMENT_HEADER_LEN as u64).unwrap_or(&[]);
    match SegmentHeader::from_bytes(head) {
        Ok(h) => scan.header = Some(h),
        Err(e) => {
            scan.header_error = Some(e);
            return scan;
        }
    }
    if let Some(h) = scan.header {
        if h.size != map.len() {
            scan.corruptions.push((
                map.len().min(h.size),
                "segment file size differs from its header (truncated?)",
            ));
        }
    }
    // 0: a segment from before the mark existed, no information (and never recycled).
    let published = match map.load_acquire_u64(PUBLISHED_END_OFFSET as u64) {
        0 => u64::MAX,
        end => end,
    };
    let mut offset = SEGMENT_HEADER_LEN as u64;
    let mut next_min_seq = scan.header.map_or(0, |h| h.first_seq);
    loop {
        let slot = read_slot(map, offset);
        if offset >= published {
            match slot {
                Slot::Record(h) if h.seq == next_min_seq => {
                    scan.records.push((offset, h));
                    next_min_seq = h.seq + 1;
                    offset += h.padded_len();
                    scan.end = offset;
                    continue;
                }
                Slot::Seal(h) if h.seq == next_min_seq => {
                    scan.sealed = true;
                    scan.end = offset + h.padded_len();
                }
                _ => {}
            }
            break;
        }
        match slot {
            Slot::End => break,
            // Like the reader, a record whose seq goes backwards is damage (or, in a recycled
            // file, a stale record): a writer resuming after it would otherwise reuse seqs the
            // reader has already passed.
            Slot::Record(h) if h.seq >= next_min_seq => {
                scan.records.push((offset, h));
                next_min_seq = h.seq + 1;
                offset += h.padded_len();
                scan.end = offset;
            }
            Slot::Seal(h) if h.seq >= next_min_seq => {
                scan.sealed = true;
                offset += h.padded_len();
                scan.end = offset;
                break;
            }
            slot @ (Slot::Empty | Slot::Corrupt(_) | Slot::Record(_) | Slot::Seal(_)) => {
                let reason = match slot {
                    Slot::Corrupt(r) => Some(r),
                    Slot::Record(_) | Slot::Seal(_) => Some("sequence number goes backwards"),
                    _ => None,
                };
                match resync(map, offset, next_min_seq) {
                    Some(next) => {
                        scan.corruptions.push((
                            offset,
                            reason.unwrap_or("zeroed record length before valid records"),
                        ));
                        offset = next;
                    }
                    None => {
                        if let Some(r) = reason {
                            scan.corruptions.push((offset, r));
                        }
                        break;
                    }
                }
            }
        }
    }
    scan
}

/// Checks the header of segment file `path` (mapped as `map`) against what its file name says.
pub(crate) fn check_header(map: &Mapping, path: &Path, index: u64) -> Result<SegmentHeader> {
    let head = map.bytes(0, SEGMENT_HEADER_LEN as u64).unwrap_or(&[]);
    let header = SegmentHeader::from_bytes(head).map_err(|reason| ReplayError::BadSegment {
        path: path.to_path_buf(),
        reason,
    })?;
    if header.index != index {
        return Err(ReplayError::BadSegment {
            path: path.to_path_buf(),
            reason: format!(
                "header says segment {}, file name says {index}",
                header.index
            ),
        });
    }
    Ok(header)
}

/// Largest payload that fits in a segment of `segment_size` bytes (leaving room for the seal).
pub(crate) fn max_payload(segment_size: u64) -> usize {
    let room = segment_size.saturating_sub((SEGMENT_HEADER_LEN + 2 * RECORD_HEADER_LEN) as u64);
    (room & !7) as usize
}

/// Padded size of a record with `payload` bytes.
pub(crate) fn record_size(payload: usize) -> u64 {
    align8((RECORD_HEADER_LEN + payload) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_round_trip() {
        assert_eq!(parse_segment_file_name(&segment_file_name(42)), Some(42));
        assert_eq!(parse_segment_file_name("seg-.log"), None);
        assert_eq!(parse_segment_file_name("seg-0001.log.tmp"), None);
        assert_eq!(parse_segment_file_name("seg-+1.log"), None);
    }

    #[test]
    fn max_payload_fits() {
        let size = 4096;
        let p = max_payload(size);
        assert!(SEGMENT_HEADER_LEN as u64 + record_size(p) + RECORD_HEADER_LEN as u64 <= size);
    }
}
