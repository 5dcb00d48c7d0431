//! A bounded fuzz target for the gateway's request parsing and counting, and
//! for the usage scan of answers: proptest over arbitrary JSON, through the
//! router without a socket (so it holds whatever the parsers become inside).
//!
//! For every request: no panic, never a 500, every error in its provider's
//! shape, and nothing left reserved (the upstream is unreachable, so a call
//! that passes parsing is admitted, refused by the network, and released).
//! For every answer, split anywhere: the scanner reads the same usage as a
//! whole-document parse.
//!
//! It runs in CI for a bounded number of cases;
//! `GATEWAY_FUZZ_CASES=100000 cargo test --release -p gateway --test parsing_fuzz`
//! runs it longer.

mod support;

use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use serde_json::{json, Map, Value};
use support::{in_use, memory_backend, TENANT_KEY};
use tower::ServiceExt;

/// Cases per property unless `GATEWAY_FUZZ_CASES` says otherwise: seconds in a debug build.
const CASES_DEFAULT: u32 = 256;
/// Field names the parsers look at, so arbitrary values land where they are read.
const FIELDS: [&str; 24] = [
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "stream",
    "stream_options",
    "n",
    "input",
    "instructions",
    "content",
    "role",
    "type",
    "text",
    "image_url",
    "url",
    "detail",
    "tools",
    "system",
    "usage",
    "prompt_tokens",
    "input_tokens",
    "source",
    "data",
];
const MODELS: [&str; 3] = ["gpt-4o-mini", "claude-test", "no-such-model"];
const PATHS: [&str; 5] = [
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
];

fn cases() -> u32 {
    std::env::var("GATEWAY_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASES_DEFAULT)
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(&FIELDS[..]).prop_map(str::to_owned),
        1 => "[a-z\"\\\\ ]{0,8}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(|n| json!(n)),
        (0u64..5_000).prop_map(|n| json!(n)),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,24}".prop_map(Value::String),
        proptest::sample::select(
            &[
                "user",
                "assistant",
                "text",
                "image_url",
                "image",
                "data:image/png;base64,iVBORw0KGgo="
            ][..]
        )
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(key(), inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A request body: usually an object with a known model, sometimes anything.
fn request_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => (proptest::sample::select(&MODELS[..]), proptest::collection::btree_map(key(), json_value(), 0..8))
            .prop_map(|(model, fields)| {
                let mut object: Map<String, Value> = fields.into_iter().collect();
                object.insert("model".into(), json!(model));
                Value::Object(object).to_string().into_bytes()
            }),
        2 => json_value().prop_map(|v| v.to_string().into_bytes()),
        1 => proptest::collection::vec(any::<u8>(), 0..64),
    ]
}

#[test]
fn arbitrary_requests_are_answered_in_shape_and_leave_nothing_reserved() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let backend = memory_backend();
    let router = runtime.block_on(async {
        // Every upstream is unreachable: what passes parsing is admitted, sent
        // nowhere, and released.
        let mut config = support::config("127.0.0.1:9".parse().unwrap(), 0);
        config.body_bytes_max = 16 * 1024;
        let gateway = gateway::Gateway::new(&config, backend.clone()).unwrap();
        for definition in gateway.definitions() {
            backend.apply_definition(definition).await.unwrap();
        }
        gateway::router(Arc::new(gateway))
    });
    let mut runner = TestRunner::new(ProptestConfig::with_cases(cases()));
    let statuses = std::cell::RefCell::new(std::collections::BTreeMap::<u16, u64>::new());
    let strategy = (proptest::sample::select(&PATHS[..]), request_body());
    runner
        .run(&strategy, |(path, body)| {
            let request = Request::post(path)
                .header("content-type", "application/json")
                .header("authorization", format!("Bearer {TENANT_KEY}"))
                .header("anthropic-version", "2023-06-01")
                .body(Body::from(body))
                .unwrap();
            let (status, answer) = runtime.block_on(async {
                let response = router.clone().oneshot(request).await.unwrap();
                let status = response.status().as_u16();
                let bytes = response.into_body().collect().await.unwrap().to_bytes();
                (status, bytes)
            });
            prop_assert!(
                [400, 404, 413, 429, 502].contains(&status),
                "{path}: status {status}: {}",
                String::from_utf8_lossy(&answer)
            );
            *statuses.borrow_mut().entry(status).or_default() += 1;
            let error: Value = serde_json::from_slice(&answer).expect("a JSON error");
            let message = error["error"]["message"].as_str();
            prop_assert!(message.is_some_and(|m| !m.is_empty()), "{error}");
            Ok(())
        })
        .unwrap();
    eprintln!("statuses: {:?}", statuses.borrow());
    runtime.block_on(async {
        for key in [
            "global:llm:openai:gpt-4o-mini:concurrency",
            "global:llm:anthropic:claude-test:concurrency",
        ] {
            support::eventually_in_use(&backend, key, 0).await;
        }
        assert_eq!(in_use(&backend, "global:llm:openai:gpt-4o-mini:tpm").await, 0);
        assert_eq!(in_use(&backend, "global:llm:anthropic:claude-test:input_tpm").await, 0);
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn the_usage_scan_reads_what_a_whole_parse_reads(
        fields in proptest::collection::btree_map(key(), json_value(), 0..8),
        usage in proptest::option::of(json_value()),
        splits in proptest::collection::vec(any::<proptest::sample::Index>(), 0..6),
    ) {
        let mut object: Map<String, Value> = fields.into_iter().collect();
        if let Some(usage) = usage {
            object.insert("usage".into(), usage);
        }
        let body = Value::Object(object).to_string().into_bytes();
        let whole = gateway::wire::usage::UsageFields::of_answer(&body);
        let mut cuts: Vec<usize> = splits.iter().map(|i| i.index(body.len() + 1)).collect();
        cuts.sort_unstable();
        let mut scanner = gateway::wire::usage_scan::UsageScanner::default();
        let mut from = 0;
        for cut in cuts.into_iter().chain([body.len()]) {
            scanner.push(&body[from..cut]);
            from = cut;
        }
        let scanned = scanner.answer().and_then(|a| gateway::wire::usage::UsageFields::of_answer(&a));
        prop_assert_eq!(scanned, whole, "{}", String::from_utf8_lossy(&body));
    }
}
