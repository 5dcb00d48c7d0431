//! A model's pool of deployments (docs/gateway.md, "Pools"): one model name served by
//! several upstream deployments, each with its own limit keys. A call is reserved,
//! all or nothing, on one deployment's keys plus the tenant's: the deployments are
//! tried in the order of `routing.rs`, those whose breaker is open are left out, and
//! a denial on one moves on to the next within the same admission. A model of the
//! single-deployment form is a pool of one.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ratelimiter::clock::Clock;
use ratelimiter::{Denial, LeaseId, LeaseOwner, LimitDefinition, Limiter, ReserveRequest};

use super::breaker::{Breaker, BreakerState, Pass};
use super::deployment::{Deployment, DeploymentState};
use super::order::{self, Candidate, WeightedTurns};
use super::pause;
use super::refusal::Refusal;
use crate::config::{deployment_price, resolve, ModelConfig, Routing, UpstreamConfig, DEPLOYMENTS_MAX};
use crate::limits::ModelKeys;
use crate::limits::{
    self, denial_key, reserve_guarded, BudgetKey, CapacityFreed, Classes, Reservation, Reserved, TenantKeys,
};

/// What a call needs, whichever deployment takes it.
#[derive(Debug, Clone)]
pub struct Need {
    /// The tenant's keys, charged once per call.
    pub tenant: Option<Arc<TenantKeys>>,
    /// The prompt's count.
    pub input_tokens: u64,
    /// The prompt's characters (a profile's admission estimate).
    pub prompt_characters: u64,
    /// The output bound.
    pub output_tokens: u64,
    /// The deployments already tried by this call (bit per index).
    pub tried: u32,
    /// The call's class (an index into `classes`): it reserves that class's ceilings.
    pub class: usize,
    /// The gateway's classes.
    pub classes: Arc<Classes>,
    /// Who the call's leases are charged to (its tenant): bounded to its share
    /// of the backend's lease table.
    pub owner: Option<LeaseOwner>,
}

/// A reservation granted on one deployment, and its guard until the call takes
/// it ([`Grant::take`]): dropped before (a client gone while queued, a waiter
/// timed out as the grant arrived), the lease is released, the breaker's probe
/// given back and the deployment's local load window told, so nothing is lost
/// however the handler ends.
pub struct Grant {
    /// The deployment.
    pub deployment: usize,
    /// The lease's own guard; `None`: nothing to reserve (no limit applies).
    lease: Option<Reserved>,
    /// Tokens reserved for input (this deployment's charge) and output.
    pub reserved: (u64, u64),
    /// The breaker's pass: a probe's outcome decides the breaker.
    pub pass: Pass,
    /// The pool, told when the grant is dropped untaken.
    pool: Arc<Pool>,
    /// The deployment's keys the call was reserved on, with their price: the
    /// call is reconciled at that price even if it changes meanwhile.
    pub keys: Arc<ModelKeys>,
    /// Whether the grant was counted on the deployment's load window.
    counted: bool,
    /// Whether the call took it.
    taken: bool,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("deployment", &self.deployment)
            .field("lease", &self.lease)
            .field("reserved", &self.reserved)
            .field("pass", &self.pass)
            .finish()
    }
}

impl Grant {
    /// Hands the lease over to the call, which owns it from now on (its
    /// `CallLease`, built with no await in between): its id, `None` when
    /// nothing was reserved.
    pub fn take(mut self) -> Option<LeaseId> {
        self.taken = true;
        self.lease.take().map(Reserved::take)
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        self.pool.abandon(self.deployment, self.pass);
        if self.counted {
            self.pool.deployments[self.deployment].load.ended();
        }
        // `lease` drops next: its guard releases the reservation.
    }
}

/// What stood in a call's way on the deployments tried so far.
#[derive(Default)]
struct Refused {
    /// The earliest temporary denial.
    temporary: Option<Denial>,
    /// The first permanent denial (the call fits that deployment even empty).
    permanent: Option<Denial>,
    /// The time to the first half-open of an open breaker.
    failing_ms: Option<u64>,
}

impl Refused {
    fn failing(&mut self, retry_after_ms: u64) {
        self.failing_ms = Some(self.failing_ms.map_or(retry_after_ms, |m| m.min(retry_after_ms)));
    }

