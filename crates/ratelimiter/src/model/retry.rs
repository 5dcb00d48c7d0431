//! Retry hints for denied reservations (docs/retry-hints.md).
//!
//! A denied caller is told how long to wait before it retries with a new lease id.
//! Backends that cannot read their state on the hot path (TigerBeetle) guess with
//! a per-kind exponential backoff driven by a per-key denial streak; the memory
//! backend computes rolling hints exactly and uses this backoff for concurrency.
//!
//! The pieces are public so both backends share them: [`RetryPolicy`] (the
//! `retry_policy:` YAML section), [`Streak`] and [`DenyTracker`] (recent denials
//! per key), [`Jitter`] (the random part), and [`RetryAdvisor`] (all three
//! together, answering "max over the failing requirements").

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::model::definition::{LimitDefinition, LimitKind};
use crate::model::key::LimitKey;

/// The longest hint a policy may configure: one hour. A longer wait is better
/// expressed by a limit's window; a typo such as `max_ms: 50000000` is rejected.
pub const RETRY_MS_MAX: u64 = 3_600_000;
/// The largest backoff factor: beyond it the second denial already hits `max_ms`.
pub const FACTOR_MAX: f64 = 100.0;
/// The highest streak counted. Any backoff reaches `max_ms` long before, so
/// counting further only risks overflow.
pub const STREAK_MAX: u32 = 1 << 31;
/// A key that saw no denial for this long starts its next streak from zero: the
/// contention that built the old streak is over.
pub const STREAK_IDLE_RESET_MS: u64 = 60_000;
/// Default bound on the keys a [`DenyTracker`] remembers; far above the number of
/// limits a deployment defines, and about 64 bytes each plus the key.
pub const TRACKED_KEYS_MAX_DEFAULT: usize = 65_536;

/// Why a retry policy is invalid. The message names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("retry_policy.{0}")]
pub struct RetryPolicyError(String);

/// Backoff for concurrency limits: `base_ms * factor^streak`, at most `max_ms`
/// and at most the limit's timeout, plus up to `jitter_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "BackoffFields", into = "BackoffFields")]
pub struct BackoffPolicy {
    fields: BackoffFields,
}

/// The raw fields of a [`BackoffPolicy`], before validation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackoffFields {
    /// The hint on the first denial, in ms; at least 1 so a hint is never 0.
    pub base_ms: u64,
    /// The largest hint before jitter, in ms; at least `base_ms`.
    pub max_ms: u64,
    /// Growth per consecutive denial; at least 1.
    pub factor: f64,
    /// The most random ms added, so denied callers do not retry in lockstep.
    pub jitter_ms: u64,
}

impl Default for BackoffFields {
    fn default() -> Self {
        Self {
            base_ms: 50,
            max_ms: 2000,
            factor: 2.0,
            jitter_ms: 25,
        }
    }
}

/// Backoff for rolling limits: like [`BackoffPolicy`], but the base is at least
/// `window_fraction` of the limit's window, since a rolling limit frees capacity
/// on the window's time scale.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RollingBackoffFields", into = "RollingBackoffFields")]
pub struct RollingBackoffPolicy {
    fields: RollingBackoffFields,
}

/// The raw fields of a [`RollingBackoffPolicy`], before validation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RollingBackoffFields {
    /// The smallest first hint, in ms; at least 1.
    pub base_ms: u64,
    /// The largest hint before jitter, in ms; at least `base_ms`.
    pub max_ms: u64,
    /// Growth per consecutive denial; at least 1.
    pub factor: f64,
    /// The most random ms added.
    pub jitter_ms: u64,
    /// The share of the window used as the first hint when larger than `base_ms`; 0..=1.
    pub window_fraction: f64,
}

/// The default longest rolling hint, in ms. ADR 0010's example has 5,000
/// (docs/retry-hints.md, "Defaults and the rolling cap"); a heuristic hint cannot know
/// when a rolling window frees room, so a caller that waits it out idles the limit
/// meanwhile. Replaying the Azure code trace through the TigerBeetle backend
/// (BENCHMARKS.md, "Trace replay") used 94.7 and 95.8 % of the provider with 5,000 and
/// 99.3 % with 1,000, for 1.6 times the denied reserves. The memory backend's rolling
/// hints are exact and do not use it.
pub const ROLLING_HINT_MS_MAX_DEFAULT: u64 = 1000;

