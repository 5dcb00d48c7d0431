//! What a [`Directory`] shows: its tenants and keys as the API and the
//! gateway's start read them, its sizes and its metrics. Below the writes
//! (`service.rs`), which it reads the state of.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::index::DirectoryIndex;
use super::service::Directory;
use super::{KeyRecord, TenantRecord};

impl Directory {
    /// The live tenant `name`.
    pub fn tenant(&self, name: &str) -> Option<TenantRecord> {
        let index = self.index.read().expect("directory lock");
        index.tenant(name).map(|t| TenantRecord::clone(t))
    }

    /// Every live tenant, by name.
    pub fn tenants(&self) -> Vec<TenantRecord> {
        let index = self.index.read().expect("directory lock");
        index.tenants().map(|t| TenantRecord::clone(t)).collect()
    }

    /// The key `id`, in any state.
    pub fn key(&self, id: &str) -> Option<KeyRecord> {
        let index = self.index.read().expect("directory lock");
        index.key(id).map(|k| KeyRecord::clone(k))
    }

    /// Every key, or those of the tenant named `tenant`, by id; with the
    /// status each has now (a key whose tenant is gone is revoked).
    pub fn keys(&self, tenant: Option<&str>) -> Vec<super::KeyView> {
        let index = self.index.read().expect("directory lock");
        let now = self.clock.now_unix_ms();
        index.keys(tenant).map(|k| view(&index, k, now)).collect()
    }

    /// Every key that has not ended (neither revoked nor expired), by id: the
    /// records whose own limits the server defines at start (an ended key's
    /// are never charged again).
    pub fn unended_key_records(&self) -> Vec<Arc<KeyRecord>> {
        let index = self.index.read().expect("directory lock");
        let now = self.clock.now_unix_ms();
        (index.keys(None))
            .filter(|k| k.ended_at_unix_ms(now).is_none())
            .cloned()
            .collect()
    }

    /// What the API shows of the key `id` now.
    pub fn key_view(&self, id: &str) -> Option<super::KeyView> {
        let index = self.index.read().expect("directory lock");
        let now = self.clock.now_unix_ms();
        index.key(id).map(|k| view(&index, k, now))
    }

    /// How many tenants live and how many keys are kept (revoked ones included).
    pub fn sizes(&self) -> (usize, usize) {
        let index = self.index.read().expect("directory lock");
        (index.tenants_len(), index.keys_len())
    }

    /// Reads of the store made for unknown keys so far.
    pub fn unknown_key_reads(&self) -> u64 {
        self.counters.unknown_key_reads.load(Ordering::Relaxed)
    }

    /// Reads of the store so far (periodic, for unknown keys, around writes).
    pub fn reads(&self) -> u64 {
        self.counters.reads_started.load(Ordering::Relaxed)
    }

    /// The directory's counters and sizes, for `/metrics`.
    pub fn metrics(&self) -> Vec<crate::base::metrics::Metric> {
        let (tenants, keys) = {
            let index = self.index.read().expect("directory lock");
            (index.tenants_len() as u64, index.keys_len() as u64)
        };
        self.counters.metrics(tenants, keys)
    }
}

/// A key's view, revoked when its tenant is gone.
fn view(index: &DirectoryIndex, key: &KeyRecord, now: u64) -> super::KeyView {
    let mut view = key.view(now);
    if view.status == super::KeyStatus::Active && index.authenticate_hash(&key.hash, now).is_err() {
        view.status = super::KeyStatus::Revoked;
    }
    view
}
