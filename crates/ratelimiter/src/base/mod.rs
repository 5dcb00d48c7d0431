//! The primitives every other layer builds on (lib.rs, "Layout"): time, ids,
//! calendar periods, counters, files only their owner reads, the listeners' origin rule and the bounded map of
//! recent ids. Nothing here imports another module of the crate.

pub mod clock;
pub mod id;
pub mod metrics;
pub mod origin;
pub mod period;
pub mod private_file;
pub mod recent_ids;