impl Default for RollingBackoffFields {
    fn default() -> Self {
        Self {
            base_ms: 100,
            max_ms: ROLLING_HINT_MS_MAX_DEFAULT,
            factor: 1.5,
            jitter_ms: 50,
            window_fraction: 0.1,
        }
    }
}

/// The `retry_policy:` configuration (docs/retry-hints.md, "ADR 0010 backoff"),
/// validated. Its `Default` is in docs/retry-hints.md, "Defaults and the rolling cap".
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// Backoff for concurrency limits.
    pub concurrency: BackoffPolicy,
    /// Backoff for rolling limits (used where exact hints are not available).
    pub rolling: RollingBackoffPolicy,
}

fn check_backoff(
    section: &str,
    base_ms: u64,
    max_ms: u64,
    factor: f64,
    jitter_ms: u64,
) -> Result<(), RetryPolicyError> {
    let invalid = |message: String| Err(RetryPolicyError(format!("{section}.{message}")));
    if base_ms == 0 {
        return invalid("base_ms must be at least 1".into());
    }
    if max_ms < base_ms || max_ms > RETRY_MS_MAX {
        return invalid(format!("max_ms must be base_ms..={RETRY_MS_MAX}, got {max_ms}"));
    }
    if !(1.0..=FACTOR_MAX).contains(&factor) {
        return invalid(format!("factor must be 1..={FACTOR_MAX}, got {factor}"));
    }
    if jitter_ms > RETRY_MS_MAX {
        return invalid(format!("jitter_ms must be at most {RETRY_MS_MAX}, got {jitter_ms}"));
    }
    Ok(())
}

/// `base * factor^streak`, saturating, as whole ms.
fn grown_ms(base_ms: u64, factor: f64, streak: u32) -> u64 {
    let exponent = i32::try_from(streak).unwrap_or(i32::MAX);
    let raw = base_ms as f64 * factor.powi(exponent);
    if raw.is_finite() && raw < RETRY_MS_MAX as f64 {
        raw as u64
    } else {
        RETRY_MS_MAX
    }
}

impl BackoffPolicy {
    /// Validates a concurrency backoff.
    pub fn new(fields: BackoffFields) -> Result<Self, RetryPolicyError> {
        check_backoff(
            "concurrency",
            fields.base_ms,
            fields.max_ms,
            fields.factor,
            fields.jitter_ms,
        )?;
        Ok(Self { fields })
    }

    /// The fields.
    pub fn fields(&self) -> &BackoffFields {
        &self.fields
    }

    /// The hint before jitter after `streak` earlier denials: at least `base_ms`,
    /// at most `max_ms` and the limit's timeout (waiting longer than the timeout
    /// is pointless: every hold is gone by then).
    pub fn backoff_ms(&self, timeout_ms: u64, streak: u32) -> u64 {
        let f = &self.fields;
        let cap_ms = f.max_ms.min(timeout_ms).max(1);
        grown_ms(f.base_ms, f.factor, streak).max(f.base_ms).min(cap_ms)
    }
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self::new(BackoffFields::default()).expect("the ADR defaults are valid")
    }
}

impl TryFrom<BackoffFields> for BackoffPolicy {
    type Error = RetryPolicyError;

    fn try_from(fields: BackoffFields) -> Result<Self, Self::Error> {
        Self::new(fields)
    }
}

impl From<BackoffPolicy> for BackoffFields {
    fn from(policy: BackoffPolicy) -> Self {
        policy.fields
    }
}

impl RollingBackoffPolicy {
    /// Validates a rolling backoff.
    pub fn new(fields: RollingBackoffFields) -> Result<Self, RetryPolicyError> {
        check_backoff(
            "rolling",
            fields.base_ms,
            fields.max_ms,
            fields.factor,
            fields.jitter_ms,
        )?;
        if !(0.0..=1.0).contains(&fields.window_fraction) {
            return Err(RetryPolicyError(format!(
                "rolling.window_fraction must be 0..=1, got {}",
                fields.window_fraction
            )));
        }
        Ok(Self { fields })
    }

    /// The fields.
    pub fn fields(&self) -> &RollingBackoffFields {
        &self.fields
    }

    /// The hint before jitter after `streak` earlier denials: the base is the
    /// larger of `base_ms` and `window_fraction` of the window; the result never
    /// exceeds `max_ms`, which wins when a long window's fraction is larger.
    pub fn backoff_ms(&self, window_ms: u64, streak: u32) -> u64 {
        let f = &self.fields;
        let fraction_ms = (window_ms as f64 * f.window_fraction) as u64;
        let base_ms = f.base_ms.max(fraction_ms).min(f.max_ms);
        grown_ms(base_ms, f.factor, streak).max(base_ms).min(f.max_ms)
    }
}