    fn denied(&mut self, denial: Denial) {
        if denial.is_permanent() {
            self.permanent.get_or_insert(denial);
        } else if (self.temporary.as_ref()).is_none_or(|t| denial.retry_after_ms() < t.retry_after_ms()) {
            self.temporary = Some(denial);
        }
    }

    fn any_denial(&self) -> bool {
        self.temporary.is_some() || self.permanent.is_some()
    }

    /// The call's refusal: the earliest temporary denial; else, when only open
    /// breakers stood in the way, the time to the first half-open; else the
    /// permanent denial.
    fn refusal(self) -> Refusal {
        if let Some(denial) = self.temporary {
            return Refusal::Denied(denial);
        }
        if let Some(retry_after_ms) = self.failing_ms {
            return Refusal::Failing { retry_after_ms };
        }
        self.permanent
            .map_or(Refusal::Failing { retry_after_ms: 0 }, Refusal::Denied)
    }
}

/// A model's deployments and how they are chosen.
pub struct Pool {
    /// The deployments, as configured.
    pub deployments: Vec<Deployment>,
    routing: Routing,
    turns: WeightedTurns,
    /// The gateway's clock: the seconds of the deployments' load windows (the
    /// deployments' breakers and pauses hold it too).
    clock: Arc<dyn Clock>,
}

impl Pool {
    /// A pool of `deployments` picked by `routing`, their load counted on `clock`.
    pub fn new(deployments: Vec<Deployment>, routing: Routing, clock: Arc<dyn Clock>) -> Self {
        assert!(!deployments.is_empty() && deployments.len() <= DEPLOYMENTS_MAX);
        Self {
            turns: WeightedTurns::new(deployments.len()),
            deployments,
            routing,
            clock,
        }
    }

    /// The clock's unix seconds: the load windows' slots.
    fn unix_seconds(&self) -> u64 {
        self.clock.now_unix_ms() / 1000
    }

    /// The pool of `model`: its deployments on `upstreams`, with their share of
    /// `definitions` (the caller registers their states in the metrics); a breaker each when the
    /// model lists `deployments`. Each deployment's calls reserve `usd` (the
    /// model's and the gateway's budgets) at the deployment's own price.
    pub fn of(
        model: &ModelConfig,
        upstreams: &[UpstreamConfig],
        (definitions, usd): (&[LimitDefinition], &[BudgetKey]),
        clock: &Arc<dyn Clock>,
    ) -> Self {
        let breaker = (!model.deployments.is_empty()).then(|| model.breaker.unwrap_or_default());
        let deployments = resolve(model)
            .iter()
            .map(|resolved| {
                let upstream = (upstreams.iter())
                    .position(|u| u.name == resolved.model.upstream)
                    .expect("validated");
                let state = Arc::new(DeploymentState::new(
                    &model.name,
                    &resolved.model.upstream,
                    &resolved.model.name,
                    breaker,
                    clock.clone(),
                ));
                // Unpriced only without configured budgets; a runtime budget
                // on such a deployment's call is refused at admission.
                let price = deployment_price(&resolved.model, &upstreams[upstream])
                    .ok()
                    .map(|p| p.price);
                let budgets = (price, usd.to_vec());
                Deployment::new(&model.name, resolved, (upstream, budgets), definitions, state)
            })
            .collect();
        Self::new(deployments, model.routing, clock.clone())
    }

    /// The gateway's clock now, in Unix ms: when a refused budget's period
    /// ends is told on the same clock that admission runs on.
    pub fn now_unix_ms(&self) -> u64 {
        self.clock.now_unix_ms()
    }

    /// Whether a failure may move a call to another deployment: the pool has one
    /// not yet tried besides the one that failed, whose breaker is not open (a
    /// call with none left gets the failed deployment's own answer, not a wait
    /// for a breaker to half-open).
    pub fn can_fail_over(&self, tried: u32) -> bool {
        (self.deployments.iter().enumerate())
            .filter(|(i, _)| tried & (1 << i) == 0)
            .any(|(_, d)| (d.state.breaker.as_ref()).is_none_or(|b| b.state() != BreakerState::Open))
    }

