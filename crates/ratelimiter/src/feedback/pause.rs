//! Pausing a model's keys after a provider's 429 (docs/provider-profiles.md,
//! "Learning from the headers"): a [`Pause`] reserves all the free capacity of the
//! keys for the provider's own time, with `hold_ms` (docs/http-api.md), so every
//! caller of the same limiter (every server of a fleet, on a shared backend) is
//! denied until the provider's limit is back, with a retry hint no later than that.
//! The holds end by themselves when the pause does, even if this process dies.
//!
//! Capacity freed during the pause (a Complete that reconciles down, an older hold
//! ending) is held again by [`Paused::rehold`], which [`Paused::run`] calls every
//! [`REHOLD_INTERVAL_MS`]: between two re-holds a caller may take what was freed.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::base::id::LeaseId;
use crate::feedback::provider_headers::ProviderHeaders;
use crate::limiting::limiter::{Backend, Limiter};
use crate::model::definition::LimitKind;
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;
use crate::model::wire::{Actual, CompleteRequest, Denial, Requirement, ReserveOutcome, ReserveRequest, HOLD_MS_MAX};

/// The longest pause: ten minutes. A provider's per-minute limits reset within a
/// minute; a longer hint is a daily limit, better met by its own limit than by
/// holding every key of the model for hours.
pub const PAUSE_MS_MAX: u64 = 600_000;
/// The pause when the provider's 429 names no time: one second, the shortest
/// period providers quantize their limits to (docs/provider-profiles.md).
pub const PAUSE_MS_DEFAULT: u64 = 1_000;
/// The most keys one pause holds: a model has a few (rpm, tpm, input and output
/// tokens, concurrency, sub-windows); as many as one reserve may name.
pub const PAUSE_KEYS_MAX: usize = crate::model::wire::REQUIREMENTS_MAX;
/// How often a running pause holds capacity freed since the last time.
pub const REHOLD_INTERVAL_MS: u64 = 100;
/// The most leases one pause keeps. Probing free capacity makes up to 128 per key
/// and round; past this bound freed capacity is no longer re-held (a warning says
/// so), as a pause must not grow the backend's lease table without end.
pub const PAUSE_LEASES_MAX: usize = 4_096;
/// The most reserves one probe of a key makes: doubling up to 2^64, then halving.
const PROBE_STEPS_MAX: usize = 130;

/// Why a pause cannot be made. Nothing was held.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PauseError {
    /// The duration or the keys break a bound.
    #[error("invalid_request: {0}")]
    Invalid(String),
    /// The limiter refused or failed (an unknown key, the backend down).
    #[error(transparent)]
    Limiter(#[from] LimiterError),
}

/// How long a model's keys are paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pause {
    duration_ms: u64,
}

impl Pause {
    /// A pause of `duration_ms`, 1..=[`PAUSE_MS_MAX`].
    pub fn new(duration_ms: u64) -> Result<Self, PauseError> {
        if duration_ms == 0 || duration_ms > PAUSE_MS_MAX {
            return Err(PauseError::Invalid(format!(
                "a pause lasts 1..={PAUSE_MS_MAX} ms, got {duration_ms}"
            )));
        }
        Ok(Self { duration_ms })
    }

    /// The pause a provider's 429 asks for ([`ProviderHeaders::wait_ms`]: its retry
    /// hint, else its limits' resets), [`PAUSE_MS_DEFAULT`] when it names no time,
    /// at most [`PAUSE_MS_MAX`].
    pub fn after_429(read: &ProviderHeaders) -> Self {
        let duration_ms = read.wait_ms().unwrap_or(PAUSE_MS_DEFAULT).clamp(1, PAUSE_MS_MAX);
        Self { duration_ms }
    }

    /// How long it lasts, in ms.
    pub fn duration_ms(&self) -> u64 {
        self.duration_ms
    }

    /// Holds the free capacity of `keys` on `backend`, read from its reports (one
    /// reserve per key): an in-process backend, or the shared backend of a fleet.
    pub async fn hold(self, backend: Arc<dyn Backend>, keys: &[LimitKey]) -> Result<Paused, PauseError> {
        self.start(Source::Reported(backend), keys).await
    }

    /// Holds the free capacity of `keys` through `limiter`, which reports nothing
    /// (the HTTP client of `ratelimiterd`): each key's free capacity is found by
    /// reserving 1, 2, 4, … units until one is denied, then halving.
    pub async fn hold_with(self, limiter: Arc<dyn Limiter>, keys: &[LimitKey]) -> Result<Paused, PauseError> {
        self.start(Source::Probed(limiter), keys).await
    }

