//! The section's parse and checks, on the documented examples.

use serde::Deserialize;

use super::*;

pub(crate) const EXAMPLE: &str = r#"
listen_addr: "127.0.0.1:8081"
upstreams:
  - name: openai
    kind: openai
    base_url: "http://127.0.0.1:9000"
    api_key_env: OPENAI_API_KEY
  - name: anthropic
    kind: anthropic
    base_url: "http://127.0.0.1:9000"
models:
  - name: gpt-4o-mini
    upstream: openai
    rpm: 500
    tpm: 200000
    concurrency: 50
    max_output_tokens_default: 4096
    max_wait_ms: 0
  - name: claude-sonnet-4
    upstream: anthropic
    input_tpm: 30000
    output_tpm: 8000
    rpm: 50
    max_output_tokens_default: 1024
    profile: anthropic
tenants:
  - name: acme
    api_key_env: ACME_GATEWAY_KEY
    daily_tokens: 1000000
"#;

fn parse(text: &str) -> GatewayConfig {
    serde_yaml::from_str(text).unwrap()
}

/// A gateway without upstreams, models or tenants, open to anyone, every
/// other field at its default: the base of other modules' test configurations.
pub(crate) fn anonymous() -> GatewayConfig {
    parse("listen_addr: \"127.0.0.1:0\"\nupstreams: []\nmodels: []\nallow_anonymous: true\n")
}

#[test]
fn a_gateway_without_tenants_serves_api_keys_or_says_it_is_open() {
    let mut config = parse(EXAMPLE);
    config.tenants.clear();
    // Valid: only keys made through the admin API may call.
    config.validate().unwrap();
    config.allow_anonymous = true;
    config.validate().unwrap();
    let mut config = parse(EXAMPLE);
    config.allow_anonymous = true;
    let error = config.validate().unwrap_err();
    assert_eq!(error.entry, "allow_anonymous");
    assert!(error.message.contains("tenants"), "{error}");
}

#[test]
fn client_timeouts_caps_and_forwarded_headers_are_checked() {
    let config = parse(EXAMPLE);
    assert_eq!(config.client_header_timeout_ms, CLIENT_HEADER_TIMEOUT_MS_DEFAULT);
    assert_eq!(config.client_body_timeout_ms, CLIENT_BODY_TIMEOUT_MS_DEFAULT);
    assert_eq!(config.client_write_timeout_ms, CLIENT_WRITE_TIMEOUT_MS_DEFAULT);
    assert_eq!(
        config.tenants[0].connections_max(&config),
        TENANT_CONNECTIONS_MAX_DEFAULT
    );
    assert_eq!(config.tenants[0].queued_max(&config), TENANT_QUEUED_MAX_DEFAULT);
    for field in [
        "client_header_timeout_ms",
        "client_body_timeout_ms",
        "client_write_timeout_ms",
    ] {
        let text = format!("{EXAMPLE}{field}: 0\n");
        assert_eq!(parse(&text).validate().unwrap_err().entry, field);
    }
    let mut config = parse(EXAMPLE);
    config.tenants[0].queued_max = Some(0);
    assert_eq!(config.validate().unwrap_err().entry, "tenants[0].queued_max");
    let mut config = parse(EXAMPLE);
    config.tenant_connections_max = TENANT_CAP_LIMIT + 1;
    assert_eq!(config.validate().unwrap_err().entry, "tenant_connections_max");
    let mut config = parse(EXAMPLE);
    config.upstreams[1].forward_headers = vec!["anthropic-beta".into()];
    config.validate().unwrap();
    config.upstreams[1].forward_headers.push("x-api-key".into());
    assert_eq!(config.validate().unwrap_err().entry, "upstreams[1].forward_headers[1]");
}

#[test]
fn the_issue_example_is_valid() {
    let config = parse(EXAMPLE);
    config.validate().unwrap();
    assert_eq!(config.models[1].limits.profile.as_deref(), Some("anthropic"));
    assert_eq!(config.body_bytes_max, BODY_BYTES_MAX_DEFAULT);
}

