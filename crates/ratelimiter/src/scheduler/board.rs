//! The scheduler's shared state: every queue, whose turn it is, when waits end,
//! and the counts that bound memory. Held under one mutex, never across an await.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::model::key::LimitKey;

use super::config::SchedulerConfig;
use super::entry::Entry;
use super::error::SubmitErrorKind;
use super::job::JobSpec;
use super::queue::{SharedKeys, WorkQueue};
use super::report::ShutdownReport;

/// The longest wait the scheduler honours, in ms: no limit frees capacity later than its
/// window, and the longest window is 31 days (docs/http-api.md, "LimitDefinition").
/// Longer hints are cut to this, which also keeps `Instant` arithmetic from overflowing.
pub(super) const WAIT_MS_MAX: u64 = 2_678_400_000;

/// Timer entries kept per live queue before the timer heap is rebuilt: a queue
/// whose wake moves earlier leaves a stale entry behind, and those must not pile up.
const TIMERS_PER_QUEUE_MAX: usize = 4;

/// Identifies a queue for as long as it lives.
pub(super) type QueueId = u64;

/// A job a worker took, with the queue it came from.
pub(super) struct Taken {
    /// The job's queue.
    pub queue: QueueId,
    /// The job.
    pub entry: Entry,
}

/// Every queue and the bookkeeping around them.
pub(super) struct Board {
    config: SchedulerConfig,
    /// Queue ids by (provider, model).
    classes: HashMap<(String, String), QueueId>,
    queues: HashMap<QueueId, WorkQueue>,
    /// Queues with ready work, in turn order.
    ring: VecDeque<QueueId>,
    /// When each queue's next wait ends; entries that no longer match the
    /// queue's `wake_at` are stale and skipped.
    timers: BinaryHeap<Reverse<(Instant, QueueId)>>,
    next_queue_id: QueueId,
    next_seq: u64,
    /// Jobs accepted and not yet answered.
    jobs: usize,
    /// Set by shutdown: no job is accepted or started any more.
    closed: bool,
    report: ShutdownReport,
    /// The jitter's random source.
    rng: StdRng,
}

impl Board {
    /// An empty board.
    pub fn new(config: SchedulerConfig) -> Self {
        let rng = match config.jitter_seed() {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_entropy(),
        };
        Self {
            config,
            classes: HashMap::new(),
            queues: HashMap::new(),
            ring: VecDeque::new(),
            timers: BinaryHeap::new(),
            next_queue_id: 0,
            next_seq: 0,
            jobs: 0,
            closed: false,
            report: ShutdownReport::default(),
            rng,
        }
    }

    /// Accepts `entry`, which [`Board::check_room`] let in. Returns true when a
    /// worker should be woken for it.
    pub fn admit(&mut self, mut entry: Entry, now: Instant) -> bool {
        let class = (entry.spec.provider.clone(), entry.spec.model.clone());
        let queue_id = match self.classes.get(&class) {
            Some(id) => *id,
            None => self.create_queue(class),
        };
        entry.seq = self.next_seq;
        self.next_seq += 1;
        self.jobs += 1;
        self.queue(queue_id).admit(entry);
        self.enlist(queue_id, now)
    }

    /// Checks that a job of `spec` may be admitted now.
    pub fn check_room(&self, spec: &JobSpec) -> Result<(), SubmitErrorKind> {
        if self.closed {
            return Err(SubmitErrorKind::ShutDown);
        }
        if self.jobs >= self.config.jobs_max() {
            return Err(SubmitErrorKind::SchedulerFull {
                jobs_max: self.config.jobs_max(),
            });
        }
        let class = (spec.provider.clone(), spec.model.clone());
        let Some(queue) = self.classes.get(&class).map(|id| &self.queues[id]) else {
            if self.queues.len() >= self.config.queues_max() {
                return Err(SubmitErrorKind::TooManyQueues {
                    queues_max: self.config.queues_max(),
                });
            }
            return Ok(());
        };
        if queue.jobs() >= self.config.queue_jobs_max() {
            return Err(SubmitErrorKind::QueueFull {
                provider: spec.provider.clone(),
                model: spec.model.clone(),
                queue_jobs_max: self.config.queue_jobs_max(),
            });
        }
        if queue.tenant_jobs(&spec.tenant_id) >= self.config.tenant_jobs_max() {
            return Err(SubmitErrorKind::TenantFull {
                tenant_id: spec.tenant_id.clone(),
                provider: spec.provider.clone(),
                model: spec.model.clone(),
                tenant_jobs_max: self.config.tenant_jobs_max(),
            });
        }
        Ok(())
    }

