//! The limiter's listener against hostile clients, on the real binary over
//! loopback (docs/http-api.md, "Connections"): an idle flood at the connection
//! cap does not take `/healthz` or the API down; a client that pipelines
//! requests and never reads is disconnected; a crowded lease table is logged
//! without lease ids; the snapshot file is readable by its owner only.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use support::raw::Session;
use support::{temp_dir, write_config_on, BackendConfig, Daemon, ADMIN_TOKEN, CLIENT_TOKEN};

/// Idle connections the flood opens: the default `connections_max`.
const IDLE_FLOOD: usize = 10_000;
/// `/healthz` probes made while the flood holds its connections.
const PROBES: usize = 20;
/// The write timeout of the non-reading client's test.
const WRITE_TIMEOUT_MS: u64 = 1_000;
/// Pipelined `/metrics` requests the non-reading client sends: far more
/// answer bytes than the socket buffers of both ends hold.
const PIPELINED: usize = 20_000;

/// Raises this process's open-file limit to its hard limit: the flood's
/// connections need one descriptor each.
fn raise_fd_limit(needed: usize) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write `limit`.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    assert!(
        limit.rlim_cur as usize > needed + 256,
        "the hard limit of open files ({}) is too low for {needed} connections",
        limit.rlim_cur
    );
}

fn get(session: &mut Session, path: &str, token: Option<&str>) -> u16 {
    let auth = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    session.write(format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n{auth}\r\n").as_bytes());
    session.read_response().map(|r| r.status).unwrap_or(0)
}

#[test]
fn healthz_and_the_api_answer_under_ten_thousand_idle_connections() {
    raise_fd_limit(IDLE_FLOOD);
    let dir = temp_dir("listener-idle-flood");
    let config = write_config_on(&dir, BackendConfig::Memory, "", "");
    let daemon = Daemon::start_with(&config).expect("the server starts");
    let started = Instant::now();
    let flood: Vec<TcpStream> = (0..IDLE_FLOOD)
        .map_while(|_| TcpStream::connect(daemon.addr).ok())
        .collect();
    let opened_ms = started.elapsed().as_millis();
    assert_eq!(flood.len(), IDLE_FLOOD, "the kernel queued every connection");
    // Let the server accept the whole flood: its table is then full of idle connections.
    std::thread::sleep(Duration::from_millis(500));
    let mut latencies_ms = Vec::new();
    for _ in 0..PROBES {
        let probe = Instant::now();
        let mut session = Session::open(daemon.addr);
        assert_eq!(get(&mut session, "/healthz", None), 200, "healthz under the flood");
        latencies_ms.push(probe.elapsed().as_secs_f64() * 1000.0);
    }
    let mut api = Session::open(daemon.addr);
    assert_eq!(
        get(&mut api, "/v1/admin/limits", Some(ADMIN_TOKEN)),
        200,
        "the API under the flood"
    );
    latencies_ms.sort_by(f64::total_cmp);
    let closed = flood.iter().filter(|stream| is_closed(stream)).count();
    println!(
        "idle flood: {IDLE_FLOOD} connections opened in {opened_ms} ms; /healthz over {PROBES} new connections: \
         median {:.1} ms, max {:.1} ms; flood connections closed for them: {closed}",
        latencies_ms[PROBES / 2],
        latencies_ms[PROBES - 1]
    );
    let logs = daemon.logs().join("\n");
    let replaced_lines = logs.matches("idle connections closed to make room").count();
    assert!(replaced_lines <= 2, "logged at a bounded rate:\n{logs}");
}

/// True when the server closed `stream` (an idle connection is sent nothing).
fn is_closed(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    !matches!(stream.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

#[test]
fn a_client_that_pipelines_requests_and_never_reads_is_disconnected() {
    let dir = temp_dir("listener-non-reader");
    let extra = format!("  client_write_timeout_ms: {WRITE_TIMEOUT_MS}\n");
    let config = write_config_on(&dir, BackendConfig::Memory, &extra, "");
    let daemon = Daemon::start_with(&config).expect("the server starts");
    let mut stream = TcpStream::connect(daemon.addr).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let request = b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n";
        for _ in 0..PIPELINED {
            if writer.write_all(request).is_err() {
                return;
            }
        }
    });
    // Nothing is read while the server's writes stall past the timeout.
    std::thread::sleep(Duration::from_millis(WRITE_TIMEOUT_MS * 4));
    let started = Instant::now();
    stream.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut answers = Vec::new();
    let mut buffer = vec![0u8; 1 << 16];
    let closed = loop {
        match stream.read(&mut buffer) {
            Ok(0) => break true,
            Ok(n) => answers.extend_from_slice(&buffer[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                break false
            }
            Err(_) => break true,
        }
        if started.elapsed() > Duration::from_secs(10) {
            break false;
        }
    };
    let served = answers.windows(12).filter(|w| *w == b"HTTP/1.1 200").count();
    println!(
        "non-reading client: disconnected {closed}, {served} of {PIPELINED} pipelined answers delivered, {} bytes",
        answers.len()
    );
    assert!(
        closed,
        "the server closed the connection of a client that stopped reading"
    );
    assert!(served < PIPELINED, "it did not serve every pipelined request");
    drop(stream);
    sender.join().unwrap();
    let mut session = Session::open(daemon.addr);
    assert_eq!(get(&mut session, "/healthz", None), 200);
}

#[test]
fn a_crowded_lease_table_is_logged_without_lease_ids_and_the_snapshot_is_private() {
    let dir = temp_dir("listener-logs");
    let config = write_config_on(&dir, BackendConfig::Memory, "", "memory:\n  leases_max: 4\n");
    let daemon = Daemon::start_with(&config).expect("the server starts");
    let admin = format!("authorization: Bearer {ADMIN_TOKEN}\r\n");
    let definition = r#"{"key":"a:rpm","kind":"rolling","capacity":100,"window_seconds":60}"#;
    let mut session = Session::open(daemon.addr);
    let put = format!(
        "PUT /v1/admin/limits HTTP/1.1\r\nhost: 127.0.0.1\r\n{admin}content-type: application/json\r\ncontent-length: {}\r\n\r\n{definition}",
        definition.len()
    );
    session.write(put.as_bytes());
    assert_eq!(session.read_response().unwrap().status, 200);
    let mut ids = Vec::new();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let id = ratelimiter::LeaseId::generate().to_string();
        let body = format!(r#"{{"lease_id":"{id}","requirements":[{{"key":"a:rpm","amount":1}}]}}"#);
        let reserve = format!(
            "POST /v1/reserve HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {CLIENT_TOKEN}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        session.write(reserve.as_bytes());
        statuses.push(session.read_response().unwrap().status);
        ids.push(id);
    }
    assert_eq!(statuses, [200, 429, 429], "a token's share of 4 leases is 1");
    let deadline = Instant::now() + Duration::from_secs(10);
    let snapshot = dir.join(ratelimiterd::snapshots::SNAPSHOT_FILE_NAME);
    while !snapshot.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mode = std::fs::metadata(&snapshot)
        .expect("a periodic snapshot")
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o600,
        "the snapshot holds live lease ids: its owner's only"
    );
    // The warning is logged as the refusal happens, and read from the server's
    // output by another thread: wait for it rather than race that thread.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut logs = daemon.logs().join("\n");
    while !logs.contains("the lease table is crowded") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        logs = daemon.logs().join("\n");
    }
    assert!(logs.contains("the lease table is crowded"), "{logs}");
    for id in &ids {
        assert!(!logs.contains(id.as_str()), "lease id {id} in the INFO log:\n{logs}");
    }
}