    async fn start(self, source: Source, keys: &[LimitKey]) -> Result<Paused, PauseError> {
        check_keys(keys)?;
        let mut paused = Paused {
            source,
            keys: keys.iter().map(|key| (key.clone(), None)).collect(),
            leases: Vec::new(),
            until: Instant::now() + Duration::from_millis(self.duration_ms),
            warned_full: false,
        };
        if let Err(error) = paused.rehold().await {
            paused.release().await;
            return Err(error.into());
        }
        Ok(paused)
    }
}

fn check_keys(keys: &[LimitKey]) -> Result<(), PauseError> {
    if keys.is_empty() || keys.len() > PAUSE_KEYS_MAX {
        return Err(PauseError::Invalid(format!(
            "a pause holds 1..={PAUSE_KEYS_MAX} keys, got {}",
            keys.len()
        )));
    }
    if let Some(key) = (keys.iter().enumerate()).find_map(|(i, key)| keys[..i].contains(key).then_some(key)) {
        return Err(PauseError::Invalid(format!("key {key} appears more than once")));
    }
    Ok(())
}

/// Where a pause reserves, and how it learns a key's free capacity.
enum Source {
    /// From the backend's report of the key.
    Reported(Arc<dyn Backend>),
    /// By probing: the limiter reports nothing.
    Probed(Arc<dyn Limiter>),
}

impl Source {
    async fn reserve(&self, request: &ReserveRequest) -> Result<ReserveOutcome, LimiterError> {
        match self {
            Source::Reported(backend) => backend.reserve(request).await,
            Source::Probed(limiter) => limiter.reserve(request).await,
        }
    }

    async fn complete(&self, request: &CompleteRequest) -> Result<(), LimiterError> {
        match self {
            Source::Reported(backend) => backend.complete(request).await,
            Source::Probed(limiter) => limiter.complete(request).await,
        }
    }
}

/// A pause in force: the leases that hold the keys' capacity until it ends.
pub struct Paused {
    source: Source,
    /// Each key with its kind, once a report told it.
    keys: Vec<(LimitKey, Option<LimitKind>)>,
    /// Every lease the pause holds, with its key.
    leases: Vec<(LeaseId, usize)>,
    until: Instant,
    warned_full: bool,
}

impl std::fmt::Debug for Paused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Paused")
            .field("keys", &self.keys)
            .field("leases", &self.leases.len())
            .field("left_ms", &self.left_ms())
            .finish()
    }
}

/// What one reserve of a probe came to.
enum Step {
    Held,
    Denied,
    /// The key takes no reservation now (a decrease waits): stop probing it.
    Closed,
}

impl Paused {
    /// The time left, in ms (0 once the pause is over).
    pub fn left_ms(&self) -> u64 {
        let left = self.until.saturating_duration_since(Instant::now());
        u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
    }

    /// The leases the pause holds.
    pub fn leases(&self) -> usize {
        self.leases.len()
    }

    /// Holds the capacity of every key freed since the last call, until the pause
    /// ends; returns the units held by this call. Nothing once the pause is over or
    /// [`PAUSE_LEASES_MAX`] leases are held.
    pub async fn rehold(&mut self) -> Result<u64, LimiterError> {
        let mut held = 0u64;
        for index in 0..self.keys.len() {
            held = held.saturating_add(self.hold_key(index).await?);
        }
        Ok(held)
    }

    /// Holds the free capacity of one key: all of it at once when the backend
    /// reports it, then probes whatever a race left (or all of it, without reports).
    async fn hold_key(&mut self, index: usize) -> Result<u64, LimiterError> {
        let mut held = 0;
        if let Source::Reported(backend) = &self.source {
            let key = &self.keys[index].0;
            let report = backend.limit_report(key).await?;
            let report = report.ok_or_else(|| LimiterError::UnknownKey(key.clone()))?;
            self.keys[index].1 = Some(report.state.definition().kind());
            let free = report.state.definition().capacity().saturating_sub(report.in_use);
            match self.reserve(index, free).await? {
                Some(Step::Held) => return Ok(free),
                // Someone took part of it since the report: probe for the rest.
                Some(Step::Denied) => {}
                Some(Step::Closed) | None => return Ok(0),
            }
        }
        // Doubling from 1 until a denial, then halving: after a denial at `amount`
        // less than `amount` is free, so every later step settles one bit.
        let mut amount = 1u64;
        let mut doubling = true;
        for _ in 0..PROBE_STEPS_MAX {
            if amount == 0 {
                break;
            }
            match self.reserve(index, amount).await? {
                None | Some(Step::Closed) => break,
                Some(Step::Held) => {
                    held += amount;
                    if doubling && amount < u64::MAX / 2 {
                        amount *= 2;
                        continue;
                    }
                }
                Some(Step::Denied) => doubling = false,
            }
            amount /= 2;
        }
        Ok(held)
    }

