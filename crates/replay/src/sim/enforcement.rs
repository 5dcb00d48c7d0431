//! How a provider enforces one limit: the meters the simulated provider's
//! [`Ledger`](crate::sim::provider::Ledger) keeps per limit, chosen by a provider
//! profile ([`crate::sim::profile`]). docs/provider-profiles.md gives the source
//! of every rule.
//!
//! - [`MeterSpec::SlidingLog`]: each admission counts for exactly one window after it.
//! - [`MeterSpec::TokenBucket`]: a bucket of the limit's capacity refilled continuously
//!   at capacity per window (Anthropic).
//! - [`MeterSpec::Fixed`]: fixed periods aligned to a clock, each with its own quota:
//!   a per-minute limit quantized to shorter periods (OpenAI, Azure), a running count
//!   reset every minute (Azure's tokens), or a calendar day from midnight in a time
//!   zone (Gemini's requests per day).

use std::collections::VecDeque;

/// The longest period a meter accepts: one day, as a calendar day is the longest
/// limit any provider publishes.
pub const PERIOD_MS_MAX: u64 = 86_400_000;

/// How one limit is enforced, without its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "model")]
pub enum MeterSpec {
    /// A sliding log over `window_ms`.
    SlidingLog {
        /// The rolling window, in ms.
        window_ms: u64,
    },
    /// A bucket holding `capacity` that refills continuously, `capacity` per
    /// `refill_window_ms`, and starts full.
    TokenBucket {
        /// The time the bucket takes to refill from empty, in ms.
        refill_window_ms: u64,
    },
    /// Fixed periods of `period_ms` starting at multiples of `period_ms` in a
    /// time zone `offset_ms` from UTC (periods of local time); each admits `capacity * period_ms / window_ms`
    /// (at least 1), so a per-minute limit quantized to 1 s admits a sixtieth of it
    /// per second, and a per-day limit with a period of a day admits all of it.
    Fixed {
        /// The window the published capacity is per (60 s for a per-minute limit).
        window_ms: u64,
        /// The period each quota lasts.
        period_ms: u64,
        /// The time zone's offset from UTC: a day from midnight in UTC-8 has `-8 h` in
        /// ms, and starts at 08:00 UTC.
        offset_ms: i64,
    },
}

impl MeterSpec {
    /// A meter enforcing `capacity` this way, empty (a bucket full) at `now_ms`.
    pub fn build(self, capacity: u64, now_ms: u64) -> Meter {
        assert!(capacity >= 1, "a limit admits something");
        let state = match self {
            MeterSpec::SlidingLog { window_ms } => {
                assert!((1..=PERIOD_MS_MAX).contains(&window_ms));
                State::Log {
                    entries: VecDeque::new(),
                    used: 0,
                }
            }
            MeterSpec::TokenBucket { refill_window_ms } => {
                assert!((1..=PERIOD_MS_MAX).contains(&refill_window_ms));
                State::Bucket {
                    level: capacity as f64,
                    updated_ms: now_ms,
                }
            }
            MeterSpec::Fixed {
                window_ms, period_ms, ..
            } => {
                assert!((1..=PERIOD_MS_MAX).contains(&window_ms) && (1..=PERIOD_MS_MAX).contains(&period_ms));
                State::Period {
                    index: i64::MIN,
                    used: 0,
                }
            }
        };
        Meter {
            spec: self,
            capacity,
            state,
        }
    }
}

/// One limit's state.
#[derive(Debug, Clone)]
enum State {
    /// Admissions still inside the window: (sequence, admitted at, amount).
    Log {
        entries: VecDeque<(u64, u64, u64)>,
        used: u64,
    },
    /// The bucket's level (may go below 0 when a settlement charges more than was held).
    Bucket { level: f64, updated_ms: u64 },
    /// The current period's index and what it has admitted.
    Period { index: i64, used: u64 },
}

/// One limit as the provider enforces it.
#[derive(Debug, Clone)]
pub struct Meter {
    spec: MeterSpec,
    capacity: u64,
    state: State,
}

impl Meter {
    /// How it is enforced.
    pub fn spec(&self) -> MeterSpec {
        self.spec
    }

    /// The published capacity.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The most one period admits: the quantum of a quantized limit, else the capacity.
    pub fn quota(&self) -> u64 {
        match self.spec {
            MeterSpec::Fixed {
                window_ms, period_ms, ..
            } => u64::try_from(u128::from(self.capacity) * u128::from(period_ms) / u128::from(window_ms))
                .unwrap_or(u64::MAX)
                .max(1),
            _ => self.capacity,
        }
    }

