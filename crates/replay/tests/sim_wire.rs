//! The simulator's OpenAI and Anthropic wire formats over real HTTP: bodies,
//! streams (event order, usage, pace), rate-limit headers, error shapes, the
//! fault switch, and a cancelled stream freeing its slot.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ratelimiter::SystemClock;
use replay::sim::control::{SimControl, MODELS_DEFAULT};
use replay::sim::limits::{Accounting, ProviderLimits};
use replay::sim::server::ProviderServer;
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// Longest a test waits for the simulator to settle (a released slot).
const SETTLE_WAIT: Duration = Duration::from_secs(10);

struct Sim {
    base: String,
    provider: Arc<ProviderServer>,
    client: Client<HttpConnector, Full<Bytes>>,
}

struct Answer {
    status: u16,
    headers: hyper::HeaderMap,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in {:?}", self.headers))
            .to_str()
            .unwrap()
    }

    /// The `data:` payloads of a server-sent-event body, with their `event:` names.
    fn events(&self) -> Vec<(Option<String>, String)> {
        self.body
            .split("\n\n")
            .filter(|block| !block.is_empty())
            .map(|block| {
                let mut name = None;
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(n) = line.strip_prefix("event: ") {
                        name = Some(n.to_owned());
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data = d.to_owned();
                    }
                }
                (name, data)
            })
            .collect()
    }
}

fn limits(concurrency: u64, ms_per_output_token: u64) -> ProviderLimits {
    ProviderLimits {
        rpm: 1_000,
        tpm: 100_000,
        window_ms: 60_000,
        concurrency,
        ms_per_output_token,
        accounting: Accounting::Actual,
    }
}

async fn start_with(limits: ProviderLimits, control: SimControl) -> Sim {
    let provider = ProviderServer::with_control(limits, Arc::new(SystemClock::new()), control);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(Arc::clone(&provider).serve(listener, std::future::pending()));
    let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    Sim { base, provider, client }
}

async fn start(limits: ProviderLimits) -> Sim {
    start_with(limits, SimControl::default()).await
}

impl Sim {
    fn request(&self, method: Method, path: &str, headers: &[(&str, &str)], body: &Value) -> Request<Full<Bytes>> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let body = if body.is_null() {
            Bytes::new()
        } else {
            Bytes::from(body.to_string())
        };
        request.body(Full::new(body)).unwrap()
    }

    async fn send(&self, method: Method, path: &str, headers: &[(&str, &str)], body: &Value) -> Answer {
        let response = self
            .client
            .request(self.request(method, path, headers, body))
            .await
            .unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    }

    async fn post(&self, path: &str, body: Value) -> Answer {
        self.send(Method::POST, path, &[], &body).await
    }

    async fn stats(&self) -> Value {
        self.send(Method::GET, "/sim/stats", &[], &Value::Null).await.json()
    }

    async fn fault(&self, fault: Value) {
        assert_eq!(self.post("/sim/faults", fault).await.status, 204);
    }
}

