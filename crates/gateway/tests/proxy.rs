//! The gateway end to end on the memory backend, in front of a provider on a real
//! socket: reservation, reconciliation to the provider's usage, streams, waiting,
//! provider 429s, upstream failures and bad input.

mod support;

use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::{json, Value};
use support::*;

const TPM: &str = "global:llm:openai:gpt-4o-mini:tpm";
const RPM: &str = "global:llm:openai:gpt-4o-mini:rpm";
const CONCURRENCY: &str = "global:llm:openai:gpt-4o-mini:concurrency";
const DAILY: &str = "tenant:acme:llm:daily_tokens";

fn chat(model: &str, stream: bool) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 50, "stream": stream})
}

#[tokio::test]
async fn a_chat_call_is_reconciled_to_the_providers_usage() {
    let Setup {
        provider: _,
        backend,
        gateway,
        client,
    } = setup(0).await;
    let (status, _, body) = post(&client, gateway, "/v1/chat/completions", chat("gpt-4o-mini", false)).await;
    assert_eq!(status, 200, "{body}");
    let total = OPENAI_USAGE.0 + OPENAI_USAGE.1;
    eventually_in_use(&backend, TPM, total).await;
    eventually_in_use(&backend, DAILY, total).await;
    assert_eq!(in_use(&backend, RPM).await, 1);
    assert_eq!(in_use(&backend, CONCURRENCY).await, 0);
}

