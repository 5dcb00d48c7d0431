//! The run's figures: how many requests were served, how many 429s the provider
//! sent, how much of its capacity was used while demand exceeded it, and how long
//! requests waited.
//!
//! Utilization is measured over windows of the provider's own length, stepped by a
//! tenth of a window. A window counts as saturated when requests were waiting
//! throughout it: at every instant some request had arrived and was not yet sent
//! (queued, or sleeping before a retry), so demand exceeded what was admitted.
//! Each token limit the provider keeps (Anthropic: input and output) is measured
//! on what the provider finally charged on it (Bedrock's 5x output burndown,
//! Anthropic's output estimate adjusted to the output), and the limit the run
//! used most of is the binding one, whose figure is the run's utilization. A
//! sliding log never admits more than its limit in any window of its length, so
//! its utilization is at most 1; a token bucket's full start, or a settlement
//! above what was held, can take one window past it.

use serde::{Deserialize, Serialize};

use crate::outcome::RequestOutcome;
use crate::sim::limits::ProviderLimits;
use crate::sim::profile::Dimension;
use crate::sim::provider::{Admission, TokenLimit, TOKEN_LIMITS_MAX};

/// Windows are stepped by this fraction of their length.
pub const WINDOW_STEPS: u64 = 10;

/// What `--summary-json` writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Requests replayed.
    pub requests: u64,
    /// Served by the provider.
    pub completed: u64,
    /// Given up (refused for good, or throttled past the retry bound).
    pub failed: u64,
    /// 429 answers the provider sent.
    pub provider_429: u64,
    /// Of those, for its request, token and concurrency limits.
    pub provider_429_by_limit: [u64; 3],
    /// The binding token limit's utilization: tokens the provider finally charged
    /// on it in saturated windows over what it allowed in them; over the whole run
    /// when no window was saturated.
    pub utilization: f64,
    /// The token limit the run used most of (`None` in summaries made before it was
    /// reported, which measured `tpm` alone).
    #[serde(default)]
    pub binding_limit: Option<Dimension>,
    /// Every token limit of the provider, measured as `utilization` is.
    #[serde(default)]
    pub token_limits: Vec<LimitUtilization>,
    /// The first token limit (the one `tpm` sets) measured on what the provider
    /// charged at admission instead: above `utilization` where the provider
    /// settles a call below what it held (Bedrock holds input plus `max_tokens`).
    #[serde(default)]
    pub utilization_at_admission: f64,
    /// Requests admitted in saturated windows over what the request limit allowed.
    pub utilization_requests: f64,
    /// Saturated windows measured (positions stepped by a tenth of a window).
    pub saturated_windows: u64,
    /// Median wait from arrival to the attempt that ended the request, ms.
    pub queue_delay_ms_p50: u64,
    /// 99th percentile of that wait, ms.
    pub queue_delay_ms_p99: u64,
    /// From the first arrival to the last request's end, seconds.
    pub duration_s: f64,
    /// Tokens the provider charged in all.
    pub charged_tokens: u64,
    /// Tokens the provider served (prompt plus output) in all.
    pub served_tokens: u64,
    /// Our strategies: from each served request's grant to the provider's
    /// admission, ms, which the window margin must cover (BENCHMARKS.md,
    /// "Window margin"); all 0 when not measured.
    #[serde(default)]
    pub grant_to_admission: GrantToAdmission,
}

/// One token limit as the run used it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LimitUtilization {
    /// Which limit.
    pub limit: Dimension,
    /// Its capacity per window.
    pub capacity: u64,
    /// Tokens the provider finally charged on it in saturated windows over what
    /// it allowed in them; over the whole run when no window was saturated.
    pub utilization: f64,
}

/// The distribution of grant-to-admission times, ms, over the served requests
/// whose grant is known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantToAdmission {
    /// Requests measured.
    pub measured: u64,
    /// Median, ms.
    pub p50_ms: u64,
    /// 99th percentile, ms.
    pub p99_ms: u64,
    /// 99.9th percentile, ms.
    pub p999_ms: u64,
    /// Largest, ms.
    pub max_ms: u64,
}

impl GrantToAdmission {
    /// The distribution over `outcomes` (those without both instants are skipped).
    pub fn of(outcomes: &[RequestOutcome]) -> Self {
        let mut times: Vec<u64> = outcomes
            .iter()
            .filter_map(RequestOutcome::grant_to_admission_ms)
            .collect();
        Self {
            measured: times.len() as u64,
            p50_ms: percentile(&mut times, 50.0),
            p99_ms: percentile(&mut times, 99.0),
            p999_ms: percentile(&mut times, 99.9),
            max_ms: times.iter().copied().max().unwrap_or(0),
        }
    }
}

