//! `ratelimiterd`: the HTTP rate limiting server, and the TigerBeetle backend of
//! distributed mode (cargo feature `tigerbeetle`).

#![warn(missing_docs)]

#[cfg(feature = "tigerbeetle")]
pub mod tigerbeetle;