    /// The order this call tries the deployments it has not tried yet.
    fn order(&self, need: &Need) -> Vec<Candidate> {
        let now_s = self.unix_seconds();
        let mut candidates: Vec<Candidate> = (self.deployments.iter().enumerate())
            .filter(|(i, _)| need.tried & (1 << i) == 0)
            .map(|(index, d)| Candidate {
                index,
                priority: d.priority,
                weight: d.weight,
                fill: if self.routing == Routing::Capacity && self.deployments.len() > 1 {
                    d.load.fill(now_s, need.input_tokens, need.output_tokens)
                } else {
                    0.0
                },
            })
            .collect();
        order::order(self.routing, &self.turns, &mut candidates);
        candidates
    }

    /// Reserves the call on the first deployment, in the pool's order, whose keys
    /// (and the tenant's) hold it; each reservation is guarded from the moment
    /// it is granted (`queue` is woken when a guard releases one). Refused: the
    /// earliest temporary denial of any deployment; else, when only open
    /// breakers stand in the way, the time to the first half-open; else the
    /// permanent denial (the call fits none, even empty).
    pub async fn reserve(
        self: &Arc<Self>,
        limiter: &Arc<dyn Limiter>,
        queue: &Arc<dyn CapacityFreed>,
        need: &Need,
    ) -> Result<Grant, Refusal> {
        let mut refused = Refused::default();
        for candidate in self.order(need) {
            let deployment = &self.deployments[candidate.index];
            let pass = match deployment.state.breaker.as_ref().map(Breaker::pass) {
                Some(Pass::Wait { retry_after_ms }) => {
                    refused.failing(retry_after_ms);
                    continue;
                }
                Some(pass) => pass,
                None => Pass::Go,
            };
            // Read once: the call reserves, and is reconciled, at this price.
            let keys = deployment.keys();
            let input = limits::prompt_charge(&keys, need.input_tokens, need.prompt_characters);
            // The pass is guarded from here: a handler dropped during the
            // reserve below gives a probe back.
            let mut grant = Grant {
                deployment: candidate.index,
                lease: None,
                reserved: (input, need.output_tokens),
                pass,
                pool: self.clone(),
                counted: false,
                taken: false,
                keys: keys.clone(),
            };
            let mut requirements = limits::requirements(&keys, need.tenant.as_deref(), input, need.output_tokens);
            // The call's class's ceilings over this deployment's keys (crate::limits::classes).
            need.classes.add_ceilings(need.class, &mut requirements);
            if requirements.is_empty() {
                self.granted(&mut grant);
                return Ok(grant);
            }
            let request = ReserveRequest::new(LeaseId::generate(), None, requirements)
                .map_err(|e| Refusal::Backend(ratelimiter::LimiterError::InvalidRequest(e.0)))?
                .with_owner(need.owner.clone());
            match reserve_guarded(limiter, request, Some(queue.clone())).await {
                Ok(Reservation::Allowed(lease)) => {
                    grant.lease = Some(lease);
                    if refused.any_denial() {
                        deployment.state.admitted_after_denial.fetch_add(1, Ordering::Relaxed);
                    }
                    self.granted(&mut grant);
                    return Ok(grant);
                }
                Ok(Reservation::Denied(denial)) => {
                    drop(grant);
                    deployment.state.denied.fetch_add(1, Ordering::Relaxed);
                    refused.denied(denial);
                }
                Err(e) => return Err(Refusal::Backend(e)),
            }
        }
        Err(refused.refusal())
    }

    fn granted(&self, grant: &mut Grant) {
        let deployment = &self.deployments[grant.deployment];
        deployment
            .load
            .admitted(self.unix_seconds(), grant.reserved.0, grant.reserved.1);
        grant.counted = true;
        deployment.state.admitted.fetch_add(1, Ordering::Relaxed);
    }

    /// Gives a breaker's pass back unused (its call was not sent).
    pub fn abandon(&self, index: usize, pass: Pass) {
        if let Some(breaker) = &self.deployments[index].state.breaker {
            breaker.abandon(pass);
        }
    }

    /// A deployment's sent call ended: `success` (any answer but a 5xx) or a
    /// failure (5xx, no connection, timeout) counts on its breaker.
    pub fn record(&self, index: usize, pass: Pass, success: bool) {
        if let Some(breaker) = &self.deployments[index].state.breaker {
            breaker.record(pass, success);
        }
    }

