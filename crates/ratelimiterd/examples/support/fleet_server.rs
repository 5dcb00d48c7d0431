//! A real `ratelimiterd` process on the TigerBeetle backend, for the examples
//! that show or measure a fleet (several servers on one cluster): a separate
//! process per server, as in production, so no server shares a cache, a
//! client session or a definition table with another by accident.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Longest wait for a server to say it listens.
pub const STARTUP_WAIT_MAX: Duration = Duration::from_secs(30);
/// The last lines of a server's log kept to explain a failed start.
const STARTUP_LINES_KEPT: usize = 10;

/// A `ratelimiterd` child process, killed (and its directory removed) on drop.
pub struct FleetServer {
    child: Child,
    /// Where it listens (loopback, a port the kernel chose).
    pub addr: SocketAddr,
    dir: PathBuf,
}

impl FleetServer {
    /// Starts `bin` on a free loopback port, on the TigerBeetle backend against
    /// `addresses` (cluster 0), with `extra_yaml` appended to its configuration
    /// (top-level blocks), and waits until it listens.
    pub fn start(bin: &Path, addresses: &[String], extra_yaml: &str) -> Result<FleetServer, String> {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ratelimiterd-fleet-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let list: Vec<String> = addresses.iter().map(|a| format!("\"{a}\"")).collect();
        let config = dir.join("config.yaml");
        // The registry path is not used on TigerBeetle (the cluster keeps the
        // definitions); it points into the server's own directory anyway.
        let yaml = format!(
            "server:\n  listen_addr: \"127.0.0.1:0\"\n  backend: tigerbeetle\n\
             registry:\n  path: {}\n\
             tigerbeetle:\n  cluster_id: \"0\"\n  addresses: [{}]\n\
             log:\n  level: \"warn,ratelimiterd::server=info\"\n{extra_yaml}",
            dir.join("limits.json").display(),
            list.join(", "),
        );
        std::fs::write(&config, yaml).map_err(|e| format!("{}: {e}", config.display()))?;
        let mut child = Command::new(bin)
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start {}: {e} (build it: cargo build -p ratelimiterd --features tigerbeetle --bin ratelimiterd)",
                    bin.display()
                )
            })?;
        let stderr = child.stderr.take().expect("piped stderr");
        // Owned at once, so a failed start still kills the process.
        let mut server = FleetServer {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            dir,
        };
        let (sender, receiver) = std::sync::mpsc::channel();
        // Reads stderr for as long as the server runs, so it never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = sender.send(line);
            }
        });
        let deadline = Instant::now() + STARTUP_WAIT_MAX;
        let mut last_lines = std::collections::VecDeque::with_capacity(STARTUP_LINES_KEPT);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // Disconnected: the server exited (e.g. a binary built without
            // `--features tigerbeetle` refuses the configuration); its last
            // lines say why.
            let line = receiver.recv_timeout(left).map_err(|_| {
                format!(
                    "{} did not start listening within {STARTUP_WAIT_MAX:?}; its last lines:\n{}",
                    bin.display(),
                    Vec::from(last_lines.clone()).join("\n")
                )
            })?;
            if last_lines.len() == STARTUP_LINES_KEPT {
                last_lines.pop_front();
            }
            last_lines.push_back(line.clone());
            if let Some(rest) = line.split("addr=").nth(1).filter(|_| line.contains("listening")) {
                let addr = rest.split_whitespace().next().unwrap_or_default();
                server.addr = addr.parse().map_err(|e| format!("listening line {line:?}: {e}"))?;
                return Ok(server);
            }
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The process id, to read its CPU time.
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for FleetServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `ratelimiterd` binary next to the running example (`target/PROFILE/`),
/// or `RATELIMITERD_BIN`.
pub fn default_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("RATELIMITERD_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    // target/PROFILE/examples/NAME -> target/PROFILE/ratelimiterd
    exe.parent()
        .and_then(Path::parent)
        .map(|profile| profile.join("ratelimiterd"))
        .unwrap_or_else(|| PathBuf::from("ratelimiterd"))
}
