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
//! one to find out: a connection opened
//! only to look, then closed, is one a proxy that accepts during a black
//! hole holds open at the replica, taking one of its connection slots until
//! bytes flow again.
//!
//! On Linux the table is read from `/proc/self/fd` (this process's socket
//! inodes) and `/proc/self/net/tcp{,6}` (every socket of its network
//! namespace with its inode, peer and state); elsewhere nothing is counted
//! and no connection is ever seen held.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The TCP state of a connection both ends have set up (`TCP_ESTABLISHED`).
const TCP_ESTABLISHED: u8 = 0x01;
/// The TCP state the kernel writes for a socket that is closed and only
/// waits out its last segments (`TCP_TIME_WAIT`); it holds nothing of the
/// peer and has no inode.
const TCP_TIME_WAIT: u8 = 0x06;
/// The TCP state of a listening socket (`TCP_LISTEN`).
const TCP_LISTEN: u8 = 0x0A;

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
        let Some(table) = kernel_table() else {
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

/// One TCP socket of this process that has a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Socket {
    inode: u64,
    peer: SocketAddr,
    /// The kernel's TCP state (`TCP_ESTABLISHED`, ...).
    state: u8,
}

/// This process's TCP sockets that have a peer; `None` where the kernel's
/// table cannot be read (not Linux).
fn kernel_table() -> Option<Vec<Socket>> {
    let ours = own_socket_inodes()?;
    let mut sockets = Vec::new();
    for file in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        sockets.extend(
            text.lines()
                .skip(1)
                .filter_map(parse_socket_line)
                .filter(|socket| ours.contains(&socket.inode)),
        );
    }
    Some(sockets)
}

/// The inodes of the sockets among this process's open files.
fn own_socket_inodes() -> Option<HashSet<u64>> {
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    Some(
        entries
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter_map(|target| {
                let target = target.to_str()?;
                target.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
            })
            .collect(),
    )
}

/// One line of `/proc/net/tcp{,6}`, for a socket that has a peer (not
/// listening, not waiting out its close).
fn parse_socket_line(line: &str) -> Option<Socket> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
    let peer = parse_address(fields.get(2)?)?;
    let state = u8::from_str_radix(fields.get(3)?, 16).ok()?;
    let inode: u64 = fields.get(9)?.parse().ok()?;
    if state == TCP_TIME_WAIT || state == TCP_LISTEN || inode == 0 {
        return None;
    }
    Some(Socket { inode, peer, state })
}

/// An address of the kernel's table: the IP as the kernel's words in host
/// order, printed in hex, then `:` and the port in hex.
fn parse_address(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.to_ne_bytes())),
        32 => {
            let mut bytes = [0u8; 16];
            for (word, chunk) in bytes.chunks_mut(4).enumerate() {
                let value = u32::from_str_radix(ip.get(word * 8..word * 8 + 8)?, 16).ok()?;
                chunk.copy_from_slice(&value.to_ne_bytes());
            }
            let v6 = Ipv6Addr::from(bytes);
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn the_kernels_address_format_is_read_on_this_host() {
        let localhost = SocketAddr::from(([127, 0, 0, 1], 3000));
        // 127.0.0.1 is the host-order word 0x0100007F on a little-endian host.
        let word = u32::from_ne_bytes([127, 0, 0, 1]);
        assert_eq!(parse_address(&format!("{word:08X}:0BB8")), Some(localhost));
        assert_eq!(parse_address("zz:0BB8"), None);
    }

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
