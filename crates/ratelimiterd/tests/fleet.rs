//! Fleet mode with the real binary: several `ratelimiterd` processes, each with
//! its own empty data directory, on one real TigerBeetle cluster, behave as one
//! limiter. A lease reserved on one server is completed on another; a definition
//! made on one is served by the others within a second; a decrease is carried
//! out once although every server runs the periodic task; and a soak across the
//! servers, one of them SIGKILLed, never over-admits and answers every call
//! through failover. Every wait is a bounded poll.

#![cfg(feature = "tigerbeetle")]

mod fleet_support;
mod support;

#[allow(dead_code)]
#[path = "../examples/soak/engine/checker.rs"]
mod checker;
#[allow(dead_code)]
#[path = "../examples/soak/engine/record.rs"]
mod record;

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ratelimiter::httpclient::{HttpClient, HttpClientConfig};
use ratelimiter::{Denial, LeaseId, LimitDefinition, LimitKey, LimitKind, LimitStatus, Limiter, ReserveOutcome};
use serde_json::{json, Value};
use support::{raw, temp_dir, Daemon, ADMIN_TOKEN, CLIENT_TOKEN};

use fleet_support::{
    complete_request, concurrency, metric, report, reserve, reserve_request, rolling, start, unique_key, wait_until,
    FAST_DECREASES, NO_DECREASES, PROPAGATION_MAX, SERIAL, WAIT_MAX,
};
use record::{now_ms, CapacityChange, Completion, Grant, LimitSpec, Records};

/// A lease reserved on A and completed on B, which never saw it: B reads the
/// lease's transfers back from the cluster, releases the concurrency hold at
/// once (not after its 300 s timeout) and reconciles the rolling limit to the
/// actual, as A would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_reserved_on_one_server_is_completed_on_another() {
    let _serial = SERIAL.lock().await;
    let (dir_a, dir_b) = (temp_dir("fleet-complete-a"), temp_dir("fleet-complete-b"));
    let a = start(&dir_a, NO_DECREASES).await;
    let b = start(&dir_b, NO_DECREASES).await;
    let prefix = LeaseId::generate().to_string();
    let slots = unique_key(&prefix, "slots");
    let tokens = unique_key(&prefix, "tokens");
    const SLOTS: u64 = 2;
    let admin = a.client(ADMIN_TOKEN);
    admin.put_limit(&concurrency(&slots, SLOTS, 300)).await.unwrap();
    admin.put_limit(&rolling(&tokens, 1_000, 60)).await.unwrap();

    let (lease, outcome) = reserve(&a, &[(&slots, SLOTS), (&tokens, 500)]).await;
    assert!(outcome.is_allowed(), "{outcome:?}");
    let (_, held) = reserve(&b, &[(&slots, 1)]).await;
    assert!(
        matches!(held, ReserveOutcome::Denied(Denial::InsufficientCapacity { .. })),
        "the hold is taken on B too: {held:?}"
    );
    let from_cluster_before = metric(&b, "ratelimiterd_tigerbeetle_completes_from_cluster_total");

    b.client(CLIENT_TOKEN)
        .complete(&complete_request(lease, &[(&tokens, 10)]))
        .await
        .expect("complete on B");
    let (again, outcome) = reserve(&a, &[(&slots, SLOTS)]).await;
    assert!(outcome.is_allowed(), "the whole capacity is free at once: {outcome:?}");
    for server in [&a, &b] {
        let tokens_report = report(server, &tokens).await;
        assert_eq!(
            tokens_report.in_use,
            10,
            "reconciled to the actual, on {}",
            server.url()
        );
    }
    let from_cluster = metric(&b, "ratelimiterd_tigerbeetle_completes_from_cluster_total");
    assert!(
        from_cluster >= from_cluster_before + 1.0,
        "B completed from the cluster: {from_cluster_before} -> {from_cluster}"
    );
    a.client(CLIENT_TOKEN)
        .complete(&complete_request(again, &[]))
        .await
        .unwrap();
}

