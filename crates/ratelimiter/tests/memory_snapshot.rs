//! The memory backend's snapshot (issue 15): what a restart keeps. Each test
//! runs one backend, snapshots it, and restores into a second backend, as a
//! new process would, with limits defined (from the registry) in another order
//! than the first had them.

use std::sync::Arc;

use ratelimiter::definition::{LimitDefinition, LimitState};
use ratelimiter::memory::{MemoryBackend, MemoryConfig, MemorySnapshot, SnapshotError};
use ratelimiter::retry::Jitter;
use ratelimiter::wire::{Actual, CompleteRequest, Denial, Requirement, ReserveOutcome, ReserveRequest};
use ratelimiter::{Backend, FakeClock, LeaseId, LimitKey, Limiter, LimiterError};

/// The instant the first backend starts at.
const START_UNIX_MS: u64 = 1_800_000_000_000;

fn key(name: &str) -> LimitKey {
    LimitKey::new(name).unwrap()
}

/// The 600 s rolling limit of 1,000 units and the two-unit concurrency limit
/// with a 10 s timeout of the issue, defined in `order`.
async fn backend(clock: &FakeClock, rolling_first: bool) -> MemoryBackend {
    let backend = MemoryBackend::new(Arc::new(clock.clone()), MemoryConfig::default());
    let tpm = LimitState::active(LimitDefinition::rolling(key("tpm"), 1_000, 600).unwrap());
    let inflight = LimitState::active(LimitDefinition::concurrency(key("inflight"), 2, 10).unwrap());
    let other = LimitState::active(LimitDefinition::rolling(key("other"), 5, 60).unwrap());
    let states = if rolling_first {
        [tpm, inflight, other]
    } else {
        [other, inflight, tpm]
    };
    for state in &states {
        backend.apply_state(state).await.unwrap();
    }
    backend
}

fn request(lease: LeaseId, needs: &[(&str, u64)]) -> ReserveRequest {
    let requirements = needs
        .iter()
        .map(|&(name, amount)| Requirement { key: key(name), amount })
        .collect();
    ReserveRequest::new(lease, None, requirements).unwrap()
}

async fn reserve(backend: &MemoryBackend, lease: LeaseId, needs: &[(&str, u64)]) -> ReserveOutcome {
    backend.reserve(&request(lease, needs)).await.unwrap()
}

async fn in_use(backend: &MemoryBackend, name: &str) -> u64 {
    backend.limit_report(&key(name)).await.unwrap().unwrap().in_use
}

async fn complete(backend: &MemoryBackend, lease: LeaseId, actuals: &[(&str, u64)]) {
    let actuals = actuals
        .iter()
        .map(|&(name, actual_amount)| Actual {
            key: key(name),
            actual_amount,
        })
        .collect();
    backend
        .complete(&CompleteRequest::new(lease, None, actuals).unwrap())
        .await
        .unwrap();
}

/// Through the file format and back, as a restart would.
fn through_bytes(snapshot: &MemorySnapshot) -> MemorySnapshot {
    let decoded = MemorySnapshot::decode(&snapshot.encode()).unwrap();
    assert_eq!(&decoded, snapshot);
    decoded
}

