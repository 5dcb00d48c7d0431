//! A bounded fuzz target for the request parsers (issue 7): proptest over the
//! router, without a socket, with arbitrary bytes and with structured mutations
//! of valid requests (fields removed, replaced, added, duplicated; numbers past
//! u64; truncation; flipped and inserted bytes) on every endpoint.
//!
//! For every request: never a 5xx other than 503, every error answer is a JSON
//! object with an `error` string, a rejected request changes no limit's usage,
//! and no key ever holds more than its capacity.
//!
//! It runs in CI for a bounded number of cases (a few seconds);
//! `RELIABILITY_FUZZ_CASES=200000 cargo test --release -p ratelimiterd --test bad_input_fuzz`
//! runs it longer.

mod support;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use ratelimiter::memory::MemoryBackend;
use ratelimiter::registry::Registry;
use ratelimiter::{FakeClock, LeaseId, LimitReport};
use ratelimiterd::{app, AppState, Config};
use serde_json::{json, Value};
use support::{temp_dir, TempDir};
use tower::ServiceExt;

const ADMIN_TOKEN: &str = "fuzz-admin-token-0123456789";
/// Cases per fuzz test unless `RELIABILITY_FUZZ_CASES` says otherwise: a few
/// seconds in a debug build.
const CASES_DEFAULT: u32 = 1_000;
/// The largest body sent: past the configured 4 KiB limit, so 413 is reached too.
const BODY_BYTES_MAX: usize = 6 * 1024;
/// The keys the fuzzer's requests name; the first three are defined.
const KEYS: [&str; 5] = ["f:rolling", "f:debt", "f:inflight", "f:unknown", "bad key"];
/// A lease id the harness replaces with one it reserved before.
const LEASE_PLACEHOLDER: &str = "7ZZZZZZZZZZZZZZZZZZZZZZZZZ";
/// How many reserved lease ids are kept for completes to name.
const LEASES_KEPT: usize = 64;
/// How far the clock moves before each request: the 60 s windows turn over
/// every hundred requests or so.
const CLOCK_STEP_MS: u64 = 500;

/// The endpoints that take a body.
#[derive(Debug, Clone, Copy)]
enum Endpoint {
    Reserve,
    Complete,
    Define,
}

impl Endpoint {
    fn request(self, body: Vec<u8>) -> Request<Body> {
        let (method, path) = match self {
            Endpoint::Reserve => (Method::POST, "/v1/reserve"),
            Endpoint::Complete => (Method::POST, "/v1/complete"),
            Endpoint::Define => (Method::PUT, "/v1/admin/limits"),
        };
        Request::builder()
            .method(method)
            .uri(path)
            .header(header::AUTHORIZATION, format!("Bearer {ADMIN_TOKEN}"))
            .body(Body::from(body))
            .expect("request")
    }
}

/// The router on the memory backend with a fake clock (nothing expires during
/// a run) and three limits, one lease holding units on each.
struct Harness {
    router: Router,
    state: AppState,
    runtime: tokio::runtime::Runtime,
    /// How many answers of each status, printed at the end so a run shows it
    /// reached past the parser (200s) as well as every rejection.
    statuses: RefCell<BTreeMap<u16, u64>>,
    /// Advanced before every request, so holds expire and reserves keep passing.
    clock: FakeClock,
    /// Lease ids reserved so far (the newest [`LEASES_KEPT`]): completes name them
    /// in place of [`LEASE_PLACEHOLDER`], so they reach live leases.
    leases: RefCell<Vec<String>>,
    /// The registry's directory, deleted when the harness is dropped.
    _dir: TempDir,
}