/// A bucket defined over HTTP on A is one bucket for the fleet
/// (docs/tigerbeetle-backend.md, "Buckets"): B reads its kind from the log,
/// denies what A's burst took with the time to the next refill, and a lease
/// taken on A and completed on B gives its unused units back to both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_is_one_bucket_for_the_fleet_and_refunds_on_any_server() {
    let _serial = SERIAL.lock().await;
    let (dir_a, dir_b) = (temp_dir("fleet-bucket-a"), temp_dir("fleet-bucket-b"));
    let a = start(&dir_a, NO_DECREASES).await;
    let b = start(&dir_b, NO_DECREASES).await;
    let otpm = unique_key(&LeaseId::generate().to_string(), "otpm");
    // A month's window: its 12.4 h slots pass no boundary during the test.
    const WINDOW_SECONDS: u64 = 2_678_400;
    let definition = LimitDefinition::bucket(otpm.clone(), WINDOW_SECONDS, WINDOW_SECONDS)
        .and_then(|d| d.with_window_margin_ms(Some(0)))
        .expect("valid definition");
    a.client(ADMIN_TOKEN).put_limit(&definition).await.unwrap();
    let shape = ratelimiter::bucket::BucketShape::new(&definition, 0).unwrap();
    let (lease, outcome) = reserve(&a, &[(&otpm, shape.burst())]).await;
    assert!(outcome.is_allowed(), "{outcome:?}");
    let (_, denied) = reserve(&b, &[(&otpm, 1_000)]).await;
    match denied {
        ReserveOutcome::Denied(Denial::InsufficientCapacity { retry_after_ms, .. }) => assert!(
            (1..=shape.slot_ms() + 1_000).contains(&retry_after_ms),
            "at most until the next boundary: {retry_after_ms} ms"
        ),
        other => panic!("the burst is taken on B too: {other:?}"),
    }
    assert_eq!(report(&b, &otpm).await.state.definition().kind(), LimitKind::Bucket);
    b.client(CLIENT_TOKEN)
        .complete(&complete_request(lease, &[(&otpm, shape.burst() - 5_000)]))
        .await
        .expect("complete on B");
    for server in [&a, &b] {
        assert_eq!(
            report(server, &otpm).await.in_use,
            shape.burst() - 5_000,
            "on {}",
            server.url()
        );
    }
    assert!(reserve(&a, &[(&otpm, 5_000)]).await.1.is_allowed(), "the refund");
    assert!(!reserve(&b, &[(&otpm, 1)]).await.1.is_allowed(), "and no more");
}

/// A definition made on A reaches B through the cluster's log: a new key is
/// served by B at once (B reads the log on an unknown key), a new key shows in
/// B's list and a capacity increase is served by B within [`PROPAGATION_MAX`]
/// (the periodic read), and a server started later with an empty data
/// directory serves every limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_made_on_one_server_are_served_by_every_other_within_a_second() {
    let _serial = SERIAL.lock().await;
    let (dir_a, dir_b, dir_c) = (
        temp_dir("fleet-defs-a"),
        temp_dir("fleet-defs-b"),
        temp_dir("fleet-defs-c"),
    );
    let a = start(&dir_a, NO_DECREASES).await;
    let b = start(&dir_b, NO_DECREASES).await;
    let prefix = LeaseId::generate().to_string();
    let admin_a = a.client(ADMIN_TOKEN);
    let admin_b = b.client(ADMIN_TOKEN);

    // Unknown to B: served at once, no 404, no poll.
    let fresh = unique_key(&prefix, "fresh");
    admin_a.put_limit(&rolling(&fresh, 2, 60)).await.unwrap();
    let started = Instant::now();
    let (_, outcome) = reserve(&b, &[(&fresh, 1)]).await;
    let first_use = started.elapsed();
    assert!(outcome.is_allowed(), "{outcome:?}");
    println!("a new key, first reserve on B: {first_use:?}");

    // A new key, seen in B's list (which does not read the log on demand).
    let listed = unique_key(&prefix, "listed");
    admin_a.put_limit(&rolling(&listed, 7, 60)).await.unwrap();
    let listed_after = wait_until("the new key in B's list", || async {
        let limits = admin_b.limits().await.expect("GET /v1/admin/limits on B");
        limits.iter().any(|r| r.state.definition().key() == &listed)
    })
    .await;
    println!("a new key in B's GET /v1/admin/limits: {listed_after:?}");
    assert!(listed_after < PROPAGATION_MAX, "new key listed after {listed_after:?}");

    // A capacity increase of a key B knows and has filled. B serves more than
    // the old capacity only once it has read the new definition: a larger
    // amount is `exceeds_capacity` (no hold, no burnt id) until then. (A unit
    // would be granted at once: the cluster's account is funded by the PUT.)
    assert!(reserve(&b, &[(&fresh, 1)]).await.1.is_allowed());
    let (_, full) = reserve(&b, &[(&fresh, 1)]).await;
    assert!(!full.is_allowed(), "full at 2: {full:?}");
    admin_a.put_limit(&rolling(&fresh, 5, 60)).await.unwrap();
    let increased_after = wait_until("the increase served by B", || async {
        reserve(&b, &[(&fresh, 3)]).await.1.is_allowed()
    })
    .await;
    println!("a capacity increase, 3 units above the old capacity served by B: {increased_after:?}");
    assert!(
        increased_after < PROPAGATION_MAX,
        "increase served after {increased_after:?}"
    );
    assert_eq!(report(&b, &fresh).await.state.definition().capacity(), 5);

    // A server that joins later knows every limit from the cluster alone.
    let c = start(&dir_c, NO_DECREASES).await;
    let limits = c.client(ADMIN_TOKEN).limits().await.expect("GET /v1/admin/limits on C");
    let capacity_of = |key: &LimitKey| {
        limits
            .iter()
            .find(|r| r.state.definition().key() == key)
            .map(|r| (r.state.definition().capacity(), r.in_use))
    };
    assert_eq!(
        capacity_of(&fresh),
        Some((5, 5)),
        "C lists the increased limit and its usage"
    );
    assert_eq!(capacity_of(&listed), Some((7, 0)));
    assert!(reserve(&c, &[(&listed, 7)]).await.1.is_allowed());
    let (_, full) = reserve(&c, &[(&fresh, 1)]).await;
    assert!(
        matches!(full, ReserveOutcome::Denied(Denial::InsufficientCapacity { .. })),
        "C counts the fleet's usage: {full:?}"
    );
}