/// What a summary is computed from.
#[derive(Debug, Clone, Copy)]
pub struct RunRecord<'a> {
    /// Every request's outcome.
    pub outcomes: &'a [RequestOutcome],
    /// The provider's admissions, in time order.
    pub admissions: &'a [Admission],
    /// The provider's token limits, in the order of each admission's `settled_tokens`.
    pub token_limits: &'a [TokenLimit],
    /// The provider's limits.
    pub limits: ProviderLimits,
    /// The provider's 429 count.
    pub provider_429: u64,
    /// Of those, for its request, token and concurrency limits.
    pub provider_429_by_limit: [u64; 3],
    /// When the first request arrived, Unix ms.
    pub start_unix_ms: u64,
}

/// The nearest-rank percentile `p` (0 < p <= 100) of `values`; 0 when empty.
pub fn percentile(values: &mut [u64], p: f64) -> u64 {
    assert!(p > 0.0 && p <= 100.0, "a percentile is in (0, 100]");
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

/// Computes the summary of a run.
pub fn summarize(run: &RunRecord<'_>) -> Summary {
    let completed = run.outcomes.iter().filter(|o| o.completed).count() as u64;
    let mut delays: Vec<u64> = run
        .outcomes
        .iter()
        .filter(|o| o.completed)
        .map(|o| o.queue_delay_ms())
        .collect();
    let end_unix_ms = run
        .outcomes
        .iter()
        .map(|o| o.done_unix_ms)
        .max()
        .unwrap_or(run.start_unix_ms);
    let measured = utilization(run);
    // The binding limit: the one used most (the first of equals).
    let binding = (measured.limits.iter()).reduce(|best, l| if l.utilization > best.utilization { l } else { best });
    Summary {
        requests: run.outcomes.len() as u64,
        completed,
        failed: run.outcomes.len() as u64 - completed,
        provider_429: run.provider_429,
        provider_429_by_limit: run.provider_429_by_limit,
        utilization: binding.map_or(0.0, |l| l.utilization),
        binding_limit: binding.map(|l| l.limit),
        token_limits: measured.limits.clone(),
        utilization_at_admission: measured.at_admission,
        utilization_requests: measured.requests,
        saturated_windows: measured.windows,
        queue_delay_ms_p50: percentile(&mut delays, 50.0),
        queue_delay_ms_p99: percentile(&mut delays, 99.0),
        duration_s: end_unix_ms.saturating_sub(run.start_unix_ms) as f64 / 1000.0,
        charged_tokens: run.admissions.iter().map(|a| a.charged_tokens).sum(),
        served_tokens: run.outcomes.iter().map(|o| o.served_tokens).sum(),
        grant_to_admission: GrantToAdmission::of(run.outcomes),
    }
}

/// What [`utilization`] measured.
struct Measured {
    /// Every token limit, on the provider's final charges.
    limits: Vec<LimitUtilization>,
    /// The first token limit on admission charges.
    at_admission: f64,
    /// Requests over what the request limit allowed.
    requests: f64,
    /// Saturated windows measured.
    windows: u64,
}

/// Token and request utilization over saturated windows, and their count. When
/// no window is saturated (demand never exceeded capacity) the figures are
/// those of the whole run, from the first arrival to one window past the last
/// admission (any span holds at most its length plus one window of admissions).
fn utilization(run: &RunRecord<'_>) -> Measured {
    let window_ms = run.limits.window_ms;
    let step_ms = (window_ms / WINDOW_STEPS).max(1);
    let admitted = Prefix::new(run.admissions);
    let backlog = Backlog::new(run.outcomes);
    let last_unix_ms = run.admissions.last().map_or(run.start_unix_ms, |a| a.at_unix_ms);
    let (mut sums, mut windows) = (Sums::default(), 0u64);
    let mut begin = run.start_unix_ms;
    while begin + window_ms <= last_unix_ms + 1 {
        let end = begin + window_ms;
        if backlog.covers(begin, end) {
            sums = sums.plus(&admitted.between(begin, end));
            windows += 1;
        }
        begin += step_ms;
    }
    let allowed = if windows > 0 {
        windows as f64
    } else {
        sums = admitted.between(run.start_unix_ms, last_unix_ms + 1);
        (last_unix_ms.saturating_sub(run.start_unix_ms) + window_ms) as f64 / window_ms as f64
    };
    let share = |used: u64, capacity: u64| used as f64 / (allowed * capacity as f64);
    Measured {
        limits: (run.token_limits.iter().zip(sums.settled))
            .map(|(limit, used)| LimitUtilization {
                limit: limit.dimension,
                capacity: limit.capacity,
                utilization: share(used, limit.capacity),
            })
            .collect(),
        at_admission: share(sums.at_admission, run.limits.tpm),
        requests: share(sums.requests, run.limits.rpm),
        windows,
    }
}

/// Admissions counted over a span, and their tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Sums {
    /// Admissions.
    requests: u64,
    /// Their admission charges on the first token limit.
    at_admission: u64,
    /// Their final charges on each token limit.
    settled: [u64; TOKEN_LIMITS_MAX],
}

