//! The simulator's Vertex AI face over real HTTP: the token endpoint, Claude's
//! rawPredict and streamRawPredict, the OpenAI-compatible endpoint, Google's
//! 401 for a missing or expired token, and a quota bucket per region and model
//! refusing with `RESOURCE_EXHAUSTED`.

use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ratelimiter::SystemClock;
use replay::sim::control::SimControl;
use replay::sim::limits::{Accounting, ProviderLimits};
use replay::sim::profile::{ProfileName, SimProfile};
use replay::sim::server::ProviderServer;
use replay::sim::vertex_auth::{VertexAuth, CLOUD_PLATFORM_SCOPE};
use ring::rand::SystemRandom;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivatePkcs8KeyDer;
use serde_json::{json, Value};

/// The test-only key (tests/fixtures/README.md).
const TEST_KEY: &str = include_str!("../../../tests/fixtures/vertex-test-only-key.pem");
const EMAIL: &str = "gw@acme-ml.iam.gserviceaccount.com";
const CLAUDE: &str = "claude-sonnet-4-5@20250929";
const GEMINI: &str = "google/gemini-2.5-flash";

struct Sim {
    base: String,
    provider: Arc<ProviderServer>,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// A simulator on loopback enforcing `profile`, trusting the test key, its
/// tokens lasting `lifetime_s`.
async fn start(rpm: u64, profile: ProfileName, output_tpm: u64, lifetime_s: u64) -> Sim {
    let limits = ProviderLimits {
        rpm,
        tpm: 100_000,
        window_ms: 60_000,
        concurrency: 64,
        ms_per_output_token: 0,
        accounting: Accounting::Actual,
    };
    let control = SimControl::new(vec![CLAUDE.to_owned(), GEMINI.to_owned()], Some("sk-sim".to_owned()));
    let provider = ProviderServer::with_control(limits, Arc::new(SystemClock::new()), control);
    provider.set_profile(SimProfile {
        output_tpm,
        ..SimProfile::with_defaults(profile, &limits)
    });
    let key_file = json!({"type": "service_account", "client_email": EMAIL, "private_key": TEST_KEY});
    provider.set_vertex_auth(VertexAuth::from_key_file(key_file.to_string().as_bytes(), lifetime_s).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(Arc::clone(&provider).serve(listener, std::future::pending()));
    let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    Sim { base, provider, client }
}

impl Sim {
    async fn send(&self, path: &str, token: Option<&str>, body: String) -> (u16, hyper::HeaderMap, String) {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let response = self
            .client
            .request(request.body(Full::new(Bytes::from(body))).unwrap())
            .await
            .unwrap();
        let (status, headers) = (response.status().as_u16(), response.headers().clone());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, String::from_utf8(body.to_vec()).unwrap())
    }

    /// An access token, for an assertion signed with the test key.
    async fn token(&self) -> String {
        let claims = json!({"iss": EMAIL, "aud": format!("{}/token", self.base), "scope": CLOUD_PLATFORM_SCOPE,
            "iat": now_s(), "exp": now_s() + 3_600});
        let form = format!(
            "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion={}",
            assertion(&claims)
        );
        let (status, _, body) = self.send("/token", None, form).await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<Value>(&body).unwrap()["access_token"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn assertion(claims: &Value) -> String {
    let der = PrivatePkcs8KeyDer::from_pem_slice(TEST_KEY.as_bytes()).unwrap();
    let pair = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).unwrap();
    let signed = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let mut signature = vec![0; pair.public().modulus_len()];
    pair.sign(
        &RSA_PKCS1_SHA256,
        &SystemRandom::new(),
        signed.as_bytes(),
        &mut signature,
    )
    .unwrap();
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature))
}

fn claude_path(region: &str, action: &str) -> String {
    format!("/v1/projects/acme-ml/locations/{region}/publishers/anthropic/models/{CLAUDE}:{action}")
}

fn messages(stream: bool, max_tokens: u64) -> Value {
    json!({"anthropic_version": "vertex-2023-10-16", "max_tokens": max_tokens, "stream": stream,
        "messages": [{"role": "user", "content": "Hello, Claude"}], "sim_output_tokens": 3})
}

#[tokio::test]
async fn claude_answers_raw_predict_and_streams_stream_raw_predict() {
    let sim = start(1_000, ProfileName::Anthropic, 10_000, 3_600).await;
    let token = sim.token().await;
    let (status, _, body) = sim
        .send(
            &claude_path("us-east5", "rawPredict"),
            Some(&token),
            messages(false, 10).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let message: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (message["type"].as_str(), message["model"].as_str()),
        (Some("message"), Some(CLAUDE))
    );
    assert_eq!(message["usage"]["output_tokens"], 3);
    let (status, headers, body) = sim
        .send(
            &claude_path("us-east5", "streamRawPredict"),
            Some(&token),
            messages(true, 10).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["content-type"], "text/event-stream");
    assert!(
        body.starts_with("event: message_start\n") && body.contains("event: message_stop\n"),
        "{body}"
    );
    assert!(
        !headers.keys().any(|h| h.as_str().starts_with("anthropic-ratelimit")),
        "{headers:?}"
    );
    // The model belongs in the path; the version is required.
    let mut with_model = messages(false, 10);
    with_model["model"] = CLAUDE.into();
    let (status, _, body) = sim
        .send(
            &claude_path("us-east5", "rawPredict"),
            Some(&token),
            with_model.to_string(),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let mut without_version = messages(false, 10);
    without_version.as_object_mut().unwrap().remove("anthropic_version");
    let (status, _, body) = sim
        .send(
            &claude_path("us-east5", "rawPredict"),
            Some(&token),
            without_version.to_string(),
        )
        .await;
    assert!(status == 400 && body.contains("anthropic_version"), "{body}");
    let unknown = claude_path("us-east5", "rawPredict").replace(CLAUDE, "claude-unknown@1");
    let (status, _, body) = sim.send(&unknown, Some(&token), messages(false, 10).to_string()).await;
    assert_eq!(
        (
            status,
            serde_json::from_str::<Value>(&body).unwrap()["error"]["status"].as_str()
        ),
        (404, Some("NOT_FOUND"))
    );
}

#[tokio::test]
async fn a_call_without_a_valid_token_is_unauthenticated() {
    let sim = start(1_000, ProfileName::Anthropic, 10_000, 1).await;
    let path = claude_path("us-east5", "rawPredict");
    for token in [None, Some("ya29.made-up")] {
        let (status, _, body) = sim.send(&path, token, messages(false, 10).to_string()).await;
        assert_eq!(status, 401, "{body}");
        let error: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (error["error"]["code"].as_u64(), error["error"]["status"].as_str()),
            (Some(401), Some("UNAUTHENTICATED"))
        );
    }
    let token = sim.token().await;
    assert_eq!(
        sim.send(&path, Some(&token), messages(false, 10).to_string()).await.0,
        200
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(
        sim.send(&path, Some(&token), messages(false, 10).to_string()).await.0,
        401,
        "expired"
    );
    assert_eq!(
        (
            sim.provider.vertex_auth().issued(),
            sim.provider.vertex_auth().refused_tokens()
        ),
        (1, 3)
    );
    let bucket = sim.provider.bucket(&format!("acme-ml/us-east5/{CLAUDE}")).unwrap();
    assert_eq!(bucket.admissions().len(), 1, "a refused call never reaches the model");
}

#[tokio::test]
async fn each_region_and_model_has_its_quota_and_a_refusal_is_resource_exhausted() {
    let sim = start(2, ProfileName::Anthropic, 25, 3_600).await;
    let token = sim.token().await;
    let call = |region: &'static str, max_tokens: u64| {
        let (sim, token) = (&sim, &token);
        async move {
            sim.send(
                &claude_path(region, "rawPredict"),
                Some(token),
                messages(false, max_tokens).to_string(),
            )
            .await
        }
    };
    assert_eq!(call("us-east5", 10).await.0, 200);
    // The output limit (25 a minute) is held apart from the input: the first
    // call's 3 output tokens and a bound of 23 do not fit.
    let (status, headers, body) = call("us-east5", 23).await;
    assert_eq!(status, 429, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (error["error"]["code"].as_u64(), error["error"]["status"].as_str()),
        (Some(429), Some("RESOURCE_EXHAUSTED"))
    );
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("Resource exhausted"));
    assert!(headers.get("retry-after").is_none() && headers.get("anthropic-ratelimit-requests-limit").is_none());
    assert_eq!(call("us-east5", 10).await.0, 200);
    assert_eq!(call("us-east5", 1).await.0, 429, "two requests a minute in us-east5");
    // Another region is another bucket.
    assert_eq!(call("europe-west1", 10).await.0, 200);
    let bucket = sim.provider.bucket(&format!("acme-ml/us-east5/{CLAUDE}")).unwrap();
    assert_eq!(bucket.admissions().len(), 2);
    assert!(
        sim.provider.admissions().is_empty(),
        "the Claude buckets are not the shared pool"
    );
}

#[tokio::test]
async fn other_models_speak_openai_chat_through_the_openapi_endpoint() {
    let sim = start(1, ProfileName::Sliding, 10_000, 3_600).await;
    let token = sim.token().await;
    let path = "/v1/projects/acme-ml/locations/global/endpoints/openapi/chat/completions";
    let chat = |model: &str| {
        json!({"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}).to_string()
    };
    let (status, _, body) = sim.send(path, Some(&token), chat(GEMINI)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["object"],
        "chat.completion"
    );
    // One request a minute in the shared pool: the second is RESOURCE_EXHAUSTED.
    let (status, _, body) = sim.send(path, Some(&token), chat(GEMINI)).await;
    assert!(status == 429 && body.contains("RESOURCE_EXHAUSTED"), "{body}");
    let (status, _, body) = sim.send(path, Some(&token), chat("gemini-2.5-flash")).await;
    assert!(status == 400 && body.contains("INVALID_ARGUMENT"), "{body}");
    assert_eq!(sim.send(path, None, chat(GEMINI)).await.0, 401);
}