    fn create_queue(&mut self, class: (String, String)) -> QueueId {
        let (provider, model) = (&class.0, &class.1);
        // A profile's jobs reserve its token keys instead of `tpm` (Anthropic: input
        // and output apart); the queue must know them to pause on a denial of any and
        // to resume when a Complete frees room on any.
        let tokens = match self.config.profile_rules(provider, model) {
            Some(rules) => rules.token_keys(),
            None => vec![LimitKey::llm_tpm(provider, model).expect("validated at submit")],
        };
        let shared_keys = SharedKeys {
            rpm: LimitKey::llm_rpm(provider, model).expect("validated at submit"),
            tokens,
            concurrency: LimitKey::llm_concurrency(provider, model).expect("validated at submit"),
        };
        let id = self.next_queue_id;
        self.next_queue_id += 1;
        self.queues
            .insert(id, WorkQueue::new(shared_keys, self.config.classes()));
        self.classes.insert(class, id);
        id
    }

    fn queue(&mut self, id: QueueId) -> &mut WorkQueue {
        self.queues.get_mut(&id).expect("a queue with unfinished jobs exists")
    }

    /// Puts the queue in the ring if it has ready work. Returns true if it was added.
    fn enlist(&mut self, id: QueueId, now: Instant) -> bool {
        let queue = self.queue(id);
        if queue.in_ring || !queue.has_ready(now) {
            return false;
        }
        queue.in_ring = true;
        self.ring.push_back(id);
        true
    }

    /// The next job to attempt at `now`, taking queues in turn.
    pub fn take(&mut self, now: Instant) -> Option<Taken> {
        self.release_due(now);
        for _ in 0..self.ring.len() {
            let id = self.ring.pop_front().expect("counted");
            let queue = self.queue(id);
            queue.in_ring = false;
            let entry = queue.take(now);
            // Taking may have moved gated jobs to `blocked`, which needs a timer.
            self.schedule(id);
            if let Some(entry) = entry {
                self.enlist(id, now);
                return Some(Taken { queue: id, entry });
            }
        }
        None
    }

    /// True when some queue has work a worker could take now.
    pub fn has_ready(&self) -> bool {
        !self.ring.is_empty()
    }

    /// The earliest time a wait ends, for idle workers to sleep until.
    pub fn next_wake(&self) -> Option<Instant> {
        self.timers.peek().map(|t| t.0 .0)
    }

    /// Ends every wait that is over at `now` and puts queues with ready work in turn.
    fn release_due(&mut self, now: Instant) {
        while let Some(&Reverse((at, id))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(queue) = self.queues.get_mut(&id) else {
                continue;
            };
            if queue.wake_at != Some(at) {
                continue;
            }
            queue.wake_at = None;
            queue.release(now);
            self.schedule(id);
            self.enlist(id, now);
        }
    }

    /// Makes sure a timer fires when the queue's earliest wait ends.
    fn schedule(&mut self, id: QueueId) {
        let queue = self.queue(id);
        let Some(at) = queue.next_wake() else { return };
        if queue.wake_at.is_some_and(|current| current <= at) {
            return;
        }
        queue.wake_at = Some(at);
        self.timers.push(Reverse((at, id)));
        if self.timers.len() > TIMERS_PER_QUEUE_MAX * self.queues.len() {
            self.timers = self
                .queues
                .iter()
                .filter_map(|(id, q)| q.wake_at.map(|at| Reverse((at, *id))))
                .collect();
        }
    }

