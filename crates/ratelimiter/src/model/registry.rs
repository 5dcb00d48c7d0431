//! The limit registry (docs/decisions.md, "Registry file"): every limit's state,
//! persisted to one JSON file that is replaced atomically, so a crash at any instant
//! leaves either the old file or the new one, never a torn or empty one.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::model::definition::LimitState;
use crate::model::key::LimitKey;

/// The largest registry file read, in bytes: 64 MiB holds well over 100,000
/// limits, and a larger file is more likely a mistake than a registry.
pub const REGISTRY_FILE_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// Why the registry could not be read or written. Each names the file, and a bad
/// entry is named by its index and key.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Reading, writing or syncing failed.
    #[error("registry {path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file is not a JSON array of limit states.
    #[error("registry {path}: {message}")]
    Format {
        /// The file involved.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// One entry is invalid.
    #[error("registry {path}: entry {index} ({key}): {message}")]
    Entry {
        /// The file involved.
        path: PathBuf,
        /// The entry's position in the array, from 0.
        index: usize,
        /// The entry's key as written, or `<no key>`.
        key: String,
        /// What is wrong.
        message: String,
    },
}

impl RegistryError {
    /// What went wrong, short and without the file's path: a client may be
    /// told it ("no storage space", "read-only filesystem or storage medium").
    pub fn reason(&self) -> String {
        match self {
            RegistryError::Io { source, .. } => source.kind().to_string(),
            RegistryError::Format { .. } | RegistryError::Entry { .. } => "the file is invalid".to_owned(),
        }
    }
}

/// The registry: states by key, mirrored to a file on every change.
#[derive(Debug)]
pub struct Registry {
    path: PathBuf,
    states: BTreeMap<LimitKey, LimitState>,
}

impl Registry {
    /// Opens the registry at `path`: loads it, or starts empty when the file does
    /// not exist yet.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, RegistryError> {
        let path = path.into();
        let states = load(&path)?
            .into_iter()
            .map(|s| (s.definition().key().clone(), s))
            .collect();
        Ok(Self { path, states })
    }

    /// The file this registry persists to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every state, ordered by key.
    pub fn states(&self) -> impl Iterator<Item = &LimitState> {
        self.states.values()
    }

    /// The state of `key`, if defined.
    pub fn get(&self, key: &LimitKey) -> Option<&LimitState> {
        self.states.get(key)
    }

    /// Stores `state` and persists the whole registry. On error the file and the
    /// in-memory map are both unchanged.
    pub fn put(&mut self, state: LimitState) -> Result<(), RegistryError> {
        let key = state.definition().key().clone();
        let previous = self.states.insert(key.clone(), state);
        let result = save(&self.path, self.states.values());
        if result.is_err() {
            match previous {
                Some(previous) => self.states.insert(key, previous),
                None => self.states.remove(&key),
            };
        }
        result
    }
}

/// Loads every state from `path`. A missing file is an empty registry; an empty,
/// torn or invalid file is an error, never an empty registry.
pub fn load(path: &Path) -> Result<Vec<LimitState>, RegistryError> {
    let io = |source| RegistryError::Io {
        path: path.to_owned(),
        source,
    };
    let format = |message: String| RegistryError::Format {
        path: path.to_owned(),
        message,
    };
    let bytes = match fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(e)),
        Ok(meta) if meta.len() > REGISTRY_FILE_BYTES_MAX => {
            return Err(format(format!("file is larger than {REGISTRY_FILE_BYTES_MAX} bytes")))
        }
        Ok(_) => fs::read(path).map_err(io)?,
    };
    let entries: Vec<serde_json::Value> =
        serde_json::from_slice(&bytes).map_err(|e| format(format!("not a JSON array of limits: {e}")))?;
    let mut seen: BTreeMap<LimitKey, usize> = BTreeMap::new();
    let mut states = Vec::with_capacity(entries.len());
    for (index, entry) in entries.into_iter().enumerate() {
        let key = entry
            .get("key")
            .and_then(|k| k.as_str())
            .unwrap_or("<no key>")
            .to_owned();
        let entry_error = |message: String| RegistryError::Entry {
            path: path.to_owned(),
            index,
            key: key.clone(),
            message,
        };
        let state: LimitState = serde_json::from_value(entry).map_err(|e| entry_error(e.to_string()))?;
        let state_key = state.definition().key().clone();
        if let Some(first) = seen.insert(state_key, index) {
            return Err(entry_error(format!("key is already defined by entry {first}")));
        }
        states.push(state);
    }
    Ok(states)
}

/// Writes `states` to `path` atomically: a temporary file beside it, fsync,
/// rename over the old file, fsync of the directory so the rename is durable.
/// A failed write (a full or read-only disk) removes its temporary file, so
/// the space it took returns and nothing half-written stays behind; the old
/// file is untouched.
pub fn save<'a>(path: &Path, states: impl IntoIterator<Item = &'a LimitState>) -> Result<(), RegistryError> {
    let tmp = tmp_path(path);
    let result = write_then_rename(path, &tmp, states);
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// [`save`]'s steps, through `tmp`.
fn write_then_rename<'a>(
    path: &Path,
    tmp: &Path,
    states: impl IntoIterator<Item = &'a LimitState>,
) -> Result<(), RegistryError> {
    let io = |source| RegistryError::Io {
        path: path.to_owned(),
        source,
    };
    let states: Vec<&LimitState> = states.into_iter().collect();
    let mut bytes = serde_json::to_vec_pretty(&states).expect("limit states serialize");
    bytes.push(b'\n');
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&directory).map_err(io)?;
    let mut file = File::create(tmp).map_err(io)?;
    file.write_all(&bytes).map_err(io)?;
    file.sync_all().map_err(io)?;
    drop(file);
    fs::rename(tmp, path).map_err(io)?;
    File::open(&directory).and_then(|d| d.sync_all()).map_err(io)
}