/// The wire answer of a reserve of `amount` of `key` on `server`: the `error`.
fn raw_reserve_error(server: &Daemon, key: &LimitKey, amount: u64) -> String {
    let body = json!({
        "lease_id": LeaseId::generate().to_string(),
        "requirements": [{"key": key.to_string(), "amount": amount}],
    });
    let answer = raw::request(
        server.addr,
        "POST",
        "/v1/reserve",
        Some(CLIENT_TOKEN),
        body.to_string().as_bytes(),
    );
    let value: Value = answer.value();
    assert_eq!(answer.status, 200, "{value}");
    value["error"].as_str().unwrap_or_default().to_owned()
}

/// A decrease started on A while A and B both try pending decreases every
/// 100 ms: both deny `limit_decreasing` while it waits, it is carried out once
/// (exactly the target can be reserved afterwards: the resource account was
/// not defunded twice), and both report it active at the new capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decrease_is_carried_out_once_by_a_fleet() {
    let _serial = SERIAL.lock().await;
    let (dir_a, dir_b) = (temp_dir("fleet-decrease-a"), temp_dir("fleet-decrease-b"));
    let a = start(&dir_a, FAST_DECREASES).await;
    let b = start(&dir_b, FAST_DECREASES).await;
    let prefix = LeaseId::generate().to_string();
    let key = unique_key(&prefix, "slots");
    const BEFORE: u64 = 10;
    const HELD: u64 = 6;
    const TARGET: u64 = 4;
    let admin_a = a.client(ADMIN_TOKEN);
    admin_a.put_limit(&concurrency(&key, BEFORE, 300)).await.unwrap();
    let (held, outcome) = reserve(&b, &[(&key, HELD)]).await;
    assert!(outcome.is_allowed(), "{outcome:?}");

    let started = admin_a.put_limit(&concurrency(&key, TARGET, 300)).await.unwrap();
    assert_eq!(
        (started.state.status(), started.state.pending_decrease_to()),
        (LimitStatus::Decreasing, TARGET),
        "held {HELD} > {TARGET}: the decrease waits"
    );
    let seen_by_b = wait_until("B sees the decrease", || async {
        report(&b, &key).await.state.status() == LimitStatus::Decreasing
    })
    .await;
    println!("a decrease started on A, seen by B: {seen_by_b:?}");
    assert!(seen_by_b < PROPAGATION_MAX, "decrease seen after {seen_by_b:?}");
    for server in [&a, &b] {
        assert_eq!(
            raw_reserve_error(server, &key, 1),
            format!("limit_decreasing:{key}"),
            "pending on {}",
            server.url()
        );
    }

    // The hold goes; either server may now carry out the decrease, once.
    a.client(CLIENT_TOKEN)
        .complete(&complete_request(held, &[]))
        .await
        .unwrap();
    for server in [&a, &b] {
        wait_until("the decrease carried out", || async {
            report(server, &key).await.state.status() == LimitStatus::Active
        })
        .await;
        let after = report(server, &key).await;
        assert_eq!(
            (
                after.state.definition().capacity(),
                after.state.pending_decrease_to(),
                after.in_use
            ),
            (TARGET, 0, 0),
            "on {}",
            server.url()
        );
    }
    // Exactly the target fits: one unit at a time, on alternating servers.
    let mut leases = Vec::new();
    for unit in 0..TARGET {
        let server = if unit % 2 == 0 { &a } else { &b };
        let (lease, outcome) = reserve(server, &[(&key, 1)]).await;
        assert!(outcome.is_allowed(), "unit {unit} of {TARGET}: {outcome:?}");
        leases.push(lease);
    }
    for server in [&a, &b] {
        let (_, over) = reserve(server, &[(&key, 1)]).await;
        assert!(
            matches!(over, ReserveOutcome::Denied(Denial::InsufficientCapacity { .. })),
            "unit {} on {}: {over:?}",
            TARGET + 1,
            server.url()
        );
    }
    for lease in leases {
        b.client(CLIENT_TOKEN)
            .complete(&complete_request(lease, &[]))
            .await
            .unwrap();
    }
}

