//! The simulated provider over real HTTP: limits answered with 429 and the
//! headers clients read, bad requests with 400.

use std::sync::Arc;

use ratelimiter::{Clock, FakeClock, SystemClock};
use replay::sim::limits::{Accounting, ProviderLimits};
use replay::sim::server::ProviderServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn start(limits: ProviderLimits) -> (String, Arc<ProviderServer>) {
    start_with_clock(limits, Arc::new(SystemClock::new())).await
}

async fn start_with_clock(limits: ProviderLimits, clock: Arc<dyn Clock>) -> (String, Arc<ProviderServer>) {
    let provider = ProviderServer::new(limits, clock);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(Arc::clone(&provider).serve(listener, std::future::pending()));
    (addr, provider)
}

/// Sends one request and returns the status line, headers (lower-cased) and body.
async fn post(addr: &str, body: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head[9..12].parse().unwrap();
    (status, head.to_lowercase(), body.to_owned())
}

fn chat(prompt_bytes: usize, max_tokens: u64, output: u64) -> String {
    format!(
        r#"{{"model":"sim-model","messages":[{{"role":"user","content":"{}"}}],"max_tokens":{max_tokens},"sim_output_tokens":{output}}}"#,
        "x".repeat(prompt_bytes)
    )
}

fn limits(rpm: u64, tpm: u64, accounting: Accounting) -> ProviderLimits {
    ProviderLimits {
        rpm,
        tpm,
        window_ms: 60_000,
        concurrency: 4,
        ms_per_output_token: 0,
        accounting,
    }
}

#[tokio::test]
async fn requests_over_the_limit_get_429_with_hints() {
    let (addr, provider) = start(limits(2, 1_000, Accounting::Actual)).await;
    let (status, head, body) = post(&addr, &chat(40, 100, 5)).await;
    assert_eq!(status, 200, "{body}");
    let usage: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        usage["usage"],
        serde_json::json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
    );
    assert!(head.contains("x-ratelimit-remaining-requests: 1\r\n"), "{head}");
    assert!(head.contains("x-ratelimit-remaining-tokens: 985\r\n"), "{head}");
    assert_eq!(post(&addr, &chat(4, 10, 1)).await.0, 200);
    let (status, head, body) = post(&addr, &chat(4, 10, 1)).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        head.contains("retry-after: 60\r\n") || head.contains("retry-after: 59\r\n"),
        "{head}"
    );
    assert!(head.contains("x-ratelimit-remaining-requests: 0\r\n"), "{head}");
    assert!(body.contains("\"type\":\"requests\""), "{body}");
    assert_eq!(provider.counts().throttled, 1);
    assert_eq!(provider.counts().admitted, 2);
}

#[tokio::test]
async fn openai_accounting_charges_max_tokens_and_refuses_by_tokens() {
    let (addr, provider) = start(limits(100, 1_000, Accounting::Openai)).await;
    // 100 prompt tokens + max_tokens 800 = 900 charged though only 3 are generated.
    let (status, head, _) = post(&addr, &chat(400, 800, 3)).await;
    assert_eq!(status, 200);
    assert!(head.contains("x-ratelimit-remaining-tokens: 100\r\n"), "{head}");
    let (status, head, body) = post(&addr, &chat(4, 100, 1)).await;
    assert_eq!(status, 429);
    assert!(body.contains("\"type\":\"tokens\""), "{body}");
    assert!(head.contains("x-ratelimit-remaining-tokens: 100\r\n"), "{head}");
    assert_eq!(provider.counts().charged_tokens, 900);
}

#[tokio::test]
async fn bad_requests_get_400_and_change_nothing() {
    let (addr, provider) = start(limits(100, 1_000, Accounting::Actual)).await;
    for body in [
        "not json".to_owned(),
        r#"{"model":"sim-model","messages":[]}"#.to_owned(),
        chat(4, 0, 1),
        chat(4, 200_000, 1),
        chat(8_000, 10, 1),
    ] {
        let (status, _, answer) = post(&addr, &body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer.contains("\"error\""), "{answer}");
    }
    assert_eq!(provider.counts().admitted, 0);
    assert_eq!(provider.counts().charged_tokens, 0);
}

#[tokio::test]
async fn profiles_answer_with_their_providers_headers_and_bodies() {
    use replay::sim::profile::{ProfileName, SimProfile};
    // Anthropic: 120 RPM in a bucket; 1,000 output tokens a minute held from max_tokens.
    let (addr, provider) = start(limits(120, 100_000, Accounting::Actual)).await;
    let profile = SimProfile {
        output_tpm: 1_000,
        ..SimProfile::with_defaults(ProfileName::Anthropic, &provider.limits())
    };
    provider.set_profile(profile);
    let (status, head, body) = post(&addr, &chat(40, 600, 5)).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        head.contains("anthropic-ratelimit-input-tokens-remaining: 99990\r\n"),
        "{head}"
    );
    assert!(
        head.contains("anthropic-ratelimit-output-tokens-remaining: 400\r\n"),
        "{head}"
    );
    assert!(head.contains("anthropic-ratelimit-requests-reset: "), "{head}");
    // The first call ended with 5 output tokens: 995 are left, not the 999 asked.
    let (status, head, body) = post(&addr, &chat(40, 999, 5)).await;
    assert_eq!(status, 429, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "rate_limit_error");
    assert!(head.contains("retry-after: "), "{head}");

    // OpenAI: 600 RPM quantized to a second admits 10 of a burst of 20. The
    // clock stands still, so the burst falls in one second however slow the
    // machine is; the next second admits again.
    let clock = FakeClock::new(1_800_000_000_000);
    let (addr, provider) = start_with_clock(limits(600, 1_000_000, Accounting::Actual), Arc::new(clock.clone())).await;
    provider.set_profile(SimProfile::with_defaults(ProfileName::Openai, &provider.limits()));
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(post(&addr, &chat(4, 10, 1)).await.0);
    }
    let admitted = statuses.iter().filter(|&&s| s == 200).count();
    assert_eq!(admitted, 10, "{statuses:?}");
    assert!(statuses[..10].iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(provider.counts().throttled, 10);
    clock.advance_ms(1_000);
    assert_eq!(post(&addr, &chat(4, 10, 1)).await.0, 200);
}