impl Harness {
    fn new(name: &str) -> Harness {
        let dir = temp_dir(name);
        let registry_path = dir.join("limits.json");
        let yaml = format!(
            "server:\n  admin_token: {ADMIN_TOKEN}\n  body_bytes_max: 4096\nregistry:\n  path: {}\n",
            registry_path.display()
        );
        let config = Config::parse(&yaml, std::path::Path::new("fuzz.yaml")).expect("config");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let clock = FakeClock::new(1_700_000_000_000);
        let backend = Arc::new(MemoryBackend::new(
            Arc::new(clock.clone()),
            ratelimiterd::backend::memory_config(&config),
        ));
        let state = AppState::new(
            ratelimiterd::backend::SelectedBackend::of(backend),
            Some(Registry::open(&registry_path).expect("registry")),
            &config,
        );
        let harness = Harness {
            router: app(state.clone()),
            state,
            runtime,
            statuses: RefCell::new(BTreeMap::new()),
            clock,
            leases: RefCell::new(Vec::new()),
            _dir: dir,
        };
        for definition in [
            json!({"key": KEYS[0], "kind": "rolling", "capacity": 1000, "window_seconds": 60}),
            json!({"key": KEYS[1], "kind": "rolling", "capacity": 1000, "window_seconds": 60, "overage": "debt"}),
            json!({"key": KEYS[2], "kind": "concurrency", "capacity": 10, "timeout_seconds": 60}),
        ] {
            let (status, _) = harness.send(Endpoint::Define.request(definition.to_string().into_bytes()));
            assert_eq!(status, StatusCode::OK);
        }
        let holder = json!({"lease_id": LeaseId::generate().to_string(), "requirements": [
            {"key": KEYS[0], "amount": 10}, {"key": KEYS[1], "amount": 10}, {"key": KEYS[2], "amount": 1}]});
        assert_eq!(
            harness
                .send(Endpoint::Reserve.request(holder.to_string().into_bytes()))
                .0,
            StatusCode::OK
        );
        harness
    }

    fn send(&self, request: Request<Body>) -> (StatusCode, Vec<u8>) {
        self.runtime.block_on(async {
            let response = self.router.clone().oneshot(request).await.expect("infallible");
            let status = response.status();
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .expect("answer body");
            (status, bytes.to_vec())
        })
    }

    /// Prints the answers' statuses; fails when no request got past the parser
    /// or none was rejected, which would mean the generators are broken.
    fn summary(&self, name: &str, expect_ok: bool) {
        let statuses = self.statuses.borrow();
        println!("{name}: answers by status {statuses:?}");
        assert!(statuses.keys().any(|&s| s >= 400), "{name}: nothing was rejected");
        if expect_ok {
            assert!(statuses.contains_key(&200), "{name}: nothing got past the parser");
        }
    }

    fn reports(&self) -> Vec<LimitReport> {
        self.runtime
            .block_on(self.state.backend().limit_reports())
            .expect("reports")
    }