/// Servers in the soak: one is killed, two carry on.
const SOAK_SERVERS: usize = 3;
/// Client tasks, each with its own fleet client, in its own server order.
const SOAK_CLIENTS: usize = 6;
/// How long clients keep sending.
const SOAK_RUN: Duration = Duration::from_secs(12);
/// When the first server is SIGKILLed: a third of the run, so there is load on
/// it before and failover after.
const SOAK_KILL_AT: Duration = Duration::from_secs(4);
/// The most reserves one client sends, whatever the speed of the machine.
const SOAK_RESERVES_MAX: usize = 300;
/// The rolling limit: small enough that clients keep it full, a window short
/// enough to roll several times in a run.
const SOAK_ROLLING_CAPACITY: u64 = 40;
const SOAK_ROLLING_WINDOW_SECONDS: u64 = 2;
/// The concurrency limit: fewer slots than clients.
const SOAK_SLOTS: u64 = 3;
/// A hold's timeout; holds are completed long before it.
const SOAK_SLOT_TIMEOUT_SECONDS: u64 = 30;
/// Retries of one call across the servers: more than enough to walk past the
/// dead server and back, bounded by the client's own limit of 10.
const SOAK_RETRIES: u32 = 6;

/// What one client task saw.
#[derive(Default)]
struct ClientLog {
    grants: Vec<Grant>,
    completions: Vec<Completion>,
    denials: u64,
    /// Calls that ended in an error after every retry: a fleet must answer each.
    failures: Vec<String>,
}

/// One client: reserve a unit of the slots and 1–3 of the rolling limit, hold
/// it a little, complete it with an actual at most what it reserved.
async fn soak_client(client: HttpClient, keys: [LimitKey; 2], seed: u64, until: Instant) -> ClientLog {
    let [tokens, slots] = keys;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut log = ClientLog::default();
    for _ in 0..SOAK_RESERVES_MAX {
        if Instant::now() >= until {
            break;
        }
        let lease = LeaseId::generate();
        let amount = rng.gen_range(1..=3);
        let request = reserve_request(lease, &[(&tokens, amount), (&slots, 1)]);
        match client.reserve(&request).await {
            Ok(ReserveOutcome::Allowed { reserved_at_unix_ms }) => {
                log.grants.push(Grant {
                    lease,
                    reserved_at_ms: reserved_at_unix_ms,
                    answered_ms: now_ms(),
                    requirements: vec![(0, amount), (1, 1)],
                });
                tokio::time::sleep(Duration::from_millis(rng.gen_range(0..40))).await;
                let actual = rng.gen_range(0..=amount);
                let sent_ms = now_ms();
                match client.complete(&complete_request(lease, &[(&tokens, actual)])).await {
                    Ok(()) => log.completions.push(Completion {
                        lease,
                        sent_ms,
                        actuals: vec![(0, actual)],
                    }),
                    Err(e) => log.failures.push(format!("complete {lease}: {e}")),
                }
            }
            Ok(ReserveOutcome::Denied(_)) => {
                log.denials += 1;
                tokio::time::sleep(Duration::from_millis(rng.gen_range(5..30))).await;
            }
            Err(e) => log.failures.push(format!("reserve {lease}: {e}")),
        }
    }
    log
}

