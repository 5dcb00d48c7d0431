//! Property test of the memory backend against a reference model.
//!
//! Random interleavings of reserves (new and retried lease ids), completes with
//! random actuals, abandoned leases (never completed), capacity changes, pending
//! decreases and clock advances, over rolling and concurrency keys. The model
//! records every grant independently; after every step the test checks that no
//! key's live granted usage exceeds its capacity, that the backend reports
//! exactly the model's usage and debt, that every outcome is the model's (so no
//! capacity sits idle either), and that a denied request changes no report.

use std::sync::Arc;

use proptest::prelude::*;

use ratelimiter::definition::{LimitKind, LimitReport, LimitState, LimitStatus, Overage};
use ratelimiter::memory::{MemoryBackend, MemoryConfig, LEASE_MEMORY_MARGIN_MS};
use ratelimiter::retry::Jitter;
use ratelimiter::WINDOW_MARGIN_MS_DEFAULT;
use ratelimiter::{
    Actual, Backend, CompleteRequest, Denial, FakeClock, LeaseId, LimitDefinition, LimitKey, Limiter, Requirement,
    ReserveOutcome, ReserveRequest,
};

const KEYS: usize = 4;

/// One key of the scenario: kinds alternate, so two of each.
#[derive(Debug, Clone)]
struct KeySpec {
    capacity: u64,
    hold_seconds: u64,
    overage: Overage,
}

#[derive(Debug, Clone)]
enum Op {
    Reserve(Vec<(usize, u64)>),
    Retry(usize),
    /// The caller crashed: the lease is never completed, its holds must end
    /// by their window or timeout.
    Abandon(usize),
    Complete {
        lease: usize,
        actuals: Vec<Option<u64>>,
    },
    Define {
        key: usize,
        capacity: u64,
    },
    ApplyDecreases,
    Advance(u64),
}

