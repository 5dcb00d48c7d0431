//! What the tests that run the real `ratelimiterd` binary share: the process on
//! a free loopback port with its temporary directory ([`Daemon`], [`TempDir`]),
//! a raw HTTP/1.1 client ([`raw`]) that can send bytes no well-behaved
//! client would, and the provider simulator, the gateway's address and a
//! client for the tests of the gateway it serves ([`gateway_setup`]).
//!
//! Each test binary uses a part of this module, so unused items are allowed here.

#![allow(dead_code)]

pub mod admin_harness;
pub mod daemon;
pub mod gateway_setup;
pub mod proxy;
pub mod raw;
pub mod sockets;

// Each test binary names a part of these, too.
#[allow(unused_imports)]
pub use daemon::{temp_dir, write_config_on, BackendConfig, Daemon, TempDir, ADMIN_TOKEN, BIN, CLIENT_TOKEN, WAIT_MAX};