#[test]
fn bad_entries_are_named() {
    let mut config = parse(EXAMPLE);
    config.models[0].upstream = "nope".into();
    assert_eq!(config.validate().unwrap_err().entry, "models[0].upstream");
    let mut config = parse(EXAMPLE);
    config.models[0].limits.published.rpm = Some(0);
    assert_eq!(config.validate().unwrap_err().entry, "models[0].rpm");
    let mut config = parse(EXAMPLE);
    config.models[1].limits.published.tpm = Some(5);
    assert_eq!(config.validate().unwrap_err().entry, "models[1].tpm");
    let mut config = parse(EXAMPLE);
    config.models[0].limits.published.input_tpm = Some(5);
    config.models[0].limits.published.tpm = None;
    assert_eq!(config.validate().unwrap_err().entry, "models[0].input_tpm");
    let mut config = parse(EXAMPLE);
    config.tenants[0].name = "a:b".into();
    assert_eq!(config.validate().unwrap_err().entry, "tenants[0].name");
    let mut config = parse(EXAMPLE);
    config.models.push(config.models[0].clone());
    assert_eq!(config.validate().unwrap_err().entry, "models[2].name");
    let mut config = parse(EXAMPLE);
    config.upstreams[0].base_url = "https://api.openai.com".into();
    config.validate().unwrap();
    for bad in ["ftp://host", "https://", "api.openai.com", "http://bad host"] {
        config.upstreams[0].base_url = bad.into();
        assert_eq!(config.validate().unwrap_err().entry, "upstreams[0].base_url", "{bad}");
    }
}

#[test]
fn counting_fields_are_optional_and_never_zero() {
    // An Anthropic model and an embeddings model as the docs show them: no
    // output default, no counting bound.
    let text = EXAMPLE.replace("    max_output_tokens_default: 1024\n", "").replace(
        "tenants:",
        "  - {name: text-embedding-3-small, upstream: openai, tpm: 1000000}\ntenants:",
    );
    let config = parse(&text);
    config.validate().unwrap();
    assert_eq!(config.models[1].max_output_tokens_default, None);
    assert_eq!(config.models[2].max_output_tokens_default, None);
    for field in [
        "max_output_tokens_default",
        "file_tokens",
        "stored_context_tokens",
        "image_tokens",
    ] {
        let text = EXAMPLE.replace("    max_wait_ms: 0\n", &format!("    max_wait_ms: 0\n    {field}: 0\n"));
        let text = text.replace("    max_output_tokens_default: 4096\n", "");
        let error = parse(&text).validate().unwrap_err();
        assert_eq!(error.entry, format!("models[0].{field}"), "{error}");
    }
}

#[test]
fn a_profile_is_validated_with_the_entry_named() {
    let mut config = parse(EXAMPLE);
    config.models[0].limits.profile = Some("openai".into());
    config.validate().unwrap();
    let profile = config.models[0].llm_profile("openai").unwrap().unwrap();
    assert_eq!(
        profile.definitions[0].key().as_str(),
        "global:llm:openai:gpt-4o-mini:rpm",
        "keyed by the upstream's name"
    );
    config.models[0].limits.profile = Some("mistral".into());
    let error = config.validate().unwrap_err();
    assert_eq!(error.entry, "models[0].profile");
    assert!(error.message.contains("mistral"), "{error}");
    // Anthropic's profile needs its rpm.
    let mut config = parse(EXAMPLE);
    config.models[1].limits.published.rpm = None;
    let error = config.validate().unwrap_err();
    assert_eq!(error.entry, "models[1].profile");
    assert!(error.message.contains("rpm"), "{error}");
    // A profile's own numbers need a profile.
    let mut config = parse(EXAMPLE);
    config.models[0].limits.published.quantum_seconds = Some(2);
    assert_eq!(config.validate().unwrap_err().entry, "models[0].quantum_seconds");
    config.models[0].limits.profile = Some("openai".into());
    config.validate().unwrap();
    config.models[0].limits.published.quantum_seconds = Some(61);
    assert_eq!(config.validate().unwrap_err().entry, "models[0].profile");
}

