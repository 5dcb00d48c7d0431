//! What the reliability and bad-input tests share: the real `ratelimiterd` binary
//! on a free loopback port ([`Daemon`]) and a raw HTTP/1.1 client ([`raw`]) that
//! can send bytes no well-behaved client would.
//!
//! Each test binary uses a part of this module, so unused items are allowed here.

#![allow(dead_code)]

pub mod daemon;
pub mod raw;

pub use daemon::{temp_dir, Daemon, ADMIN_TOKEN, CLIENT_TOKEN, WAIT_MAX};
