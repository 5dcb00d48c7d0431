//! A real single-replica TigerBeetle cluster on loopback for tests, examples and
//! benchmarks. It finds the server through `scripts/tigerbeetle.sh path` (or
//! `TIGERBEETLE_BIN`), formats a data file in a fresh temporary directory,
//! starts on a free port, and is killed when dropped, or when the process that
//! started it exits (a watchdog shell, which also deletes the gigabyte data
//! file), so a shared cluster in a `static` does not outlive its test binary.
//! A test can kill the replica and start it again on its data and port
//! ([`LocalCluster::kill`], [`LocalCluster::start_again`]), as a crash and a
//! restart.

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the replica gets to listen after start.
pub const START_TIMEOUT_MS: u64 = 60_000;
/// How many free ports are tried: another process may take a port between the
/// probe and the replica's bind.
pub const START_ATTEMPTS_MAX: u32 = 3;
/// The grid cache of test replicas: the default is a gigabyte, tests need little.
pub const CACHE_GRID: &str = "128MiB";
/// The file whose presence tells the watchdog shell that a dead replica was
/// killed on purpose, to be started again once the file is gone.
const STOPPED_FILE: &str = "stopped";

/// Why a local cluster could not start.
#[derive(Debug, thiserror::Error)]
#[error("local TigerBeetle: {0}")]
pub struct HarnessError(String);

/// A running local replica; killed on drop.
#[derive(Debug)]
pub struct LocalCluster {
    watchdog: Child,
    /// The watchdog's output: one line with the replica's pid at each start.
    pids: Mutex<BufReader<ChildStdout>>,
    /// The running replica's pid (it changes with [`LocalCluster::restart`]).
    replica_pid: AtomicU32,
    dir: PathBuf,
    address: String,
}

impl LocalCluster {
    /// Builds (once per machine) or finds the server, then starts a fresh
    /// single-replica cluster 0 on a free loopback port.
    pub fn start() -> Result<Self, HarnessError> {
        let binary = server_binary()?;
        let mut last = None;
        for _ in 0..START_ATTEMPTS_MAX {
            match Self::start_with(&binary) {
                Ok(cluster) => return Ok(cluster),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    fn start_with(binary: &Path) -> Result<Self, HarnessError> {
        static STARTED: AtomicU32 = AtomicU32::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ratelimiter-tb-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| HarnessError(format!("temp dir {}: {e}", dir.display())))?;
        let data = dir.join("0_0.tigerbeetle");
        let status = Command::new(binary)
            .args([
                "format",
                "--cluster=0",
                "--replica=0",
                "--replica-count=1",
                "--development",
            ])
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| HarnessError(format!("format: {e}")))?;
        if !status.success() {
            return Err(HarnessError(format!("format exited with {status}")));
        }
        let port = free_port()?;
        let address = format!("127.0.0.1:{port}");
        let mut watchdog = spawn_watchdog(binary, &address, &data, &dir)?;
        let mut pids = BufReader::new(watchdog.stdout.take().expect("piped stdout"));
        let replica_pid = AtomicU32::new(read_replica_pid(&mut pids)?);
        let pids = Mutex::new(pids);
        let cluster = Self {
            watchdog,
            pids,
            replica_pid,
            dir,
            address,
        };
        cluster.wait_listening()?;
        Ok(cluster)
    }

    /// The replicas named by the `TB_ADDRESS` environment variable
    /// (comma-separated), or else a local replica started for the caller, who
    /// keeps the returned cluster alive for as long as it uses the addresses.
    pub fn from_env_or_start() -> Result<(Option<Self>, Vec<String>), HarnessError> {
        if let Ok(addresses) = std::env::var("TB_ADDRESS") {
            return Ok((None, addresses.split(',').map(str::to_owned).collect()));
        }
        let cluster = Self::start()?;
        let address = cluster.address().to_owned();
        Ok((Some(cluster), vec![address]))
    }

    /// The replica's address, `127.0.0.1:PORT`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// What the replica logged so far (every start of it).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("replica.log")).unwrap_or_default()
    }

    /// Stops the replica (SIGSTOP): the cluster answers nothing, as when it is
    /// down, while its connections stay open, the case that hangs naive clients.
    pub fn pause(&self) -> Result<(), HarnessError> {
        self.signal("-STOP")
    }

    /// Lets a paused replica run again (SIGCONT): the cluster returns with its data.
    pub fn resume(&self) -> Result<(), HarnessError> {
        self.signal("-CONT")
    }

    /// Kills the replica (SIGKILL), as a crash or a host's reboot: its port
    /// refuses connections until [`LocalCluster::start_again`], which starts it
    /// again on the same data file and port. Its data is kept meanwhile.
    pub fn kill(&self) -> Result<(), HarnessError> {
        let stopped = self.dir.join(STOPPED_FILE);
        std::fs::write(&stopped, b"").map_err(|e| HarnessError(format!("{}: {e}", stopped.display())))?;
        self.signal("-KILL")
    }

