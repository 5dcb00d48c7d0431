//! The OTLP export never in a call's way, through the real `ratelimiterd`
//! binary (docs/observability.md, "Never in a call's way"): a collector that
//! answers 503 and one that is down slow no call against the same calls with
//! export off, and what was dropped or failed is counted by signal in
//! `ratelimiterd_otel_dropped_total` on the Prometheus endpoint.

#[path = "telemetry_support/rig.rs"]
mod rig;
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use rig::{as_env, call, start_server, start_shapes, KEY_ENV};
use serde_json::json;
use support::gateway_setup::{client, gateway_addr, send, HttpClient};
use support::{temp_dir, Daemon};

/// Calls made on each server.
const CALLS: u8 = 20;
/// How long the counters may take to rise: exports are tried every 50 to 100 ms here.
const COUNT_WAIT: Duration = Duration::from_secs(20);

/// One served model on `upstream`.
fn section(upstream: SocketAddr) -> String {
    format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: ok, kind: openai, base_url: \"http://{upstream}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: ok, rpm: 100000, tpm: 100000000, max_output_tokens_default: 64}}\n  tenants:\n    - {{name: team, api_key_env: {KEY_ENV}}}\n"
    )
}

/// A collector that refuses every export with a 503.
async fn start_refusing_collector() -> SocketAddr {
    let router = Router::new()
        .route("/v1/traces", post(|| async { StatusCode::SERVICE_UNAVAILABLE }))
        .route("/v1/metrics", post(|| async { StatusCode::SERVICE_UNAVAILABLE }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

/// A loopback address nothing listens on.
async fn down_collector() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// How long [`CALLS`] chat calls on `server` take, each answered 200.
async fn time_calls(client: &HttpClient, server: &Daemon) -> Duration {
    let gateway = gateway_addr(server);
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]});
    let started = Instant::now();
    for n in 0..CALLS {
        let (_, answer) = call(client, gateway, ("/v1/chat/completions", body.clone()), n).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    started.elapsed()
}

/// The server's `ratelimiterd_otel_dropped_total` of `signal`.
async fn dropped(client: &HttpClient, server: &Daemon, signal: &str) -> u64 {
    let text = send(
        client,
        hyper::Method::GET,
        format!("http://{}/metrics", server.addr),
        &[],
        None,
    )
    .await;
    let line = format!("ratelimiterd_otel_dropped_total{{signal=\"{signal}\"}} ");
    let value = text
        .body
        .lines()
        .find_map(|l| l.strip_prefix(line.as_str()).map(str::to_owned));
    value
        .unwrap_or_else(|| panic!("no {line}in:\n{}", text.body))
        .parse()
        .unwrap()
}

/// Waits (bounded) until the server has counted at least `least` lost items of `signal`.
async fn dropped_at_least(client: &HttpClient, server: &Daemon, signal: &str, least: u64) {
    let started = Instant::now();
    loop {
        let count = dropped(client, server, signal).await;
        if count >= least {
            return;
        }
        assert!(started.elapsed() < COUNT_WAIT, "{signal}: {count} dropped, not {least}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_a_refusing_or_down_collector_slows_no_call_and_is_counted() {
    let (upstream, _) = start_shapes(StatusCode::OK, Duration::ZERO).await;
    let client = client();
    let dir = temp_dir("telemetry-export-off");
    let off = start_server(&dir, &section(upstream), &[]);
    time_calls(&client, &off).await; // warms the connections
    let baseline = time_calls(&client, &off).await;
    assert_eq!(dropped(&client, &off, "traces").await, 0);
    let refusing = format!("http://{}", start_refusing_collector().await);
    let down = format!("http://{}", down_collector().await);
    let collectors = [
        // Exports tried every 50 ms: each refused batch and metrics export is counted.
        (refusing, "5000"),
        // A queue of 4 spans that a 60 s batch period never empties: the calls'
        // spans find it full and are dropped at once.
        (down, "4"),
    ];
    for (endpoint, queue) in collectors {
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
            (
                "OTEL_BSP_SCHEDULE_DELAY",
                if queue == "4" { "60000" } else { "50" }.to_owned(),
            ),
            ("OTEL_BSP_MAX_QUEUE_SIZE", queue.to_owned()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "100".to_owned()),
        ];
        let dir = temp_dir("telemetry-export-lost");
        let server = start_server(&dir, &section(upstream), &as_env(&env));
        time_calls(&client, &server).await;
        let took = time_calls(&client, &server).await;
        // Generous: a call waiting on an export would wait for its connection
        // or a 503 each time; the same calls with export off set the pace.
        let bound = baseline * 3 + Duration::from_millis(500);
        assert!(
            took < bound,
            "{endpoint}: {took:?} against {baseline:?} with export off"
        );
        // Two spans a call: at least all but the queue's 4 of the 80 spans of the
        // first 40 calls are lost, and the metrics' exports fail.
        dropped_at_least(&client, &server, "traces", 4 * u64::from(CALLS) - 4).await;
        dropped_at_least(&client, &server, "metrics", 1).await;
    }
}
