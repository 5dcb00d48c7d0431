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
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::shutdown::Shutdown;

/// How long a client has to send a request's headers, and so also how long a
/// kept-alive connection may stay idle before the server closes it.
pub const HEADER_READ_TIMEOUT_MS: u64 = 30_000;
/// The pause after a failed accept (out of file descriptors, for instance), so
/// the loop does not spin while the condition lasts.
const ACCEPT_ERROR_BACKOFF_MS: u64 = 50;

/// Serves `router` on `listener` until `shutdown` fires, then closes the
/// listener and gives open connections up to `grace` to finish their requests.
pub async fn serve(listener: TcpListener, router: Router, connections_max: usize, shutdown: Shutdown, grace: Duration) {
    let slots = Arc::new(Semaphore::new(connections_max));
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(HEADER_READ_TIMEOUT_MS))
        .keep_alive(true);
    let stop = shutdown.wait();
    tokio::pin!(stop);
    loop {
        let (tcp, peer) = tokio::select! {
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
        spawn_connection(&builder, &graceful, tcp, peer, router.clone(), slot);
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("every connection closed"),
        () = tokio::time::sleep(grace) => tracing::warn!(grace_ms = grace.as_millis() as u64,
            "grace period over; closing the connections still open"),
    }
}

fn spawn_connection(
    builder: &http1::Builder,
    graceful: &GracefulShutdown,
    tcp: TcpStream,
    peer: SocketAddr,
    router: Router,
    slot: OwnedSemaphorePermit,
) {
    // Answers are small: send them at once rather than wait to fill a packet.
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
    }
    let connection = builder.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(router));
    let connection = graceful.watch(connection);
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(%peer, error = %e, "connection ended with an error");
        }
        drop(slot);
    });
}
