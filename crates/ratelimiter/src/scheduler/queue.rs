//! One model's queue: the jobs of one (provider, model), served by class in
//! proportion to the classes' shares and round-robin by tenant within a class, with
//! the waits its denials taught it.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};

use tokio::time::Instant;

use crate::model::key::LimitKey;

use super::class::{ClassTurns, WorkClass};
use super::entry::Entry;

/// The jobs of one (provider, model).
///
/// A denial on a key every job here needs (the model's rpm, token limits or concurrency)
/// pauses the whole queue until the retry time: every other job would be denied
/// too, and asking again would only load the limiter. A denial on a key only some
/// jobs need (a tenant's daily budget) gates that key: jobs needing it wait in
/// `blocked`, the rest go on.
///
/// A completion that frees what a pause waits for lets one job through as a
/// probe rather than ending the pause: a completion frees one call's room, and
/// letting every idle worker reserve at once would meet one grant and a denial
/// for each other worker (measured on the trace replay: about 14 denied
/// reserves per grant). A granted probe lets the next one through; the pause
/// ends for all when its retry time comes.
pub(super) struct WorkQueue {
    /// Keys every job of this queue reserves.
    shared_keys: SharedKeys,
    /// Jobs per (class, tenant); a lane lives while it has unfinished jobs here.
    lanes: HashMap<(usize, String), Lane>,
    /// Per class, the tenants with ready jobs in that class, in turn order.
    lane_rings: Vec<VecDeque<String>>,
    /// Which class the next take serves (super::class).
    turns: ClassTurns,
    /// Unfinished jobs per tenant over every class, for the per-tenant bound.
    tenant_jobs: HashMap<String, usize>,
    /// Jobs waiting for a gated key, earliest first.
    blocked: BinaryHeap<Reverse<Blocked>>,
    /// Keys that only some jobs need, denied until the given time.
    gates: HashMap<LimitKey, Instant>,
    /// No job of this queue is tried before this time.
    paused_until: Option<Instant>,
    /// The key whose denial set `paused_until`; `None` for an unknown outcome.
    paused_on: Option<LimitKey>,
    /// Whether a paused queue may let a probe through.
    probe: Probe,
    /// A completion freed room while the probe was in flight: if the probe is
    /// denied (it may have been sent before the room was freed), try another.
    freed_during_probe: bool,
    /// Unfinished jobs: ready, blocked or being attempted by a worker.
    jobs: usize,
    /// Whether the queue is in the board's ring of queues with ready work.
    pub in_ring: bool,
    /// The earliest time the board's timer will wake this queue.
    pub wake_at: Option<Instant>,
}

/// What a paused queue lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// Nothing until the pause ends.
    Closed,
    /// One job, since a completion freed room.
    Open,
    /// The job with this sequence number is the probe, in flight.
    InFlight(u64),
}

/// The keys every job of one (provider, model) reserves.
pub(super) struct SharedKeys {
    /// Requests per window.
    pub rpm: LimitKey,
    /// Every token limit per window: `tpm`, or a provider profile's token keys
    /// (Anthropic's input and output limits, `itpm` and `otpm`).
    pub tokens: Vec<LimitKey>,
    /// Calls in flight.
    pub concurrency: LimitKey,
}

impl SharedKeys {
    fn contains(&self, key: &LimitKey) -> bool {
        *key == self.rpm || *key == self.concurrency || self.tokens.contains(key)
    }
}

/// One tenant's jobs in one queue.
#[derive(Default)]
struct Lane {
    /// Ready jobs by submit order, so a job back from a wait keeps its place.
    ready: BTreeMap<u64, Entry>,
    /// Unfinished jobs: ready, blocked or being attempted.
    jobs: usize,
}

/// A job waiting for a gated key.
struct Blocked {
    not_before: Instant,
    entry: Entry,
}

impl Blocked {
    fn order_key(&self) -> (Instant, u64) {
        (self.not_before, self.entry.seq)
    }
}

impl PartialEq for Blocked {
    fn eq(&self, other: &Self) -> bool {
        self.order_key() == other.order_key()
    }
}

impl Eq for Blocked {}

impl PartialOrd for Blocked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Blocked {
    fn cmp(&self, other: &Self) -> Ordering {
        self.order_key().cmp(&other.order_key())
    }
}

