//! The limiter's API traced, through the real `ratelimiterd` binary without a
//! gateway and the library's HTTP client (docs/observability.md, "The limiter's
//! API"): a reserve and a complete sent within the caller's trace context are
//! SERVER spans of the caller's trace, with the limit keys, the decision and,
//! on a denial, the binding key and the retry hint.

#[path = "telemetry_support/otlp.rs"]
mod otlp;
#[path = "telemetry_support/rig.rs"]
mod rig;
mod support;

use opentelemetry_proto::tonic::trace::v1::Span;
use otlp::{attribute, hex, int, kind, spans_of, start_receiver, string, Any, SpanKind};
use ratelimiter::httpclient::{with_trace_context, TraceContext};
use ratelimiter::{Actual, CompleteRequest, LeaseId, LimitKey, Limiter, Requirement, ReserveRequest};
use rig::{as_env, export_env, start_server, traceparent};
use serde_json::json;
use support::{temp_dir, ADMIN_TOKEN, CLIENT_TOKEN};

/// The parent span id [`traceparent`] writes.
const PARENT_ID: &str = "00f067aa0ba902b7";

/// The span named `name` among `spans`.
fn named<'a>(spans: &'a [(String, Span)], name: &str) -> &'a Span {
    let found = spans.iter().find(|(_, s)| s.name == name);
    &found.unwrap_or_else(|| panic!("no {name} in {spans:?}")).1
}

/// The span's `ratelimiter.limit_keys`.
fn keys(span: &Span) -> Vec<String> {
    match attribute(&span.attributes, "ratelimiter.limit_keys") {
        Some(Any::ArrayValue(array)) => (array.values.iter())
            .filter_map(|v| match &v.value {
                Some(Any::StringValue(s)) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        other => panic!("limit keys: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_reserve_and_complete_continue_the_callers_trace() {
    let (receiver, got) = start_receiver().await;
    let dir = temp_dir("telemetry-api");
    let env = export_env(receiver);
    let server = start_server(&dir, "", &as_env(&env));
    let definition = json!({"key": "global:rpm", "kind": "rolling", "capacity": 1, "window_seconds": 60});
    server
        .client(ADMIN_TOKEN)
        .put_limit(&serde_json::from_value(definition).unwrap())
        .await
        .unwrap();
    let client = server.client(CLIENT_TOKEN);
    let key = LimitKey::new("global:rpm").unwrap();
    let reserve = || {
        ReserveRequest::new(
            LeaseId::generate(),
            None,
            vec![Requirement {
                key: key.clone(),
                amount: 1,
            }],
        )
    };
    // Allowed, then completed, in one trace.
    let (allowed_trace, parent) = traceparent(1);
    let request = reserve().unwrap();
    let context = TraceContext::new(&parent, Some("vendor=x")).unwrap();
    with_trace_context(context, async {
        assert!(client.reserve(&request).await.unwrap().is_allowed());
        let actual = Actual {
            key: key.clone(),
            actual_amount: 1,
        };
        client
            .complete(&CompleteRequest::new(request.lease_id(), None, vec![actual]).unwrap())
            .await
            .unwrap();
    })
    .await;
    // Denied, in another.
    let (denied_trace, parent) = traceparent(2);
    let context = TraceContext::new(&parent, None).unwrap();
    let denied = with_trace_context(context, client.reserve(&reserve().unwrap()))
        .await
        .unwrap();
    assert!(!denied.is_allowed());
    let spans = spans_of(&got, &allowed_trace, 2).await;
    let (service, _) = &spans[0];
    assert_eq!(service, "ratelimiterd");
    let reserved = named(&spans, "POST /v1/reserve");
    assert!(kind(reserved, SpanKind::Server));
    assert_eq!(
        hex(&reserved.parent_span_id),
        PARENT_ID,
        "the caller's span is the parent"
    );
    let attrs = &reserved.attributes;
    assert_eq!(string(attrs, "http.route").as_deref(), Some("/v1/reserve"));
    assert_eq!(int(attrs, "http.response.status_code"), Some(200));
    assert_eq!(string(attrs, "ratelimiter.decision").as_deref(), Some("allowed"));
    assert_eq!(keys(reserved), ["global:rpm"]);
    let completed = named(&spans, "POST /v1/complete");
    assert_eq!(hex(&completed.parent_span_id), PARENT_ID);
    assert_eq!(keys(completed), ["global:rpm"]);
    let lease = request.lease_id().to_string();
    for (_, span) in &spans {
        let all = format!("{:?}", span.attributes);
        assert!(
            !all.contains(&lease) && !all.contains(CLIENT_TOKEN),
            "no lease id, no token: {all}"
        );
    }
    let spans = spans_of(&got, &denied_trace, 1).await;
    let attrs = &named(&spans, "POST /v1/reserve").attributes;
    assert_eq!(string(attrs, "ratelimiter.decision").as_deref(), Some("denied"));
    assert_eq!(string(attrs, "ratelimiter.denied_by").as_deref(), Some("global:rpm"));
    assert_eq!(
        string(attrs, "ratelimiter.denial").as_deref(),
        Some("insufficient_capacity")
    );
    assert!(
        int(attrs, "ratelimiter.retry_after_ms").is_some_and(|ms| ms > 0),
        "{attrs:?}"
    );
}
