//! The spend ledger (docs/prices.md, "The spend ledger"): every completed call's
//! tokens and cost, kept durably, and the report that sums them by tenant, key,
//! model, deployment and day in UTC.
//!
//! - [`SpendEntry`] (`entry`): one completed call, validated.
//! - [`UtcDay`] (`day`): a calendar day in UTC, `YYYY-MM-DD`.
//! - [`SpendQuery`], [`SpendField`], [`SpendRow`] (`query`): what a report asks
//!   for and answers.
//! - [`SpendLedger`] (`ledger`): the memory backend's ledger, an append-only file
//!   beside the registry, each entry synced before it is acknowledged, with the
//!   sums kept in memory for the report.
//! - [`SpendSums`] (`sums`): the sums by finest group, which a report adds up.
//! - [`SpendBook`], [`SpendRecord`] (`book`): what the gateway records in and
//!   reports from, the memory ledger or the cluster's
//!   (`crate::tigerbeetle::TigerBeetleSpendBook`).

mod book;
mod day;
mod entry;
mod ledger;
mod query;
mod sums;

pub use book::{SpendBook, SpendRecord};
pub use day::UtcDay;
pub use entry::{SpendEntry, SPEND_NAME_BYTES_MAX};
pub use ledger::{spend_path, SpendLedger, SPEND_FILE_BYTES_MAX, SPEND_FILE_NAME};
pub use query::{SpendField, SpendQuery, SpendRow, QUERY_DAYS_MAX};
pub use sums::SpendSums;

/// Why the ledger refused an entry or a query, or could not keep an entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpendError {
    /// Bad input: nothing was changed. The message names the field.
    #[error("invalid: {0}")]
    Invalid(String),
    /// The entry could not be made durable: it is not in the ledger.
    #[error("spend ledger {path}: {reason}")]
    NotPersisted {
        /// The ledger's file.
        path: String,
        /// What the operating system said.
        reason: String,
    },
    /// The shared book (the cluster) could not be reached or refused the write:
    /// nothing of the batch is counted; retry later.
    #[error("spend ledger unavailable: {0}")]
    Unavailable(String),
}
