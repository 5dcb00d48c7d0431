//! The watchdog's probe: a fresh client that sends one lookup, kept open while
//! the network holds its connections and given way to a fresh one while the
//! network resets them (see [`super::pool`]).

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tigerbeetle_unofficial as tb;

use super::session::{new_client, OpenClient};

/// How long a probe client lives while the network resets or refuses its
/// connections. Its first answer can come only with its client's first
/// resend of its registration (the first send, made as it opens, finds no
/// connection yet): after twice the client's 300 ms round-trip estimate, 60
/// of its 10 ms ticks, which is 0.6 s on an idle host and was up to 1.4 s on
/// a loaded 2-core one, where those ticks run late (TigerBeetle 0.16,
/// measured). A probe closed before that never resent, and the next starts
/// the count again: with probes given way every 500 ms, the server waited
/// 1.2–2.2 s after resets ended for the first answer, from a probe opened
/// only then. From its first resend on, a probe resends every 600 ms plus a
/// jitter of at most 10 × 2^attempt ms (20, 40, 80 ms for the next three),
/// so at this age its next resend after the network returns comes as soon as
/// a fresh probe's first would; older, its resends back off toward 10 s
/// apart, and it gives way. (Its attempts to connect, if refused, are up to
/// 1 s apart by then, the client library's cap.) Nothing of such a probe
/// reaches a replica, so replacing it costs the cluster nothing.
pub const PROBE_RESET_LIFETIME_MS: u64 = 2_000;
/// The account id a probe looks up: any id will do, the answer is what counts.
const PROBE_ACCOUNT_ID: u128 = 1;

/// A fresh client whose lookup is on its way.
pub(super) struct Probe {
    pub(super) client: Arc<tb::Client>,
    /// The lookup's outcome: true when the cluster answered.
    answer: tokio::sync::oneshot::Receiver<bool>,
    /// The task sending the lookup, aborted when the probe is dropped, so that
    /// it lets go of the client, which then closes.
    task: tokio::task::JoinHandle<()>,
    started: Instant,
    /// How long readings found the network resetting or refusing connections
    /// while this probe was open: its client backs off with every failed
    /// attempt.
    reset_for: Duration,
    /// When the watchdog last judged it (see [`Watch::judge`]).
    judged: Instant,
    /// Counts the probe among the open clients while it lives.
    _open: OpenClient,
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Probe {
    /// Opens a probe client: a fresh session that sends one lookup, counted
    /// in `open` while it lives.
    pub(super) fn start(cluster_id: u128, addresses: &str, open: &Arc<AtomicUsize>) -> Option<Probe> {
        let client = Arc::new(
            new_client(cluster_id, addresses)
                .inspect_err(|e| tracing::error!(error = %e, "cannot open a probe session"))
                .ok()?,
        );
        let (tell, answer) = tokio::sync::oneshot::channel();
        let asking = Arc::clone(&client);
        let task = tokio::spawn(async move {
            let answered = asking.lookup_accounts(vec![PROBE_ACCOUNT_ID]).await.is_ok();
            drop(asking);
            let _ = tell.send(answered);
        });
        Some(Probe {
            client,
            answer,
            task,
            started: Instant::now(),
            reset_for: Duration::ZERO,
            judged: Instant::now(),
            _open: OpenClient::new(open),
        })
    }
}

/// What the watchdog keeps between its ticks.
#[derive(Default)]
pub(super) struct Watch {
    /// The one probe open, if any.
    pub(super) probe: Option<Probe>,
}

impl Watch {
    /// Decides whether the probe open may stay, given whether the network
    /// holds connections open: a probe whose connections are reset or refused
    /// closes after [`PROBE_RESET_LIFETIME_MS`] (nothing of it reached a
    /// replica, and its client has backed off); a probe held open stays until
    /// it is answered, since its registration is on its way, and closing it
    /// would leave that registration to land later as a session nobody uses
    /// and its connection held open at the replica by whatever holds the
    /// network (the client library reconnects by itself if that connection
    /// fails). A probe that met resets for as long as a reset probe lives has
    /// backed off: when the network holds connections again it gives way to a
    /// fresh one. The time between two readings counts as met resets when
    /// the second finds none held (a slow reading counts for what it took).
    /// A probe held for as long has backed off too: when a connection of ours
    /// closes while the network holds (`closed`; a black hole passes no
    /// close, so one that arrives means bytes flow again, from a replica
    /// restarted behind it, say), it gives way to a fresh one, whose
    /// registration goes out on a live connection, instead of waiting out its
    /// backoff if the replica dropped its registration.
    pub(super) fn judge(&mut self, held: bool, closed: bool) {
        let Some(probe) = &mut self.probe else {
            return;
        };
        let now = Instant::now();
        if !held {
            probe.reset_for += now.saturating_duration_since(probe.judged);
        }
        probe.judged = now;
        if !probe_may_stay(held, closed, probe.reset_for, probe.started.elapsed()) {
            self.probe = None;
        }
    }

    /// Waits for the next tick, or for the open probe's answer if it comes
    /// first: `Some(true)` when the cluster answered it, `Some(false)` when
    /// its client failed (evicted, shut down), `None` at a tick.
    pub(super) async fn next_answer_or_tick(&mut self, ticks: &mut tokio::time::Interval) -> Option<bool> {
        let Some(probe) = &mut self.probe else {
            ticks.tick().await;
            return None;
        };
        tokio::select! {
            _ = ticks.tick() => None,
            answer = &mut probe.answer => Some(answer.unwrap_or(false)),
        }
    }
}

/// Whether a probe of age `age` stays open when the network holds
/// connections open (`held`) or not, given whether a connection of ours
/// closed since the last reading (`closed`) and how long the probe met resets
/// while open (`reset_for`; see [`Watch::judge`]).
fn probe_may_stay(held: bool, closed: bool, reset_for: Duration, age: Duration) -> bool {
    let lifetime = Duration::from_millis(PROBE_RESET_LIFETIME_MS);
    if held {
        reset_for < lifetime && (!closed || age < lifetime)
    } else {
        age < lifetime
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_probe_stays_until_answered_and_a_reset_one_gives_way_once_backed_off() {
        let lifetime = Duration::from_millis(PROBE_RESET_LIFETIME_MS);
        let young = lifetime - Duration::from_millis(1);
        let none = Duration::ZERO;
        // Past its first resend even where the client's ticks run late.
        assert!(probe_may_stay(false, false, none, Duration::from_millis(1_400)));
        assert!(probe_may_stay(false, false, young, young));
        assert!(
            !probe_may_stay(false, false, young, lifetime),
            "a reset probe has backed off"
        );
        // Held: its registration is on its way; closing it would leave the
        // registration to land as a session nobody uses, and its connection
        // held open at the replica.
        assert!(probe_may_stay(true, false, none, Duration::from_secs(3_600)));
        assert!(probe_may_stay(true, false, young, lifetime));
        // Held after resets for as long as a reset probe lives: backed off.
        assert!(!probe_may_stay(true, false, lifetime, lifetime));
        // Held and backed off while a connection closed: bytes flow again.
        assert!(!probe_may_stay(true, true, none, lifetime));
        assert!(
            probe_may_stay(true, true, none, young),
            "a young held probe resends soon"
        );
    }
}
