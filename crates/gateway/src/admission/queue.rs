//! The fair wait queue of one model (docs/gateway.md, "Waiting"): a denied call
//! waits its turn; waiting classes share freed capacity by their shares
//! (docs/gateway.md, "Classes"; the library scheduler's rule) and tenants take
//! turns round robin within a class; each model has its own queue and its own
//! pump, so a saturated model never holds up another.
//!
//! The pump is the scheduler's idea (`ratelimiter::scheduler`) cut to what a
//! proxy needs: the waiting call is a client connection, not a job to run, so
//! the pump only reserves for the waiter at the head of the turn and hands it
//! the lease; the handler then calls the upstream itself.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ratelimiter::scheduler::{ClassTurns, WorkClass};
use ratelimiter::{Denial, Limiter};
use tokio::sync::{oneshot, Notify};

use crate::limits::{denial_key, CapacityFreed};
use crate::routing::{Grant, Need, Pool, Refusal};

/// The most calls waiting on one model; more are answered 429 at once, so a
/// stampede cannot grow memory without bound.
pub const WAITERS_MAX: usize = 10_000;
/// The longest the pump sleeps before it tries again without being woken: a
/// completion on another server of a fleet frees capacity without waking us.
pub const PUMP_SLEEP_MAX_MS: u64 = 100;

struct Waiter {
    need: Need,
    reply: oneshot::Sender<Result<Grant, Refusal>>,
}

struct State {
    /// Per class, the tenants with waiters of that class, in turn order.
    order: Vec<VecDeque<usize>>,
    /// Waiters by (class, tenant).
    waiting: HashMap<(usize, usize), VecDeque<Waiter>>,
    /// Which class the next waiter comes from.
    turns: ClassTurns,
    len: usize,
    pumping: bool,
    /// The class of the waiter the pump holds while it reserves for it.
    held: Option<usize>,
    last_denial: Option<Denial>,
}

impl State {
    fn new(classes: &[WorkClass]) -> Self {
        Self {
            order: vec![VecDeque::new(); classes.len()],
            waiting: HashMap::new(),
            turns: ClassTurns::new(classes),
            len: 0,
            pumping: false,
            held: None,
            last_denial: None,
        }
    }

    /// The classes with waiters.
    fn waiting_classes(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.order.len()).filter(|class| !self.order[*class].is_empty())
    }

    /// Tenants with waiters, over every class.
    fn tenants_waiting(&self) -> usize {
        self.order.iter().map(VecDeque::len).sum()
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

    /// Whether calls of class `class` or above are waiting (or held by the pump): a
    /// new call of `class` then queues behind them. Waiters of lower classes do not
    /// hold it back: whatever they wait for, the headroom above them is not theirs.
    pub fn is_busy(&self, class: usize) -> bool {
        let state = self.state.lock().expect("queue lock");
        state.held.is_some_and(|held| held <= class) || state.waiting_classes().any(|c| c <= class)
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

    /// The last denial the pump saw, for the headers of a 429 after the wait.
    pub fn last_denial(&self) -> Option<Denial> {
        self.state.lock().expect("queue lock").last_denial.clone()
    }

    /// Queues a call of `tenant` (an index; tenants without a key share one) in
    /// its class (`need.class`) and returns the channel its lease comes on.
    pub fn enqueue(
        self: &Arc<Self>,
        limiter: &Arc<dyn Limiter>,
        pool: &Arc<Pool>,
        tenant: usize,
        need: Need,
    ) -> Result<oneshot::Receiver<Result<Grant, Refusal>>, Refusal> {
        let (reply, receiver) = oneshot::channel();
        let mut state = self.state.lock().expect("queue lock");
        if state.len >= WAITERS_MAX {
            return Err(Refusal::QueueFull);
        }
        let class = need.class;
        let class_was_idle = state.order[class].is_empty();
        if class_was_idle {
            // It rejoins at the pass of the classes waiting: no turns banked while idle.
            let waiting: Vec<usize> = state.waiting_classes().collect();
            state.turns.rejoin(class, waiting.into_iter());
        }
        let queue = state.waiting.entry((class, tenant)).or_default();
        if queue.is_empty() {
            state.order[class].push_back(tenant);
        }
        let queue = state.waiting.get_mut(&(class, tenant)).expect("just inserted");
        queue.push_back(Waiter { need, reply });
        state.len += 1;
        if !state.pumping {
            state.pumping = true;
            tokio::spawn(pump(self.clone(), limiter.clone(), pool.clone()));
        } else if class_was_idle {
            // The pump may be sleeping on a lower class's denial: this class may fit now.
            self.wake.notify_one();
        }
        Ok(receiver)
    }

    /// The next live waiter, of the class whose turn it is and the tenant next in
    /// turn within it, or `None` (and the pump stops).
    fn next(&self) -> Option<(usize, Waiter)> {
        let mut guard = self.state.lock().expect("queue lock");
        let state: &mut State = &mut guard;
        state.held = None;
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
                return Some((tenant, waiter));
            }
            state.waiting.remove(&(class, tenant));
        }
        state.pumping = false;
        None
    }

    /// Puts a denied waiter back at the head of its tenant's line; its class keeps
    /// its turn. `rotate`: the tenant's own limit denied it, so the other tenants go first.
    fn put_back(&self, tenant: usize, waiter: Waiter, denial: Option<Denial>, rotate: bool) {
        let mut guard = self.state.lock().expect("queue lock");
        let state: &mut State = &mut guard;
        if denial.is_some() {
            state.last_denial = denial;
        }
        state.len += 1;
        state.held = None;
        let class = waiter.need.class;
        state.turns.gave_back(class);
        let order = &mut state.order[class];
        let queue = state.waiting.entry((class, tenant)).or_default();
        let was_empty = queue.is_empty();
        queue.push_front(waiter);
        if was_empty {
            if rotate {
                order.push_back(tenant);
            } else {
                order.push_front(tenant);
            }
        } else if !rotate {
            // Its turn was taken by `next`: give it back.
            if let Some(pos) = order.iter().position(|t| *t == tenant) {
                order.remove(pos);
            }
            order.push_front(tenant);
        }
    }
}

