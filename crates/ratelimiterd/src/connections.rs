//! Accepting and serving connections: HTTP/1.1 with keep-alive, at most
//! `server.connections_max` open at once, each with a header read timeout and a
//! write timeout so an idle, slow or non-reading client cannot hold a
//! connection slot for long; at the cap the idle connection of the peer holding
//! the most gives way to the new one ([`crate::connection_table`]); a graceful
//! end lets requests in flight finish. The limiter's listener and the
//! gateway's are both served here.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Router;
use http_body_util::BodyExt;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::connection_table::{Admitted, ConnectionTable, Slot};
use crate::shutdown::Shutdown;
use crate::write_stall::WriteStall;

/// How long a client has to send a request's headers, and so also how long a
/// kept-alive connection may stay idle before the server closes it.
pub const HEADER_READ_TIMEOUT_MS: u64 = 30_000;
/// Connections the kernel queues for `accept` before refusing more (it caps the
/// figure at `net.core.somaxconn`). A fleet opens hundreds of connections at
/// once when it starts or when the server restarts; a connection that finds the
/// queue full loses its SYN and waits a second for the retransmit. With
/// tokio's default of 128, 256 connections opened together cost a reservation
/// benchmark a p99 of 0.7 s from the due time (BENCHMARKS.md, issue 4).
pub const LISTEN_BACKLOG: u32 = 4096;
/// How long a write to the limiter's clients may stay blocked: its answers are
/// small, so a client that has not read one in 10 s stopped reading (it
/// pipelines requests and never reads, for instance) and is disconnected.
pub const WRITE_STALL_TIMEOUT_MS: u64 = 10_000;
/// The pause after a failed accept (out of file descriptors, for instance), so
/// the loop does not spin while the condition lasts.
const ACCEPT_ERROR_BACKOFF_MS: u64 = 50;
/// How often, at most, each kind of connection trouble (failed accepts,
/// connections refused or replaced at the cap) is logged: a flood costs one
/// line per interval, with the count of what it stands for.
const TROUBLE_LOG_INTERVAL_MS: u64 = 10_000;

/// A listener on `addr` with a queue of [`LISTEN_BACKLOG`] connections; needs a
/// tokio runtime. Like tokio's own `bind`, it reuses the address of a recently
/// closed listener (`SO_REUSEADDR`), so a restart can bind at once.
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// How long a client may take: to send a request's headers (and to stay idle
/// between requests), and to read what is written to it.
#[derive(Debug, Clone, Copy)]
pub struct ClientTimeouts {
    /// The header read timeout.
    pub header_read: Duration,
    /// How long a write may stay blocked; `None`: no bound.
    pub write_stall: Option<Duration>,
}

impl Default for ClientTimeouts {
    fn default() -> Self {
        Self {
            header_read: Duration::from_millis(HEADER_READ_TIMEOUT_MS),
            write_stall: Some(Duration::from_millis(WRITE_STALL_TIMEOUT_MS)),
        }
    }
}

impl ClientTimeouts {
    /// The limiter listener's timeouts (`server.client_header_timeout_ms` and
    /// `server.client_write_timeout_ms`). Takes the values rather than the
    /// configuration, whose defaults are this module's constants: the two
    /// modules do not import each other.
    pub fn of_server(header_timeout_ms: u64, write_timeout_ms: u64) -> Self {
        Self {
            header_read: Duration::from_millis(header_timeout_ms),
            write_stall: Some(Duration::from_millis(write_timeout_ms)),
        }
    }
}

/// A warning logged at most once per [`TROUBLE_LOG_INTERVAL_MS`], with the
/// number of occurrences it stands for.
#[derive(Debug)]
struct BoundedWarning {
    what: &'static str,
    last: Mutex<Option<Instant>>,
    unlogged: AtomicU64,
}

impl BoundedWarning {
    const fn new(what: &'static str) -> Self {
        Self {
            what,
            last: Mutex::new(None),
            unlogged: AtomicU64::new(0),
        }
    }

    /// Counts one occurrence; logs it with the ones since the last line when
    /// the interval has passed.
    fn occurred(&self, detail: &dyn std::fmt::Display) {
        let count = self.unlogged.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = self.last.lock().expect("warning lock poisoned");
        let due = last.is_none_or(|at| at.elapsed() >= Duration::from_millis(TROUBLE_LOG_INTERVAL_MS));
        if due {
            *last = Some(Instant::now());
            self.unlogged.fetch_sub(count, Ordering::Relaxed);
            tracing::warn!(count, last = %detail, "{}", self.what);
        }
    }
}

/// Serves `router` on `listener` until `shutdown` fires, then closes the
/// listener and gives open connections up to `grace` to finish their requests.
pub async fn serve(listener: TcpListener, router: Router, connections_max: usize, shutdown: Shutdown, grace: Duration) {
    let timeouts = ClientTimeouts::default();
    serve_with(listener, router, connections_max, timeouts, shutdown, grace).await;
}

