//! Priority classes end to end on the memory backend (docs/gateway.md, "Classes"):
//! a lower class never takes the headroom, the top class can take everything, the
//! class header lowers a call's class and never raises it, and the class metrics.

mod support;

use support::*;

#[tokio::test]
async fn a_lower_class_never_takes_the_headroom_of_the_classes_above() {
    batch_never_takes_the_interactive_headroom(memory_backend()).await;
}

#[tokio::test]
async fn the_top_class_running_alone_takes_the_whole_limit() {
    let (provider, _) = start_provider().await;
    let backend = memory_backend();
    let gateway = start_gateway(&classes_config(provider), backend.clone()).await;
    let client = client();
    for _ in 0..CLASSES_RPM {
        let (status, body) = chat_as(&client, gateway, WEB_KEY, &[]).await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(in_use(&backend, CLASSES_RPM_KEY).await, CLASSES_RPM);
    assert_eq!(
        in_use(&backend, BATCH_CEILING_KEY).await,
        0,
        "the top class reserves no ceiling"
    );
}

#[tokio::test]
async fn the_class_header_lowers_a_calls_class_and_never_raises_it() {
    let (provider, _) = start_provider().await;
    let backend = memory_backend();
    let (gateway, metrics) = start_gateway_with_metrics(&classes_config(provider), backend.clone()).await;
    let client = client();
    // Lower: the interactive tenant's call runs as batch, on the batch ceiling.
    let (status, body) = chat_as(&client, gateway, WEB_KEY, &[("x-ratelimit-class", "batch")]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(in_use(&backend, BATCH_CEILING_KEY).await, 1);
    // Higher: a 403 in the provider's shape, nothing reserved.
    let (status, body) = chat_as(&client, gateway, ETL_KEY, &[("x-ratelimit-class", "interactive")]).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("permission_denied"), "{body}");
    // Unknown: a 400 naming the classes, nothing reserved.
    let (status, body) = chat_as(&client, gateway, WEB_KEY, &[("x-ratelimit-class", "urgent")]).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("interactive, batch"), "{body}");
    assert_eq!(in_use(&backend, CLASSES_RPM_KEY).await, 1);
    let reports = metrics.classes.reports();
    let batch = reports.iter().find(|r| r.class == "batch").unwrap();
    assert_eq!(
        (batch.model.as_str(), batch.admitted, batch.denied),
        ("gpt-4o-mini", 1, 0)
    );
    let mut text = String::new();
    metrics.render(&mut text);
    assert!(text.contains("ratelimiterd_gateway_class_admitted_total{model=\"gpt-4o-mini\",class=\"batch\"} 1"));
}

#[tokio::test]
async fn bad_classes_are_configuration_errors_naming_the_entry() {
    let (provider, _) = start_provider().await;
    let base = classes_config(provider);
    type Break = fn(&mut gateway::GatewayConfig);
    let cases: [(Break, &str); 3] = [
        (
            |c| c.tenants[1].class = Some("urgent".into()),
            "gateway.tenants[1].class",
        ),
        (|c| c.classes[0].share = 0, "gateway.classes[0].share"),
        (|c| c.classes[1].name = "interactive".into(), "gateway.classes[1].name"),
    ];
    for (break_it, entry) in cases {
        let mut config = base.clone();
        break_it(&mut config);
        let error = config.validate().unwrap_err().to_string();
        assert!(error.starts_with(entry), "{error}");
    }
    let yaml = "listen_addr: \"127.0.0.1:0\"\nupstreams: []\nmodels: []\nclasses:\n  - {name: a, headroom: 1.0}\n";
    let error = serde_yaml::from_str::<gateway::GatewayConfig>(yaml)
        .unwrap_err()
        .to_string();
    assert!(error.contains("headroom must be in [0, 1)"), "{error}");
}

/// The longest the other tenant's call may take while one tenant floods its own
/// limit: a small part of `max_wait_ms` (2 s), so a call that queued behind the
/// flood fails it, and room for a loaded 2-core machine.
const OTHER_TENANT_LATENCY_MAX_MS: u128 = 400;

