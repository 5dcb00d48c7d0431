//! The harness that runs the behaviour suite on the memory backend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;

use crate::base::clock::FakeClock;
use crate::limiting::limiter::Backend;
use crate::memory::{MemoryBackend, MemoryConfig};
use crate::model::retry::Jitter;

use super::Harness;

/// An arbitrary fixed start (2025-01-12), so reports are reproducible.
const START_UNIX_MS: u64 = 1_736_660_000_000;

/// Memory backends on one fake clock: time moves only in [`Harness::advance`],
/// and expiry is exact (no slack).
#[derive(Debug)]
pub struct MemoryHarness {
    clock: FakeClock,
    config: MemoryConfig,
    scenarios: AtomicU64,
}

impl MemoryHarness {
    /// A harness with the default configuration but no window margin: the
    /// shared scenarios time holds to exactly their window, as the TigerBeetle
    /// suites (whole-second timeouts) must.
    pub fn new() -> Self {
        Self::with_config(MemoryConfig {
            window_margin_ms: 0,
            ..MemoryConfig::default()
        })
    }

    /// A harness whose backends use `config`.
    pub fn with_config(config: MemoryConfig) -> Self {
        Self {
            clock: FakeClock::new(START_UNIX_MS),
            config,
            scenarios: AtomicU64::new(0),
        }
    }

    /// The shared fake clock.
    pub fn clock(&self) -> &FakeClock {
        &self.clock
    }
}

impl Default for MemoryHarness {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Harness for MemoryHarness {
    async fn backend(&self) -> Arc<dyn Backend> {
        let seed = self.scenarios.load(Ordering::Relaxed);
        let clock = Arc::new(self.clock.clone());
        Arc::new(MemoryBackend::with_jitter(clock, self.config, Jitter::seeded(seed)))
    }

    fn unique_prefix(&self) -> String {
        format!("test:s{}", self.scenarios.fetch_add(1, Ordering::Relaxed))
    }

    async fn advance(&self, ms: u64) {
        self.clock.advance_ms(ms);
    }

    fn expiry_slack_ms(&self) -> u64 {
        0
    }

    fn decrease_retry_ms(&self) -> u64 {
        self.config.decrease_retry_ms
    }
}