impl Default for RollingBackoffPolicy {
    fn default() -> Self {
        Self::new(RollingBackoffFields::default()).expect("the ADR defaults are valid")
    }
}

impl TryFrom<RollingBackoffFields> for RollingBackoffPolicy {
    type Error = RetryPolicyError;

    fn try_from(fields: RollingBackoffFields) -> Result<Self, Self::Error> {
        Self::new(fields)
    }
}

impl From<RollingBackoffPolicy> for RollingBackoffFields {
    fn from(policy: RollingBackoffPolicy) -> Self {
        policy.fields
    }
}

impl RetryPolicy {
    /// The hint (docs/retry-hints.md, "ADR 0010 backoff") for one failing requirement of
    /// `definition`, after `streak` earlier denials of its key, jitter included.
    ///
    /// A limit with a calendar period denies "not now" only while calls in flight
    /// hold part of it ([`crate::decision::period_is_spent`]): room comes back when
    /// they complete, as on a concurrency limit, not on a window's time scale, so it
    /// takes the concurrency backoff.
    pub fn retry_after_ms(&self, definition: &LimitDefinition, streak: u32, jitter: &Jitter) -> u64 {
        let completes_free_room = definition.kind() == LimitKind::Concurrency || definition.period().is_some();
        if completes_free_room {
            let backoff_ms = self.concurrency.backoff_ms(definition.hold_ms(), streak);
            return backoff_ms + jitter.sample_ms(self.concurrency.fields.jitter_ms);
        }
        let backoff_ms = self.rolling.backoff_ms(definition.hold_ms(), streak);
        backoff_ms + jitter.sample_ms(self.rolling.fields.jitter_ms)
    }

    /// The jitter bound of `kind`, for hints computed elsewhere (the memory
    /// backend's exact rolling hints).
    pub fn jitter_ms(&self, kind: LimitKind) -> u64 {
        match kind {
            LimitKind::Concurrency => self.concurrency.fields.jitter_ms,
            LimitKind::Rolling | LimitKind::Bucket => self.rolling.fields.jitter_ms,
        }
    }
}

/// A source of non-negative random delays. Lock-free (SplitMix64 over one atomic
/// word) so concurrent denials do not serialize on it; seeded for deterministic tests.
#[derive(Debug)]
pub struct Jitter {
    state: AtomicU64,
}

/// SplitMix64's increment: an odd constant that visits every 64-bit state.
const SPLITMIX_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl Jitter {
    /// A deterministic sequence: the same seed gives the same delays.
    pub fn seeded(seed: u64) -> Self {
        Self {
            state: AtomicU64::new(seed),
        }
    }

    /// A sequence seeded from the operating system, for production.
    pub fn from_entropy() -> Self {
        Self::seeded(rand::random())
    }

    /// A uniformly distributed delay in `0..=max_ms`.
    pub fn sample_ms(&self, max_ms: u64) -> u64 {
        if max_ms == 0 {
            return 0;
        }
        let mut z = self
            .state
            .fetch_add(SPLITMIX_GAMMA, Ordering::Relaxed)
            .wrapping_add(SPLITMIX_GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // The modulo bias is below max_ms / 2^64: irrelevant for a hint.
        z % (max_ms + 1)
    }
}

/// Consecutive denials of one key, decaying on success and with idleness.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Streak {
    denials: u32,
    updated_unix_ms: u64,
}

impl Streak {
    /// A streak of `denials` last counted at `updated_unix_ms`: a memory
    /// snapshot puts one back after a restart (capped at the streak's maximum).
    pub fn from_parts(denials: u32, updated_unix_ms: u64) -> Self {
        Self {
            denials: denials.min(STREAK_MAX),
            updated_unix_ms,
        }
    }

    /// (denials, last counted at): what a memory snapshot saves.
    pub fn parts(&self) -> (u32, u64) {
        (self.denials, self.updated_unix_ms)
    }

    /// The denials counted at `now_unix_ms` (0 once idle for [`STREAK_IDLE_RESET_MS`]).
    pub fn current(&self, now_unix_ms: u64) -> u32 {
        if now_unix_ms.saturating_sub(self.updated_unix_ms) >= STREAK_IDLE_RESET_MS {
            0
        } else {
            self.denials
        }
    }

