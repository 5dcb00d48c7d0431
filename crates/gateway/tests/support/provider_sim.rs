//! The provider simulator (`replay`) in process for the gateway's tests of
//! Bedrock and Vertex AI: limits no test reaches, the test-only Vertex AI key
//! trusted, its key files, and faults armed through its control API.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use ratelimiter::SystemClock;
use replay::provider::{Accounting, ProviderLimits};
use replay::provider_server::ProviderServer;
use replay::sim::vertex_auth::VertexAuth;
use replay::sim_control::SimControl;
use serde_json::{json, Value};

/// The test-only service account key (tests/fixtures/README.md).
pub const VERTEX_TEST_KEY: &str = include_str!("../../../../tests/fixtures/vertex-test-only-key.pem");
/// The service account [`VERTEX_TEST_KEY`] belongs to.
pub const VERTEX_ACCOUNT: &str = "gw@acme-ml.iam.gserviceaccount.com";

/// The simulator answering as `control` says, with limits far above what any
/// test sends (what a test sees is the provider's wire, never the simulator's
/// own 429) and output paced at 1 ms a token, on the system clock;
/// `configure` runs before it serves on a free loopback port.
pub async fn start_roomy_sim(
    control: SimControl,
    configure: impl FnOnce(&ProviderServer),
) -> (SocketAddr, Arc<ProviderServer>) {
    let limits = ProviderLimits {
        rpm: 100_000,
        tpm: 100_000_000,
        window_ms: 60_000,
        concurrency: 1_000,
        ms_per_output_token: 1,
        accounting: Accounting::Actual,
    };
    let provider = ProviderServer::with_control(limits, Arc::new(SystemClock::new()), control);
    configure(&provider);
    (serve_provider(&provider).await, provider)
}

/// Serves `provider` on a free loopback port, for the rest of the test.
pub async fn serve_provider(provider: &Arc<ProviderServer>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Arc::clone(provider).serve(listener, std::future::pending()));
    addr
}

/// Makes `provider` trust [`VERTEX_ACCOUNT`]'s key, its tokens lasting `lifetime_s`.
pub fn trust_vertex_test_key(provider: &ProviderServer, lifetime_s: u64) {
    let key = json!({"client_email": VERTEX_ACCOUNT, "private_key": VERTEX_TEST_KEY});
    provider.set_vertex_auth(VertexAuth::from_key_file(key.to_string().as_bytes(), lifetime_s).unwrap());
}

/// A service account key file of [`VERTEX_ACCOUNT`] holding `private_key`, whose
/// `token_uri` is the simulator's at `sim`, in a directory of the test's own
/// (named after `test`; the test removes it).
pub fn vertex_key_file(test: &str, sim: SocketAddr, private_key: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gateway-vertex-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("service-account.json");
    let file = json!({"type": "service_account", "project_id": "acme-ml", "private_key_id": "k1",
        "private_key": private_key, "client_email": VERTEX_ACCOUNT,
        "token_uri": format!("http://{sim}/token")});
    std::fs::write(&path, file.to_string()).unwrap();
    path
}

/// Arms `fault` on the simulator at `sim` (`POST /sim/faults`, docs/provider-sim.md).
pub async fn arm_fault(sim: SocketAddr, fault: Value) {
    let request = hyper::Request::post(format!("http://{sim}/sim/faults"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(fault.to_string())))
        .unwrap();
    assert_eq!(super::client().request(request).await.unwrap().status(), 204);
}
