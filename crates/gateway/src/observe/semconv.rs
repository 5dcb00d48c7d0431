//! The names of the gateway's spans' attributes (docs/observability.md): the
//! OpenTelemetry semantic conventions' HTTP and GenAI names the call's SERVER
//! and CLIENT spans carry, and the limiter's own. Every name is written once,
//! here; [`super::trace`] writes them and re-exports them.

/// The version of the OpenTelemetry semantic conventions the names follow
/// (HTTP spans, GenAI client spans), exported as the tracer's schema URL.
pub const SEMCONV_SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.37.0";

/// HTTP conventions: the request's method.
pub const HTTP_REQUEST_METHOD: &str = "http.request.method";
/// HTTP conventions: the route matched (the gateway's endpoint path).
pub const HTTP_ROUTE: &str = "http.route";
/// HTTP conventions: the request's path.
pub const URL_PATH: &str = "url.path";
/// HTTP conventions: the status the client got (SERVER) or the provider sent (CLIENT).
pub const HTTP_RESPONSE_STATUS_CODE: &str = "http.response.status_code";
/// The class of a failure: the HTTP status, or `timeout` and the like.
pub const ERROR_TYPE: &str = "error.type";
/// The provider's host.
pub const SERVER_ADDRESS: &str = "server.address";
/// The provider's port.
pub const SERVER_PORT: &str = "server.port";

/// GenAI conventions: `chat` or `embeddings`.
pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
/// GenAI conventions: who serves the model (`openai`, `anthropic`, `azure.ai.openai`, ...).
pub const GEN_AI_PROVIDER_NAME: &str = "gen_ai.provider.name";
/// GenAI conventions: the model as sent to the deployment.
pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
/// GenAI conventions: the response's id, as the provider gave it.
pub const GEN_AI_RESPONSE_ID: &str = "gen_ai.response.id";
/// GenAI conventions: the model that served the answer, as the provider names it.
pub const GEN_AI_RESPONSE_MODEL: &str = "gen_ai.response.model";
/// GenAI conventions: why each choice finished, one per choice.
pub const GEN_AI_RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
/// GenAI conventions (after v1.37): a stream's first bytes, in seconds after the try was sent.
pub const GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: &str = "gen_ai.response.time_to_first_chunk";
/// GenAI conventions: the request's messages (only on the operator's opt-in).
pub const GEN_AI_INPUT_MESSAGES: &str = "gen_ai.input.messages";
/// GenAI conventions: the answer's messages (only on the operator's opt-in).
pub const GEN_AI_OUTPUT_MESSAGES: &str = "gen_ai.output.messages";
/// GenAI conventions: the output bound sent.
pub const GEN_AI_REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
/// GenAI conventions: whether the answer is asked as a stream.
pub const GEN_AI_REQUEST_STREAM: &str = "gen_ai.request.stream";
/// GenAI conventions: every input token, cached ones included.
pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
/// GenAI conventions: the output tokens.
pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
/// GenAI conventions: the input tokens read from the provider's cache.
pub const GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
/// GenAI conventions: the input tokens written to the provider's cache.
pub const GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: &str = "gen_ai.usage.cache_creation.input_tokens";

/// The limiter: the call's tenant (`_none` without one).
pub const RATELIMITER_TENANT: &str = "ratelimiter.tenant";
/// The limiter: the id of the directory key the call came with (never the key).
pub const RATELIMITER_KEY_ID: &str = "ratelimiter.key_id";
/// The limiter: the call's class.
pub const RATELIMITER_CLASS: &str = "ratelimiter.class";
/// The limiter: the deployment that served the call (its last try).
pub const RATELIMITER_DEPLOYMENT: &str = "ratelimiter.deployment";
/// The limiter: `admitted` at once, `queued` then admitted, or `denied`.
pub const RATELIMITER_DECISION: &str = "ratelimiter.decision";
/// The limiter: how long the call waited in its model's queue, in milliseconds.
pub const RATELIMITER_QUEUE_WAIT_MS: &str = "ratelimiter.queue.wait_ms";
/// The limiter: the key of the limit that denied the call.
pub const RATELIMITER_DENIED_BY: &str = "ratelimiter.denied_by";
/// The limiter: the retry hint of a denial, in milliseconds.
pub const RATELIMITER_RETRY_AFTER_MS: &str = "ratelimiter.retry_after_ms";
/// The limiter: the tokens reserved (input and output bound).
pub const RATELIMITER_TOKENS_RESERVED: &str = "ratelimiter.tokens.reserved";
/// The limiter: the tokens the limits were reconciled to.
pub const RATELIMITER_TOKENS_USED: &str = "ratelimiter.tokens.used";
/// The limiter: the call's worst case in dollars at the deployment's price,
/// what its budgets in money reserve.
pub const RATELIMITER_USD_RESERVED: &str = "ratelimiter.usd.reserved";
/// The limiter: the call's cost in dollars, at the deployment's price.
pub const RATELIMITER_USD_BILLED: &str = "ratelimiter.usd.billed";

/// [`RATELIMITER_DECISION`]'s values.
pub const DECISION_ADMITTED: &str = "admitted";
/// See [`DECISION_ADMITTED`].
pub const DECISION_QUEUED: &str = "queued";
/// See [`DECISION_ADMITTED`].
pub const DECISION_DENIED: &str = "denied";
