//! Ways to run a limiter without writing a backend's setup (lib.rs, "Layout"):
//! the remote HTTP client of `ratelimiterd` and the single-binary mode on a
//! memory backend configured from a limits file.

#[cfg(feature = "http-client")]
pub mod httpclient;
pub mod local;
