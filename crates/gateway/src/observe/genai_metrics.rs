//! The metrics of the gateway's calls over OTLP (docs/observability.md): the
//! OpenTelemetry GenAI client metrics of each try on a deployment, and the
//! limiter's own decisions and queue waits. Named once, here; recorded by the
//! call's trace ([`super::trace`]) only when the server exports metrics.
//!
//! As a server to its callers, each call's `gen_ai.server.*` metrics, as
//! agentgateway and Envoy AI Gateway emit them. Names, units and buckets as the
//! GenAI conventions v1.37.0 give them
//! (<https://github.com/open-telemetry/semantic-conventions/blob/v1.37.0/docs/gen-ai/gen-ai-metrics.md>).
//!
//! Tenant and key stay off every metric's attributes: one series per tenant
//! and key would be unbounded; the spans carry them. An operator may opt in to
//! the tenant ([`GenAiMetrics::with_tenants`]), bounded by [`METRIC_TENANTS_MAX`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::metrics::{BoundCounter, BoundHistogram, Counter, Histogram, Meter};
use opentelemetry::{KeyValue, StringValue};

use super::bound_metrics::BoundSets;

/// GenAI conventions: tokens per try, by `gen_ai.token.type`.
pub const GEN_AI_CLIENT_TOKEN_USAGE: &str = "gen_ai.client.token.usage";
/// GenAI conventions: how long a try took, in seconds (a stream to its end).
pub const GEN_AI_CLIENT_OPERATION_DURATION: &str = "gen_ai.client.operation.duration";
/// GenAI conventions (after v1.37): a stream's time to its first chunk, in seconds.
pub const GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK: &str = "gen_ai.client.operation.time_to_first_chunk";
/// GenAI conventions: how long the gateway took to answer a call, to its last byte, in seconds.
pub const GEN_AI_SERVER_REQUEST_DURATION: &str = "gen_ai.server.request.duration";
/// GenAI conventions: how long a streamed call took to its first chunk, in seconds.
pub const GEN_AI_SERVER_TIME_TO_FIRST_TOKEN: &str = "gen_ai.server.time_to_first_token";
/// GenAI conventions: a streamed call's time per output token after the first, in seconds.
pub const GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN: &str = "gen_ai.server.time_per_output_token";
/// The limiter: the call's tenant, on the metrics only when the operator opts in.
pub const RATELIMITER_TENANT: &str = "ratelimiter.tenant";
/// The most distinct tenants given their own series when the tenant is a
/// metric attribute: each tenant multiplies every metric's series, and a
/// collector's memory (and a vendor's bill) grows with them; past the bound a
/// tenant's calls count under [`TENANT_OTHER`].
pub const METRIC_TENANTS_MAX: usize = 100;
/// The tenant attribute's value past [`METRIC_TENANTS_MAX`].
pub const TENANT_OTHER: &str = "_other";
/// GenAI conventions: `input` or `output`.
pub const GEN_AI_TOKEN_TYPE: &str = "gen_ai.token.type";
/// The limiter: calls by `ratelimiter.decision` and `gen_ai.request.model`.
pub const RATELIMITER_GATEWAY_DECISIONS: &str = "ratelimiter.gateway.decisions";
/// The limiter: how long queued calls waited, in seconds.
pub const RATELIMITER_GATEWAY_QUEUE_DURATION: &str = "ratelimiter.gateway.queue.duration";

/// The most attributes one record of a call's metric carries: the operation,
/// the provider, the model, `error.type`, the tenant and the token type.
pub const METRIC_ATTRIBUTES_MAX: usize = 6;

/// The GenAI conventions' advised buckets of `gen_ai.client.token.usage`: powers of 4.
const TOKEN_BOUNDARIES: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0,
    67108864.0,
];
/// The GenAI conventions' advised buckets of `gen_ai.client.operation.duration`,
/// in seconds: doubling from 10 ms; used for the queue's wait too.
const DURATION_BOUNDARIES_S: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