/// The pool example of docs/gateway.md ("Pools"), its `gateway:` section.
#[test]
fn a_misspelt_field_of_a_model_or_a_deployment_is_refused_by_name() {
    // The limits are flattened into both entries, so serde cannot deny unknown
    // keys there: `validate` must, or `tmp: 5` would mean "no token limit".
    let text = EXAMPLE.replace("    tpm: 200000\n", "    tmp: 200000\n");
    let error = parse(&text).validate().unwrap_err();
    assert_eq!(error.entry, "models[0].tmp");
    assert_eq!(error.message, "unknown field");
    let text = docs_pool_text().replace("          concurrency: 20\n", "          concurency: 20\n");
    let error = parse_section(&text).validate().unwrap_err();
    assert_eq!(error.entry, "models[0].deployments[1].concurency");
    assert_eq!(error.message, "unknown field");
    // A known field still lands in the flattened limits.
    let config = parse(EXAMPLE);
    assert_eq!(config.models[0].limits.published.tpm, Some(200_000));
    assert_eq!(config.models[1].limits.profile.as_deref(), Some("anthropic"));
    assert_eq!(config.models[0].limits.unknown, UnknownFields::default());
}

/// The YAML example of docs/gateway.md, "Pools".
fn docs_pool_text() -> String {
    let docs = include_str!("../../../../docs/gateway.md");
    let pools = &docs[docs.find("## Pools").expect("a Pools section")..];
    let start = pools.find("```yaml\n").expect("a YAML example") + "```yaml\n".len();
    pools[start..start + pools[start..].find("```").unwrap()].to_owned()
}

/// A `gateway:` section, parsed.
fn parse_section(text: &str) -> GatewayConfig {
    #[derive(Deserialize)]
    struct Section {
        gateway: GatewayConfig,
    }
    serde_yaml::from_str::<Section>(text).unwrap().gateway
}

fn docs_pool() -> GatewayConfig {
    parse_section(&docs_pool_text())
}

#[test]
fn the_documented_pool_is_valid_and_resolves_into_its_deployments() {
    let config = docs_pool();
    config.validate().unwrap();
    let deployments = resolve(&config.models[0]);
    let keys: Vec<String> = deployments
        .iter()
        .map(|d| format!("{}/{}/{}", d.model.upstream, d.model.name, d.priority))
        .collect();
    assert_eq!(
        keys,
        ["azure-east/gpt-4o-ptu/0", "azure-west/gpt-4o/1", "openai/gpt-4o/1"]
    );
    assert_eq!(deployments[1].model.limits.published.concurrency, Some(20));
    assert_eq!(deployments[2].model.limits.profile.as_deref(), Some("openai"));
    assert_eq!(
        deployments[0].model.max_wait_ms, 2000,
        "the model's own fields carry over"
    );
}

#[test]
fn pool_configuration_errors_name_the_model_and_the_entry() {
    let error_of = |edit: &dyn Fn(&mut GatewayConfig)| {
        let mut config = docs_pool();
        edit(&mut config);
        let error = config.validate().unwrap_err();
        assert!(error.message.contains("\"gpt-4o\""), "{error}");
        error.entry
    };
    assert_eq!(
        error_of(&|c| c.models[0].upstream = "openai".into()),
        "models[0].upstream"
    );
    assert_eq!(
        error_of(&|c| c.models[0].limits.published.rpm = Some(5)),
        "models[0].rpm"
    );
    assert_eq!(error_of(&|c| c.models[0].deployments.clear()), "models[0].upstream");
    assert_eq!(
        error_of(&|c| c.models[0].deployments[1].weight = Some(2)),
        "models[0].deployments[1].weight"
    );
    assert_eq!(
        error_of(&|c| {
            let copy = c.models[0].deployments[1].clone();
            c.models[0].deployments.push(copy);
        }),
        "models[0].deployments[3].model"
    );
    assert_eq!(
        error_of(&|c| c.models[0].breaker = Some(BreakerConfig {
            failures: 0,
            open_ms: 1
        })),
        "models[0].breaker.failures"
    );
    // Mixed wire formats.
    let error = {
        let mut config = docs_pool();
        config.upstreams.push(UpstreamConfig {
            name: "claude".into(),
            kind: UpstreamKind::Anthropic,
            base_url: "https://api.anthropic.com".into(),
            api_key_env: None,
            forward_headers: Vec::new(),
            api_version: None,
            region: None,
            project: None,
            credentials_file: None,
        });
        config.models[0].deployments[2].upstream = "claude".into();
        config.models[0].deployments[2].limits.profile = None;
        config.validate().unwrap_err()
    };
    assert_eq!(error.entry, "models[0].deployments[2].upstream");
    // A deployment's own checks, with its entry named.
    let mut config = docs_pool();
    config.models[0].deployments[0].limits.published.rpm = Some(0);
    assert_eq!(config.validate().unwrap_err().entry, "models[0].deployments[0].rpm");
    config.models[0].deployments[0].limits.published.rpm = Some(1);
    config.models[0].deployments[0].upstream = "nowhere".into();
    assert_eq!(
        config.validate().unwrap_err().entry,
        "models[0].deployments[0].upstream"
    );
    // A pool's fields on a single-deployment model.
    let mut config = parse(EXAMPLE);
    config.models[0].routing = Routing::Weighted;
    assert_eq!(config.validate().unwrap_err().entry, "models[0].routing");
    // A deployment may not share a single model's keys.
    let mut config = docs_pool();
    let mut single = parse(EXAMPLE).models[0].clone();
    single.name = "gpt-4o-ptu".into();
    single.upstream = "azure-east".into();
    config.models.push(single);
    assert_eq!(config.validate().unwrap_err().entry, "models[1].model");
}

