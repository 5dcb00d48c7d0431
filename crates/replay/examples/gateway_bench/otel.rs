//! `--otel on|down` (gateway_bench.rs): the new server exports every call's
//! trace (sampler `always_on`, ratio 1.0) and the GenAI metrics over OTLP/HTTP,
//! to a sink in the bench's process that takes every export and answers 200
//! (`on`), or to a port where nothing listens (`down`: a collector that is
//! away). The baseline server is started without any of it, so running the
//! same build as `--baseline-bin` measures what the export costs a call.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::StatusCode;

/// Where the new server's export goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Otel {
    /// No export (the default).
    Off,
    /// To the sink.
    On,
    /// To a port where nothing listens.
    Down,
}

impl Otel {
    /// The flag's value.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "off" => Some(Self::Off),
            "on" => Some(Self::On),
            "down" => Some(Self::Down),
            _ => None,
        }
    }
}

/// What the sink took: exports and their bytes.
#[derive(Debug, Default)]
pub struct Received {
    /// Export requests answered.
    pub requests: AtomicU64,
    /// Their bodies' bytes.
    pub bytes: AtomicU64,
}

/// The environment of the new server for `otel`, and the sink's counts (`on`).
pub fn environment(otel: Otel) -> (Vec<(String, String)>, Option<Arc<Received>>) {
    let (endpoint, received) = match otel {
        Otel::Off => return (Vec::new(), None),
        Otel::On => {
            let received = Arc::new(Received::default());
            (format!("http://{}", start_sink(received.clone())), Some(received))
        }
        Otel::Down => (format!("http://127.0.0.1:{}", super::bench_support::free_port()), None),
    };
    let variables = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_TRACES_SAMPLER", "always_on"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "5000"),
    ];
    let variables = variables.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    (variables, received)
}

/// Starts the sink on a thread of its own (its own runtime: the bench's
/// workers stay the load generator's); returns its address.
fn start_sink(received: Arc<Received>) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = listener.local_addr().expect("bound");
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            let app = axum::Router::new().fallback(move |body: Bytes| {
                let received = received.clone();
                async move {
                    received.requests.fetch_add(1, Ordering::Relaxed);
                    received.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                    // An empty Export*ServiceResponse: everything accepted.
                    (
                        StatusCode::OK,
                        [("content-type", "application/x-protobuf")],
                        Bytes::new(),
                    )
                }
            });
            axum::serve(listener, app).await.expect("the sink serves");
        });
    });
    addr
}
