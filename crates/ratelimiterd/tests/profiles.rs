//! `profiles:` entries of the configuration become their provider profile's
//! definitions when the server starts (docs/provider-profiles.md).

mod support;

use serde_json::Value;
use support::{raw, temp_dir, Daemon, ADMIN_TOKEN};

#[test]
fn profiles_in_the_configuration_are_defined_at_startup() {
    let dir = temp_dir("profiles");
    let sections = "profiles:\n  - provider: openai\n    model: gpt-4o-mini\n    limits: {rpm: 500, tpm: 200000}\n  \
                    - provider: anthropic\n    model: claude-sonnet\n    limits: {rpm: 50, input_tpm: 30000, output_tpm: 8000}\n";
    let daemon = Daemon::start(&dir, "", sections);
    let response = raw::request(daemon.addr, "GET", "/v1/admin/limits", Some(ADMIN_TOKEN), b"");
    let reports: Vec<Value> = serde_json::from_value(response.json()).expect("a list of limits");
    let mut got: Vec<(String, &str, u64, u64)> = (reports.iter())
        .map(|r| {
            let field = |name: &str| r[name].as_u64().unwrap_or(0);
            (
                r["key"].as_str().unwrap().to_owned(),
                r["kind"].as_str().unwrap(),
                field("capacity"),
                field("window_seconds"),
            )
        })
        .collect();
    got.sort();
    // Anthropic's token buckets are buckets; OpenAI's quanta are rolling sub-windows.
    let expected: Vec<(String, &str, u64, u64)> = [
        ("global:llm:anthropic:claude-sonnet:itpm", "bucket", 30_000, 60),
        ("global:llm:anthropic:claude-sonnet:otpm", "bucket", 8_000, 60),
        ("global:llm:anthropic:claude-sonnet:rpm", "bucket", 50, 60),
        ("global:llm:openai:gpt-4o-mini:rpm", "rolling", 8, 1),
        ("global:llm:openai:gpt-4o-mini:tpm", "rolling", 16_666, 5),
    ]
    .iter()
    .map(|&(k, kind, c, w)| (k.to_owned(), kind, c, w))
    .collect();
    assert_eq!(got, expected);
}