/// The GenAI conventions' advised buckets of the times to a first token or
/// chunk, in seconds (`gen_ai.server.time_to_first_token`,
/// <https://github.com/open-telemetry/semantic-conventions/blob/v1.37.0/docs/gen-ai/gen-ai-metrics.md>).
const FIRST_TOKEN_BOUNDARIES_S: [f64; 16] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// The GenAI conventions' advised buckets of `gen_ai.server.time_per_output_token`, in seconds.
const PER_TOKEN_BOUNDARIES_S: [f64; 13] = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5];

/// The instruments, made once from the server's meter.
pub struct GenAiMetrics {
    server_duration: Histogram<f64>,
    server_first_token: Histogram<f64>,
    server_per_token: Histogram<f64>,
    /// The tenants given their own series, when the operator opted in; each
    /// name made once, shared by every record of its calls.
    tenants: Option<Mutex<HashSet<Arc<str>>>>,
    token_usage: Histogram<u64>,
    operation_duration: Histogram<f64>,
    time_to_first_chunk: Histogram<f64>,
    decisions: Counter<u64>,
    queue_duration: Histogram<f64>,
    /// The instruments bound to the sets the calls repeat (`bound_metrics.rs`).
    bound: Bound,
}

/// The instruments of each record bound to the attribute sets it has met.
#[derive(Default)]
struct Bound {
    tries: BoundSets<TryInstruments>,
    calls: BoundSets<CallInstruments>,
    decisions: BoundSets<BoundCounter<u64>>,
    queues: BoundSets<BoundHistogram<f64>>,
}

/// A try's instruments, bound to its attributes (and the token types').
struct TryInstruments {
    duration: BoundHistogram<f64>,
    first_chunk: BoundHistogram<f64>,
    input_tokens: BoundHistogram<u64>,
    output_tokens: BoundHistogram<u64>,
}

/// A call's instruments as a server, bound to its attributes.
struct CallInstruments {
    duration: BoundHistogram<f64>,
    first_token: BoundHistogram<f64>,
    per_token: BoundHistogram<f64>,
}

impl GenAiMetrics {
    /// The instruments of `meter`.
    pub fn new(meter: &Meter) -> Self {
        let seconds = |name: &'static str, description: &'static str, boundaries: &[f64]| {
            (meter.f64_histogram(name))
                .with_unit("s")
                .with_description(description)
                .with_boundaries(boundaries.to_vec())
                .build()
        };
        Self {
            server_duration: seconds(
                GEN_AI_SERVER_REQUEST_DURATION,
                "How long the gateway took to answer a call, to its last byte",
                &DURATION_BOUNDARIES_S,
            ),
            server_first_token: seconds(
                GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
                "How long a streamed call took to its first chunk",
                &FIRST_TOKEN_BOUNDARIES_S,
            ),
            server_per_token: seconds(
                GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
                "A streamed call's time per output token after the first",
                &PER_TOKEN_BOUNDARIES_S,
            ),
            tenants: None,
            token_usage: (meter.u64_histogram(GEN_AI_CLIENT_TOKEN_USAGE))
                .with_unit("{token}")
                .with_description("Tokens used per try on a deployment, by input and output")
                .with_boundaries(TOKEN_BOUNDARIES.to_vec())
                .build(),
            operation_duration: (meter.f64_histogram(GEN_AI_CLIENT_OPERATION_DURATION))
                .with_unit("s")
                .with_description("Duration of each try on a deployment")
                .with_boundaries(DURATION_BOUNDARIES_S.to_vec())
                .build(),
            time_to_first_chunk: (meter.f64_histogram(GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK))
                .with_unit("s")
                .with_description("Time from sending a streamed try to its first chunk")
                .with_boundaries(FIRST_TOKEN_BOUNDARIES_S.to_vec())
                .build(),
            decisions: (meter.u64_counter(RATELIMITER_GATEWAY_DECISIONS))
                .with_unit("{call}")
                .with_description("The gateway's admission decisions: admitted, queued, denied")
                .build(),
            queue_duration: (meter.f64_histogram(RATELIMITER_GATEWAY_QUEUE_DURATION))
                .with_unit("s")
                .with_description("How long calls waited in their model's queue")
                .with_boundaries(DURATION_BOUNDARIES_S.to_vec())
                .build(),
            bound: Bound::default(),
        }
    }

