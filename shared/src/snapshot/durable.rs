//! Durable, atomic writes: every file fsynced as it is closed, a directory published by
//! renaming its `NAME.tmp` twin once complete, a small file replaced by tmp + rename. The one
//! implementation of the write-tmp-fsync-rename protocol, for snapshots and the reward model.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::error::{Result, SnapshotError};

/// Size and CRC-32C of a written file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileDigest {
    /// Length in bytes.
    pub bytes: u64,
    /// CRC-32C (Castagnoli) of the whole file.
    pub crc32c: u32,
}

/// A writer that counts bytes and updates a CRC-32C as they pass, so a checksum costs no
/// second read of the file.
pub struct DigestWriter<W> {
    inner: W,
    digest: FileDigest,
}

impl<W: Write> DigestWriter<W> {
    /// Wraps `inner`, starting from an empty digest.
    pub fn new(inner: W) -> Self {
        DigestWriter {
            inner,
            digest: FileDigest {
                bytes: 0,
                crc32c: 0,
            },
        }
    }

    /// Size and checksum of everything written so far.
    pub fn digest(&self) -> FileDigest {
        self.digest
    }

    /// The wrapped writer.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: Write> Write for DigestWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.digest.crc32c = crc32c::crc32c_append(self.digest.crc32c, &buf[..n]);
        self.digest.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// fsyncs a directory, so that the entries created or renamed in it are durable.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| SnapshotError::io(dir, e))
}

/// Writes `bytes` to `path`, fsyncs, and returns size and checksum.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<FileDigest> {
    let io = |e| SnapshotError::io(path, e);
    let mut out = DigestWriter::new(File::create(path).map_err(io)?);
    out.write_all(bytes).map_err(io)?;
    let digest = out.digest();
    out.into_inner().sync_all().map_err(io)?;
    Ok(digest)
}

/// Size and CRC-32C of a file on disk, read in chunks.
pub fn digest_file(path: &Path) -> Result<FileDigest> {
    let io = |e| SnapshotError::io(path, e);
    let mut file = File::open(path).map_err(io)?;
    let mut sink = DigestWriter::new(std::io::sink());
    std::io::copy(&mut file, &mut sink).map_err(io)?;
    Ok(sink.digest())
}

/// Replaces the small file `path` atomically: `NAME.tmp` written and fsynced, renamed over
/// `path`, the directory fsynced. A reader sees the old or the new contents, never a mix.
pub fn replace_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| SnapshotError::corrupt(path, "not a file path"))?;
    let tmp = path.with_file_name(format!("{name}.tmp"));
    write_synced(&tmp, bytes)?;
    fs::rename(&tmp, path).map_err(|e| SnapshotError::io(path, e))?;
    fsync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// A directory being written as `NAME.tmp` and published as `NAME` by [`AtomicDir::commit`].
/// Dropped without a commit, it leaves the `NAME.tmp` directory for the next writer (or the
/// owner's start-up clean-up) to remove: a crash at any point never leaves a partial `NAME`.
#[derive(Debug)]
pub struct AtomicDir {
    tmp: PathBuf,
    target: PathBuf,
}

impl AtomicDir {
    /// Starts writing `target`: its parent is created if missing, a stale `NAME.tmp` from an
    /// interrupted writer is removed, and a fresh empty one created. Refuses when `target`
    /// already exists: a published directory is never rewritten (readers may have it mapped).
    pub fn create(target: &Path) -> Result<Self> {
        let name = target
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| SnapshotError::corrupt(target, "not a directory path"))?;
        if target.exists() {
            return Err(SnapshotError::corrupt(
                target,
                "already exists; a published directory is never rewritten",
            ));
        }
        let parent = target.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(parent).map_err(|e| SnapshotError::io(parent, e))?;
        let tmp = parent.join(format!("{name}.tmp"));
        debug_assert_eq!(Some(&tmp), Self::tmp_path(target).as_ref());
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(|e| SnapshotError::io(&tmp, e))?;
        }
        fs::create_dir(&tmp).map_err(|e| SnapshotError::io(&tmp, e))?;
        Ok(AtomicDir {
            tmp,
            target: target.to_path_buf(),
        })
    }

    /// Where the directory `target` is written before [`AtomicDir::commit`] (`NAME.tmp`
    /// beside it): other processes that contribute files find it here.
    pub fn tmp_path(target: &Path) -> Option<PathBuf> {
        let name = target.file_name()?.to_str()?;
        Some(
            target
                .parent()
                .unwrap_or(Path::new("."))
                .join(format!("{name}.tmp")),
        )
    }

    /// Path of `file` inside the directory being written.
    pub fn path(&self, file: &str) -> PathBuf {
        self.tmp.join(file)
    }

    /// Writes and fsyncs one file of the directory.
    pub fn write(&self, file: &str, bytes: &[u8]) -> Result<FileDigest> {
        write_synced(&self.path(file), bytes)
    }

    /// Publishes: fsyncs the directory, renames it to its final name, fsyncs the parent.
    /// Every file must have been written (and fsynced) before.
    pub fn commit(self) -> Result<PathBuf> {
        fsync_dir(&self.tmp)?;
        fs::rename(&self.tmp, &self.target).map_err(|e| SnapshotError::io(&self.target, e))?;
        fsync_dir(self.target.parent().unwrap_or(Path::new(".")))?;
        Ok(self.target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_dir_is_invisible_until_committed_and_never_rewritten() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("out");
        let dir = AtomicDir::create(&target).unwrap();
        let digest = dir.write("a.txt", b"hello").unwrap();
        assert_eq!(digest.bytes, 5);
        assert_eq!(digest.crc32c, crc32c::crc32c(b"hello"));
        assert!(!target.exists());
        assert!(root.path().join("out.tmp/a.txt").is_file());
        assert_eq!(dir.commit().unwrap(), target);
        assert_eq!(fs::read(target.join("a.txt")).unwrap(), b"hello");
        assert!(!root.path().join("out.tmp").exists());
        assert!(AtomicDir::create(&target).is_err());
    }

    #[test]
    fn stale_tmp_is_replaced_and_files_are_swapped_whole() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("x.tmp")).unwrap();
        fs::write(root.path().join("x.tmp/junk"), b"j").unwrap();
        let dir = AtomicDir::create(&root.path().join("x")).unwrap();
        assert!(!dir.path("junk").exists());
        let f = root.path().join("LATEST");
        replace_file(&f, b"1\n").unwrap();
        replace_file(&f, b"2\n").unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"2\n");
        assert!(!root.path().join("LATEST.tmp").exists());
        assert_eq!(digest_file(&f).unwrap().bytes, 2);
    }
}
