//! The fair wait queue of one model (docs/gateway.md, "Waiting"): a denied call
//! waits its turn; waiting classes share freed capacity by their shares
//! (docs/gateway.md, "Classes"; the library scheduler's rule) and tenants take
//! turns round robin within a class; each model has its own queue and its own
//! pump, so a saturated model never holds up another.
//!
//! Classes wait per cause: only a wait on a shared key (the model's, a
//! deployment's, a class ceiling) orders the classes. A call denied by a limit of
//! its own (its tenant's, its key's: [`is_own_key`]) is *parked*: its tenant's
//! line leaves the turns until the limit's retry hint (at most
//! [`PUMP_SLEEP_MAX_MS`]), so it never holds back the calls of other tenants, in
//! its class or below, whose limits have room.
//!
//! The pump is the scheduler's idea (`ratelimiter::scheduler`) cut to what a
//! proxy needs: the waiting call is a client connection, not a job to run, so
//! the pump only reserves for the waiter at the head of the turn and hands it
//! the lease; the handler then calls the upstream itself.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ratelimiter::scheduler::{ClassTurns, WorkClass};
use ratelimiter::{Denial, Limiter};
use tokio::sync::{oneshot, Notify};

use crate::limits::{denial_key, is_own_key, CapacityFreed};
use crate::routing::{Grant, Need, Pool, Refusal};

/// The most calls waiting on one model; more are answered 429 at once, so a
/// stampede cannot grow memory without bound.
pub const WAITERS_MAX: usize = 10_000;
/// The longest the pump sleeps before it tries again without being woken: a
/// completion on another server of a fleet frees capacity without waking us.
/// It is also the longest a line stays parked on its own limit, for the same reason.
pub const PUMP_SLEEP_MAX_MS: u64 = 100;

/// The last denial of one waiting call, shared between the pump, which records
/// it, and the call, which answers its 429 with it.
type DenialSlot = Arc<Mutex<Option<Denial>>>;

struct Waiter {
    need: Need,
    reply: oneshot::Sender<Result<Grant, Refusal>>,
    denial: DenialSlot,
}

/// A queued call's side of its wait: the channel its lease comes on, and the
/// last denial seen for it.
pub struct Ticket {
    /// Where the grant (or the final refusal) comes.
    pub grant: oneshot::Receiver<Result<Grant, Refusal>>,
    denial: DenialSlot,
}

impl Ticket {
    /// The last denial of this call: the key that denied *it*, with its hint.
    pub fn last_denial(&self) -> Option<Denial> {
        self.denial.lock().expect("denial lock").clone()
    }
}

/// What the pump does next.
enum Next {
    /// Reserve for this waiter of this tenant.
    Try(usize, Waiter),
    /// Only parked lines wait: sleep up to this long (or until woken).
    Sleep(Duration),
    /// Nothing waits: the pump stops.
    Done,
}

struct State {
    /// Per class, the tenants with waiters of that class in turn order, parked ones aside.
    order: Vec<VecDeque<usize>>,
    /// Waiters by (class, tenant).
    waiting: HashMap<(usize, usize), VecDeque<Waiter>>,
    /// Lines whose head waits on its own limit, with when to try it again; out
    /// of `order`, so they hold back no one. Every line of `waiting` is in
    /// exactly one of `order` and `parked`.
    parked: HashMap<(usize, usize), Instant>,
    /// Which class the next waiter comes from.
    turns: ClassTurns,
    len: usize,
    pumping: bool,
    /// The class of the waiter the pump holds while it reserves for it.
    held: Option<usize>,
    /// The last denial on a shared key.
    last_denial: Option<Denial>,
}

impl State {
    fn new(classes: &[WorkClass]) -> Self {
        Self {
            order: vec![VecDeque::new(); classes.len()],
            waiting: HashMap::new(),
            parked: HashMap::new(),
            turns: ClassTurns::new(classes),
            len: 0,
            pumping: false,
            held: None,
            last_denial: None,
        }
    }

