//! The console's memory of the recent past, kept by the server so that a page
//! opened now shows the last 15 minutes at once (docs/console.md, "History").
//!
//! Two bounded rings, filled by one sampler task:
//! - per limit, its utilization every [`SAMPLE_INTERVAL_MS`] for
//!   [`SAMPLES_MAX`] samples (15 minutes), for at most [`HISTORY_KEYS_MAX`]
//!   keys: two bytes a sample, about 7 MiB at the bound;
//! - the gateway's counters every second for [`GATEWAY_SAMPLES_MAX`] seconds,
//!   from which the page's per-second and per-minute rates are computed.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use gateway::class_metrics::ClassTotals;
use gateway::metrics::CallTotals;
use ratelimiter::metrics::HistogramSnapshot;
use ratelimiter::{LimitKey, LimitReport};

/// Time between two utilization samples of every limit.
pub const SAMPLE_INTERVAL_MS: u64 = 5_000;
/// Samples kept per limit: 15 minutes at [`SAMPLE_INTERVAL_MS`].
pub const SAMPLES_MAX: usize = 180;
/// The most limits with a history; past it new keys get none, so a registry
/// that grows without bound cannot grow this memory.
pub const HISTORY_KEYS_MAX: usize = 20_000;
/// Seconds of gateway counters kept: one minute and the sample that starts it.
pub const GATEWAY_SAMPLES_MAX: usize = 61;
/// The value of a slot with no sample (the key did not exist, or the sampler
/// could not read the backend then).
const NO_SAMPLE: u16 = u16::MAX;
/// Utilization is kept in basis points of the capacity; debt can take usage
/// above the capacity, so values are capped just below [`NO_SAMPLE`].
const BASIS_POINTS_MAX: u64 = (u16::MAX - 1) as u64;

/// One limit's samples, slot `tick % SAMPLES_MAX` holding sample `tick`.
struct Ring {
    slots: Box<[u16; SAMPLES_MAX]>,
    /// The last tick written.
    last_tick: u64,
}

/// The gateway's counters at one second.
#[derive(Debug, Clone, Default)]
pub struct GatewaySample {
    /// When it was taken.
    pub at_unix_ms: u64,
    /// Totals per (model, tenant).
    pub calls: Vec<(String, String, CallTotals)>,
    /// The queue-wait histogram per model.
    pub queue_waits: Vec<(String, HistogramSnapshot)>,
    /// Totals per (model, class).
    pub classes: Vec<(String, String, ClassTotals)>,
}

#[derive(Default)]
struct Inner {
    keys: HashMap<LimitKey, Ring>,
    /// Samples of limits taken so far; the next one is sample `ticks`.
    ticks: u64,
    last_sample_unix_ms: u64,
    gateway: VecDeque<GatewaySample>,
}

/// Both rings, behind one lock taken briefly by the sampler and the page's reads.
#[derive(Default)]
pub struct History {
    inner: Mutex<Inner>,
}

/// A limit's utilization in basis points (10,000 = full).
pub fn basis_points(report: &LimitReport) -> u16 {
    let capacity = report.state.definition().capacity().max(1) as u128;
    let used = report.in_use as u128 + report.debt as u128;
    (used * 10_000 / capacity).min(BASIS_POINTS_MAX as u128) as u16
}

