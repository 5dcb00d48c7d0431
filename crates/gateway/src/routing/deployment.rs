//! One deployment of a model's pool, ready to serve, and its state: the breaker
//! and this server's pause that decide whether it is tried, and its counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use axum::http::HeaderMap;
use bytes::Bytes;
use ratelimiter::clock::Clock;
use ratelimiter::LimitDefinition;

use super::breaker::{Breaker, BreakerState};
use super::order::{Capacity, LoadWindow};
use super::pause::Cooldown;
use crate::config::{BreakerConfig, ModelConfig, Resolved};
use crate::limits::{BudgetKey, ModelKeys};
use crate::wire::envelope::Envelope;
use ratelimiter::price::ModelPrice;

/// One deployment, ready to serve.
pub struct Deployment {
    /// Its single-deployment form.
    pub config: ModelConfig,
    /// Its upstream (index into the gateway's upstreams).
    pub upstream: usize,
    /// The upstream's name: the `x-ratelimit-deployment` header and the labels.
    pub label: Arc<str>,
    /// Its limit keys with the price in force: swapped whole when a price
    /// changes at runtime, so a call holds the keys (and the price) it was
    /// reserved at until it is reconciled.
    keys: RwLock<Arc<ModelKeys>>,
    /// Its own definitions, compared with the provider's headers.
    pub definitions: Vec<LimitDefinition>,
    /// The model name to write into the body when it differs from the client's.
    pub rewrite: Option<String>,
    /// Lower is tried first.
    pub priority: u32,
    /// Its share under weighted routing.
    pub weight: u32,
    /// This server's reservations on it over the last minute.
    pub load: LoadWindow,
    /// Counters, breaker and pause, shown by the metrics and the admin API.
    pub state: Arc<DeploymentState>,
    /// Whether the configured limit above the provider's was logged.
    pub warned_above_provider: std::sync::atomic::AtomicBool,
}

impl Deployment {
    /// The deployment of `resolved` for the model the clients call `model`.
    /// `upstream` is its upstream's index, with the deployment's price and the
    /// budgets its calls reserve besides their caller's.
    pub fn new(
        model: &str,
        resolved: &Resolved,
        (upstream, (price, usd)): (usize, (Option<ModelPrice>, Vec<BudgetKey>)),
        definitions: &[LimitDefinition],
        state: Arc<DeploymentState>,
    ) -> Self {
        let config = resolved.model.clone();
        let prefix = format!("global:llm:{}:{}:", config.upstream, config.key_name());
        Self {
            upstream,
            label: Arc::from(config.upstream.as_str()),
            keys: RwLock::new(Arc::new(
                ModelKeys::new(&config.upstream, &config).with_budgets(price, usd),
            )),
            definitions: (definitions.iter())
                .filter(|d| d.key().as_str().starts_with(&prefix))
                .cloned()
                .collect(),
            rewrite: (config.name != model).then(|| config.name.clone()),
            priority: resolved.priority,
            weight: resolved.weight,
            load: LoadWindow::new(Capacity {
                requests: config.limits.published.rpm,
                tokens: config.limits.published.tpm,
                input_tokens: config.limits.published.input_tpm,
                output_tokens: config.limits.published.output_tpm,
                concurrency: config.limits.published.concurrency,
            }),
            state,
            warned_above_provider: std::sync::atomic::AtomicBool::new(false),
            config,
        }
    }

    /// Its limit keys with the price in force now: read once per call at
    /// admission, and kept by the call until it is reconciled.
    pub fn keys(&self) -> Arc<ModelKeys> {
        self.keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Sets the price its calls admitted from now on reserve and reconcile
    /// at; a call admitted before keeps the keys it was reserved with.
    /// Returns the price it replaced.
    pub fn set_price(&self, price: Option<ModelPrice>) -> Option<ModelPrice> {
        let mut keys = self.keys.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let before = keys.price;
        if before != price {
            let usd = keys.usd.clone();
            *keys = Arc::new(ModelKeys::clone(&keys).with_budgets(price, usd));
        }
        before
    }

    /// The body sent to this deployment: `body` with `model` rewritten when the
    /// deployment's name differs (the answer keeps what the upstream returns),
    /// with `bound` (the field this deployment's upstream reads, and the
    /// output bound the call was reserved at) when the request named none, and
    /// wrapped in its upstream's `envelope` (with the client's `forwarded`
    /// headers it may carry).
    pub fn body(
        &self,
        body: &Bytes,
        bound: Option<(&str, u64)>,
        (envelope, forwarded): (Envelope, &HeaderMap),
    ) -> Bytes {
        if self.rewrite.is_none() && bound.is_none() && !envelope.rewrites_body() {
            return body.clone();
        }
        match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body) {
            Ok(mut object) => {
                if let Some(name) = &self.rewrite {
                    object.insert("model".to_owned(), serde_json::Value::String(name.clone()));
                }
                if let Some(bound) = bound {
                    crate::wire::openai::set_bound(&mut object, bound);
                }
                envelope.wrap(&mut object, forwarded);
                serde_json::to_vec(&object).map_or_else(|_| body.clone(), Bytes::from)
            }
            Err(_) => body.clone(),
        }
    }
}

/// The state of one deployment of a model (docs/gateway.md, "Pools"): its
/// breaker and this server's pause, which choose whether it is tried, and its
/// counters, shown in `/metrics` and by the admin API (`GET /v1/admin/gateway/deployments`).
#[derive(Debug)]
pub struct DeploymentState {
    /// The model name clients send.
    pub model: String,
    /// The upstream's name (never its URL or key).
    pub upstream: String,
    /// The model name sent to it.
    pub upstream_model: String,
    /// Calls reserved on it.
    pub admitted: AtomicU64,
    /// Of them, calls reserved after another deployment's keys denied them in the
    /// same admission (not the first deployment tried).
    pub admitted_after_denial: AtomicU64,
    /// Reservations its keys (or the tenant's) denied.
    pub denied: AtomicU64,
    /// Calls it failed (429, 5xx, no connection, timeout) that went on to another deployment.
    pub failed_over: AtomicU64,
    /// Its breaker (deployments of a pool only); this server's.
    pub breaker: Option<Breaker>,
    /// This server's pause after its provider's 429.
    pub cooldown: Cooldown,
}

impl DeploymentState {
    /// Fresh counters of a deployment, with a breaker of `breaker` when given,
    /// its breaker and pauses on `clock`.
    pub fn new(
        model: &str,
        upstream: &str,
        upstream_model: &str,
        breaker: Option<BreakerConfig>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            model: model.to_owned(),
            upstream: upstream.to_owned(),
            upstream_model: upstream_model.to_owned(),
            admitted: AtomicU64::new(0),
            admitted_after_denial: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            failed_over: AtomicU64::new(0),
            breaker: breaker.map(|config| Breaker::new(config, clock.clone())),
            cooldown: Cooldown::new(clock),
        }
    }

    /// The breaker's state now; `closed` without a breaker.
    pub fn breaker_state(&self) -> BreakerState {
        (self.breaker.as_ref()).map_or(BreakerState::Closed, Breaker::state)
    }

    /// Whether it saw a call, or has a breaker open or a pause running.
    pub fn is_active(&self) -> bool {
        self.admitted.load(Ordering::Relaxed) > 0
            || self.denied.load(Ordering::Relaxed) > 0
            || self.breaker_state() != BreakerState::Closed
            || self.cooldown.until_unix_ms().is_some()
    }
}