    /// The time `retry_after_ms` plus jitter from `now`, cut to [`WAIT_MS_MAX`].
    pub fn retry_time(&mut self, now: Instant, retry_after_ms: u64) -> Instant {
        let jitter_ms = self.rng.gen_range(0..=self.config.jitter_ms_max());
        let wait_ms = retry_after_ms.saturating_add(jitter_ms).min(WAIT_MS_MAX);
        now + Duration::from_millis(wait_ms)
    }

    /// Takes back a job denied "not now" on `key`; it waits until `until`. A closed
    /// board gives the job back: it will not run.
    pub fn deny(&mut self, taken: Taken, key: &LimitKey, until: Instant) -> Option<Entry> {
        self.put_back(taken, |queue, entry| queue.deny(entry, key, until))
    }

    /// Takes back a job whose reserve outcome is unknown; its queue waits until
    /// `until`. A closed board gives the job back.
    pub fn defer(&mut self, taken: Taken, until: Instant) -> Option<Entry> {
        self.put_back(taken, |queue, entry| queue.defer(entry, until))
    }

    fn put_back(&mut self, taken: Taken, put: impl FnOnce(&mut WorkQueue, Entry)) -> Option<Entry> {
        if self.closed {
            return Some(taken.entry);
        }
        put(self.queue(taken.queue), taken.entry);
        self.schedule(taken.queue);
        None
    }

    /// Notes that a lease of the queue was completed, giving back its concurrency
    /// and, when `tokens_returned`, tokens. Returns true when the queue's pause
    /// ended and a worker should be woken.
    pub fn lease_completed(&mut self, queue_id: QueueId, tokens_returned: bool, now: Instant) -> bool {
        self.queue(queue_id).resume_after_complete(tokens_returned) && self.enlist(queue_id, now)
    }

    /// Notes that the job `seq` of the queue was granted. Returns true when it
    /// was a paused queue's probe and the next probe should be taken.
    pub fn granted(&mut self, queue_id: QueueId, seq: u64, now: Instant) -> bool {
        self.queue(queue_id).granted(seq) && self.enlist(queue_id, now)
    }

    /// Forgets a job whose handle is being answered, and its queue once empty.
    pub fn retire(&mut self, queue_id: QueueId, tenant_id: &str, class: usize) {
        self.jobs -= 1;
        let queue = self.queue(queue_id);
        queue.retire(tenant_id, class);
        if queue.jobs() == 0 {
            self.queues.remove(&queue_id);
            self.classes.retain(|_, id| *id != queue_id);
            self.ring.retain(|id| *id != queue_id);
        }
    }

    /// Stops intake and takes out every job not being attempted, oldest first.
    /// The caller answers them and retires them.
    pub fn close(&mut self) -> Vec<(QueueId, Entry)> {
        self.closed = true;
        let mut drained: Vec<(QueueId, Entry)> = Vec::new();
        for (id, queue) in &mut self.queues {
            drained.extend(queue.drain().into_iter().map(|e| (*id, e)));
        }
        drained.sort_by_key(|(_, e)| e.seq);
        self.ring.clear();
        drained
    }

    /// True once shutdown began.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Notes a job that will not run, for the shutdown report.
    pub fn note_not_run(&mut self, job_id: &str) {
        self.report.not_run.push(job_id.to_owned());
    }

    /// Notes a job stopped at the deadline, for the shutdown report.
    pub fn note_aborted(&mut self, job_id: &str) {
        self.report.aborted.push(job_id.to_owned());
    }

    /// The shutdown report so far.
    pub fn take_report(&mut self) -> ShutdownReport {
        std::mem::take(&mut self.report)
    }

    /// Jobs accepted and not yet answered.
    pub fn jobs(&self) -> usize {
        self.jobs
    }
}