/// The wall clock's time, as the history's samples are stamped.
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl History {
    /// Records one utilization sample of every limit in `reports`, taken at `at_unix_ms`.
    pub fn record_limits(&self, reports: &[LimitReport], at_unix_ms: u64) {
        let mut inner = self.inner.lock().expect("history lock");
        let tick = inner.ticks;
        inner.ticks += 1;
        inner.last_sample_unix_ms = at_unix_ms;
        for report in reports {
            let key = report.state.definition().key();
            let value = basis_points(report);
            if let Some(ring) = inner.keys.get_mut(key) {
                ring.write(tick, value);
            } else if inner.keys.len() < HISTORY_KEYS_MAX {
                let mut ring = Ring {
                    slots: Box::new([NO_SAMPLE; SAMPLES_MAX]),
                    last_tick: tick,
                };
                ring.slots[(tick % SAMPLES_MAX as u64) as usize] = value;
                inner.keys.insert(key.clone(), ring);
            }
        }
    }

    /// The samples of `key`, oldest first, ending with the latest sample of any
    /// key; `None` in a slot that has none. Empty when the key has no history.
    pub fn limit(&self, key: &LimitKey) -> Vec<Option<u16>> {
        let inner = self.inner.lock().expect("history lock");
        let Some(ring) = inner.keys.get(key) else {
            return Vec::new();
        };
        let end = inner.ticks;
        let start = end.saturating_sub(SAMPLES_MAX as u64);
        (start..end)
            .map(|tick| {
                let fresh = tick <= ring.last_tick && ring.last_tick - tick < SAMPLES_MAX as u64;
                let value = ring.slots[(tick % SAMPLES_MAX as u64) as usize];
                (fresh && value != NO_SAMPLE).then_some(value)
            })
            .collect()
    }

    /// When the last limits sample was taken (0 before the first).
    pub fn last_sample_unix_ms(&self) -> u64 {
        self.inner.lock().expect("history lock").last_sample_unix_ms
    }

    /// Records one second of gateway counters, dropping the oldest past the bound.
    pub fn record_gateway(&self, sample: GatewaySample) {
        let mut inner = self.inner.lock().expect("history lock");
        if inner.gateway.len() == GATEWAY_SAMPLES_MAX {
            inner.gateway.pop_front();
        }
        inner.gateway.push_back(sample);
    }

    /// The newest gateway sample and the one `seconds` before it (or the oldest
    /// kept, when the server is younger): the two ends of a rate.
    pub fn gateway_span(&self, seconds: usize) -> Option<(GatewaySample, GatewaySample)> {
        let inner = self.inner.lock().expect("history lock");
        let newest = inner.gateway.back()?.clone();
        let back = (inner.gateway.len() - 1).min(seconds);
        let older = inner.gateway[inner.gateway.len() - 1 - back].clone();
        Some((older, newest))
    }

    /// Per class, its calls admitted in each second kept (summed over models),
    /// oldest first: the classes panel's sparkline, at most
    /// [`GATEWAY_SAMPLES_MAX`] − 1 values a class.
    pub fn class_admissions(&self) -> HashMap<String, Vec<u64>> {
        let inner = self.inner.lock().expect("history lock");
        let mut out: HashMap<String, Vec<u64>> = HashMap::new();
        let seconds = inner.gateway.len().saturating_sub(1);
        for (i, (older, newer)) in inner.gateway.iter().zip(inner.gateway.iter().skip(1)).enumerate() {
            for (model, class, now) in &newer.classes {
                let was = (older.classes.iter())
                    .find(|(m, c, _)| m == model && c == class)
                    .map_or(0, |(_, _, t)| t.admitted);
                let series = out.entry(class.clone()).or_insert_with(|| vec![0; seconds]);
                series[i] += now.admitted.saturating_sub(was);
            }
        }
        out
    }
}