    /// Counts a denial and returns the streak before it, so the first denial of
    /// a calm key is answered with the policy's base.
    pub fn record_deny(&mut self, now_unix_ms: u64) -> u32 {
        let before = self.current(now_unix_ms);
        self.denials = (before + 1).min(STREAK_MAX);
        self.updated_unix_ms = now_unix_ms;
        before
    }

    /// Counts a grant: the streak halves, so one lucky grant amid contention does
    /// not reset the backoff, while a run of grants does.
    pub fn record_allow(&mut self, now_unix_ms: u64) {
        if self.denials == 0 {
            // Calm already: leave the memory untouched (this runs on every grant).
            return;
        }
        self.denials = self.current(now_unix_ms) / 2;
        self.updated_unix_ms = now_unix_ms;
    }
}

/// The denial streaks of many keys, bounded (docs/retry-hints.md, "Streaks"). Best-effort
/// and in memory only; safe to share between threads.
#[derive(Debug)]
pub struct DenyTracker {
    keys_max: usize,
    streaks: Mutex<HashMap<LimitKey, Streak>>,
}

impl DenyTracker {
    /// A tracker remembering at most `keys_max` keys (at least 1).
    pub fn new(keys_max: usize) -> Self {
        assert!(keys_max >= 1, "a tracker needs room for one key");
        Self {
            keys_max,
            streaks: Mutex::new(HashMap::new()),
        }
    }

    /// Counts a denial of `key` and returns the streak before it.
    ///
    /// When the map is full, idle keys are forgotten first; if every key is busy
    /// the new key goes untracked and is answered as a calm key (streak 0).
    pub fn increment(&self, key: &LimitKey, now_unix_ms: u64) -> u32 {
        let mut streaks = self.streaks.lock().expect("deny tracker poisoned");
        if let Some(streak) = streaks.get_mut(key) {
            return streak.record_deny(now_unix_ms);
        }
        if streaks.len() >= self.keys_max {
            streaks.retain(|_, s| s.current(now_unix_ms) > 0);
            if streaks.len() >= self.keys_max {
                return 0;
            }
        }
        let mut streak = Streak::default();
        let before = streak.record_deny(now_unix_ms);
        streaks.insert(key.clone(), streak);
        before
    }

    /// Counts a grant on `key` and returns the streak after it.
    pub fn decay(&self, key: &LimitKey, now_unix_ms: u64) -> u32 {
        let mut streaks = self.streaks.lock().expect("deny tracker poisoned");
        let Some(streak) = streaks.get_mut(key) else {
            return 0;
        };
        streak.record_allow(now_unix_ms);
        let after = streak.denials;
        if after == 0 {
            streaks.remove(key);
        }
        after
    }

    /// The number of keys remembered now.
    pub fn len(&self) -> usize {
        self.streaks.lock().expect("deny tracker poisoned").len()
    }

