//! A lease read back from the cluster (docs/tigerbeetle-backend.md, "Complete on
//! any server"): a lease's reservations, its denied marker and its completion
//! record sit at ids derived from the lease id alone, so any server finds what
//! the lease reserved and whether it was completed or denied, whichever server
//! reserved it and whether that server still remembers it.

use std::collections::HashMap;

use tigerbeetle_unofficial as tb;

use crate::base::id::LeaseId;
use crate::model::definition::LimitKind;
use crate::model::error::LimiterError;

use super::ids;
use super::lease_cache::{fingerprint, HeldRequirement, LeaseRecord};
use super::shared::{unavailable, Shared};

/// The most transfers one lease has: a reserve, a void, a re-reserve and a
/// debt per requirement, at most 32 requirements.
pub const LEASE_TRANSFERS_MAX: u32 = 4 * 32;

/// The most requirements of one lease (the request's own bound).
const REQUIREMENTS_MAX: usize = 32;

/// How many reservations a first lookup fetches besides the first: leases of
/// up to this many + 1 requirements (an LLM call's requests, tokens and
/// concurrency) are read in one round trip; larger ones take a second.
const SPECULATIVE_HOLDS: usize = 3;

/// What the cluster holds of one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterLease {
    /// The reservations, in the order they were made; empty for a lease the
    /// cluster never granted.
    pub held: Vec<HeldRequirement>,
    /// The reservation time the reserving server answered (or, for chains
    /// written before it was recorded, the cluster's time of the first one).
    pub reserved_at_unix_ms: u64,
    /// The cluster's time stamp of the latest reservation, in ns: the
    /// reservations' timeouts run from their stamps, so a Complete measures
    /// how much of the window is left from here ([`super::cluster_clock`]).
    pub reserved_at_cluster_ns: u64,
    /// True when a Complete of the lease already wrote anything.
    pub completed: bool,
    /// True when the lease was denied for capacity on some server (its
    /// denied marker exists).
    pub denied: bool,
}

impl ClusterLease {
    /// What this server would have cached of the lease had it reserved it;
    /// `None` when the cluster holds no reservation of it.
    pub fn record(self) -> Option<LeaseRecord> {
        if self.held.is_empty() {
            return None;
        }
        Some(LeaseRecord {
            reserved_at_unix_ms: self.reserved_at_unix_ms,
            reserved_at_cluster_ns: Some(self.reserved_at_cluster_ns),
            fingerprint: fingerprint(self.held.iter().map(|h| (&h.key, h.amount))),
            held: self.held,
            confirmed: true,
            completed: self.completed,
        })
    }
}

impl Shared {
    /// Reads the lease back from the cluster by id: its first reservation
    /// (or denied marker), its completion record and its next reservations in
    /// one batched lookup, the rest of a large lease in a second.
    pub(super) async fn cluster_lease(&self, lease: LeaseId) -> Result<ClusterLease, LimiterError> {
        let first_ids: Vec<u128> = [ids::lease_marker_id(lease), ids::completion_id(lease)]
            .into_iter()
            .chain((1..=SPECULATIVE_HOLDS).map(|i| ids::reservation_id(lease, i)))
            .collect();
        let mut found = self.lookup_ids(first_ids).await?;
        let mut lease_found = ClusterLease {
            held: Vec::new(),
            reserved_at_unix_ms: 0,
            reserved_at_cluster_ns: 0,
            completed: false,
            denied: false,
        };
        let completion = found.get(&ids::completion_id(lease)).copied();
        lease_found.denied = completion.is_some_and(|c| c.code() == ids::CODE_LEASE_DENIED);
        lease_found.completed = completion.is_some_and(|c| c.code() == ids::CODE_LEASE_COMPLETED);
        let Some(first) = found.get(&ids::lease_marker_id(lease)).copied() else {
            return Ok(lease_found);
        };
        if first.ledger() == ids::LEDGER_LEASES {
            return match first.code() {
                ids::CODE_LEASE_DENIED => Ok(ClusterLease {
                    denied: true,
                    ..lease_found
                }),
                // A chain of an earlier version, which opened with a marker.
                _ => self.legacy_cluster_lease(lease).await,
            };
        }
        let count = (first.user_data_32() as usize).clamp(1, REQUIREMENTS_MAX);
        if count > SPECULATIVE_HOLDS + 1 {
            let rest = (SPECULATIVE_HOLDS + 1..count)
                .map(|i| ids::reservation_id(lease, i))
                .collect();
            found.extend(self.lookup_ids(rest).await?);
        }
        lease_found.reserved_at_unix_ms = first.user_data_64();
        for i in 0..count {
            let Some(transfer) = found.get(&ids::reservation_id(lease, i)) else {
                // A chain is committed whole: a missing reservation is a bug
                // or a cluster that lost data; nothing is reconciled then.
                tracing::error!(%lease, index = i, count, "a reservation of the lease is missing");
                return Err(LimiterError::Backend("a lease's reservation is missing".to_owned()));
            };
            lease_found.reserved_at_cluster_ns = lease_found.reserved_at_cluster_ns.max(cluster_ns(transfer));
            let Some(held) = self.held_of(transfer).await? else {
                continue;
            };
            lease_found.held.push(held);
        }
        Ok(lease_found)
    }

