//! The memory backend's spend ledger: a file of one JSON entry per line beside
//! the registry. An entry is appended with one write and synced (`fdatasync`)
//! before [`SpendLedger::append`] returns, so an acknowledged call's spend
//! survives a SIGKILL or a power cut the next instant; a line torn by a crash
//! mid-write was never acknowledged and is cut at the next open. The sums per
//! day, tenant, key, model and deployment are kept in memory, so a report reads
//! no file and its cost grows with the groups, not the calls.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::{SpendEntry, SpendError, SpendQuery, SpendRow, SpendSums};
use crate::base::private_file::{make_private, private_options};

/// The file's name, in the registry's directory: one directory holds everything
/// a server keeps.
pub const SPEND_FILE_NAME: &str = "gateway-spend.jsonl";
/// The largest file opened: about 80 million calls at some 200 bytes each, read
/// in a minute or so at start. A ledger growing past it wants the TigerBeetle
/// backend, or the file moved aside (its sums are then no longer reported).
pub const SPEND_FILE_BYTES_MAX: u64 = 16 << 30;

/// Where the spend ledger of the server whose registry is `registry_path` lives.
pub fn spend_path(registry_path: &Path) -> PathBuf {
    match registry_path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.join(SPEND_FILE_NAME),
        _ => PathBuf::from(SPEND_FILE_NAME),
    }
}

/// The ledger: its file and the sums of every entry in it. A clone is the same
/// ledger (so a blocking append can move to a thread of its own).
#[derive(Debug, Clone)]
pub struct SpendLedger {
    path: PathBuf,
    state: Arc<Mutex<LedgerState>>,
}

#[derive(Debug)]
struct LedgerState {
    /// The length of the file's whole lines: a failed append is cut back to it.
    length_bytes: u64,
    /// Set when a failed append could not be cut back: nothing more is written
    /// until a restart cuts the torn line.
    broken: bool,
    /// The file, open for appending since the first write.
    file: Option<File>,
    sums: SpendSums,
}

