//! The backend behaviour suite on the memory backend.

use ratelimiter::testkit::{self, MemoryHarness};

#[tokio::test]
async fn memory_backend_passes_the_behaviour_suite() {
    testkit::run_all(&MemoryHarness::new()).await;
}

#[tokio::test]
async fn memory_backend_passes_the_bucket_scenarios() {
    testkit::run_bucket(&MemoryHarness::new()).await;
}
