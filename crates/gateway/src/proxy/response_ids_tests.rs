use std::sync::Mutex as StdMutex;

use async_trait::async_trait;
use ratelimiter::LimiterError;
use serde_json::json;

use super::*;
use crate::wire::error::Format;

fn request(value: Value) -> Map<String, Value> {
    value.as_object().unwrap().clone()
}

fn code(e: &GatewayError) -> Value {
    e.body(Format::OpenAi)["error"]["code"].clone()
}

#[tokio::test]
async fn each_tenant_continues_only_its_own_responses() {
    let ids = ResponseIds::default();
    let (acme, beta): (Arc<str>, Arc<str>) = (Arc::from("acme"), Arc::from("beta"));
    ids.record(&acme, StoredKind::Response, "resp_a").await;
    let follow = request(json!({"previous_response_id": "resp_a"}));
    assert!(ids.check(Endpoint::Responses, &acme, &follow).await.is_ok());
    let refused = ids.check(Endpoint::Responses, &beta, &follow).await.unwrap_err();
    assert_eq!(refused.status().as_u16(), 400);
    let unknown = request(json!({"previous_response_id": "resp_never"}));
    let unknown = ids.check(Endpoint::Responses, &acme, &unknown).await.unwrap_err();
    assert_eq!(
        code(&refused),
        code(&unknown),
        "another's id answers like an unknown one"
    );
    let null = request(json!({"previous_response_id": null}));
    assert!(ids.check(Endpoint::Responses, &beta, &null).await.is_ok());
    assert!(ids.check(Endpoint::ChatCompletions, &beta, &follow).await.is_ok());
    let number = request(json!({"previous_response_id": 5}));
    assert!(ids.check(Endpoint::Responses, &beta, &number).await.is_err());
    // A response id is no conversation id.
    let as_conversation = request(json!({"conversation": "resp_a"}));
    assert!(ids.check(Endpoint::Responses, &acme, &as_conversation).await.is_err());
    // One tenant's flood of answers never pushes out another's ids.
    for i in 0..RESPONSE_IDS_PER_TENANT_MAX + 1 {
        ids.remember(&beta, StoredKind::Response, &format!("resp_b{i}"));
    }
    assert!(ids.knows("acme", StoredKind::Response, "resp_a"));
    assert!(
        !ids.knows("beta", StoredKind::Response, "resp_b0"),
        "the tenant's oldest id is forgotten"
    );
    let newest = format!("resp_b{RESPONSE_IDS_PER_TENANT_MAX}");
    assert!(ids.knows("beta", StoredKind::Response, &newest));
}

#[tokio::test]
async fn each_tenant_continues_only_its_own_conversations() {
    let (acme, beta): (Arc<str>, Arc<str>) = (Arc::from("acme"), Arc::from("beta"));
    let handed = RememberResponseId {
        ids: Arc::new(ResponseIds::default()),
        tenant: acme.clone(),
    };
    handed.record(None, Some(&json!(null))).await;
    assert!(
        handed.ids.tenants.lock().unwrap().is_empty(),
        "a null conversation is none"
    );
    handed.record(Some("resp_1"), Some(&json!({"id": "conv_a"}))).await;
    let ids = &handed.ids;
    for form in [json!("conv_a"), json!({"id": "conv_a"})] {
        let call = request(json!({"conversation": form}));
        assert!(ids.check(Endpoint::Responses, &acme, &call).await.is_ok());
        let refused = ids.check(Endpoint::Responses, &beta, &call).await.unwrap_err();
        assert_eq!(refused.status().as_u16(), 404);
        let body = refused.body(Format::OpenAi);
        assert_eq!(body["error"]["param"], "conversation");
        let unknown = request(json!({"conversation": "conv_never"}));
        let unknown = ids.check(Endpoint::Responses, &acme, &unknown).await.unwrap_err();
        assert_eq!(
            code(&refused),
            code(&unknown),
            "another's id answers like an unknown one"
        );
    }
    for bad in [json!(5), json!({"id": 5}), json!({}), json!(["conv_a"])] {
        let call = request(json!({"conversation": bad}));
        let refused = ids.check(Endpoint::Responses, &acme, &call).await.unwrap_err();
        assert_eq!(refused.status().as_u16(), 400, "{call:?}");
    }
    assert!(ids.knows("acme", StoredKind::Response, "resp_1"));
}

/// A fleet's record kept in a set, as the cluster would keep it.
#[derive(Debug, Default)]
struct FleetRecord(StdMutex<HashSet<(String, StoredKind, String)>>);

#[async_trait]
impl HandedIdStore for FleetRecord {
    async fn record(&self, tenant: &str, kind: StoredKind, id: &str) -> Result<(), LimiterError> {
        self.0.lock().unwrap().insert((tenant.to_owned(), kind, id.to_owned()));
        Ok(())
    }
    async fn handed(&self, tenant: &str, kind: StoredKind, id: &str) -> Result<bool, LimiterError> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .contains(&(tenant.to_owned(), kind, id.to_owned())))
    }
}

#[tokio::test]
async fn a_fleet_accepts_on_one_server_what_another_handed() {
    let fleet: Arc<FleetRecord> = Arc::default();
    let one = ResponseIds::shared(fleet.clone());
    let two = ResponseIds::shared(fleet.clone());
    let (acme, beta): (Arc<str>, Arc<str>) = (Arc::from("acme"), Arc::from("beta"));
    one.record(&acme, StoredKind::Response, "resp_a").await;
    let follow = request(json!({"previous_response_id": "resp_a"}));
    assert!(two.check(Endpoint::Responses, &acme, &follow).await.is_ok());
    assert!(
        two.knows("acme", StoredKind::Response, "resp_a"),
        "remembered after the lookup"
    );
    assert!(two.check(Endpoint::Responses, &beta, &follow).await.is_err());
    assert!(one.check(Endpoint::Responses, &beta, &follow).await.is_err());
    let long = "r".repeat(HANDED_ID_BYTES_MAX + 1);
    one.record(&acme, StoredKind::Response, &long).await;
    assert_eq!(fleet.0.lock().unwrap().len(), 1, "an over-long id is never recorded");
}
