//! Offline look at a replay directory: what `cascade replay inspect` prints. Never writes, never
//! panics on a damaged log.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{IoContext, Result};
use crate::header::{RecordMeta, RECORD_HEADER_LEN};
use crate::mmap::Mapping;
use crate::segment::{
    list_segments, parse_segment_file_name, recycled, scan_segment, Corruption, SegmentScan,
};

/// Summary of one actor directory.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ActorReport {
    /// Actor directory name.
    pub actor: String,
    /// The directory.
    pub dir: PathBuf,
    /// Segment files on disk.
    pub segments: usize,
    /// Valid records.
    pub records: u64,
    /// Smallest and largest seq.
    pub seq_range: Option<(u64, u64)>,
    /// Smallest and largest policy version.
    pub policy_version_range: Option<(u64, u64)>,
    /// Sum of the segment file sizes.
    pub bytes_on_disk: u64,
    /// Every corrupt or torn record (file and offset).
    pub corruptions: Vec<Corruption>,
}

/// Summary of a replay root (or of a single actor directory).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// One entry per actor directory, sorted by name.
    pub actors: Vec<ActorReport>,
}

impl Report {
    /// Whether any corruption was found.
    pub fn has_corruption(&self) -> bool {
        self.actors.iter().any(|a| !a.corruptions.is_empty())
    }
}

/// A record read by [`dump`].
#[derive(Debug, Clone, Serialize)]
pub struct DumpedRecord {
    /// Actor directory name.
    pub actor: String,
    /// Seq.
    pub seq: u64,
    /// Header metadata.
    pub meta: RecordMeta,
    /// Segment file.
    pub path: PathBuf,
    /// Offset of the record in the file.
    pub offset: u64,
    /// The payload bytes.
    #[serde(skip)]
    pub payload: Vec<u8>,
}

fn has_segments(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries.flatten().any(|e| {
                e.file_name()
                    .to_str()
                    .and_then(parse_segment_file_name)
                    .is_some()
            })
        })
        .unwrap_or(false)
}

/// The actor directories of `dir`: itself if it holds segments, else its subdirectories.
fn actor_dirs(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    if has_segments(dir) {
        let name = dir
            .file_name()
            .map_or_else(|| ".".to_string(), |n| n.to_string_lossy().into_owned());
        return Ok(vec![(name, dir.to_path_buf())]);
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).at(dir)? {
        let entry = entry.at(dir)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && entry.path().is_dir() {
            out.push((name, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Maps and scans segment `index` at `path`. `None` when the file is gone: deleted by retention
/// before it was opened, or recycled for a later segment while it was scanned (a writer only
/// does either to segments every consumer is done with, and renames a file before it changes
/// its index word, so a changed index with the name gone is recycling, not damage).
fn scan_file(index: u64, path: &Path) -> Result<Option<(Mapping, SegmentScan)>> {
    let map = match Mapping::open_read(path) {
        Ok(m) => m,
        Err(crate::ReplayError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    let scan = scan_segment(&map);
    if gone(&map, index, path) {
        return Ok(None);
    }
    Ok(Some((map, scan)))
}

fn gone(map: &Mapping, index: u64, path: &Path) -> bool {
    recycled(map, index) && !path.exists()
}

/// Scans every actor directory under `dir` (or `dir` itself). Segments deleted or recycled
/// by a live writer while they are looked at are left out.
pub fn inspect(dir: impl AsRef<Path>) -> Result<Report> {
    let mut report = Report::default();
    for (actor, dir) in actor_dirs(dir.as_ref())? {
        let mut a = ActorReport {
            actor: actor.clone(),
            dir: dir.clone(),
            ..Default::default()
        };
        for (index, path) in list_segments(&dir)? {
            let Some((map, scan)) = scan_file(index, &path)? else {
                continue;
            };
            a.segments += 1;
            a.bytes_on_disk += map.len();
            let mut push = |offset: u64, reason: String| {
                a.corruptions.push(Corruption {
                    actor: actor.clone(),
                    path: path.clone(),
                    offset,
                    reason,
                })
            };
            if let Some(e) = &scan.header_error {
                push(0, e.clone());
            }
            for (offset, reason) in &scan.corruptions {
                push(*offset, reason.to_string());
            }
            for (_, h) in &scan.records {
                a.records += 1;
                let (lo, hi) = a.seq_range.unwrap_or((h.seq, h.seq));
                a.seq_range = Some((lo.min(h.seq), hi.max(h.seq)));
                let pv = h.meta.policy_version;
                let (lo, hi) = a.policy_version_range.unwrap_or((pv, pv));
                a.policy_version_range = Some((lo.min(pv), hi.max(pv)));
            }
        }
        report.actors.push(a);
    }
    Ok(report)
}

/// The first `n` valid records of `dir`, actor by actor in seq order.
pub fn dump(dir: impl AsRef<Path>, n: usize) -> Result<Vec<DumpedRecord>> {
    let mut out = Vec::new();
    for (actor, dir) in actor_dirs(dir.as_ref())? {
        for (index, path) in list_segments(&dir)? {
            if out.len() >= n {
                return Ok(out);
            }
            let Some((map, scan)) = scan_file(index, &path)? else {
                continue;
            };
            let mut records = Vec::new();
            for (offset, h) in scan.records.into_iter().take(n - out.len()) {
                let len = h.len as u64 - RECORD_HEADER_LEN as u64;
                let payload = map
                    .bytes(offset + RECORD_HEADER_LEN as u64, len)
                    .map(<[u8]>::to_vec)
                    .unwrap_or_default();
                records.push(DumpedRecord {
                    actor: actor.clone(),
                    seq: h.seq,
                    meta: h.meta,
                    path: path.clone(),
                    offset,
                    payload,
                });
            }
            // The copies are the records' only if the file was not recycled meanwhile.
            if !gone(&map, index, &path) {
                out.extend(records);
            }
        }
    }
    Ok(out)
}