/// Two classes and a model with ample room (500 rpm); the interactive tenant has
/// a small rpm of its own, the batch tenant none.
fn own_limit_config(provider: std::net::SocketAddr) -> gateway::GatewayConfig {
    std::env::set_var("GATEWAY_TEST_WEB_KEY", WEB_KEY);
    std::env::set_var("GATEWAY_TEST_ETL_KEY", ETL_KEY);
    let yaml = format!(
        r#"listen_addr: "127.0.0.1:0"
upstreams:
  - {{name: openai, kind: openai, base_url: "http://{provider}"}}
models:
  - {{name: gpt-4o-mini, upstream: openai, rpm: 500, tpm: 1000000, max_output_tokens_default: 50, max_wait_ms: 2000}}
classes:
  - {{name: interactive, share: 4, headroom: 0.1}}
  - {{name: batch, share: 1}}
tenants:
  - {{name: web, api_key_env: GATEWAY_TEST_WEB_KEY, class: interactive, rpm: 2}}
  - {{name: etl, api_key_env: GATEWAY_TEST_ETL_KEY, class: batch}}
"#
    );
    serde_yaml::from_str(&yaml).unwrap()
}

#[tokio::test]
async fn a_tenant_waiting_on_its_own_limit_never_holds_back_another_tenant() {
    let (provider, _) = start_provider().await;
    let backend = memory_backend();
    let gateway = start_gateway(&own_limit_config(provider), backend.clone()).await;
    let client = client();
    // The reference: the batch tenant's calls with nobody else calling.
    let mut alone_ms = Vec::new();
    for _ in 0..10 {
        let started = std::time::Instant::now();
        assert_eq!(chat_as(&client, gateway, ETL_KEY, &[]).await.0, 200);
        alone_ms.push(started.elapsed().as_millis());
    }
    alone_ms.sort_unstable();
    // The interactive tenant spends its own rpm, then loops over it on 4 connections.
    for _ in 0..2 {
        assert_eq!(chat_as(&client, gateway, WEB_KEY, &[]).await.0, 200);
    }
    let flooding = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut flood = Vec::new();
    for _ in 0..4 {
        let (client, flooding) = (client.clone(), flooding.clone());
        flood.push(tokio::spawn(async move {
            let mut refused = Vec::new();
            while flooding.load(std::sync::atomic::Ordering::Relaxed) {
                let (status, body) = chat_as(&client, gateway, WEB_KEY, &[]).await;
                refused.push((status.as_u16(), body));
            }
            refused
        }));
    }
    // Let the flood fill the queue.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mut latencies_ms = Vec::new();
    for _ in 0..10 {
        let started = std::time::Instant::now();
        let (status, body) = chat_as(&client, gateway, ETL_KEY, &[]).await;
        latencies_ms.push(started.elapsed().as_millis());
        assert_eq!(status, 200, "the batch tenant is not held back: {body}");
    }
    flooding.store(false, std::sync::atomic::Ordering::Relaxed);
    latencies_ms.sort_unstable();
    let slowest_ms = latencies_ms[latencies_ms.len() - 1];
    eprintln!(
        "the other tenant's calls during the flood: median {} ms, slowest {slowest_ms} ms; alone: median {} ms, slowest {} ms",
        latencies_ms[latencies_ms.len() / 2],
        alone_ms[alone_ms.len() / 2],
        alone_ms[alone_ms.len() - 1]
    );
    assert!(
        slowest_ms < OTHER_TENANT_LATENCY_MAX_MS,
        "the batch tenant waited {slowest_ms} ms behind another tenant's own limit"
    );
    // Each flooding call's 429 names its own tenant's key, with its own hint.
    for task in flood {
        for (status, body) in task.await.unwrap() {
            assert_eq!(status, 429, "{body}");
            assert!(body.contains("tenant:web:llm:rpm"), "{body}");
        }
    }
}
