//! The over-admission soak (issue 7, RELIABILITY.md): many concurrent clients
//! reserve, complete and abandon LLM-shaped leases over HTTP while capacities
//! rise and fall; every grant is recorded, and afterwards the checker proves
//! that at no instant did any limit hold more than the capacity in force, and
//! that usage drained to 0 once every hold ended.
//!
//! ```sh
//! # 60 s against an in-process server on the memory backend:
//! cargo run --release -p ratelimiterd --example soak -- --seconds 60
//! # an in-process server with another backend (server.backend in the file):
//! cargo run --release -p ratelimiterd --features tigerbeetle --example soak -- --config tb.yaml
//! # a server running elsewhere, any backend:
//! cargo run --release -p ratelimiterd --example soak -- --url http://127.0.0.1:8080 \
//!     --admin-token "$ADMIN" --client-token "$CLIENT"
//! ```
//!
//! Exits 0 when everything held, 1 otherwise.

mod engine;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use engine::workload::{Endpoints, SoakOptions};
use engine::{checker, report, server, workload};

/// Soak `ratelimiterd` and check it never over-admitted.
#[derive(Debug, Parser)]
struct Args {
    /// How long the clients run, in seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Rolling windows and concurrency timeouts, in seconds (tenant budgets: twice).
    #[arg(long, default_value_t = 5)]
    hold_seconds: u64,
    /// Percent of granted leases never completed.
    #[arg(long, default_value_t = 5)]
    abandon_percent: u32,
    /// Percent of answers whose lease id is sent again.
    #[arg(long, default_value_t = 5)]
    replay_percent: u32,
    /// The longest simulated provider call, in ms.
    #[arg(long, default_value_t = 40)]
    call_ms_max: u64,
    /// Mean interval between capacity changes, in ms.
    #[arg(long, default_value_t = 400)]
    change_interval_ms: u64,
    /// Interval between usage samples, in ms.
    #[arg(long, default_value_t = 100)]
    sample_interval_ms: u64,
    /// Multiplies every capacity: above 1 the server's request rate, not the
    /// limits, bounds the run.
    #[arg(long, default_value_t = 1)]
    capacity_scale: u64,
    /// Seed of the clients' choices (random when absent).
    #[arg(long)]
    seed: Option<u64>,
    /// Serve from this process with this configuration (its backend; tokens and
    /// listen address replaced). Without it and without --url: the memory backend.
    #[arg(long, conflicts_with = "url")]
    config: Option<PathBuf>,
    /// Soak a server running elsewhere instead.
    #[arg(long)]
    url: Option<String>,
    /// With --url: the admin token, if the server wants one.
    #[arg(long, requires = "url")]
    admin_token: Option<String>,
    /// With --url: a client token, if the server wants one.
    #[arg(long, requires = "url")]
    client_token: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match runtime.block_on(soak(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(message) => {
            eprintln!("soak: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn soak(args: Args) -> Result<bool, String> {
    let seed = args.seed.unwrap_or_else(rand::random);
    let prefix = format!("soak:{seed:x}");
    let options = SoakOptions {
        duration: Duration::from_secs(args.seconds),
        clients: args.clients,
        hold_seconds: args.hold_seconds,
        abandon_percent: args.abandon_percent,
        replay_percent: args.replay_percent,
        call_ms_max: args.call_ms_max,
        change_interval: Duration::from_millis(args.change_interval_ms),
        sample_interval: Duration::from_millis(args.sample_interval_ms),
        capacity_scale: args.capacity_scale,
        seed,
        prefix: prefix.clone(),
    };
    let (endpoints, in_process) = match &args.url {
        Some(url) => {
            let endpoints = Endpoints {
                url: url.clone(),
                admin_token: args.admin_token.clone(),
                client_token: args.client_token.clone(),
            };
            (endpoints, None)
        }
        None => {
            let config = server::config(args.config.as_deref(), &server::temp_dir(&prefix))?;
            println!("in-process server, backend {:?}", config.server.backend);
            let running = server::start(&config).await?;
            (running.endpoints.clone(), Some(running))
        }
    };
    println!(
        "soak {} s, {} clients, seed {seed}, against {}",
        args.seconds, args.clients, endpoints.url
    );
    let (limits, records) = workload::run(options, &endpoints).await?;
    if let Some(running) = in_process {
        running.stop().await;
    }
    let verdict = checker::check(&limits, &records);
    print!(
        "{}",
        report::render(&records, &verdict, Duration::from_secs(args.seconds))
    );
    let passed = report::passed(&records, &verdict);
    println!("{}", if passed { "PASS" } else { "FAIL" });
    Ok(passed)
}
