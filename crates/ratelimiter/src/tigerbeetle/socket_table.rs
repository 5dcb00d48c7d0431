//! The kernel's table of this process's TCP sockets that have a peer, which
//! [`super::connections`] counts per replica and the watchdog reads every
//! tick while a session is stalled.
//!
//! It is read over netlink (`NETLINK_SOCK_DIAG`, the interface `ss` uses),
//! asking the kernel for the sockets in every state but `TIME_WAIT` and
//! `LISTEN`. The text table `/proc/self/net/tcp` lists every socket of the
//! network namespace, and a busy host keeps thousands waiting out their
//! close: with 4,400 of them on a loaded 2-core host, reading and parsing it
//! took 0.1–0.9 s (measured), so the watchdog, reading it every tick, saw the
//! network return, and its probe answered, that much late, and its probes
//! under resets lived twice as long as they should. The text table is read
//! only where netlink is refused. Either way only this process's sockets
//! count: those whose inodes are among its open files (`/proc/self/fd`).
//! Elsewhere than Linux there is no table.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
#[cfg(target_os = "linux")]
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The TCP state of a connection both ends have set up (`TCP_ESTABLISHED`).
pub(super) const TCP_ESTABLISHED: u8 = 0x01;
/// The TCP state the kernel writes for a socket that is closed and only
/// waits out its last segments (`TCP_TIME_WAIT`); it holds nothing of the
/// peer and has no inode.
const TCP_TIME_WAIT: u8 = 0x06;
/// The TCP state of a listening socket (`TCP_LISTEN`).
const TCP_LISTEN: u8 = 0x0A;
/// The TCP states asked of the kernel, one bit each: all twelve but
/// `TIME_WAIT` (the bulk of a busy host's table) and `LISTEN`.
const STATES_WANTED: u32 = ((1 << 12) - 1) & !(1 << TCP_TIME_WAIT) & !(1 << TCP_LISTEN);
/// The netlink message type of a request for a dump of sockets
/// (`SOCK_DIAG_BY_FAMILY`, linux/sock_diag.h).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// The length of a netlink message header (`struct nlmsghdr`).
const HEADER_LEN: usize = 16;
/// The length of a dump request's body (`struct inet_diag_req_v2`).
const REQUEST_LEN: usize = 56;
/// The length of one socket of a dump's reply (`struct inet_diag_msg`).
const SOCKET_MESSAGE_LEN: usize = 72;
/// The receive buffer for a dump's replies: the kernel fills it with as many
/// whole messages as fit (about 400 sockets) and the rest follow in the next.
const RECEIVE_BUFFER_BYTES: usize = 32 * 1024;

/// One TCP socket of this process that has a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Socket {
    pub inode: u64,
    pub peer: SocketAddr,
    /// The kernel's TCP state (`TCP_ESTABLISHED`, ...).
    pub state: u8,
}

