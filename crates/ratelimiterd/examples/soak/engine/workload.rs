//! The soak's load: many concurrent clients reserving LLM-shaped leases (rpm,
//! tpm, calls in flight, per-tenant budgets and calls) over HTTP, completing
//! them with actuals below and above the estimate, abandoning some, replaying
//! some lease ids, while an admin task raises and lowers capacities and a
//! sampler reads usage. Everything is recorded for the checker.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ratelimiter::httpclient::{HttpClient, HttpClientConfig};
use ratelimiter::{
    Actual, CompleteRequest, DefinitionFields, Denial, LeaseId, LimitDefinition, LimitKey, LimitKind, LimitStatus,
    Limiter, LimiterError, Overage, Requirement, ReserveOutcome, ReserveRequest,
};
use tokio::time::Instant;

use super::record::{now_ms, CapacityChange, Completion, Grant, LimitSpec, Observation, Recorder, Records};

/// The longest a denied client waits before its next attempt, so pressure
/// stays on even when a hint is long (a decreasing key's is 10 s).
const DENIED_WAIT_MS_MAX: u64 = 250;
/// The wait after a reserve of unknown outcome.
const UNKNOWN_WAIT_MS: u64 = 50;
/// The largest token estimate of one call.
const TOKENS_ESTIMATE_MAX: u64 = 2_000;
/// Tenants, each with a token budget and a calls-in-flight limit.
const TENANTS: usize = 3;
/// How long past the last hold's end the drain check waits for usage to reach 0.
const DRAIN_MARGIN_MS: u64 = 3_000;

/// How a soak runs.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// How long clients run.
    pub duration: Duration,
    /// Concurrent clients.
    pub clients: usize,
    /// Rolling windows in seconds (tenant budgets get twice that); concurrency
    /// timeouts are the same. Short, so many windows turn over in one run.
    pub hold_seconds: u64,
    /// Percent of granted leases never completed.
    pub abandon_percent: u32,
    /// Percent of answers whose lease id is sent again to check idempotency.
    pub replay_percent: u32,
    /// The longest simulated provider call, in ms.
    pub call_ms_max: u64,
    /// How often a capacity changes.
    pub change_interval: Duration,
    /// How often usage is sampled.
    pub sample_interval: Duration,
    /// Multiplies every capacity: above 1 the run is bound by the server's
    /// request rate rather than by the limits.
    pub capacity_scale: u64,
    /// Seeds every client's choices.
    pub seed: u64,
    /// Every key of the run starts with it, so runs never share a key.
    pub prefix: String,
}

/// Where the server is and the tokens it wants.
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// `http://host:port`.
    pub url: String,
    /// For `PUT` and `GET /v1/admin/limits`.
    pub admin_token: Option<String>,
    /// For reserve and complete.
    pub client_token: Option<String>,
}

/// The limits of a run and their starting capacities.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Every limit, by index.
    pub limits: Vec<LimitSpec>,
    /// The definition each limit starts with.
    pub definitions: Vec<LimitDefinition>,
}

const RPM: usize = 0;
const TPM: usize = 1;
const INFLIGHT: usize = 2;
/// The tenant budgets are limits `TENANT_TOKENS + t`, their calls in flight `TENANT_CALLS + t`.
const TENANT_TOKENS: usize = 3;
const TENANT_CALLS: usize = TENANT_TOKENS + TENANTS;

fn definition(key: &str, kind: LimitKind, capacity: u64, hold_seconds: u64, overage: Overage) -> LimitDefinition {
    let (window_seconds, timeout_seconds) = match kind {
        LimitKind::Rolling | LimitKind::Bucket => (hold_seconds, 0),
        LimitKind::Concurrency => (0, hold_seconds),
    };
    LimitDefinition::new(DefinitionFields {
        key: LimitKey::new(key).expect("soak keys are valid"),
        kind,
        capacity,
        window_seconds,
        // No margin: the checker counts every hold for exactly its window.
        window_margin_ms: (kind == LimitKind::Rolling).then_some(0),
        timeout_seconds,
        unit: String::new(),
        description: "soak".to_owned(),
        overage,
        period: None,
    })
    .expect("soak definitions are valid")
}