impl CapacityFreed for ModelQueue {
    fn capacity_freed(&self) {
        ModelQueue::capacity_freed(self);
    }
}

/// Reserves for the waiters in turn until none is left, each on the first
/// deployment of the model's pool that holds it.
async fn pump(queue: Arc<ModelQueue>, limiter: Arc<dyn Limiter>, pool: Arc<Pool>) {
    let mut tenant_denials_in_a_row = 0usize;
    while let Some((tenant, waiter)) = queue.next() {
        let freed: Arc<dyn CapacityFreed> = queue.clone();
        let (denial, retry_after_ms) = match pool.reserve(&limiter, &freed, &waiter.need).await {
            Ok(grant) => {
                tenant_denials_in_a_row = 0;
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
        let tenant_bound = denial
            .as_ref()
            .and_then(denial_key)
            .is_some_and(|k| k.starts_with("tenant:") || k.starts_with(crate::limits::KEY_LIMIT_PREFIX));
        queue.put_back(tenant, waiter, denial, tenant_bound);
        tenant_denials_in_a_row = if tenant_bound { tenant_denials_in_a_row + 1 } else { 0 };
        let tenants = queue.state.lock().expect("queue lock").tenants_waiting();
        if !tenant_bound || tenant_denials_in_a_row >= tenants {
            tenant_denials_in_a_row = 0;
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
            vec![Deployment::new("m", resolved, 0, &[], stats)],
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
            waiting.push((tenant, queue.enqueue(&limiter, &pool, tenant, need.clone()).unwrap()));
        }
        assert!(queue.is_busy(0));
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
        assert!(!queue.is_busy(0));
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
            receivers.push(queue.enqueue(&limiter, &pool, tenant, need).unwrap());
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
            waiting.push((1, queue.enqueue(&limiter, &pool, tenant, of_class(1)).unwrap()));
        }
        assert!(
            queue.is_busy(1) && !queue.is_busy(0),
            "batch waiters do not hold interactive back"
        );
        for _ in 0..40 {
            waiting.push((0, queue.enqueue(&limiter, &pool, 99, of_class(0)).unwrap()));
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
        let receiver = queue.enqueue(&limiter, &pool, 0, need).unwrap();
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
        let left = queue.enqueue(&limiter, &pool, 0, need.clone()).unwrap();
        drop(left);
        let stays = queue.enqueue(&limiter, &pool, 1, need.clone()).unwrap();
        let grant = stays.await.unwrap().unwrap();
        let report = backend.limit_report(&slot()).await.unwrap().unwrap();
        assert_eq!(
            report.in_use, 1,
            "only the waiter still there holds the slot: {grant:?}"
        );
        for _ in 0..WAITERS_MAX {
            std::mem::forget(queue.enqueue(&limiter, &pool, 2, need.clone()).unwrap());
        }
        assert!(matches!(
            queue.enqueue(&limiter, &pool, 3, need),
            Err(Refusal::QueueFull)
        ));
    }
}