/// This process's TCP sockets that have a peer, in any state but waiting out
/// their close; `None` where the kernel's table cannot be read.
pub(super) fn own_sockets() -> Option<Vec<Socket>> {
    let ours = own_socket_inodes()?;
    let mut sockets = netlink_sockets().or_else(text_sockets)?;
    sockets.retain(|socket| ours.contains(&socket.inode));
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

/// Netlink's socket diagnostics are Linux's.
#[cfg(not(target_os = "linux"))]
fn netlink_sockets() -> Option<Vec<Socket>> {
    None
}

/// The TCP sockets of the network namespace in [`STATES_WANTED`], IPv4 and
/// IPv6, as the kernel dumps them over netlink; `None` when it refuses.
#[cfg(target_os = "linux")]
fn netlink_sockets() -> Option<Vec<Socket>> {
    let netlink = Netlink::open()?;
    let mut sockets = Vec::new();
    for (sequence, family) in [(1, libc::AF_INET), (2, libc::AF_INET6)] {
        netlink.send(&dump_request(u8::try_from(family).ok()?, sequence))?;
        netlink.receive_dump(&mut sockets)?;
    }
    Some(sockets)
}

/// A request for a dump of the TCP sockets of `family` in [`STATES_WANTED`].
#[cfg(target_os = "linux")]
fn dump_request(family: u8, sequence: u32) -> Vec<u8> {
    let flags = u16::try_from(libc::NLM_F_REQUEST | libc::NLM_F_DUMP).expect("netlink flags fit");
    let mut request = Vec::with_capacity(HEADER_LEN + REQUEST_LEN);
    request.extend_from_slice(&((HEADER_LEN + REQUEST_LEN) as u32).to_ne_bytes());
    request.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    request.extend_from_slice(&flags.to_ne_bytes());
    request.extend_from_slice(&sequence.to_ne_bytes());
    // The kernel is port 0.
    request.extend_from_slice(&0u32.to_ne_bytes());
    let protocol = u8::try_from(libc::IPPROTO_TCP).expect("protocol fits");
    // Family, protocol, no extensions, padding, the states.
    request.extend_from_slice(&[family, protocol, 0, 0]);
    request.extend_from_slice(&STATES_WANTED.to_ne_bytes());
    // Any ports, addresses, interface and cookie.
    request.resize(HEADER_LEN + REQUEST_LEN, 0);
    request
}

/// One socket of a dump's reply (`struct inet_diag_msg`), if it has a peer.
fn parse_socket_message(body: &[u8]) -> Option<Socket> {
    let body = body.get(..SOCKET_MESSAGE_LEN)?;
    let (family, state) = (i32::from(body[0]), body[1]);
    // The socket's id: source port, destination port (big-endian), then the
    // source and destination addresses, 16 bytes each (network order).
    let port = u16::from_be_bytes([body[6], body[7]]);
    let destination = &body[24..40];
    let ip = if family == libc::AF_INET {
        IpAddr::V4(Ipv4Addr::new(
            destination[0],
            destination[1],
            destination[2],
            destination[3],
        ))
    } else {
        let v6 = Ipv6Addr::from(<[u8; 16]>::try_from(destination).ok()?);
        v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
    };
    let inode = u32::from_ne_bytes(body[68..72].try_into().ok()?);
    if inode == 0 || port == 0 {
        return None;
    }
    Some(Socket {
        inode: u64::from(inode),
        peer: SocketAddr::new(ip, port),
        state,
    })
}

/// A netlink socket to the kernel's socket diagnostics, closed when dropped.
#[cfg(target_os = "linux")]
struct Netlink(OwnedFd);

#[cfg(target_os = "linux")]
impl Netlink {
    fn open() -> Option<Self> {
        // SAFETY: socket(2) takes no pointers; a non-negative result is a new
        // descriptor that nothing else owns.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                libc::NETLINK_SOCK_DIAG,
            )
        };
        // SAFETY: see above; the descriptor is owned from here on.
        (fd >= 0).then(|| Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Sends `message` to the kernel (an unconnected netlink socket's peer).
    fn send(&self, message: &[u8]) -> Option<()> {
        // SAFETY: the pointer and length describe `message`, alive for the call.
        let sent = unsafe { libc::send(self.0.as_raw_fd(), message.as_ptr().cast(), message.len(), 0) };
        (usize::try_from(sent).ok()? == message.len()).then_some(())
    }

    /// Receives a dump's replies until its end, adding its sockets to
    /// `sockets`; `None` when the kernel answers with an error. The kernel
    /// writes the dump as it is received, so this never waits on anything
    /// but the kernel.
    fn receive_dump(&self, sockets: &mut Vec<Socket>) -> Option<()> {
        let mut buffer = vec![0u8; RECEIVE_BUFFER_BYTES];
        loop {
            // SAFETY: the pointer and length describe `buffer`, alive and
            // borrowed mutably for the call.
            let received = unsafe { libc::recv(self.0.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len(), 0) };
            let received = usize::try_from(received).ok().filter(|&n| n > 0)?;
            let mut at = 0;
            while at + HEADER_LEN <= received {
                let header = &buffer[at..at + HEADER_LEN];
                let length = u32::from_ne_bytes(header[0..4].try_into().ok()?) as usize;
                let kind = i32::from(u16::from_ne_bytes(header[4..6].try_into().ok()?));
                if length < HEADER_LEN || at + length > received {
                    return None;
                }
                match kind {
                    libc::NLMSG_DONE => return Some(()),
                    libc::NLMSG_ERROR => return None,
                    _ => sockets.extend(parse_socket_message(&buffer[at + HEADER_LEN..at + length])),
                }
                // Messages start on 4-byte boundaries.
                at += length.next_multiple_of(4);
            }
        }
    }
}

/// The text table's sockets (`/proc/self/net/tcp{,6}`): every socket of the
/// network namespace, for a kernel that refuses netlink.
fn text_sockets() -> Option<Vec<Socket>> {
    let mut sockets = Vec::new();
    for file in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        sockets.extend(text.lines().skip(1).filter_map(parse_socket_line));
    }
    Some(sockets)
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

/// An address of the text table: the IP as the kernel's words in host
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
    fn netlink_lists_the_sockets_the_text_table_lists() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
        let peer = listener.local_addr().expect("address");
        let _client = TcpStream::connect(peer).expect("connect");
        let _accepted = listener.accept().expect("accept");
        let closed = TcpStream::connect(peer).expect("connect");
        drop(listener.accept().expect("accept"));
        std::thread::sleep(std::time::Duration::from_millis(50));
        // Other tests of this process open sockets too: compare those to `peer`.
        let to_peer = |sockets: Vec<Socket>| -> HashSet<Socket> {
            sockets.into_iter().filter(|socket| socket.peer == peer).collect()
        };
        let by_netlink = to_peer(netlink_sockets().expect("netlink answers"));
        let by_text = to_peer(text_sockets().expect("the text table"));
        assert_eq!(
            by_netlink.len(),
            2,
            "one established, one its peer closed: {by_netlink:?}"
        );
        assert_eq!(by_netlink, by_text);
        assert!(by_netlink.iter().any(|socket| socket.state == TCP_ESTABLISHED));
        drop(closed);
    }
}
