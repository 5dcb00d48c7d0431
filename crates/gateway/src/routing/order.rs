//! The order in which a pool's deployments are tried for one call (docs/gateway.md,
//! "Pools"): by `priority` first (a higher number only once every lower one denied),
//! then, among deployments of one priority, by the model's `routing`. The order is
//! only a preference made from what this server knows: the reservation on the
//! shared backend is the check, and a denial moves on to the next deployment.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::config::Routing;

/// The slots of the local load window: one per second of the providers' minute.
pub const WINDOW_SLOTS: usize = 60;

/// What one deployment allows per minute, the denominators of its fill.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capacity {
    /// `rpm`.
    pub requests: Option<u64>,
    /// `tpm`: prompt and output together.
    pub tokens: Option<u64>,
    /// `input_tpm`.
    pub input_tokens: Option<u64>,
    /// `output_tpm`.
    pub output_tokens: Option<u64>,
    /// `concurrency`.
    pub concurrency: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    second: u64,
    requests: u64,
    input: u64,
    output: u64,
}

/// What this server reserved on one deployment over the last minute, by second,
/// and its calls in flight: the local estimate `capacity` routing orders by.
#[derive(Debug)]
pub struct LoadWindow {
    capacity: Capacity,
    slots: Mutex<[Slot; WINDOW_SLOTS]>,
    in_flight: AtomicU64,
}

impl LoadWindow {
    /// An empty window of a deployment with `capacity`.
    pub fn new(capacity: Capacity) -> Self {
        Self {
            capacity,
            slots: Mutex::new([Slot::default(); WINDOW_SLOTS]),
            in_flight: AtomicU64::new(0),
        }
    }

    /// A call reserved at `now_s` (unix seconds) with `input` and `output` tokens.
    pub fn admitted(&self, now_s: u64, input: u64, output: u64) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let mut slots = self.slots.lock().expect("load window lock");
        let slot = &mut slots[(now_s % WINDOW_SLOTS as u64) as usize];
        if slot.second != now_s {
            *slot = Slot {
                second: now_s,
                ..Slot::default()
            };
        }
        slot.requests += 1;
        slot.input = slot.input.saturating_add(input);
        slot.output = slot.output.saturating_add(output);
    }

    /// A call admitted here ended (its lease completed).
    pub fn ended(&self) {
        let _ = self
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// The fullest of the deployment's limits, as a fraction, once a call of
    /// `input` and `output` tokens is added at `now_s`; 0 without limits.
    pub fn fill(&self, now_s: u64, input: u64, output: u64) -> f64 {
        let mut sum = Slot::default();
        {
            let slots = self.slots.lock().expect("load window lock");
            for slot in slots.iter().filter(|s| s.second + (WINDOW_SLOTS as u64) > now_s) {
                sum.requests += slot.requests;
                sum.input = sum.input.saturating_add(slot.input);
                sum.output = sum.output.saturating_add(slot.output);
            }
        }
        let ratio = |used: u64, capacity: Option<u64>| capacity.map_or(0.0, |c| used as f64 / c.max(1) as f64);
        let c = &self.capacity;
        [
            ratio(sum.requests + 1, c.requests),
            ratio(sum.input + sum.output + input + output, c.tokens),
            ratio(sum.input + input, c.input_tokens),
            ratio(sum.output + output, c.output_tokens),
            ratio(self.in_flight.load(Ordering::Relaxed) + 1, c.concurrency),
        ]
        .into_iter()
        .fold(0.0, f64::max)
    }
}

/// One deployment as the order sees it.
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    /// Its index in the pool.
    pub index: usize,
    /// Lower first.
    pub priority: u32,
    /// Its share under `weighted`.
    pub weight: u32,
    /// Its fill after this call (`capacity`).
    pub fill: f64,
}

/// The smooth weighted round robin of one pool (nginx's): each pick adds every
/// candidate's weight to its credit, takes the largest credit, and takes the
/// total off it, so deployments of weights 2 and 1 go A B A, A B A, ...
#[derive(Debug)]
pub struct WeightedTurns {
    credit: Mutex<Vec<i64>>,
}

impl WeightedTurns {
    /// Turns over `deployments` deployments.
    pub fn new(deployments: usize) -> Self {
        Self {
            credit: Mutex::new(vec![0; deployments]),
        }
    }