/// The limits of one model and its tenants, scaled to `hold_seconds` and
/// `capacity_scale`.
pub fn plan(prefix: &str, hold_seconds: u64, capacity_scale: u64) -> Plan {
    let scale = capacity_scale.max(1);
    let per_second = |n: u64| n * hold_seconds * scale;
    let mut definitions = vec![
        definition(
            &format!("{prefix}:rpm"),
            LimitKind::Rolling,
            per_second(150),
            hold_seconds,
            Overage::None,
        ),
        definition(
            &format!("{prefix}:tpm"),
            LimitKind::Rolling,
            per_second(40_000),
            hold_seconds,
            Overage::None,
        ),
        definition(
            &format!("{prefix}:inflight"),
            LimitKind::Concurrency,
            24 * scale,
            hold_seconds,
            Overage::None,
        ),
    ];
    for t in 0..TENANTS {
        let key = format!("{prefix}:tenant:{t}:tokens");
        definitions.push(definition(
            &key,
            LimitKind::Rolling,
            per_second(15_000),
            2 * hold_seconds,
            Overage::Debt,
        ));
    }
    for t in 0..TENANTS {
        let key = format!("{prefix}:tenant:{t}:inflight");
        definitions.push(definition(
            &key,
            LimitKind::Concurrency,
            8 * scale,
            hold_seconds,
            Overage::None,
        ));
    }
    let limits = definitions
        .iter()
        .map(|d| LimitSpec {
            key: d.key().to_string(),
            kind: d.kind(),
            hold_ms: d.hold_ms(),
        })
        .collect();
    Plan { limits, definitions }
}

/// What every task of a run shares.
struct Context {
    options: SoakOptions,
    plan: Plan,
    admin: HttpClient,
    client: HttpClient,
    recorder: Recorder,
    deadline: Instant,
}

fn http_client(url: &str, token: &Option<String>) -> Result<HttpClient, String> {
    HttpClient::new(HttpClientConfig {
        token: token.clone(),
        ..HttpClientConfig::new(url)
    })
    .map_err(|e| e.to_string())
}

/// Runs a soak against `endpoints`: defines the limits, runs the clients, the
/// admin task and the sampler for the duration, then waits for every hold to
/// end and checks that usage drained to 0 (nothing leaked).
pub async fn run(options: SoakOptions, endpoints: &Endpoints) -> Result<(Vec<LimitSpec>, Records), String> {
    let plan = plan(&options.prefix, options.hold_seconds, options.capacity_scale);
    let context = Arc::new(Context {
        admin: http_client(&endpoints.url, &endpoints.admin_token)?,
        client: http_client(&endpoints.url, &endpoints.client_token)?,
        deadline: Instant::now() + options.duration,
        recorder: Recorder::default(),
        plan,
        options,
    });
    for (limit, definition) in context.plan.definitions.iter().enumerate() {
        put(&context, limit, definition).await?;
    }
    let mut tasks = Vec::new();
    for id in 0..context.options.clients {
        tasks.push(tokio::spawn(client_loop(context.clone(), id as u64)));
    }
    tasks.push(tokio::spawn(admin_loop(context.clone())));
    tasks.push(tokio::spawn(sample_loop(context.clone())));
    for task in tasks {
        task.await.map_err(|e| format!("a soak task failed: {e}"))?;
    }
    drain(&context).await;
    sample(&context).await;
    Ok((context.plan.limits.clone(), context.recorder.take()))
}