/// Clients on a fleet client each, reserving on three servers; the first server
/// is SIGKILLed a third of the way. Nothing is over-admitted (the soak's
/// checker, from every grant and complete, across all servers), and every call
/// gets a definitive answer through failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_across_servers_with_one_killed_never_over_admits() {
    let _serial = SERIAL.lock().await;
    let dirs: Vec<_> = (0..SOAK_SERVERS)
        .map(|i| temp_dir(&format!("fleet-soak-{i}")))
        .collect();
    let mut servers = Vec::new();
    for dir in &dirs {
        servers.push(start(dir, NO_DECREASES).await);
    }
    let urls: Vec<String> = servers.iter().map(Daemon::url).collect();
    let seed: u64 = rand::random();
    println!("soak seed {seed}");
    let prefix = format!("soak:{seed:x}");
    let tokens = unique_key(&prefix, "tokens");
    let slots = unique_key(&prefix, "slots");
    let mut records = Records::default();
    let admin = servers[1].client(ADMIN_TOKEN);
    for (index, definition) in [
        rolling(&tokens, SOAK_ROLLING_CAPACITY, SOAK_ROLLING_WINDOW_SECONDS),
        concurrency(&slots, SOAK_SLOTS, SOAK_SLOT_TIMEOUT_SECONDS),
    ]
    .into_iter()
    .enumerate()
    {
        let sent_ms = now_ms();
        let answered = admin.put_limit(&definition).await.unwrap();
        records.changes.push(CapacityChange {
            limit: index,
            sent_ms,
            answered_ms: now_ms(),
            capacity: answered.state.definition().capacity(),
            pending_decrease_to: 0,
            unknown: false,
        });
    }
    let limits = vec![
        LimitSpec {
            key: tokens.to_string(),
            kind: LimitKind::Rolling,
            hold_ms: SOAK_ROLLING_WINDOW_SECONDS * 1000,
        },
        LimitSpec {
            key: slots.to_string(),
            kind: LimitKind::Concurrency,
            hold_ms: SOAK_SLOT_TIMEOUT_SECONDS * 1000,
        },
    ];

    let started = Instant::now();
    let until = started + SOAK_RUN;
    let mut tasks = Vec::new();
    for client_index in 0..SOAK_CLIENTS {
        // Every server is some clients' first choice, the one that dies included.
        let mut order = urls.clone();
        order.rotate_left(client_index % SOAK_SERVERS);
        let client = HttpClient::new(HttpClientConfig {
            token: Some(CLIENT_TOKEN.to_owned()),
            retries_max: SOAK_RETRIES,
            retry_wait_ms_max: 200,
            ..HttpClientConfig::fleet(order)
        })
        .expect("fleet client");
        let keys = [tokens.clone(), slots.clone()];
        tasks.push(tokio::spawn(soak_client(
            client,
            keys,
            seed.wrapping_add(client_index as u64),
            until,
        )));
    }
    tokio::time::sleep_until((started + SOAK_KILL_AT).into()).await;
    let killed = servers[0].url();
    servers[0].kill9();
    let killed_at_ms = now_ms();
    println!("killed {killed} at {:?}", started.elapsed());

    let mut failures = Vec::new();
    let mut denials = 0;
    for task in tasks {
        let log = tokio::time::timeout(SOAK_RUN + WAIT_MAX, task)
            .await
            .expect("a client outlived its bound")
            .expect("client task");
        records.grants.extend(log.grants);
        records.completions.extend(log.completions);
        failures.extend(log.failures);
        denials += log.denials;
    }
    let verdict = checker::check(&limits, &records);
    println!(
        "{} grants, {} completes, {denials} denials, {} failures in {:?}",
        records.grants.len(),
        records.completions.len(),
        failures.len(),
        started.elapsed()
    );
    for summary in &verdict.limits {
        println!(
            "{}: {} grants, peak {}/{} held",
            summary.key, summary.grants, summary.peak_held, summary.peak_capacity
        );
    }
    assert!(failures.is_empty(), "calls without an answer: {failures:#?}");
    assert!(
        verdict.holds(),
        "over-admission: {:#?} {:#?}",
        verdict.violations,
        verdict.anomalies
    );
    // The run pushed its limits and used the fleet after the kill, or it says little.
    assert!(denials > 0, "no denial: the limits were never full");
    assert!(
        records.grants.iter().any(|g| g.answered_ms > killed_at_ms),
        "nothing granted after the kill"
    );
    for server in &servers[1..] {
        let in_use = report(server, &slots).await.in_use;
        assert_eq!(in_use, 0, "every slot released, on {}", server.url());
    }
}