    /// Looks `ids` up in the batcher; the transfers found, by id.
    async fn lookup_ids(&self, ids: Vec<u128>) -> Result<HashMap<u128, tb::Transfer>, LimiterError> {
        let transfers = self
            .lookups
            .lookup(ids, self.timeout)
            .await
            .map_err(|e| unavailable(&e, "lease lookup"))?;
        Ok(transfers.into_iter().map(|t| (t.id(), t)).collect())
    }

    /// The requirement a reservation transfer holds; `None` for an account
    /// that is no limit this server can find.
    async fn held_of(&self, transfer: &tb::Transfer) -> Result<Option<HeldRequirement>, LimiterError> {
        let Some(key) = self.key_of_account(transfer.debit_account_id()).await? else {
            return Ok(None);
        };
        let state = self.state_of(&key);
        let kind = state.as_ref().map_or(LimitKind::Rolling, |s| s.definition().kind());
        // A bucket's take is posted, without a timeout: its window for refunds
        // is the definition's (a pause's own `hold_ms` is not recorded; the
        // window then bounds its refund instead).
        let timeout_seconds = match (&state, kind) {
            (Some(state), LimitKind::Bucket) => super::chain::timeout_seconds(state, self.window_margin_ms),
            _ => transfer.timeout(),
        };
        Ok(Some(HeldRequirement {
            key,
            amount: u64::try_from(transfer.amount()).unwrap_or(u64::MAX),
            kind,
            timeout_seconds: u64::from(timeout_seconds),
            reservation_id: transfer.id(),
        }))
    }

    /// Reads a lease of an earlier version's chain (a zero-amount marker,
    /// then reservations named by key) by `query_transfers` on its
    /// `user_data_128`.
    async fn legacy_cluster_lease(&self, lease: LeaseId) -> Result<ClusterLease, LimiterError> {
        let filter = tb::QueryFilter::new(LEASE_TRANSFERS_MAX).with_user_data_128(lease.to_u128());
        let slot = self.admin_slot().await?;
        let transfers = self
            .pool
            .run(slot, self.timeout, move |client| async move {
                client.query_transfers(Box::new(filter)).await
            })
            .await
            .map_err(|e| unavailable(&e, "lease lookup"))?;
        let mut found = ClusterLease {
            held: Vec::new(),
            reserved_at_unix_ms: 0,
            reserved_at_cluster_ns: 0,
            completed: false,
            denied: false,
        };
        for transfer in transfers
            .iter()
            .filter(|t| t.flags().contains(tb::transfer::Flags::PENDING))
        {
            let Some(held) = self.held_of(transfer).await? else {
                continue;
            };
            if transfer.id() != ids::reserve_transfer_id(lease, &held.key) {
                continue;
            }
            found.reserved_at_cluster_ns = found.reserved_at_cluster_ns.max(cluster_ns(transfer));
            if found.held.is_empty() {
                found.reserved_at_unix_ms = match transfer.user_data_64() {
                    0 => unix_ms(transfer),
                    at => at,
                };
            }
            found.held.push(held);
        }
        found.completed = transfers.iter().any(|t| {
            t.id() == ids::completion_id(lease)
                || found.held.iter().any(|h| {
                    let written = [
                        ids::void_transfer_id(lease, &h.key),
                        ids::rereserve_transfer_id(lease, &h.key),
                        ids::debt_transfer_id(lease, &h.key),
                    ];
                    written.contains(&t.id())
                })
        });
        Ok(found)
    }
}

/// The cluster time of `transfer`, in ms since the epoch.
fn unix_ms(transfer: &tb::Transfer) -> u64 {
    cluster_ns(transfer) / 1_000_000
}

/// The cluster time of `transfer`, in ns since the epoch: when the cluster
/// wrote it.
fn cluster_ns(transfer: &tb::Transfer) -> u64 {
    transfer.as_raw().timestamp
}
