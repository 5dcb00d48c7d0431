//! The replayer: releases each trace request at its compressed arrival time into
//! a strategy and gathers the outcomes.

use std::sync::Arc;
use std::time::Duration;

use indicatif::ProgressBar;
use ratelimiter::Clock;
use tokio::task::JoinSet;

use crate::outcome::{ReplayRequest, RequestOutcome};
use crate::strategy::Strategy;
use crate::trace::Trace;

/// The largest speed-up: a millisecond of replay for every 100 s of trace is
/// already far past what any provider serves.
pub const SPEEDUP_MAX: f64 = 100_000.0;

/// How a trace is replayed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    /// When the first request arrives, Unix ms (every process of a run shares it).
    pub start_unix_ms: u64,
    /// Trace time divided by this is replay time.
    pub speedup: f64,
    /// The `max_tokens` bound each request sends.
    pub max_tokens: u64,
    /// `(i, n)`: replay only the requests whose index is `i` modulo `n`.
    pub shard: (usize, usize),
}

impl Plan {
    /// The requests of `trace` this plan replays, with their arrival times.
    pub fn requests(&self, trace: &Trace) -> Vec<ReplayRequest> {
        assert!(
            self.speedup > 0.0 && self.speedup <= SPEEDUP_MAX,
            "speed-up out of range"
        );
        let (shard, shards) = self.shard;
        assert!(shard < shards, "shard index below the shard count");
        trace
            .records()
            .iter()
            .enumerate()
            .filter(|(index, _)| index % shards == shard)
            .map(|(index, record)| ReplayRequest {
                index,
                record: *record,
                arrival_unix_ms: self.start_unix_ms + (record.offset_ms as f64 / self.speedup).round() as u64,
                max_tokens: self.max_tokens,
            })
            .collect()
    }
}

/// Replays `requests` through `strategy`: each enters at its arrival time, read
/// from `clock`; returns the outcomes in trace order.
pub async fn replay(
    requests: Vec<ReplayRequest>,
    strategy: Arc<dyn Strategy>,
    clock: Arc<dyn Clock>,
    progress: ProgressBar,
) -> Vec<RequestOutcome> {
    let mut tasks = JoinSet::new();
    let mut outcomes = Vec::with_capacity(requests.len());
    for request in requests {
        let wait_ms = request.arrival_unix_ms.saturating_sub(clock.now_unix_ms());
        if wait_ms > 0 {
            tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        }
        let strategy = Arc::clone(&strategy);
        tasks.spawn(async move { strategy.run(request).await });
        // Gather what finished meanwhile, so the progress bar moves during arrivals.
        while let Some(done) = tasks.try_join_next() {
            outcomes.push(done.expect("a strategy task does not panic"));
            progress.inc(1);
        }
    }
    while let Some(done) = tasks.join_next().await {
        outcomes.push(done.expect("a strategy task does not panic"));
        progress.inc(1);
    }
    progress.finish_and_clear();
    outcomes.sort_by_key(|o| o.index);
    outcomes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceRecord;

    #[test]
    fn plans_compress_time_and_shard_by_index() {
        let record = |offset_ms| TraceRecord {
            offset_ms,
            input_tokens: 1,
            output_tokens: 1,
        };
        let trace = Trace::from_records(vec![record(0), record(1_000), record(2_000), record(3_001)]);
        let plan = Plan {
            start_unix_ms: 10_000,
            speedup: 10.0,
            max_tokens: 64,
            shard: (0, 1),
        };
        let arrivals: Vec<u64> = plan.requests(&trace).iter().map(|r| r.arrival_unix_ms).collect();
        assert_eq!(arrivals, vec![10_000, 10_100, 10_200, 10_300]);
        let odd = Plan { shard: (1, 2), ..plan }.requests(&trace);
        assert_eq!(odd.iter().map(|r| r.index).collect::<Vec<_>>(), vec![1, 3]);
        assert!(odd.iter().all(|r| r.max_tokens == 64));
    }
}