/// `server`'s view of the fleet's servers (`GET /v1/admin/servers`): per
/// address, (starts, records written).
fn servers_seen(server: &Daemon) -> std::collections::HashMap<String, (u64, u64)> {
    let answer = raw::request(server.addr, "GET", "/v1/admin/servers", Some(ADMIN_TOKEN), b"");
    assert_eq!(answer.status, 200, "{}", answer.text());
    let body = answer.value();
    (body["servers"].as_array().expect("a list on TigerBeetle").iter())
        .map(|s| {
            let count = |field: &str| s[field].as_u64().unwrap();
            (
                s["address"].as_str().unwrap().to_owned(),
                (count("starts"), count("records_written")),
            )
        })
        .collect()
}

/// Each server names itself in the cluster when it starts, and each definition
/// record names its writer, on a ledger of its own: every server lists both,
/// with the records each wrote, and the definitions still reach every server
/// (a reader of the log never meets the writers' transfers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_server_lists_the_fleet_and_who_wrote_each_definition() {
    let _serial = SERIAL.lock().await;
    let (dir_a, dir_b) = (temp_dir("fleet-servers-a"), temp_dir("fleet-servers-b"));
    let a = start(&dir_a, NO_DECREASES).await;
    let b = start(&dir_b, NO_DECREASES).await;
    let (addr_a, addr_b) = (a.addr.to_string(), b.addr.to_string());
    wait_until("both servers announced, as b sees them", || {
        let seen = servers_seen(&b);
        let both = seen.contains_key(&addr_a) && seen.contains_key(&addr_b);
        async move { both }
    })
    .await;
    let before = servers_seen(&b);
    let prefix = LeaseId::generate().to_string();
    let keys: Vec<LimitKey> = (0..3).map(|i| unique_key(&prefix, &format!("k{i}"))).collect();
    a.client(ADMIN_TOKEN)
        .put_limit(&rolling(&keys[0], 10, 60))
        .await
        .unwrap();
    a.client(ADMIN_TOKEN)
        .put_limit(&rolling(&keys[1], 10, 60))
        .await
        .unwrap();
    b.client(ADMIN_TOKEN)
        .put_limit(&rolling(&keys[2], 10, 60))
        .await
        .unwrap();
    for (server, name) in [(&a, "a"), (&b, "b")] {
        wait_until(&format!("{name} counts a's two records and b's one"), || {
            let seen = servers_seen(server);
            let grew = |addr: &str, by: u64| seen.get(addr).map(|s| s.1) == Some(before[addr].1 + by);
            let counted = grew(&addr_a, 2) && grew(&addr_b, 1);
            async move { counted }
        })
        .await;
    }
    // The definitions themselves reach the other server, with no record skipped.
    for key in &keys {
        assert_eq!(report(&a, key).await.state.definition().capacity(), 10);
        assert_eq!(report(&b, key).await.state.definition().capacity(), 10);
    }
    assert_eq!(metric(&a, "ratelimiterd_tigerbeetle_definitions_malformed_total"), 0.0);
    assert_eq!(metric(&b, "ratelimiterd_tigerbeetle_definitions_malformed_total"), 0.0);
    // The console's backend section lists the same servers, named and timed.
    let state = raw::request(a.addr, "GET", "/ui/api/state", Some(ADMIN_TOKEN), b"").value();
    let servers = state["backend"]["servers"]
        .as_array()
        .expect("the servers in the console");
    let listed = |addr: &str| servers.iter().find(|s| s["address"] == addr).cloned().unwrap();
    for addr in [&addr_a, &addr_b] {
        let server = listed(addr);
        assert!(!server["name"].as_str().unwrap().is_empty(), "{server}");
        assert!(server["starts"].as_u64().unwrap() >= 1, "{server}");
        let (first, last) = (
            server["first_seen_unix_ms"].as_u64().unwrap(),
            server["last_seen_unix_ms"].as_u64().unwrap(),
        );
        assert!(first > 0 && first <= last, "{server}");
    }
}
