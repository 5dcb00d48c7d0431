//! The backend behaviour suite (`ratelimiter::testkit`) on a fleet: two
//! `TigerBeetleBackend`s on one real cluster, every call going to one of the two
//! at random. A fleet must behave as one limiter, so the suite that one backend
//! passes must pass unchanged when reserve, complete and the admin calls of one
//! lease are spread over two servers that share nothing but the cluster.
//!
//! The choice is a seeded rng; the seed is printed first (the test's output is
//! shown when it fails) and a run is repeated with `FLEET_SEED=<seed>`.

#![cfg(feature = "tigerbeetle")]

mod tigerbeetle_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ratelimiter::testkit::{self, Harness};
use ratelimiter::tigerbeetle::{client as tb, SubmitMode, TigerBeetleBackend};
use ratelimiter::{
    Actual, Backend, CompleteRequest, Denial, LeaseId, LimitDefinition, LimitKey, LimitReport, LimitState, Limiter,
    LimiterError, Requirement, ReserveOutcome, ReserveRequest, SystemClock,
};
use tigerbeetle_common::backend_with;

/// How late TigerBeetle may release a pending transfer after its timeout (as in
/// `tigerbeetle_behaviour.rs`): the cluster expires them in the background.
const EXPIRY_SLACK_MS: u64 = 5_000;
/// The `decrease_retry_ms` both servers are built with (`tigerbeetle_common::options`).
const DECREASE_RETRY_MS: u64 = 10_000;
/// Names the seed of the server choices, to replay a failing run.
const SEED_ENV: &str = "FLEET_SEED";

/// Two servers of one fleet seen as one backend: each call goes to one of them,
/// chosen at random.
struct Fleet {
    servers: [Arc<TigerBeetleBackend>; 2],
    rng: Mutex<StdRng>,
}

impl Fleet {
    /// The index of the server of the next call.
    fn pick(&self) -> usize {
        self.rng.lock().expect("rng lock").gen_range(0..self.servers.len())
    }

    /// A server chosen at random.
    fn any(&self) -> &TigerBeetleBackend {
        &self.servers[self.pick()]
    }

