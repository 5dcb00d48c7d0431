//! Each directory key's calls and tokens today, as this server counted them
//! (docs/console.md, "Tenants and keys"): what the console's keys panel shows
//! beside each key. Per server and since the start of the UTC day; nothing
//! durable: a restart starts the day's counts at zero. A key with its own
//! `daily_tokens` limit has a fleet-wide figure in the backend besides, which
//! the console prefers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use ratelimiter::clock::Clock;

/// A UTC day, in milliseconds: counts start again at each day's midnight.
pub const DAY_MS: u64 = 86_400_000;
/// The most keys counted at once: the directory's own bound, so that a flood of
/// keys cannot grow this map past what the directory itself holds. Entries of
/// an earlier day are dropped first when it is reached.
pub const KEY_USAGE_ENTRIES_MAX: usize = ratelimiter::directory::KEYS_MAX;

/// One key's count of one day.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DayUsage {
    /// The UTC day counted (days since the Unix epoch).
    pub day: u64,
    /// Calls admitted.
    pub calls: u64,
    /// Tokens the provider reported used.
    pub tokens: u64,
}

/// One key's counter: one lock per key, so keys never contend with each other.
#[derive(Debug, Default)]
pub struct KeyCounter {
    usage: Mutex<DayUsage>,
}

impl KeyCounter {
    /// Adds `calls` and `tokens` on `day`, starting the count again when the day changed.
    fn add(&self, day: u64, calls: u64, tokens: u64) {
        let mut usage = self.usage.lock().expect("key usage lock");
        if usage.day != day {
            *usage = DayUsage {
                day,
                ..DayUsage::default()
            };
        }
        usage.calls = usage.calls.saturating_add(calls);
        usage.tokens = usage.tokens.saturating_add(tokens);
    }

    fn on(&self, day: u64) -> DayUsage {
        let usage = *self.usage.lock().expect("key usage lock");
        if usage.day == day {
            usage
        } else {
            DayUsage {
                day,
                ..DayUsage::default()
            }
        }
    }
}

/// The counters of the keys that called, by key id.
#[derive(Debug)]
pub struct KeyUsage {
    /// By key id (the server's own ULIDs): a fast hash, looked up at every call.
    counters: RwLock<HashMap<String, Arc<KeyCounter>, foldhash::fast::RandomState>>,
    clock: Arc<dyn Clock>,
}

impl KeyUsage {
    /// Counters on `clock`, whose UTC day they count.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            counters: RwLock::new(HashMap::default()),
            clock,
        }
    }

    fn today(&self) -> u64 {
        self.clock.now_unix_ms() / DAY_MS
    }

    /// The start of today (UTC), ms since the Unix epoch.
    pub fn day_started_unix_ms(&self) -> u64 {
        self.today() * DAY_MS
    }

    /// The counter of key `id`, made at its first call.
    pub fn counter(&self, id: &str) -> Arc<KeyCounter> {
        if let Some(found) = self.counters.read().expect("key usage lock").get(id) {
            return found.clone();
        }
        let mut counters = self.counters.write().expect("key usage lock");
        if counters.len() >= KEY_USAGE_ENTRIES_MAX && !counters.contains_key(id) {
            let today = self.today();
            counters.retain(|_, c| c.on(today).calls > 0 || c.on(today).tokens > 0);
        }
        counters.entry(id.to_owned()).or_default().clone()
    }

    /// A call of the key admitted.
    pub fn called(&self, counter: &KeyCounter) {
        counter.add(self.today(), 1, 0);
    }

    /// `tokens` the provider reported for a call of the key.
    pub fn used(&self, counter: &KeyCounter, tokens: u64) {
        counter.add(self.today(), 0, tokens);
    }

    /// Key `id`'s count today; zero for a key that did not call today.
    pub fn of(&self, id: &str) -> DayUsage {
        let today = self.today();
        match self.counters.read().expect("key usage lock").get(id) {
            Some(counter) => counter.on(today),
            None => DayUsage {
                day: today,
                ..DayUsage::default()
            },
        }
    }
}

/// A call's key counter with the counters it lives in: what a call of a
/// directory key carries from admission to its end.
#[derive(Debug, Clone)]
pub struct KeyCall {
    /// Every key's counters (their clock).
    pub usage: Arc<KeyUsage>,
    /// This key's.
    pub counter: Arc<KeyCounter>,
}

impl KeyCall {
    /// The call was admitted.
    pub fn admitted(&self) {
        self.usage.called(&self.counter);
    }

    /// The provider reported `tokens` used.
    pub fn used(&self, tokens: u64) {
        self.usage.used(&self.counter, tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimiter::clock::FakeClock;

    #[test]
    fn counts_start_again_at_each_utc_midnight() {
        let clock = Arc::new(FakeClock::new(3 * DAY_MS + 1_000));
        let usage = Arc::new(KeyUsage::new(clock.clone()));
        let call = KeyCall {
            usage: usage.clone(),
            counter: usage.counter("k1"),
        };
        call.admitted();
        call.admitted();
        call.used(120);
        assert_eq!((usage.of("k1").calls, usage.of("k1").tokens), (2, 120));
        assert_eq!(usage.of("other").calls, 0);
        assert_eq!(usage.day_started_unix_ms(), 3 * DAY_MS);
        // The next day: nothing counted yet, then the new day's calls only.
        clock.advance_ms(DAY_MS);
        assert_eq!((usage.of("k1").calls, usage.of("k1").tokens), (0, 0));
        call.admitted();
        assert_eq!((usage.of("k1").calls, usage.of("k1").tokens), (1, 0));
    }
}