    /// Reserves `amount` of key `index` until the pause ends, as one lease. `None`
    /// when there is nothing to do: no amount, the pause over, or the leases full.
    async fn reserve(&mut self, index: usize, amount: u64) -> Result<Option<Step>, LimiterError> {
        let hold_ms = self.left_ms().min(HOLD_MS_MAX);
        if amount == 0 || hold_ms == 0 || self.leases_full() {
            return Ok(None);
        }
        let lease = LeaseId::generate();
        let requirement = Requirement {
            key: self.keys[index].0.clone(),
            amount,
        };
        let request = ReserveRequest::new(lease, Some("pause".to_owned()), vec![requirement])
            .and_then(|r| r.with_hold_ms(Some(hold_ms)))
            .map_err(|e| LimiterError::InvalidRequest(e.0))?;
        Ok(Some(match self.source.reserve(&request).await? {
            ReserveOutcome::Allowed { .. } => {
                self.leases.push((lease, index));
                Step::Held
            }
            ReserveOutcome::Denied(Denial::LimitDecreasing { .. }) => Step::Closed,
            ReserveOutcome::Denied(_) => Step::Denied,
        }))
    }

    fn leases_full(&mut self) -> bool {
        let full = self.leases.len() >= PAUSE_LEASES_MAX;
        if full && !self.warned_full {
            self.warned_full = true;
            tracing::warn!(
                leases = self.leases.len(),
                "pause: the lease bound is reached; freed capacity is no longer held"
            );
        }
        full
    }

