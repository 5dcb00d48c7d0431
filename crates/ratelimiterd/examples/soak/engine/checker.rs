//! The over-admission checker: from the records alone, a lower bound of what
//! each limit held at every instant, compared with an upper bound of the
//! capacity in force then. Any excess is an over-admission the server really
//! made; no correct server can produce one (the bounds below say why).
//!
//! - A grant's hold surely exists from its answer's arrival (the server made it
//!   no later) until `reserved_at + hold_ms` (the server's own end). Counting
//!   holds only from the answer makes concurrent grants count against each
//!   other, which is where races would show.
//! - A complete is assumed carried out when it was sent (the earliest it could
//!   be), so shrinks and releases lower the bound as early as possible; overage
//!   an actual may add is not counted.
//! - Capacity: a PUT may take effect from when it was sent; after its answer,
//!   the capacity in force is the answered one. A decrease (answered
//!   `decreasing`) takes the target as bound from the first evidence that it
//!   was carried out: a grant on the key with `reserved_at` after the PUT's
//!   answer (no grant is made while decreasing), or a sample showing it active.
//!   A PUT without an answer may or may not have been applied: the larger of
//!   the two capacities holds until the next answered change.

use std::collections::HashMap;

use ratelimiter::{LeaseId, LimitKind};

use super::record::{CapacityChange, Completion, Grant, LimitSpec, Records};

/// The most violations, and of other anomalies, kept with their details
/// (violations are all counted).
pub const VIOLATIONS_KEPT_MAX: usize = 50;

/// A moment when a limit surely held more than its capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The limit's key.
    pub key: String,
    /// When (ms since the epoch).
    pub at_ms: u64,
    /// Units surely held then.
    pub held: u128,
    /// The most the capacity in force could be then.
    pub capacity: u64,
}

/// What the check found for one limit.
#[derive(Debug, Clone, Default)]
pub struct LimitSummary {
    /// The key.
    pub key: String,
    /// Grants that held units on it.
    pub grants: u64,
    /// The highest share of the capacity bound surely held at a grant (0..=1
    /// when correct): how hard the run pushed this limit.
    pub peak_utilisation: f64,
    /// Units surely held at that peak.
    pub peak_held: u128,
    /// The capacity bound at that peak.
    pub peak_capacity: u64,
    /// Decreases answered `decreasing`.
    pub decreases: u64,
    /// Of those, the ones seen carried out.
    pub decreases_carried_out: u64,
}

/// The result of a check.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// Over-admissions, the first [`VIOLATIONS_KEPT_MAX`].
    pub violations: Vec<Violation>,
    /// How many over-admissions.
    pub violations_total: u64,
    /// Other broken rules found in the records (a lease granted twice, a
    /// sample over capacity), the first [`VIOLATIONS_KEPT_MAX`].
    pub anomalies: Vec<String>,
    /// Per limit.
    pub limits: Vec<LimitSummary>,
}

impl Verdict {
    /// True when nothing broke a rule.
    pub fn holds(&self) -> bool {
        self.violations_total == 0 && self.anomalies.is_empty()
    }
}

/// Checks every limit of `records`.
pub fn check(limits: &[LimitSpec], records: &Records) -> Verdict {
    let mut verdict = Verdict::default();
    let completions = first_completions(&records.completions);
    check_grants_unique(&records.grants, &mut verdict);
    for (index, spec) in limits.iter().enumerate() {
        let bounds = capacity_bounds(index, records);
        check_samples(index, spec, records, &bounds.points, &mut verdict);
        let events = hold_events(index, spec, &records.grants, &completions);
        let mut summary = sweep(spec, &events, &bounds.points, &mut verdict);
        summary.decreases = bounds.decreases;
        summary.decreases_carried_out = bounds.carried_out;
        verdict.limits.push(summary);
    }
    verdict
}

/// The first complete sent for each lease: the one the server carries out.
fn first_completions(completions: &[Completion]) -> HashMap<LeaseId, &Completion> {
    let mut first: HashMap<LeaseId, &Completion> = HashMap::with_capacity(completions.len());
    for completion in completions {
        first
            .entry(completion.lease)
            .and_modify(|c| {
                if completion.sent_ms < c.sent_ms {
                    *c = completion;
                }
            })
            .or_insert(completion);
    }
    first
}

