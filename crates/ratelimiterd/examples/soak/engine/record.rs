//! What the soak records: every grant, completion, capacity change and usage
//! sample, with the client's wall-clock times around each call, so the checker
//! can bound what the server held at every instant.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use ratelimiter::{LeaseId, LimitKind};

/// The most records of each sort kept: a 60 s run at full speed stays far below
/// it; past it the run is marked incomplete and the check fails rather than
/// pass on partial data.
pub const RECORDS_MAX: usize = 20_000_000;
/// The most anomalies kept with their text (all are counted).
pub const ANOMALIES_KEPT_MAX: usize = 100;

/// Milliseconds since the Unix epoch on this machine's clock: the clock the
/// memory backend stamps `reserved_at_unix_ms` with.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_millis() as u64
}

/// One limit of the run, by index.
#[derive(Debug, Clone)]
pub struct LimitSpec {
    /// The key.
    pub key: String,
    /// Rolling or concurrency.
    pub kind: LimitKind,
    /// How long one hold lasts at most: the window or the timeout, in ms.
    pub hold_ms: u64,
}

/// An allowed reserve.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The lease.
    pub lease: LeaseId,
    /// The server's `reserved_at_unix_ms`: its holds end `hold_ms` after it.
    pub reserved_at_ms: u64,
    /// When the answer arrived: the hold surely exists from then on.
    pub answered_ms: u64,
    /// (limit index, amount).
    pub requirements: Vec<(usize, u64)>,
}

/// A complete sent for a granted lease.
#[derive(Debug, Clone)]
pub struct Completion {
    /// The lease.
    pub lease: LeaseId,
    /// When it was sent: the server carried it out no earlier.
    pub sent_ms: u64,
    /// (limit index, actual) for rolling limits.
    pub actuals: Vec<(usize, u64)>,
}

/// An answered `PUT /v1/admin/limits`.
#[derive(Debug, Clone)]
pub struct CapacityChange {
    /// The limit index.
    pub limit: usize,
    /// When the PUT was sent.
    pub sent_ms: u64,
    /// When its answer arrived.
    pub answered_ms: u64,
    /// The capacity in force after it.
    pub capacity: u64,
    /// The decrease it started; 0 when the limit is active.
    pub pending_decrease_to: u64,
    /// True when the PUT got no answer (the server was unreachable): it may or
    /// may not have been applied, and `capacity` is the one asked for.
    pub unknown: bool,
}

/// One limit as a `GET /v1/admin/limits` reported it.
#[derive(Debug, Clone)]
pub struct Observation {
    /// The limit index.
    pub limit: usize,
    /// When the GET was sent.
    pub sent_ms: u64,
    /// When its answer arrived.
    pub answered_ms: u64,
    /// The capacity in force.
    pub capacity: u64,
    /// True when no decrease is pending.
    pub active: bool,
    /// Units held.
    pub in_use: u64,
}

/// Everything one run recorded.
#[derive(Debug, Default)]
pub struct Records {
    /// Every allowed reserve.
    pub grants: Vec<Grant>,
    /// Every complete sent.
    pub completions: Vec<Completion>,
    /// Every capacity change, the initial definitions included.
    pub changes: Vec<CapacityChange>,
    /// Usage samples.
    pub observations: Vec<Observation>,
    /// Denials by wire error code (the key cut off).
    pub denials: std::collections::BTreeMap<String, u64>,
    /// Reserves whose outcome stayed unknown (503 after retries, timeouts).
    pub unknown: u64,
    /// Other calls the server did not answer (completes, PUTs, samples): only
    /// expected in runs that stop the server.
    pub unavailable: u64,
    /// Leases never completed on purpose.
    pub abandoned: u64,
    /// Idempotent replays checked.
    pub replays: u64,
    /// What broke a rule the checker does not derive from the records
    /// (an idempotency answer, a sample over capacity, an unexpected error).
    pub anomalies: Vec<String>,
    /// How many anomalies there were.
    pub anomalies_total: u64,
    /// True when a record had to be dropped at [`RECORDS_MAX`].
    pub truncated: bool,
}

/// The records, shared by every task of a run.
#[derive(Debug, Default)]
pub struct Recorder {
    records: Mutex<Records>,
}

fn push<T>(list: &mut Vec<T>, item: T, truncated: &mut bool) {
    if list.len() < RECORDS_MAX {
        list.push(item);
    } else {
        *truncated = true;
    }
}

impl Recorder {
    /// Records a grant.
    pub fn grant(&self, grant: Grant) {
        let mut r = self.records.lock().expect("records");
        let Records { grants, truncated, .. } = &mut *r;
        push(grants, grant, truncated);
    }

    /// Records a complete.
    pub fn completion(&self, completion: Completion) {
        let mut r = self.records.lock().expect("records");
        let Records {
            completions, truncated, ..
        } = &mut *r;
        push(completions, completion, truncated);
    }

    /// Records a capacity change.
    pub fn change(&self, change: CapacityChange) {
        let mut r = self.records.lock().expect("records");
        let Records { changes, truncated, .. } = &mut *r;
        push(changes, change, truncated);
    }

    /// Records usage samples.
    pub fn observations(&self, new: impl IntoIterator<Item = Observation>) {
        let mut r = self.records.lock().expect("records");
        let Records {
            observations,
            truncated,
            ..
        } = &mut *r;
        for observation in new {
            push(observations, observation, truncated);
        }
    }

    /// Counts a denial by its code.
    pub fn denial(&self, code: &str) {
        let code = code.split(':').next().unwrap_or(code).to_owned();
        *self.records.lock().expect("records").denials.entry(code).or_default() += 1;
    }

    /// Counts a reserve of unknown outcome.
    pub fn unknown(&self) {
        self.records.lock().expect("records").unknown += 1;
    }

    /// Counts a call other than a reserve that got no answer.
    pub fn unavailable(&self) {
        self.records.lock().expect("records").unavailable += 1;
    }

    /// Counts an abandoned lease.
    pub fn abandoned(&self) {
        self.records.lock().expect("records").abandoned += 1;
    }

    /// Counts a checked replay.
    pub fn replay(&self) {
        self.records.lock().expect("records").replays += 1;
    }

    /// Records something that broke a rule.
    pub fn anomaly(&self, what: String) {
        let mut r = self.records.lock().expect("records");
        r.anomalies_total += 1;
        if r.anomalies.len() < ANOMALIES_KEPT_MAX {
            r.anomalies.push(what);
        }
    }

    /// The records, leaving the recorder empty.
    pub fn take(&self) -> Records {
        std::mem::take(&mut *self.records.lock().expect("records"))
    }
}
