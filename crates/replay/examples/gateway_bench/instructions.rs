//! `--count instructions` (gateway_bench.rs): the servers run under valgrind's
//! callgrind, and a phase's server figure is the instructions the server executed
//! per call instead of its CPU time. An instruction count does not move with what
//! else the machine runs (steal time, the other core's load, cache contention), so
//! two builds compare within a fraction of a per cent where CPU time moves by a
//! third from one round to the next on a shared two-core machine.
//!
//! Callgrind runs a program some 50 to 100 times slower, so the offered rates are
//! lowered to match (`--rate 20 --stream-rate 4` leaves a server about as idle
//! between calls as 1,000 req/s does natively). Each phase is preceded by an idle
//! phase of the same length, whose instructions (timers, snapshots, the periodic
//! metrics export) are taken off, so that the figure is what the calls cost, not how
//! long the slowed phase lasted. The dumps stay in the bench's directory (printed at
//! the end), one per phase, for `callgrind_annotate` to say where two builds differ.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The longest wait for callgrind to write a dump it was asked for: a slowed
/// server serving a backlog answers the request between two of its blocks.
const DUMP_WAIT_MAX: Duration = Duration::from_secs(120);

/// The command that starts `binary` under callgrind, its dumps in `directory`.
pub fn command(binary: &Path, directory: &Path) -> Command {
    let mut command = Command::new("valgrind");
    command
        .arg("--tool=callgrind")
        .arg(format!(
            "--callgrind-out-file={}",
            directory.join("callgrind.%p").display()
        ))
        // Function-level totals are what the figure and an A/B diff need.
        .args(["--dump-instr=no", "--collect-jumps=no", "--quiet"])
        .arg(binary);
    command
}

/// Whether valgrind's callgrind and its control program can be run here.
pub fn available() -> bool {
    let runs = |program: &str| {
        Command::new(program)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    runs("valgrind") && runs("callgrind_control")
}

/// Sets the instruction counters of the callgrind-run process `pid` to zero.
pub fn zero(pid: u32) {
    control(pid, "--zero");
}

/// Has the callgrind-run process `pid` write its counts since the last zero;
/// returns their total instructions.
pub fn dump(pid: u32, directory: &Path) -> u64 {
    control(pid, "--dump");
    let path = latest_dump(pid, directory).expect("callgrind wrote a dump");
    let text = std::fs::read_to_string(&path).expect("the dump reads");
    // The total is on the `totals:` line (older callgrinds: `summary:`), events Ir.
    let total = (text.lines())
        .find_map(|l| l.strip_prefix("totals:").or_else(|| l.strip_prefix("summary:")))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("the dump has a total");
    total
}

/// Runs `callgrind_control` with `action` on `pid`; it returns once the
/// process has carried it out.
fn control(pid: u32, action: &str) {
    let status = Command::new("timeout")
        .arg(DUMP_WAIT_MAX.as_secs().to_string())
        .arg("callgrind_control")
        .arg(action)
        .arg(pid.to_string())
        .output()
        .expect("callgrind_control runs");
    assert!(status.status.success(), "callgrind_control {action} {pid}: {status:?}");
}

/// The dump callgrind wrote last for `pid`: `callgrind.PID.N` with the highest N.
fn latest_dump(pid: u32, directory: &Path) -> Option<PathBuf> {
    let prefix = format!("callgrind.{pid}.");
    std::fs::read_dir(directory)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let number: u64 = name.strip_prefix(&prefix)?.parse().ok()?;
            Some((number, entry.path()))
        })
        .max_by_key(|(number, _)| *number)
        .map(|(_, path)| path)
}