    /// Starts the replica killed by [`LocalCluster::kill`] again, on the same
    /// data file and port, and waits until it listens.
    pub fn start_again(&self) -> Result<(), HarnessError> {
        let stopped = self.dir.join(STOPPED_FILE);
        std::fs::remove_file(&stopped).map_err(|e| HarnessError(format!("{}: {e}", stopped.display())))?;
        let pid = read_replica_pid(&mut self.pids.lock().expect("pids lock"))?;
        self.replica_pid.store(pid, Ordering::Relaxed);
        self.wait_listening()
    }

    fn signal(&self, signal: &str) -> Result<(), HarnessError> {
        let status = Command::new("kill")
            .arg(signal)
            .arg(self.replica_pid.load(Ordering::Relaxed).to_string())
            .status()
            .map_err(|e| HarnessError(format!("kill {signal}: {e}")))?;
        if !status.success() {
            return Err(HarnessError(format!("kill {signal} exited with {status}")));
        }
        Ok(())
    }

    fn wait_listening(&self) -> Result<(), HarnessError> {
        let deadline = Instant::now() + Duration::from_millis(START_TIMEOUT_MS);
        while Instant::now() < deadline {
            if TcpStream::connect_timeout(
                &self.address.parse().expect("loopback address"),
                Duration::from_millis(200),
            )
            .is_ok()
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = std::fs::read_to_string(self.dir.join("replica.log")).unwrap_or_default();
        Err(HarnessError(format!(
            "replica did not listen on {} within {START_TIMEOUT_MS} ms; log:\n{log}",
            self.address
        )))
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        // A paused replica must run again to act on the termination signal.
        let _ = self.signal("-CONT");
        // The watchdog shell first: left alive, it would start a killed
        // replica again once the replica it knows of is gone.
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
        let _ = Command::new("kill")
            .arg(self.replica_pid.load(Ordering::Relaxed).to_string())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The server binary: `TIGERBEETLE_BIN`, or what `scripts/tigerbeetle.sh path`
/// prints (it builds the server the first time on a machine).
pub fn server_binary() -> Result<PathBuf, HarnessError> {
    if let Some(path) = std::env::var_os("TIGERBEETLE_BIN") {
        return Ok(PathBuf::from(path));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/tigerbeetle.sh");
    let output = Command::new("bash")
        .arg(&script)
        .arg("path")
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| HarnessError(format!("{}: {e}", script.display())))?;
    if !output.status.success() {
        return Err(HarnessError(format!("{} path failed", script.display())));
    }
    let path = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    Ok(PathBuf::from(path))
}

fn free_port() -> Result<u16, HarnessError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| HarnessError(format!("probe port: {e}")))?;
    let port = listener.local_addr().map_err(|e| HarnessError(e.to_string()))?.port();
    Ok(port)
}

/// Starts the replica under a shell that kills it when this process exits.
fn spawn_watchdog(binary: &Path, address: &str, data: &Path, dir: &Path) -> Result<Child, HarnessError> {
    // Bound to loopback only: TigerBeetle has no authentication. Without the
    // limits below, --development caps requests at 32 KiB and queues no request
    // beyond the 8 in the pipeline, so a 9th client session never gets an answer.
    // A replica killed while the stopped file exists is started again (same
    // data, same port) once the file is gone, and its new pid printed.
    let script = r#"
        run() {
            "$TB" start --addresses="$ADDR" --development --cache-grid="$CACHE" \
                --experimental --limit-request=1MiB --limit-pipeline-requests=24 "$DATA" >>"$LOG" 2>&1 &
            tb=$!
            echo "$tb"
        }
        run
        # The data file is a gigabyte: it goes with the replica.
        trap 'kill $tb 2>/dev/null; wait $tb 2>/dev/null; rm -rf "$DIR"' EXIT
        trap 'exit 0' TERM INT
        while kill -0 "$PARENT" 2>/dev/null; do
            if ! kill -0 "$tb" 2>/dev/null; then
                [ -e "$DIR/$STOPPED" ] || break
                wait "$tb" 2>/dev/null
                while [ -e "$DIR/$STOPPED" ] && kill -0 "$PARENT" 2>/dev/null; do sleep 0.02; done
                run
            fi
            sleep 0.1
        done
    "#;
    Command::new("bash")
        .arg("-c")
        .arg(script)
        .env("TB", binary)
        .env("ADDR", address)
        .env("CACHE", CACHE_GRID)
        .env("DATA", data)
        .env("LOG", dir.join("replica.log"))
        .env("DIR", dir)
        .env("STOPPED", STOPPED_FILE)
        .env("PARENT", std::process::id().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| HarnessError(format!("start: {e}")))
}

fn read_replica_pid(pids: &mut BufReader<ChildStdout>) -> Result<u32, HarnessError> {
    let mut line = String::new();
    pids.read_line(&mut line)
        .map_err(|e| HarnessError(format!("watchdog: {e}")))?;
    line.trim()
        .parse()
        .map_err(|_| HarnessError(format!("watchdog printed {line:?}, not a pid")))
}
