//! The client against fake servers: retries with the same lease id, failover, errors mapped back.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use std::time::Duration;

use super::*;
use crate::base::id::LeaseId;
use crate::limiting::limiter::Limiter;
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;
use crate::model::wire::Requirement;
use crate::model::wire::{CompleteRequest, ReserveOutcome, ReserveRequest};

/// What the fake server does with one request.
#[derive(Clone, Copy)]
enum Canned {
    /// Answers this status and JSON body.
    Answer(u16, &'static str),
    /// Never answers: the client must time out.
    Silent,
    /// Closes the connection without answering: a server dying mid-request.
    HangUp,
}
use Canned::{Answer, HangUp, Silent};

/// A fake server that answers each request with the next canned answer and
/// records every request body. One request per connection keeps it simple.
async fn fake_server(answers: Vec<Canned>) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let seen = bodies.clone();
    tokio::spawn(async move {
        for answer in answers {
            let (mut stream, _) = listener.accept().await.unwrap();
            let body = read_request(&mut stream).await;
            seen.lock().unwrap().push(body);
            match answer {
                Answer(status, json) => {
                    let response = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{json}",
                        json.len()
                    );
                    stream.write_all(response.as_bytes()).await.unwrap();
                }
                // Keep the connection open and silent until the test ends.
                Silent => drop(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    drop(stream);
                })),
                HangUp => drop(stream),
            }
        }
    });
    (url, bodies)
}

async fn read_request(stream: &mut TcpStream) -> String {
    read_head_and_body(stream).await.1
}

/// A request's head (request line and headers) and its body.
async fn read_head_and_body(stream: &mut TcpStream) -> (String, String) {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "client closed early");
        data.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&data).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .map(|v| v.trim().parse::<usize>().unwrap())
                .unwrap_or(0);
            if data.len() >= end + 4 + length {
                return (text[..end].to_owned(), text[end + 4..end + 4 + length].to_owned());
            }
        }
    }
}

fn client(url: &str, retries_max: u32) -> HttpClient {
    fleet_client(&[url], retries_max)
}

fn fleet_client(urls: &[&str], retries_max: u32) -> HttpClient {
    HttpClient::new(HttpClientConfig {
        request_timeout_ms: 300,
        retries_max,
        retry_wait_ms_max: 5,
        ..HttpClientConfig::fleet(urls.iter().copied())
    })
    .unwrap()
}

/// The URL of a port that was bound, then closed: connecting is refused.
async fn dead_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

/// Asserts every recorded body is `request`, the same lease id included.
fn assert_all_sent(bodies: &Mutex<Vec<String>>, request: &ReserveRequest, count: usize) {
    let bodies = bodies.lock().unwrap();
    assert_eq!(bodies.len(), count, "{bodies:?}");
    for body in bodies.iter() {
        assert_eq!(&serde_json::from_str::<ReserveRequest>(body).unwrap(), request);
    }
}

fn request() -> ReserveRequest {
    let requirement = Requirement {
        key: LimitKey::new("global:rpm").unwrap(),
        amount: 1,
    };
    ReserveRequest::new(LeaseId::generate(), None, vec![requirement]).unwrap()
}

const ALLOWED: &str = r#"{"allowed":true,"retry_after_ms":0,"reserved_at_unix_ms":1234}"#;
const UNAVAILABLE: &str = r#"{"error":"backend_unavailable","retry_after_ms":3}"#;

#[tokio::test]
async fn a_503_and_a_timeout_are_retried_with_the_same_lease_id() {
    let (url, bodies) = fake_server(vec![Answer(503, UNAVAILABLE), Silent, Answer(200, ALLOWED)]).await;
    let request = request();
    let outcome = client(&url, 2).reserve(&request).await.unwrap();
    assert_eq!(
        outcome,
        ReserveOutcome::Allowed {
            reserved_at_unix_ms: 1234
        }
    );
    let bodies = bodies.lock().unwrap();
    assert_eq!(bodies.len(), 3);
    for body in bodies.iter() {
        let sent: ReserveRequest = serde_json::from_str(body).unwrap();
        assert_eq!(sent, request);
    }
}