fn chat(stream: bool, include_usage: bool, max_tokens: u64, output: u64) -> Value {
    let mut body = json!({
        "model": "gpt-4o-mini", "stream": stream, "max_tokens": max_tokens, "sim_output_tokens": output,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hello there"}]}],
    });
    if include_usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

#[tokio::test]
async fn chat_stream_sends_a_chunk_per_token_then_usage_then_done() {
    let sim = start(limits(4, 0)).await;
    let answer = sim.post("/v1/chat/completions", chat(true, true, 10, 3)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.header("content-type"), "text/event-stream");
    assert_eq!(answer.header("x-ratelimit-remaining-requests"), "999");
    // "be brief" = 8 bytes = 2 tokens, "hello there" = 11 bytes = 3 tokens; 3 written.
    assert_eq!(answer.header("x-ratelimit-remaining-tokens"), (100_000 - 8).to_string());
    assert_eq!(answer.header("x-ratelimit-reset-requests"), "1m0s");
    let events = answer.events();
    let data: Vec<&str> = events.iter().map(|(_, d)| d.as_str()).collect();
    assert_eq!(data.len(), 1 + 3 + 1 + 1 + 1, "{data:?}");
    assert_eq!(*data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks[1..4]
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, "the cat sat ");
    assert!(chunks[..5]
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk" && c["usage"].is_null()));
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[5]["choices"], json!([]));
    assert_eq!(
        chunks[5]["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8})
    );

    // Without include_usage: no usage chunk and no usage field; the bound reached is "length".
    let answer = sim.post("/v1/chat/completions", chat(true, false, 2, 9)).await;
    let data: Vec<String> = answer.events().into_iter().map(|(_, d)| d).collect();
    assert_eq!(data.len(), 1 + 2 + 1 + 1);
    assert!(!data.iter().any(|d| d.contains("\"usage\"")), "{data:?}");
    assert!(data[3].contains("\"finish_reason\":\"length\""), "{}", data[3]);
    assert_eq!(sim.provider.counts().charged_tokens, 8 + 7);
}

#[tokio::test]
async fn chat_without_stream_answers_usage_and_unknown_models_get_404() {
    let sim = start(limits(4, 0)).await;
    let answer = sim
        .post(
            "/v1/chat/completions",
            json!({"model": "gpt-4o", "max_tokens": 4, "messages": [{"role": "user", "content": "abcdefgh"}]}),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        answer.json()["usage"],
        json!({"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6})
    );
    assert_eq!(answer.header("x-ratelimit-reset-tokens"), "1m0s");
    let answer = sim
        .post(
            "/v1/chat/completions",
            json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(answer.status, 404);
    assert_eq!(answer.json()["error"]["code"], "model_not_found");
    let answer = sim
        .post("/v1/chat/completions", json!({"model": "gpt-4o", "messages": "x"}))
        .await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.json()["error"]["type"], "invalid_request_error");
    assert_eq!(sim.provider.counts().admitted, 1);
    let models = sim.send(Method::GET, "/v1/models", &[], &Value::Null).await.json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, MODELS_DEFAULT);
    assert_eq!(models["object"], "list");
}

#[tokio::test]
async fn embeddings_charge_the_input_and_answer_floats_or_base64() {
    let sim = start(limits(4, 0)).await;
    let answer = sim
        .post(
            "/v1/embeddings",
            json!({"model": "text-embedding-3-small", "input": ["abcd", "abcde"], "dimensions": 3}),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let body = answer.json();
    assert_eq!(body["usage"], json!({"prompt_tokens": 3, "total_tokens": 3}));
    assert_eq!(body["data"][1]["index"], 1);
    assert_eq!(body["data"][1]["embedding"].as_array().unwrap().len(), 3);
    let answer = sim
        .post(
            "/v1/embeddings",
            json!({"model": "text-embedding-3-small", "input": [1, 2, 3], "encoding_format": "base64"}),
        )
        .await;
    let body = answer.json();
    assert_eq!(body["usage"]["prompt_tokens"], 3);
    // 16 float32 values, base64: 64 bytes in 88 characters.
    assert_eq!(body["data"][0]["embedding"].as_str().unwrap().len(), 88);
    for bad in [
        json!({"model": "text-embedding-3-small", "input": []}),
        json!({"model": "text-embedding-3-small", "input": ""}),
        json!({"model": "text-embedding-3-small", "input": 5}),
    ] {
        assert_eq!(sim.post("/v1/embeddings", bad).await.status, 400);
    }
    assert_eq!(sim.provider.counts().charged_tokens, 6);
}

#[tokio::test]
async fn responses_report_usage_in_the_object_and_in_response_completed() {
    let sim = start(limits(4, 0)).await;
    let body = json!({"model": "gpt-4o-mini", "instructions": "abcd", "input": [{"role": "user", "content": [{"type": "input_text", "text": "abcdefgh"}]}], "max_output_tokens": 16, "sim_output_tokens": 2});
    let answer = sim.post("/v1/responses", body.clone()).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let object = answer.json();
    assert_eq!(object["status"], "completed");
    assert_eq!(object["usage"]["input_tokens"], 3);
    assert_eq!(object["usage"]["output_tokens"], 2);
    assert_eq!(object["output"][0]["content"][0]["text"], "the cat ");
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let answer = sim.post("/v1/responses", streamed).await;
    let events = answer.events();
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let last: Value = serde_json::from_str(&events[9].1).unwrap();
    assert_eq!(last["sequence_number"], 9);
    assert_eq!(last["response"]["usage"]["total_tokens"], 5);
    // Writing up to the bound ends as OpenAI does: incomplete, for max_output_tokens.
    let answer = sim
        .post(
            "/v1/responses",
            json!({"model": "gpt-4o-mini", "input": "hi", "max_output_tokens": 1, "stream": true}),
        )
        .await;
    assert!(answer.body.contains("event: response.incomplete\n"), "{}", answer.body);
    assert_eq!(
        sim.post("/v1/responses", json!({"model": "gpt-4o-mini", "input": []}))
            .await
            .status,
        400
    );
}

#[tokio::test]
async fn anthropic_messages_stream_start_deltas_cumulative_usage_and_stop() {
    let sim = start(limits(4, 0)).await;
    let body = json!({"model": "claude-haiku-4-5", "max_tokens": 50, "sim_output_tokens": 3, "system": "abcd",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "abcdefgh"}]}]});
    let answer = sim.post("/v1/messages", body.clone()).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let message = answer.json();
    assert_eq!(message["type"], "message");
    assert_eq!(message["stop_reason"], "end_turn");
    assert_eq!(message["usage"]["input_tokens"], 3);
    assert_eq!(message["usage"]["output_tokens"], 3);
    assert_eq!(answer.header("anthropic-ratelimit-requests-remaining"), "999");
    assert_eq!(answer.header("anthropic-ratelimit-tokens-limit"), "100000");
    assert!(answer.header("anthropic-ratelimit-tokens-reset").ends_with('Z'));
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let answer = sim.post("/v1/messages", streamed).await;
    let events = answer.events();
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let start: Value = serde_json::from_str(&events[0].1).unwrap();
    assert_eq!(start["message"]["usage"]["input_tokens"], 3);
    let delta: Value = serde_json::from_str(&events[7].1).unwrap();
    assert_eq!(delta["usage"]["output_tokens"], 3);
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    let count = sim
        .post(
            "/v1/messages/count_tokens",
            json!({"model": "claude-haiku-4-5", "system": "abcd", "messages": body["messages"]}),
        )
        .await;
    assert_eq!(count.json(), json!({"input_tokens": 3}));
    // count_tokens is not charged: two calls of 6 tokens each.
    assert_eq!(sim.provider.counts().charged_tokens, 12);
    let missing = sim
        .post(
            "/v1/messages",
            json!({"model": "claude-haiku-4-5", "messages": body["messages"]}),
        )
        .await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.json()["error"]["type"], "invalid_request_error");
    assert_eq!(missing.json()["type"], "error");
    let unknown = sim
        .post(
            "/v1/messages",
            json!({"model": "claude-0", "max_tokens": 1, "messages": body["messages"]}),
        )
        .await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["error"]["type"], "not_found_error");
}