/// [`serve`] with the clients' timeouts of `timeouts`.
pub async fn serve_with(
    listener: TcpListener,
    router: Router,
    connections_max: usize,
    timeouts: ClientTimeouts,
    shutdown: Shutdown,
    grace: Duration,
) {
    let table = ConnectionTable::new(connections_max);
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_read)
        .keep_alive(true);
    let accept_failed = BoundedWarning::new("accept failed");
    let refused = BoundedWarning::new("connections refused: every connection is serving a request");
    let replaced = BoundedWarning::new("idle connections closed to make room for new ones (connections_max)");
    let stop = shutdown.wait();
    tokio::pin!(stop);
    loop {
        let (tcp, peer): (TcpStream, SocketAddr) = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    accept_failed.occurred(&e);
                    tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_BACKOFF_MS)).await;
                    continue;
                }
            },
        };
        // Full of connections serving requests: close at once; queueing would
        // only move the wait into the kernel's backlog, where the client cannot see it.
        let slot = match table.admit(peer.ip()) {
            Some(Admitted::Room(slot)) => slot,
            Some(Admitted::Replaced(slot, closed_peer)) => {
                replaced.occurred(&format_args!("for {peer}, of {closed_peer}"));
                slot
            }
            None => {
                refused.occurred(&format_args!("{peer} (connections_max {connections_max})"));
                continue;
            }
        };
        // Answers are small: send them at once rather than wait to fill a packet.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
        }
        match timeouts.write_stall {
            None => spawn_connection(&builder, &graceful, tcp, peer, router.clone(), slot),
            Some(timeout) => spawn_connection(
                &builder,
                &graceful,
                WriteStall::new(tcp, timeout),
                peer,
                router.clone(),
                slot,
            ),
        }
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("every connection closed"),
        () = tokio::time::sleep(grace) => tracing::warn!(grace_ms = grace.as_millis() as u64,
            "grace period over; closing the connections still open"),
    }
}

/// Serves one connection until it ends, or until another takes its place in
/// the table ([`ConnectionTable::admit`]). Each request marks the connection
/// busy until its answer's body is dropped.
fn spawn_connection<T>(
    builder: &http1::Builder,
    graceful: &GracefulShutdown,
    tcp: T,
    peer: SocketAddr,
    router: Router,
    slot: Slot,
) where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let inner = TowerToHyperService::new(router);
    let (connection, table) = (slot.connection().clone(), slot.table().clone());
    let service = hyper::service::service_fn(move |request| {
        let busy = connection.busy(&table);
        let call = hyper::service::Service::call(&inner, request);
        async move {
            let response = call.await?;
            Ok::<_, std::convert::Infallible>(response.map(|body| {
                // The guard lives as long as the body: a streamed answer keeps
                // its connection busy to its last byte.
                axum::body::Body::new(body.map_frame(move |frame| {
                    let _keep_busy = &busy;
                    frame
                }))
            }))
        }
    });
    let served = builder.serve_connection(TokioIo::new(tcp), service);
    let served = graceful.watch(served);
    tokio::spawn(async move {
        tokio::select! {
            result = served => if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            },
            () = slot.connection().closed() => tracing::debug!(%peer, "idle connection closed for a new one"),
        }
        drop(slot);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Longer than a connect takes when the kernel queues it, shorter than the
    /// second a dropped SYN waits for its retransmit.
    const CONNECT_TIMEOUT_MS: u64 = 900;

    /// How many connections the kernel lets wait here: ours, or `somaxconn`
    /// where that is lower (then the test cannot tell, but still must pass).
    fn queued_max() -> usize {
        let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|text| text.trim().parse::<usize>().ok())
            .unwrap_or(LISTEN_BACKLOG as usize);
        somaxconn.min(LISTEN_BACKLOG as usize)
    }

    #[tokio::test]
    async fn hundreds_of_connections_opened_at_once_wait_in_the_queue_not_for_a_retransmit() {
        let listener = listen(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let addr = listener.local_addr().unwrap();
        // Nothing accepts: every connection has to fit in the kernel's queue,
        // as when a fleet connects faster than the accept loop runs. 300 is
        // over tokio's default queue of 128.
        let connections = 300.min(queued_max());
        let connected = tokio::task::spawn_blocking(move || {
            let timeout = Duration::from_millis(CONNECT_TIMEOUT_MS);
            let threads: Vec<_> = (0..connections)
                .map(|_| std::thread::spawn(move || std::net::TcpStream::connect_timeout(&addr, timeout)))
                .collect();
            let streams: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            streams.iter().filter(|stream| stream.is_ok()).count()
        })
        .await
        .unwrap();
        assert_eq!(connected, connections, "every connection was queued at once");
        drop(listener);
    }
}
