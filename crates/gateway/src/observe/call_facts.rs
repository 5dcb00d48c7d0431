//! What a call's SERVER span learns as the call goes ([`super::trace`]):
//! gathered here and written on the span once, when it ends.

use std::sync::Arc;
use std::time::Instant;

use axum::http::StatusCode;
use opentelemetry::{KeyValue, StringValue};

use super::semconv::{
    ERROR_TYPE, HTTP_RESPONSE_STATUS_CODE, RATELIMITER_CLASS, RATELIMITER_DECISION, RATELIMITER_DENIED_BY,
    RATELIMITER_DEPLOYMENT, RATELIMITER_KEY_ID, RATELIMITER_QUEUE_WAIT_MS, RATELIMITER_RETRY_AFTER_MS,
    RATELIMITER_TENANT, RATELIMITER_TOKENS_RESERVED, RATELIMITER_TOKENS_USED, RATELIMITER_USD_BILLED,
    RATELIMITER_USD_RESERVED,
};

/// The most attributes a SERVER span carries: 3 at its start (method, route,
/// path), 3 of the caller (tenant, key id, class), 2 of the status (the code,
/// `error.type`) and 9 of the limiter. Its attributes' vector is made this
/// long at once, so that the span never grows it.
pub const SERVER_SPAN_ATTRIBUTES_MAX: usize = 17;

/// The limiter's part of a call, gathered as its phases go and written on the
/// SERVER span once, when it ends: a failover or a wait changes a fact, and
/// an attribute set twice would be exported twice. The span's values are kept
/// only when the span records; the metrics' only when metrics are exported.
#[derive(Default)]
pub struct LimiterFacts {
    /// The model the client asked for, made once for every metric of the call.
    pub model: Option<StringValue>,
    /// The caller's tenant, for the span.
    pub tenant: Option<StringValue>,
    /// The tenant's metric attribute, when the operator opted in.
    pub tenant_metric: Option<KeyValue>,
    /// The id of the directory key the call came with.
    pub key_id: Option<StringValue>,
    /// The call's class.
    pub class: Option<StringValue>,
    /// `admitted`, `queued` or `denied`, once decided.
    pub decision: Option<&'static str>,
    /// How long the call waited in its model's queue, over its tries.
    pub queue_wait_ms: Option<u64>,
    /// The limit that denied the call (kept when the span records), and its hint.
    pub denied: Option<(Option<StringValue>, Option<u64>)>,
    /// What the last try reserved and was reconciled to.
    pub served: Option<Served>,
    /// The last try's provider, for the call's server metrics.
    pub provider: Option<StringValue>,
    /// When the call's stream sent its first chunk.
    pub first_chunk_at: Option<Instant>,
    /// The last try's output tokens, as the provider reported them.
    pub output_tokens: Option<u64>,
    /// The status the client got.
    pub status: Option<StatusCode>,
}

/// What one try reserved and was reconciled to, for the call's SERVER span.
pub struct Served {
    /// The deployment tried.
    pub deployment: Arc<str>,
    /// The tokens reserved: the input count and the output bound.
    pub reserved_tokens: u64,
    /// The tokens the limits were reconciled to; `None` while the reservation is kept.
    pub used_tokens: Option<u64>,
    /// The try's worst case in micro-dollars, when a price is known.
    pub reserved_micro_usd: Option<u64>,
    /// The try's cost in micro-dollars, when a price is known.
    pub billed_micro_usd: Option<u64>,
}

impl LimiterFacts {
    /// The asked model's metric value (empty before the caller is known).
    pub fn model_value(&self) -> StringValue {
        self.model.clone().unwrap_or_else(|| StringValue::from(""))
    }