#[tokio::test]
async fn ledger_refusals_are_429_in_each_providers_shape_with_hints() {
    let mut small = limits(4, 0);
    small.rpm = 1;
    let sim = start(small).await;
    assert_eq!(
        sim.post("/v1/chat/completions", chat(true, false, 1, 1)).await.status,
        200
    );
    let answer = sim.post("/v1/chat/completions", chat(true, false, 1, 1)).await;
    assert_eq!(answer.status, 429);
    assert_eq!(answer.json()["error"]["code"], "rate_limit_exceeded");
    assert_eq!(answer.header("x-ratelimit-remaining-requests"), "0");
    let hint_ms: u64 = answer.header("retry-after-ms").parse().unwrap();
    assert!((1..=60_000).contains(&hint_ms), "{hint_ms}");
    let answer = sim
        .post("/v1/messages", json!({"model": "claude-sonnet-4-5", "max_tokens": 1, "stream": true, "messages": [{"role": "user", "content": "x"}]}))
        .await;
    assert_eq!(answer.status, 429);
    assert_eq!(
        answer.json(),
        json!({"type": "error", "error": {"type": "rate_limit_error", "message": answer.json()["error"]["message"]}})
    );
    assert_eq!(answer.header("anthropic-ratelimit-requests-remaining"), "0");
    assert!(answer.header("retry-after").parse::<u64>().unwrap() >= 1);
}

