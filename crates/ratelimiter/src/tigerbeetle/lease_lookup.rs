//! A lease read back from the cluster (docs/tigerbeetle-backend.md, "Complete on
//! any server"): every transfer of a lease carries its id in `user_data_128`,
//! so any server finds what the lease reserved and whether it was completed,
//! whichever server reserved it and whether that server still remembers it.

use tigerbeetle_unofficial as tb;

use crate::{LeaseId, LimitKind, LimiterError};

use super::backend::{unavailable, TigerBeetleBackend};
use super::ids;
use super::lease_cache::{fingerprint, HeldRequirement, LeaseRecord};

/// The most transfers one lease has: a reserve, a void, a re-reserve and a
/// debt per requirement, at most 32 requirements.
pub const LEASE_TRANSFERS_MAX: u32 = 4 * 32;

/// What the cluster holds of one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterLease {
    /// The reservations, in the order they were made; empty for a lease the
    /// cluster never granted.
    pub held: Vec<HeldRequirement>,
    /// The reservation time the reserving server answered (or, for chains
    /// written before it was recorded, the cluster's time of the first one).
    pub reserved_at_unix_ms: u64,
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
            fingerprint: fingerprint(self.held.iter().map(|h| (&h.key, h.amount))),
            held: self.held,
            confirmed: true,
            completed: self.completed,
        })
    }
}

impl TigerBeetleBackend {
    /// Reads the lease's transfers back from the cluster.
    pub(super) async fn cluster_lease(&self, lease: LeaseId) -> Result<ClusterLease, LimiterError> {
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
            completed: false,
            denied: false,
        };
        for transfer in transfers
            .iter()
            .filter(|t| t.flags().contains(tb::transfer::Flags::PENDING))
        {
            let Some(key) = self.key_of_account(transfer.debit_account_id()).await? else {
                continue;
            };
            if transfer.id() != ids::reserve_transfer_id(lease, &key) {
                continue;
            }
            if found.held.is_empty() {
                found.reserved_at_unix_ms = match transfer.user_data_64() {
                    0 => unix_ms(transfer),
                    at => at,
                };
            }
            let kind = self
                .state_of(&key)
                .map_or(LimitKind::Rolling, |s| s.definition().kind());
            found.held.push(HeldRequirement {
                key,
                amount: u64::try_from(transfer.amount()).unwrap_or(u64::MAX),
                kind,
                timeout_seconds: u64::from(transfer.timeout()),
            });
        }
        found.denied = transfers
            .iter()
            .any(|t| t.id() == ids::lease_marker_id(lease) && t.code() == ids::CODE_LEASE_DENIED);
        found.completed = transfers.iter().any(|t| {
            found.held.iter().any(|h| {
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
    transfer.as_raw().timestamp / 1_000_000
}