impl WorkQueue {
    /// An empty queue whose jobs all reserve `shared_keys`, of the given classes.
    pub fn new(shared_keys: SharedKeys, classes: &[WorkClass]) -> Self {
        Self {
            shared_keys,
            lanes: HashMap::new(),
            lane_rings: vec![VecDeque::new(); classes.len()],
            turns: ClassTurns::new(classes),
            tenant_jobs: HashMap::new(),
            blocked: BinaryHeap::new(),
            gates: HashMap::new(),
            paused_until: None,
            paused_on: None,
            probe: Probe::Closed,
            freed_during_probe: false,
            jobs: 0,
            in_ring: false,
            wake_at: None,
        }
    }

    /// Unfinished jobs in this queue.
    pub fn jobs(&self) -> usize {
        self.jobs
    }

    /// Unfinished jobs of `tenant_id` in this queue.
    pub fn tenant_jobs(&self, tenant_id: &str) -> usize {
        self.tenant_jobs.get(tenant_id).copied().unwrap_or(0)
    }

    /// Accepts a new job.
    pub fn admit(&mut self, entry: Entry) {
        self.jobs += 1;
        *self.tenant_jobs.entry(entry.spec.tenant_id.clone()).or_default() += 1;
        let lane_key = (entry.class, entry.spec.tenant_id.clone());
        self.lanes.entry(lane_key).or_default().jobs += 1;
        self.make_ready(entry);
    }

    /// Puts an accepted job back among the ready ones, in its submit-order place.
    pub fn make_ready(&mut self, entry: Entry) {
        let class = entry.class;
        let tenant_id = entry.spec.tenant_id.clone();
        let lane = (self.lanes.get_mut(&(class, tenant_id.clone()))).expect("an unfinished job's lane exists");
        if lane.ready.is_empty() {
            if self.lane_rings[class].is_empty() {
                let waiting = self.waiting_classes().collect::<Vec<_>>();
                self.turns.rejoin(class, waiting.into_iter());
            }
            self.lane_rings[class].push_back(tenant_id.clone());
        }
        let lane = (self.lanes.get_mut(&(class, tenant_id))).expect("an unfinished job's lane exists");
        let previous = lane.ready.insert(entry.seq, entry);
        assert!(previous.is_none(), "a job is ready at most once");
    }

