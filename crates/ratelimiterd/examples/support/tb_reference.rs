//! The reference of the TigerBeetle benchmarks (`proto_tb_batching`, `loadgen
//! reservations`): the same linked chain the backend sends for a lease
//! ([`lease_chain`]), sent straight to the cluster with the Rust client, with
//! the sessions shared round robin. The client library coalesces the requests
//! queued on one session by itself; nothing else stands between the caller and
//! TigerBeetle.

use std::sync::atomic::{AtomicUsize, Ordering};

use ratelimiter::tigerbeetle::client as tb;
use ratelimiter::tigerbeetle::lease_chain;
use ratelimiter::{LeaseId, LimitKey};

/// One requirement of the reference's leases: the limit, the units, and the
/// pending transfer's timeout in seconds (the limit's window or hold timeout).
#[derive(Debug, Clone)]
pub struct Hold {
    /// The limit, defined on the cluster beforehand (its account must exist).
    pub key: LimitKey,
    /// Units reserved per lease.
    pub amount: u64,
    /// When the pending transfer expires, as the backend would set it.
    pub timeout_seconds: u32,
}

/// Client sessions sending lease chains straight to TigerBeetle.
pub struct ReferenceClient {
    clients: Vec<tb::Client>,
    holds: Vec<Hold>,
    next: AtomicUsize,
}

impl ReferenceClient {
    /// Opens `sessions` sessions to the cluster `cluster_id` at `addresses`
    /// (comma-separated); every lease reserves `holds`.
    pub fn connect(
        cluster_id: u128,
        addresses: &str,
        sessions: usize,
        holds: Vec<Hold>,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        assert!(
            sessions >= 1 && !holds.is_empty(),
            "a reference needs a session and a hold"
        );
        let clients = (0..sessions)
            .map(|_| tb::Client::new(cluster_id, addresses))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            clients,
            holds,
            next: AtomicUsize::new(0),
        })
    }

    /// Reserves one fresh lease; panics when TigerBeetle refuses any transfer
    /// (the benchmarks define capacities that are never reached).
    pub async fn reserve(&self) {
        let lease = LeaseId::generate();
        let now_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let holds = self.holds.iter().map(|h| (&h.key, h.amount, h.timeout_seconds));
        let chain = lease_chain(lease, now_unix_ms, holds);
        let session = self.next.fetch_add(1, Ordering::Relaxed) % self.clients.len();
        if let Err(e) = self.clients[session].create_transfers(chain).await {
            panic!("the reference chain of lease {lease} failed: {e:?}");
        }
    }
}