/// `limits.json` → `limits.json.tmp`, in the same directory so the rename is atomic.
fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".tmp");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::definition::LimitDefinition;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ratelimiter-registry-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn rolling(key: &str, capacity: u64) -> LimitState {
        LimitState::active(LimitDefinition::rolling(LimitKey::new(key).unwrap(), capacity, 60).unwrap())
    }

    #[test]
    fn round_trip_keeps_every_state() {
        let path = temp_dir("round").join("data").join("limits.json");
        let mut registry = Registry::open(&path).unwrap();
        assert_eq!(registry.states().count(), 0);
        registry.put(rolling("b", 10)).unwrap();
        let conc = LimitDefinition::concurrency(LimitKey::new("a").unwrap(), 8, 30).unwrap();
        registry.put(LimitState::decreasing(conc, 4).unwrap()).unwrap();
        registry.put(rolling("b", 20)).unwrap();
        assert!(!tmp_path(&path).exists());

        let reopened = Registry::open(&path).unwrap();
        let states: Vec<&LimitState> = reopened.states().collect();
        assert_eq!(states.len(), 2);
        assert_eq!(states[0].pending_decrease_to(), 4);
        assert_eq!(states[1].definition().capacity(), 20);
    }

    #[test]
    fn window_margins_round_trip_as_given_and_files_without_them_load() {
        let dir = temp_dir("margin");
        let path = dir.join("limits.json");
        // A registry file written before window margins existed.
        fs::write(
            &path,
            r#"[{"key":"old","kind":"rolling","capacity":5,"window_seconds":60,"timeout_seconds":0,"unit":"","description":"","overage":"none","status":"active","pending_decrease_to":0}]"#,
        )
        .unwrap();
        let mut registry = Registry::open(&path).unwrap();
        let old = registry
            .get(&LimitKey::new("old").unwrap())
            .unwrap()
            .definition()
            .clone();
        assert_eq!(old.window_margin_ms(), None);
        let given = rolling("given", 5)
            .definition()
            .with_window_margin_ms(Some(120))
            .unwrap();
        registry.put(LimitState::active(given.clone())).unwrap();

        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.matches("window_margin_ms").count(), 1, "{text}");
        let reopened = Registry::open(&path).unwrap();
        assert_eq!(reopened.get(given.key()).unwrap().definition(), &given);
        assert_eq!(reopened.get(old.key()).unwrap().definition(), &old);
    }

    #[test]
    fn bad_files_name_the_file_and_the_entry() {
        let dir = temp_dir("bad");
        let path = dir.join("limits.json");
        let cases: [(&str, &str); 5] = [
            ("", "not a JSON array"),
            ("[{\"key\":\"a\",\"kind\":\"rolling\",", "not a JSON array"),
            ("{}", "not a JSON array"),
            (
                r#"[{"key":"ok","kind":"rolling","capacity":1,"window_seconds":60},{"key":"x","kind":"rolling","capacity":0,"window_seconds":60}]"#,
                "entry 1 (x)",
            ),
            (
                r#"[{"key":"d","kind":"rolling","capacity":1,"window_seconds":60},{"key":"d","kind":"rolling","capacity":2,"window_seconds":60}]"#,
                "entry 1 (d): key is already defined by entry 0",
            ),
        ];
        for (content, expected) in cases {
            fs::write(&path, content).unwrap();
            let message = Registry::open(&path).unwrap_err().to_string();
            assert!(message.contains(path.to_str().unwrap()), "{message}");
            assert!(message.contains(expected), "{message} should contain {expected}");
        }
    }

    #[test]
    fn a_failed_write_changes_nothing() {
        let dir = temp_dir("fail");
        let path = dir.join("limits.json");
        let mut registry = Registry::open(&path).unwrap();
        registry.put(rolling("a", 1)).unwrap();
        // A directory where the temporary file must go makes the write fail.
        fs::create_dir_all(tmp_path(&path)).unwrap();
        assert!(registry.put(rolling("b", 1)).is_err());
        assert!(registry.get(&LimitKey::new("b").unwrap()).is_none());
        fs::remove_dir_all(tmp_path(&path)).unwrap();
        assert_eq!(Registry::open(&path).unwrap().states().count(), 1);
    }

    #[test]
    fn a_leftover_tmp_file_is_ignored() {
        let dir = temp_dir("leftover");
        let path = dir.join("limits.json");
        save(&path, [&rolling("a", 5)]).unwrap();
        fs::write(tmp_path(&path), "[{\"key\":").unwrap();
        assert_eq!(load(&path).unwrap().len(), 1);
    }
}