    /// The classes with ready jobs.
    fn waiting_classes(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.lane_rings.len()).filter(|class| !self.lane_rings[*class].is_empty())
    }

    /// True when `take` may return a job at `now`.
    pub fn has_ready(&self, now: Instant) -> bool {
        (!self.is_paused(now) || self.probe == Probe::Open) && self.waiting_classes().next().is_some()
    }

    fn is_paused(&self, now: Instant) -> bool {
        self.paused_until.is_some_and(|until| until > now)
    }

    /// The next job to attempt: the oldest ready job of the tenant whose turn it
    /// is. Jobs needing a gated key are moved to `blocked` on the way.
    pub fn take(&mut self, now: Instant) -> Option<Entry> {
        if !self.is_paused(now) {
            return self.take_next(now);
        }
        if self.probe != Probe::Open {
            return None;
        }
        let probe = self.take_next(now)?;
        self.probe = Probe::InFlight(probe.seq);
        Some(probe)
    }

    /// The oldest ready job of the next tenant in turn of the class whose turn it
    /// is. Jobs needing a gated key are moved to `blocked` on the way.
    fn take_next(&mut self, now: Instant) -> Option<Entry> {
        while let Some(class) = self.turns.next(self.waiting_classes()) {
            let ring = &mut self.lane_rings[class];
            let tenant_id = ring.pop_front().expect("a waiting class has a tenant in turn");
            let lane = (self.lanes.get_mut(&(class, tenant_id.clone()))).expect("a tenant in turn has a lane");
            let (_, entry) = lane.ready.pop_first().expect("a tenant in turn has a ready job");
            if !lane.ready.is_empty() {
                ring.push_back(tenant_id);
            }
            match self.gated_until(&entry, now) {
                Some(not_before) => self.blocked.push(Reverse(Blocked { not_before, entry })),
                None => {
                    self.turns.took(class);
                    return Some(entry);
                }
            }
        }
        None
    }

    fn gated_until(&self, entry: &Entry, now: Instant) -> Option<Instant> {
        entry
            .requirements
            .iter()
            .filter_map(|r| self.gates.get(&r.key))
            .copied()
            .filter(|until| *until > now)
            .max()
    }

    /// Records a "not now" denial of `entry` on `key` until `until`, and keeps the
    /// job until then.
    pub fn deny(&mut self, entry: Entry, key: &LimitKey, until: Instant) {
        // The take got no capacity: its class keeps its turn, so that turns count grants.
        self.turns.gave_back(entry.class);
        if self.probe == Probe::InFlight(entry.seq) {
            self.probe = if self.freed_during_probe {
                Probe::Open
            } else {
                Probe::Closed
            };
            self.freed_during_probe = false;
        }
        let needed_by_all = self.shared_keys.contains(key);
        let needed_by_entry = entry.requirements.iter().any(|r| &r.key == key);
        if needed_by_all || !needed_by_entry {
            // A key outside the job's requirements is the limiter's mistake; pausing
            // the whole queue is the safe reading of it.
            self.pause(until, Some(key));
            self.make_ready(entry);
        } else {
            let gate = self.gates.entry(key.clone()).or_insert(until);
            *gate = (*gate).max(until);
            self.blocked.push(Reverse(Blocked {
                not_before: until,
                entry,
            }));
        }
    }

    /// Keeps every job of this queue waiting until `until`, because of a denial
    /// on `key` or, when `None`, an unknown outcome.
    pub fn pause(&mut self, until: Instant, key: Option<&LimitKey>) {
        if self.paused_until.is_none_or(|current| current < until) {
            self.paused_until = Some(until);
            self.paused_on = key.cloned();
        }
    }

    /// Lets a probe through a pause on the concurrency key, or on a token key
    /// when the lease gave tokens back, since one of this queue's leases was just
    /// completed and freed what the pause waits for. Returns true when a probe
    /// may go now.
    ///
    /// The retry hint is a guess made before the completion; waiting it out would
    /// leave the freed capacity idle.
    pub fn resume_after_complete(&mut self, tokens_returned: bool) -> bool {
        let Some(key) = &self.paused_on else { return false };
        let freed = *key == self.shared_keys.concurrency || (tokens_returned && self.shared_keys.tokens.contains(key));
        match self.probe {
            _ if !freed => false,
            Probe::Closed => {
                self.probe = Probe::Open;
                true
            }
            Probe::Open => false,
            Probe::InFlight(_) => {
                self.freed_during_probe = true;
                false
            }
        }
    }

    /// Notes that the job `seq` was granted. Returns true when it was the probe
    /// of a queue still paused, which then lets the next probe through.
    pub fn granted(&mut self, seq: u64) -> bool {
        if self.probe != Probe::InFlight(seq) {
            return false;
        }
        self.probe = Probe::Open;
        self.freed_during_probe = false;
        true
    }

    /// Ends the waits that are over at `now`.
    pub fn release(&mut self, now: Instant) {
        if self.paused_until.is_some_and(|until| until <= now) {
            self.paused_until = None;
            self.paused_on = None;
            // A probe lost to an unknown outcome or a failed job ends here too.
            self.probe = Probe::Closed;
            self.freed_during_probe = false;
        }
        self.gates.retain(|_, until| *until > now);
        while self.blocked.peek().is_some_and(|b| b.0.not_before <= now) {
            let Reverse(blocked) = self.blocked.pop().expect("peeked");
            self.make_ready(blocked.entry);
        }
    }

    /// When the earliest wait ends, if any.
    pub fn next_wake(&self) -> Option<Instant> {
        let blocked = self.blocked.peek().map(|b| b.0.not_before);
        match (self.paused_until, blocked) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Puts back a job whose reserve outcome is unknown; the queue waits until
    /// `until`. Like a denial, the take gives its class's turn back.
    pub fn defer(&mut self, entry: Entry, until: Instant) {
        self.turns.gave_back(entry.class);
        self.pause(until, None);
        self.make_ready(entry);
    }

    /// Forgets a finished job of `tenant_id` in class `class`.
    pub fn retire(&mut self, tenant_id: &str, class: usize) {
        let lane_key = (class, tenant_id.to_owned());
        let lane = self.lanes.get_mut(&lane_key).expect("a finished job's lane exists");
        lane.jobs -= 1;
        if lane.jobs == 0 {
            assert!(lane.ready.is_empty(), "a lane without jobs has no ready job");
            self.lanes.remove(&lane_key);
        }
        let tenant_jobs = self
            .tenant_jobs
            .get_mut(tenant_id)
            .expect("a finished job's tenant is counted");
        *tenant_jobs -= 1;
        if *tenant_jobs == 0 {
            self.tenant_jobs.remove(tenant_id);
        }
        self.jobs -= 1;
    }

    /// Takes every ready and blocked job out, leaving their counts to `retire`.
    pub fn drain(&mut self) -> Vec<Entry> {
        let mut entries: Vec<Entry> = self.blocked.drain().map(|b| b.0.entry).collect();
        for lane in self.lanes.values_mut() {
            entries.extend(std::mem::take(&mut lane.ready).into_values());
        }
        self.lane_rings.iter_mut().for_each(VecDeque::clear);
        entries
    }
}