#[tokio::test]
async fn a_restore_keeps_live_units_and_leases_and_drops_ended_holds() {
    let clock = FakeClock::new(START_UNIX_MS);
    let first = backend(&clock, true).await;
    let big = LeaseId::generate();
    assert!(matches!(
        reserve(&first, big, &[("tpm", 700)]).await,
        ReserveOutcome::Allowed { .. }
    ));
    let (a, b) = (LeaseId::generate(), LeaseId::generate());
    reserve(&first, a, &[("inflight", 1)]).await;
    clock.advance_ms(5_000);
    reserve(&first, b, &[("inflight", 1), ("tpm", 100)]).await;
    let snapshot = through_bytes(&first.snapshot());
    assert_eq!(snapshot.leases_len(), 3);

    // The next process starts 6 s later: lease a's 10 s timeout has ended.
    let clock = FakeClock::new(START_UNIX_MS + 11_000);
    let second = backend(&clock, false).await;
    let report = second.restore(&snapshot).unwrap();
    // Lease a ended: remembered as settled rather than live.
    assert_eq!((report.leases_live, report.leases_settled), (2, 1), "{report:?}");
    assert_eq!(
        (in_use(&second, "tpm").await, in_use(&second, "inflight").await),
        (800, 1)
    );
    let over = reserve(&second, LeaseId::generate(), &[("tpm", 201)]).await;
    let ReserveOutcome::Denied(Denial::InsufficientCapacity { retry_after_ms, .. }) = over else {
        panic!("{over:?}")
    };
    // The exact hint from the saved expiry (the grant at the start, plus the
    // 600 s window and its default margin), plus the default rolling jitter.
    let window = LimitDefinition::rolling(LimitKey::new("any").unwrap(), 1, 600).unwrap();
    let expiry_ms = window.hold_with_margin_ms(ratelimiter::WINDOW_MARGIN_MS_DEFAULT);
    let exact_ms = expiry_ms - 11_000;
    assert!(
        (exact_ms..=exact_ms + 50).contains(&retry_after_ms),
        "{retry_after_ms} against {exact_ms}"
    );
    // Complete still reconciles: lease big used 300 of its 700, b released.
    complete(&second, big, &[("tpm", 300)]).await;
    complete(&second, b, &[]).await;
    assert_eq!(
        (in_use(&second, "tpm").await, in_use(&second, "inflight").await),
        (400, 0)
    );
    // The holds end at the instants saved, in wall time.
    clock.advance_ms(expiry_ms - 11_000);
    assert_eq!(in_use(&second, "tpm").await, 100);
    clock.advance_ms(5_000);
    assert_eq!(in_use(&second, "tpm").await, 0);
}

#[tokio::test]
async fn replays_are_answered_as_before_after_a_restore() {
    let clock = FakeClock::new(START_UNIX_MS);
    let first = backend(&clock, true).await;
    let (settled, live, denied) = (LeaseId::generate(), LeaseId::generate(), LeaseId::generate());
    let ReserveOutcome::Allowed { reserved_at_unix_ms } = reserve(&first, settled, &[("tpm", 10), ("other", 1)]).await
    else {
        panic!("allowed")
    };
    complete(&first, settled, &[]).await;
    clock.advance_ms(1);
    reserve(&first, live, &[("inflight", 1)]).await;
    let outcome = reserve(&first, denied, &[("other", 5)]).await;
    assert!(matches!(outcome, ReserveOutcome::Denied(_)), "{outcome:?}");
    let snapshot = through_bytes(&first.snapshot());

    let clock = FakeClock::new(START_UNIX_MS + 2_000);
    let second = backend(&clock, false).await;
    let report = second.restore(&snapshot).unwrap();
    assert_eq!(
        (report.settled_remembered, report.failed_remembered),
        (1, 1),
        "{report:?}"
    );
    // The settled lease: allowed at its time again, reserving nothing, even
    // though the limits have other indices here.
    let before = in_use(&second, "tpm").await;
    let again = reserve(&second, settled, &[("other", 1), ("tpm", 10)]).await;
    assert_eq!(again, ReserveOutcome::Allowed { reserved_at_unix_ms });
    assert_eq!(in_use(&second, "tpm").await, before);
    let other = second.reserve(&request(settled, &[("tpm", 11), ("other", 1)])).await;
    assert!(matches!(other, Err(LimiterError::Conflict(_))), "{other:?}");
    // The live lease answers the same, the denied one stays denied.
    let again = reserve(&second, live, &[("inflight", 1)]).await;
    assert_eq!(
        again,
        ReserveOutcome::Allowed {
            reserved_at_unix_ms: reserved_at_unix_ms + 1
        }
    );
    assert_eq!(in_use(&second, "inflight").await, 1);
    let again = reserve(&second, denied, &[("other", 1)]).await;
    assert_eq!(again, ReserveOutcome::Denied(Denial::LeaseAlreadyFailed));
}

