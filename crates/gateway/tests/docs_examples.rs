//! Every `gateway:` example of docs/gateway.md and the README is started: its
//! keys set in the environment, the gateway built on a memory backend, its
//! limits defined and served on a free port, and one unauthenticated call
//! answered (a 401 with tenants, else past authentication).

mod support;

use std::collections::BTreeSet;

use serde_yaml::Value;

/// The fenced `yaml` blocks of `text` whose top level has a `gateway:` key.
fn gateway_examples(text: &str) -> Vec<String> {
    let mut examples = Vec::new();
    let mut block: Option<String> = None;
    for line in text.lines() {
        match (&mut block, line.trim_start()) {
            (None, fence) if fence.starts_with("```yaml") => block = Some(String::new()),
            (Some(_), "```") => {
                let done = block.take().unwrap();
                if done.lines().any(|l| l == "gateway:") {
                    examples.push(done);
                }
            }
            (Some(body), _) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, _) => {}
        }
    }
    examples
}

/// Every `api_key_env` of the section, each set to a key of its own.
fn set_keys(section: &Value) {
    let mut names = BTreeSet::new();
    for list in ["upstreams", "tenants"] {
        for entry in section[list].as_sequence().into_iter().flatten() {
            if let Some(name) = entry["api_key_env"].as_str() {
                names.insert(name.to_owned());
            }
        }
    }
    for name in names {
        std::env::set_var(&name, format!("docs-example-key-{name}-0123456789"));
    }
}

#[tokio::test]
async fn every_gateway_example_in_the_docs_starts() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let mut started = 0;
    for file in ["docs/gateway.md", "README.md"] {
        let text = std::fs::read_to_string(format!("{root}/{file}")).unwrap();
        for example in gateway_examples(&text) {
            let document: Value = serde_yaml::from_str(&example).unwrap_or_else(|e| panic!("{file}: {e}\n{example}"));
            let section = document["gateway"].clone();
            set_keys(&section);
            let config: gateway::GatewayConfig =
                serde_yaml::from_value(section).unwrap_or_else(|e| panic!("{file}: {e}\n{example}"));
            let backend = support::memory_backend();
            let gateway =
                gateway::Gateway::new(&config, backend.clone()).unwrap_or_else(|e| panic!("{file}: {e}\n{example}"));
            let (addr, _) = support::serve_gateway(gateway, backend).await;
            let response = support::post_raw(&support::client(), addr, "/v1/chat/completions", "{}", &[]).await;
            let expected = if config.tenants.is_empty() { 400 } else { 401 };
            assert_eq!(response.status(), expected, "{file}:\n{example}");
            started += 1;
        }
    }
    assert!(started >= 4, "only {started} examples found");
}
