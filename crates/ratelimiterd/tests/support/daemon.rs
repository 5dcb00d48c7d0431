//! The real `ratelimiterd` binary, started on a free loopback port with its own
//! registry directory, and stopped by SIGTERM, SIGKILL or drop: the one way every
//! test of this crate runs the server as a process.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use ratelimiter::httpclient::{HttpClient, HttpClientConfig};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_ratelimiterd");
/// The admin token of every configuration written here.
pub const ADMIN_TOKEN: &str = "ratelimiterd-test-admin-token-0123456789";
/// The client token of every configuration written here.
pub const CLIENT_TOKEN: &str = "ratelimiterd-test-client-token-0123456789";
/// The longest any single wait may take: generous, so a loaded CI machine is
/// slow rather than failing; no test asserts on how fast something happened.
pub const WAIT_MAX: Duration = Duration::from_secs(30);
/// The most log lines kept (and echoed) per server, so a chatty server cannot
/// grow a test's memory.
const LOG_LINES_MAX: usize = 10_000;
/// How often a wait for the process's exit looks again.
const EXIT_POLL_MS: u64 = 10;

/// A fresh, empty directory under the system's temporary directory, deleted
/// with all it holds on drop, so test runs do not pile up registries.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates the directory; `name` and a counter make it unique in this process.
    pub fn new(name: &str) -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "ratelimiterd-test-{}-{name}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("temporary directory");
        TempDir { path }
    }
}

impl Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A fresh [`TempDir`] named after `name`.
pub fn temp_dir(name: &str) -> TempDir {
    TempDir::new(name)
}

/// A running `ratelimiterd`, killed on drop if still running.
pub struct Daemon {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its configuration file (empty when it runs on its defaults).
    pub config: PathBuf,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    /// Writes a configuration into `dir` with [`write_config`] (the backend of
    /// [`TIGERBEETLE_ADDRESSES_ENV`]) and starts the binary on it.
    pub fn start(dir: &Path, server_extra: &str, sections: &str) -> Daemon {
        Self::start_on(dir, BackendConfig::FromEnv, server_extra, sections)
    }

    /// Writes a configuration into `dir` with [`write_config_on`] and starts
    /// the binary on it; panics, with the server's output, when it does not start.
    pub fn start_on(dir: &Path, backend: BackendConfig, server_extra: &str, sections: &str) -> Daemon {
        let config = write_config_on(dir, backend, server_extra, sections);
        Self::start_with(&config).unwrap_or_else(|logs| panic!("ratelimiterd did not start:\n{logs}"))
    }

    /// Starts the binary on `config`; `Err` holds its output when it exits or
    /// does not log its address in time.
    pub fn start_with(config: &Path) -> Result<Daemon, String> {
        let mut command = Command::new(BIN);
        command.arg("--config").arg(config);
        Self::spawn(command, config)
    }

    /// Like [`Daemon::start_with`], with `env` added to the process's
    /// environment (a preloaded library that steps its clock, for instance).
    pub fn start_with_env(config: &Path, env: &[(&str, &std::ffi::OsStr)]) -> Result<Daemon, String> {
        let mut command = Command::new(BIN);
        command.arg("--config").arg(config);
        command.envs(env.iter().copied());
        Self::spawn(command, config)
    }

    /// Like [`Daemon::start_with`], running `at_spawn` with the process's id
    /// the moment it is spawned, before it has started anything (a signal
    /// sent in its first instants).
    pub fn start_and_at_spawn(config: &Path, at_spawn: impl FnOnce(u32)) -> Result<Daemon, String> {
        let mut command = Command::new(BIN);
        command.arg("--config").arg(config);
        Self::spawn_then(command, config, at_spawn)
    }

    /// Starts the binary without `--config`, in `dir`, so it runs on its
    /// defaults; `Err` holds its output when it exits or does not log its
    /// address in time.
    pub fn start_defaults(dir: &Path) -> Result<Daemon, String> {
        let mut command = Command::new(BIN);
        command.current_dir(dir);
        Self::spawn(command, Path::new(""))
    }

    /// Runs `command` and waits (bounded) for the `listening addr=...` line.
    fn spawn(command: Command, config: &Path) -> Result<Daemon, String> {
        Self::spawn_then(command, config, |_| {})
    }

