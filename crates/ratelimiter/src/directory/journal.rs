//! The memory backend's store of the directory: a file of one JSON change per
//! line beside the registry. A change is appended with one write and synced
//! (`fdatasync`) before the API answers, so a 201 survives a SIGKILL or a
//! power cut the next instant; a line torn by a crash mid-write was never
//! acknowledged and is cut at the next start. At start, a file holding many
//! more changes than records is rewritten with one change per record,
//! atomically (a temporary file, synced, renamed, the directory synced).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use async_trait::async_trait;

use super::change::{Change, Recorded};
use super::store::{Appended, DirectoryStore};
use super::DirectoryError;
use crate::base::private_file::{make_private, private_options};

/// The file's name, in the registry's directory: one directory holds
/// everything a server keeps.
pub const JOURNAL_FILE_NAME: &str = "gateway-directory.jsonl";
/// The largest file read: 100,000 keys take about 40 MB; a larger file is
/// more likely a mistake than a directory.
pub const JOURNAL_FILE_BYTES_MAX: u64 = 1 << 30;
/// Changes beyond twice the records, and at least this many, make the start
/// rewrite the file: updates and revocations do not grow it without bound.
pub const COMPACT_CHANGES_MIN: usize = 10_000;

/// Where the directory of the server whose registry is `registry_path` lives.
pub fn journal_path(registry_path: &Path) -> PathBuf {
    match registry_path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.join(JOURNAL_FILE_NAME),
        _ => PathBuf::from(JOURNAL_FILE_NAME),
    }
}

/// The file and what is not read from it yet.
#[derive(Debug)]
pub struct FileStore {
    path: PathBuf,
    state: Mutex<FileState>,
}

#[derive(Debug)]
struct FileState {
    /// The length of the file's whole lines: a failed append is cut back to it.
    length_bytes: u64,
    /// The last version given: the lines written since the file began,
    /// counting on across a compaction, so versions only increase.
    lines: u64,
    /// Changes recorded and not yet returned by `read_new`.
    unread: Vec<Recorded>,
    /// Set when a failed append could not be cut back: nothing more is
    /// written until a restart cuts the torn line.
    broken: bool,
    /// Changes read at open: a start compacts when they are many.
    loaded: usize,
}

fn io_error(path: &Path, error: std::io::Error) -> DirectoryError {
    DirectoryError::NotPersisted {
        reason: error.kind().to_string(),
        detail: format!("directory {}: {error}", path.display()),
    }
}