    /// The time left of this server's pause of the deployment whose key `denial`
    /// names, if one runs: the provider's own time is then the 429's hint.
    pub fn cooldown_left_ms(&self, denial: &Denial) -> Option<u64> {
        let key = denial_key(denial)?;
        self.deployments
            .iter()
            .find(|d| pause::key(&d.keys()).is_some_and(|k| k.as_str() == key))
            .and_then(|d| d.state.cooldown.left_ms())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use axum::http::HeaderMap;
    use bytes::Bytes;

    use crate::wire::envelope::Envelope;

    fn clock() -> Arc<dyn Clock> {
        Arc::new(ratelimiter::SystemClock::new())
    }

    /// A pool without a queue behind it.
    struct NoWaiters;

    impl CapacityFreed for NoWaiters {
        fn capacity_freed(&self) {}
    }

    fn pool_model() -> ModelConfig {
        serde_yaml::from_str(
            "{name: gpt-4o, max_output_tokens_default: 8, max_wait_ms: 5, deployments: [{upstream: east, model: gpt-4o-ptu, rpm: 6}, {upstream: west, priority: 2, tpm: 100}]}",
        )
        .unwrap()
    }

    #[test]
    fn a_deployment_is_the_single_model_it_abbreviates_and_rewrites_the_model_it_sends() {
        let model = pool_model();
        let resolved = resolve(&model);
        assert_eq!(resolved[0].model.name, "gpt-4o-ptu");
        assert_eq!(resolved[0].model.limits.published.rpm, Some(6));
        assert_eq!(resolved[1].model.name, "gpt-4o", "default: the model's name");
        assert_eq!(
            (resolved[1].priority, resolved[1].model.limits.published.tpm),
            (2, Some(100))
        );
        assert_eq!(resolved[1].model.max_wait_ms, 5);
        let stats = Arc::new(DeploymentState::new("gpt-4o", "east", "gpt-4o-ptu", None, clock()));
        let east = Deployment::new("gpt-4o", &resolved[0], (0, (None, Vec::new())), &[], stats.clone());
        let body = Bytes::from_static(br#"{"model":"gpt-4o","messages":[],"max_tokens":3}"#);
        let sent: serde_json::Value =
            serde_json::from_slice(&east.body(&body, None, (Envelope::Plain, &HeaderMap::new()))).unwrap();
        assert_eq!(sent["model"], "gpt-4o-ptu");
        assert_eq!(sent["max_tokens"], 3, "the rest unchanged");
        let west = Deployment::new("gpt-4o", &resolved[1], (1, (None, Vec::new())), &[], stats);
        assert_eq!(
            west.body(&body, None, (Envelope::Plain, &HeaderMap::new())),
            body,
            "the same name: the client's bytes, untouched"
        );
        // A single-deployment model is its own one deployment.
        let single: ModelConfig =
            serde_yaml::from_str("{name: m, upstream: u, rpm: 3, max_output_tokens_default: 1}").unwrap();
        assert_eq!(resolve(&single)[0].model, single);
    }

    #[tokio::test]
    async fn a_grant_dropped_before_its_call_took_it_gives_the_lease_and_the_probe_back() {
        use ratelimiter::{Backend, LimitKey, MemoryBackend, MemoryConfig, SystemClock};
        let slot = LimitKey::new("global:llm:test:m:concurrency").unwrap();
        let backend = Arc::new(MemoryBackend::new(
            Arc::new(SystemClock::new()),
            MemoryConfig::default(),
        ));
        backend
            .apply_definition(&LimitDefinition::concurrency(slot.clone(), 1, 60).unwrap())
            .await
            .unwrap();
        let limiter: Arc<dyn Limiter> = backend.clone();
        let model: ModelConfig = serde_yaml::from_str(
            "{name: m, max_output_tokens_default: 1, deployments: [{upstream: test, concurrency: 1}]}",
        )
        .unwrap();
        let breaker = crate::config::BreakerConfig {
            failures: 1,
            open_ms: 1,
        };
        let fake = Arc::new(ratelimiter::FakeClock::new(1_000_000));
        let clock: Arc<dyn Clock> = fake.clone();
        let stats = Arc::new(DeploymentState::new("m", "test", "m", Some(breaker), clock.clone()));
        let pool = Arc::new(Pool::new(
            vec![Deployment::new(
                "m",
                &resolve(&model)[0],
                (0, (None, Vec::new())),
                &[],
                stats.clone(),
            )],
            model.routing,
            clock,
        ));
        // The breaker opens, then half-opens: the next grant carries its one probe.
        pool.record(0, Pass::Go, false);
        fake.advance_ms(1);
        let need = Need {
            tenant: None,
            input_tokens: 1,
            prompt_characters: 0,
            output_tokens: 1,
            tried: 0,
            class: 0,
            classes: Arc::new(Classes::new(&[])),
            owner: None,
        };
        let queue: Arc<dyn CapacityFreed> = Arc::new(NoWaiters);
        let grant = pool.reserve(&limiter, &queue, &need).await.unwrap();
        assert_eq!(grant.pass, Pass::Probe);
        assert_eq!(backend.limit_report(&slot).await.unwrap().unwrap().in_use, 1);
        // The handler ends before the call takes its grant (a client gone).
        drop(grant);
        assert_eq!(
            backend.limit_report(&slot).await.unwrap().unwrap().in_use,
            0,
            "the lease is released"
        );
        // The probe came back: the next call may probe, and its grant, taken,
        // keeps the slot for the call.
        let grant = pool.reserve(&limiter, &queue, &need).await.unwrap();
        assert_eq!(grant.pass, Pass::Probe, "the probe was given back");
        assert!(grant.take().is_some());
        assert_eq!(backend.limit_report(&slot).await.unwrap().unwrap().in_use, 1);
    }

    #[tokio::test]
    async fn the_load_windows_count_on_the_gateways_clock() {
        use ratelimiter::{Backend, FakeClock, LimitKey, MemoryBackend, MemoryConfig, SystemClock};
        let backend = Arc::new(MemoryBackend::new(
            Arc::new(SystemClock::new()),
            MemoryConfig::default(),
        ));
        for upstream in ["a", "b"] {
            let key = LimitKey::new(format!("global:llm:{upstream}:m:rpm")).unwrap();
            backend
                .apply_definition(&LimitDefinition::rolling(key, 10, 60).unwrap())
                .await
                .unwrap();
        }
        let limiter: Arc<dyn Limiter> = backend.clone();
        let model: ModelConfig = serde_yaml::from_str(
            "{name: m, max_output_tokens_default: 1, deployments: [{upstream: a, rpm: 10}, {upstream: b, rpm: 10}]}",
        )
        .unwrap();
        let fake = Arc::new(FakeClock::new(1_000_000));
        let clock: Arc<dyn Clock> = fake.clone();
        let deployments = (resolve(&model).iter().enumerate())
            .map(|(i, resolved)| {
                let state = DeploymentState::new("m", &resolved.model.upstream, "m", None, clock.clone());
                Deployment::new("m", resolved, (i, (None, Vec::new())), &[], Arc::new(state))
            })
            .collect();
        let pool = Arc::new(Pool::new(deployments, model.routing, clock));
        let need = Need {
            tenant: None,
            input_tokens: 0,
            prompt_characters: 0,
            output_tokens: 0,
            tried: 0,
            class: 0,
            classes: Arc::new(Classes::new(&[])),
            owner: None,
        };
        let queue: Arc<dyn CapacityFreed> = Arc::new(NoWaiters);
        let first = pool.reserve(&limiter, &queue, &need).await.unwrap();
        assert_eq!(first.deployment, 0, "both empty: the first listed");
        assert!(first.take().is_some());
        let order = |pool: &Pool| pool.order(&need).iter().map(|c| c.index).collect::<Vec<_>>();
        assert_eq!(order(&pool), [1, 0], "the emptier deployment first");
        fake.advance_ms(59_000);
        assert_eq!(order(&pool), [1, 0], "within the minute, the call still counts");
        fake.advance_ms(2_000);
        assert_eq!(
            order(&pool),
            [0, 1],
            "a minute later on the gateway's clock, it is gone"
        );
    }
}
