//! The task that fills the console's history while the server runs: the
//! gateway's counters every second, every limit's utilization every
//! [`SAMPLE_INTERVAL_MS`].

use std::time::Duration;

use tokio::time::MissedTickBehavior;

use crate::console::access::Access;
use crate::console::history::{now_unix_ms, GatewaySample, SAMPLE_INTERVAL_MS};
use crate::shutdown::Shutdown;
use crate::state::AppState;

/// How often the gateway's counters are sampled for the page's rates.
const GATEWAY_SAMPLE_INTERVAL: Duration = Duration::from_millis(1_000);

/// Fills the history until `shutdown`: the gateway's counters every second, every
/// limit's utilization every [`SAMPLE_INTERVAL_MS`]. Does nothing when the
/// console is off.
pub async fn sample(state: AppState, shutdown: Shutdown) {
    if state.console().access() == Access::Off {
        return;
    }
    let mut ticks = tokio::time::interval(GATEWAY_SAMPLE_INTERVAL);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let per_limits_sample = SAMPLE_INTERVAL_MS / GATEWAY_SAMPLE_INTERVAL.as_millis() as u64;
    let stop = shutdown.wait();
    tokio::pin!(stop);
    for second in 0u64.. {
        tokio::select! {
            () = &mut stop => return,
            _ = ticks.tick() => {}
        }
        let history = state.console().history();
        if let Some(gateway) = state.gateway_metrics() {
            let queue_waits = (state.gateway().map(|g| g.status()).unwrap_or_default().into_iter())
                .filter_map(|m| Some((m.name.clone(), gateway.queue_wait(&m.name)?)))
                .collect();
            history.record_gateway(GatewaySample {
                at_unix_ms: now_unix_ms(),
                calls: gateway.call_totals(),
                queue_waits,
                classes: gateway.classes.totals(),
            });
        }
        if second % per_limits_sample == 0 {
            match state.backend().limit_reports().await {
                Ok(reports) => history.record_limits(&reports, now_unix_ms()),
                Err(error) => {
                    // An empty sample keeps the time axis: the gap shows where the backend was away.
                    history.record_limits(&[], now_unix_ms());
                    tracing::debug!(%error, "console: the limits could not be sampled");
                }
            }
        }
    }
}
