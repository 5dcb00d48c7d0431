//! The bounds of a definition's fields, each with its reason, and the check of
//! a window margin that backends also apply to their default.

/// The longest rolling window: 31 days, long enough for monthly budgets.
pub const WINDOW_SECONDS_MAX: u64 = 2_678_400;
/// The longest concurrency hold timeout: one day. A crashed worker's hold is
/// released after at most this long.
pub const TIMEOUT_SECONDS_MAX: u64 = 86_400;
/// The longest window margin, in ms: a minute. The margin covers the time from
/// a grant to the provider receiving the call, milliseconds when measured
/// (BENCHMARKS.md, "Window margin"); more than a minute is a unit mistake
/// (seconds written as ms) that would quietly cost capacity.
pub const WINDOW_MARGIN_MS_MAX: u64 = 60_000;
/// The window margin of definitions that give none, in ms, when the backend is
/// not told otherwise (`MemoryConfig::window_margin_ms`, the TigerBeetle
/// backend's `BackendOptions::window_margin_ms`, `ratelimiterd`'s
/// `defaults.window_margin_ms`). The provider starts a request's window when
/// the call reaches it, after our grant: the trace replay measured that time on
/// loopback, in process and through `ratelimiterd`, at a median of 0–1 ms and a
/// 99th percentile of at most 31 ms in eight runs of nine on a loaded 2-core
/// machine (the ninth: a burst of 500 grants, up to 174 ms); 50 ms covers that
/// and costs 1/200 of a 10 s window (BENCHMARKS.md, "Window margin").
/// A provider across a network is reached later: add the path's latency.
pub const WINDOW_MARGIN_MS_DEFAULT: u64 = 50;
/// A longer window's default margin is at least 1/250 of the window (0.4 %):
/// the time from a grant to the provider grows with the calls granted at once,
/// and a long window frees a large burst of them when it rolls over (the replay
/// met one burst of 500 grants that reached the provider up to 174 ms late, on
/// a 60 s window, where 50 ms let 461 calls through early: BENCHMARKS.md,
/// "Window margin"). The cost is the same 0.4 % of capacity for any window;
/// windows up to 12.5 s keep the 50 ms floor.
pub const WINDOW_MARGIN_WINDOW_DIVISOR: u64 = 250;
/// Longest `unit` text: it is a label for humans, not a document.
pub const UNIT_BYTES_MAX: usize = 64;
/// Longest `description` text, so the registry file stays small.
pub const DESCRIPTION_BYTES_MAX: usize = 1024;

/// Checks a window margin against its bounds: at most [`WINDOW_MARGIN_MS_MAX`]
/// and, when `window_seconds` is not 0, at most the window (a margin longer
/// than the window it pads is a mistake). Backends check their default with
/// `window_seconds` 0.
pub fn check_window_margin_ms(margin_ms: u64, window_seconds: u64) -> Result<(), String> {
    if margin_ms > WINDOW_MARGIN_MS_MAX {
        return Err(format!(
            "window_margin_ms must be at most {WINDOW_MARGIN_MS_MAX}, got {margin_ms}"
        ));
    }
    if window_seconds != 0 && margin_ms > window_seconds * 1000 {
        return Err(format!(
            "window_margin_ms must be at most the window ({} ms), got {margin_ms}",
            window_seconds * 1000
        ));
    }
    Ok(())
}