    /// Brings every server but `writer` up to date with the definitions log.
    ///
    /// A definition written through one server reaches the others through the
    /// cluster's log, which they read every 200 ms or on an unknown key. A
    /// caller that observes a fleet after changing a definition waits for that
    /// propagation (measured separately, in `ratelimiterd/tests/fleet.rs`); the
    /// suite's scenarios assume a backend serves a definition once it is
    /// applied, so the wrapper waits for it here by reading the log on the
    /// others before returning. This does not hide a stale read of a known key
    /// at any other moment: the periodic refresh is not started here.
    async fn propagate(&self, writer: usize) -> Result<(), LimiterError> {
        for (index, server) in self.servers.iter().enumerate() {
            if index != writer {
                server.refresh_definitions().await?;
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Limiter for Fleet {
    async fn reserve(&self, request: &ReserveRequest) -> Result<ReserveOutcome, LimiterError> {
        self.any().reserve(request).await
    }

    async fn complete(&self, request: &CompleteRequest) -> Result<(), LimiterError> {
        self.any().complete(request).await
    }
}

#[async_trait]
impl Backend for Fleet {
    async fn apply_state(&self, state: &LimitState) -> Result<(), LimiterError> {
        let writer = self.pick();
        self.servers[writer].apply_state(state).await?;
        self.propagate(writer).await
    }

    async fn limit_report(&self, key: &LimitKey) -> Result<Option<LimitReport>, LimiterError> {
        self.any().limit_report(key).await
    }

    async fn limit_reports(&self) -> Result<Vec<LimitReport>, LimiterError> {
        self.any().limit_reports().await
    }

    async fn apply_pending_decreases(&self) -> Result<Vec<LimitState>, LimiterError> {
        let writer = self.pick();
        let changed = self.servers[writer].apply_pending_decreases().await?;
        self.propagate(writer).await?;
        Ok(changed)
    }

    async fn health(&self) -> Result<(), LimiterError> {
        self.any().health().await
    }

    fn keeps_definitions(&self) -> bool {
        true
    }

    async fn refresh_definitions(&self) -> Result<(), LimiterError> {
        for server in &self.servers {
            server.refresh_definitions().await?;
        }
        Ok(())
    }
}

/// Scenarios share the fleet (and cluster); each gets its own key prefix.
struct FleetHarness {
    fleet: Arc<Fleet>,
    run: LeaseId,
    scenarios: AtomicU64,
}

#[async_trait]
impl Harness for FleetHarness {
    async fn backend(&self) -> Arc<dyn Backend> {
        self.fleet.clone()
    }

    fn unique_prefix(&self) -> String {
        format!("fleet:{}:{}", self.run, self.scenarios.fetch_add(1, Ordering::Relaxed))
    }

    async fn advance(&self, ms: u64) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    fn expiry_slack_ms(&self) -> u64 {
        EXPIRY_SLACK_MS
    }

    fn decrease_retry_ms(&self) -> u64 {
        DECREASE_RETRY_MS
    }
}

/// The seed of this run: [`SEED_ENV`] when set, else a random one; printed.
fn seed() -> u64 {
    let seed = match std::env::var(SEED_ENV) {
        Ok(text) => text.trim().parse().expect("FLEET_SEED is a u64"),
        Err(_) => rand::random(),
    };
    println!("fleet server choices: {SEED_ENV}={seed}");
    seed
}

async fn harness(mode: SubmitMode) -> FleetHarness {
    let clock = Arc::new(SystemClock::new());
    let servers = [
        Arc::new(backend_with(mode, clock.clone()).await),
        Arc::new(backend_with(mode, clock).await),
    ];
    FleetHarness {
        fleet: Arc::new(Fleet {
            servers,
            rng: Mutex::new(StdRng::seed_from_u64(seed())),
        }),
        run: LeaseId::generate(),
        scenarios: AtomicU64::new(0),
    }
}

/// Every scenario of `testkit::run_all`, each call to a random server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_two_backends_passes_the_behaviour_suite() {
    let h = harness(SubmitMode::Batching).await;
    testkit::run_all(&h).await;
}

/// Decisions, "Reserve precedence", row 4: a lease id denied for capacity is
/// final, `lease_already_failed`, whatever the retry asks for. One server keeps
/// this with its own memory of denied ids (`denied_leases.rs`); another server
/// has no such memory, and TigerBeetle's `id_already_failed` only covers the
/// very transfer ids that failed (`xfer:reserve:<lease>:<key>`): the lease's
/// denied marker, which opens every chain of the lease, is what refuses the
/// same lease id asking for another key there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_denied_on_one_server_stays_denied_on_another() {
    let clock = Arc::new(SystemClock::new());
    let a = backend_with(SubmitMode::Direct, clock.clone()).await;
    let b = backend_with(SubmitMode::Direct, clock).await;
    let full = LimitKey::new(format!("fleet:denied:{}:full", LeaseId::generate())).unwrap();
    let open = LimitKey::new(format!("fleet:denied:{}:open", LeaseId::generate())).unwrap();
    for key in [&full, &open] {
        let definition = LimitDefinition::rolling(key.clone(), 1, 60).unwrap();
        a.apply_definition(&definition).await.unwrap();
    }
    b.refresh_definitions().await.unwrap();
    let request = |lease, key: &LimitKey| {
        let requirements = vec![Requirement {
            key: key.clone(),
            amount: 1,
        }];
        ReserveRequest::new(lease, None, requirements).unwrap()
    };
    assert!(matches!(
        a.reserve(&request(LeaseId::generate(), &full)).await.unwrap(),
        ReserveOutcome::Allowed { .. }
    ));
    let burnt = LeaseId::generate();
    let denied = a.reserve(&request(burnt, &full)).await.unwrap();
    assert!(
        matches!(denied, ReserveOutcome::Denied(Denial::InsufficientCapacity { .. })),
        "{denied:?}"
    );
    assert_eq!(
        a.reserve(&request(burnt, &open)).await.unwrap(),
        ReserveOutcome::Denied(Denial::LeaseAlreadyFailed),
        "the server that denied it"
    );
    assert_eq!(
        b.reserve(&request(burnt, &open)).await.unwrap(),
        ReserveOutcome::Denied(Denial::LeaseAlreadyFailed),
        "another server of the fleet"
    );
}

/// Issue 21, item 3: racing definitions. Each of many keys is decreasing
/// (100 to 10) when one server raises it again (to 100..=200) while two others
/// carry out pending decreases: the decrease and the new PUT race. In the end
/// every server serves one definition per key, the one of the last PUT, and
/// the cluster's account holds exactly its capacity: none lost (below), none
/// idle (above). A decrease carried out by a server that had not seen the
/// newer PUT used to take the difference away from the new capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_definitions_end_in_one_definition_whose_capacity_the_cluster_holds() {
    const KEYS: usize = 24;
    let clock = Arc::new(SystemClock::new());
    let mut servers = Vec::new();
    for _ in 0..4 {
        servers.push(Arc::new(backend_with(SubmitMode::Batching, clock.clone()).await));
    }
    let run = LeaseId::generate();
    let keys: Vec<LimitKey> = (0..KEYS)
        .map(|i| LimitKey::new(format!("fleet:race:{run}:{i}")).unwrap())
        .collect();
    let definition = |key: &LimitKey, capacity| LimitDefinition::rolling(key.clone(), capacity, 60).unwrap();
    for key in &keys {
        servers[0].apply_definition(&definition(key, 100)).await.unwrap();
        servers[0].apply_definition(&definition(key, 10)).await.unwrap();
    }
    for server in &servers {
        server.refresh_definitions().await.unwrap();
    }
    let mut rng = StdRng::seed_from_u64(seed());
    let mut tasks = tokio::task::JoinSet::new();
    let mut wanted = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let capacity = rng.gen_range(100..=200);
        wanted.push(capacity);
        let (writer, raise) = (servers[2 + i % 2].clone(), definition(key, capacity));
        let pause = Duration::from_micros(rng.gen_range(0..3_000));
        tasks.spawn(async move {
            tokio::time::sleep(pause).await;
            writer.apply_definition(&raise).await.map(|_| ())
        });
    }
    for decreaser in &servers[..2] {
        let decreaser = decreaser.clone();
        tasks.spawn(async move {
            for _ in 0..4 {
                decreaser.apply_pending_decreases().await?;
            }
            Ok(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.unwrap().unwrap();
    }
    // Whatever is still pending (nothing is reserved) is carried out now.
    for server in &servers {
        server.apply_pending_decreases().await.unwrap();
    }
    let client = tb::Client::new(0, tigerbeetle_common::cluster().address()).unwrap();
    let accounts = (keys.iter())
        .map(ratelimiter::tigerbeetle::ids::resource_account_id)
        .collect::<Vec<_>>();
    let accounts = client.lookup_accounts(accounts).await.unwrap();
    for server in &servers {
        server.refresh_definitions().await.unwrap();
    }
    for (i, key) in keys.iter().enumerate() {
        let mut states = Vec::new();
        for server in &servers {
            states.push(server.limit_report(key).await.unwrap().unwrap().state);
        }
        assert!(states.iter().all(|s| s == &states[0]), "{key}: {states:?}");
        let state = &states[0];
        assert_eq!(
            (state.status(), state.definition().capacity()),
            (ratelimiter::LimitStatus::Active, wanted[i]),
            "{key}"
        );
        let account = accounts.iter().find(|a| a.id() == accounts_id(key)).unwrap();
        let held = account.credits_posted() - account.debits_posted();
        assert_eq!(held, u128::from(wanted[i]), "{key}: the account against the definition");
    }
    // The whole capacity is reservable through any server, and no more.
    let reserve = |amount| {
        let requirements = vec![Requirement {
            key: keys[0].clone(),
            amount,
        }];
        ReserveRequest::new(LeaseId::generate(), None, requirements).unwrap()
    };
    assert!(servers[1].reserve(&reserve(wanted[0])).await.unwrap().is_allowed());
    assert!(!servers[2].reserve(&reserve(1)).await.unwrap().is_allowed());
}

fn accounts_id(key: &LimitKey) -> u128 {
    ratelimiter::tigerbeetle::ids::resource_account_id(key)
}

/// The same, when the denied lease's full key is not its first: the first
/// reservation's id is not burnt then, so the denied marker written there is
/// what refuses the lease elsewhere; and a standing denial on another server
/// (an amount above capacity, decided before anything is sent) still comes
/// after the lease's denial (precedence rows 3 and 4), for both shapes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_denied_at_any_index_stays_denied_on_another_server() {
    let clock = Arc::new(SystemClock::new());
    let a = backend_with(SubmitMode::Batching, clock.clone()).await;
    let b = backend_with(SubmitMode::Batching, clock).await;
    let key = |name: &str| LimitKey::new(format!("fleet:denied-at:{}:{name}", LeaseId::generate())).unwrap();
    let (full, open, other) = (key("full"), key("open"), key("other"));
    for k in [&full, &open, &other] {
        a.apply_definition(&LimitDefinition::rolling(k.clone(), 1, 60).unwrap())
            .await
            .unwrap();
    }
    b.refresh_definitions().await.unwrap();
    let request = |lease, keys: &[(&LimitKey, u64)]| {
        let requirements = (keys.iter())
            .map(|(key, amount)| Requirement {
                key: (*key).clone(),
                amount: *amount,
            })
            .collect();
        ReserveRequest::new(lease, None, requirements).unwrap()
    };
    let fill = a.reserve(&request(LeaseId::generate(), &[(&full, 1)])).await.unwrap();
    assert!(matches!(fill, ReserveOutcome::Allowed { .. }), "{fill:?}");
    for shape in [vec![(&open, 1), (&full, 1)], vec![(&full, 1), (&open, 1)]] {
        let burnt = LeaseId::generate();
        let denied = a.reserve(&request(burnt, &shape)).await.unwrap();
        assert!(
            matches!(denied, ReserveOutcome::Denied(Denial::InsufficientCapacity { .. })),
            "{denied:?}"
        );
        assert_eq!(
            b.reserve(&request(burnt, &[(&other, 5)])).await.unwrap(),
            ReserveOutcome::Denied(Denial::LeaseAlreadyFailed),
            "a standing denial on another server, {shape:?}"
        );
        assert_eq!(
            b.reserve(&request(burnt, &[(&other, 1)])).await.unwrap(),
            ReserveOutcome::Denied(Denial::LeaseAlreadyFailed),
            "another key on another server, {shape:?}"
        );
    }
    let report = b.limit_report(&other).await.unwrap().unwrap();
    assert_eq!(report.in_use, 0, "nothing of a denied lease was reserved");
}

/// Issue 21 item 2: Complete is idempotent across a fleet. The first
/// Complete of a lease decides its reconciliation on every server; a later
/// Complete with other actuals, on the same or another server, whether that
/// server holds the lease in its cache or reads it from the cluster, is
/// answered `ok` and changes nothing. Both orders: the reserving server first
/// (with actuals equal to the reservation, which once wrote nothing), and
/// another server first (the reserving one's cache still has the lease open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_complete_of_a_lease_decides_on_every_server() {
    let clock = Arc::new(SystemClock::new());
    let a = backend_with(SubmitMode::Batching, clock.clone()).await;
    let b = backend_with(SubmitMode::Batching, clock).await;
    let key = LimitKey::new(format!("fleet:complete-once:{}", LeaseId::generate())).unwrap();
    a.apply_definition(&LimitDefinition::rolling(key.clone(), 10_000, 60).unwrap())
        .await
        .unwrap();
    b.refresh_definitions().await.unwrap();
    let in_use = || async { a.limit_report(&key).await.unwrap().unwrap().in_use };
    let complete = |lease, actual| {
        let actuals = vec![Actual {
            key: key.clone(),
            actual_amount: actual,
        }];
        CompleteRequest::new(lease, None, actuals).unwrap()
    };
    let reserve = |lease| {
        let requirements = vec![Requirement {
            key: key.clone(),
            amount: 1_000,
        }];
        ReserveRequest::new(lease, None, requirements).unwrap()
    };

    // The reserving server first, actuals equal to the reservation.
    let first = LeaseId::generate();
    assert!(matches!(
        a.reserve(&reserve(first)).await.unwrap(),
        ReserveOutcome::Allowed { .. }
    ));
    a.complete(&complete(first, 1_000)).await.unwrap();
    assert_eq!(in_use().await, 1_000);
    b.complete(&complete(first, 10)).await.unwrap();
    b.complete(&complete(first, 5_000)).await.unwrap();
    a.complete(&complete(first, 0)).await.unwrap();
    assert_eq!(in_use().await, 1_000, "later Completes changed nothing");

    // Another server first: the reserving server's cache still has the lease open.
    let second = LeaseId::generate();
    assert!(matches!(
        a.reserve(&reserve(second)).await.unwrap(),
        ReserveOutcome::Allowed { .. }
    ));
    b.complete(&complete(second, 300)).await.unwrap();
    assert_eq!(in_use().await, 1_300);
    a.complete(&complete(second, 1_000)).await.unwrap();
    a.complete(&complete(second, 2_000)).await.unwrap();
    b.complete(&complete(second, 300)).await.unwrap();
    assert_eq!(in_use().await, 1_300, "the first Complete (300) stands everywhere");
    let counters = (a.counters(), b.counters());
    assert_eq!(counters.0.overage_debt_units + counters.1.overage_debt_units, 0);
}

/// Issue 20 item 2: Completes of many leases this server does not hold, at
/// once, each read back from the cluster (batched lookups by id) and each
/// reconciled exactly: the key's usage is the sum of the actuals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_completes_of_foreign_leases_at_once_are_each_reconciled() {
    let clock = Arc::new(SystemClock::new());
    let a = backend_with(SubmitMode::Batching, clock.clone()).await;
    let b = Arc::new(backend_with(SubmitMode::Batching, clock).await);
    let keys: Vec<LimitKey> = (0..6)
        .map(|i| LimitKey::new(format!("fleet:foreign:{}:{i}", LeaseId::generate())).unwrap())
        .collect();
    for k in &keys {
        a.apply_definition(&LimitDefinition::rolling(k.clone(), 1_000_000, 60).unwrap())
            .await
            .unwrap();
    }
    b.refresh_definitions().await.unwrap();
    // Leases of 1 to 6 requirements: some fit the first lookup, some need a second.
    let mut leases = Vec::new();
    for i in 0..48usize {
        let lease = LeaseId::generate();
        let held = &keys[..1 + i % keys.len()];
        let requirements = (held.iter())
            .map(|k| Requirement {
                key: k.clone(),
                amount: 100,
            })
            .collect();
        let request = ReserveRequest::new(lease, None, requirements).unwrap();
        assert!(matches!(
            a.reserve(&request).await.unwrap(),
            ReserveOutcome::Allowed { .. }
        ));
        leases.push((lease, held.to_vec(), (i % 7) as u64 * 10));
    }
    let tasks: Vec<_> = (leases.iter().cloned())
        .map(|(lease, held, actual)| {
            let b = Arc::clone(&b);
            tokio::spawn(async move {
                let actuals = (held.iter())
                    .map(|k| Actual {
                        key: k.clone(),
                        actual_amount: actual,
                    })
                    .collect();
                b.complete(&CompleteRequest::new(lease, None, actuals).unwrap()).await
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    for (i, k) in keys.iter().enumerate() {
        let expected: u64 = (leases.iter())
            .filter(|(_, held, _)| held.len() > i)
            .map(|(_, _, actual)| actual)
            .sum();
        assert_eq!(a.limit_report(k).await.unwrap().unwrap().in_use, expected, "key {i}");
    }
    let counters = b.counters();
    assert_eq!(counters.completes_from_cluster, leases.len() as u64);
    // Started together, the lookups share requests: the first goes out
    // alone, the rest queue behind it and leave together (a cluster round
    // trip is milliseconds; spawning 48 tasks, microseconds).
    assert!(
        counters.lease_lookup_requests < counters.lease_lookups,
        "{} lookups took {} requests",
        counters.lease_lookups,
        counters.lease_lookup_requests
    );
}

/// Issue 19, item 4: a pause after a provider's 429 made on server A (through the
/// probing `hold_with`, as a remote caller makes it) holds on server B, which
/// denies with a hint no later than about the pause's end rather than the
/// key's minute; and it ends by itself, with nobody releasing it (the process
/// that made it may be gone), long before the key's window would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_made_on_one_server_holds_on_another_and_ends_by_itself() {
    const PAUSE_MS: u64 = 1_500;
    let clock = Arc::new(SystemClock::new());
    let a = Arc::new(backend_with(SubmitMode::Direct, clock.clone()).await);
    let b = backend_with(SubmitMode::Direct, clock).await;
    let rpm = LimitKey::new(format!("fleet:pause:{}:rpm", LeaseId::generate())).unwrap();
    a.apply_definition(&LimitDefinition::rolling(rpm.clone(), 40, 60).unwrap())
        .await
        .unwrap();
    b.refresh_definitions().await.unwrap();
    let request = |amount| {
        let requirements = vec![Requirement {
            key: rpm.clone(),
            amount,
        }];
        ReserveRequest::new(LeaseId::generate(), None, requirements).unwrap()
    };
    assert!(
        b.reserve(&request(3)).await.unwrap().is_allowed(),
        "a call before the pause"
    );
    let pause = ratelimiter::pause::Pause::new(PAUSE_MS).unwrap();
    let limiter: Arc<dyn Limiter> = a.clone();
    let paused = pause.hold_with(limiter, std::slice::from_ref(&rpm)).await.unwrap();
    assert_eq!(
        b.limit_report(&rpm).await.unwrap().unwrap().in_use,
        40,
        "all of it held"
    );
    match b.reserve(&request(1)).await.unwrap() {
        ReserveOutcome::Denied(Denial::InsufficientCapacity { retry_after_ms, .. }) => {
            assert!(
                retry_after_ms <= PAUSE_MS,
                "B's hint {retry_after_ms} ms, not the minute"
            );
        }
        other => panic!("B during the pause: {other:?}"),
    }
    // Nobody releases the pause: its holds time out by themselves, whole
    // seconds after they were made (2 s for 1.5 s), plus the cluster's lag.
    drop(paused);
    let deadline = std::time::Instant::now() + Duration::from_millis(PAUSE_MS + EXPIRY_SLACK_MS);
    loop {
        let in_use = b.limit_report(&rpm).await.unwrap().unwrap().in_use;
        if in_use == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "B still holds {in_use} after the pause"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(b.reserve(&request(37)).await.unwrap().is_allowed(), "B after the pause");
}

/// A fleet mid-upgrade: a server that names itself writes its records' authors
/// on a ledger of their own, so the definition log holds exactly what a reader
/// of an older version reads (format 1 records, nothing else): read whole by the
/// log's decoder, every record decodes and the new definition is there; the
/// servers' ledger names the writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_of_the_log_alone_reads_every_record_of_a_server_that_names_itself() {
    use ratelimiter::tigerbeetle::definition_log::{DefinitionView, LEDGER_DEFINITIONS, QUERY_TRANSFERS_MAX};
    use ratelimiter::tigerbeetle::server_log::{CODE_AUTHOR, LEDGER_SERVERS};

    let named = backend_with(SubmitMode::Batching, Arc::new(ratelimiter::SystemClock::new())).await;
    named.name_server("host-new", "127.0.0.1:18080").unwrap();
    named.announce_if_due().await;
    let key = LimitKey::new(format!("test:upgrade:{}", LeaseId::generate())).unwrap();
    named
        .apply_definition(&LimitDefinition::rolling(key.clone(), 42, 60).unwrap())
        .await
        .unwrap();
    let client = tb::Client::new(0, tigerbeetle_common::cluster().address()).unwrap();
    let read_ledger = |ledger: u32| {
        let client = &client;
        async move {
            let mut all = Vec::new();
            loop {
                let mut filter = tb::QueryFilter::new(QUERY_TRANSFERS_MAX).with_ledger(ledger);
                filter.as_raw_mut().timestamp_min = all.last().map_or(0, |t: &tb::Transfer| t.as_raw().timestamp) + 1;
                let page = client.query_transfers(Box::new(filter)).await.unwrap();
                let done = page.len() < QUERY_TRANSFERS_MAX as usize;
                all.extend(page);
                if done {
                    return all;
                }
            }
        }
    };
    let log = read_ledger(LEDGER_DEFINITIONS).await;
    assert!(
        log.iter().all(|t| t.code() != CODE_AUTHOR),
        "no author on the log's ledger"
    );
    let mut reader = DefinitionView::default();
    reader.consume(&log);
    assert_eq!(reader.malformed_total(), 0, "every record decodes as format 1");
    assert_eq!(reader.get(&key).map(|v| v.state.definition().capacity()), Some(42));
    let servers = read_ledger(LEDGER_SERVERS).await;
    assert!(
        servers.iter().any(|t| t.code() == CODE_AUTHOR),
        "the record's author, on its own ledger"
    );
    let listed = named.read_servers().await.unwrap();
    let me = listed
        .iter()
        .find(|s| s.address == "127.0.0.1:18080")
        .expect("the writer is listed");
    assert!(me.records_written >= 1, "{me:?}");
}