fn check_grants_unique(grants: &[Grant], verdict: &mut Verdict) {
    let mut seen: HashMap<LeaseId, u64> = HashMap::with_capacity(grants.len());
    for grant in grants {
        let Some(first) = seen.insert(grant.lease, grant.reserved_at_ms) else {
            continue;
        };
        if verdict.anomalies.len() < VIOLATIONS_KEPT_MAX {
            verdict.anomalies.push(format!(
                "lease {} granted twice, reserved at {first} and at {}",
                grant.lease, grant.reserved_at_ms
            ));
        }
    }
}

/// A change in units surely held, at an instant; `check` marks a grant's arrival.
#[derive(Debug, Clone, Copy)]
struct Event {
    at_ms: u64,
    delta: i128,
    check: bool,
}

/// The lower bound of one limit's holds as events.
fn hold_events(
    index: usize,
    spec: &LimitSpec,
    grants: &[Grant],
    completions: &HashMap<LeaseId, &Completion>,
) -> Vec<Event> {
    let mut events = Vec::new();
    for grant in grants {
        let Some(&(_, amount)) = grant.requirements.iter().find(|(l, _)| *l == index) else {
            continue;
        };
        let start = grant.answered_ms.max(grant.reserved_at_ms);
        let end = grant.reserved_at_ms.saturating_add(spec.hold_ms);
        if start >= end {
            continue;
        }
        // From `cut` on the hold is `after` units (a release or a shrink).
        let (cut, after) = match completions.get(&grant.lease) {
            None => (end, amount),
            Some(c) => match spec.kind {
                LimitKind::Concurrency => (c.sent_ms.max(start), 0),
                LimitKind::Bucket => unreachable!("the soak's workload defines no buckets"),
                LimitKind::Rolling => match c.actuals.iter().find(|(l, _)| *l == index) {
                    Some(&(_, actual)) => (c.sent_ms.max(start), actual.min(amount)),
                    None => (end, amount),
                },
            },
        };
        let (amount, after) = (i128::from(amount), i128::from(after));
        events.push(Event {
            at_ms: start,
            delta: amount,
            check: true,
        });
        let left = if cut < end {
            events.push(Event {
                at_ms: cut,
                delta: after - amount,
                check: false,
            });
            after
        } else {
            amount
        };
        events.push(Event {
            at_ms: end,
            delta: -left,
            check: false,
        });
    }
    events.sort_unstable_by_key(|e| e.at_ms);
    events
}

/// Applies the events in time order and checks the total at every grant.
fn sweep(spec: &LimitSpec, events: &[Event], bounds: &[(u64, u64)], verdict: &mut Verdict) -> LimitSummary {
    let mut summary = LimitSummary {
        key: spec.key.clone(),
        ..LimitSummary::default()
    };
    let mut held: i128 = 0;
    let mut i = 0;
    while i < events.len() {
        let at_ms = events[i].at_ms;
        let mut checks = 0u64;
        while i < events.len() && events[i].at_ms == at_ms {
            held += events[i].delta;
            checks += u64::from(events[i].check);
            i += 1;
        }
        assert!(held >= 0, "the lower bound of holds went negative: a checker bug");
        if checks == 0 {
            continue;
        }
        summary.grants += checks;
        let capacity = bound_at(bounds, at_ms);
        let utilisation = held as f64 / capacity.max(1) as f64;
        if utilisation > summary.peak_utilisation {
            summary.peak_utilisation = utilisation;
            summary.peak_held = held as u128;
            summary.peak_capacity = capacity;
        }
        if held > i128::from(capacity) {
            verdict.violations_total += 1;
            if verdict.violations.len() < VIOLATIONS_KEPT_MAX {
                verdict.violations.push(Violation {
                    key: spec.key.clone(),
                    at_ms,
                    held: held as u128,
                    capacity,
                });
            }
        }
    }
    summary
}

