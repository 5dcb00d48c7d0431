//! What the `ratelimiterd` binary's one-shot commands print: `check-config`
//! fails on an unset key variable of the gateway exactly as `serve` would,
//! naming it, and on a Vertex AI upstream's bad or missing key file; a key operation given a key's text in place of its id never
//! prints the text back (its last four characters at most).

mod support;

use std::path::Path;
use std::process::{Command, Output};

use support::{temp_dir, BackendConfig, Daemon, ADMIN_TOKEN, BIN};

/// The upstream's and the tenant's key variables of [`GATEWAY`].
const UPSTREAM_VAR: &str = "CLI_CHECKS_UPSTREAM_KEY";
const TENANT_VAR: &str = "CLI_CHECKS_TENANT_KEY";

/// A server with a gateway whose upstream and tenant read their keys from
/// [`UPSTREAM_VAR`] and [`TENANT_VAR`].
const GATEWAY: &str = "server:\n  listen_addr: \"127.0.0.1:0\"\ngateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {name: oai, kind: openai, base_url: \"http://127.0.0.1:9\", api_key_env: CLI_CHECKS_UPSTREAM_KEY}\n  models:\n    - {name: gpt-4o-mini, upstream: oai, rpm: 10, max_output_tokens_default: 64}\n  tenants:\n    - {name: acme, api_key_env: CLI_CHECKS_TENANT_KEY}\n";

/// Runs the binary on `config` with `args`, with only the key variables of `set`.
fn run(config: &Path, args: &[&str], set: &[&str]) -> Output {
    let mut command = Command::new(BIN);
    command.arg("--config").arg(config).args(args);
    command.env_remove(UPSTREAM_VAR).env_remove(TENANT_VAR);
    for var in set {
        command.env(var, format!("{var}-value-0123456789abcdef"));
    }
    command.output().expect("run ratelimiterd")
}

#[test]
fn check_config_fails_on_an_unset_key_variable_as_the_start_does() {
    let dir = temp_dir("cli-check-config-keys");
    let config = dir.join("gateway.yaml");
    std::fs::write(&config, GATEWAY).unwrap();
    for (set, unset) in [(&[][..], UPSTREAM_VAR), (&[UPSTREAM_VAR][..], TENANT_VAR)] {
        let checked = run(&config, &["check-config"], set);
        let stderr = String::from_utf8_lossy(&checked.stderr);
        assert_eq!(checked.status.code(), Some(1), "{unset}: {stderr}");
        assert!(
            stderr.contains(&format!("environment variable {unset} is not set")),
            "{stderr}"
        );
        // `serve` refuses the same configuration with the same words.
        let served = run(&config, &["serve"], set);
        let start = String::from_utf8_lossy(&served.stderr);
        assert_eq!(served.status.code(), Some(1), "{unset}: {start}");
        assert!(
            start.contains(&format!("environment variable {unset} is not set")),
            "{start}"
        );
    }
    let checked = run(&config, &["check-config"], &[UPSTREAM_VAR, TENANT_VAR]);
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
    assert_eq!(String::from_utf8_lossy(&checked.stdout), "configuration is valid\n");
}

/// A gateway with one Vertex AI upstream: its key file `{credentials}`, or
/// `GOOGLE_APPLICATION_CREDENTIALS`'s when the line is left out.
fn vertex_gateway(credentials: Option<&Path>) -> String {
    let file = credentials.map_or(String::new(), |p| format!(", credentials_file: \"{}\"", p.display()));
    format!(
        "server:\n  listen_addr: \"127.0.0.1:0\"\ngateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: vx, kind: vertex, project: acme-ml, region: us-east5{file}}}\n  models:\n    - {{name: claude-sonnet-4-5, upstream: vx, rpm: 10, input_tpm: 1000, output_tpm: 1000}}\n  tenants:\n    - {{name: acme, api_key_env: CLI_CHECKS_TENANT_KEY}}\n"
    )
}

