//! The TigerBeetle backend (distributed mode, docs/tigerbeetle-backend.md): limits are
//! TigerBeetle accounts, reservations are linked chains of pending transfers with
//! timeouts, and the hot path never reads.
//!
//! - [`ids`]: the account model and the deterministic ids (docs/lease-ids.md,
//!   "Deterministic TigerBeetle ids").
//! - [`config`]: the `tigerbeetle:` settings.
//! - [`pool`]: client sessions and the bound on requests outstanding on them;
//!   a session's client (`session`) and the watchdog's probe (`probe`) below it.
//! - [`submitter`]: micro-batching of many requests' chains (docs/tigerbeetle-backend.md,
//!   "The submitter").
//! - `shared`: what the backend holds (sessions, submitter, definitions, lease
//!   cache, counters), below every path of the backend; the paths (`reserve`,
//!   `complete`, `admin`, `definitions`, `next_release`, `bucket_refills`,
//!   `clock_probe`, `cluster_lease`, `fleet_servers`) are `impl` blocks of it
//!   in their own files.
//! - [`backend`]: [`TigerBeetleBackend`], the [`crate::Backend`], above the
//!   paths, handing each call to them.
//! - `chain`: a lease's chain of reservations and the timeouts it carries.
//! - [`cluster_clock`]: a lower bound of the cluster's clock, which times a
//!   Complete of a lease reserved by another process (docs/tigerbeetle-backend.md,
//!   "Clocks").
//! - `buckets`: token-bucket limits as accounts and refill transfers
//!   (docs/tigerbeetle-backend.md, "Buckets").
//! - `next_release`: the time until a key next gets a held unit back, read
//!   from its pending transfers and refills (docs/tigerbeetle-backend.md, "Next release").
//! - [`server_log`]: the fleet's servers as the cluster saw them (announces at
//!   start, the writer of each definition record).
//! - `chain_reassembler`: the linked chains of one log's records put back
//!   together across the pages a reader reads them in.
//! - [`directory_log`]: the gateway's tenants and keys, a log every server
//!   of a fleet reads (docs/gateway.md, "Tenants and keys").
//! - [`handed_id_log`]: the stored ids handed to each gateway tenant, which
//!   every server of a fleet looks up (docs/gateway.md, "Stored responses").
//! - [`once_log`]: records a fleet makes once (a deterministic transfer id;
//!   making it again finds `exists`): the handed ids and the alert claims.
//! - [`alert_claim_log`]: which server alerts each crossing of a budget's
//!   `alert_at` (docs/gateway.md, "Budgets and spend").
//! - [`spend_log`]: the gateway's spend ledger, every completed call's
//!   tokens and cost, which every server tails into sums (docs/prices.md,
//!   "The spend ledger").
//! - [`harness`]: a local cluster for tests, examples and benchmarks.

#[cfg(feature = "tigerbeetle")]
pub mod alert_claim_log;
#[cfg(feature = "tigerbeetle")]
pub mod backend;
#[cfg(feature = "tigerbeetle")]
mod chain_reassembler;
#[cfg(feature = "tigerbeetle")]
pub mod cluster_clock;
pub mod config;
#[cfg(feature = "tigerbeetle")]
pub mod connections;
#[cfg(feature = "tigerbeetle")]
pub mod definition_log;
#[cfg(feature = "tigerbeetle")]
mod definitions;
#[cfg(feature = "tigerbeetle")]
pub mod denied_leases;
#[cfg(feature = "tigerbeetle")]
pub mod directory_log;
#[cfg(feature = "tigerbeetle")]
pub mod handed_id_log;
#[cfg(feature = "tigerbeetle")]
pub mod harness;
#[cfg(feature = "tigerbeetle")]
pub mod ids;
#[cfg(feature = "tigerbeetle")]
pub mod lease_cache;
#[cfg(feature = "tigerbeetle")]
mod lease_lookup;
#[cfg(feature = "tigerbeetle")]
pub mod once_log;
#[cfg(feature = "tigerbeetle")]
pub mod pool;
#[cfg(feature = "tigerbeetle")]
pub mod server_log;
#[cfg(feature = "tigerbeetle")]
mod socket_table;
#[cfg(feature = "tigerbeetle")]
pub mod spend_log;
#[cfg(feature = "tigerbeetle")]
pub mod submitter;

#[cfg(feature = "tigerbeetle")]
mod admin;
#[cfg(feature = "tigerbeetle")]
mod bucket_refills;
#[cfg(feature = "tigerbeetle")]
mod buckets;
#[cfg(feature = "tigerbeetle")]
mod chain;
#[cfg(feature = "tigerbeetle")]
mod clock_probe;
#[cfg(feature = "tigerbeetle")]
mod cluster_lease;
#[cfg(feature = "tigerbeetle")]
mod complete;
#[cfg(feature = "tigerbeetle")]
mod counters;
#[cfg(feature = "tigerbeetle")]
mod fleet_servers;
#[cfg(feature = "tigerbeetle")]
mod next_release;
#[cfg(feature = "tigerbeetle")]
mod probe;
#[cfg(feature = "tigerbeetle")]
mod reserve;
#[cfg(feature = "tigerbeetle")]
mod session;
#[cfg(feature = "tigerbeetle")]
mod shared;

#[cfg(feature = "tigerbeetle")]
pub use chain::lease_chain;
/// The TigerBeetle client library this backend speaks, for benchmarks and
/// prototypes that compare against it; one pinned version for the workspace.
#[cfg(feature = "tigerbeetle")]
pub use tigerbeetle_unofficial as client;

#[cfg(feature = "tigerbeetle")]
pub use alert_claim_log::TigerBeetleAlertClaims;
#[cfg(feature = "tigerbeetle")]
pub use backend::{BackendOptions, TigerBeetleBackend};
pub use config::{ConfigFields, SubmitMode, TigerBeetleConfig};
#[cfg(feature = "tigerbeetle")]
pub use counters::TigerBeetleCounters;
#[cfg(feature = "tigerbeetle")]
pub use definitions::DEFINITIONS_REFRESH_INTERVAL_MS;
#[cfg(feature = "tigerbeetle")]
pub use directory_log::TigerBeetleDirectoryStore;
#[cfg(feature = "tigerbeetle")]
pub use handed_id_log::TigerBeetleHandedIds;
#[cfg(feature = "tigerbeetle")]
pub use harness::LocalCluster;
#[cfg(feature = "tigerbeetle")]
pub use next_release::{NEXT_RELEASE_PAGES_MAX, NEXT_RELEASE_PAGE_TRANSFERS};
#[cfg(feature = "tigerbeetle")]
pub use server_log::ServerIdentity;
#[cfg(feature = "tigerbeetle")]
pub use spend_log::TigerBeetleSpendBook;