/// Flags the samples of limit `index` that report more units in use than
/// any capacity that could be in force while they were read. A sample's state
/// and its balances are not read at one instant on every backend (on
/// TigerBeetle the states, then the accounts), so a change answered between
/// the two may show a capacity that was not the one the units were held
/// under: the bound over the whole request is what a correct server keeps.
fn check_samples(index: usize, spec: &LimitSpec, records: &Records, points: &[(u64, u64)], verdict: &mut Verdict) {
    for observation in records.observations.iter().filter(|o| o.limit == index) {
        let bound = bound_between(points, observation.sent_ms, observation.answered_ms);
        if observation.in_use > bound && verdict.anomalies.len() < VIOLATIONS_KEPT_MAX {
            verdict.anomalies.push(format!(
                "{} reported in_use {} over capacity {} (at most {bound} in force from {} to {})",
                spec.key, observation.in_use, observation.capacity, observation.sent_ms, observation.answered_ms
            ));
        }
    }
}

/// The largest capacity bound in force at any instant of `[from_ms, to_ms]`.
fn bound_between(points: &[(u64, u64)], from_ms: u64, to_ms: u64) -> u64 {
    let inside = points
        .iter()
        .filter(|&&(at, _)| at > from_ms && at <= to_ms)
        .map(|&(_, most)| most);
    inside.fold(bound_at(points, from_ms), u64::max)
}

/// The capacity bound at `at_ms`: the value of the last point at or before it.
fn bound_at(points: &[(u64, u64)], at_ms: u64) -> u64 {
    let after = points.partition_point(|&(from, _)| from <= at_ms);
    if after == 0 {
        0
    } else {
        points[after - 1].1
    }
}

/// A limit's capacity bound over time, as (from ms, most units) points.
struct Bounds {
    points: Vec<(u64, u64)>,
    decreases: u64,
    carried_out: u64,
}

fn capacity_bounds(index: usize, records: &Records) -> Bounds {
    let mut changes: Vec<&CapacityChange> = records.changes.iter().filter(|c| c.limit == index).collect();
    changes.sort_unstable_by_key(|c| c.sent_ms);
    let mut bounds = Bounds {
        points: Vec::new(),
        decreases: 0,
        carried_out: 0,
    };
    let mut current = 0;
    for (n, change) in changes.iter().enumerate() {
        let next_sent = changes.get(n + 1).map_or(u64::MAX, |c| c.sent_ms);
        assert!(
            change.answered_ms < next_sent,
            "capacity changes of one key are sequential"
        );
        if change.unknown {
            // Maybe applied, maybe not: the larger of both from when it was sent
            // until the next answered change says what holds.
            current = current.max(change.capacity);
            bounds.points.push((change.sent_ms, current));
            continue;
        }
        // Sent but not answered: the old bound or the new capacity, whichever is larger.
        bounds.points.push((change.sent_ms, current.max(change.capacity)));
        // Strictly after the answer's millisecond, the answered capacity holds.
        bounds.points.push((change.answered_ms + 1, change.capacity));
        current = change.capacity;
        if change.pending_decrease_to == 0 {
            continue;
        }
        bounds.decreases += 1;
        if let Some(from) = carried_out_by(index, change, next_sent, records) {
            bounds.carried_out += 1;
            bounds
                .points
                .push((from.max(change.answered_ms + 1), change.pending_decrease_to));
            current = change.pending_decrease_to;
        }
    }
    bounds
}

/// The earliest instant a decrease is known carried out, before the next change.
fn carried_out_by(index: usize, change: &CapacityChange, next_sent: u64, records: &Records) -> Option<u64> {
    let by_grant = records
        .grants
        .iter()
        .filter(|g| g.reserved_at_ms > change.answered_ms && g.answered_ms < next_sent)
        .filter(|g| g.requirements.iter().any(|(l, _)| *l == index))
        .map(|g| g.answered_ms)
        .min();
    let by_sample = records
        .observations
        .iter()
        .filter(|o| o.limit == index && o.active && o.capacity == change.pending_decrease_to)
        .filter(|o| o.sent_ms > change.answered_ms && o.answered_ms < next_sent)
        .map(|o| o.answered_ms)
        .min();
    by_grant.into_iter().chain(by_sample).min()
}