#[test]
fn check_config_and_serve_refuse_a_vertex_key_file_naming_the_upstream_and_the_field() {
    let dir = temp_dir("cli-check-config-vertex");
    let key = dir.join("vertex-sa.json");
    let mut file = serde_json::json!({"type": "service_account", "private_key_id": "k1",
        "client_email": "gw@acme-ml.iam.gserviceaccount.com", "token_uri": "https://oauth2.googleapis.com/token",
        "private_key": include_str!("../../../tests/fixtures/vertex-test-only-key.pem")});
    file.as_object_mut().unwrap().remove("private_key");
    std::fs::write(&key, file.to_string()).unwrap();
    let config = dir.join("gateway.yaml");
    std::fs::write(&config, vertex_gateway(Some(&key))).unwrap();
    for command in ["check-config", "serve"] {
        let refused = run(&config, &[command], &[TENANT_VAR]);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(1), "{command}: {stderr}");
        assert!(
            stderr.contains("gateway upstream vx: credentials_file "),
            "{command}: {stderr}"
        );
        assert!(
            stderr.contains("the field private_key is missing"),
            "{command}: {stderr}"
        );
    }
    let unset = dir.join("default.yaml");
    std::fs::write(&unset, vertex_gateway(None)).unwrap();
    let mut command = Command::new(BIN);
    command.arg("--config").arg(&unset).arg("check-config");
    command
        .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
        .env(TENANT_VAR, "tenant-key-0123456789abcdef");
    let refused = command.output().expect("run ratelimiterd");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("gateway upstream vx: no credentials_file, and GOOGLE_APPLICATION_CREDENTIALS is not set"),
        "{stderr}"
    );
    file["private_key"] = include_str!("../../../tests/fixtures/vertex-test-only-key.pem").into();
    std::fs::write(&key, file.to_string()).unwrap();
    let checked = run(&config, &["check-config"], &[TENANT_VAR]);
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
}

/// Runs a client command of the binary against `daemon` with the admin token.
fn client(daemon: &Daemon, args: &[&str]) -> Output {
    let url = daemon.url();
    let mut all = vec!["--url", url.as_str(), "--token", ADMIN_TOKEN];
    all.extend_from_slice(args);
    Command::new(BIN).args(all).output().expect("run ratelimiterd")
}

#[test]
fn a_key_operation_given_the_keys_text_never_prints_it_back() {
    let dir = temp_dir("cli-key-text");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", "");
    assert!(client(&daemon, &["tenants", "create", "acme"]).status.success());
    let created = client(&daemon, &["keys", "create", "--tenant", "acme"]);
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let created: serde_json::Value = serde_json::from_slice(&created.stdout).unwrap();
    let text = created["key"].as_str().unwrap();
    let last_four = &text[text.len() - 4..];
    let rotate = ["keys", "rotate", text];
    for args in [&["keys", "revoke", text][..], &["keys", "get", text][..], &rotate[..]] {
        let output = client(&daemon, args);
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(!output.status.success(), "{args:?}: {printed}");
        assert!(
            !printed.contains(&text[..text.len() - 4]),
            "{args:?} echoed the key: {printed}"
        );
        assert!(
            printed.contains("not a key id") && printed.contains(last_four),
            "{args:?}: {printed}"
        );
    }
    // The CLI refuses before sending; the server, asked by another client,
    // answers the same way without echoing the text either.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let admin = daemon.client(ADMIN_TOKEN);
    let paths = [
        format!("/v1/admin/gateway/keys/{text}"),
        format!("/v1/admin/gateway/keys/{text}/rotate"),
    ];
    for (method, path) in [("GET", &paths[0]), ("DELETE", &paths[0]), ("POST", &paths[1])] {
        let body = (method == "POST").then(|| serde_json::json!({}));
        let (status, answer) = runtime.block_on(admin.admin_json(method, path, body.as_ref())).unwrap();
        let answer = answer.to_string();
        assert_eq!(status, 404, "{method} {answer}");
        assert!(
            !answer.contains(&text[..text.len() - 4]),
            "{method} echoed the key: {answer}"
        );
        assert!(
            answer.contains("unknown key") && answer.contains(last_four),
            "{method}: {answer}"
        );
    }
    // The key still works by its id.
    let id = created["id"].as_str().unwrap();
    assert!(client(&daemon, &["keys", "revoke", id]).status.success());
}