#[tokio::test]
async fn retries_are_bounded_and_end_in_unavailable() {
    let (url, bodies) = fake_server(vec![Answer(503, UNAVAILABLE), Answer(503, UNAVAILABLE)]).await;
    let error = client(&url, 1).reserve(&request()).await.unwrap_err();
    assert_eq!(error, LimiterError::Unavailable { retry_after_ms: 3 });
    assert_eq!(bodies.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn error_statuses_map_back_to_limiter_errors() {
    let cases: Vec<(u16, &'static str, LimiterError)> = vec![
        (
            404,
            r#"{"allowed":false,"retry_after_ms":0,"error":"unknown_limit_key: global:rpm"}"#,
            LimiterError::UnknownKey(LimitKey::new("global:rpm").unwrap()),
        ),
        (
            400,
            r#"{"error":"invalid_request: bad"}"#,
            LimiterError::InvalidRequest("bad".into()),
        ),
        (
            409,
            r#"{"error":"conflict: kind"}"#,
            LimiterError::Conflict("kind".into()),
        ),
        (
            500,
            r#"{"error":"backend_error"}"#,
            LimiterError::Backend("HTTP 500: backend_error".into()),
        ),
        (
            429,
            r#"{"error":"too_many_leases: client_tokens[0] holds 10 live leases","retry_after_ms":1000}"#,
            LimiterError::TooManyLeases {
                retry_after_ms: 1000,
                message: "client_tokens[0] holds 10 live leases".into(),
            },
        ),
    ];
    for (status, body, expected) in cases {
        let (url, _) = fake_server(vec![Answer(status, body)]).await;
        assert_eq!(client(&url, 0).reserve(&request()).await.unwrap_err(), expected);
    }
}

#[tokio::test]
async fn denials_and_completions_are_read_back() {
    let denied =
        r#"{"allowed":false,"retry_after_ms":40,"reserved_at_unix_ms":0,"error":"insufficient_capacity:global:rpm"}"#;
    let (url, bodies) = fake_server(vec![Answer(200, denied), Answer(200, r#"{"ok":true}"#)]).await;
    let client = client(&url, 0);
    let outcome = client.reserve(&request()).await.unwrap();
    assert!(!outcome.is_allowed());
    let complete = CompleteRequest::new(LeaseId::generate(), None, vec![]).unwrap();
    client.complete(&complete).await.unwrap();
    assert!(bodies.lock().unwrap()[1].contains(&complete.lease_id().to_string()));
}

#[test]
fn bad_configurations_are_refused() {
    assert!(HttpClient::new(HttpClientConfig::new("https://x:1")).is_err());
    assert!(HttpClient::new(HttpClientConfig::new("x:1")).is_err());
    let too_many = HttpClientConfig {
        retries_max: RETRIES_MAX_LIMIT + 1,
        ..HttpClientConfig::new("http://127.0.0.1:1")
    };
    assert!(HttpClient::new(too_many).is_err());
}

#[test]
fn bad_server_lists_are_refused_with_a_reason() {
    let error = |urls: Vec<String>| HttpClient::new(HttpClientConfig::fleet(urls)).unwrap_err().to_string();
    assert!(error(vec![]).contains("at least one"));
    let many: Vec<String> = (0..=SERVERS_MAX)
        .map(|i| format!("http://127.0.0.1:{}", 1000 + i))
        .collect();
    assert!(error(many).contains(&format!("at most {SERVERS_MAX}")));
    let twice = vec!["http://127.0.0.1:1".to_owned(), "http://127.0.0.1:1/".to_owned()];
    assert!(error(twice).contains("listed twice"));
    for bad in [
        "http://",
        "http://a:1?x=1",
        "127.0.0.1:1",
        "https://a:1",
        "http://a b:1",
    ] {
        let urls = vec!["http://127.0.0.1:1".to_owned(), bad.to_owned()];
        assert!(error(urls).contains(&format!("{bad:?}")), "{bad}");
    }
    let fleet = HttpClient::new(HttpClientConfig::fleet(["http://a:1/", " http://b:2"])).unwrap();
    assert_eq!(fleet.servers(), ["http://a:1", "http://b:2"]);
    assert_eq!(fleet.preferred_server(), "http://a:1");
}

#[tokio::test]
async fn a_refused_first_server_fails_over_with_the_same_lease_id() {
    let dead = dead_server().await;
    let (live, bodies) = fake_server(vec![Answer(200, ALLOWED)]).await;
    let request = request();
    let client = fleet_client(&[&dead, &live], 1);
    assert!(client.reserve(&request).await.unwrap().is_allowed());
    assert_all_sent(&bodies, &request, 1);
    assert_eq!(client.preferred_server(), live);
}

#[tokio::test]
async fn a_server_dying_mid_request_costs_one_attempt_not_one_per_call() {
    let (dying, dying_bodies) = fake_server(vec![HangUp, Answer(200, ALLOWED)]).await;
    let (live, live_bodies) = fake_server(vec![Answer(200, ALLOWED), Answer(200, r#"{"ok":true}"#)]).await;
    let request = request();
    let client = fleet_client(&[&dying, &live], 1);
    assert!(client.reserve(&request).await.unwrap().is_allowed());
    assert_all_sent(&dying_bodies, &request, 1);
    assert_all_sent(&live_bodies, &request, 1);
    // Later calls, from clones too, start on the server that answered.
    let complete = CompleteRequest::new(request.lease_id(), None, vec![]).unwrap();
    client.clone().complete(&complete).await.unwrap();
    assert_eq!(dying_bodies.lock().unwrap().len(), 1);
    assert_eq!(live_bodies.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_503_fails_over_at_once_whatever_its_hint() {
    const LONG_HINT: &str = r#"{"error":"backend_unavailable","retry_after_ms":60000}"#;
    let (busy, busy_bodies) = fake_server(vec![Answer(503, LONG_HINT)]).await;
    let (live, live_bodies) = fake_server(vec![Answer(200, ALLOWED)]).await;
    let client = HttpClient::new(HttpClientConfig {
        retries_max: 1,
        retry_wait_ms_max: 60_000,
        ..HttpClientConfig::fleet([&busy, &live])
    })
    .unwrap();
    let request = request();
    let started = std::time::Instant::now();
    assert!(client.reserve(&request).await.unwrap().is_allowed());
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_all_sent(&busy_bodies, &request, 1);
    assert_all_sent(&live_bodies, &request, 1);
    assert_eq!(client.preferred_server(), live);
}

#[tokio::test]
async fn failover_attempts_are_bounded_in_total_and_wrap_around() {
    let (a, a_bodies) = fake_server(vec![Answer(503, UNAVAILABLE), Answer(503, UNAVAILABLE)]).await;
    let (b, b_bodies) = fake_server(vec![Answer(503, UNAVAILABLE), Answer(200, ALLOWED)]).await;
    let (c, c_bodies) = fake_server(vec![Answer(503, UNAVAILABLE), Answer(200, ALLOWED)]).await;
    let request = request();
    let client = fleet_client(&[&a, &b, &c], 3);
    let error = client.reserve(&request).await.unwrap_err();
    assert_eq!(error, LimiterError::Unavailable { retry_after_ms: 3 });
    // Four attempts: a, b, c, then a again; the preference did not move.
    assert_all_sent(&a_bodies, &request, 2);
    assert_all_sent(&b_bodies, &request, 1);
    assert_all_sent(&c_bodies, &request, 1);
    assert_eq!(client.preferred_server(), a);
}

#[tokio::test]
async fn denials_and_4xx_are_never_tried_elsewhere() {
    let denied =
        r#"{"allowed":false,"retry_after_ms":40,"reserved_at_unix_ms":0,"error":"insufficient_capacity:global:rpm"}"#;
    let (first, first_bodies) = fake_server(vec![
        Answer(200, denied),
        Answer(400, r#"{"error":"invalid_request: bad"}"#),
    ])
    .await;
    let (second, second_bodies) = fake_server(vec![Answer(200, ALLOWED)]).await;
    let client = fleet_client(&[&first, &second], 3);
    assert!(!client.reserve(&request()).await.unwrap().is_allowed());
    let error = client.reserve(&request()).await.unwrap_err();
    assert_eq!(error, LimiterError::InvalidRequest("bad".into()));
    assert_eq!(first_bodies.lock().unwrap().len(), 2);
    assert!(second_bodies.lock().unwrap().is_empty());
}

#[tokio::test]
async fn admin_calls_fail_over_too() {
    let dead = dead_server().await;
    let report = r#"[]"#;
    let (live, bodies) = fake_server(vec![Answer(200, report)]).await;
    let client = fleet_client(&[&dead, &live], 1);
    assert!(client.limits().await.unwrap().is_empty());
    assert_eq!(bodies.lock().unwrap().len(), 1);
}

/// A fake server that answers `answers` requests allowed, recording each request's head.
async fn head_recorder(answers: usize) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        for _ in 0..answers {
            let (mut stream, _) = listener.accept().await.unwrap();
            let (head, _) = read_head_and_body(&mut stream).await;
            seen.lock().unwrap().push(head.to_ascii_lowercase());
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{ALLOWED}",
                ALLOWED.len()
            );
            stream.write_all(response.as_bytes()).await.unwrap();
        }
    });
    (url, heads)
}

#[tokio::test]
async fn the_callers_trace_context_is_sent_within_its_scope_only() {
    let (url, heads) = head_recorder(2).await;
    let client = client(&url, 0);
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let context = TraceContext::new(parent, Some("vendor=x")).unwrap();
    let traced = with_trace_context(context, client.reserve(&request())).await;
    assert!(matches!(traced, Ok(ReserveOutcome::Allowed { .. })), "{traced:?}");
    client.reserve(&request()).await.unwrap();
    let heads = heads.lock().unwrap().clone();
    assert!(heads[0].contains(&format!("traceparent: {parent}")), "{}", heads[0]);
    assert!(heads[0].contains("tracestate: vendor=x"), "{}", heads[0]);
    assert!(!heads[1].contains("traceparent"), "{}", heads[1]);
}
