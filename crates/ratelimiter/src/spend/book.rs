//! The spend book: what the gateway records completed calls in and reports
//! from, whichever backend keeps it (a file beside the registry on memory, the
//! cluster on TigerBeetle).

use async_trait::async_trait;

use super::{SpendEntry, SpendError, SpendLedger, SpendQuery, SpendRow};

/// One entry to record, with the id that makes its recording idempotent: the
/// recorder gives an entry its id once and sends the same id on every retry, so
/// a write whose answer was lost is not counted twice where the book can tell
/// (the cluster refuses a second transfer of one id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendRecord {
    /// Unique per entry: random at the call's completion.
    pub id: u128,
    /// The entry.
    pub entry: SpendEntry,
}

impl SpendRecord {
    /// `entry` with a fresh random id.
    pub fn new(entry: SpendEntry) -> Self {
        Self {
            id: rand::random(),
            entry,
        }
    }
}

/// Where completed calls' spend is kept and summed.
#[async_trait]
pub trait SpendBook: Send + Sync + std::fmt::Debug {
    /// Records `records` durably: `Ok` only once every one of them is durable
    /// (synced to the file, or acknowledged by the cluster) and counted. A bad
    /// entry refuses the batch and changes nothing; on any other error the
    /// batch may be retried whole and no entry is counted twice.
    async fn record(&self, records: &[SpendRecord]) -> Result<(), SpendError>;

    /// The report `query` asks for, from the sums in memory, with every entry
    /// durable before the call began.
    async fn report(&self, query: &SpendQuery) -> Result<Vec<SpendRow>, SpendError>;

    /// True when servers share the book (a fleet on one cluster): each reports
    /// every server's calls.
    fn shared(&self) -> bool;
}

#[async_trait]
impl SpendBook for SpendLedger {
    async fn record(&self, records: &[SpendRecord]) -> Result<(), SpendError> {
        // Encoded and counted here; only the bytes go to the blocking thread,
        // so no entry is copied for it.
        let lines = super::ledger::encode(records.iter().map(|r| &r.entry))?;
        let ledger = self.clone();
        let written = tokio::task::spawn_blocking(move || ledger.write_lines(&lines)).await;
        written.map_err(|e| SpendError::NotPersisted {
            path: self.path().display().to_string(),
            reason: format!("the write's thread failed: {e}"),
        })??;
        self.count(records.iter().map(|r| &r.entry));
        Ok(())
    }

    async fn report(&self, query: &SpendQuery) -> Result<Vec<SpendRow>, SpendError> {
        Ok(self.query(query))
    }

    fn shared(&self) -> bool {
        false
    }
}