    /// The classes with waiters in turn (parked lines aside).
    fn waiting_classes(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.order.len()).filter(|class| !self.order[*class].is_empty())
    }

    /// Puts the line (`class`, `tenant`) back in its class's turns, at the back
    /// or the front; a class that had none in turn rejoins at the pass of the
    /// classes waiting (no turns banked while idle).
    fn line_in_turn(&mut self, class: usize, tenant: usize, front: bool) {
        if self.order[class].is_empty() {
            let waiting: Vec<usize> = self.waiting_classes().collect();
            self.turns.rejoin(class, waiting.into_iter());
        }
        if front {
            self.order[class].push_front(tenant);
        } else {
            self.order[class].push_back(tenant);
        }
    }

    /// Puts back in turn the parked lines whose time has come; answers the time
    /// to the next one still parked.
    fn unpark_due(&mut self, now: Instant) -> Option<Duration> {
        let due: Vec<(usize, usize)> = (self.parked.iter())
            .filter(|(_, until)| **until <= now)
            .map(|(line, _)| *line)
            .collect();
        for (class, tenant) in due {
            self.parked.remove(&(class, tenant));
            self.line_in_turn(class, tenant, false);
        }
        self.parked
            .values()
            .min()
            .map(|until| until.saturating_duration_since(now))
    }
}

/// One model's queue.
pub struct ModelQueue {
    state: Mutex<State>,
    wake: Notify,
}

impl Default for ModelQueue {
    /// A queue of one class.
    fn default() -> Self {
        let class = WorkClass::new(ratelimiter::scheduler::DEFAULT_CLASS, 1).expect("the default class is valid");
        Self::new(&[class])
    }
}

impl ModelQueue {
    /// A queue whose waiters come in `classes`, highest first.
    pub fn new(classes: &[WorkClass]) -> Self {
        Self {
            state: Mutex::new(State::new(classes)),
            wake: Notify::new(),
        }
    }

    /// Whether a new call of `tenant` in `class` queues behind others: calls of
    /// `class` or above waiting on shared keys (or held by the pump), or calls of
    /// the same tenant at `class` or above (its own come in order). Waiters of lower
    /// classes do not hold it back: the headroom above them is not theirs; nor
    /// do other tenants' lines parked on their own limits.
    pub fn is_busy(&self, class: usize, tenant: usize) -> bool {
        let state = self.state.lock().expect("queue lock");
        state.held.is_some_and(|held| held <= class)
            || state.waiting_classes().any(|c| c <= class)
            || (0..=class).any(|c| state.waiting.contains_key(&(c, tenant)))
    }

    /// Calls waiting now (the operator's console shows it).
    pub fn waiting(&self) -> usize {
        self.state.lock().expect("queue lock").len
    }

    /// Calls waiting now per class (by index, highest first), for the console's classes.
    pub fn waiting_by_class(&self) -> Vec<usize> {
        let state = self.state.lock().expect("queue lock");
        let mut out = vec![0; state.order.len()];
        for ((class, _), waiters) in &state.waiting {
            out[*class] += waiters.len();
        }
        out
    }

    /// Wakes the pump: capacity was just freed on this server.
    pub fn capacity_freed(&self) {
        self.wake.notify_one();
    }

    /// The last denial the pump saw on a shared key (the model's, a deployment's,
    /// a ceiling), for the 429 of a call that waited without being tried.
    pub fn last_denial(&self) -> Option<Denial> {
        self.state.lock().expect("queue lock").last_denial.clone()
    }

