//! The periodic decrease task (docs/decisions.md, "Capacity decreases"): every check
//! interval it carries out the pending capacity decreases that usage now allows and
//! persists them.

use std::time::Duration;

use tokio::time::MissedTickBehavior;

use crate::shutdown::Shutdown;
use crate::state::AppState;

/// Runs until `shutdown` fires. Errors are logged and retried on the next tick:
/// a decrease that waits longer only keeps its key conservative.
pub async fn run(state: AppState, interval: Duration, shutdown: Shutdown) {
    // The first check comes one interval after startup, not at once, so a state
    // restored as decreasing is observable until then.
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let stop = shutdown.wait();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            _ = ticks.tick() => {}
        }
        match state.admin().apply_pending_decreases().await {
            Ok(0) => {}
            Ok(count) => tracing::debug!(count, "pending decreases carried out"),
            Err(e) => tracing::warn!(error = ?e, "decrease check failed; will retry"),
        }
    }
}
