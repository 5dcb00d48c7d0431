//! The soak engine, shared by the `soak` example (the long run) and the
//! `reliability_soak` test (a short run in CI, and the checker's own tests).

pub mod checker;
pub mod record;
pub mod report;
pub mod server;
pub mod workload;
