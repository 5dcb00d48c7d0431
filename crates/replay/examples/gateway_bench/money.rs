//! `--money on` (gateway_bench.rs): the new server's calls carry a key of a
//! tenant made through its admin API, with a budget in dollars on the tenant,
//! so each call is authenticated by the directory, priced, reserved and
//! reconciled on the budget, and recorded in the spend ledger (which every
//! server with a gateway keeps). A build from before keys and money cannot
//! have them: it serves its plain configuration in the same rounds.

use std::net::SocketAddr;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};

/// The tenant the bench makes.
const TENANT: &str = "bench";
/// The tenant's daily budget in USD: far above what the bench's calls cost
/// (a few micro-dollars each, about a dollar a run), so no call is refused.
const BUDGET_USD_PER_DAY: u64 = 100_000;

/// Makes the tenant with its budget and a key of it on the server whose API
/// listens at `api` (a loopback listener: no admin token needed); returns the
/// key's text, to send as `Authorization: Bearer <key>`.
pub async fn tenant_key(api: SocketAddr) -> String {
    let tenant = format!(r#"{{"name":"{TENANT}","budgets":[{{"usd":{BUDGET_USD_PER_DAY},"period":"day"}}]}}"#);
    post(api, "/v1/admin/gateway/tenants", tenant).await;
    let key = post(
        api,
        "/v1/admin/gateway/keys",
        format!(r#"{{"tenant":"{TENANT}","name":"bench"}}"#),
    )
    .await;
    let key: serde_json::Value = serde_json::from_slice(&key).expect("the key's JSON");
    key["key"].as_str().expect("the answer carries the key").to_owned()
}

/// POSTs `body` to `path` of the API at `api`; panics unless it is a 201.
async fn post(api: SocketAddr, path: &str, body: String) -> Bytes {
    let mut sender = super::connect(api).await;
    let request = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("host", api.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a request");
    let response = sender.send_request(request).await.expect("the admin API answers");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("the answer's body")
        .to_bytes();
    assert_eq!(status, 201, "{path}: {}", String::from_utf8_lossy(&body));
    body
}