impl FileStore {
    /// Opens the file at `path` (none yet: an empty directory), cutting a torn
    /// last line. A line that is not a change is an error naming it: the
    /// server does not start on a directory it cannot read whole.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, String> {
        let path = path.into();
        let name = path.display().to_string();
        // It holds every key's hash: its owner's only, an older file's too.
        make_private(&path).map_err(|e| format!("directory {name}: {e}"))?;
        let bytes = match fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(format!("directory {name}: {e}")),
            Ok(meta) if meta.len() > JOURNAL_FILE_BYTES_MAX => {
                return Err(format!("directory {name}: larger than {JOURNAL_FILE_BYTES_MAX} bytes"))
            }
            Ok(_) => fs::read(&path).map_err(|e| format!("directory {name}: {e}"))?,
        };
        let whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        if whole < bytes.len() {
            tracing::warn!(directory = %name, torn_bytes = bytes.len() - whole,
                "the directory's last change was cut by a crash before it was acknowledged; dropped");
            let file = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|e| format!("directory {name}: {e}"))?;
            file.set_len(whole as u64)
                .and_then(|()| file.sync_all())
                .map_err(|e| format!("directory {name}: {e}"))?;
        }
        let mut unread = Vec::new();
        for (i, line) in bytes[..whole].split(|b| *b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            let change: Change =
                serde_json::from_slice(line).map_err(|e| format!("directory {name}: line {}: {e}", i + 1))?;
            unread.push(Recorded {
                version: i as u64 + 1,
                change,
            });
        }
        let lines = bytes[..whole].iter().filter(|b| **b == b'\n').count() as u64;
        let loaded = unread.len();
        Ok(Self {
            path,
            state: Mutex::new(FileState {
                length_bytes: whole as u64,
                lines,
                unread,
                broken: false,
                loaded,
            }),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn append_line(&self, state: &mut FileState, line: &[u8]) -> Result<(), DirectoryError> {
        let fresh = state.length_bytes == 0;
        if fresh {
            if let Some(parent) = self.path.parent().filter(|p| !p.as_os_str().is_empty()) {
                fs::create_dir_all(parent).map_err(|e| io_error(&self.path, e))?;
            }
        }
        let mut file = private_options(OpenOptions::new().create(true).append(true))
            .open(&self.path)
            .map_err(|e| io_error(&self.path, e))?;
        let written = file.write_all(line).and_then(|()| file.sync_data());
        if let Err(e) = written {
            // Cut what may have been written, so the next append starts a line.
            if file.set_len(state.length_bytes).and_then(|()| file.sync_all()).is_err() {
                state.broken = true;
            }
            return Err(io_error(&self.path, e));
        }
        if fresh {
            // The file's own entry in its directory must be durable too.
            sync_parent(&self.path).map_err(|e| io_error(&self.path, e))?;
        }
        state.length_bytes += line.len() as u64;
        Ok(())
    }
}

fn sync_parent(path: &Path) -> std::io::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    File::open(parent)?.sync_all()
}

#[async_trait]
impl DirectoryStore for FileStore {
    async fn read_new(&self) -> Result<Vec<Recorded>, DirectoryError> {
        Ok(std::mem::take(
            &mut self.state.lock().expect("directory file lock").unread,
        ))
    }

    /// Appends under the lock: one writer at a time, so a change always
    /// follows the version its writer saw (the directory serializes its
    /// writes too), and `previous_version` needs no check here.
    async fn append(&self, change: &Change, _previous_version: u64) -> Result<Appended, DirectoryError> {
        let mut line = serde_json::to_vec(change).expect("a change serializes");
        line.push(b'\n');
        let mut state = self.state.lock().expect("directory file lock");
        if state.broken {
            return Err(DirectoryError::NotPersisted {
                reason: "an earlier write failed and could not be undone".to_owned(),
                detail: format!(
                    "directory {}: restart the server to cut the torn line",
                    self.path.display()
                ),
            });
        }
        self.append_line(&mut state, &line)?;
        state.lines += 1;
        let version = state.lines;
        state.unread.push(Recorded {
            version,
            change: change.clone(),
        });
        Ok(Appended::Written)
    }

    fn shared(&self) -> bool {
        false
    }

    async fn compact(&self, changes: Vec<Change>) -> Result<(), DirectoryError> {
        let mut state = self.state.lock().expect("directory file lock");
        if state.loaded < COMPACT_CHANGES_MIN || state.loaded <= 2 * changes.len() || !state.unread.is_empty() {
            return Ok(());
        }
        let mut bytes = Vec::new();
        for change in &changes {
            serde_json::to_writer(&mut bytes, change).expect("a change serializes");
            bytes.push(b'\n');
        }
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let written = private_options(OpenOptions::new().write(true).create(true).truncate(true))
            .open(&tmp)
            .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
            .and_then(|()| fs::rename(&tmp, &self.path))
            .and_then(|()| sync_parent(&self.path));
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(io_error(&self.path, e));
        }
        tracing::info!(directory = %self.path.display(), changes_before = state.loaded, changes_after = changes.len(), "directory file compacted");
        // Versions keep increasing across the rewrite: `lines` counts on.
        state.length_bytes = bytes.len() as u64;
        state.loaded = changes.len();
        Ok(())
    }
}