fn key_spec() -> impl Strategy<Value = KeySpec> {
    (1..=12u64, 1..=3u64, any::<bool>()).prop_map(|(capacity, hold_seconds, debt)| KeySpec {
        capacity,
        hold_seconds,
        overage: if debt { Overage::Debt } else { Overage::None },
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop::collection::vec((0..KEYS, 1..=14u64), 1..=KEYS).prop_map(Op::Reserve),
        1 => any::<prop::sample::Index>().prop_map(|i| Op::Retry(i.index(usize::MAX))),
        1 => any::<prop::sample::Index>().prop_map(|i| Op::Abandon(i.index(usize::MAX))),
        4 => (any::<prop::sample::Index>(), prop::collection::vec(prop::option::of(0..=20u64), KEYS))
            .prop_map(|(i, actuals)| Op::Complete { lease: i.index(usize::MAX), actuals }),
        1 => (0..KEYS, 1..=14u64).prop_map(|(key, capacity)| Op::Define { key, capacity }),
        1 => Just(Op::ApplyDecreases),
        3 => prop_oneof![0..=400u64, 900..=3100u64].prop_map(Op::Advance),
    ]
}

/// A hold the model granted.
#[derive(Debug, Clone)]
struct Grant {
    key: usize,
    units: u64,
    expires_at_unix_ms: u64,
}

#[derive(Debug)]
struct ModelLease {
    id: LeaseId,
    requirements: Vec<(usize, u64)>,
    /// `Some(reserved_at)` when allowed; `None` when burnt by a denial.
    reserved_at_unix_ms: Option<u64>,
    grants: Vec<Grant>,
    completed: bool,
    /// Never completed from now on.
    abandoned: bool,
    /// When the backend started remembering the id after it stopped being live
    /// (denied or completed): it forgets it `retention_ms` later.
    settled_at_unix_ms: Option<u64>,
}

#[derive(Debug)]
struct ModelKey {
    key: LimitKey,
    state: LimitState,
    debt: u64,
}

/// The reference: what a correct backend must have granted.
struct Model {
    keys: Vec<ModelKey>,
    leases: Vec<ModelLease>,
    /// How long the backend remembers settled and denied ids: the longest hold
    /// plus its margin.
    retention_ms: u64,
}

impl Model {
    fn kind(&self, key: usize) -> LimitKind {
        self.keys[key].state.definition().kind()
    }

    fn capacity(&self, key: usize) -> u64 {
        self.keys[key].state.definition().capacity()
    }

    /// Units of `key` granted and live at `now`.
    fn usage(&self, key: usize, now: u64) -> u64 {
        let concurrency = self.kind(key) == LimitKind::Concurrency;
        self.leases
            .iter()
            .filter(|l| !(concurrency && l.completed))
            .flat_map(|l| &l.grants)
            .filter(|g| g.key == key && g.expires_at_unix_ms > now)
            .map(|g| g.units)
            .sum()
    }

    fn expected_reserve(&self, requirements: &[(usize, u64)], now: u64) -> ReserveOutcome {
        let key = |k: usize| self.keys[k].key.clone();
        if let Some(&(k, _)) = requirements.iter().find(|&&(k, a)| a > self.capacity(k)) {
            return ReserveOutcome::Denied(Denial::ExceedsCapacity { key: key(k) });
        }
        if let Some(&(k, _)) = requirements
            .iter()
            .find(|&&(k, _)| self.keys[k].state.status() == LimitStatus::Decreasing)
        {
            let retry_after_ms = MemoryConfig::default().decrease_retry_ms;
            return ReserveOutcome::Denied(Denial::LimitDecreasing {
                key: key(k),
                retry_after_ms,
            });
        }
        if let Some(&(k, _)) = requirements
            .iter()
            .find(|&&(k, a)| self.usage(k, now) + a > self.capacity(k))
        {
            // The hint is checked separately (> 0); the model only names the key.
            return ReserveOutcome::Denied(Denial::InsufficientCapacity {
                key: key(k),
                retry_after_ms: 0,
            });
        }
        ReserveOutcome::Allowed {
            reserved_at_unix_ms: now,
        }
    }

    fn grant(&mut self, id: LeaseId, requirements: Vec<(usize, u64)>, now: u64) {
        let grants = requirements
            .iter()
            .map(|&(key, units)| Grant {
                key,
                units,
                expires_at_unix_ms: now
                    + (self.keys[key].state.definition()).hold_with_margin_ms(WINDOW_MARGIN_MS_DEFAULT),
            })
            .collect();
        self.leases.push(ModelLease {
            id,
            requirements,
            reserved_at_unix_ms: Some(now),
            grants,
            completed: false,
            abandoned: false,
            settled_at_unix_ms: None,
        });
    }

    /// Reconciles one rolling grant of lease `l` with `actual`.
    fn reconcile(&mut self, l: usize, g: usize, actual: u64, now: u64) {
        let Grant {
            key,
            units,
            expires_at_unix_ms,
        } = self.leases[l].grants[g].clone();
        let live = expires_at_unix_ms > now;
        if actual <= units {
            if live {
                self.leases[l].grants[g].units = actual;
            }
            return;
        }
        let extra = actual - units;
        if live && self.usage(key, now) + extra <= self.capacity(key) {
            self.leases[l].grants[g].units += extra;
        } else if self.keys[key].state.definition().overage() == Overage::Debt {
            self.keys[key].debt += extra;
        }
    }
}

struct Run {
    runtime: tokio::runtime::Runtime,
    clock: FakeClock,
    backend: Arc<MemoryBackend>,
    model: Model,
}

impl Run {
    fn new(specs: &[KeySpec]) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let clock = FakeClock::new(1_000_000);
        let backend = Arc::new(MemoryBackend::with_jitter(
            Arc::new(clock.clone()),
            MemoryConfig::default(),
            Jitter::seeded(9),
        ));
        let mut keys = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            let key = LimitKey::new(format!("k{i}")).unwrap();
            let definition = if i % 2 == 0 {
                LimitDefinition::rolling(key.clone(), spec.capacity, spec.hold_seconds)
            } else {
                LimitDefinition::concurrency(key.clone(), spec.capacity, spec.hold_seconds)
            };
            let definition = definition.unwrap().with_overage(spec.overage);
            let state = runtime.block_on(backend.apply_definition(&definition)).unwrap();
            keys.push(ModelKey { key, state, debt: 0 });
        }
        // Rolling keys (even indexes) hold for their window plus the default margin.
        let longest_hold_ms = (specs.iter().enumerate())
            .map(|(i, s)| s.hold_seconds * 1000 + if i % 2 == 0 { WINDOW_MARGIN_MS_DEFAULT } else { 0 })
            .max()
            .unwrap();
        let model = Model {
            keys,
            leases: Vec::new(),
            retention_ms: longest_hold_ms + LEASE_MEMORY_MARGIN_MS,
        };
        Self {
            runtime,
            clock,
            backend,
            model,
        }
    }

    fn now(&self) -> u64 {
        use ratelimiter::Clock;
        self.clock.now_unix_ms()
    }

    fn reports(&self) -> Vec<LimitReport> {
        self.runtime.block_on(self.backend.limit_reports()).unwrap()
    }

    fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Reserve(needs) => {
                let mut requirements: Vec<(usize, u64)> = Vec::new();
                for (k, a) in needs {
                    if requirements.iter().all(|&(seen, _)| seen != k) {
                        requirements.push((k, a));
                    }
                }
                self.reserve(LeaseId::generate(), requirements)?;
            }
            Op::Retry(i) if !self.model.leases.is_empty() => {
                let lease = &self.model.leases[i % self.model.leases.len()];
                let remembered = lease
                    .settled_at_unix_ms
                    .is_none_or(|at| at + self.model.retention_ms > self.now());
                if remembered {
                    let (id, requirements) = (lease.id, lease.requirements.clone());
                    self.reserve(id, requirements)?;
                }
            }
            Op::Retry(_) => {}
            Op::Complete { lease, actuals } if !self.model.leases.is_empty() => {
                let l = lease % self.model.leases.len();
                if !self.model.leases[l].abandoned {
                    self.complete(l, &actuals)?;
                }
            }
            Op::Abandon(i) if !self.model.leases.is_empty() => {
                let l = i % self.model.leases.len();
                self.model.leases[l].abandoned = true;
            }
            Op::Abandon(_) => {}
            Op::Complete { .. } => {}
            Op::Define { key, capacity } => self.define(key, capacity)?,
            Op::ApplyDecreases => self.apply_decreases()?,
            Op::Advance(ms) => self.clock.advance_ms(ms),
        }
        self.check_invariants()
    }

    fn reserve(&mut self, id: LeaseId, requirements: Vec<(usize, u64)>) -> Result<(), TestCaseError> {
        let now = self.now();
        let earlier = self.model.leases.iter().find(|l| l.id == id);
        let expected = match earlier {
            Some(ModelLease {
                reserved_at_unix_ms: Some(at),
                ..
            }) => ReserveOutcome::Allowed {
                reserved_at_unix_ms: *at,
            },
            Some(_) => ReserveOutcome::Denied(Denial::LeaseAlreadyFailed),
            None => self.model.expected_reserve(&requirements, now),
        };
        let request = ReserveRequest::new(
            id,
            None,
            requirements
                .iter()
                .map(|&(k, amount)| Requirement {
                    key: self.model.keys[k].key.clone(),
                    amount,
                })
                .collect(),
        )
        .unwrap();
        let before = self.reports();
        let outcome = self.runtime.block_on(self.backend.reserve(&request)).unwrap();
        let outcome_for_compare = match &outcome {
            ReserveOutcome::Denied(Denial::InsufficientCapacity { key, retry_after_ms }) => {
                prop_assert!(*retry_after_ms > 0, "a not-now denial has a hint");
                ReserveOutcome::Denied(Denial::InsufficientCapacity {
                    key: key.clone(),
                    retry_after_ms: 0,
                })
            }
            other => other.clone(),
        };
        prop_assert_eq!(&outcome_for_compare, &expected, "reserve {:?} at {}", requirements, now);
        let fresh = earlier.is_none();
        match outcome {
            ReserveOutcome::Allowed { .. } if fresh => self.model.grant(id, requirements, now),
            ReserveOutcome::Allowed { .. } => prop_assert_eq!(self.reports(), before, "a replay changes nothing"),
            ReserveOutcome::Denied(denial) => {
                prop_assert_eq!(self.reports(), before, "a denial changes nothing");
                if fresh && matches!(denial, Denial::InsufficientCapacity { .. }) {
                    self.model.leases.push(ModelLease {
                        id,
                        requirements,
                        reserved_at_unix_ms: None,
                        grants: Vec::new(),
                        completed: false,
                        abandoned: false,
                        settled_at_unix_ms: Some(now),
                    });
                }
            }
        }
        Ok(())
    }

    fn complete(&mut self, l: usize, factors: &[Option<u64>]) -> Result<(), TestCaseError> {
        let now = self.now();
        let lease = &self.model.leases[l];
        let mut actuals = Vec::new();
        for (g, grant) in lease.grants.iter().enumerate() {
            if self.model.kind(grant.key) == LimitKind::Rolling {
                if let Some(actual) = factors[g % factors.len()] {
                    actuals.push((g, actual));
                }
            }
        }
        let request = CompleteRequest::new(
            lease.id,
            None,
            actuals
                .iter()
                .map(|&(g, actual_amount)| Actual {
                    key: self.model.keys[lease.grants[g].key].key.clone(),
                    actual_amount,
                })
                .collect(),
        )
        .unwrap();
        let settles = lease.reserved_at_unix_ms.is_some() && !lease.completed;
        self.runtime.block_on(self.backend.complete(&request)).unwrap();
        if settles {
            self.model.leases[l].completed = true;
            self.model.leases[l].settled_at_unix_ms = Some(now);
            for (g, actual) in actuals {
                self.model.reconcile(l, g, actual, now);
            }
        }
        Ok(())
    }

    fn define(&mut self, key: usize, capacity: u64) -> Result<(), TestCaseError> {
        let current = &self.model.keys[key].state;
        let definition = current.definition().with_capacity(capacity).unwrap();
        let expected = LimitState::after_definition(Some(current), definition.clone()).unwrap();
        let state = self
            .runtime
            .block_on(self.backend.apply_definition(&definition))
            .unwrap();
        prop_assert_eq!(&state, &expected);
        self.model.keys[key].state = state;
        Ok(())
    }

    fn apply_decreases(&mut self) -> Result<(), TestCaseError> {
        let now = self.now();
        let mut expected = Vec::new();
        for (k, model_key) in self.model.keys.iter().enumerate() {
            let state = &model_key.state;
            if state.status() == LimitStatus::Decreasing {
                let delta = state.definition().capacity() - state.pending_decrease_to();
                if state.definition().capacity() - self.model.usage(k, now).min(state.definition().capacity()) >= delta
                {
                    expected.push(state.with_decrease_applied());
                }
            }
        }
        let applied = self.runtime.block_on(self.backend.apply_pending_decreases()).unwrap();
        prop_assert_eq!(&applied, &expected);
        for state in applied {
            let k = self
                .model
                .keys
                .iter()
                .position(|m| &m.key == state.definition().key())
                .unwrap();
            self.model.keys[k].state = state;
        }
        Ok(())
    }

    fn check_invariants(&self) -> Result<(), TestCaseError> {
        let now = self.now();
        let reports = self.reports();
        for (k, model_key) in self.model.keys.iter().enumerate() {
            let usage = self.model.usage(k, now);
            prop_assert!(
                usage <= self.model.capacity(k),
                "{} over-admitted: {} live units granted, capacity {}",
                model_key.key,
                usage,
                self.model.capacity(k)
            );
            let report = reports
                .iter()
                .find(|r| r.state.definition().key() == &model_key.key)
                .unwrap();
            prop_assert_eq!(&report.state, &model_key.state);
            prop_assert_eq!(report.in_use, usage, "in_use of {}", model_key.key);
            prop_assert_eq!(report.debt, model_key.debt, "debt of {}", model_key.key);
        }
        // Far below `settled_leases_max`: every settled lease is remembered for
        // its whole retention, so every retry above was predictable.
        prop_assert_eq!(self.backend.counters().settled_leases_evicted_total, 0);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_interleaving_over_admits_and_denials_change_nothing(
        specs in prop::collection::vec(key_spec(), KEYS),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let mut run = Run::new(&specs);
        for op in ops {
            run.step(op)?;
        }
    }
}