    /// These metrics with the call's tenant among their attributes, for at
    /// most [`METRIC_TENANTS_MAX`] tenants (the operator's opt-in).
    pub fn with_tenants(self) -> Self {
        Self {
            tenants: Some(Mutex::new(HashSet::new())),
            ..self
        }
    }

    /// The tenant attribute of a call of `tenant`, when the operator opted in:
    /// its name while fewer than [`METRIC_TENANTS_MAX`] have one, else [`TENANT_OTHER`].
    pub fn tenant_attribute(&self, tenant: &str) -> Option<KeyValue> {
        let mut seen = self.tenants.as_ref()?.lock().unwrap_or_else(|p| p.into_inner());
        let value = match seen.get(tenant) {
            Some(known) => StringValue::from(known.clone()),
            None if seen.len() < METRIC_TENANTS_MAX => {
                let name: Arc<str> = Arc::from(tenant);
                seen.insert(name.clone());
                StringValue::from(name)
            }
            None => StringValue::from(TENANT_OTHER),
        };
        Some(KeyValue::new(RATELIMITER_TENANT, value))
    }

    /// A call ended after `took`, with `attributes` (operation, provider,
    /// model, `error.type` on failure); a stream's time to its first chunk
    /// and its output tokens give its time per output token after the first.
    pub fn call_ended(&self, attributes: &[KeyValue], took: Duration, stream: Option<(Duration, Option<u64>)>) {
        let duration = took.as_secs_f64();
        let first = stream.map(|(first, _)| first.as_secs_f64());
        // A stream's time per output token after the first.
        let per_token = stream.and_then(|(first, output_tokens)| {
            let tokens = output_tokens.filter(|t| *t > 1)?;
            Some(took.saturating_sub(first).as_secs_f64() / (tokens - 1) as f64)
        });
        let bind = |a: &[KeyValue]| CallInstruments {
            duration: self.server_duration.bind(a),
            first_token: self.server_first_token.bind(a),
            per_token: self.server_per_token.bind(a),
        };
        let bound = self.bound.calls.record(attributes, bind, |call| {
            call.duration.record(duration);
            first.inspect(|f| call.first_token.record(*f));
            per_token.inspect(|p| call.per_token.record(*p));
        });
        if bound.is_none() {
            self.server_duration.record(duration, attributes);
            first.inspect(|f| self.server_first_token.record(*f, attributes));
            per_token.inspect(|p| self.server_per_token.record(*p, attributes));
        }
    }

    /// One try ended after `took`, with `attributes` (operation, provider,
    /// model, `error.type` on failure), a stream's first chunk `first_chunk`
    /// after it was sent and, when the provider reported it, its
    /// `(input, output)` tokens, recorded with the token type added to the
    /// same attributes (and taken off again).
    pub fn try_ended(
        &self,
        attributes: &mut MetricAttributes,
        (took, first_chunk): (Duration, Option<Duration>),
        tokens: Option<(u64, u64)>,
    ) {
        let duration = took.as_secs_f64();
        let first = first_chunk.map(|f| f.as_secs_f64());
        let bind = |a: &[KeyValue]| {
            let typed = |token_type: &'static str| [a, &[KeyValue::new(GEN_AI_TOKEN_TYPE, token_type)]].concat();
            TryInstruments {
                duration: self.operation_duration.bind(a),
                first_chunk: self.time_to_first_chunk.bind(a),
                input_tokens: self.token_usage.bind(&typed("input")),
                output_tokens: self.token_usage.bind(&typed("output")),
            }
        };
        let bound = self.bound.tries.record(attributes.as_slice(), bind, |try_| {
            try_.duration.record(duration);
            first.inspect(|f| try_.first_chunk.record(*f));
            if let Some((input, output)) = tokens {
                try_.input_tokens.record(input);
                try_.output_tokens.record(output);
            }
        });
        if bound.is_some() {
            return;
        }
        first.inspect(|f| self.time_to_first_chunk.record(*f, attributes.as_slice()));
        self.operation_duration.record(duration, attributes.as_slice());
        if let Some((input, output)) = tokens {
            attributes.push(KeyValue::new(GEN_AI_TOKEN_TYPE, "input"));
            self.token_usage.record(input, attributes.as_slice());
            attributes.pop();
            attributes.push(KeyValue::new(GEN_AI_TOKEN_TYPE, "output"));
            self.token_usage.record(output, attributes.as_slice());
            attributes.pop();
        }
    }