/// Azure OpenAI's v1 API is an OpenAI-compatible upstream whose base URL ends in
/// `/openai` (docs/gateway.md, "Upstreams"): the gateway sends the OpenAI path
/// under it, and the model is the deployment's name.
#[tokio::test]
async fn an_azure_style_base_path_is_kept_and_the_call_reconciled() {
    let (addr, provider) = start_provider().await;
    std::env::set_var("GATEWAY_TEST_ACME_KEY", TENANT_KEY);
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nupstreams:\n  - {{name: azure, kind: openai-compatible, base_url: \"http://{addr}/openai\"}}\nmodels:\n  - {{name: my-deployment, upstream: azure, rpm: 10, tpm: 10000, max_output_tokens_default: 100}}\ntenants:\n  - {{name: acme, api_key_env: GATEWAY_TEST_ACME_KEY}}\n"
    );
    let backend = memory_backend();
    let gateway = start_gateway(&serde_yaml::from_str(&yaml).unwrap(), backend.clone()).await;
    let (status, _, body) = post(&client(), gateway, "/v1/chat/completions", chat("my-deployment", false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(provider.azure_calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    eventually_in_use(
        &backend,
        "global:llm:azure:my-deployment:tpm",
        OPENAI_USAGE.0 + OPENAI_USAGE.1,
    )
    .await;
}

#[tokio::test]
async fn a_stream_passes_through_and_the_usage_chunk_asked_for_by_the_gateway_is_dropped() {
    let Setup {
        provider: state,
        backend,
        gateway,
        client,
    } = setup(0).await;
    let (status, headers, body) = post(&client, gateway, "/v1/chat/completions", chat("gpt-4o-mini", true)).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/event-stream");
    let sent = state.last_body.lock().unwrap().clone().unwrap();
    assert_eq!(
        sent["stream_options"]["include_usage"], true,
        "the gateway asks for usage"
    );
    assert!(body.contains("\"hi\"") && body.contains("\" there\"") && body.ends_with("data: [DONE]\n\n"));
    assert!(
        !body.contains("prompt_tokens"),
        "the client did not ask for usage: {body}"
    );
    eventually_in_use(&backend, TPM, OPENAI_USAGE.0 + OPENAI_USAGE.1).await;
    // A client that asks for usage gets it.
    let mut asked = chat("gpt-4o-mini", true);
    asked["stream_options"] = json!({"include_usage": true});
    let (_, _, body) = post(&client, gateway, "/v1/chat/completions", asked).await;
    assert!(body.contains("\"prompt_tokens\":11"), "{body}");
}

#[tokio::test]
async fn anthropic_usage_splits_input_and_output_and_takes_the_last_delta() {
    let Setup {
        provider: _,
        backend,
        gateway,
        client,
    } = setup(0).await;
    let (input, creation, _, output) = ANTHROPIC_USAGE;
    for stream in [false, true] {
        let body = json!({"model": "claude-test", "max_tokens": 64, "stream": stream,
            "messages": [{"role": "user", "content": "Say hi."}]});
        let response = post_raw(
            &client,
            gateway,
            "/v1/messages",
            body.to_string(),
            &[("x-api-key", TENANT_KEY), ("anthropic-version", "2023-06-01")],
        )
        .await;
        assert_eq!(response.status(), 200);
        response.into_body().collect().await.unwrap();
    }
    eventually_in_use(
        &backend,
        "global:llm:anthropic:claude-test:input_tpm",
        2 * (input + creation),
    )
    .await;
    eventually_in_use(&backend, "global:llm:anthropic:claude-test:output_tpm", 2 * output).await;
    // A model whose cache reads count on its input limit (count_cache_reads).
    let body = json!({"model": "claude-old", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]});
    let response = post_raw(
        &client,
        gateway,
        "/v1/messages",
        body.to_string(),
        &[("x-api-key", TENANT_KEY)],
    )
    .await;
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.unwrap();
    let (_, _, read, _) = ANTHROPIC_USAGE;
    eventually_in_use(
        &backend,
        "global:llm:anthropic:claude-old:input_tpm",
        input + creation + read,
    )
    .await;
    // The tenant's budget counts what Anthropic bills, cache reads included,
    // on every model alike.
    eventually_in_use(&backend, DAILY, 3 * (input + creation + read + output)).await;
}

#[tokio::test]
async fn concurrency_is_never_exceeded_and_a_denial_is_a_429_in_the_providers_shape() {
    let Setup {
        provider: state,
        backend,
        gateway,
        client,
    } = setup(0).await;
    let slow = open(&client, gateway, &chat("gpt-4o-mini-slow", true)).await;
    assert_eq!(slow.status(), 200);
    // The same model's only slot is held by the open stream.
    let slow_concurrency = "global:llm:openai:gpt-4o-mini-slow:concurrency";
    assert_eq!(in_use(&backend, slow_concurrency).await, 1);
    let (status, headers, body) = post(
        &client,
        gateway,
        "/v1/chat/completions",
        chat("gpt-4o-mini-slow", false),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"]["code"], "rate_limit_exceeded");
    assert!(headers.contains_key("retry-after-ms") && headers.contains_key("retry-after"));
    assert_eq!(headers["x-ratelimit-limit-concurrency"], "1");
    assert_eq!(headers["x-ratelimit-remaining-concurrency"], "0");
    // Another model is not held up.
    let (status, _, _) = post(&client, gateway, "/v1/chat/completions", chat("gpt-4o-mini", false)).await;
    assert_eq!(status, 200);
    state.gate.add_permits(1);
    slow.into_body().collect().await.unwrap();
    eventually_in_use(&backend, slow_concurrency, 0).await;
}

#[tokio::test]
async fn a_denied_call_waits_its_turn_up_to_max_wait() {
    let Setup {
        provider: state,
        backend,
        gateway,
        client,
    } = setup(30_000).await;
    let slow = open(&client, gateway, &chat("gpt-4o-mini-slow", true)).await;
    let waiting = tokio::spawn({
        let client = client.clone();
        async move {
            post(
                &client,
                gateway,
                "/v1/chat/completions",
                chat("gpt-4o-mini-slow", false),
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "the second call waits while the slot is held");
    state.gate.add_permits(1);
    slow.into_body().collect().await.unwrap();
    let (status, _, body) = waiting.await.unwrap();
    assert_eq!(status, 200, "{body}");
    eventually_in_use(&backend, "global:llm:openai:gpt-4o-mini-slow:concurrency", 0).await;
}

#[tokio::test]
async fn a_client_that_leaves_mid_stream_frees_its_slot_and_keeps_its_tokens() {
    let Setup {
        provider: _,
        backend,
        gateway,
        client,
    } = setup(0).await;
    let bearer = format!("Bearer {TENANT_KEY}");
    let request = chat("gpt-4o-mini-slow", true);
    let mut response = post_raw(
        &client,
        gateway,
        "/v1/chat/completions",
        request.to_string(),
        &[("authorization", &bearer)],
    )
    .await;
    let first = response.body_mut().frame().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(first.data_ref().unwrap()).contains("\"hi\""));
    let reserved = in_use(&backend, "global:llm:openai:gpt-4o-mini-slow:tpm").await;
    assert!(reserved > 50, "prompt plus max_tokens is reserved: {reserved}");
    drop(response);
    drop(client);
    eventually_in_use(&backend, "global:llm:openai:gpt-4o-mini-slow:concurrency", 0).await;
    assert_eq!(
        in_use(&backend, "global:llm:openai:gpt-4o-mini-slow:tpm").await,
        reserved
    );
}

const RPM_429: &str = "global:llm:openai:gpt-4o-mini-429:rpm";

/// A gateway whose first call of `gpt-4o-mini-429` the provider refused with its 429
/// (`retry-after-ms: 800`), once the pause holds the rest of the model's rpm.
async fn after_a_provider_429() -> (Setup, axum::http::HeaderMap, String) {
    let setup = setup(0).await;
    let (status, headers, body) = post(
        &setup.client,
        setup.gateway,
        "/v1/chat/completions",
        chat("gpt-4o-mini-429", false),
    )
    .await;
    assert_eq!(status, 429);
    // The rest of the minute's requests are held by the pause, on the backend.
    eventually_in_use(&setup.backend, RPM_429, 3).await;
    (setup, headers, body)
}

#[tokio::test]
async fn a_provider_429_is_passed_through_and_cools_the_model_down() {
    let (setup, headers, body) = after_a_provider_429().await;
    let Setup {
        backend,
        gateway,
        client,
        ..
    } = setup;
    assert_eq!(headers["retry-after-ms"], "800");
    assert!(body.contains("Rate limit reached"));
    eventually_in_use(&backend, "global:llm:openai:gpt-4o-mini-429:tpm", 0).await;
    let (status, headers, _) = post(&client, gateway, "/v1/chat/completions", chat("gpt-4o-mini-429", false)).await;
    assert_eq!(status, 429);
    // The gateway's own 429 hints the provider's time, not the end of the rpm window.
    let hint: u64 = headers["retry-after-ms"].to_str().unwrap().parse().unwrap();
    assert!((1..=800).contains(&hint), "{hint}");
    // After the provider's hint, the hold is given back (the first call stays counted).
    eventually_in_use(&backend, RPM_429, 1).await;
}

/// Issue 19, item 4: the pause is on the shared backend and lasts the provider's
/// time, so another server of a fleet, which has no cooldown of its own and answers
/// the backend's hint, hints the provider's 800 ms, not the end of the rpm minute.
#[tokio::test]
async fn a_provider_429_pauses_the_model_on_the_backend_for_the_providers_time() {
    let (setup, _, _) = after_a_provider_429().await;
    let requirement = ratelimiter::Requirement {
        key: ratelimiter::LimitKey::new(RPM_429).unwrap(),
        amount: 1,
    };
    let request = ratelimiter::ReserveRequest::new(ratelimiter::LeaseId::generate(), None, vec![requirement]).unwrap();
    let denial = match setup.backend.reserve(&request).await.unwrap() {
        ratelimiter::ReserveOutcome::Denied(denial) => denial,
        allowed => panic!("another server's call during the pause: {allowed:?}"),
    };
    // The provider's 800 ms plus at most the backend's 50 ms of jitter.
    assert!((1..=850).contains(&denial.retry_after_ms()), "{denial:?}");
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_that_releases_everything_but_the_request() {
    let (provider, _) = start_provider().await;
    let backend = memory_backend();
    let gateway = start_gateway(&config(provider, 0), backend.clone()).await;
    let (status, _, body) = post(&client(), gateway, "/v1/chat/completions", chat("gpt-4o-gone", false)).await;
    assert_eq!(status, 502, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"]["type"], "server_error");
    eventually_in_use(&backend, "global:llm:nowhere:gpt-4o-gone:concurrency", 0).await;
    eventually_in_use(&backend, "global:llm:nowhere:gpt-4o-gone:tpm", 0).await;
}

#[tokio::test]
async fn bad_input_is_answered_before_anything_is_reserved() {
    let Setup {
        provider: state,
        backend,
        gateway,
        client,
    } = setup(0).await;
    let bearer = format!("Bearer {TENANT_KEY}");
    let auth = [("authorization", bearer.as_str())];
    /// Path, body, headers, expected status, a word the answer must hold.
    type Case<'a> = (&'a str, String, &'a [(&'a str, &'a str)], u16, &'a str);
    let cases: Vec<Case> = vec![
        (
            "/v1/chat/completions",
            "{not json".into(),
            &auth,
            400,
            "invalid_request_error",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": []}).to_string(),
            &auth,
            400,
            "invalid_request_error",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}).to_string(),
            &auth,
            404,
            "model_not_found",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "max_tokens": "a"})
                .to_string(),
            &auth,
            400,
            "invalid_request_error",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x".repeat(5000)}]}).to_string(),
            &auth,
            413,
            "request_too_large",
        ),
        (
            "/v1/chat/completions",
            chat("gpt-4o-mini", false).to_string(),
            &[],
            401,
            "invalid_api_key",
        ),
        (
            "/v1/chat/completions",
            chat("gpt-4o-mini", false).to_string(),
            &[("authorization", "Bearer wrong-key-0123456789abcdef")],
            401,
            "invalid_api_key",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "max_tokens": 20000})
                .to_string(),
            &auth,
            400,
            "never",
        ),
        ("/v1/nothing", "{}".into(), &auth, 404, "invalid_request_error"),
    ];
    for (path, body, headers, status, needle) in cases {
        let response = post_raw(&client, gateway, path, body.clone(), headers).await;
        let got = response.status().as_u16();
        let text = String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
        assert_eq!(got, status, "{path} {body:.80}: {text}");
        assert!(text.contains(needle), "{text}");
    }
    // Anthropic endpoints answer in Anthropic's shape.
    let response = post_raw(
        &client,
        gateway,
        "/v1/messages",
        json!({"model": "claude-test", "messages": []}).to_string(),
        &[("x-api-key", TENANT_KEY)],
    )
    .await;
    assert_eq!(response.status(), 400);
    let text = response.into_body().collect().await.unwrap().to_bytes();
    let error: Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(
        (error["type"].as_str(), error["error"]["type"].as_str()),
        (Some("error"), Some("invalid_request_error"))
    );
    assert_eq!(
        state.calls.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing was forwarded"
    );
    for key in [RPM, TPM, CONCURRENCY, DAILY] {
        assert_eq!(in_use(&backend, key).await, 0, "{key}");
    }
}

#[tokio::test]
async fn models_lists_the_configured_models() {
    let (provider, _) = start_provider().await;
    let gateway = start_gateway(&config(provider, 0), memory_backend()).await;
    let response = client()
        .request(
            hyper::Request::get(format!("http://{gateway}/v1/models"))
                .header("authorization", format!("Bearer {TENANT_KEY}"))
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    let body: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let ids: Vec<&str> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids[0], "gpt-4o-mini");
    assert!(ids.contains(&"claude-test"));
}

#[tokio::test]
async fn a_spent_daily_budget_is_a_429_the_sdks_do_not_retry() {
    let Setup {
        provider: state,
        backend,
        gateway,
        client,
    } = setup(0).await;
    let bearer = format!("Bearer {TINY_TENANT_KEY}");
    let auth = [("authorization", bearer.as_str())];
    let request = |model: &str| {
        json!({"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 250, "stream": true})
            .to_string()
    };
    // The first call holds about 265 of the tenant's 300 tokens while it streams.
    let open = post_raw(
        &client,
        gateway,
        "/v1/chat/completions",
        request("gpt-4o-mini-slow"),
        &auth,
    )
    .await;
    assert_eq!(open.status(), 200);
    let second = post_raw(&client, gateway, "/v1/chat/completions", request("gpt-4o-mini"), &auth).await;
    assert_eq!(second.status(), 429);
    assert_eq!(second.headers()["x-should-retry"], "false");
    let body: Value = serde_json::from_slice(&second.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["error"]["code"], "insufficient_quota", "{body}");
    state.gate.add_permits(1);
    open.into_body().collect().await.unwrap();
    // Reconciled to the provider's usage, the budget has room again.
    eventually_in_use(
        &backend,
        "tenant:tiny:llm:daily_tokens",
        OPENAI_USAGE.0 + OPENAI_USAGE.1,
    )
    .await;
    let third = post_raw(&client, gateway, "/v1/chat/completions", request("gpt-4o-mini"), &auth).await;
    assert_eq!(third.status(), 200);
}

/// A backend whose complete answers only after `delay`, as a TigerBeetle
/// cluster answers after a round trip: what the gateway must wait for before
/// the client sees its answer end.
struct SlowComplete {
    inner: std::sync::Arc<dyn ratelimiter::Backend>,
    delay: Duration,
}

#[async_trait::async_trait]
impl ratelimiter::Limiter for SlowComplete {
    async fn reserve(
        &self,
        request: &ratelimiter::ReserveRequest,
    ) -> Result<ratelimiter::ReserveOutcome, ratelimiter::LimiterError> {
        self.inner.reserve(request).await
    }

    async fn complete(&self, request: &ratelimiter::CompleteRequest) -> Result<(), ratelimiter::LimiterError> {
        tokio::time::sleep(self.delay).await;
        self.inner.complete(request).await
    }
}

#[async_trait::async_trait]
impl ratelimiter::Backend for SlowComplete {
    async fn apply_state(&self, state: &ratelimiter::LimitState) -> Result<(), ratelimiter::LimiterError> {
        self.inner.apply_state(state).await
    }

    async fn limit_report(
        &self,
        key: &ratelimiter::LimitKey,
    ) -> Result<Option<ratelimiter::LimitReport>, ratelimiter::LimiterError> {
        self.inner.limit_report(key).await
    }

    async fn limit_reports(&self) -> Result<Vec<ratelimiter::LimitReport>, ratelimiter::LimiterError> {
        self.inner.limit_reports().await
    }

    async fn apply_pending_decreases(&self) -> Result<Vec<ratelimiter::LimitState>, ratelimiter::LimiterError> {
        self.inner.apply_pending_decreases().await
    }

    async fn health(&self) -> Result<(), ratelimiter::LimiterError> {
        self.inner.health().await
    }
}

/// A caller that waits for each answer before sending its next call never meets
/// its own last call's concurrency hold: the complete is done, not just started,
/// before the answer ends for the client, whole or streamed, however long the
/// backend takes to answer it.
#[tokio::test]
async fn a_callers_next_call_finds_its_last_calls_hold_released() {
    let (provider, _state) = start_provider().await;
    let backend: std::sync::Arc<dyn ratelimiter::Backend> = std::sync::Arc::new(SlowComplete {
        inner: memory_backend(),
        delay: Duration::from_millis(300),
    });
    let gateway = start_gateway(&config(provider, 0), backend.clone()).await;
    let client = client();
    // Concurrency 1 and no waiting: a hold still in place is a 429.
    for stream in [false, true, false] {
        let (status, _, body) = post(&client, gateway, "/v1/chat/completions", chat("gpt-4o-mini", stream)).await;
        assert_eq!(status, 200, "stream {stream}: {body}");
        assert_eq!(in_use(&backend, CONCURRENCY).await, 0, "stream {stream}");
    }
}
