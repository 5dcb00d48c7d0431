//! The simulated LLM provider (docs/provider-sim.md): a ledger that enforces a
//! provider's limits the way the provider does, its HTTP face with OpenAI's and
//! Anthropic's wire formats, and the client the replay calls it with. The
//! `provider-sim` binary serves it on its own; the replay and the gateway's
//! tests start it in process.
//!
//! The simulator knows nothing of the replay: no module here imports the
//! trace, the strategies or the run (tests/layers.rs keeps it so).
//!
//! # Layout
//!
//! Each module imports only from those listed above it (tests/layers.rs keeps it so):
//!
//! - [`limits`]: the provider's limits, how it charges tokens and counts a text;
//! - [`enforcement`]: how one limit is metered (sliding log, bucket, fixed window);
//! - [`profile`]: a provider's profile (its limits, meters, charges and headers);
//! - [`provider`]: the ledger that admits or refuses a call, and its hints;
//! - [`prompt`], [`cache`], [`vision`], [`reset_time`]: synthesized prompts,
//!   Anthropic's prompt cache, what an image is billed, how reset times are written;
//! - [`price`], [`billing`]: what a model's tokens cost, and the bill of every call;
//! - [`wire`]: the chat call's request and usage shapes and their bounds;
//! - [`errors`]: the two wire formats' error shapes; [`faults`]: the fault switch;
//! - [`sigv4`]: AWS Signature Version 4 checked as Bedrock checks it; [`sts`]:
//!   temporary credentials for a web identity;
//! - [`vertex_auth`]: Google's token endpoint for a service account and the
//!   check of the tokens it issued;
//! - [`content`]: what a call's messages hold, as the simulator counts them;
//! - [`control`]: the models, the key, the calls in flight, the armed fault;
//! - [`server`]: the provider's state (ledger, control, quota buckets) and a call's slot;
//! - [`admission`]: a call through the fault switch and the ledger, and its refusal;
//! - [`sse`]: streamed bodies at the model's pace;
//! - [`hosted_tools`]: OpenAI's hosted web search, billed as input;
//! - [`openai`], [`anthropic`]: the two wire formats; [`azure`]: Azure OpenAI's
//!   per-deployment paths over the OpenAI endpoints; [`event_stream`]: Bedrock's
//!   stream frames; [`bedrock`]: Bedrock's runtime over the Anthropic and OpenAI
//!   endpoints; [`sts_routes`]: STS's `AssumeRoleWithWebIdentity`; [`vertex`]:
//!   Vertex AI's Claude and OpenAI-compatible paths over them;
//!   [`control_routes`]: `/sim/*`;
//! - [`routes`]: every route on one listener;
//! - [`client`]: the replay's HTTP client for the provider.

pub mod admission;
pub mod anthropic;
pub mod azure;
pub mod bedrock;
pub mod billing;
pub mod cache;
pub mod client;
pub mod content;
pub mod control;
pub mod control_routes;
pub mod enforcement;
pub mod errors;
pub mod event_stream;
pub mod faults;
pub mod hosted_tools;
pub mod limits;
pub mod openai;
pub mod price;
pub mod profile;
pub mod prompt;
pub mod provider;
pub mod reset_time;
pub mod routes;
pub mod server;
pub mod sigv4;
pub mod sse;
pub mod sts;
pub mod sts_routes;
pub mod vertex;
pub mod vertex_auth;
pub mod vision;
pub mod wire;