    /// Brings the state to `now_ms`: expires log entries, refills the bucket, starts a new period.
    pub fn advance(&mut self, now_ms: u64) {
        match (&mut self.state, self.spec) {
            (State::Log { entries, used }, MeterSpec::SlidingLog { window_ms }) => {
                while let Some(&(_, at, amount)) = entries.front() {
                    if at + window_ms > now_ms {
                        break;
                    }
                    *used -= amount;
                    entries.pop_front();
                }
            }
            (State::Bucket { level, updated_ms }, MeterSpec::TokenBucket { refill_window_ms }) => {
                let elapsed = now_ms.saturating_sub(*updated_ms) as f64;
                *level = (*level + elapsed * self.capacity as f64 / refill_window_ms as f64).min(self.capacity as f64);
                *updated_ms = (*updated_ms).max(now_ms);
            }
            (
                State::Period { index, used },
                MeterSpec::Fixed {
                    period_ms, offset_ms, ..
                },
            ) => {
                let current = period_index(now_ms, period_ms, offset_ms);
                if current > *index {
                    *index = current;
                    *used = 0;
                }
            }
            _ => unreachable!("a meter's state matches its spec"),
        }
    }

    /// Whether `amount` fits at `now_ms` (after [`Meter::advance`]): `Ok`, or the
    /// ms until it would fit. `None` in the error: it never fits (above the quota).
    pub fn check(&self, now_ms: u64, amount: u64) -> Result<(), Option<u64>> {
        if amount > self.quota() {
            return Err(None);
        }
        match (&self.state, self.spec) {
            (State::Log { entries, used }, MeterSpec::SlidingLog { window_ms }) => {
                if used + amount <= self.capacity {
                    return Ok(());
                }
                let mut left = *used;
                for &(_, at, entry) in entries {
                    left -= entry;
                    if left + amount <= self.capacity {
                        return Err(Some((at + window_ms).saturating_sub(now_ms).max(1)));
                    }
                }
                unreachable!("an amount within the capacity fits once the log is empty")
            }
            (State::Bucket { level, .. }, MeterSpec::TokenBucket { refill_window_ms }) => {
                let missing = amount as f64 - level;
                if missing <= 0.0 {
                    return Ok(());
                }
                let ms = (missing * refill_window_ms as f64 / self.capacity as f64).ceil();
                Err(Some((ms as u64).max(1)))
            }
            (
                State::Period { index, used },
                MeterSpec::Fixed {
                    period_ms, offset_ms, ..
                },
            ) => {
                if used + amount <= self.quota() {
                    return Ok(());
                }
                Err(Some(
                    period_start_ms(index + 1, period_ms, offset_ms)
                        .saturating_sub(now_ms)
                        .max(1),
                ))
            }
            _ => unreachable!("a meter's state matches its spec"),
        }
    }

    /// Charges `amount` admitted at `now_ms` as admission number `sequence`
    /// (after [`Meter::check`], or unconditionally for a refused request the
    /// provider counts anyway).
    pub fn take(&mut self, sequence: u64, now_ms: u64, amount: u64) {
        match &mut self.state {
            State::Log { entries, used } => {
                entries.push_back((sequence, now_ms, amount));
                *used += amount;
            }
            State::Bucket { level, .. } => *level -= amount as f64,
            State::Period { used, .. } => *used += amount,
        }
    }

    /// Changes the charge of admission `sequence`, admitted at `admitted_ms`, from
    /// `held` to `charged` (the provider settles at the end of the call). Nothing
    /// changes once the charge has left the meter (expired or its period ended).
    pub fn settle(&mut self, sequence: u64, admitted_ms: u64, held: u64, charged: u64) {
        match (&mut self.state, self.spec) {
            (State::Log { entries, used }, _) => {
                if let Ok(at) = entries.binary_search_by_key(&sequence, |e| e.0) {
                    *used = *used - entries[at].2 + charged;
                    entries[at].2 = charged;
                }
            }
            (State::Bucket { level, .. }, _) => {
                *level = (*level + held as f64 - charged as f64).min(self.capacity as f64);
            }
            (
                State::Period { index, used },
                MeterSpec::Fixed {
                    period_ms, offset_ms, ..
                },
            ) => {
                if period_index(admitted_ms, period_ms, offset_ms) == *index {
                    *used = (*used + charged).saturating_sub(held);
                }
            }
            _ => unreachable!("a meter's state matches its spec"),
        }
    }

    /// What is left now, as the provider's `remaining` headers report it.
    pub fn remaining(&self) -> u64 {
        match &self.state {
            State::Log { used, .. } => self.capacity.saturating_sub(*used),
            State::Bucket { level, .. } => level.max(0.0).floor() as u64,
            State::Period { used, .. } => self.quota().saturating_sub(*used),
        }
    }

    /// The ms from `now_ms` until the limit is whole again, as the provider's
    /// `reset` headers report it: the log's last entry expiring, the bucket full,
    /// the period's end.
    pub fn reset_ms(&self, now_ms: u64) -> u64 {
        match (&self.state, self.spec) {
            (State::Log { entries, .. }, MeterSpec::SlidingLog { window_ms }) => entries
                .back()
                .map_or(0, |&(_, at, _)| (at + window_ms).saturating_sub(now_ms)),
            (State::Bucket { level, .. }, MeterSpec::TokenBucket { refill_window_ms }) => {
                let missing = (self.capacity as f64 - level).max(0.0);
                (missing * refill_window_ms as f64 / self.capacity as f64).ceil() as u64
            }
            (
                State::Period { index, .. },
                MeterSpec::Fixed {
                    period_ms, offset_ms, ..
                },
            ) => period_start_ms(index + 1, period_ms, offset_ms).saturating_sub(now_ms),
            _ => unreachable!("a meter's state matches its spec"),
        }
    }
}

