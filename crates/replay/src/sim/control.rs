//! The simulator's own state beside the ledger: the model catalogue, the upstream
//! key, the calls in flight and their peak, the armed fault
//! ([`crate::sim::faults`]), how many tokens a call writes, and the bill
//! ([`crate::sim::billing`]). The routes that read and set it from outside are in
//! [`crate::sim::control_routes`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::sim::billing::Billing;
use crate::sim::cache::PromptCache;
use crate::sim::errors::{error, Wire};
use crate::sim::faults::{ArmedFault, FaultMode};
use crate::sim::sigv4::AwsKeys;
use crate::sim::sts::Sts;

/// The models the simulator serves when none are configured: the replay's model and
/// the names the gateway's tests and examples use. Any other name gets a 404, as a
/// provider answers a model it does not have.
pub const MODELS_DEFAULT: [&str; 6] = [
    "sim-model",
    "gpt-4o-mini",
    "gpt-4o",
    "text-embedding-3-small",
    "claude-haiku-4-5",
    "claude-sonnet-4-5",
];
/// The most models a simulator serves: the catalogue is scanned on every call.
pub const MODELS_MAX: usize = 256;

/// The simulator's own state beside the ledger.
#[derive(Debug)]
pub struct SimControl {
    models: Vec<String>,
    api_key: Option<String>,
    /// The AWS keys Bedrock's signatures are checked with (`sim/bedrock.rs`).
    aws_keys: Option<AwsKeys>,
    /// STS's web identity exchange, when served (`sim/sts.rs`).
    sts: Option<Sts>,
    fault: Mutex<Option<ArmedFault>>,
    in_flight: AtomicU64,
    in_flight_max: AtomicU64,
    calls: AtomicU64,
    faults_injected: AtomicU64,
    /// Anthropic's prompt cache.
    pub(crate) prompt_cache: PromptCache,
    /// Draws a call's output tokens when it names none; `None`: the bound.
    output_draw: Option<Mutex<StdRng>>,
    /// The prices and the bill.
    pub billing: Billing,
}

impl Default for SimControl {
    fn default() -> Self {
        Self::new(MODELS_DEFAULT.iter().map(|m| (*m).to_owned()).collect(), None)
    }
}

impl SimControl {
    /// Serves `models`; requires `api_key` from callers when set.
    pub fn new(models: Vec<String>, api_key: Option<String>) -> Self {
        assert!(
            !models.is_empty() && models.len() <= MODELS_MAX,
            "1..=MODELS_MAX models"
        );
        Self {
            models,
            api_key,
            aws_keys: None,
            sts: None,
            fault: Mutex::new(None),
            in_flight: AtomicU64::new(0),
            in_flight_max: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            faults_injected: AtomicU64::new(0),
            prompt_cache: PromptCache::default(),
            output_draw: None,
            billing: Billing::default(),
        }
    }

    /// Checks Bedrock's SigV4 signatures against `keys` (docs/provider-sim.md, "Bedrock").
    pub fn with_aws_keys(self, keys: AwsKeys) -> Self {
        Self {
            aws_keys: Some(keys),
            ..self
        }
    }

    /// Serves STS's `AssumeRoleWithWebIdentity`, its credentials lasting
    /// `lifetime` and accepted by Bedrock's routes until they expire.
    pub fn with_sts(self, lifetime: std::time::Duration) -> Self {
        Self {
            sts: Some(Sts::new(lifetime)),
            ..self
        }
    }

    /// The STS, if served.
    pub fn sts(&self) -> Option<&Sts> {
        self.sts.as_ref()
    }

    /// The key callers must send, if one is required.
    pub fn api_key(&self) -> Option<&str> {
        self.api_key.as_deref()
    }

    /// The AWS keys Bedrock's signatures are checked with, if configured.
    pub fn aws_keys(&self) -> Option<&AwsKeys> {
        self.aws_keys.as_ref()
    }

    /// Bills calls with `billing`'s prices.
    pub fn with_billing(self, billing: Billing) -> Self {
        Self { billing, ..self }
    }