impl Sums {
    fn of(admission: &Admission) -> Self {
        Self {
            requests: 1,
            at_admission: admission.charged_tokens,
            settled: admission.settled_tokens,
        }
    }

    fn plus(&self, other: &Self) -> Self {
        self.combine(other, |a, b| a + b)
    }

    fn minus(&self, other: &Self) -> Self {
        self.combine(other, |a, b| a - b)
    }

    fn combine(&self, other: &Self, op: impl Fn(u64, u64) -> u64) -> Self {
        Self {
            requests: op(self.requests, other.requests),
            at_admission: op(self.at_admission, other.at_admission),
            settled: std::array::from_fn(|i| op(self.settled[i], other.settled[i])),
        }
    }
}

/// Admissions with prefix sums, to count those in a time range by binary search.
struct Prefix {
    times: Vec<u64>,
    sums: Vec<Sums>,
}

impl Prefix {
    fn new(admissions: &[Admission]) -> Self {
        let mut times = Vec::with_capacity(admissions.len());
        let mut sums = Vec::with_capacity(admissions.len() + 1);
        sums.push(Sums::default());
        for admission in admissions {
            assert!(
                times.last().is_none_or(|&t| t <= admission.at_unix_ms),
                "admissions are in time order"
            );
            times.push(admission.at_unix_ms);
            sums.push(sums.last().expect("starts with 0").plus(&Sums::of(admission)));
        }
        Self { times, sums }
    }

    /// Admissions and their tokens in `[begin, end)`.
    fn between(&self, begin: u64, end: u64) -> Sums {
        let from = self.times.partition_point(|&t| t < begin);
        let to = self.times.partition_point(|&t| t < end);
        self.sums[to].minus(&self.sums[from])
    }
}

/// The times some request was waiting: the union of every request's
/// `[arrival, wait end)`, as disjoint intervals in time order.
struct Backlog {
    intervals: Vec<(u64, u64)>,
}

impl Backlog {
    fn new(outcomes: &[RequestOutcome]) -> Self {
        let mut waits: Vec<(u64, u64)> = outcomes
            .iter()
            .map(|o| (o.arrival_unix_ms, o.wait_end_unix_ms()))
            .filter(|(arrival, end)| end > arrival)
            .collect();
        waits.sort_unstable();
        let mut intervals: Vec<(u64, u64)> = Vec::with_capacity(waits.len());
        for (begin, end) in waits {
            match intervals.last_mut() {
                Some(last) if begin <= last.1 => last.1 = last.1.max(end),
                _ => intervals.push((begin, end)),
            }
        }
        Self { intervals }
    }

