//! The checks of single values that more than one section of the configuration
//! makes: a number's range and a listen address. Below every section.

use std::net::SocketAddr;

/// Whether `value` is within `min..=max`; the error says the range and the value,
/// so that a message names what is allowed.
pub fn check_range(value: u64, min: u64, max: u64) -> Result<(), String> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(format!("must be {min}..={max}, got {value}"))
    }
}

/// Parses `host:port`, `[v6]:port` or `:port` (every interface).
pub fn parse_listen_addr(text: &str) -> Result<SocketAddr, String> {
    let full = match text.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => text.to_owned(),
    };
    full.parse::<SocketAddr>()
        .map_err(|_| format!("{text:?} is not host:port, [v6]:port or :port with a numeric host"))
}
