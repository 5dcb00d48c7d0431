//! The simulated provider's state: the provider with its [`Ledger`], shared by
//! every connection, and the concurrency slot a call holds. Its routes are in
//! [`crate::sim::routes`]; the wire formats, [`crate::sim::openai`] and
//! [`crate::sim::anthropic`]. Every call is admitted by the ledger, answered 429
//! with `retry-after` and rate-limit headers when refused, and takes a time that
//! grows with the output tokens.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, HeaderValue};
use ratelimiter::Clock;

use crate::sim::control::SimControl;
use crate::sim::limits::ProviderLimits;
use crate::sim::profile::SimProfile;
use crate::sim::provider::{Admission, Ledger, LedgerCounts, Remaining, Ticket, TokenLimit};
use crate::sim::vertex_auth::VertexAuth;

/// The most quota buckets of their own a provider keeps ([`ProviderServer::bucket`]):
/// Vertex AI serves about 40 regions; 4,096 covers every region for a hundred
/// models, and bounds what clients naming made-up regions can make it hold.
pub const BUCKETS_MAX: usize = 4_096;

/// The provider with its ledger, shared by every connection.
#[derive(Debug)]
pub struct ProviderServer {
    pub(crate) ledger: Mutex<Ledger>,
    pub(crate) clock: Arc<dyn Clock>,
    /// The models, key, fault switch and call counts of the wire formats.
    pub(crate) control: Arc<SimControl>,
    /// Vertex AI's token endpoint and the tokens it issued.
    vertex_auth: Mutex<Arc<VertexAuth>>,
    /// The quota buckets of a provider that keeps one per project, region and
    /// model (Vertex AI's Claude), by name; empty for the others.
    buckets: Mutex<HashMap<String, Arc<ProviderServer>>>,
}

impl ProviderServer {
    /// A provider enforcing `limits`, reading time from `clock`.
    pub fn new(limits: ProviderLimits, clock: Arc<dyn Clock>) -> Arc<Self> {
        Self::with_control(limits, clock, SimControl::default())
    }

    /// A provider enforcing `limits` that serves the models of `control` (and
    /// requires its key).
    pub fn with_control(limits: ProviderLimits, clock: Arc<dyn Clock>, control: SimControl) -> Arc<Self> {
        Arc::new(Self {
            ledger: Mutex::new(Ledger::new(limits)),
            clock,
            control: Arc::new(control),
            vertex_auth: Mutex::new(Arc::new(VertexAuth::default())),
            buckets: Mutex::new(HashMap::new()),
        })
    }

    /// Trusts `auth`'s service account at the Vertex AI token endpoint from now
    /// on (call it before serving): the buckets made after share it.
    pub fn set_vertex_auth(&self, auth: VertexAuth) {
        *self.vertex_auth.lock().expect("vertex lock") = Arc::new(auth);
    }

    /// The Vertex AI token endpoint and the tokens it issued.
    pub fn vertex_auth(&self) -> Arc<VertexAuth> {
        Arc::clone(&self.vertex_auth.lock().expect("vertex lock"))
    }

    /// The quota bucket `name` (Vertex AI's: `{project}/{region}/{model}`): a
    /// ledger of its own with this provider's limits and profile, sharing its
    /// models, key, faults, calls and bill; made at its first call. `None` past
    /// [`BUCKETS_MAX`] buckets.
    pub fn bucket(&self, name: &str) -> Option<Arc<ProviderServer>> {
        let mut buckets = self.buckets.lock().expect("buckets lock");
        if let Some(bucket) = buckets.get(name) {
            return Some(Arc::clone(bucket));
        }
        if buckets.len() >= BUCKETS_MAX {
            return None;
        }
        let ledger = {
            let ledger = self.ledger.lock().expect("ledger lock");
            Ledger::with_profile(*ledger.limits(), *ledger.profile(), self.clock.now_unix_ms())
        };
        let bucket = Arc::new(Self {
            ledger: Mutex::new(ledger),
            clock: Arc::clone(&self.clock),
            control: Arc::clone(&self.control),
            vertex_auth: Mutex::new(self.vertex_auth()),
            buckets: Mutex::new(HashMap::new()),
        });
        buckets.insert(name.to_owned(), Arc::clone(&bucket));
        Some(bucket)
    }

    /// The most model calls served at once since the start or the last reset.
    pub fn in_flight_max(&self) -> u64 {
        self.control.in_flight_max()
    }

    /// Every admission so far.
    pub fn admissions(&self) -> Vec<Admission> {
        self.ledger.lock().expect("ledger lock").admissions().to_vec()
    }

    /// The token limits enforced, in the order of [`Admission::settled_tokens`].
    pub fn token_limits(&self) -> Vec<TokenLimit> {
        self.ledger.lock().expect("ledger lock").token_limits()
    }

    /// The counts so far.
    pub fn counts(&self) -> LedgerCounts {
        self.ledger.lock().expect("ledger lock").counts()
    }

    /// The limits enforced.
    pub fn limits(&self) -> ProviderLimits {
        *self.ledger.lock().expect("ledger lock").limits()
    }

    /// Enforces the limits as `profile`'s provider does from now on, with an
    /// empty ledger (call it before serving).
    pub fn set_profile(&self, profile: SimProfile) {
        let mut ledger = self.ledger.lock().expect("ledger lock");
        *ledger = Ledger::with_profile(*ledger.limits(), profile, self.clock.now_unix_ms());
    }

    /// How many temporary credentials the simulated STS issued (`sim/sts.rs`).
    pub fn sts_issued(&self) -> u64 {
        self.control.sts().map_or(0, |sts| sts.issued_count())
    }

    /// The profile enforced.
    pub fn profile(&self) -> SimProfile {
        *self.ledger.lock().expect("ledger lock").profile()
    }
}

/// Releases the concurrency slot when the call ends, also when the client hangs
/// up mid-call and the handler is dropped.
pub struct Slot {
    pub(crate) provider: Arc<ProviderServer>,
    pub(crate) ticket: Ticket,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.provider.ledger.lock().expect("ledger lock").release(self.ticket);
    }
}

/// The sliding log's rate-limit headers, in OpenAI's names.
pub(crate) fn limit_headers(headers: &mut HeaderMap, limits: &ProviderLimits, remaining: Remaining) {
    let mut put = |name: &'static str, value: u64| {
        headers.insert(name, HeaderValue::from(value));
    };
    put("x-ratelimit-limit-requests", limits.rpm);
    put("x-ratelimit-limit-tokens", limits.tpm);
    put("x-ratelimit-remaining-requests", remaining.requests);
    put("x-ratelimit-remaining-tokens", remaining.tokens);
}

/// The sequence number of the next stored object the simulator names (a
/// response, a conversation): ids stay unique when two are made in one
/// millisecond, as a provider's are.
pub fn next_object_seq() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