/// Defines one limit and records the answer as a capacity change.
async fn put(context: &Context, limit: usize, definition: &LimitDefinition) -> Result<(), String> {
    let sent_ms = now_ms();
    let change = match context.admin.put_limit(definition).await {
        Ok(report) => CapacityChange {
            limit,
            sent_ms,
            answered_ms: now_ms(),
            capacity: report.state.definition().capacity(),
            pending_decrease_to: report.state.pending_decrease_to(),
            unknown: false,
        },
        // The server was unreachable (a fault run restarts it): the change may
        // or may not have been made, which the checker takes into account.
        Err(LimiterError::Unavailable { .. }) => {
            context.recorder.unavailable();
            CapacityChange {
                limit,
                sent_ms,
                answered_ms: now_ms(),
                capacity: definition.capacity(),
                pending_decrease_to: 0,
                unknown: true,
            }
        }
        Err(e) => return Err(format!("PUT {}: {e}", definition.key())),
    };
    context.recorder.change(change);
    Ok(())
}

/// One client: reserve, call, complete (or abandon), until the deadline.
async fn client_loop(context: Arc<Context>, id: u64) {
    let mut rng = StdRng::seed_from_u64(context.options.seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    while Instant::now() < context.deadline {
        let (request, wanted) = lease_request(&context.plan, &mut rng);
        match context.client.reserve(&request).await {
            Ok(ReserveOutcome::Allowed { reserved_at_unix_ms }) => {
                let grant = Grant {
                    lease: request.lease_id(),
                    reserved_at_ms: reserved_at_unix_ms,
                    answered_ms: now_ms(),
                    requirements: wanted.clone(),
                };
                context.recorder.grant(grant);
                use_lease(&context, &mut rng, &request, reserved_at_unix_ms).await;
            }
            Ok(ReserveOutcome::Denied(denial)) => {
                context.recorder.denial(&denial.error_code());
                if matches!(denial, Denial::InsufficientCapacity { .. }) && replay(&context, &mut rng) {
                    expect_burnt(&context, &request).await;
                }
                let wait_ms = denial.retry_after_ms().clamp(1, DENIED_WAIT_MS_MAX);
                tokio::time::sleep(Duration::from_millis(rng.gen_range(1..=wait_ms))).await;
            }
            Err(error) => unknown_outcome(&context, &request, error).await,
        }
    }
}

fn replay(context: &Context, rng: &mut StdRng) -> bool {
    rng.gen_range(0..100) < context.options.replay_percent
}

/// An LLM-shaped lease: one request and an estimate of tokens on the model,
/// a call in flight, and one tenant's budget and call; or, one time in ten, the
/// model's rpm and tpm alone. Returns the request and its (limit, amount) pairs.
fn lease_request(plan: &Plan, rng: &mut StdRng) -> (ReserveRequest, Vec<(usize, u64)>) {
    // Mostly small estimates, some large, as completions go.
    let tokens = if rng.gen_bool(0.8) {
        rng.gen_range(1..=TOKENS_ESTIMATE_MAX / 4)
    } else {
        rng.gen_range(1..=TOKENS_ESTIMATE_MAX)
    };
    let tenant = rng.gen_range(0..TENANTS);
    let mut wanted = vec![(RPM, 1), (TPM, tokens)];
    if rng.gen_range(0..10) != 0 {
        wanted.extend([
            (INFLIGHT, 1),
            (TENANT_TOKENS + tenant, tokens),
            (TENANT_CALLS + tenant, 1),
        ]);
    }
    let requirements = wanted
        .iter()
        .map(|&(limit, amount)| Requirement {
            key: plan.definitions[limit].key().clone(),
            amount,
        })
        .collect();
    let request = ReserveRequest::new(LeaseId::generate(), None, requirements).expect("a valid request");
    (request, wanted)
}

/// After a grant: maybe replay it, "call the provider", then complete with
/// actuals (below or above the estimate), complete twice, or abandon.
async fn use_lease(context: &Context, rng: &mut StdRng, request: &ReserveRequest, reserved_at_unix_ms: u64) {
    if replay(context, rng) {
        expect_same_grant(context, request, reserved_at_unix_ms, false).await;
    }
    let call_ms = rng.gen_range(0..=context.options.call_ms_max);
    tokio::time::sleep(Duration::from_millis(call_ms)).await;
    if rng.gen_range(0..100) < context.options.abandon_percent {
        context.recorder.abandoned();
        return;
    }
    let mut actuals = Vec::new();
    // One complete in ten reports nothing: the reservation stands as made.
    if rng.gen_range(0..10) != 0 {
        for requirement in request.requirements() {
            let limit = limit_of(&context.plan, &requirement.key);
            if context.plan.limits[limit].kind == LimitKind::Rolling && limit != RPM {
                // 0 to 1.5 times the estimate: shrinks, and overage to hold or drop.
                let actual = requirement.amount * rng.gen_range(0..=150) / 100;
                actuals.push((limit, actual));
            }
        }
    }
    let wire: Vec<Actual> = actuals
        .iter()
        .map(|&(limit, actual_amount)| Actual {
            key: context.plan.definitions[limit].key().clone(),
            actual_amount,
        })
        .collect();
    let complete = CompleteRequest::new(request.lease_id(), None, wire).expect("a valid complete");
    let times = if rng.gen_range(0..100) < context.options.replay_percent {
        2
    } else {
        1
    };
    for _ in 0..times {
        context.recorder.completion(Completion {
            lease: request.lease_id(),
            sent_ms: now_ms(),
            actuals: actuals.clone(),
        });
        match context.client.complete(&complete).await {
            Ok(()) => {}
            // Unreachable: the checker already counts the complete as done when sent.
            Err(LimiterError::Unavailable { .. }) => context.recorder.unavailable(),
            Err(e) => context
                .recorder
                .anomaly(format!("complete {}: {e}", request.lease_id())),
        }
    }
    if rng.gen_range(0..100) < context.options.replay_percent {
        expect_same_grant(context, request, reserved_at_unix_ms, true).await;
    }
}

fn limit_of(plan: &Plan, key: &LimitKey) -> usize {
    plan.definitions
        .iter()
        .position(|d| d.key() == key)
        .expect("a key of the plan")
}

/// The same lease id again after a grant: allowed again at the original time,
/// whether the lease is live or was completed (`completed`): both backends
/// remember completed leases well past a soak's replay delay.
async fn expect_same_grant(context: &Context, request: &ReserveRequest, reserved_at_unix_ms: u64, completed: bool) {
    context.recorder.replay();
    match context.client.reserve(request).await {
        Ok(ReserveOutcome::Allowed { reserved_at_unix_ms: again }) if again == reserved_at_unix_ms => {}
        Ok(ReserveOutcome::Allowed { reserved_at_unix_ms: again }) => {
            let lease = request.lease_id();
            context.recorder.anomaly(format!(
                "replay of granted lease {lease} (completed: {completed}) granted anew at {again}, \
                 not at {reserved_at_unix_ms}"
            ));
            // The requirements are held again: release them. The new grant is
            // left out of the records, which keeps the checker's bound a lower one.
            let complete = CompleteRequest::new(request.lease_id(), None, Vec::new()).expect("a valid complete");
            let _ = context.client.complete(&complete).await;
        }
        Err(LimiterError::Unavailable { .. }) => context.recorder.unknown(),
        other => context.recorder.anomaly(format!(
            "replay of granted lease {} (completed: {completed}) answered {other:?}, not allowed at {reserved_at_unix_ms}",
            request.lease_id()
        )),
    }
}

/// The same lease id again after an insufficient-capacity denial: burnt.
async fn expect_burnt(context: &Context, request: &ReserveRequest) {
    context.recorder.replay();
    match context.client.reserve(request).await {
        Ok(ReserveOutcome::Denied(Denial::LeaseAlreadyFailed)) => {}
        Err(LimiterError::Unavailable { .. }) => context.recorder.unknown(),
        other => context.recorder.anomaly(format!(
            "replay of denied lease {} answered {other:?}, not lease_already_failed",
            request.lease_id()
        )),
    }
}

/// A reserve without an answer: counted, and completed anyway, which releases
/// whatever it may hold (a complete of an unknown lease is a no-op).
async fn unknown_outcome(context: &Context, request: &ReserveRequest, error: LimiterError) {
    match error {
        LimiterError::Unavailable { .. } => context.recorder.unknown(),
        other => context
            .recorder
            .anomaly(format!("reserve {}: unexpected error {other}", request.lease_id())),
    }
    let complete = CompleteRequest::new(request.lease_id(), None, Vec::new()).expect("a valid complete");
    context.recorder.completion(Completion {
        lease: request.lease_id(),
        sent_ms: now_ms(),
        actuals: Vec::new(),
    });
    let _ = context.client.complete(&complete).await;
    tokio::time::sleep(Duration::from_millis(UNKNOWN_WAIT_MS)).await;
}

/// Raises and lowers capacities: 30% to 160% of the starting one, or back to it.
async fn admin_loop(context: Arc<Context>) {
    let mut rng = StdRng::seed_from_u64(context.options.seed.rotate_left(17));
    loop {
        let wait = context.options.change_interval.mul_f64(rng.gen_range(0.5..1.5));
        if Instant::now() + wait >= context.deadline {
            return;
        }
        tokio::time::sleep(wait).await;
        let limit = rng.gen_range(0..context.plan.definitions.len());
        let start = &context.plan.definitions[limit];
        let capacity = if rng.gen_bool(0.2) {
            start.capacity()
        } else {
            (start.capacity() as f64 * rng.gen_range(0.3..1.6)).round().max(1.0) as u64
        };
        let definition = start.with_capacity(capacity).expect("a valid capacity");
        if let Err(e) = put(&context, limit, &definition).await {
            context.recorder.anomaly(e);
        }
    }
}

/// Reads every limit's usage now and then.
async fn sample_loop(context: Arc<Context>) {
    while Instant::now() < context.deadline {
        tokio::time::sleep(context.options.sample_interval).await;
        sample(&context).await;
    }
}

/// One usage sample of every limit of the run; `None` when the GET failed.
async fn sample(context: &Context) -> Option<Vec<Observation>> {
    let sent_ms = now_ms();
    let reports = match context.admin.limits().await {
        Ok(reports) => reports,
        Err(LimiterError::Unavailable { .. }) => {
            context.recorder.unavailable();
            return None;
        }
        Err(e) => {
            context.recorder.anomaly(format!("GET /v1/admin/limits: {e}"));
            return None;
        }
    };
    let answered_ms = now_ms();
    let observations: Vec<Observation> = reports
        .iter()
        .filter_map(|report| {
            let limit = context
                .plan
                .definitions
                .iter()
                .position(|d| d.key() == report.state.definition().key())?;
            Some(Observation {
                limit,
                sent_ms,
                answered_ms,
                capacity: report.state.definition().capacity(),
                active: report.state.status() == LimitStatus::Active,
                in_use: report.in_use,
            })
        })
        .collect();
    context.recorder.observations(observations.iter().cloned());
    Some(observations)
}

/// Waits until every hold has ended, then requires usage 0 everywhere: an
/// abandoned lease is released by its timeout, nothing leaks.
async fn drain(context: &Context) {
    let longest_ms = context.plan.limits.iter().map(|l| l.hold_ms).max().unwrap_or(0);
    let until = Instant::now() + Duration::from_millis(longest_ms + DRAIN_MARGIN_MS);
    loop {
        let Some(observations) = sample(context).await else {
            // The failed sample is an anomaly already; the wait stays bounded.
            if Instant::now() >= until {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let held: Vec<String> = observations
            .iter()
            .filter(|o| o.in_use > 0)
            .map(|o| format!("{} holds {}", context.plan.limits[o.limit].key, o.in_use))
            .collect();
        if held.is_empty() {
            return;
        }
        if Instant::now() >= until {
            context
                .recorder
                .anomaly(format!("usage did not drain after every hold ended: {held:?}"));
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