#[tokio::test]
async fn faults_answer_a_status_hang_or_cut_a_stream_for_the_calls_they_cover() {
    let sim = start(limits(4, 0)).await;
    sim.fault(json!({"mode": "status", "status": 429, "retry_after_ms": 1500, "count": 2, "model": "gpt-4o-mini"}))
        .await;
    // Another model is not covered.
    let answer = sim
        .post(
            "/v1/messages",
            json!({"model": "claude-sonnet-4-5", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    for _ in 0..2 {
        let answer = sim.post("/v1/chat/completions", chat(true, true, 4, 4)).await;
        assert_eq!(answer.status, 429);
        assert_eq!(answer.header("retry-after-ms"), "1500");
        assert_eq!(answer.header("retry-after"), "2");
    }
    assert_eq!(
        sim.post("/v1/chat/completions", chat(true, true, 4, 4)).await.status,
        200
    );
    sim.fault(json!({"mode": "status", "status": 529, "count": 1})).await;
    let answer = sim
        .post(
            "/v1/messages",
            json!({"model": "claude-sonnet-4-5", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(answer.status, 529);
    assert_eq!(answer.json()["error"]["type"], "overloaded_error");

    // A stream cut after 3 events: the client sees the call fail (the head and the
    // first events may or may not have been flushed before the cut).
    sim.fault(json!({"mode": "drop", "after_events": 3, "count": 1})).await;
    let request = sim.request(Method::POST, "/v1/chat/completions", &[], &chat(true, true, 8, 8));
    match sim.client.request(request).await {
        Ok(response) => assert!(response.into_body().collect().await.is_err()),
        Err(e) => assert!(
            e.is_connect() || format!("{e:?}").contains("IncompleteMessage"),
            "{e:?}"
        ),
    }

    // A hang never answers; disarmed, calls are served again.
    sim.fault(json!({"mode": "hang", "count": 1})).await;
    let hung = sim.post("/v1/chat/completions", chat(false, false, 1, 1));
    assert!(tokio::time::timeout(Duration::from_millis(300), hung).await.is_err());
    sim.fault(json!({"mode": "status", "status": 500, "count": 5})).await;
    assert_eq!(
        sim.send(Method::DELETE, "/sim/faults", &[], &Value::Null).await.status,
        204
    );
    assert_eq!(
        sim.post("/v1/chat/completions", chat(false, false, 1, 1)).await.status,
        200
    );
    // Two 429s, a 529, a cut and a hang.
    assert_eq!(sim.stats().await["faults_injected"], 5);
    for bad in [
        json!({"mode": "status", "status": 200, "count": 1}),
        json!({"mode": "hang", "count": 0}),
        json!({"mode": "melt", "count": 1}),
    ] {
        assert_eq!(sim.post("/sim/faults", bad).await.status, 400);
    }
}

#[tokio::test]
async fn a_stream_paces_its_tokens_and_a_cancelled_stream_frees_its_slot_at_once() {
    let sim = start(limits(1, 40)).await;
    let started = Instant::now();
    let response = sim
        .client
        .request(sim.request(
            Method::POST,
            "/v1/chat/completions",
            &[],
            &chat(true, false, 1_000, 1_000),
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut seen = String::new();
    while !seen.contains("\"content\":\"the \"") {
        let frame = body.frame().await.unwrap().unwrap();
        seen.push_str(std::str::from_utf8(frame.data_ref().unwrap()).unwrap());
    }
    // The first token came after one token's time, not after the 40 s the call would take.
    assert!(started.elapsed() >= Duration::from_millis(40));
    let stats = sim.stats().await;
    assert_eq!(
        (stats["in_flight"].as_u64(), stats["in_flight_max"].as_u64()),
        (Some(1), Some(1))
    );
    // Concurrency 1 is taken: a second call is refused.
    assert_eq!(
        sim.post("/v1/chat/completions", chat(true, false, 1, 1)).await.status,
        429
    );
    drop(body);
    let deadline = Instant::now() + SETTLE_WAIT;
    while sim.stats().await["in_flight"] != 0 {
        assert!(
            Instant::now() < deadline,
            "the cancelled stream's slot was never released"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        sim.post("/v1/chat/completions", chat(true, false, 1, 1)).await.status,
        200
    );
    assert_eq!(
        sim.send(Method::DELETE, "/sim/stats", &[], &Value::Null).await.status,
        204
    );
    assert_eq!(sim.stats().await["in_flight_max"], 0);
}

#[tokio::test]
async fn a_required_key_is_checked_in_each_providers_header() {
    let control = SimControl::new(vec!["m".to_owned()], Some("sk-sim".to_owned()));
    let sim = start_with(limits(4, 0), control).await;
    let openai = json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1});
    let anthropic = json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]});
    let answer = sim
        .send(
            Method::POST,
            "/v1/chat/completions",
            &[("authorization", "Bearer nope")],
            &openai,
        )
        .await;
    assert_eq!(answer.status, 401);
    assert_eq!(answer.json()["error"]["code"], "invalid_api_key");
    let answer = sim
        .send(
            Method::POST,
            "/v1/chat/completions",
            &[("authorization", "Bearer sk-sim")],
            &openai,
        )
        .await;
    assert_eq!(answer.status, 200);
    let answer = sim
        .send(
            Method::POST,
            "/v1/messages",
            &[("authorization", "Bearer sk-sim")],
            &anthropic,
        )
        .await;
    assert_eq!(answer.status, 401);
    assert_eq!(answer.json()["error"]["type"], "authentication_error");
    let answer = sim
        .send(Method::POST, "/v1/messages", &[("x-api-key", "sk-sim")], &anthropic)
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(sim.provider.counts().admitted, 2);
}

#[tokio::test]
async fn a_fault_armed_for_a_time_covers_every_call_until_it_ends() {
    let sim = start(limits(4, 0)).await;
    sim.fault(json!({"mode": "status", "status": 503, "for_ms": 400})).await;
    for _ in 0..3 {
        let answer = sim.post("/v1/chat/completions", chat(false, false, 1, 1)).await;
        assert_eq!(answer.status, 503, "every call while armed, not a count");
    }
    tokio::time::sleep(Duration::from_millis(450)).await;
    let answer = sim.post("/v1/chat/completions", chat(false, false, 1, 1)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    for bad in [
        json!({"mode": "status", "status": 503, "for_ms": 0}),
        json!({"mode": "status", "status": 503, "for_ms": 3_600_001}),
    ] {
        assert_eq!(sim.post("/sim/faults", bad).await.status, 400);
    }
}