    /// Sends `body` to `endpoint`, a reserved lease id in place of the placeholder,
    /// and checks every property of the answer.
    fn check_body(&self, endpoint: Endpoint, mut body: Vec<u8>) -> Result<(), TestCaseError> {
        let placeholder = LEASE_PLACEHOLDER.as_bytes();
        if let Some(at) = body.windows(placeholder.len()).position(|w| w == placeholder) {
            let leases = self.leases.borrow();
            if let Some(lease) = leases.get(at % leases.len().max(1)) {
                body.splice(at..at + placeholder.len(), lease.bytes());
            }
        }
        let lease = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("lease_id").and_then(Value::as_str).map(str::to_owned));
        let allowed = self.check(endpoint.request(body))?;
        if let (Endpoint::Reserve, true, Some(lease)) = (endpoint, allowed, lease) {
            let mut leases = self.leases.borrow_mut();
            if leases.len() == LEASES_KEPT {
                leases.remove(0);
            }
            leases.push(lease);
        }
        Ok(())
    }

    /// Sends `request` and checks every property of the answer; `Ok(true)` when
    /// it was an allowed reserve.
    fn check(&self, request: Request<Body>) -> Result<bool, TestCaseError> {
        let what = format!("{} {}", request.method(), request.uri());
        self.clock.advance_ms(CLOCK_STEP_MS);
        let before = self.reports();
        let (status, body) = self.send(request);
        *self.statuses.borrow_mut().entry(status.as_u16()).or_default() += 1;
        let text = String::from_utf8_lossy(&body);
        prop_assert!(
            !status.is_server_error() || status == StatusCode::SERVICE_UNAVAILABLE,
            "{what}: {status} {text}"
        );
        let value: Value = serde_json::from_slice(&body)
            .map_err(|e| TestCaseError::fail(format!("{what}: {status} answer is not JSON ({e}): {text}")))?;
        let after = self.reports();
        if status != StatusCode::OK {
            prop_assert!(
                value.get("error").is_some_and(Value::is_string),
                "{what}: {status} without an error string: {text}"
            );
            prop_assert!(
                before == after,
                "{what}: rejected with {status} but usage changed: {text}"
            );
        }
        for report in &after {
            prop_assert!(
                report.in_use <= report.state.definition().capacity(),
                "{what}: {} holds {} of {}",
                report.state.definition().key(),
                report.in_use,
                report.state.definition().capacity()
            );
        }
        Ok(value.get("allowed") == Some(&Value::Bool(true)))
    }
}

fn cases() -> u32 {
    std::env::var("RELIABILITY_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASES_DEFAULT)
}

fn runner() -> TestRunner {
    TestRunner::new(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })
}

fn endpoint() -> impl Strategy<Value = Endpoint> {
    prop_oneof![
        Just(Endpoint::Reserve),
        Just(Endpoint::Complete),
        Just(Endpoint::Define)
    ]
}

/// Values that break types and ranges.
fn odd_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        prop_oneof![Just(0u64), Just(1), Just(u64::MAX), Just(u64::MAX - 1)].prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON numbers are finite", |f| f.is_finite())
            .prop_map(Value::from),
        prop::sample::select(KEYS.to_vec()).prop_map(Value::from),
        any::<u128>().prop_map(|bits| Value::from(LeaseId::from_u128(bits).to_string())),
        ".{0,24}".prop_map(Value::String),
        (1..400usize).prop_map(|n| Value::String("k".repeat(n))),
        Just(json!([])),
        Just(json!({})),
        Just(json!([{"key": KEYS[0], "amount": 1}])),
        Just(json!({"key": KEYS[0], "amount": 1})),
    ]
}

/// A valid request of each endpoint, over the fuzzer's keys.
fn template() -> impl Strategy<Value = (Endpoint, Value)> {
    let key = prop::sample::select(KEYS[..3].to_vec());
    let amount = prop_oneof![6 => 1..400u64, 1 => Just(u64::MAX), 1 => (u64::MAX - 100)..u64::MAX];
    let reserve = (
        prop::collection::vec((key.clone(), amount), 1..4),
        prop::option::of("[a-z]{1,8}"),
    )
        .prop_map(|(requirements, job_id)| {
            let mut seen = std::collections::HashSet::new();
            let requirements: Vec<Value> = requirements
                .into_iter()
                .filter(|(k, _)| seen.insert(*k))
                .map(|(k, amount)| json!({"key": k, "amount": amount}))
                .collect();
            let mut body = json!({"lease_id": LeaseId::generate().to_string(), "requirements": requirements});
            if let Some(job_id) = job_id {
                body["job_id"] = json!(job_id);
            }
            (Endpoint::Reserve, body)
        });
    let actual = prop_oneof![3 => 0..5000u64, 1 => Just(u64::MAX), 1 => (u64::MAX - 100)..u64::MAX];
    let complete = (key.clone(), actual, any::<bool>()).prop_map(|(k, actual, known)| {
        let lease = if known {
            LEASE_PLACEHOLDER.to_owned()
        } else {
            LeaseId::generate().to_string()
        };
        let body = json!({"lease_id": lease, "actuals": [{"key": k, "actual_amount": actual}]});
        (Endpoint::Complete, body)
    });
    let define = (key, 1..5000u64, any::<bool>()).prop_map(|(k, capacity, debt)| {
        let body = if k == KEYS[2] {
            json!({"key": k, "kind": "concurrency", "capacity": capacity, "timeout_seconds": 60})
        } else {
            json!({"key": k, "kind": "rolling", "capacity": capacity, "window_seconds": 60,
                   "overage": if debt { "debt" } else { "none" }, "unit": "tokens", "description": "fuzz"})
        };
        (Endpoint::Define, body)
    });
    prop_oneof![3 => reserve, 2 => complete, 1 => define]
}

