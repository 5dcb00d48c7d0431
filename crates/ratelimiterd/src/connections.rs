//! Accepting and serving connections: HTTP/1.1 with keep-alive, at most
//! `server.connections_max` open at once, each with a header read timeout so an
//! idle or slow client cannot hold a connection slot forever, and a graceful end
//! that lets requests in flight finish.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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
/// The pause after a failed accept (out of file descriptors, for instance), so
/// the loop does not spin while the condition lasts.
const ACCEPT_ERROR_BACKOFF_MS: u64 = 50;

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
    /// How long a write may stay blocked; `None`: no bound (the limiter API's
    /// answers are small and fit the socket's buffer).
    pub write_stall: Option<Duration>,
}

impl Default for ClientTimeouts {
    fn default() -> Self {
        Self {
            header_read: Duration::from_millis(HEADER_READ_TIMEOUT_MS),
            write_stall: None,
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
    let slots = Arc::new(Semaphore::new(connections_max));
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_read)
        .keep_alive(true);
    let stop = shutdown.wait();
    tokio::pin!(stop);
    loop {
        let (tcp, peer): (TcpStream, SocketAddr) = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_BACKOFF_MS)).await;
                    continue;
                }
            },
        };
        // Over the limit, close at once: queueing would only move the wait into
        // the kernel's backlog, where the client cannot see it.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%peer, connections_max, "connection refused: too many open connections");
            continue;
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

fn spawn_connection<T>(
    builder: &http1::Builder,
    graceful: &GracefulShutdown,
    tcp: T,
    peer: SocketAddr,
    router: Router,
    slot: OwnedSemaphorePermit,
) where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let connection = builder.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(router));
    let connection = graceful.watch(connection);
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(%peer, error = %e, "connection ended with an error");
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