#[test]
fn an_azure_upstream_needs_its_api_version_and_no_other_takes_one() {
    let azure = |version: &str| {
        parse(&format!(
            "listen_addr: \"127.0.0.1:0\"\nallow_anonymous: true\nupstreams:\n  - {{name: az, kind: azure, base_url: \"https://acme.openai.azure.com\"{version}}}\nmodels:\n  - {{name: gpt-4o-prod, upstream: az, tpm: 1000}}\n"
        ))
    };
    azure(", api_version: \"2024-10-21\"").validate().unwrap();
    azure(", api_version: \"2025-04-01-preview\"").validate().unwrap();
    for (version, says) in [
        ("", "required for kind azure"),
        (", api_version: \"\"", "is not an api-version"),
        (", api_version: \"2024-10-21&x=1\"", "is not an api-version"),
    ] {
        let error = azure(version).validate().unwrap_err();
        assert_eq!(error.entry, "upstreams[0].api_version", "{version}");
        assert!(error.message.contains(says), "{version}: {error}");
    }
    let mut config = parse(EXAMPLE);
    config.upstreams[0].api_version = Some("2024-10-21".into());
    let error = config.validate().unwrap_err();
    assert_eq!(error.entry, "upstreams[0].api_version");
    assert!(error.message.contains("only an upstream of kind azure"), "{error}");
}

/// A section whose first upstream is `upstream` (YAML flow mapping fields) and
/// whose one model is served there.
fn with_upstream(upstream: &str) -> GatewayConfig {
    parse(&format!(
        "listen_addr: \"127.0.0.1:0\"\nallow_anonymous: true\nupstreams:\n  - {{name: up, {upstream}}}\nmodels:\n  - {{name: m, upstream: up, tpm: 1000}}\n"
    ))
}

#[test]
fn regional_fields_are_required_where_they_apply_and_refused_elsewhere() {
    for (upstream, entry, says) in [
        ("kind: bedrock", "upstreams[0].region", "required for kind bedrock"),
        (
            "kind: vertex, project: p",
            "upstreams[0].region",
            "required for kind vertex",
        ),
        (
            "kind: bedrock, region: US_EAST",
            "upstreams[0].region",
            "is not a region",
        ),
        ("kind: bedrock, region: \"\"", "upstreams[0].region", "is not a region"),
        (
            "kind: vertex, region: global",
            "upstreams[0].project",
            "required for kind vertex",
        ),
        (
            "kind: vertex, region: global, project: \"a/b\"",
            "upstreams[0].project",
            "is not a project id",
        ),
        (
            "kind: bedrock, region: us-east-1, project: p",
            "upstreams[0].project",
            "only an upstream of kind vertex",
        ),
        (
            "kind: openai, base_url: \"https://x\", region: us-east-1",
            "upstreams[0].region",
            "only an upstream of kind bedrock or vertex",
        ),
        (
            "kind: vertex, region: global, project: p, credentials_file: \"\"",
            "upstreams[0].credentials_file",
            "must not be empty",
        ),
        (
            "kind: anthropic, base_url: \"https://x\", credentials_file: f",
            "upstreams[0].credentials_file",
            "only an upstream of kind vertex",
        ),
        ("kind: openai", "upstreams[0].base_url", "must be an http"),
    ] {
        let error = with_upstream(upstream).validate().unwrap_err();
        assert_eq!(error.entry, entry, "{upstream}: {error}");
        assert!(error.message.contains(says), "{upstream}: {error}");
    }
}