impl Ring {
    /// Writes sample `tick`, marking the ticks missed since the last one as empty.
    fn write(&mut self, tick: u64, value: u16) {
        let missed = tick.saturating_sub(self.last_tick + 1).min(SAMPLES_MAX as u64);
        for gap in 0..missed {
            self.slots[((self.last_tick + 1 + gap) % SAMPLES_MAX as u64) as usize] = NO_SAMPLE;
        }
        self.slots[(tick % SAMPLES_MAX as u64) as usize] = value;
        self.last_tick = tick;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimiter::{LimitDefinition, LimitState};

    fn report(key: &str, capacity: u64, in_use: u64) -> LimitReport {
        let definition = LimitDefinition::rolling(LimitKey::new(key).unwrap(), capacity, 60).unwrap();
        LimitReport {
            state: LimitState::active(definition),
            in_use,
            debt: 0,
            owing: false,
        }
    }

    #[test]
    fn a_limit_keeps_its_last_fifteen_minutes_oldest_first() {
        let history = History::default();
        let a = LimitKey::new("a").unwrap();
        for i in 0..(SAMPLES_MAX as u64 + 20) {
            history.record_limits(&[report("a", 100, i % 100)], i * SAMPLE_INTERVAL_MS);
        }
        let samples = history.limit(&a);
        assert_eq!(samples.len(), SAMPLES_MAX, "bounded");
        assert_eq!(samples[0], Some(2_000), "the oldest kept is sample 20: 20 of 100");
        assert_eq!(
            samples[SAMPLES_MAX - 1],
            Some(9_900),
            "the newest is sample 199: 99 of 100"
        );
    }

    #[test]
    fn a_new_key_and_a_missed_sample_show_as_gaps() {
        let history = History::default();
        history.record_limits(&[report("a", 10, 1)], 0);
        history.record_limits(&[report("a", 10, 2), report("b", 10, 10)], 1);
        history.record_limits(&[report("b", 10, 5)], 2);
        history.record_limits(&[report("a", 10, 4), report("b", 10, 50)], 3);
        let a = history.limit(&LimitKey::new("a").unwrap());
        assert_eq!(a, vec![Some(1_000), Some(2_000), None, Some(4_000)]);
        let b = history.limit(&LimitKey::new("b").unwrap());
        assert_eq!(
            b,
            vec![None, Some(10_000), Some(5_000), Some(50_000)],
            "debt shows above full"
        );
        assert!(history.limit(&LimitKey::new("c").unwrap()).is_empty());
    }

    #[test]
    fn keys_past_the_bound_get_no_history() {
        let history = History::default();
        let reports: Vec<_> = (0..HISTORY_KEYS_MAX + 1)
            .map(|i| report(&format!("k{i:06}"), 10, 1))
            .collect();
        history.record_limits(&reports, 0);
        assert_eq!(history.limit(&LimitKey::new("k000000").unwrap()).len(), 1);
        let last = format!("k{HISTORY_KEYS_MAX:06}");
        assert!(history.limit(&LimitKey::new(last).unwrap()).is_empty());
    }

    #[test]
    fn gateway_spans_reach_back_as_far_as_kept() {
        let history = History::default();
        assert!(history.gateway_span(60).is_none());
        for second in 0..100u64 {
            history.record_gateway(GatewaySample {
                at_unix_ms: second * 1_000,
                ..GatewaySample::default()
            });
        }
        let (older, newest) = history.gateway_span(60).unwrap();
        assert_eq!((older.at_unix_ms, newest.at_unix_ms), (39_000, 99_000));
        let (older, _) = history.gateway_span(5).unwrap();
        assert_eq!(older.at_unix_ms, 94_000);
    }

    #[test]
    fn class_admissions_are_per_second_and_summed_over_models() {
        let history = History::default();
        let totals = |admitted| ClassTotals {
            admitted,
            ..ClassTotals::default()
        };
        for (second, (gpt, mini)) in [(0u64, 0u64), (2, 1), (5, 1)].into_iter().enumerate() {
            history.record_gateway(GatewaySample {
                at_unix_ms: second as u64 * 1_000,
                classes: vec![
                    ("gpt".to_owned(), "batch".to_owned(), totals(gpt)),
                    ("mini".to_owned(), "batch".to_owned(), totals(mini)),
                    ("gpt".to_owned(), "interactive".to_owned(), totals(7)),
                ],
                ..GatewaySample::default()
            });
        }
        let series = history.class_admissions();
        assert_eq!(series["batch"], vec![3, 3]);
        assert_eq!(series["interactive"], vec![0, 0]);
    }
}