    /// Orders `group` (one priority's candidates): the pick first, then the rest by credit.
    fn order(&self, group: &mut [Candidate]) {
        let mut credit = self.credit.lock().expect("turns lock");
        let total: i64 = group.iter().map(|c| i64::from(c.weight)).sum();
        for c in group.iter() {
            credit[c.index] += i64::from(c.weight);
        }
        group.sort_by(|a, b| credit[b.index].cmp(&credit[a.index]).then(a.index.cmp(&b.index)));
        if let Some(first) = group.first() {
            credit[first.index] -= total;
        }
    }
}

/// Sorts `candidates` into the order they are tried in: by priority, then by
/// `routing` within each priority.
pub fn order(routing: Routing, turns: &WeightedTurns, candidates: &mut [Candidate]) {
    candidates.sort_by(|a, b| a.priority.cmp(&b.priority).then(a.index.cmp(&b.index)));
    let mut start = 0;
    while start < candidates.len() {
        let priority = candidates[start].priority;
        let end = start
            + candidates[start..]
                .iter()
                .take_while(|c| c.priority == priority)
                .count();
        let group = &mut candidates[start..end];
        match routing {
            Routing::Ordered => {}
            Routing::Capacity => group.sort_by(|a, b| a.fill.total_cmp(&b.fill).then(a.index.cmp(&b.index))),
            Routing::Weighted => turns.order(group),
        }
        start = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(index: usize, priority: u32, weight: u32, fill: f64) -> Candidate {
        Candidate {
            index,
            priority,
            weight,
            fill,
        }
    }

    fn indexes(c: &[Candidate]) -> Vec<usize> {
        c.iter().map(|c| c.index).collect()
    }

    #[test]
    fn priority_first_then_the_mode() {
        let turns = WeightedTurns::new(4);
        let mut c = vec![
            candidate(0, 1, 1, 0.1),
            candidate(1, 0, 1, 0.9),
            candidate(2, 0, 1, 0.2),
            candidate(3, 1, 1, 0.0),
        ];
        order(Routing::Ordered, &turns, &mut c);
        assert_eq!(indexes(&c), [1, 2, 0, 3]);
        order(Routing::Capacity, &turns, &mut c);
        assert_eq!(indexes(&c), [2, 1, 3, 0], "the emptier first, within a priority");
    }

    #[test]
    fn weighted_turns_give_exact_shares() {
        let turns = WeightedTurns::new(3);
        let mut firsts = [0usize; 3];
        for _ in 0..60 {
            let mut c = vec![
                candidate(0, 0, 3, 0.0),
                candidate(1, 0, 2, 0.0),
                candidate(2, 0, 1, 0.0),
            ];
            order(Routing::Weighted, &turns, &mut c);
            firsts[c[0].index] += 1;
            assert_eq!(c.len(), 3, "every deployment stays in the order");
        }
        assert_eq!(firsts, [30, 20, 10]);
    }

    #[test]
    fn the_fill_is_the_fullest_limit_after_the_call() {
        let window = LoadWindow::new(Capacity {
            requests: Some(10),
            tokens: Some(1_000),
            concurrency: Some(10),
            ..Capacity::default()
        });
        assert!((window.fill(100, 50, 50) - 0.1).abs() < 1e-9);
        window.admitted(100, 400, 100);
        assert!((window.fill(100, 50, 50) - 0.6).abs() < 1e-9, "tokens bind");
        window.admitted(101, 0, 0);
        assert!((window.fill(101, 0, 0) - 0.5).abs() < 1e-9);
        window.ended();
        window.ended();
        assert!((window.fill(159, 0, 0) - 0.5).abs() < 1e-9);
        assert!((window.fill(161, 0, 0) - 0.1).abs() < 1e-9, "a minute later it is gone");
        // Calls in flight against a concurrency limit.
        let slots = LoadWindow::new(Capacity {
            concurrency: Some(2),
            ..Capacity::default()
        });
        slots.admitted(100, 0, 0);
        slots.admitted(100, 0, 0);
        assert!(
            (slots.fill(100, 0, 0) - 1.5).abs() < 1e-9,
            "two of two held, plus this one"
        );
        slots.ended();
        assert!((slots.fill(100, 0, 0) - 1.0).abs() < 1e-9);
    }
}
