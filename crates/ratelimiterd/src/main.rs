//! `ratelimiterd`: runs the server, or one operator command against a running one.

use std::process::ExitCode;

use clap::Parser;
use ratelimiterd::cli::{self, Cli, Command};

/// mimalloc: per-thread heaps for the allocations every request makes on every
/// worker (BENCHMARKS.md, "The gateway's CPU per call: profile and cuts").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // First of all: a SIGHUP (or a stray SIGUSR1, ...) sent while the server
    // starts must not end it (`signals.rs`).
    ratelimiterd::signals::ignore_stray();
    // Before the server allocates much: how long freed memory is kept (allocator.rs).
    ratelimiterd::allocator::tune();
    let cli = Cli::parse();
    if !matches!(cli.command, None | Some(Command::Serve)) {
        ratelimiterd::signals::restore_default();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ratelimiterd: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            None | Some(Command::Serve) => serve(cli.config).await,
            Some(Command::CheckConfig) => {
                cli::check_config(cli.config.as_ref())?;
                println!("configuration is valid");
                Ok(ExitCode::SUCCESS)
            }
            Some(command) => cli::run_client(command, &cli.remote).await,
        }
    });
    result.unwrap_or_else(|message| {
        eprintln!("ratelimiterd: {message}");
        ExitCode::FAILURE
    })
}

async fn serve(config: Option<std::path::PathBuf>) -> Result<ExitCode, String> {
    let config = cli::load_config(config.as_ref())?;
    ratelimiterd::logging::init(&config.log);
    ratelimiterd::run(config, ratelimiterd::shutdown::signal())
        .await
        .map_err(|e| e.to_string())?;
    Ok(ExitCode::SUCCESS)
}
