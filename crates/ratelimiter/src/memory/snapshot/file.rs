//! A snapshot's file: written whole or not at all (a temporary file, synced,
//! then renamed over the old one), readable by its owner only, read back checked.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::content::MemorySnapshot;
use super::error::SnapshotError;

impl MemorySnapshot {
    /// Writes the snapshot to `path` atomically: a temporary file beside it,
    /// fsync, rename over the old file, fsync of the directory. A crash at any
    /// point leaves the old snapshot or the new one, never a torn file.
    /// Returns the bytes written.
    pub fn write_atomic(&self, path: &Path) -> Result<usize, SnapshotError> {
        let bytes = self.encode();
        write_atomic(path, &bytes)?;
        Ok(bytes.len())
    }

    /// Reads the snapshot at `path`: `None` when there is none.
    pub fn read(path: &Path) -> Result<Option<Self>, SnapshotError> {
        let bytes = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(SnapshotError::Io {
                    path: path.to_owned(),
                    source,
                })
            }
        };
        Self::decode(&bytes).map(Some).map_err(|reason| SnapshotError::Damaged {
            path: path.to_owned(),
            reason,
        })
    }
}

/// `bytes` to `path` through `<path>.tmp`, durably. A failed write (a full or
/// read-only disk) removes the temporary file: its space returns, and the
/// previous snapshot stays whole.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), SnapshotError> {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".tmp");
    let tmp = path.with_file_name(name);
    let result = write_then_rename(path, &tmp, bytes);
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// [`write_atomic`]'s steps, through `tmp`.
fn write_then_rename(path: &Path, tmp: &Path, bytes: &[u8]) -> Result<(), SnapshotError> {
    let io = |source| SnapshotError::Io {
        path: path.to_owned(),
        source,
    };
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&directory).map_err(io)?;
    let mut file = private_file(tmp).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)?;
    drop(file);
    fs::rename(tmp, path).map_err(io)?;
    File::open(&directory).and_then(|d| d.sync_all()).map_err(io)
}

/// Creates (or truncates) `path` readable and writable by its owner only
/// (0600 on Unix): a snapshot holds every live lease id, and whoever reads one
/// may complete that lease. A file left by an earlier version with wider
/// permissions is narrowed too.
fn private_file(path: &Path) -> std::io::Result<File> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options.open(path)?;
    #[cfg(unix)]
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    Ok(file)
}