    /// [`Daemon::spawn`], with `at_spawn` run on the process's id at once.
    fn spawn_then(mut command: Command, config: &Path, at_spawn: impl FnOnce(u32)) -> Result<Daemon, String> {
        let mut child = command
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ratelimiterd");
        at_spawn(child.id());
        let stderr = child.stderr.take().expect("piped stderr");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let lines = read_lines(stderr, logs.clone());
        // Owned by a `Daemon` at once, so a failed start still kills the process.
        let mut daemon = Daemon {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            config: config.to_owned(),
            logs,
        };
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
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

    /// The library's HTTP client for this server, sending `token`.
    pub fn client(&self, token: &str) -> HttpClient {
        HttpClient::new(HttpClientConfig {
            token: Some(token.to_owned()),
            ..HttpClientConfig::new(self.url())
        })
        .expect("an HTTP client")
    }

    /// The process id, to read `/proc` or signal the process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: the process dies at once, without any cleanup.
    pub fn kill9(&mut self) -> ExitStatus {
        // `Child::kill` sends SIGKILL on Unix.
        let _ = self.child.kill();
        self.child.wait().expect("wait for the killed server")
    }

    /// Sends SIGTERM and returns at once: graceful shutdown begins.
    pub fn signal_term(&self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits (bounded) for the process to exit.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "the server did not exit in time");
            std::thread::sleep(Duration::from_millis(EXIT_POLL_MS));
        }
    }

    /// SIGTERM, then waits (bounded) for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        self.signal_term();
        self.wait_exit()
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

/// Reads `stderr` on a thread of its own: keeps the first [`LOG_LINES_MAX`]
/// lines in `logs`, echoes them (the test harness shows them when the test
/// fails) and sends every line to the returned receiver. The receiver
/// disconnects when the process's output ends.
fn read_lines(stderr: ChildStderr, logs: Arc<Mutex<Vec<String>>>) -> mpsc::Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut kept = logs.lock().unwrap();
            if kept.len() < LOG_LINES_MAX {
                eprintln!("[server] {line}");
                kept.push(line.clone());
            }
            drop(kept);
            let _ = sender.send(line);
        }
    });
    receiver
}

/// The address of a `listening addr=...` log line.
fn listening_addr(line: &str) -> Option<SocketAddr> {
    if !line.contains("listening") {
        return None;
    }
    line.split("addr=").nth(1)?.split_whitespace().next()?.parse().ok()
}

/// Names a running TigerBeetle cluster (`host:port`, comma-separated) to run
/// every server of the reliability tests on the TigerBeetle backend instead of
/// memory. The binary must then be built with `--features tigerbeetle`, and the
/// cluster should be fresh (`scripts/tigerbeetle.sh stop; scripts/tigerbeetle.sh start 3`):
/// the tests use fixed keys.
pub const TIGERBEETLE_ADDRESSES_ENV: &str = "RELIABILITY_TIGERBEETLE_ADDRESSES";

/// The backend a written configuration puts the server on.
#[derive(Debug, Clone, Copy)]
pub enum BackendConfig<'a> {
    /// TigerBeetle at [`TIGERBEETLE_ADDRESSES_ENV`] when it is set, else
    /// memory: the reliability suites hold on either backend.
    FromEnv,
    /// Memory, whatever the environment says: for tests that assert what only
    /// memory does (usage gone after a restart).
    Memory,
    /// The TigerBeetle cluster at `addresses` (`host:port`, comma-separated).
    TigerBeetle {
        /// The replicas' addresses.
        addresses: &'a str,
        /// More lines of the `tigerbeetle:` section (`  sessions: 2\n`).
        settings: &'a str,
    },
}

impl BackendConfig<'_> {
    /// The lines of the `server:` section and the section after it.
    fn lines(self) -> (String, String) {
        match self {
            BackendConfig::FromEnv => match std::env::var(TIGERBEETLE_ADDRESSES_ENV) {
                Ok(addresses) if !addresses.trim().is_empty() => BackendConfig::TigerBeetle {
                    addresses: &addresses,
                    settings: "",
                }
                .lines(),
                _ => BackendConfig::Memory.lines(),
            },
            BackendConfig::Memory => (String::new(), String::new()),
            BackendConfig::TigerBeetle { addresses, settings } => {
                let list: Vec<String> = addresses.split(',').map(|a| format!("\"{}\"", a.trim())).collect();
                (
                    "  backend: tigerbeetle\n".to_owned(),
                    format!(
                        "tigerbeetle:\n  cluster_id: \"0\"\n  addresses: [{}]\n{settings}",
                        list.join(", ")
                    ),
                )
            }
        }
    }
}

/// Writes `dir/config.yaml` with [`write_config_on`] on the backend of
/// [`TIGERBEETLE_ADDRESSES_ENV`].
pub fn write_config(dir: &Path, server_extra: &str, sections: &str) -> PathBuf {
    write_config_on(dir, BackendConfig::FromEnv, server_extra, sections)
}

/// Writes `dir/config.yaml`: loopback port 0, both tokens, `backend`, the
/// `server_extra` lines of the `server:` section, the registry in `dir`, then
/// `sections`.
pub fn write_config_on(dir: &Path, backend: BackendConfig, server_extra: &str, sections: &str) -> PathBuf {
    let path = dir.join("config.yaml");
    let (backend_lines, backend_section) = backend.lines();
    let text = format!(
        "server:\n  listen_addr: \"127.0.0.1:0\"\n  admin_token: {ADMIN_TOKEN}\n  client_tokens: [{CLIENT_TOKEN}]\n\
         {backend_lines}{server_extra}registry:\n  path: {}\n{backend_section}{sections}",
        dir.join("limits.json").display()
    );
    std::fs::write(&path, text).expect("write config");
    path
}
