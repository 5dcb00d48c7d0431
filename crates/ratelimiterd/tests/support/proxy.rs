//! A TCP proxy on loopback in front of one replica, for the tests that cut a
//! server from its cluster: it forwards, black-holes (holds every byte and
//! every new connection, as a network that drops packets while TCP keeps
//! retrying), resets every connection and refuses new ones (a replica
//! restarting, a firewall or balancer flushing connections), resets every
//! connection as soon as it is accepted, or accepts and holds: a black hole
//! that still accepts every new connection and opens one to the replica for
//! it, moving no byte either way (a sidecar or TCP balancer in front of a
//! network that drops packets).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forwards both ways.
    Forward,
    /// Holds every byte and every new connection until forwarding resumes.
    BlackHole,
    /// Holds every byte, but accepts every new connection and connects it to
    /// the replica at once: the replica accepts a connection on which nothing
    /// arrives (and whose close arrives only once bytes flow again).
    AcceptHold,
    /// Resets every connection and closes its port: connections are refused.
    Refuse,
    /// Resets every connection, and every new one as soon as it is accepted.
    Reset,
}

/// A TCP proxy on loopback in front of one replica, on a runtime of its own.
pub struct Proxy {
    /// Where the server connects to reach the replica.
    pub addr: SocketAddr,
    mode: Arc<watch::Sender<Mode>>,
    /// Connections accepted so far.
    accepted: Arc<AtomicU64>,
    _runtime: tokio::runtime::Runtime,
}

impl Proxy {
    /// Starts forwarding to `upstream`.
    pub fn start(upstream: SocketAddr) -> Proxy {
        Self::start_with(upstream, false)
    }

    /// Starts forwarding to `upstream`; with `keeps_upstream`, a connection
    /// the client closes stays open upstream until the replica closes it or
    /// the proxy stops forwarding (as a balancer that does not pass a
    /// half-close on).
    pub fn start_with(upstream: SocketAddr, keeps_upstream: bool) -> Proxy {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("proxy runtime");
        let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0")).expect("proxy port");
        let addr = listener.local_addr().expect("proxy address");
        let mode = Arc::new(watch::Sender::new(Mode::Forward));
        let accepted = Arc::new(AtomicU64::new(0));
        let accepting = Accepting {
            addr,
            upstream,
            keeps_upstream,
            accepted: Arc::clone(&accepted),
        };
        runtime.spawn(accept_loop(listener, accepting, Arc::clone(&mode)));
        Proxy {
            addr,
            mode,
            accepted,
            _runtime: runtime,
        }
    }

    /// Connections the proxy accepted so far (while forwarding or holding).
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Switches what the proxy does with every connection, open or new.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

/// Accepts while forwarding or black-holing; while refusing, the port is closed.
/// What the accept loop needs besides its listener and mode.
struct Accepting {
    addr: SocketAddr,
    upstream: SocketAddr,
    keeps_upstream: bool,
    accepted: Arc<AtomicU64>,
}

async fn accept_loop(mut listener: TcpListener, accepting: Accepting, mode: Arc<watch::Sender<Mode>>) {
    let Accepting {
        addr,
        upstream,
        keeps_upstream,
        accepted: count,
    } = accepting;
    let mut changes = mode.subscribe();
    loop {
        if *changes.borrow_and_update() == Mode::Refuse {
            drop(listener);
            while *changes.borrow_and_update() == Mode::Refuse {
                changes.changed().await.expect("the proxy lives");
            }
            listener = loop {
                match TcpListener::bind(addr).await {
                    Ok(listener) => break listener,
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            };
            continue;
        }
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((client, _)) = accepted {
                    count.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(connection(client, upstream, mode.subscribe(), keeps_upstream));
                }
            }
            _ = changes.changed() => {}
        }
    }
}

/// One proxied connection: connects upstream once forwarding, then pipes.
async fn connection(client: TcpStream, upstream: SocketAddr, mut mode: watch::Receiver<Mode>, keeps_upstream: bool) {
    // Closing with a zero linger sends a reset, as a flushed connection (and
    // does not block: the deprecation is about a lingering close).
    #[allow(deprecated)]
    let _ = client.set_linger(Some(Duration::ZERO));
    if *mode.borrow_and_update() != Mode::AcceptHold && !wait_forwarding(&mut mode).await {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    #[allow(deprecated)]
    let _ = server.set_linger(Some(Duration::ZERO));
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pipe(client_read, server_write, mode.clone(), keeps_upstream),
        pipe(server_read, client_write, mode, false)
    );
}

/// Waits while black-holed; false when the connection must be reset.
async fn wait_forwarding(mode: &mut watch::Receiver<Mode>) -> bool {
    loop {
        match *mode.borrow_and_update() {
            Mode::Forward => return true,
            Mode::Refuse | Mode::Reset => return false,
            Mode::BlackHole | Mode::AcceptHold => {}
        }
        if mode.changed().await.is_err() {
            return false;
        }
    }
}

/// Copies one direction, holding bytes while black-holed; returns (dropping
/// its halves, which resets the connection) when refusing or at end of stream,
/// or, `holds_on_end`, only once the proxy stops forwarding.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    holds_on_end: bool,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        if !wait_forwarding(&mut mode).await {
            return;
        }
        tokio::select! {
            read = from.read(&mut buffer) => {
                let n = match read {
                    Ok(0) if holds_on_end => {
                        // Keeps `to` open until the proxy stops forwarding.
                        while wait_forwarding(&mut mode).await {
                            if mode.changed().await.is_err() {
                                return;
                            }
                        }
                        return;
                    }
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if !wait_forwarding(&mut mode).await || to.write_all(&buffer[..n]).await.is_err() {
                    return;
                }
            }
            _ = mode.changed() => {}
        }
    }
}