    /// Queues a call of `tenant` (an index; tenants without a key share one) in
    /// its class (`need.class`); `denied` is the denial of its try before it
    /// queued, if any: on its own key, its line starts parked. Returns its ticket.
    pub fn enqueue(
        self: &Arc<Self>,
        limiter: &Arc<dyn Limiter>,
        pool: &Arc<Pool>,
        (tenant, need): (usize, Need),
        denied: Option<Denial>,
    ) -> Result<Ticket, Refusal> {
        let (reply, grant) = oneshot::channel();
        let mut state = self.state.lock().expect("queue lock");
        if state.len >= WAITERS_MAX {
            return Err(Refusal::QueueFull);
        }
        let class = need.class;
        let parked_ms = denied.as_ref().and_then(own_park_ms);
        let line = (class, tenant);
        let new_line = !state.waiting.contains_key(&line);
        let class_was_idle = state.order[class].is_empty();
        if new_line {
            match parked_ms {
                Some(ms) => {
                    state.parked.insert(line, Instant::now() + Duration::from_millis(ms));
                }
                None => state.line_in_turn(class, tenant, false),
            }
        }
        // Behind a parked line, the call waits on what its head waits on.
        let denied = denied.or_else(|| {
            let head = state.waiting.get(&line).and_then(|queue| queue.front());
            head.filter(|_| state.parked.contains_key(&line))
                .and_then(|head| head.denial.lock().expect("denial lock").clone())
        });
        let denial = Arc::new(Mutex::new(denied));
        let waiter = Waiter {
            need,
            reply,
            denial: denial.clone(),
        };
        state.waiting.entry(line).or_default().push_back(waiter);
        state.len += 1;
        if !state.pumping {
            state.pumping = true;
            tokio::spawn(pump(self.clone(), limiter.clone(), pool.clone()));
        } else if new_line && (class_was_idle || parked_ms.is_some()) {
            // The pump may be sleeping on a lower class's denial (this class may
            // fit now), or on a parked line due later than this one.
            self.wake.notify_one();
        }
        Ok(Ticket { grant, denial })
    }

    /// The next live waiter, of the class whose turn it is and the tenant next in
    /// turn within it; else how long until a parked line is due; else `Done` (and
    /// the pump stops).
    fn next(&self) -> Next {
        let mut guard = self.state.lock().expect("queue lock");
        let state: &mut State = &mut guard;
        state.held = None;
        let parked_for = state.unpark_due(Instant::now());
        while let Some(class) = state.turns.next(state.waiting_classes()) {
            let tenant = state.order[class].pop_front().expect("a waiting class has a tenant");
            let queue = state.waiting.get_mut(&(class, tenant)).expect("ordered tenants wait");
            let mut found = None;
            while let Some(waiter) = queue.pop_front() {
                if !waiter.reply.is_closed() {
                    found = Some(waiter);
                    break;
                }
                state.len -= 1;
            }
            let queue = state.waiting.get_mut(&(class, tenant)).expect("ordered tenants wait");
            if let Some(waiter) = found {
                state.len -= 1;
                if queue.is_empty() {
                    state.waiting.remove(&(class, tenant));
                } else {
                    state.order[class].push_back(tenant);
                }
                state.turns.took(class);
                state.held = Some(class);
                return Next::Try(tenant, waiter);
            }
            state.waiting.remove(&(class, tenant));
        }
        if let Some(duration) = parked_for {
            return Next::Sleep(duration.max(Duration::from_millis(1)));
        }
        state.pumping = false;
        Next::Done
    }

    /// Puts a denied waiter back at the head of its tenant's line. Denied on a
    /// shared key, its class keeps its turn and its tenant its place; denied on
    /// its own key (`parked_ms`), its line leaves the turns for that long.
    fn put_back(&self, tenant: usize, waiter: Waiter, denial: Option<Denial>, parked_ms: Option<u64>) {
        let mut guard = self.state.lock().expect("queue lock");
        let state: &mut State = &mut guard;
        if let Some(denial) = &denial {
            if parked_ms.is_none() {
                state.last_denial = Some(denial.clone());
            }
            *waiter.denial.lock().expect("denial lock") = Some(denial.clone());
        }
        state.len += 1;
        state.held = None;
        let class = waiter.need.class;
        state.turns.gave_back(class);
        let line = (class, tenant);
        let queue = state.waiting.entry(line).or_default();
        let was_empty = queue.is_empty();
        queue.push_front(waiter);
        // `next` put the line back in turn if it had more waiters: take it out.
        if !was_empty {
            if let Some(pos) = state.order[class].iter().position(|t| *t == tenant) {
                state.order[class].remove(pos);
            }
        }
        match parked_ms {
            Some(ms) => {
                // The whole line waits on its tenant's limit: each call's 429 says so.
                for behind in queue.iter().skip(1) {
                    *behind.denial.lock().expect("denial lock") = denial.clone();
                }
                state.parked.insert(line, Instant::now() + Duration::from_millis(ms));
            }
            // Its class was in turn a moment ago and keeps its pass: no rejoin.
            // (A call of the tenant that queued meanwhile may have parked the line.)
            None => {
                state.parked.remove(&line);
                state.order[class].push_front(tenant);
            }
        }
    }
}

