//! Why a call was not admitted on any deployment of its pool.

use ratelimiter::{Denial, LimiterError};

/// Why a call was not admitted.
#[derive(Debug)]
pub enum Refusal {
    /// The limits said no (last answer, with its binding key).
    Denied(Denial),
    /// The queue is full.
    QueueFull,
    /// The backend failed.
    Backend(LimiterError),
    /// Every deployment of the pool left is failing (its breaker open) or was
    /// tried: the first half-opens in `retry_after_ms` (0: none left).
    Failing {
        /// Until the first breaker half-opens.
        retry_after_ms: u64,
    },
}
