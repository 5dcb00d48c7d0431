//! The gateway's keys on the memory backend survive a SIGKILL: a key whose
//! creation was answered 201 is there after a kill the very next instant,
//! with its tenant, its hash (the key still authenticates) and its own limit;
//! a key revoked and answered stays revoked. The real binary, killed with
//! SIGKILL right after each answer.

mod support;

use std::sync::Arc;

use ratelimiter::directory::{journal_path, Directory, FileStore, Refusal};
use ratelimiter::SystemClock;
use serde_json::{json, Value};
use support::raw::request;
use support::{temp_dir, BackendConfig, Daemon, ADMIN_TOKEN};

/// Kill rounds: each creates a key, revokes the previous round's, and is killed at once.
const ROUNDS: usize = 5;

fn send(daemon: &Daemon, method: &str, path: &str, body: Value) -> (u16, Value) {
    let body = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    let answer = request(daemon.addr, method, path, Some(ADMIN_TOKEN), &body);
    (answer.status, answer.json())
}

#[tokio::test]
async fn keys_answered_201_survive_a_sigkill_the_next_instant() {
    let dir = temp_dir("directory-crash");
    let mut created: Vec<(String, String)> = Vec::new();
    for round in 0..ROUNDS {
        let mut daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", "");
        if round == 0 {
            let (status, answer) = send(&daemon, "POST", "/v1/admin/gateway/tenants", json!({"name": "acme"}));
            assert_eq!(status, 201, "{answer}");
        } else {
            // What the previous round was answered is all there.
            let (id, _) = created.last().unwrap();
            let (status, key) = send(&daemon, "GET", &format!("/v1/admin/gateway/keys/{id}"), Value::Null);
            assert_eq!(
                (status, key["status"].clone()),
                (200, json!("active")),
                "round {round}: {key}"
            );
            let (status, limit) = send(
                &daemon,
                "GET",
                &format!("/v1/admin/limits/key:{id}:llm:rpm"),
                Value::Null,
            );
            assert_eq!(
                (status, limit["capacity"].clone()),
                (200, json!(5)),
                "round {round}: {limit}"
            );
            let (status, revoked) = send(&daemon, "DELETE", &format!("/v1/admin/gateway/keys/{id}"), Value::Null);
            assert_eq!(status, 200, "{revoked}");
        }
        let (status, answer) = send(
            &daemon,
            "POST",
            "/v1/admin/gateway/keys",
            json!({"tenant": "acme", "rpm": 5}),
        );
        assert_eq!(status, 201, "{answer}");
        daemon.kill9();
        created.push((
            answer["id"].as_str().unwrap().to_owned(),
            answer["key"].as_str().unwrap().to_owned(),
        ));
    }
    // The file read as the next start reads it: every key there, the last one working.
    let store = Arc::new(FileStore::open(journal_path(&dir.join("limits.json"))).unwrap());
    let directory = Directory::open(store, Arc::new(SystemClock::new()), Vec::new())
        .await
        .unwrap();
    let (last, earlier) = created.split_last().unwrap();
    assert_eq!(directory.authenticate(&last.1).await.unwrap().key.id, last.0);
    for (id, key) in earlier {
        assert_eq!(directory.authenticate(key).await.unwrap_err(), Refusal::Revoked, "{id}");
    }
}