    /// Re-holds freed capacity every [`REHOLD_INTERVAL_MS`] until the pause ends,
    /// then releases its leases. A failed re-hold is tried again (logged once, not
    /// every 100 ms): the holds already made stand until their end either way.
    pub async fn run(mut self) {
        let mut warned = false;
        loop {
            let left_ms = self.left_ms();
            if left_ms == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(left_ms.min(REHOLD_INTERVAL_MS))).await;
            match self.rehold().await {
                Err(error) if !warned => {
                    warned = true;
                    tracing::warn!(%error, "pause: freed capacity was not held again; retrying every 100 ms");
                }
                _ => {}
            }
        }
        self.release().await;
    }

    /// Ends the pause now: completes every lease, giving its capacity back (a
    /// rolling hold with an actual of 0). A lease that cannot be completed ends
    /// with its hold anyway, no later than the pause would have.
    pub async fn release(mut self) {
        for (lease, index) in std::mem::take(&mut self.leases) {
            let (key, kind) = &self.keys[index];
            let actuals = if *kind == Some(LimitKind::Concurrency) {
                Vec::new()
            } else {
                vec![Actual {
                    key: key.clone(),
                    actual_amount: 0,
                }]
            };
            let Ok(request) = CompleteRequest::new(lease, Some("pause".to_owned()), actuals) else {
                continue;
            };
            let result = match self.source.complete(&request).await {
                // An unreported key whose actual was refused is a concurrency key:
                // it is released without one. Nothing changed on the refusal.
                Err(LimiterError::InvalidRequest(_)) if kind.is_none() => {
                    let bare = CompleteRequest::new(lease, Some("pause".to_owned()), Vec::new());
                    match bare {
                        Ok(bare) => self.source.complete(&bare).await,
                        Err(_) => continue,
                    }
                }
                other => other,
            };
            if let Err(error) = result {
                tracing::warn!(%lease, %error, "pause: a lease was not released; it ends with its hold");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::clock::SystemClock;
    use crate::feedback::provider_headers::read_headers_at;
    use crate::memory::{MemoryBackend, MemoryConfig};
    use crate::model::definition::LimitDefinition;

    async fn backend() -> (Arc<MemoryBackend>, LimitKey, LimitKey) {
        let backend = Arc::new(MemoryBackend::new(
            Arc::new(SystemClock::new()),
            MemoryConfig::default(),
        ));
        let rpm = LimitKey::new("global:llm:openai:gpt-4o:rpm").unwrap();
        let conc = LimitKey::new("global:llm:openai:gpt-4o:concurrency").unwrap();
        backend
            .apply_definition(&LimitDefinition::rolling(rpm.clone(), 1_000, 60).unwrap())
            .await
            .unwrap();
        backend
            .apply_definition(&LimitDefinition::concurrency(conc.clone(), 7, 60).unwrap())
            .await
            .unwrap();
        (backend, rpm, conc)
    }

    async fn take(backend: &MemoryBackend, key: &LimitKey, amount: u64) -> LeaseId {
        let lease = LeaseId::generate();
        let requirement = Requirement {
            key: key.clone(),
            amount,
        };
        let request = ReserveRequest::new(lease, None, vec![requirement]).unwrap();
        assert!(backend.reserve(&request).await.unwrap().is_allowed());
        lease
    }

    async fn in_use(backend: &MemoryBackend, key: &LimitKey) -> u64 {
        backend.limit_report(key).await.unwrap().unwrap().in_use
    }

    #[test]
    fn a_pause_lasts_the_providers_time_within_bounds() {
        let read = |headers: &[(&str, &str)]| Pause::after_429(&read_headers_at(headers.iter().copied(), 0));
        assert_eq!(read(&[("retry-after-ms", "1500")]).duration_ms(), 1_500);
        assert_eq!(read(&[("x-ratelimit-reset-requests", "6m0s")]).duration_ms(), 360_000);
        assert_eq!(read(&[]).duration_ms(), PAUSE_MS_DEFAULT);
        assert_eq!(read(&[("retry-after", "3600")]).duration_ms(), PAUSE_MS_MAX);
        assert_eq!(read(&[("retry-after-ms", "0")]).duration_ms(), 1);
        assert!(Pause::new(0).is_err() && Pause::new(PAUSE_MS_MAX + 1).is_err());
        assert_eq!(Pause::new(PAUSE_MS_MAX).unwrap().duration_ms(), PAUSE_MS_MAX);
    }

    #[tokio::test]
    async fn probing_holds_exactly_the_free_capacity_and_release_gives_it_back() {
        let (backend, rpm, conc) = backend().await;
        let caller = take(&backend, &rpm, 333).await;
        take(&backend, &conc, 2).await;
        let limiter: Arc<dyn Limiter> = backend.clone();
        let mut paused = Pause::new(60_000)
            .unwrap()
            .hold_with(limiter, &[rpm.clone(), conc.clone()])
            .await
            .unwrap();
        assert_eq!(
            (in_use(&backend, &rpm).await, in_use(&backend, &conc).await),
            (1_000, 7)
        );
        let complete = CompleteRequest::new(
            caller,
            None,
            vec![Actual {
                key: rpm.clone(),
                actual_amount: 0,
            }],
        );
        backend.complete(&complete.unwrap()).await.unwrap();
        assert_eq!(in_use(&backend, &rpm).await, 667);
        assert_eq!(paused.rehold().await.unwrap(), 333, "the freed capacity is held again");
        assert_eq!(in_use(&backend, &rpm).await, 1_000);
        assert_eq!(paused.rehold().await.unwrap(), 0);
        paused.release().await;
        assert_eq!((in_use(&backend, &rpm).await, in_use(&backend, &conc).await), (0, 2));
    }

    #[tokio::test]
    async fn a_reported_hold_takes_one_lease_per_key_and_bad_keys_change_nothing() {
        let (backend, rpm, conc) = backend().await;
        take(&backend, &rpm, 10).await;
        let paused = Pause::new(60_000)
            .unwrap()
            .hold(backend.clone(), &[rpm.clone(), conc.clone()])
            .await
            .unwrap();
        assert_eq!(paused.leases(), 2);
        assert_eq!(
            (in_use(&backend, &rpm).await, in_use(&backend, &conc).await),
            (1_000, 7)
        );
        paused.release().await;
        assert_eq!((in_use(&backend, &rpm).await, in_use(&backend, &conc).await), (10, 0));

        let unknown = LimitKey::new("global:llm:openai:gpt-4o:nope").unwrap();
        let error = Pause::new(1_000)
            .unwrap()
            .hold(backend.clone(), &[rpm.clone(), unknown.clone()])
            .await;
        assert_eq!(
            error.unwrap_err(),
            PauseError::Limiter(LimiterError::UnknownKey(unknown))
        );
        assert_eq!(
            in_use(&backend, &rpm).await,
            10,
            "the key held before the error is given back"
        );
        let twice = Pause::new(1_000)
            .unwrap()
            .hold(backend.clone(), &[rpm.clone(), rpm.clone()])
            .await;
        assert!(matches!(twice, Err(PauseError::Invalid(_))));
        assert!(matches!(
            Pause::new(1_000).unwrap().hold(backend.clone(), &[]).await,
            Err(PauseError::Invalid(_))
        ));
        assert_eq!(in_use(&backend, &rpm).await, 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_running_pause_ends_by_itself() {
        let (backend, rpm, _) = backend().await;
        let paused = Pause::new(1_000)
            .unwrap()
            .hold(backend.clone(), std::slice::from_ref(&rpm))
            .await
            .unwrap();
        assert_eq!(in_use(&backend, &rpm).await, 1_000);
        paused.run().await;
        assert_eq!(in_use(&backend, &rpm).await, 0, "released at the end");
    }
}