/// The index of the period holding `at_ms`.
fn period_index(at_ms: u64, period_ms: u64, offset_ms: i64) -> i64 {
    let shifted = i128::from(at_ms) + i128::from(offset_ms);
    i64::try_from(shifted.div_euclid(i128::from(period_ms))).expect("periods of Unix ms fit i64")
}

/// When period `index` starts, Unix ms.
fn period_start_ms(index: i64, period_ms: u64, offset_ms: i64) -> u64 {
    let start = i128::from(index) * i128::from(period_ms) - i128::from(offset_ms);
    u64::try_from(start.max(0)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit(meter: &mut Meter, sequence: u64, now_ms: u64, amount: u64) -> Result<(), Option<u64>> {
        meter.advance(now_ms);
        meter.check(now_ms, amount)?;
        meter.take(sequence, now_ms, amount);
        Ok(())
    }

    #[test]
    fn a_burst_into_one_second_on_a_quantized_limit_is_refused() {
        // 600 requests a minute quantized to 1 s: 10 a second, not 600 at once.
        let spec = MeterSpec::Fixed {
            window_ms: 60_000,
            period_ms: 1_000,
            offset_ms: 0,
        };
        let mut meter = spec.build(600, 5_000);
        assert_eq!(meter.quota(), 10);
        let admitted = (0..600).filter(|&i| admit(&mut meter, i, 5_000 + i, 1).is_ok()).count();
        assert_eq!(admitted, 10, "one second's share of the minute");
        assert_eq!(meter.check(5_600, 1), Err(Some(400)), "the next period starts at 6 s");
        assert!(admit(&mut meter, 700, 6_000, 1).is_ok());
        assert_eq!(
            meter.check(6_000, 11),
            Err(None),
            "more than a period's share never fits"
        );
    }

    #[test]
    fn a_calendar_day_starts_at_midnight_in_its_time_zone() {
        // A day from midnight UTC-8 (Pacific standard time): 08:00 UTC.
        let day_ms = 86_400_000;
        let spec = MeterSpec::Fixed {
            window_ms: day_ms,
            period_ms: day_ms,
            offset_ms: -8 * 3_600_000,
        };
        let start = 20_000 * day_ms; // A UTC midnight.
        let mut meter = spec.build(2, start);
        assert!(admit(&mut meter, 0, start, 1).is_ok());
        assert!(admit(&mut meter, 1, start + 1, 1).is_ok());
        assert_eq!(meter.check(start + 2, 1), Err(Some(8 * 3_600_000 - 2)));
        assert!(
            admit(&mut meter, 2, start + 8 * 3_600_000, 1).is_ok(),
            "a new Pacific day"
        );
    }

    #[test]
    fn a_token_bucket_refills_at_its_rate() {
        // 60,000 a minute: 1 per ms once empty, full at the start.
        let mut meter = MeterSpec::TokenBucket {
            refill_window_ms: 60_000,
        }
        .build(60_000, 0);
        assert!(
            admit(&mut meter, 0, 0, 60_000).is_ok(),
            "a full bucket bursts its capacity"
        );
        assert_eq!(meter.check(0, 1_000), Err(Some(1_000)));
        assert!(admit(&mut meter, 1, 999, 1_000).is_err());
        assert!(admit(&mut meter, 2, 1_000, 1_000).is_ok());
        // Over 30 s it lets through exactly the refill, never more.
        let mut admitted = 0;
        for ms in (1_001..=31_001).step_by(10) {
            if admit(&mut meter, 3 + ms, ms, 10).is_ok() {
                admitted += 10;
            }
        }
        assert_eq!(admitted, 30_000);
        assert_eq!(meter.reset_ms(31_001), 59_999);
    }

    #[test]
    fn settlement_changes_what_the_meter_holds() {
        let mut log = MeterSpec::SlidingLog { window_ms: 60_000 }.build(100, 0);
        admit(&mut log, 7, 0, 80).unwrap();
        assert!(log.check(1, 30).is_err());
        log.settle(7, 0, 80, 20);
        assert_eq!(log.remaining(), 80);
        let mut bucket = MeterSpec::TokenBucket {
            refill_window_ms: 60_000,
        }
        .build(100, 0);
        admit(&mut bucket, 0, 0, 50).unwrap();
        bucket.settle(0, 0, 50, 250);
        assert_eq!(bucket.remaining(), 0, "a 5x burndown charges more than was held");
        assert_eq!(bucket.check(0, 1), Err(Some(90_600)), "151 tokens at 100 a minute");
        let mut fixed = MeterSpec::Fixed {
            window_ms: 60_000,
            period_ms: 60_000,
            offset_ms: 0,
        }
        .build(100, 0);
        admit(&mut fixed, 0, 59_000, 90).unwrap();
        fixed.advance(60_000);
        fixed.settle(0, 59_000, 90, 10);
        assert_eq!(fixed.remaining(), 100, "a past period's charge is gone");
    }
}