    /// A call's decision, with `attributes` its `ratelimiter.decision` and
    /// `gen_ai.request.model` (the model the client asked for).
    pub fn decided(&self, attributes: &[KeyValue]) {
        let bind = |a: &[KeyValue]| self.decisions.bind(a);
        if self.bound.decisions.record(attributes, bind, |d| d.add(1)).is_none() {
            self.decisions.add(1, attributes);
        }
    }

    /// A call waited `waited` in its model's queue (`attributes`: the model).
    pub fn queued(&self, waited: Duration, attributes: &[KeyValue]) {
        let waited = waited.as_secs_f64();
        let bind = |a: &[KeyValue]| self.queue_duration.bind(a);
        if self
            .bound
            .queues
            .record(attributes, bind, |q| q.record(waited))
            .is_none()
        {
            self.queue_duration.record(waited, attributes);
        }
    }
}

/// The attributes of one metric record, held on the stack: the instruments
/// take a slice, and a call's few attributes, some of them optional, need no
/// vector per record (their values are static or shared, so a copy of one
/// allocates nothing either).
pub struct MetricAttributes {
    items: [KeyValue; METRIC_ATTRIBUTES_MAX],
    len: usize,
}

impl Default for MetricAttributes {
    fn default() -> Self {
        Self {
            // Static placeholders: nothing allocated, never recorded.
            items: std::array::from_fn(|_| KeyValue::new("", "")),
            len: 0,
        }
    }
}

impl MetricAttributes {
    /// No attributes yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// `attribute` added last; a record has at most [`METRIC_ATTRIBUTES_MAX`].
    pub fn push(&mut self, attribute: KeyValue) {
        assert!(
            self.len < METRIC_ATTRIBUTES_MAX,
            "a metric record has at most {METRIC_ATTRIBUTES_MAX} attributes"
        );
        self.items[self.len] = attribute;
        self.len += 1;
    }

    /// `attribute` added last when there is one.
    pub fn push_some(&mut self, attribute: Option<KeyValue>) {
        if let Some(attribute) = attribute {
            self.push(attribute);
        }
    }

    /// The last attribute taken off (it stays held until overwritten).
    fn pop(&mut self) {
        assert!(self.len > 0, "no attribute to take off");
        self.len -= 1;
    }

    /// The attributes, in the order added.
    pub fn as_slice(&self) -> &[KeyValue] {
        &self.items[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_attributes_keep_their_order_and_take_the_last_off() {
        let mut attributes = MetricAttributes::new();
        assert!(attributes.as_slice().is_empty());
        attributes.push(KeyValue::new("a", "1"));
        attributes.push_some(None);
        attributes.push_some(Some(KeyValue::new("b", "2")));
        attributes.push(KeyValue::new(GEN_AI_TOKEN_TYPE, "input"));
        attributes.pop();
        let keys: Vec<&str> = attributes.as_slice().iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(keys, ["a", "b"]);
    }

    #[test]
    #[should_panic(expected = "at most")]
    fn a_metric_record_with_too_many_attributes_is_a_programmer_error() {
        let mut attributes = MetricAttributes::new();
        for _ in 0..=METRIC_ATTRIBUTES_MAX {
            attributes.push(KeyValue::new("k", "v"));
        }
    }

    #[test]
    fn the_tenant_is_an_attribute_only_on_opt_in_and_bounded() {
        let meter = opentelemetry::global::meter("test");
        assert_eq!(GenAiMetrics::new(&meter).tenant_attribute("acme"), None);
        let metrics = GenAiMetrics::new(&meter).with_tenants();
        let value = |tenant: &str| metrics.tenant_attribute(tenant).map(|kv| kv.value.to_string());
        for n in 0..METRIC_TENANTS_MAX {
            assert_eq!(value(&format!("t{n}")), Some(format!("t{n}")));
        }
        assert_eq!(value("one-too-many").as_deref(), Some(TENANT_OTHER));
        assert_eq!(value("t0").as_deref(), Some("t0"), "a known tenant keeps its series");
    }
}
