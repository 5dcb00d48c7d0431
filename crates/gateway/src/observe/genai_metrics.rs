//! The metrics of the gateway's calls over OTLP (docs/telemetry.md): the
//! OpenTelemetry GenAI client metrics of each try on a deployment, and the
//! limiter's own decisions and queue waits. Named once, here; recorded by the
//! call's trace ([`super::trace`]) only when the server exports metrics.
//!
//! Tenant and key stay off every metric's attributes: one series per tenant
//! and key would be unbounded; the spans carry them.

use std::time::Duration;

use opentelemetry::metrics::{Counter, Histogram, Meter};
use opentelemetry::KeyValue;

/// GenAI conventions: tokens per try, by `gen_ai.token.type`.
pub const GEN_AI_CLIENT_TOKEN_USAGE: &str = "gen_ai.client.token.usage";
/// GenAI conventions: how long a try took, in seconds (a stream to its end).
pub const GEN_AI_CLIENT_OPERATION_DURATION: &str = "gen_ai.client.operation.duration";
/// GenAI conventions (after v1.37): a stream's time to its first chunk, in seconds.
pub const GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK: &str = "gen_ai.client.operation.time_to_first_chunk";
/// GenAI conventions: `input` or `output`.
pub const GEN_AI_TOKEN_TYPE: &str = "gen_ai.token.type";
/// The limiter: calls by `ratelimiter.decision` and `gen_ai.request.model`.
pub const RATELIMITER_GATEWAY_DECISIONS: &str = "ratelimiter.gateway.decisions";
/// The limiter: how long queued calls waited, in seconds.
pub const RATELIMITER_GATEWAY_QUEUE_DURATION: &str = "ratelimiter.gateway.queue.duration";

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

/// The instruments, made once from the server's meter.
pub struct GenAiMetrics {
    token_usage: Histogram<u64>,
    operation_duration: Histogram<f64>,
    time_to_first_chunk: Histogram<f64>,
    decisions: Counter<u64>,
    queue_duration: Histogram<f64>,
}

impl GenAiMetrics {
    /// The instruments of `meter`.
    pub fn new(meter: &Meter) -> Self {
        Self {
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
        }
    }

    /// One try ended after `took`, with `attributes` (operation, provider,
    /// model, `error.type` on failure) and, when the provider reported it, its
    /// `(input, output)` tokens.
    pub fn try_ended(&self, attributes: &[KeyValue], took: Duration, tokens: Option<(u64, u64)>) {
        self.operation_duration.record(took.as_secs_f64(), attributes);
        if let Some((input, output)) = tokens {
            let mut typed = attributes.to_vec();
            typed.push(KeyValue::new(GEN_AI_TOKEN_TYPE, "input"));
            self.token_usage.record(input, &typed);
            if let Some(last) = typed.last_mut() {
                *last = KeyValue::new(GEN_AI_TOKEN_TYPE, "output");
            }
            self.token_usage.record(output, &typed);
        }
    }

    /// A streamed try's first chunk came `after` it was sent (`attributes` as
    /// [`GenAiMetrics::try_ended`]'s).
    pub fn first_chunk(&self, attributes: &[KeyValue], after: Duration) {
        self.time_to_first_chunk.record(after.as_secs_f64(), attributes);
    }

    /// A call's decision, with `attributes` its `ratelimiter.decision` and
    /// `gen_ai.request.model` (the model the client asked for).
    pub fn decided(&self, attributes: &[KeyValue]) {
        self.decisions.add(1, attributes);
    }

    /// A call waited `waited` in its model's queue (`attributes`: the model).
    pub fn queued(&self, waited: Duration, attributes: &[KeyValue]) {
        self.queue_duration.record(waited.as_secs_f64(), attributes);
    }
}
