//! The open connections of a listener, and which one gives way at the cap
//! (docs/http-api.md, "Connections"). A connection is idle while it serves no
//! request: before its first, between two on keep-alive, or while its client
//! trickles headers. At `connections_max`, a new connection closes the idle one
//! of the peer holding the most connections, idle the longest, as Envoy's
//! overload manager and nginx's `reset_timedout_connection` make room: a flood
//! of idle connections then costs the flooder its own connections, and
//! `/healthz` and the API keep answering. A connection serving a request is
//! never closed for another; when every one is busy, the new one is refused.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

/// One open connection.
#[derive(Debug)]
pub struct Connection {
    peer: IpAddr,
    /// Requests in progress (pipelined ones count once each).
    busy: AtomicUsize,
    /// When it last became idle, in ms since the table's start.
    idle_since_ms: AtomicU64,
    /// Fired when another connection takes its place.
    close: Notify,
}

impl Connection {
    /// Marks a request in progress until the returned guard is dropped (with
    /// the answer's body, so a streamed answer keeps its connection busy).
    pub fn busy(self: &Arc<Self>, table: &ConnectionTable) -> Busy {
        self.busy.fetch_add(1, Ordering::AcqRel);
        Busy {
            connection: self.clone(),
            started: table.started,
        }
    }

    /// Resolves when the connection was chosen to give way.
    pub async fn closed(&self) {
        self.close.notified().await;
    }
}

/// A request in progress on a connection; dropping it ends the request.
#[derive(Debug)]
pub struct Busy {
    connection: Arc<Connection>,
    started: Instant,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let now_ms = self.started.elapsed().as_millis() as u64;
        self.connection.idle_since_ms.store(now_ms, Ordering::Release);
        self.connection.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The connections of one listener, at most `connections_max`.
#[derive(Debug)]
pub struct ConnectionTable {
    connections_max: usize,
    started: Instant,
    inner: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    next_id: u64,
    by_id: HashMap<u64, Arc<Connection>>,
    per_peer: HashMap<IpAddr, usize>,
}

impl Open {
    fn remove(&mut self, id: u64) -> Option<Arc<Connection>> {
        let connection = self.by_id.remove(&id)?;
        if let Some(count) = self.per_peer.get_mut(&connection.peer) {
            *count -= 1;
            if *count == 0 {
                self.per_peer.remove(&connection.peer);
            }
        }
        Some(connection)
    }

    /// The idle connection to close for a new one: of the peer with the most
    /// connections, idle the longest. `None` when every one serves a request.
    fn victim(&self) -> Option<u64> {
        let idle = self.by_id.iter().filter(|(_, c)| c.busy.load(Ordering::Acquire) == 0);
        idle.min_by_key(|(_, c)| {
            let held = self.per_peer.get(&c.peer).copied().unwrap_or(0);
            (std::cmp::Reverse(held), c.idle_since_ms.load(Ordering::Acquire))
        })
        .map(|(&id, _)| id)
    }
}

/// A connection's place in the table, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    table: Arc<ConnectionTable>,
    id: u64,
    connection: Arc<Connection>,
}

impl Slot {
    /// The connection this slot holds.
    pub fn connection(&self) -> &Arc<Connection> {
        &self.connection
    }

    /// The table it belongs to.
    pub fn table(&self) -> &Arc<ConnectionTable> {
        &self.table
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.table.locked().remove(self.id);
    }
}

/// What admitting a connection did.
#[derive(Debug)]
pub enum Admitted {
    /// There was room.
    Room(Slot),
    /// The table was full: this idle connection (of this peer) was closed.
    Replaced(Slot, IpAddr),
}

impl ConnectionTable {
    /// An empty table for at most `connections_max` connections (at least 1).
    pub fn new(connections_max: usize) -> Arc<Self> {
        assert!(connections_max >= 1, "room for one connection");
        Arc::new(Self {
            connections_max,
            started: Instant::now(),
            inner: Mutex::new(Open::default()),
        })
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, Open> {
        self.inner.lock().expect("connection table lock poisoned")
    }

    /// How many connections are open.
    pub fn len(&self) -> usize {
        self.locked().by_id.len()
    }

    /// True when no connection is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A place for a new connection from `peer`: free, or taken from the idle
    /// connection that gives way ([`Open::victim`]); `None` when the table is
    /// full of connections serving requests.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Admitted> {
        let mut open = self.locked();
        let mut replaced = None;
        if open.by_id.len() >= self.connections_max {
            let victim = open.victim()?;
            let closed = open.remove(victim).expect("the victim is open");
            closed.close.notify_one();
            replaced = Some(closed.peer);
        }
        let id = open.next_id;
        open.next_id += 1;
        let connection = Arc::new(Connection {
            peer,
            busy: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(self.started.elapsed().as_millis() as u64),
            close: Notify::new(),
        });
        open.by_id.insert(id, connection.clone());
        *open.per_peer.entry(peer).or_insert(0) += 1;
        let slot = Slot {
            table: self.clone(),
            id,
            connection,
        };
        Some(match replaced {
            None => Admitted::Room(slot),
            Some(peer) => Admitted::Replaced(slot, peer),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn slot(admitted: Option<Admitted>) -> Slot {
        match admitted.expect("admitted") {
            Admitted::Room(slot) | Admitted::Replaced(slot, _) => slot,
        }
    }

    #[tokio::test]
    async fn at_the_cap_the_flooders_longest_idle_connection_gives_way_never_a_busy_one() {
        let table = ConnectionTable::new(3);
        let client = slot(table.admit(ip(1)));
        let flood_old = slot(table.admit(ip(2)));
        std::thread::sleep(std::time::Duration::from_millis(5));
        let flood_new = slot(table.admit(ip(2)));
        // The client is idle the longest, but the flooder holds more.
        let Some(Admitted::Replaced(_fresh, peer)) = table.admit(ip(3)) else {
            panic!("replaced");
        };
        assert_eq!(peer, ip(2));
        tokio::time::timeout(std::time::Duration::from_secs(1), flood_old.connection().closed())
            .await
            .expect("the flooder's oldest idle connection was told to close");
        assert_eq!(table.len(), 3);
        drop(flood_old);
        assert_eq!(table.len(), 3, "a closed victim's slot was already given");
        let _serving = [client.connection().busy(&table), flood_new.connection().busy(&table)];
        let _ = &_fresh;
        // Only the fresh connection is idle now: it gives way.
        assert!(matches!(table.admit(ip(4)), Some(Admitted::Replaced(_, peer)) if peer == ip(3)));
    }

    #[test]
    fn a_table_full_of_busy_connections_refuses() {
        let table = ConnectionTable::new(1);
        let only = slot(table.admit(ip(1)));
        let busy = only.connection().busy(&table);
        assert!(table.admit(ip(2)).is_none());
        drop(busy);
        assert!(table.admit(ip(2)).is_some(), "idle again: it gives way");
    }
}