    /// A call that names no `sim_output_tokens` writes a number of tokens drawn
    /// uniformly in 1..=its bound (seeded by `seed`, so a run repeats), as a model
    /// stops where it will, instead of writing its whole bound.
    pub fn with_random_output(self, seed: u64) -> Self {
        Self {
            output_draw: Some(Mutex::new(StdRng::seed_from_u64(seed))),
            ..self
        }
    }

    /// The output tokens of a call bounded by `bound` that asked for `asked`: the
    /// ask capped by the bound, else the draw (when random), else the bound.
    pub fn output_tokens(&self, asked: Option<u64>, bound: u64) -> u64 {
        match (asked, &self.output_draw) {
            (Some(asked), _) => asked.min(bound),
            (None, Some(draw)) if bound > 0 => draw.lock().expect("draw lock").gen_range(1..=bound),
            (None, _) => bound,
        }
    }

    /// The models served.
    pub fn models(&self) -> &[String] {
        &self.models
    }

    /// The most model calls served at once since the start or the last reset.
    pub fn in_flight_max(&self) -> u64 {
        self.in_flight_max.load(Ordering::SeqCst)
    }

    /// Checks the caller's key (when one is required) and the model, and takes the
    /// armed fault's next turn; `Err` is the answer to send instead.
    pub fn check(&self, wire: Wire, headers: &HeaderMap, model: &str) -> Result<Option<FaultMode>, Box<Response>> {
        self.authorize(wire, headers, model)?;
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(self.take_fault(model))
    }

    /// Checks the caller's key (when one is required) and the model.
    pub fn authorize(&self, wire: Wire, headers: &HeaderMap, model: &str) -> Result<(), Box<Response>> {
        if let Some(key) = &self.api_key {
            let sent = match wire {
                Wire::Openai => headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer ")),
                Wire::Anthropic => headers.get("x-api-key").and_then(|v| v.to_str().ok()),
            };
            if sent != Some(key.as_str()) {
                return Err(Box::new(error(
                    wire,
                    StatusCode::UNAUTHORIZED,
                    "invalid api key".to_owned(),
                )));
            }
        }
        if !self.models.iter().any(|m| m == model) {
            let message = format!("The model `{model}` does not exist");
            return Err(Box::new(error(wire, StatusCode::NOT_FOUND, message)));
        }
        Ok(())
    }

    /// The armed fault's next turn for a call of `model`, if it covers it.
    fn take_fault(&self, model: &str) -> Option<FaultMode> {
        let mut armed = self.fault.lock().expect("fault lock");
        let fault = armed.as_mut()?;
        if fault.until.is_some_and(|until| std::time::Instant::now() >= until) {
            *armed = None;
            return None;
        }
        if fault.model.as_deref().is_some_and(|m| m != model) {
            return None;
        }
        let mode = fault.mode;
        fault.left -= 1;
        if fault.left == 0 {
            *armed = None;
        }
        self.faults_injected.fetch_add(1, Ordering::SeqCst);
        Some(mode)
    }

    /// Model calls in flight now.
    pub fn in_flight_calls(&self) -> u64 {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Model calls checked since the start or the last reset.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Calls a fault covered since the start or the last reset.
    pub fn faults_injected(&self) -> u64 {
        self.faults_injected.load(Ordering::SeqCst)
    }

    /// The peak starts again from the calls in flight now, the call counters from 0.
    pub fn reset_stats(&self) {
        self.in_flight_max
            .store(self.in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
        self.calls.store(0, Ordering::SeqCst);
        self.faults_injected.store(0, Ordering::SeqCst);
    }

    /// Arms `fault` in place of the armed one, or disarms with `None`.
    pub(crate) fn arm(&self, fault: Option<ArmedFault>) {
        *self.fault.lock().expect("fault lock") = fault;
    }

    /// Counts a model call in flight until the guard drops.
    pub fn busy(self: &Arc<Self>) -> Busy {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.in_flight_max.fetch_max(now, Ordering::SeqCst);
        Busy(Arc::clone(self))
    }
}

/// A model call in flight at the simulator (admitted or being refused): the count
/// `/sim/stats` reports as `in_flight_calls` and its peak as `in_flight_max`.
#[derive(Debug)]
pub struct Busy(Arc<SimControl>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}
