//! How the gateway benchmark measures a path's phases (gateway_bench.rs): each
//! process's CPU time (`cpu.rs`), and a server run under callgrind in
//! instructions instead (`instructions.rs`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::cpu::{cpu_per_call_us, Pids};
use super::instructions;

/// How a path's phases are measured: every process's CPU time, and, for a server
/// run under callgrind (`--count instructions`), its instructions instead.
#[derive(Clone)]
pub struct Meter {
    pub pids: Pids,
    /// Where the server's callgrind dumps go, when it runs under callgrind.
    pub callgrind: Option<PathBuf>,
}

impl Meter {
    /// Where the server's dumps go and its process id, when it is counted.
    fn counted(&self) -> Option<(&Path, u32)> {
        Some((self.callgrind.as_deref()?, self.pids.server?))
    }

    /// The server's instructions per second while no call arrives, over
    /// `seconds` (0 when it is not counted).
    pub async fn idle_per_second(&self, seconds: f64) -> f64 {
        let Some((directory, pid)) = self.counted() else {
            return 0.0;
        };
        instructions::zero(pid);
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        instructions::dump(pid, directory) as f64 / seconds
    }

    /// A phase starts: the counters are zeroed, the CPU times read.
    pub fn start(&self) -> [u64; 3] {
        if let Some((_, pid)) = self.counted() {
            instructions::zero(pid);
        }
        self.pids.ticks()
    }

    /// A phase of `calls` that took `elapsed` ended: per call, the CPU µs of
    /// each process, the server's figure being its instructions less the idle
    /// ones (`idle_per_second`) when it is counted.
    pub fn per_call(
        &self,
        before: [u64; 3],
        (calls, elapsed): (u64, Duration),
        idle_per_second: f64,
        hz: u64,
    ) -> [u64; 3] {
        let mut figures = cpu_per_call_us(before, self.pids.ticks(), calls, hz);
        if let Some((directory, pid)) = self.counted() {
            let total = instructions::dump(pid, directory) as f64;
            let busy = (total - idle_per_second * elapsed.as_secs_f64()).max(0.0);
            figures[2] = (busy / calls.max(1) as f64) as u64;
        }
        figures
    }
}
