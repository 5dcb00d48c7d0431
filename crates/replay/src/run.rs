//! One replay run from the command line: start the provider, build the strategy,
//! replay, then write the summary, the outcomes and the plot.

use std::io::Write;
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use ratelimiter::{Clock, SystemClock};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::cli::Args;
use crate::outcome::RequestOutcome;
use crate::plot;
use crate::provider_client::ProviderClient;
use crate::provider_server::ProviderServer;
use crate::replayer::{self, Plan};
use crate::strategy::{self, Caller, StrategyKind};
use crate::summary::{self, RunRecord, Summary};
use crate::trace::Trace;

/// The provider name in limit keys and requests.
pub const PROVIDER: &str = "sim";
/// The model name in limit keys and requests.
pub const MODEL: &str = "sim-model";
/// The delay between setting up and the first arrival, in ms: lets every client
/// process start before the shared start time.
pub const START_DELAY_MS: u64 = 300;

/// Loads the trace named by `args`, cut to `--requests`.
pub fn load_trace(args: &Args) -> Result<Trace, String> {
    let mut trace = Trace::load(&args.trace, args.format).map_err(|e| e.to_string())?;
    if let Some(n) = args.requests {
        trace.truncate(n);
    }
    Ok(trace)
}

/// A progress bar over `len` requests, hidden when asked or when not on a terminal.
fn progress_bar(len: usize, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} requests (eta {eta})")
            .expect("a valid template"),
    );
    bar
}

/// Runs the replay `args` describe and returns its summary.
pub async fn run(args: &Args) -> Result<Summary, String> {
    let limits = args.provider_limits()?;
    let trace = load_trace(args)?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let provider = ProviderServer::new(limits, Arc::clone(&clock));
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("provider bind: {e}"))?;
    let provider_url = format!("http://{}", listener.local_addr().map_err(|e| e.to_string())?);
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(Arc::clone(&provider).serve(listener, async {
        let _ = stopped.await;
    }));
    let plan = Plan {
        start_unix_ms: clock.now_unix_ms() + START_DELAY_MS,
        speedup: args.speedup,
        max_tokens: args.max_output_tokens,
        shard: (0, 1),
    };
    let outcomes = run_strategy(args, &trace, &plan, &provider_url, &clock).await;
    let _ = stop.send(());
    server
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("provider: {e}"))?;
    let outcomes = outcomes?;
    let admissions = provider.admissions();
    let record = RunRecord {
        outcomes: &outcomes,
        admissions: &admissions,
        limits,
        provider_429: provider.counts().throttled,
        start_unix_ms: plan.start_unix_ms,
    };
    let summary = summary::summarize(&record);
    write_reports(args, &record, &summary)?;
    Ok(summary)
}

async fn run_strategy(
    args: &Args,
    trace: &Trace,
    plan: &Plan,
    provider_url: &str,
    clock: &Arc<dyn Clock>,
) -> Result<Vec<RequestOutcome>, String> {
    let limits = args.provider_limits()?;
    let caller = Caller::new(
        ProviderClient::new(provider_url, MODEL),
        Arc::clone(clock),
        limits.accounting,
    );
    let strategy: Arc<dyn strategy::Strategy> = match args.strategy {
        StrategyKind::None => Arc::new(strategy::none::NoLimiter::new(caller)),
        StrategyKind::TokenBucket => Arc::new(strategy::token_bucket::TokenBucket::new(caller, limits)),
        other => return Err(format!("strategy {other:?} is not available in this build")),
    };
    let requests = plan.requests(trace);
    let progress = progress_bar(requests.len(), args.quiet);
    Ok(replayer::replay(requests, strategy, Arc::clone(clock), progress).await)
}

fn write_reports(args: &Args, record: &RunRecord<'_>, summary: &Summary) -> Result<(), String> {
    if let Some(path) = &args.summary_json {
        let json = serde_json::to_string_pretty(summary).expect("a summary serializes");
        std::fs::write(path, json + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &args.outcomes_jsonl {
        let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut out = std::io::BufWriter::new(file);
        for outcome in record.outcomes {
            serde_json::to_writer(&mut out, outcome).expect("an outcome serializes");
            out.write_all(b"\n").map_err(|e| format!("{}: {e}", path.display()))?;
        }
        out.flush().map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        let end = record
            .outcomes
            .iter()
            .map(|o| o.done_unix_ms)
            .max()
            .unwrap_or(record.start_unix_ms);
        let (admitted, offered) = plot::trailing_window_series(
            record.admissions,
            record.outcomes,
            record.limits.window_ms,
            record.start_unix_ms,
            end,
        );
        let name = args
            .trace
            .file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        let title = format!("{name}, strategy {:?}, speed-up {}", args.strategy, args.speedup);
        plot::draw(path, &title, &record.limits, &admitted, &offered)?;
    }
    Ok(())
}

/// The command's entry: runs, prints the summary, and reports errors as text.
pub async fn main(args: Args) -> Result<(), String> {
    let summary = run(&args).await?;
    println!(
        "{}",
        serde_json::to_string_pretty(&summary).expect("a summary serializes")
    );
    Ok(())
}
