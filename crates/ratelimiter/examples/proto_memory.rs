//! Spec prototype 5, semantics half: prototypes 1 and 3 on the memory backend,
//! in real time, printing what the backend answered. Exits non-zero when an
//! answer is not the one the specification requires.
//!
//! `cargo run -p ratelimiter --example proto_memory`
//!
//! The scheduler half (two providers, one saturated, no head-of-line blocking)
//! comes with the scheduler.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimiter::{
    Actual, Backend, CompleteRequest, Denial, LeaseId, LimitDefinition, LimitKey, Limiter, MemoryBackend, MemoryConfig,
    Requirement, ReserveOutcome, ReserveRequest, ReserveResponse, SystemClock,
};

/// How long prototype 1 polls for the window to pass before it gives up.
const EXPIRY_DEADLINE: Duration = Duration::from_secs(3);

fn reserve_request(lease: LeaseId, key: &LimitKey, amount: u64) -> ReserveRequest {
    let requirement = Requirement {
        key: key.clone(),
        amount,
    };
    ReserveRequest::new(lease, None, vec![requirement]).expect("valid request")
}

async fn reserve(backend: &MemoryBackend, label: &str, lease: LeaseId, key: &LimitKey, amount: u64) -> ReserveOutcome {
    let outcome = backend
        .reserve(&reserve_request(lease, key, amount))
        .await
        .expect("reserve");
    let wire = serde_json::to_string(&ReserveResponse::from(&outcome)).expect("json");
    println!("  {label:<44} lease {lease} -> {wire}");
    outcome
}

fn check(ok: bool, what: &str, failures: &mut Vec<String>) {
    println!("  {} {what}", if ok { "ok  " } else { "FAIL" });
    if !ok {
        failures.push(what.to_owned());
    }
}

async fn prototype_1(backend: &MemoryBackend, failures: &mut Vec<String>) {
    println!("prototype 1: rolling limit of 2 per 1 s, lease ids after a denial");
    let key = LimitKey::new("proto:rpm").unwrap();
    backend
        .apply_definition(&LimitDefinition::rolling(key.clone(), 2, 1).unwrap())
        .await
        .expect("define");
    let mut allowed = 0;
    let mut denied_lease = None;
    for attempt in 1..=3 {
        let lease = LeaseId::generate();
        match reserve(backend, &format!("attempt {attempt}"), lease, &key, 1).await {
            ReserveOutcome::Allowed { .. } => allowed += 1,
            ReserveOutcome::Denied(_) => denied_lease = Some(lease),
        }
    }
    check(
        allowed == 2 && denied_lease.is_some(),
        "three leases: two allowed, one denied",
        failures,
    );
    let Some(denied) = denied_lease else { return };
    let again = reserve(backend, "the denied lease again", denied, &key, 1).await;
    let still_denied = again == ReserveOutcome::Denied(Denial::LeaseAlreadyFailed);
    check(
        still_denied,
        "the same lease id stays denied (lease_already_failed)",
        failures,
    );
    let start = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let outcome = reserve(backend, "a new lease after waiting", LeaseId::generate(), &key, 1).await;
        if outcome.is_allowed() {
            println!("  allowed {} ms after the denial", start.elapsed().as_millis());
            break;
        }
        if start.elapsed() > EXPIRY_DEADLINE {
            check(false, "a new lease is allowed once the window passed", failures);
            return;
        }
    }
    check(true, "a new lease is allowed once the window passed", failures);
}

async fn prototype_3(backend: &MemoryBackend, failures: &mut Vec<String>) {
    println!("prototype 3: reconciliation frees capacity early (tpm capacity 100 per 60 s)");
    let key = LimitKey::new("proto:tpm").unwrap();
    backend
        .apply_definition(&LimitDefinition::rolling(key.clone(), 100, 60).unwrap())
        .await
        .expect("define");
    let lease = LeaseId::generate();
    let first = reserve(backend, "reserve the upper bound, 100", lease, &key, 100).await;
    check(first.is_allowed(), "100 of 100 allowed", failures);
    let start = Instant::now();
    let actual = Actual {
        key: key.clone(),
        actual_amount: 10,
    };
    let complete = CompleteRequest::new(lease, None, vec![actual]).expect("valid request");
    backend.complete(&complete).await.expect("complete");
    println!("  completed with actual 10");
    let next = reserve(backend, "reserve 90 right after", LeaseId::generate(), &key, 90).await;
    let freed_ms = start.elapsed().as_millis();
    check(
        next.is_allowed(),
        &format!("90 allowed {freed_ms} ms after complete (< 1 s)"),
        failures,
    );
    let report = backend.limit_report(&key).await.expect("report").expect("defined");
    println!("  in_use {} of {}", report.in_use, report.state.definition().capacity());
    check(report.in_use == 100, "in_use is 10 + 90", failures);
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let backend = Arc::new(MemoryBackend::new(
        Arc::new(SystemClock::new()),
        MemoryConfig::default(),
    ));
    let mut failures = Vec::new();
    prototype_1(&backend, &mut failures).await;
    prototype_3(&backend, &mut failures).await;
    if failures.is_empty() {
        println!("all prototype checks passed");
    } else {
        eprintln!("{} prototype checks failed: {failures:?}", failures.len());
        std::process::exit(1);
    }
}