/// One change to a request, on its JSON or on its bytes.
#[derive(Debug, Clone)]
enum Mutation {
    Remove(Index),
    Replace(Index, Value),
    Add(Index, String, Value),
    Duplicate(Index),
    BigNumber(Index, &'static str),
    Truncate(Index),
    Flip(Index, u8),
    Insert(Index, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let number = prop::sample::select(vec![
        "18446744073709551616",
        "-1",
        "-0",
        "1e400",
        "1.0",
        "0x10",
        "99999999999999999999999999999999",
    ]);
    prop_oneof![
        2 => any::<Index>().prop_map(Mutation::Remove),
        3 => (any::<Index>(), odd_value()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        1 => (any::<Index>(), "[a-z_]{1,12}", odd_value()).prop_map(|(i, n, v)| Mutation::Add(i, n, v)),
        1 => any::<Index>().prop_map(Mutation::Duplicate),
        1 => (any::<Index>(), number).prop_map(|(i, n)| Mutation::BigNumber(i, n)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => (any::<Index>(), 1..=255u8).prop_map(|(i, x)| Mutation::Flip(i, x)),
        1 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
    ]
}

/// The JSON pointers of every object member in `value`.
fn members(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (name, child) in map {
                let pointer = format!("{at}/{}", name.replace('~', "~0").replace('/', "~1"));
                out.push(pointer.clone());
                members(child, pointer, out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                members(child, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// The JSON pointers of every object in `value`, itself included.
fn objects(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            out.push(at.clone());
            for (name, child) in map {
                objects(
                    child,
                    format!("{at}/{}", name.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                objects(child, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// Applies `mutations` in order; byte mutations turn the JSON into bytes for the rest.
fn mutate(mut value: Value, mutations: &[Mutation]) -> Vec<u8> {
    let mut bytes: Option<Vec<u8>> = None;
    for mutation in mutations {
        if let Some(b) = bytes.as_mut() {
            mutate_bytes(b, mutation);
            continue;
        }
        let mut pointers = Vec::new();
        members(&value, String::new(), &mut pointers);
        match mutation {
            Mutation::Remove(i) if !pointers.is_empty() => {
                let pointer = &pointers[i.index(pointers.len())];
                let (parent, name) = pointer.rsplit_once('/').expect("a member pointer");
                if let Some(Value::Object(map)) = value.pointer_mut(parent) {
                    map.remove(&name.replace("~1", "/").replace("~0", "~"));
                }
            }
            Mutation::Replace(i, with) if !pointers.is_empty() => {
                if let Some(slot) = value.pointer_mut(&pointers[i.index(pointers.len())]) {
                    *slot = with.clone();
                }
            }
            Mutation::Add(i, name, with) => {
                let mut maps = Vec::new();
                objects(&value, String::new(), &mut maps);
                if let Some(Value::Object(map)) = maps
                    .get(i.index(maps.len().max(1)))
                    .and_then(|pointer| value.pointer_mut(pointer))
                {
                    map.insert(name.clone(), with.clone());
                }
            }
            Mutation::Remove(_) | Mutation::Replace(..) => {}
            _ => {
                let mut b = serde_json::to_vec(&value).expect("serialize");
                mutate_bytes(&mut b, mutation);
                bytes = Some(b);
            }
        }
    }
    bytes.unwrap_or_else(|| serde_json::to_vec(&value).expect("serialize"))
}

fn mutate_bytes(bytes: &mut Vec<u8>, mutation: &Mutation) {
    match mutation {
        Mutation::Duplicate(i) => {
            // Repeats one `"name":value` member of the top-level object at its start.
            let text = String::from_utf8_lossy(bytes).into_owned();
            if let Ok(Value::Object(map)) = serde_json::from_str::<Value>(&text) {
                if !map.is_empty() {
                    let (name, value) = map.iter().nth(i.index(map.len())).expect("in range");
                    let member = format!("{}:{},", json!(name), value);
                    bytes.splice(1..1, member.into_bytes());
                }
            }
        }
        Mutation::BigNumber(i, literal) => {
            let digits: Vec<usize> = (0..bytes.len())
                .filter(|&p| bytes[p].is_ascii_digit() && (p == 0 || bytes[p - 1] == b':'))
                .collect();
            if !digits.is_empty() {
                let start = digits[i.index(digits.len())];
                let end = (start..bytes.len())
                    .find(|&p| !bytes[p].is_ascii_digit())
                    .unwrap_or(bytes.len());
                bytes.splice(start..end, literal.bytes());
            }
        }
        Mutation::Truncate(i) if !bytes.is_empty() => bytes.truncate(i.index(bytes.len())),
        Mutation::Flip(i, x) if !bytes.is_empty() => {
            let p = i.index(bytes.len());
            bytes[p] ^= x;
        }
        Mutation::Insert(i, b) => {
            let p = i.index(bytes.len() + 1);
            bytes.insert(p, *b);
        }
        _ => {}
    }
}

#[test]
fn arbitrary_bytes_get_json_errors_and_change_nothing() {
    let harness = Harness::new("bytes");
    let bodies = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        prop::collection::vec(any::<u8>(), 0..BODY_BYTES_MAX),
        // Printable JSON-ish text reaches further into the parser than random bytes.
        "[\\[\\]{}\":,0-9a-z \\-.eE]{0,200}".prop_map(String::into_bytes),
    ];
    runner()
        .run(&(endpoint(), bodies), |(endpoint, body)| {
            harness.check_body(endpoint, body)
        })
        .unwrap();
    harness.summary("arbitrary bytes", false);
}

#[test]
fn mutated_requests_get_json_errors_and_change_nothing() {
    let harness = Harness::new("mutations");
    // No mutation at all in about one case in four: valid requests with extreme
    // amounts and actuals reach the backend.
    let cases = (template(), prop::collection::vec(mutation(), 0..4));
    runner()
        .run(&cases, |((endpoint, value), mutations)| {
            harness.check_body(endpoint, mutate(value, &mutations))
        })
        .unwrap();
    harness.summary("mutated requests", true);
}

#[test]
fn arbitrary_key_paths_get_json_answers() {
    let harness = Harness::new("paths");
    let segment = prop_oneof![
        ".{0,300}".prop_map(|s| s.bytes().map(|b| format!("%{b:02X}")).collect::<String>()),
        "[A-Za-z0-9:_.@/%-]{0,300}",
        prop::collection::vec(any::<u8>(), 0..64).prop_map(|b| b.iter().map(|b| format!("%{b:02X}")).collect()),
    ];
    runner()
        .run(&segment, |segment| {
            let uri = format!("/v1/admin/limits/{segment}");
            // Some generated paths are not valid URIs at all; those never reach a server.
            let Ok(request) = Request::builder()
                .method(Method::GET)
                .uri(&uri)
                .header(header::AUTHORIZATION, format!("Bearer {ADMIN_TOKEN}"))
                .body(Body::empty())
            else {
                return Ok(());
            };
            harness.check(request).map(|_| ())
        })
        .unwrap();
    harness.summary("key paths", false);
}
