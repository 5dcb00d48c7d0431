//! The Grafana dashboard in docs/grafana/ratelimiterd.json queries only series
//! that `/metrics` exports: a renamed or removed metric fails here, not on an
//! operator's empty panel.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use ratelimiter::registry::Registry;
use ratelimiterd::{app, AppState, Config};
use support::temp_dir;
use tower::ServiceExt;

const DASHBOARD: &str = include_str!("../../../docs/grafana/ratelimiterd.json");
/// The prefix of every series the server exports.
const PREFIX: &str = "ratelimiterd_";

/// Every metric name in `text`: each run of name characters that starts with [`PREFIX`].
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(PREFIX) {
        let preceded = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if !preceded.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            names.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// The series a Prometheus text exposition declares, histograms with their
/// `_bucket`, `_sum` and `_count` series.
fn exported(exposition: &str) -> BTreeSet<String> {
    let mut series = BTreeSet::new();
    for line in exposition.lines() {
        let Some(declaration) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = declaration.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            panic!("a malformed TYPE line: {line}");
        };
        series.insert(name.to_owned());
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                series.insert(format!("{name}{suffix}"));
            }
        }
    }
    series
}

/// `/metrics` of a server on the memory backend with a gateway attached.
async fn exposition() -> String {
    let dir = temp_dir("grafana");
    let yaml = format!(
        "registry:\n  path: {}\ngateway:\n  listen_addr: \"127.0.0.1:0\"\n  allow_anonymous: true\n  upstreams:\n    - {{name: openai, kind: openai, base_url: \"http://127.0.0.1:9\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: openai, rpm: 100, max_output_tokens_default: 64}}\n",
        dir.join("limits.json").display()
    );
    let config = Config::parse(&yaml, std::path::Path::new("grafana.yaml")).unwrap();
    // The backend as the server builds it: the memory backend with its snapshots' metrics.
    let selected = ratelimiterd::backend::build(&config).await.unwrap();
    let state = AppState::new(
        selected,
        Some(Registry::open(dir.join("limits.json")).unwrap()),
        &config,
    );
    let gateway = gateway::Gateway::new(config.gateway.as_ref().unwrap(), state.backend().clone()).unwrap();
    state.set_gateway(Arc::new(gateway));
    let request = Request::get("/metrics").body(Body::empty()).unwrap();
    let response = app(state).oneshot(request).await.unwrap();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 24).await.unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn every_series_the_dashboard_queries_is_exported() {
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let queried = metric_names(DASHBOARD);
    assert!(queried.len() >= 15, "the dashboard queries {queried:?}");
    let exported = exported(&exposition().await);
    let missing: Vec<_> = queried.difference(&exported).collect();
    assert!(missing.is_empty(), "queried but not exported: {missing:?}");
    // Every panel but the rows queries something.
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] != "row" {
            assert!(!panel["targets"].as_array().unwrap().is_empty(), "{}", panel["title"]);
        }
    }
}

#[test]
fn names_are_read_whole() {
    let names = metric_names("rate(ratelimiterd_a_total{x=\"y\"}[5m]) / xratelimiterd_b + ratelimiterd_c_bucket");
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["ratelimiterd_a_total", "ratelimiterd_c_bucket"]
    );
    let series = exported("# HELP h x\n# TYPE ratelimiterd_h histogram\n# TYPE ratelimiterd_c counter\n");
    assert!(series.contains("ratelimiterd_h_bucket") && series.contains("ratelimiterd_c"));
    assert!(!series.contains("ratelimiterd_c_bucket"));
}