    /// True when some request was waiting at every instant of `[begin, end)`.
    fn covers(&self, begin: u64, end: u64) -> bool {
        let after = self.intervals.partition_point(|&(start, _)| start <= begin);
        after > 0 && self.intervals[after - 1].1 >= end
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::limits::Accounting;

    fn limits() -> ProviderLimits {
        ProviderLimits {
            rpm: 10,
            tpm: 1_000,
            window_ms: 1_000,
            concurrency: 4,
            ms_per_output_token: 0,
            accounting: Accounting::Actual,
        }
    }

    const TOKENS: [TokenLimit; 1] = [TokenLimit {
        dimension: Dimension::Tokens,
        capacity: 1_000,
    }];

    /// A run of `outcomes` and `admissions` under [`limits`] and no 429.
    fn record<'a>(
        outcomes: &'a [RequestOutcome],
        admissions: &'a [Admission],
        token_limits: &'a [TokenLimit],
        start_unix_ms: u64,
    ) -> RunRecord<'a> {
        RunRecord {
            outcomes,
            admissions,
            token_limits,
            limits: limits(),
            provider_429: 0,
            provider_429_by_limit: [0; 3],
            start_unix_ms,
        }
    }

    /// An admission charged `tokens` on `tpm`, settled at that.
    fn admission(at_unix_ms: u64, tokens: u64) -> Admission {
        Admission {
            at_unix_ms,
            charged_tokens: tokens,
            settled_tokens: [tokens, 0],
        }
    }

    fn outcome(index: usize, arrival: u64, sent: u64, done: u64, tokens: u64) -> RequestOutcome {
        RequestOutcome {
            index,
            arrival_unix_ms: arrival,
            sent_unix_ms: sent,
            done_unix_ms: done,
            attempts: 1,
            throttled: 0,
            completed: sent > 0,
            error: None,
            offered_tokens: tokens,
            served_tokens: if sent > 0 { tokens } else { 0 },
            granted_unix_ms: 0,
            admitted_unix_ms: 0,
        }
    }

    #[test]
    fn grant_to_admission_skips_unknown_instants() {
        use crate::outcome::ReplayRequest;
        use crate::trace::TraceRecord;
        let request = ReplayRequest {
            index: 0,
            record: TraceRecord {
                offset_ms: 0,
                input_tokens: 1,
                output_tokens: 1,
            },
            arrival_unix_ms: 1_000,
            max_tokens: 1,
        };
        let timed = |granted, admitted| RequestOutcome {
            granted_unix_ms: granted,
            admitted_unix_ms: admitted,
            ..RequestOutcome::new(&request, Accounting::Actual)
        };
        let outcomes = [
            timed(1_000, 1_003),
            timed(1_000, 1_000),
            timed(0, 1_500),
            timed(2_000, 0),
        ];
        let got = GrantToAdmission::of(&outcomes);
        assert_eq!((got.measured, got.p50_ms, got.max_ms), (2, 0, 3));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut values: Vec<u64> = (1..=100).rev().collect();
        assert_eq!(percentile(&mut values, 50.0), 50);
        assert_eq!(percentile(&mut values, 99.0), 99);
        assert_eq!(percentile(&mut values, 100.0), 100);
        assert_eq!(percentile(&mut [7], 1.0), 7);
        assert_eq!(percentile(&mut [], 50.0), 0);
        assert_eq!(percentile(&mut [1, 2, 3], 50.0), 2);
    }

    #[test]
    fn saturated_windows_measure_admitted_over_allowed() {
        // Ten requests of 250 tokens arrive at 0; the provider takes 1,000 tokens a
        // second: four admitted at once, four a second later, two after two seconds.
        let times = [0, 0, 0, 0, 1_000, 1_000, 1_000, 1_000, 2_000, 2_000].map(|t| t + 10_000);
        let outcomes: Vec<_> = times
            .iter()
            .enumerate()
            .map(|(i, &t)| outcome(i, 10_000, t, t + 5, 250))
            .collect();
        let admissions: Vec<_> = times.iter().map(|&t| admission(t, 250)).collect();
        let run = RunRecord {
            provider_429: 3,
            provider_429_by_limit: [3, 0, 0],
            ..record(&outcomes, &admissions, &TOKENS, 10_000)
        };
        let summary = summarize(&run);
        // Windows [0, 1000) and [100, 1100) ... [1000, 2000) wait on requests sent at
        // 1,000 and 2,000: eleven positions, each holding exactly four admissions.
        assert_eq!(summary.saturated_windows, 11);
        assert!((summary.utilization - 1.0).abs() < 1e-9, "{}", summary.utilization);
        assert!((summary.utilization_requests - 0.4).abs() < 1e-9);
        assert_eq!(summary.requests, 10);
        assert_eq!(summary.completed, 10);
        assert_eq!(summary.failed, 0);
        assert_eq!(summary.provider_429, 3);
        assert_eq!(summary.queue_delay_ms_p50, 1_000);
        assert_eq!(summary.queue_delay_ms_p99, 2_000);
        assert_eq!(summary.duration_s, 2.005);
        assert_eq!(summary.charged_tokens, 2_500);
        assert_eq!(summary.served_tokens, 2_500);
    }

    #[test]
    fn a_half_used_saturated_window_is_half_utilized() {
        // One request waits from 0 to 2,000 while only 500 tokens a window are admitted.
        // (The other, never sent, waited 5 ms.)
        let outcomes = vec![outcome(0, 0, 2_000, 2_010, 100), outcome(1, 0, 0, 5, 500)];
        let admissions = vec![admission(0, 500), admission(1_000, 500), admission(2_000, 100)];
        let run = record(&outcomes, &admissions, &TOKENS, 0);
        let summary = summarize(&run);
        assert_eq!(summary.saturated_windows, 11);
        assert!((summary.utilization - 0.5).abs() < 1e-9, "{}", summary.utilization);
        assert_eq!((summary.completed, summary.failed), (1, 1));
    }

    #[test]
    fn every_token_limit_is_measured_on_its_settled_charge_and_the_most_used_binds() {
        // One request waits from 0 to 2,000: eleven saturated windows of 1 s, each
        // holding one admission. Each holds 500 input tokens at admission, settled to
        // 400 (as Bedrock settles), and 180 output tokens of an output limit of 200.
        let outcomes = vec![outcome(0, 0, 2_000, 2_010, 100), outcome(1, 0, 0, 5, 500)];
        let admissions: Vec<Admission> = [0, 1_000, 2_000]
            .map(|at| Admission {
                at_unix_ms: at,
                charged_tokens: 500,
                settled_tokens: [400, 180],
            })
            .to_vec();
        let token_limits = [
            TokenLimit {
                dimension: Dimension::InputTokens,
                capacity: 1_000,
            },
            TokenLimit {
                dimension: Dimension::OutputTokens,
                capacity: 200,
            },
        ];
        let run = record(&outcomes, &admissions, &token_limits, 0);
        let summary = summarize(&run);
        assert_eq!(summary.saturated_windows, 11);
        let measured: Vec<(Dimension, u64, f64)> = (summary.token_limits.iter())
            .map(|l| (l.limit, l.capacity, (l.utilization * 1e6).round() / 1e6))
            .collect();
        assert_eq!(
            measured,
            [
                (Dimension::InputTokens, 1_000, 0.4),
                (Dimension::OutputTokens, 200, 0.9)
            ]
        );
        assert_eq!(summary.binding_limit, Some(Dimension::OutputTokens));
        assert!((summary.utilization - 0.9).abs() < 1e-9, "{}", summary.utilization);
        assert!((summary.utilization_at_admission - 0.5).abs() < 1e-9);
    }

    #[test]
    fn a_window_is_saturated_only_if_requests_wait_throughout() {
        // Three requests each wait 600 ms, overlapping: waiting from 0 to 1,700
        // without a gap; a fourth waits from 2,000 to 2,900 after a gap.
        let outcomes = vec![
            outcome(0, 10_000, 10_600, 10_700, 100),
            outcome(1, 10_500, 11_100, 11_200, 100),
            outcome(2, 11_100, 11_700, 11_800, 100),
            outcome(3, 12_000, 12_900, 13_000, 100),
        ];
        let admissions: Vec<_> = outcomes.iter().map(|o| admission(o.sent_unix_ms, 100)).collect();
        let backlog = Backlog::new(&outcomes);
        assert_eq!(backlog.intervals, vec![(10_000, 11_700), (12_000, 12_900)]);
        assert!(backlog.covers(10_000, 11_000));
        assert!(backlog.covers(10_700, 11_700));
        assert!(!backlog.covers(10_800, 11_800));
        assert!(!backlog.covers(11_900, 12_100));
        let run = record(&outcomes, &admissions, &TOKENS, 10_000);
        // Positions 10,000 .. 10,700 (eight) lie inside the first waiting stretch.
        assert_eq!(summarize(&run).saturated_windows, 8);
    }

    #[test]
    fn without_saturation_the_whole_run_is_measured() {
        let outcomes = vec![outcome(0, 0, 0, 0, 0), outcome(1, 1_000, 1_000, 1_010, 300)];
        let outcomes: Vec<_> = outcomes
            .into_iter()
            .map(|mut o| {
                o.sent_unix_ms = o.arrival_unix_ms;
                o.completed = true;
                o
            })
            .collect();
        let admissions = vec![admission(0, 200), admission(2_000, 300)];
        let run = record(&outcomes, &admissions, &TOKENS, 0);
        let summary = summarize(&run);
        assert_eq!(summary.saturated_windows, 0);
        // 500 tokens from 0 to one window past 2,000: three windows of 1,000 allowed.
        assert!(
            (summary.utilization - 500.0 / 3_000.0).abs() < 1e-9,
            "{}",
            summary.utilization
        );
        assert_eq!(summary.queue_delay_ms_p99, 0);
    }
}
