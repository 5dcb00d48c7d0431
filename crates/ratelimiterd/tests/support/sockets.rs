//! What the kernel knows of the TCP connections on a loopback port, read with
//! `ss` (iproute2): the connections a replica holds (accepted, or completed
//! and waiting in its listening socket's accept queue), the length of that
//! queue, and the connections clients hold to a port. The tests that cut a
//! server from its replica sample these to see what holds the replica's
//! accepts.

use std::process::Command;

/// The connections on one listening port at one moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PortSockets {
    /// Connections whose local end is the port, in any state but listening:
    /// accepted by the process, or completed by the kernel and waiting in the
    /// accept queue.
    pub connections: u64,
    /// Connections completed by the kernel that the process has not accepted
    /// yet (the listening socket's Recv-Q).
    pub accept_queue: u64,
    /// Of [`Self::connections`], those whose peer has closed its side
    /// (CLOSE-WAIT): the process has not read to the end of them yet.
    pub closed_by_peer: u64,
}

/// The lines of `ss -Htan` (every TCP socket, numeric, no header).
fn sockets() -> String {
    let out = Command::new("ss").args(["-Htan"]).output().expect("ss (iproute2) runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The port of a `host:port` column of `ss`.
fn port_of(column: &str) -> Option<u16> {
    column.rsplit(':').next()?.parse().ok()
}

/// What the kernel holds on the listening `port`.
pub fn on_port(port: u16) -> PortSockets {
    let mut seen = PortSockets::default();
    for line in sockets().lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [state, recv_q, _send_q, local, _peer, ..] = fields[..] else {
            continue;
        };
        if port_of(local) != Some(port) {
            continue;
        }
        if state == "LISTEN" {
            seen.accept_queue += recv_q.parse::<u64>().unwrap_or(0);
            continue;
        }
        seen.connections += 1;
        if state == "CLOSE-WAIT" {
            seen.closed_by_peer += 1;
        }
    }
    seen
}

/// Connections clients hold to `port` (their local end elsewhere, the peer
/// `port`), in any state but TIME-WAIT (closed, kept by the kernel only).
pub fn clients_of(port: u16) -> u64 {
    sockets()
        .lines()
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            matches!(fields[..], [state, _, _, _, peer, ..] if state != "TIME-WAIT" && port_of(peer) == Some(port))
        })
        .count() as u64
}