/// How long a line denied by `denial` stays parked: the denial's hint (at most
/// [`PUMP_SLEEP_MAX_MS`]) when it names one of the caller's own keys; `None` for
/// a shared key's denial, which orders the classes.
fn own_park_ms(denial: &Denial) -> Option<u64> {
    let own = denial_key(denial).is_some_and(is_own_key);
    own.then(|| denial.retry_after_ms().clamp(1, PUMP_SLEEP_MAX_MS))
}

impl CapacityFreed for ModelQueue {
    fn capacity_freed(&self) {
        ModelQueue::capacity_freed(self);
    }
}

/// Reserves for the waiters in turn until none is left, each on the first
/// deployment of the model's pool that holds it.
async fn pump(queue: Arc<ModelQueue>, limiter: Arc<dyn Limiter>, pool: Arc<Pool>) {
    loop {
        let (tenant, waiter) = match queue.next() {
            Next::Try(tenant, waiter) => (tenant, waiter),
            Next::Sleep(duration) => {
                tokio::select! {
                    () = tokio::time::sleep(duration) => {}
                    () = queue.wake.notified() => {}
                }
                continue;
            }
            Next::Done => return,
        };
        let freed: Arc<dyn CapacityFreed> = queue.clone();
        let (denial, retry_after_ms) = match pool.reserve(&limiter, &freed, &waiter.need).await {
            Ok(grant) => {
                // The grant travels in its guard: a client that left before the
                // hand-over, or leaves with the grant unread in the channel, drops
                // it, and nothing was sent upstream, so everything is given back.
                let _ = waiter.reply.send(Ok(grant));
                continue;
            }
            Err(Refusal::Denied(denial)) if !denial.is_permanent() => {
                let retry_after_ms = denial.retry_after_ms();
                (Some(denial), retry_after_ms)
            }
            Err(Refusal::Failing { retry_after_ms }) if retry_after_ms > 0 => (None, retry_after_ms),
            Err(refusal) => {
                let _ = waiter.reply.send(Err(refusal));
                continue;
            }
        };
        let parked_ms = denial.as_ref().and_then(own_park_ms);
        queue.put_back(tenant, waiter, denial, parked_ms);
        if parked_ms.is_none() {
            // A shared key is full: nobody of this class or below fits before it frees.
            let sleep_ms = retry_after_ms.clamp(1, PUMP_SLEEP_MAX_MS);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(sleep_ms)) => {}
                () = queue.wake.notified() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::resolve;
    use crate::config::ModelConfig;
    use crate::routing::{Deployment, DeploymentState};
    use ratelimiter::{
        Backend, CompleteRequest, LeaseId, LimitDefinition, LimitKey, MemoryBackend, MemoryConfig, Requirement,
        ReserveRequest, SystemClock,
    };

    fn slot() -> LimitKey {
        LimitKey::new("global:llm:test:m:concurrency").unwrap()
    }

    /// A memory backend with one slot, the pool of one deployment holding it, and
    /// what one call needs.
    async fn one_slot() -> (Arc<MemoryBackend>, Arc<dyn Limiter>, Arc<Pool>, Need) {
        let backend = Arc::new(MemoryBackend::new(
            Arc::new(SystemClock::new()),
            MemoryConfig::default(),
        ));
        backend
            .apply_definition(&LimitDefinition::concurrency(slot(), 1, 60).unwrap())
            .await
            .unwrap();
        let limiter: Arc<dyn Limiter> = backend.clone();
        let model: ModelConfig =
            serde_yaml::from_str("{name: m, upstream: test, concurrency: 1, max_output_tokens_default: 1}").unwrap();
        let resolved = &resolve(&model)[0];
        let stats = Arc::new(DeploymentState::new(
            "m",
            "test",
            "m",
            None,
            Arc::new(SystemClock::new()),
        ));
        let pool = Arc::new(Pool::new(
            vec![Deployment::new("m", resolved, (0, (None, Vec::new())), &[], stats)],
            model.routing,
            Arc::new(SystemClock::new()),
        ));
        let need = Need {
            tenant: None,
            input_tokens: 1,
            prompt_characters: 0,
            output_tokens: 1,
            tried: 0,
            class: 0,
            classes: Arc::new(crate::limits::classes::Classes::new(&[])),
            owner: None,
        };
        (backend, limiter, pool, need)
    }

    #[tokio::test]
    async fn tenants_take_turns_and_a_call_gets_its_lease() {
        let (_backend, limiter, pool, need) = one_slot().await;
        // The slot is taken: every call below has to wait.
        let holder = LeaseId::generate();
        let request = ReserveRequest::new(holder, None, vec![Requirement { key: slot(), amount: 1 }]).unwrap();
        assert!(limiter.reserve(&request).await.unwrap().is_allowed());
        let queue = Arc::new(ModelQueue::default());
        // Tenant 0 queues three calls before tenant 1 queues one.
        let mut waiting = Vec::new();
        for tenant in [0, 0, 0, 1] {
            waiting.push((
                tenant,
                queue
                    .enqueue(&limiter, &pool, (tenant, need.clone()), None)
                    .unwrap()
                    .grant,
            ));
        }
        assert!(queue.is_busy(0, 7));
        let mut order = Vec::new();
        let mut held = holder;
        for _ in 0..4 {
            limiter
                .complete(&CompleteRequest::new(held, None, Vec::new()).unwrap())
                .await
                .unwrap();
            queue.capacity_freed();
            // Exactly one waiter gets the slot; find it.
            let (index, lease) = loop {
                let mut granted = None;
                for (i, (_, receiver)) in waiting.iter_mut().enumerate() {
                    if let Ok(result) = receiver.try_recv() {
                        granted = Some((i, result.unwrap().take().unwrap()));
                        break;
                    }
                }
                if let Some(found) = granted {
                    break found;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            };
            order.push(waiting.remove(index).0);
            held = lease;
        }
        // Round robin: tenant 1's one call goes second, not after tenant 0's three.
        assert_eq!(order, vec![0, 1, 0, 0]);
        assert!(!queue.is_busy(0, 7));
    }

    #[tokio::test]
    async fn waiting_calls_are_counted_per_class() {
        let (_backend, limiter, pool, need) = one_slot().await;
        let request =
            ReserveRequest::new(LeaseId::generate(), None, vec![Requirement { key: slot(), amount: 1 }]).unwrap();
        assert!(limiter.reserve(&request).await.unwrap().is_allowed());
        let class = |name: &str| crate::config::ClassConfig {
            name: name.to_owned(),
            share: 1,
            headroom: Default::default(),
        };
        let classes = Arc::new(crate::limits::classes::Classes::new(&[
            class("interactive"),
            class("batch"),
        ]));
        let queue = Arc::new(ModelQueue::new(classes.work_classes()));
        let mut receivers = Vec::new();
        for (tenant, class) in [(0, 1), (1, 1), (2, 1), (3, 0), (3, 0)] {
            let need = Need {
                class,
                classes: classes.clone(),
                ..need.clone()
            };
            receivers.push(queue.enqueue(&limiter, &pool, (tenant, need), None).unwrap().grant);
        }
        // The pump holds one waiter for a moment while it tries; all are back between tries.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while queue.waiting_by_class() != vec![2, 3] {
            assert!(std::time::Instant::now() < deadline, "{:?}", queue.waiting_by_class());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(queue.waiting(), 5);
    }

    #[tokio::test]
    async fn freed_capacity_goes_to_waiting_classes_by_their_shares() {
        let (_backend, limiter, pool, need) = one_slot().await;
        let holder = LeaseId::generate();
        let request = ReserveRequest::new(holder, None, vec![Requirement { key: slot(), amount: 1 }]).unwrap();
        assert!(limiter.reserve(&request).await.unwrap().is_allowed());
        let class = |name: &str, share: u32| crate::config::ClassConfig {
            name: name.to_owned(),
            share,
            headroom: Default::default(),
        };
        let classes = Arc::new(crate::limits::classes::Classes::new(&[
            class("interactive", 4),
            class("batch", 1),
        ]));
        let queue = Arc::new(ModelQueue::new(classes.work_classes()));
        let of_class = |class: usize| Need {
            class,
            classes: classes.clone(),
            ..need.clone()
        };
        let mut waiting = Vec::new();
        // Batch queues first, from many tenants: neither earns it more turns.
        for tenant in 0..40 {
            waiting.push((
                1,
                queue
                    .enqueue(&limiter, &pool, (tenant, of_class(1)), None)
                    .unwrap()
                    .grant,
            ));
        }
        assert!(
            queue.is_busy(1, 7) && !queue.is_busy(0, 7),
            "batch waiters do not hold interactive back"
        );
        for _ in 0..40 {
            waiting.push((
                0,
                queue.enqueue(&limiter, &pool, (99, of_class(0)), None).unwrap().grant,
            ));
        }
        let mut order = Vec::new();
        let mut held = holder;
        for _ in 0..25 {
            let complete = CompleteRequest::new(held, None, Vec::new()).unwrap();
            limiter.complete(&complete).await.unwrap();
            queue.capacity_freed();
            let (index, lease) = loop {
                let granted = (waiting.iter_mut().enumerate())
                    .find_map(|(i, (_, receiver))| receiver.try_recv().ok().map(|r| (i, r.unwrap().take().unwrap())));
                if let Some(found) = granted {
                    break found;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            };
            order.push(waiting.remove(index).0);
            held = lease;
        }
        let interactive = order.iter().filter(|class| **class == 0).count();
        // 4 of every 5 grants; batch is never starved.
        assert!(
            (19..=21).contains(&interactive),
            "interactive got {interactive} of 25: {order:?}"
        );
    }

    #[tokio::test]
    async fn a_grant_left_unread_in_the_channel_is_released() {
        let (backend, limiter, pool, need) = one_slot().await;
        let queue = Arc::new(ModelQueue::default());
        let receiver = queue.enqueue(&limiter, &pool, (0, need), None).unwrap().grant;
        // The pump grants at once; the grant then waits in the channel.
        for _ in 0..200 {
            if backend.limit_report(&slot()).await.unwrap().unwrap().in_use == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The client leaves (its timeout fired) without reading the grant.
        drop(receiver);
        for _ in 0..200 {
            if backend.limit_report(&slot()).await.unwrap().unwrap().in_use == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the grant nobody took still holds its slot");
    }

    #[tokio::test]
    async fn a_waiter_that_left_is_skipped_and_a_full_queue_refuses() {
        let (backend, limiter, pool, need) = one_slot().await;
        let queue = Arc::new(ModelQueue::default());
        let left = queue.enqueue(&limiter, &pool, (0, need.clone()), None).unwrap().grant;
        drop(left);
        let stays = queue.enqueue(&limiter, &pool, (1, need.clone()), None).unwrap().grant;
        let grant = stays.await.unwrap().unwrap();
        let report = backend.limit_report(&slot()).await.unwrap().unwrap();
        assert_eq!(
            report.in_use, 1,
            "only the waiter still there holds the slot: {grant:?}"
        );
        for _ in 0..WAITERS_MAX {
            std::mem::forget(queue.enqueue(&limiter, &pool, (2, need.clone()), None).unwrap());
        }
        assert!(matches!(
            queue.enqueue(&limiter, &pool, (3, need), None),
            Err(Refusal::QueueFull)
        ));
    }
}