    /// True when no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Policy, tracker and jitter together: what a backend without a read path asks
/// on every decision.
#[derive(Debug)]
pub struct RetryAdvisor {
    policy: RetryPolicy,
    tracker: DenyTracker,
    jitter: Jitter,
}

impl RetryAdvisor {
    /// An advisor for `policy`, tracking up to `keys_max` keys, drawing jitter from `jitter`.
    pub fn new(policy: RetryPolicy, keys_max: usize, jitter: Jitter) -> Self {
        Self {
            policy,
            tracker: DenyTracker::new(keys_max),
            jitter,
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Counts a denial of every failing definition and returns the hint: the largest of
    /// their hints (docs/retry-hints.md, "Which hint each answer carries"). `failing`
    /// must not be empty.
    pub fn on_denied<'a>(&self, failing: impl IntoIterator<Item = &'a LimitDefinition>, now_unix_ms: u64) -> u64 {
        let mut hint_ms = None;
        for definition in failing {
            let streak = self.tracker.increment(definition.key(), now_unix_ms);
            let ms = self.policy.retry_after_ms(definition, streak, &self.jitter);
            hint_ms = Some(hint_ms.map_or(ms, |h: u64| h.max(ms)));
        }
        hint_ms.expect("a denial names at least one failing requirement")
    }

    /// Counts a grant on every key of an allowed request.
    pub fn on_allowed<'a>(&self, keys: impl IntoIterator<Item = &'a LimitKey>, now_unix_ms: u64) {
        for key in keys {
            self.tracker.decay(key, now_unix_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> LimitKey {
        LimitKey::new(k).unwrap()
    }

    fn no_jitter() -> RetryPolicy {
        let c = BackoffFields {
            jitter_ms: 0,
            ..Default::default()
        };
        let r = RollingBackoffFields {
            jitter_ms: 0,
            ..Default::default()
        };
        RetryPolicy {
            concurrency: BackoffPolicy::new(c).unwrap(),
            rolling: RollingBackoffPolicy::new(r).unwrap(),
        }
    }

    #[test]
    fn defaults_are_the_adr_values_but_a_shorter_rolling_cap_and_parse_from_yaml_shaped_json() {
        let json = r#"{"concurrency":{"base_ms":50,"max_ms":2000,"factor":2.0,"jitter_ms":25},
            "rolling":{"base_ms":100,"max_ms":1000,"factor":1.5,"jitter_ms":50,"window_fraction":0.1}}"#;
        let parsed: RetryPolicy = serde_json::from_str(json).unwrap();
        assert_eq!(parsed, RetryPolicy::default());
        let partial: RetryPolicy = serde_json::from_str(r#"{"rolling":{"max_ms":9000}}"#).unwrap();
        assert_eq!(partial.rolling.fields().max_ms, 9000);
        assert_eq!(partial.rolling.fields().base_ms, 100);
        assert_eq!(partial.concurrency, BackoffPolicy::default());
        let empty: RetryPolicy = serde_json::from_str("{}").unwrap();
        assert_eq!(empty, RetryPolicy::default());
    }

    #[test]
    fn invalid_policies_are_rejected_with_the_field_named() {
        let cases = [
            (r#"{"concurrency":{"base_ms":3000}}"#, "concurrency.max_ms"),
            (r#"{"concurrency":{"base_ms":0}}"#, "concurrency.base_ms"),
            (r#"{"concurrency":{"factor":0.5}}"#, "concurrency.factor"),
            (r#"{"rolling":{"factor":1000.0}}"#, "rolling.factor"),
            (r#"{"rolling":{"window_fraction":1.5}}"#, "rolling.window_fraction"),
            (r#"{"rolling":{"window_fraction":-0.1}}"#, "rolling.window_fraction"),
            (r#"{"rolling":{"max_ms":99999999}}"#, "rolling.max_ms"),
            (r#"{"rolling":{"jitter_ms":99999999}}"#, "rolling.jitter_ms"),
        ];
        for (json, field) in cases {
            let error = serde_json::from_str::<RetryPolicy>(json).unwrap_err().to_string();
            assert!(error.contains(field), "{json}: {error}");
        }
        assert!(serde_json::from_str::<RetryPolicy>(r#"{"concurency":{}}"#).is_err());
        assert!(serde_json::from_str::<RetryPolicy>(r#"{"rolling":{"base":1}}"#).is_err());
    }

    #[test]
    fn concurrency_backoff_grows_from_base_and_is_capped_by_max_and_timeout() {
        let policy = no_jitter();
        let jitter = Jitter::seeded(1);
        let def = LimitDefinition::concurrency(key("c"), 4, 300).unwrap();
        let hints: Vec<u64> = (0..8).map(|s| policy.retry_after_ms(&def, s, &jitter)).collect();
        assert_eq!(hints, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
        let short = LimitDefinition::concurrency(key("c"), 4, 1).unwrap();
        assert_eq!(policy.retry_after_ms(&short, 20, &jitter), 1000);
        assert_eq!(policy.retry_after_ms(&short, u32::MAX, &jitter), 1000);
    }

    #[test]
    fn rolling_backoff_starts_at_the_window_fraction_and_is_capped_by_max() {
        // ADR 0010's example values (docs/retry-hints.md, "Defaults and the rolling
        // cap"), where the window fraction and growth show.
        let adr = RollingBackoffFields {
            max_ms: 5000,
            jitter_ms: 0,
            ..Default::default()
        };
        let policy = RetryPolicy {
            rolling: RollingBackoffPolicy::new(adr).unwrap(),
            ..no_jitter()
        };
        let jitter = Jitter::seeded(1);
        let minute = LimitDefinition::rolling(key("r"), 10, 60).unwrap();
        assert_eq!(policy.retry_after_ms(&minute, 0, &jitter), 5000);
        let second = LimitDefinition::rolling(key("r"), 10, 1).unwrap();
        let hints: Vec<u64> = (0..3).map(|s| policy.retry_after_ms(&second, s, &jitter)).collect();
        assert_eq!(hints, [100, 150, 225]);
        let ten = LimitDefinition::rolling(key("r"), 10, 10).unwrap();
        assert_eq!(policy.retry_after_ms(&ten, 0, &jitter), 1000);
        assert_eq!(policy.retry_after_ms(&ten, 1, &jitter), 1500);
        assert_eq!(policy.retry_after_ms(&ten, 50, &jitter), 5000);
    }

    #[test]
    fn a_period_waits_for_completes_as_a_concurrency_limit_does() {
        let policy = no_jitter();
        let jitter = Jitter::seeded(1);
        let day = LimitDefinition::per_period(key("budget"), 20, crate::base::period::Period::Day).unwrap();
        let hints: Vec<u64> = (0..8).map(|s| policy.retry_after_ms(&day, s, &jitter)).collect();
        assert_eq!(
            hints,
            [50, 100, 200, 400, 800, 1600, 2000, 2000],
            "not a day's window fraction"
        );
    }

    #[test]
    fn jitter_is_bounded_deterministic_per_seed_and_spread() {
        let a = Jitter::seeded(7);
        let b = Jitter::seeded(7);
        let xs: Vec<u64> = (0..1000).map(|_| a.sample_ms(25)).collect();
        let ys: Vec<u64> = (0..1000).map(|_| b.sample_ms(25)).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|&x| x <= 25));
        let distinct: std::collections::HashSet<_> = xs.iter().collect();
        assert_eq!(distinct.len(), 26, "every value of 0..=25 appears in 1000 draws");
        assert_eq!(a.sample_ms(0), 0);
        let policy = RetryPolicy::default();
        let def = LimitDefinition::concurrency(key("c"), 4, 300).unwrap();
        for _ in 0..100 {
            let hint = policy.retry_after_ms(&def, 0, &a);
            assert!((50..=75).contains(&hint), "{hint}");
        }
    }

    #[test]
    fn streak_counts_denials_halves_on_grant_and_resets_when_idle() {
        let mut s = Streak::default();
        assert_eq!(s.record_deny(0), 0);
        assert_eq!(s.record_deny(10), 1);
        assert_eq!(s.record_deny(20), 2);
        assert_eq!(s.record_deny(30), 3);
        s.record_allow(40);
        assert_eq!(s.current(40), 2);
        s.record_allow(50);
        assert_eq!(s.current(50), 1);
        assert_eq!(s.current(50 + STREAK_IDLE_RESET_MS), 0);
        assert_eq!(s.record_deny(50 + STREAK_IDLE_RESET_MS), 0);
    }

    #[test]
    fn tracker_is_bounded_and_forgets_idle_keys_first() {
        let tracker = DenyTracker::new(2);
        assert_eq!(tracker.increment(&key("a"), 0), 0);
        assert_eq!(tracker.increment(&key("a"), 1), 1);
        assert_eq!(tracker.increment(&key("b"), 1), 0);
        assert_eq!(tracker.increment(&key("c"), 2), 0, "full of busy keys: untracked");
        assert_eq!(tracker.increment(&key("c"), 3), 0);
        assert_eq!(tracker.len(), 2);
        let later = 2 + STREAK_IDLE_RESET_MS;
        assert_eq!(tracker.increment(&key("c"), later), 0);
        assert_eq!(
            tracker.increment(&key("c"), later),
            1,
            "idle keys were dropped to make room"
        );
        assert_eq!(tracker.decay(&key("c"), later), 1);
        assert_eq!(tracker.decay(&key("c"), later), 0);
        assert!(tracker.is_empty());
        assert_eq!(tracker.decay(&key("zzz"), later), 0);
    }

    #[test]
    fn advisor_answers_the_max_over_failing_requirements_and_backs_off() {
        let advisor = RetryAdvisor::new(no_jitter(), 16, Jitter::seeded(3));
        let conc = LimitDefinition::concurrency(key("c"), 1, 300).unwrap();
        let rpm = LimitDefinition::rolling(key("r"), 1, 1).unwrap();
        assert_eq!(advisor.on_denied([&conc, &rpm], 0), 100);
        assert_eq!(advisor.on_denied([&conc, &rpm], 1), 150);
        assert_eq!(advisor.on_denied([&conc], 2), 200);
        assert_eq!(advisor.on_denied([&conc], 3), 400);
        advisor.on_allowed([conc.key()], 4);
        assert_eq!(advisor.on_denied([&conc], 5), 200);
    }
}
