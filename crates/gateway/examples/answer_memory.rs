//! Memory per call for large non-stream answers, measured (BENCHMARKS.md,
//! "Gateway: memory per call"): the peak of live heap bytes while answers pass
//! through the gateway to clients that read them, against the reference of the
//! same answers collected whole (what a gateway that buffers an answer to read
//! its usage holds), in one run, one process, by a counting allocator.
//!
//! `cargo run --release -p gateway --example answer_memory [-- <MB per answer> <calls at once>]`

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use axum::routing;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Live heap bytes, and their peak since the last reset.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        pointer
    }
    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        unsafe { System.dealloc(pointer, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The chunk the provider writes at a time.
const CHUNK_BYTES: usize = 64 * 1024;

/// An embeddings answer of `bytes`, made as it is sent, its usage at the end.
fn answer(bytes: usize) -> Response {
    let head = Bytes::from_static(b"{\"object\":\"list\",\"data\":[{\"embedding\":[0.1");
    let tail = Bytes::from_static(b"]}],\"usage\":{\"prompt_tokens\":3,\"total_tokens\":3}}");
    let chunk = Bytes::from(",0.1".repeat(CHUNK_BYTES / 4));
    let parts = std::iter::once(head)
        .chain(std::iter::repeat_n(chunk, bytes / CHUNK_BYTES))
        .chain([tail])
        .map(Ok::<_, std::io::Error>);
    let mut response = Response::new(Body::from_stream(futures_util::stream::iter(parts)));
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// Posts an embeddings call to `addr`; reads the answer chunk by chunk
/// (`keep: false`, what an SDK streaming to disk does) or whole (`keep: true`).
async fn call(client: &HttpClient, addr: SocketAddr, keep: bool) -> usize {
    let body = Bytes::from_static(br#"{"model":"embed","input":"hello"}"#);
    let request = hyper::Request::post(format!("http://{addr}/v1/embeddings"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer answer-memory-key-0123456789")
        .body(Full::new(body))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    if keep {
        return body.collect().await.unwrap().to_bytes().len();
    }
    let mut received = 0;
    while let Some(frame) = body.frame().await {
        received += frame.unwrap().into_data().map_or(0, |d| d.len());
    }
    received
}

/// The peak of live heap bytes above the baseline while `calls` calls run at once.
async fn peak_over_baseline(client: &HttpClient, addr: SocketAddr, calls: usize, keep: bool) -> (usize, usize) {
    let baseline = LIVE.load(Ordering::Relaxed);
    PEAK.store(baseline, Ordering::Relaxed);
    let tasks: Vec<_> = (0..calls)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { call(&client, addr, keep).await })
        })
        .collect();
    let mut received = 0;
    for task in tasks {
        received += task.await.unwrap();
    }
    (PEAK.load(Ordering::Relaxed).saturating_sub(baseline), received)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let megabytes = args.first().copied().unwrap_or(100);
    let calls = args.get(1).copied().unwrap_or(1);
    let bytes = megabytes * 1024 * 1024;
    let provider =
        serve(Router::new().route("/v1/embeddings", routing::post(move || async move { answer(bytes) }))).await;
    std::env::set_var("ANSWER_MEMORY_KEY", "answer-memory-key-0123456789");
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nupstreams:\n  - {{name: p, kind: openai, base_url: \"http://{provider}\"}}\nmodels:\n  - {{name: embed, upstream: p, tpm: 1000000000, max_output_tokens_default: 1}}\ntenants:\n  - {{name: acme, api_key_env: ANSWER_MEMORY_KEY}}\n"
    );
    let config: gateway::GatewayConfig = serde_yaml::from_str(&yaml).unwrap();
    let backend: Arc<dyn ratelimiter::Backend> = Arc::new(ratelimiter::MemoryBackend::new(
        Arc::new(ratelimiter::SystemClock::new()),
        ratelimiter::MemoryConfig::default(),
    ));
    let gateway = gateway::Gateway::new(&config, backend.clone()).unwrap();
    for definition in gateway.definitions() {
        backend.apply_definition(definition).await.unwrap();
    }
    let gateway = serve(gateway::router(Arc::new(gateway))).await;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    // Warm-up: connections, the tokenizer, the pools.
    call(&client, gateway, false).await;
    println!("{calls} call(s) at once, {megabytes} MB each");
    for round in 1..=3 {
        let (through, got) = peak_over_baseline(&client, gateway, calls, false).await;
        let (whole, direct) = peak_over_baseline(&client, provider, calls, true).await;
        assert_eq!(got, direct, "every byte passed");
        println!(
            "round {round}: through the gateway {:.2} MB peak ({:.3} MB per call); reference, the answer held whole: {:.1} MB; ratio {:.4}",
            through as f64 / 1e6,
            through as f64 / 1e6 / calls as f64,
            whole as f64 / 1e6,
            through as f64 / whole as f64
        );
    }
    let tpm = ratelimiter::LimitKey::new("global:llm:p:embed:tpm").unwrap();
    let report = backend.limit_report(&tpm).await.unwrap().unwrap();
    println!("reconciled: tpm in use {} (3 per call)", report.in_use);
}