    /// The facts as the SERVER span's attributes, in the order they were
    /// learned: the caller, the status, the decision, what was served.
    pub fn into_attributes(self) -> impl Iterator<Item = KeyValue> {
        let (denied_by, retry_after_ms) = self.denied.unwrap_or_default();
        let status = self.status.map(|s| s.as_u16());
        let (deployment, reserved, used, reserved_usd, billed_usd) = match self.served {
            Some(served) => (
                Some(served.deployment),
                Some(served.reserved_tokens),
                served.used_tokens,
                served.reserved_micro_usd,
                served.billed_micro_usd,
            ),
            None => (None, None, None, None, None),
        };
        let wait_ms = self.decision.map(|_| self.queue_wait_ms.unwrap_or(0));
        let int = |key: &'static str, value: Option<u64>| value.map(|v| KeyValue::new(key, v as i64));
        let usd = |key: &'static str, micro: Option<u64>| micro.map(|m| KeyValue::new(key, m as f64 / 1e6));
        [
            self.tenant.map(|tenant| KeyValue::new(RATELIMITER_TENANT, tenant)),
            self.key_id.map(|id| KeyValue::new(RATELIMITER_KEY_ID, id)),
            self.class.map(|class| KeyValue::new(RATELIMITER_CLASS, class)),
            status.map(|s| KeyValue::new(HTTP_RESPONSE_STATUS_CODE, i64::from(s))),
            (status.filter(|s| (500..600).contains(s))).map(|s| KeyValue::new(ERROR_TYPE, status_error_type(s))),
            self.decision
                .map(|decision| KeyValue::new(RATELIMITER_DECISION, decision)),
            int(RATELIMITER_QUEUE_WAIT_MS, wait_ms),
            denied_by.map(|key| KeyValue::new(RATELIMITER_DENIED_BY, key)),
            int(RATELIMITER_RETRY_AFTER_MS, retry_after_ms),
            deployment.map(|d| KeyValue::new(RATELIMITER_DEPLOYMENT, StringValue::from(d))),
            int(RATELIMITER_TOKENS_RESERVED, reserved),
            int(RATELIMITER_TOKENS_USED, used),
            usd(RATELIMITER_USD_RESERVED, reserved_usd),
            usd(RATELIMITER_USD_BILLED, billed_usd),
        ]
        .into_iter()
        .flatten()
    }
}

/// The `error.type` of a failed HTTP status: its code, in digits. The codes
/// the providers answer with are static, others made: OpenAI's
/// (<https://platform.openai.com/docs/guides/error-codes/api-errors>),
/// Anthropic's with its 529 `overloaded_error`
/// (<https://docs.anthropic.com/en/api/errors>), and the gateway's own.
pub fn status_error_type(status: u16) -> StringValue {
    let digits = match status {
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        408 => "408",
        409 => "409",
        413 => "413",
        422 => "422",
        429 => "429",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        529 => "529",
        other => return StringValue::from(other.to_string()),
    };
    StringValue::from(digits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statuss_error_type_is_its_code_in_digits() {
        for status in 100..1000u16 {
            assert_eq!(status_error_type(status).as_str(), status.to_string());
        }
    }

    #[test]
    fn the_facts_are_written_once_each_in_the_order_learned() {
        let facts = LimiterFacts {
            tenant: Some("acme".into()),
            class: Some("interactive".into()),
            status: Some(StatusCode::SERVICE_UNAVAILABLE),
            decision: Some("denied"),
            denied: Some((Some("model:gpt".into()), Some(1500))),
            ..LimiterFacts::default()
        };
        let attributes: Vec<KeyValue> = facts.into_attributes().collect();
        let keys: Vec<&str> = attributes.iter().map(|kv| kv.key.as_str()).collect();
        let expected = [
            RATELIMITER_TENANT,
            RATELIMITER_CLASS,
            HTTP_RESPONSE_STATUS_CODE,
            ERROR_TYPE,
            RATELIMITER_DECISION,
            RATELIMITER_QUEUE_WAIT_MS,
            RATELIMITER_DENIED_BY,
            RATELIMITER_RETRY_AFTER_MS,
        ];
        assert_eq!(keys, expected);
        assert_eq!(attributes[3].value.as_str(), "503");
        assert_eq!(attributes[5].value, opentelemetry::Value::I64(0));
        let served = LimiterFacts {
            status: Some(StatusCode::TOO_MANY_REQUESTS),
            served: Some(Served {
                deployment: Arc::from("east"),
                reserved_tokens: 100,
                used_tokens: Some(40),
                reserved_micro_usd: None,
                billed_micro_usd: Some(2_500),
            }),
            ..LimiterFacts::default()
        };
        let attributes: Vec<KeyValue> = served.into_attributes().collect();
        let keys: Vec<&str> = attributes.iter().map(|kv| kv.key.as_str()).collect();
        let expected = [
            HTTP_RESPONSE_STATUS_CODE,
            RATELIMITER_DEPLOYMENT,
            RATELIMITER_TOKENS_RESERVED,
            RATELIMITER_TOKENS_USED,
            RATELIMITER_USD_BILLED,
        ];
        assert_eq!(keys, expected, "a 4xx is no error of the SERVER span");
        assert_eq!(attributes[4].value, opentelemetry::Value::F64(0.0025));
    }
}