impl SpendLedger {
    /// Opens the ledger at `path` (none yet: an empty ledger), cutting a torn last
    /// line. A line that is not a valid entry is an error naming it: the server
    /// does not start on a ledger it cannot read whole.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, String> {
        let path = path.into();
        let name = path.display().to_string();
        let fail = |e: &dyn std::fmt::Display| format!("spend ledger {name}: {e}");
        // It says who spent what: its owner's only, an older file's too.
        make_private(&path).map_err(|e| fail(&e))?;
        let file = match File::open(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(fail(&e)),
            Ok(file) => Some(file),
        };
        let mut sums = SpendSums::default();
        let mut whole = 0u64;
        if let Some(file) = file {
            let length = file.metadata().map_err(|e| fail(&e))?.len();
            if length > SPEND_FILE_BYTES_MAX {
                return Err(fail(&format!("larger than {SPEND_FILE_BYTES_MAX} bytes")));
            }
            whole = read_entries(BufReader::new(file), &mut sums).map_err(|e| fail(&e))?;
            if whole < length {
                tracing::warn!(ledger = %name, torn_bytes = length - whole,
                    "the spend ledger's last entry was cut by a crash before it was acknowledged; dropped");
                let file = OpenOptions::new().write(true).open(&path).map_err(|e| fail(&e))?;
                file.set_len(whole)
                    .and_then(|()| file.sync_all())
                    .map_err(|e| fail(&e))?;
            }
        }
        Ok(Self {
            path,
            state: Arc::new(Mutex::new(LedgerState {
                length_bytes: whole,
                broken: false,
                file: None,
                sums,
            })),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records `entry`: validated (a bad one changes nothing), written as one line
    /// and synced before this returns, then counted in the sums. Blocking file
    /// I/O: call it off an async runtime's worker threads (`spawn_blocking`).
    pub fn append(&self, entry: &SpendEntry) -> Result<(), SpendError> {
        self.append_all(std::slice::from_ref(entry))
    }

    /// Records `entries` together: all validated first (one bad entry refuses
    /// them all, and nothing is written), written in one write and synced once,
    /// then counted: the cost of a sync shared by a batch. On an error none of
    /// them is in the ledger, so retrying the batch counts each entry once.
    pub fn append_all(&self, entries: &[SpendEntry]) -> Result<(), SpendError> {
        let lines = encode(entries.iter())?;
        self.write_lines(&lines)?;
        self.count(entries.iter());
        Ok(())
    }

    /// Writes `lines` (entries as [`encode`] gives them) in one write and syncs
    /// them: the blocking half of [`SpendLedger::append_all`], apart so that a
    /// caller on an async runtime encodes and counts its entries where they are
    /// and hands only the bytes to a blocking thread. Nothing is counted.
    pub fn write_lines(&self, lines: &[u8]) -> Result<(), SpendError> {
        if lines.is_empty() {
            return Ok(());
        }
        let mut state = self.state.lock().expect("the spend ledger's lock is never poisoned");
        if state.broken {
            return Err(self.not_persisted(
                "a failed write could not be cut back; restart the server to repair the file".to_owned(),
            ));
        }
        self.append_line(&mut state, lines)
    }

    /// Counts `entries`, written by [`SpendLedger::write_lines`], in the sums.
    pub fn count<'a>(&self, entries: impl Iterator<Item = &'a SpendEntry>) {
        let mut state = self.state.lock().expect("the spend ledger's lock is never poisoned");
        entries.for_each(|entry| state.sums.add(entry));
    }

    /// The report `query` asks for: one row per group of the calls completed on
    /// its days, ordered by the grouped fields (tenant, key, model, deployment,
    /// day); no row for a group without calls.
    pub fn query(&self, query: &SpendQuery) -> Vec<SpendRow> {
        let state = self.state.lock().expect("the spend ledger's lock is never poisoned");
        state.sums.report(query)
    }

    fn append_line(&self, state: &mut LedgerState, line: &[u8]) -> Result<(), SpendError> {
        let fresh = state.length_bytes == 0;
        if fresh {
            if let Some(parent) = self.path.parent().filter(|p| !p.as_os_str().is_empty()) {
                fs::create_dir_all(parent).map_err(|e| self.not_persisted(e.to_string()))?;
            }
        }
        // Kept open between writes: an open and a close per batch saved.
        let file = match state.file.take() {
            Some(file) => file,
            None => (private_options(OpenOptions::new().create(true).append(true)).open(&self.path))
                .map_err(|e| self.not_persisted(e.to_string()))?,
        };
        let mut writer = &file;
        if let Err(e) = writer.write_all(line).and_then(|()| file.sync_data()) {
            // Cut what may have been written, so the next append starts a line;
            // the file is opened anew by the next write.
            if file.set_len(state.length_bytes).and_then(|()| file.sync_all()).is_err() {
                state.broken = true;
            }
            return Err(self.not_persisted(e.to_string()));
        }
        if fresh {
            // The file's own entry in its directory must be durable too.
            sync_parent(&self.path).map_err(|e| self.not_persisted(e.to_string()))?;
        }
        state.length_bytes += line.len() as u64;
        state.file = Some(file);
        Ok(())
    }

    fn not_persisted(&self, reason: String) -> SpendError {
        SpendError::NotPersisted {
            path: self.path.display().to_string(),
            reason,
        }
    }
}

/// `entries` as the ledger's lines: each validated (the first bad one refuses
/// them all) and written as one line of JSON.
pub fn encode<'a>(entries: impl ExactSizeIterator<Item = &'a SpendEntry>) -> Result<Vec<u8>, SpendError> {
    let mut lines = Vec::with_capacity(entries.len() * ENTRY_BYTES_USUAL);
    for entry in entries {
        entry.validate()?;
        entry.write_json(&mut lines);
        lines.push(b'\n');
    }
    Ok(lines)
}

/// The bytes of an entry's line, usually: room reserved per entry, so a batch's
/// lines are written into one buffer without growing it.
const ENTRY_BYTES_USUAL: usize = 256;

/// Reads every whole line of `reader` into `totals`; returns the length of the
/// whole lines (a last line without its newline was torn and is not read).
fn read_entries(mut reader: impl BufRead, sums: &mut SpendSums) -> Result<u64, String> {
    let (mut whole, mut number) = (0u64, 0u64);
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = reader.read_until(b'\n', &mut line).map_err(|e| e.to_string())?;
        if read == 0 || line.last() != Some(&b'\n') {
            return Ok(whole);
        }
        number += 1;
        let entry: SpendEntry = serde_json::from_slice(&line).map_err(|e| format!("line {number}: {e}"))?;
        entry.validate().map_err(|e| format!("line {number}: {e}"))?;
        sums.add(&entry);
        whole += read as u64;
    }
}

fn sync_parent(path: &Path) -> std::io::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    File::open(parent)?.sync_all()
}