#[tokio::test]
async fn limits_gone_from_the_registry_leave_out_their_holds_and_leases() {
    let clock = FakeClock::new(START_UNIX_MS);
    let first = backend(&clock, true).await;
    reserve(&first, LeaseId::generate(), &[("tpm", 5), ("other", 2)]).await;
    reserve(&first, LeaseId::generate(), &[("tpm", 7)]).await;
    let snapshot = first.snapshot();
    let second = MemoryBackend::new(Arc::new(clock.clone()), MemoryConfig::default());
    let tpm = LimitState::active(LimitDefinition::rolling(key("tpm"), 1_000, 600).unwrap());
    second.apply_state(&tpm).await.unwrap();
    let report = second.restore(&snapshot).unwrap();
    assert_eq!(
        (report.limits_dropped, report.leases_dropped, report.leases_live),
        (2, 1, 1)
    );
    assert_eq!(in_use(&second, "tpm").await, 12, "units held stay held");
}

#[tokio::test]
async fn a_damaged_snapshot_is_rejected_whole() {
    let clock = FakeClock::new(START_UNIX_MS);
    let first = backend(&clock, true).await;
    for n in 0..20 {
        reserve(&first, LeaseId::generate(), &[("tpm", n + 1)]).await;
    }
    let bytes = first.snapshot().encode();
    // A flipped bit anywhere, a truncation, another version, trailing bytes.
    for at in [0, 9, 13, 30, bytes.len() / 2, bytes.len() - 1] {
        let mut flipped = bytes.clone();
        flipped[at] ^= 0x10;
        assert!(MemorySnapshot::decode(&flipped).is_err(), "bit flipped at {at}");
    }
    for len in [0, 10, bytes.len() - 33, bytes.len() - 1] {
        let error = MemorySnapshot::decode(&bytes[..len]).unwrap_err();
        assert!(!error.is_empty(), "truncated to {len}");
    }
    let mut newer = bytes.clone();
    newer[8] = u8::try_from(ratelimiter::memory::SNAPSHOT_FORMAT_VERSION + 1).unwrap();
    let newer_version = format!("version {}", ratelimiter::memory::SNAPSHOT_FORMAT_VERSION + 1);
    assert!(MemorySnapshot::decode(&newer).unwrap_err().contains(&newer_version));
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(MemorySnapshot::decode(&longer).is_err());

    // From a file: the error names it; a missing file is no snapshot.
    let dir = std::env::temp_dir().join(format!("memory-snapshot-test-{}", std::process::id()));
    let path = dir.join("memory-snapshot.bin");
    assert!(MemorySnapshot::read(&path).unwrap().is_none());
    first.snapshot().write_atomic(&path).unwrap();
    assert_eq!(MemorySnapshot::read(&path).unwrap().unwrap().leases_len(), 20);
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let error = MemorySnapshot::read(&path).unwrap_err();
    assert!(matches!(error, SnapshotError::Damaged { .. }), "{error}");
    assert!(error.to_string().contains("memory-snapshot.bin"), "{error}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_restore_needs_a_backend_that_served_nothing() {
    let clock = FakeClock::new(START_UNIX_MS);
    let first = backend(&clock, true).await;
    reserve(&first, LeaseId::generate(), &[("tpm", 1)]).await;
    let snapshot = first.snapshot();
    let error = first.restore(&snapshot).unwrap_err();
    assert!(matches!(error, SnapshotError::NotFresh), "{error}");
    assert_eq!(in_use(&first, "tpm").await, 1, "nothing changed");
}

/// A file whose checksum is right but whose leases hold more than their
/// limits (written by hand, or by a bug): rejected, since restoring it would
/// give back units on Complete that were never held.
#[tokio::test]
async fn a_snapshot_whose_leases_hold_more_than_their_limits_is_rejected() {
    let clock = FakeClock::new(START_UNIX_MS);
    let first = backend(&clock, true).await;
    reserve(&first, LeaseId::generate(), &[("tpm", 7)]).await;
    let mut bytes = first.snapshot().encode();
    // The tpm limit's one hold is the first limit's units: 7 → 6 as u64 LE.
    let limit_units = bytes.windows(8).position(|w| w == 7u64.to_le_bytes()).unwrap();
    bytes[limit_units] = 6;
    let content = bytes.len() - 32;
    let checksum = {
        use sha2::Digest;
        sha2::Sha256::digest(&bytes[..content])
    };
    bytes[content..].copy_from_slice(&checksum);
    let error = MemorySnapshot::decode(&bytes).unwrap_err();
    assert!(error.contains("more than the limit holds"), "{error}");
}

/// The wall clock steps by an hour, forward or back, between the snapshot and
/// the next process (issue 21): the holds still end when the real time they
/// were granted for has passed. Forward, the wall clock alone ended them at
/// once (the whole capacity handed out again: over-admission); back, it kept
/// them an hour longer (capacity idle).
#[tokio::test]
async fn a_wall_clock_step_between_two_processes_moves_no_hold_end() {
    const HOUR_MS: i64 = 3_600_000;
    for step_ms in [HOUR_MS, -HOUR_MS] {
        let clock = FakeClock::new(START_UNIX_MS);
        let first = backend(&clock, true).await;
        reserve(&first, LeaseId::generate(), &[("tpm", 700)]).await;
        let live = LeaseId::generate();
        reserve(&first, live, &[("inflight", 1)]).await;
        let snapshot = through_bytes(&first.snapshot());
        clock.advance_ms(2_000);

        let stepped = clock.after_wall_step(step_ms);
        let second = backend(&stepped, false).await;
        let report = second.restore(&snapshot).unwrap();
        assert_eq!(report.clock_step_ms, step_ms, "{report:?}");
        assert_eq!((report.leases_live, report.units_held), (2, 701), "{report:?}");
        let over = reserve(&second, LeaseId::generate(), &[("tpm", 301)]).await;
        assert!(matches!(over, ReserveOutcome::Denied(_)), "step {step_ms}: {over:?}");
        // The lease completes as before; the rolling hold ends with its window
        // in real time: 600 s and the margin from the grant, not an hour off.
        // A replay is answered with the grant's time as first answered.
        let replay = reserve(&second, live, &[("inflight", 1)]).await;
        assert_eq!(
            replay,
            ReserveOutcome::Allowed {
                reserved_at_unix_ms: START_UNIX_MS
            }
        );
        complete(&second, live, &[]).await;
        assert_eq!(in_use(&second, "inflight").await, 0);
        let window = LimitDefinition::rolling(key("any"), 1, 600).unwrap();
        let expiry_ms = window.hold_with_margin_ms(ratelimiter::WINDOW_MARGIN_MS_DEFAULT);
        stepped.advance_ms(expiry_ms - 2_001);
        assert_eq!(in_use(&second, "tpm").await, 700, "step {step_ms}: ended early");
        stepped.advance_ms(1);
        assert_eq!(in_use(&second, "tpm").await, 0, "step {step_ms}: ended late");
    }
}

/// Without a boot clock to compare (another boot, a version 1 file) the wall
/// clock is all there is: a restore trusts it, as before.
#[tokio::test]
async fn without_a_comparable_boot_clock_a_restore_trusts_the_wall_clock() {
    let clock = FakeClock::new(START_UNIX_MS);
    let first = backend(&clock, true).await;
    reserve(&first, LeaseId::generate(), &[("tpm", 700)]).await;
    let snapshot = first.snapshot();
    let later_micros = (START_UNIX_MS + 5_000) * 1_000;
    assert_eq!(snapshot.clock_step_ms(later_micros, None), 0);
    let other_boot = ratelimiter::BootInstant {
        boot_id: 7,
        since_boot_micros: 1,
    };
    assert_eq!(snapshot.clock_step_ms(later_micros, Some(other_boot)), 0);
}

/// Denial streaks survive a snapshot (issue 21): a contended concurrency
/// key's backoff goes on growing after a restart instead of starting again
/// from the base, which would send every waiting client back at once.
#[tokio::test]
async fn denial_streaks_survive_a_snapshot() {
    let clock = FakeClock::new(START_UNIX_MS);
    let first = backend(&clock, true).await;
    reserve(&first, LeaseId::generate(), &[("inflight", 2)]).await;
    let mut hints = Vec::new();
    for _ in 0..4 {
        let denied = reserve(&first, LeaseId::generate(), &[("inflight", 1)]).await;
        let ReserveOutcome::Denied(Denial::InsufficientCapacity { retry_after_ms, .. }) = denied else {
            panic!("{denied:?}")
        };
        hints.push(retry_after_ms);
    }
    let snapshot = through_bytes(&first.snapshot());
    // Same jitter on both sides, so the hints compare exactly.
    let next_hint = |backend: MemoryBackend| async move {
        match reserve(&backend, LeaseId::generate(), &[("inflight", 1)]).await {
            ReserveOutcome::Denied(Denial::InsufficientCapacity { retry_after_ms, .. }) => retry_after_ms,
            other => panic!("{other:?}"),
        }
    };
    let restored = seeded_backend(&clock).await;
    restored.restore(&snapshot).unwrap();
    let fresh = seeded_backend(&clock).await;
    let held = LeaseId::generate();
    reserve(&fresh, held, &[("inflight", 2)]).await;
    let (after_restore, from_calm) = (next_hint(restored).await, next_hint(fresh).await);
    assert!(
        after_restore > from_calm,
        "a streak of 4 backs off longer ({after_restore} ms) than a calm key ({from_calm} ms); hints before: {hints:?}"
    );
}

/// A budget that owes (`overage: owe`) still owes after a restart, until
/// the window of the bill it could not hold ends: a restart does not admit
/// past it.
#[tokio::test]
async fn a_budget_that_owes_still_owes_after_a_restore() {
    // The quick read of what a limit has available.
    async fn available(backend: &MemoryBackend, name: &str) -> Option<u64> {
        backend.limit_available(&key(name)).await.unwrap()
    }
    let clock = FakeClock::new(START_UNIX_MS);
    let owe = || {
        let definition = LimitDefinition::rolling(key("budget"), 100, 60).unwrap();
        LimitState::active(definition.with_overage(ratelimiter::definition::Overage::Owe))
    };
    let first = MemoryBackend::new(Arc::new(clock.clone()), MemoryConfig::default());
    first.apply_state(&owe()).await.unwrap();
    let (billed, in_flight) = (LeaseId::generate(), LeaseId::generate());
    reserve(&first, billed, &[("budget", 60)]).await;
    reserve(&first, in_flight, &[("budget", 30)]).await;
    complete(&first, billed, &[("budget", 150)]).await;
    complete(&first, in_flight, &[("budget", 0)]).await;
    let snapshot = through_bytes(&first.snapshot());
    let second = MemoryBackend::new(Arc::new(clock.clone()), MemoryConfig::default());
    second.apply_state(&owe()).await.unwrap();
    second.restore(&snapshot).unwrap();
    let report = second.limit_report(&key("budget")).await.unwrap().unwrap();
    assert!(report.owing, "{report:?}");
    // The quick read says what the report says.
    assert_eq!(available(&second, "budget").await, Some(report.available()));
    assert_eq!(available(&second, "budget").await, Some(0), "nothing while it owes");
    assert_eq!(available(&second, "undefined").await, None);
    let denied = reserve(&second, LeaseId::generate(), &[("budget", 1)]).await;
    assert!(
        matches!(denied, ReserveOutcome::Denied(Denial::InsufficientCapacity { .. })),
        "{denied:?}"
    );
    clock.advance_ms(60_000 + 1_000);
    let allowed = reserve(&second, LeaseId::generate(), &[("budget", 1)]).await;
    assert!(matches!(allowed, ReserveOutcome::Allowed { .. }), "{allowed:?}");
    let report = second.limit_report(&key("budget")).await.unwrap().unwrap();
    assert_eq!(available(&second, "budget").await, Some(report.available()));
    assert_eq!(
        report.available(),
        99,
        "the window rolled: the capacity less the one held"
    );
}

/// [`backend`]'s limits with a fixed jitter seed.
async fn seeded_backend(clock: &FakeClock) -> MemoryBackend {
    let backend = MemoryBackend::with_jitter(Arc::new(clock.clone()), MemoryConfig::default(), Jitter::seeded(7));
    let inflight = LimitState::active(LimitDefinition::concurrency(key("inflight"), 2, 10).unwrap());
    backend.apply_state(&inflight).await.unwrap();
    let tpm = LimitState::active(LimitDefinition::rolling(key("tpm"), 1_000, 600).unwrap());
    backend.apply_state(&tpm).await.unwrap();
    backend
}

/// A periodic snapshot reuses one `MemorySnapshot` and copies only the settled
/// leases added since its last copy of a generation (BENCHMARKS.md, "Memory
/// snapshots"): through appends, count rotations (a memory of 8, so a
/// generation of 4) and time rotations, every reused copy must say exactly
/// what a fresh full copy says, on the wire and restored.
#[tokio::test]
async fn a_reused_snapshot_copies_what_settled_since_and_says_what_a_fresh_copy_says() {
    let clock = FakeClock::new(START_UNIX_MS);
    let config = MemoryConfig {
        settled_leases_max: 8,
        ..MemoryConfig::default()
    };
    let backend = MemoryBackend::new(Arc::new(clock.clone()), config);
    let limit = LimitDefinition::rolling(key("rpm"), 1_000_000, 60).unwrap();
    backend.apply_state(&LimitState::active(limit)).await.unwrap();
    let mut reused = MemorySnapshot::empty();
    let mut settled = Vec::new();
    // Rounds of 0 to 6 settlements: some leave a generation half-filled
    // between copies, some fill it and rotate, the long pauses rotate by time.
    for (round, count) in [1, 0, 2, 3, 6, 1, 1, 4, 5, 0, 2, 6, 3].into_iter().enumerate() {
        for _ in 0..count {
            let lease = LeaseId::generate();
            assert!(matches!(
                reserve(&backend, lease, &[("rpm", 1)]).await,
                ReserveOutcome::Allowed { .. }
            ));
            complete(&backend, lease, &[("rpm", 1)]).await;
            settled.push(lease);
            clock.advance_ms(10);
        }
        clock.advance_ms(if round % 4 == 3 { 120_000 } else { 1_000 });
        backend.snapshot_into(&mut reused);
        let fresh = backend.snapshot();
        assert_eq!(reused, fresh, "round {round}");
        assert_eq!(reused.encode(), fresh.encode(), "round {round}");
    }
    // Restored from the reused copy, the last generation's leases are still
    // remembered: a replayed reserve is answered, not granted again.
    let second = MemoryBackend::new(Arc::new(clock.clone()), config);
    let limit = LimitDefinition::rolling(key("rpm"), 1_000_000, 60).unwrap();
    second.apply_state(&LimitState::active(limit)).await.unwrap();
    let report = second.restore(&through_bytes(&reused)).unwrap();
    assert!(report.settled_remembered > 0, "{report:?}");
    let last = *settled.last().unwrap();
    let held = in_use(&second, "rpm").await;
    reserve(&second, last, &[("rpm", 1)]).await;
    assert_eq!(
        in_use(&second, "rpm").await,
        held,
        "a settled lease's replay reserves nothing"
    );
}
