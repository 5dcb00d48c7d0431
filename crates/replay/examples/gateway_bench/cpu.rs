//! The CPU the gateway benchmark's processes spend per call (gateway_bench.rs):
//! each process's user and system time from `/proc/<pid>/stat`, read before and
//! after a phase.

use std::process::Command;

use super::bench_support::Process;

/// Clock ticks per second of `/proc/<pid>/stat`'s CPU times when `getconf`
/// cannot say: Linux's USER_HZ, 100 on every common build.
const CLOCK_TICKS_PER_SECOND_DEFAULT: u64 = 100;

impl Process {
    /// The child's process id, whose `/proc` entry the CPU readings read.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

/// The CPU time (user + system) process `pid` has used, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) may hold spaces: count fields after its ')'.
    let after_name = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    field(11) + field(12)
}

/// The clock ticks per second of `/proc/<pid>/stat`'s CPU times.
pub fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(CLOCK_TICKS_PER_SECOND_DEFAULT)
}

/// The processes whose CPU a phase measures: the load generator (this process),
/// the simulator and, on a gateway path, the server.
#[derive(Clone, Copy)]
pub struct Pids {
    pub generator: u32,
    pub simulator: u32,
    pub server: Option<u32>,
}

impl Pids {
    /// The CPU ticks of the generator, the simulator and the server (0 without one).
    pub fn ticks(&self) -> [u64; 3] {
        [
            cpu_ticks(self.generator),
            cpu_ticks(self.simulator),
            self.server.map_or(0, cpu_ticks),
        ]
    }
}

/// CPU per call, in µs, of each process of `pids` between two readings.
pub fn cpu_per_call_us(before: [u64; 3], after: [u64; 3], calls: u64, hz: u64) -> [u64; 3] {
    let per_call = |i: usize| (after[i] - before[i]) * 1_000_000 / hz / calls.max(1);
    [per_call(0), per_call(1), per_call(2)]
}