#[test]
fn a_kind_this_version_cannot_reach_is_refused_at_load() {
    let error = with_upstream("kind: vertex, region: us-east5, project: p")
        .validate()
        .unwrap_err();
    assert_eq!(error.entry, "upstreams[0].kind", "{error}");
    assert!(error.message.contains("not served by this version"), "{error}");
}

#[test]
fn bedrock_model_ids_map_one_to_one_onto_limit_key_names() {
    use super::key_model_name;
    let id = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";
    assert_eq!(key_model_name(id), "us.anthropic.claude-sonnet-4-5-20250929-v1@0");
    assert_eq!(
        key_model_name("claude-sonnet-4-5@20250929"),
        "claude-sonnet-4-5@20250929",
        "no ':': itself"
    );
    let arn = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc";
    let key = ratelimiter::LimitKey::llm_rpm("bedrock-east", &key_model_name(arn)).unwrap();
    assert_eq!(
        key.as_str(),
        "global:llm:bedrock-east:arn@aws@bedrock@us-east-1@123456789012@application-inference-profile/abc:rpm"
    );
    // One-to-one: a Bedrock id holds no '@', so its key name's '@' were its ':'.
    let bedrock: UpstreamConfig = serde_yaml::from_str("{name: b, kind: bedrock, region: us-east-1}").unwrap();
    let mut pool = docs_pool();
    pool.upstreams.push(bedrock);
    pool.models[0].deployments[0].upstream = "b".into();
    pool.models[0].deployments[0].model = Some("us.anthropic.claude-v1@0".into());
    let error = pool.validate().unwrap_err();
    assert_eq!(error.entry, "models[0].deployments[0].model", "{error}");
    assert!(error.message.contains("holds no '@'"), "{error}");
    // Elsewhere a ':' is still refused.
    let mut pool = docs_pool();
    pool.models[0].deployments[0].model = Some("llama3:8b".into());
    assert_eq!(pool.validate().unwrap_err().entry, "models[0].deployments[0].model");
}

#[test]
fn a_pool_mixes_anthropic_and_claude_on_bedrock_but_not_bedrock_s_openai_models() {
    let pool = |second: &str| {
        parse(&format!(
            "listen_addr: \"127.0.0.1:0\"\nallow_anonymous: true\nupstreams:\n  - {{name: a, kind: anthropic, base_url: \"https://x\"}}\n  - {{name: b, kind: bedrock, region: us-east-1}}\nmodels:\n  - name: claude\n    deployments:\n      - {{upstream: a, rpm: 5, input_tpm: 100, output_tpm: 10}}\n      - {{upstream: b, model: \"{second}\", rpm: 5, tpm: 1000}}\n"
        ))
    };
    pool("us.anthropic.claude-sonnet-4-5-20250929-v1:0").validate().unwrap();
    let error = pool("openai.gpt-oss-120b-1:0").validate().unwrap_err();
    assert_eq!(error.entry, "models[0].deployments[1].upstream", "{error}");
    assert!(error.message.contains("one wire format"), "{error}");
    // Bedrock's OpenAI-format models have one tpm, as OpenAI's.
    let split = |model: &str| {
        parse(&format!(
            "listen_addr: \"127.0.0.1:0\"\nallow_anonymous: true\nupstreams:\n  - {{name: b, kind: bedrock, region: us-east-1}}\nmodels:\n  - name: m\n    deployments:\n      - {{upstream: b, model: \"{model}\", input_tpm: 10, output_tpm: 5}}\n"
        ))
    };
    let error = split("openai.gpt-oss-120b-1:0").validate().unwrap_err();
    assert_eq!(error.entry, "models[0].deployments[0].input_tpm", "{error}");
    split("anthropic.claude-v1:0").validate().unwrap();
}
