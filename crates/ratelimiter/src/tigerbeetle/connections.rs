//! The TCP connections this process holds to each replica, as the kernel
//! lists them: the client library opens and closes its connections by itself
//! (one per replica per client, again after every failure, with its own
//! backoff), so the only account of them that cannot be wrong is the
//! kernel's. A replica serves a bounded number of connections and stops
//! accepting while they are all taken (TigerBeetle 0.16, `message_bus.zig`:
//! `connections_max` = replicas − 1 + `clients_limit`), so what a server
//! holds, and what it opened while cut off, is what an operator must see
//! (docs/tigerbeetle-backend.md, "Connections").
//!
//! The same reading tells the watchdog whether the network holds connections
//! open (a connection of ours to a replica is established) without opening
//! one to find out: a connection opened only to look, then closed, is one a
//! proxy that accepts during a black hole holds open at the replica, taking
//! one of its connection slots until bytes flow again.
//!
//! The table is read as [`super::socket_table`] says (netlink on Linux, a
//! millisecond however many sockets the host holds); where it cannot be
//! read nothing is counted and no connection is ever seen held.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::socket_table::{self, TCP_ESTABLISHED};

/// What this process holds to one replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaConnectionCounts {
    /// The replica's address, as configured (resolved).
    pub replica: SocketAddr,
    /// Connections open now (any state but closed).
    pub open: u64,
    /// Connections seen opened since the start.
    pub opened: u64,
    /// Of those, the ones opened while a session was stalled (cut off).
    pub opened_cut_off: u64,
    /// Connections seen closed since the start.
    pub closed: u64,
}

/// The tally of one replica between two readings of the kernel's table.
#[derive(Debug)]
struct Tally {
    replica: SocketAddr,
    /// Socket inodes open at the last reading.
    known: Mutex<HashSet<u64>>,
    open: AtomicU64,
    opened: AtomicU64,
    opened_cut_off: AtomicU64,
    closed: AtomicU64,
}

/// What one reading of the kernel's table found, all replicas together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    /// Connections open now.
    pub open: u64,
    /// True when a connection is established: the network holds connections
    /// open (a replica that listens, a slow cluster, a black hole, a proxy),
    /// rather than resetting or refusing them (a connection reset as it is
    /// accepted is established for a moment only, and a refused or dropped
    /// one never).
    pub held: bool,
    /// Connections seen closed since the previous reading.
    pub closed: u64,
}

/// The connections this process holds to each replica of a cluster, counted
/// from the kernel's table each time [`ReplicaConnections::read`] runs.
#[derive(Debug)]
pub struct ReplicaConnections {
    tallies: Vec<Tally>,
}

impl ReplicaConnections {
    /// Counts connections to `replicas`.
    pub fn new(replicas: &[SocketAddr]) -> Self {
        let tallies = (replicas.iter())
            .map(|&replica| Tally {
                replica,
                known: Mutex::new(HashSet::new()),
                open: AtomicU64::new(0),
                opened: AtomicU64::new(0),
                opened_cut_off: AtomicU64::new(0),
                closed: AtomicU64::new(0),
            })
            .collect();
        Self { tallies }
    }

    /// Reads the kernel's table: a connection not seen before counts as
    /// opened (and as opened while cut off when `cut_off`), one seen before
    /// and gone as closed. Returns the connections open now, all replicas
    /// together. A connection that opens and closes between two readings is
    /// not seen.
    pub fn read(&self, cut_off: bool) -> Reading {
        let Some(table) = socket_table::own_sockets() else {
            return Reading::default();
        };
        let mut reading = Reading::default();
        for tally in &self.tallies {
            let ours = || table.iter().filter(|socket| socket.peer == tally.replica);
            let open: HashSet<u64> = ours().map(|socket| socket.inode).collect();
            let mut known = tally.known.lock().expect("connections lock");
            let opened = open.difference(&known).count() as u64;
            let closed = known.difference(&open).count() as u64;
            tally.opened.fetch_add(opened, Ordering::Relaxed);
            if cut_off {
                tally.opened_cut_off.fetch_add(opened, Ordering::Relaxed);
            }
            tally.closed.fetch_add(closed, Ordering::Relaxed);
            tally.open.store(open.len() as u64, Ordering::Relaxed);
            reading.open += open.len() as u64;
            reading.closed += closed;
            reading.held |= ours().any(|socket| socket.state == TCP_ESTABLISHED);
            *known = open;
        }
        reading
    }

    /// The counts of every replica, as of the last reading.
    pub fn counts(&self) -> Vec<ReplicaConnectionCounts> {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        (self.tallies.iter())
            .map(|t| ReplicaConnectionCounts {
                replica: t.replica,
                open: load(&t.open),
                opened: load(&t.opened),
                opened_cut_off: load(&t.opened_cut_off),
                closed: load(&t.closed),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[cfg(target_os = "linux")]
    #[test]
    fn connections_to_a_replica_are_counted_opened_and_closed_as_the_kernel_lists_them() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
        let replica = listener.local_addr().expect("address");
        let other = TcpListener::bind("127.0.0.1:0").expect("another port");
        let connections = ReplicaConnections::new(&[replica]);
        assert_eq!(connections.read(false).open, 0);

        let first = TcpStream::connect(replica).expect("connect");
        let second = TcpStream::connect(replica).expect("connect");
        let _elsewhere = TcpStream::connect(other.local_addr().expect("address")).expect("connect");
        let reading = connections.read(true);
        assert_eq!(reading.open, 2, "only the replica's, and only ours");
        assert!(reading.held, "established");
        drop(first);
        let reading = connections.read(false);
        assert_eq!(reading.open, 1);
        assert!(reading.held, "the second is still established");
        let counts = &connections.counts()[0];
        assert_eq!(
            (counts.open, counts.opened, counts.opened_cut_off, counts.closed),
            (1, 2, 2, 1)
        );
        drop(second);
        let reading = connections.read(false);
        assert_eq!((reading.open, reading.held), (0, false));
        let counts = &connections.counts()[0];
        assert_eq!((counts.open, counts.opened, counts.closed), (0, 2, 2));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_connection_its_peer_closed_is_not_held_and_one_it_keeps_is() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
        let replica = listener.local_addr().expect("address");
        let connections = ReplicaConnections::new(&[replica]);
        let closed = TcpStream::connect(replica).expect("connect");
        drop(listener.accept().expect("accept"));
        // Our end stays open, its peer gone: not a connection the network holds.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let reading = connections.read(true);
        assert_eq!((reading.open, reading.held), (1, false));
        let _kept = TcpStream::connect(replica).expect("connect");
        let _accepted = listener.accept().expect("accept");
        assert!(connections.read(true).held);
        drop(closed);
    }
}
