//! The real `ratelimiterd` binary, started on a free loopback port with its own
//! registry directory, and stopped by SIGTERM, SIGKILL or drop.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_ratelimiterd");
/// The admin token of every configuration written here.
pub const ADMIN_TOKEN: &str = "reliability-admin-token-0123456789";
/// The client token of every configuration written here.
pub const CLIENT_TOKEN: &str = "reliability-client-token-0123456789";
/// The longest any single wait may take: generous, so a loaded CI machine is
/// slow rather than failing; no test asserts on how fast something happened.
pub const WAIT_MAX: Duration = Duration::from_secs(30);
/// The most log lines kept per server, so a chatty server cannot grow a test's memory.
const LOG_LINES_MAX: usize = 10_000;

/// A fresh, empty directory under the system's temporary directory.
pub fn temp_dir(name: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "ratelimiterd-rel-{}-{name}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temporary directory");
    dir
}

/// A running `ratelimiterd`, killed on drop if still running.
pub struct Daemon {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its configuration file.
    pub config: PathBuf,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    /// Writes a configuration into `dir` (free loopback port, both tokens, the
    /// registry `dir/limits.json`, then `extra` YAML lines of the `server:`
    /// section and `sections` after it) and starts the binary on it.
    pub fn start(dir: &Path, server_extra: &str, sections: &str) -> Daemon {
        let config = write_config(dir, server_extra, sections);
        Self::start_with(&config).unwrap_or_else(|logs| panic!("ratelimiterd did not start:\n{logs}"))
    }

    /// Starts the binary on `config`; `Err` holds its output when it exits or
    /// does not log its address in time.
    pub fn start_with(config: &Path) -> Result<Daemon, String> {
        let mut child = Command::new(BIN)
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ratelimiterd");
        let stderr = child.stderr.take().expect("piped stderr");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (sender, receiver) = mpsc::channel();
        let kept = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut kept = kept.lock().unwrap();
                if kept.len() < LOG_LINES_MAX {
                    kept.push(line.clone());
                }
                drop(kept);
                let _ = sender.send(line);
            }
        });
        let mut daemon = Daemon {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            config: config.to_owned(),
            logs,
        };
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match receiver.recv_timeout(left) {
                Ok(line) => {
                    if let Some(addr) = listening_addr(&line) {
                        daemon.addr = addr;
                        return Ok(daemon);
                    }
                }
                // The output ended (the process exited) or the wait is over.
                Err(_) => {
                    let _ = daemon.child.kill();
                    let _ = daemon.child.wait();
                    return Err(daemon.logs().join("\n"));
                }
            }
        }
    }

    /// The server's log lines so far.
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// SIGKILL: the process dies at once, without any cleanup.
    pub fn kill9(&mut self) -> ExitStatus {
        // `Child::kill` sends SIGKILL on Unix.
        let _ = self.child.kill();
        self.child.wait().expect("wait for the killed server")
    }

    /// SIGTERM, then waits (bounded) for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "the server did not exit in time");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address of a `listening addr=...` log line.
fn listening_addr(line: &str) -> Option<SocketAddr> {
    if !line.contains("listening") {
        return None;
    }
    line.split("addr=").nth(1)?.split_whitespace().next()?.parse().ok()
}

/// Names a running TigerBeetle cluster (`host:port`, comma-separated) to run
/// every server of these tests on the TigerBeetle backend instead of memory.
/// The binary must then be built with `--features tigerbeetle`, and the cluster
/// should be fresh (`scripts/tigerbeetle.sh stop; scripts/tigerbeetle.sh start 3`):
/// the tests use fixed keys.
pub const TIGERBEETLE_ADDRESSES_ENV: &str = "RELIABILITY_TIGERBEETLE_ADDRESSES";

/// The backend lines of every configuration: `server:` lines and a section.
fn backend_config() -> (String, String) {
    match std::env::var(TIGERBEETLE_ADDRESSES_ENV) {
        Ok(addresses) if !addresses.trim().is_empty() => {
            let list: Vec<String> = addresses.split(',').map(|a| format!("\"{}\"", a.trim())).collect();
            (
                "  backend: tigerbeetle\n".to_owned(),
                format!(
                    "tigerbeetle:\n  cluster_id: \"0\"\n  addresses: [{}]\n",
                    list.join(", ")
                ),
            )
        }
        _ => (String::new(), String::new()),
    }
}

/// Writes `dir/config.yaml`: loopback port 0, both tokens, the registry in
/// `dir`, the backend of [`TIGERBEETLE_ADDRESSES_ENV`].
pub fn write_config(dir: &Path, server_extra: &str, sections: &str) -> PathBuf {
    let path = dir.join("config.yaml");
    let (backend_lines, backend_section) = backend_config();
    let text = format!(
        "server:\n  listen_addr: \"127.0.0.1:0\"\n  admin_token: {ADMIN_TOKEN}\n  client_tokens: [{CLIENT_TOKEN}]\n\
         {backend_lines}{server_extra}registry:\n  path: {}\n{backend_section}{sections}",
        dir.join("limits.json").display()
    );
    std::fs::write(&path, text).expect("write config");
    path
}
