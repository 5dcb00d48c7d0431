//! What the gateway benchmarks (`gateway_bench`, `bedrock_bench`, `pool_bench`, `class_bench`)
//! share: child processes that end with the benchmark, free loopback ports, and
//! `provider-sim` started and waited for, and the command line's reader
//! ([`flags`]). A directory, not an example of its own.

pub mod flags;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest wait for a process to listen.
pub const STARTUP_WAIT_MAX: Duration = Duration::from_secs(30);

/// A child process killed when the benchmark ends.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port free now.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("bound").port()
}

/// Returns once something accepts connections on `addr`; panics after [`STARTUP_WAIT_MAX`].
pub fn wait_listening(addr: SocketAddr) {
    let deadline = Instant::now() + STARTUP_WAIT_MAX;
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `provider-sim` from `bin_dir` on a free loopback port with `args` (its limits,
/// pace and models), once it listens.
pub fn start_sim(bin_dir: &Path, args: &[&str]) -> (Process, SocketAddr) {
    let port = free_port();
    let child = Command::new(bin_dir.join("provider-sim"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(args)
        .stderr(Stdio::null())
        .spawn()
        .expect("provider-sim starts (build it with --release)");
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("an address");
    wait_listening(addr);
    (Process(child), addr)
}
