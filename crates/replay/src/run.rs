//! One replay run from the command line: start the provider, build the strategy,
//! replay, then write the summary, the outcomes and the plot.

use std::io::Write;
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use ratelimiter::{
    Backend, Clock, DefinitionFields, LimitDefinition, LimitKind, MemoryBackend, MemoryConfig, SystemClock,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::cli::{Args, ProfileWindows};
use crate::definitions::limiter_definitions;
use crate::names::MODEL;
use crate::outcome::RequestOutcome;
use crate::plot;
use crate::record::SavedRun;
use crate::replayer::{self, Plan};
use crate::server_process::{self, define_limits, locate_binary, ServerProcess};
use crate::sim::client::ProviderClient;
use crate::sim::limits::ProviderLimits;
use crate::sim::profile::ProfileName;
use crate::sim::server::ProviderServer;
use crate::strategy::none::NoLimiter;
use crate::strategy::scheduled::Scheduled;
use crate::strategy::server_multi::{self as server_multi, ChildRun};
use crate::strategy::token_bucket::TokenBucket;
use crate::strategy::{self, Caller, StrategyKind};
use crate::summary::{self, RunRecord, Summary};
use crate::trace::Trace;
use ratelimiter::profile::{llm_profile, LlmProfile, Published};

/// The delay between setting up and the first arrival, in ms: lets every client
/// process start before the shared start time.
pub const START_DELAY_MS: u64 = 300;
/// The same for `server-multi`, whose client processes start first.
pub const MULTI_START_DELAY_MS: u64 = 2_000;

/// Loads the trace named by `args`, cut to `--requests`.
pub fn load_trace(args: &Args) -> Result<Trace, String> {
    let path = args.trace.as_deref().ok_or("--trace is required")?;
    let mut trace = Trace::load(path, args.format).map_err(|e| e.to_string())?;
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

/// What a strategy needs running during the replay: the strategy itself (in
/// this process) or the URL the `server-multi` children share, and the server
/// the replay started, stopped when dropped.
struct Prepared {
    strategy: Option<Arc<dyn strategy::Strategy>>,
    server_url: Option<String>,
    _server: Option<ServerProcess>,
}

/// Starts what `args.strategy` needs and builds it.
async fn prepare(args: &Args, trace: &Trace, provider_url: &str, clock: &Arc<dyn Clock>) -> Result<Prepared, String> {
    let limits = args.provider_limits()?;
    let caller = Caller::new(
        ProviderClient::new(provider_url, MODEL),
        Arc::clone(clock),
        limits.accounting,
    );
    let (definitions, rules) = match args.limiter_profile {
        false => (limiter_definitions(&limits, args.limiter_window_margin_ms)?, None),
        true => {
            let profile = library_profile(args, &limits)?;
            (profile.definitions, Some(profile.rules))
        }
    };
    let jobs = trace.records().len();
    let (strategy, server_url, server): (Option<Arc<dyn strategy::Strategy>>, _, _) = match args.strategy {
        StrategyKind::None => (Some(Arc::new(NoLimiter::new(caller))), None, None),
        StrategyKind::TokenBucket => (Some(Arc::new(TokenBucket::new(caller, limits))), None, None),
        StrategyKind::Local => {
            let backend = Arc::new(MemoryBackend::new(Arc::clone(clock), MemoryConfig::default()));
            for definition in &definitions {
                backend.apply_definition(definition).await.map_err(|e| e.to_string())?;
            }
            let scheduled = Scheduled::new(caller, backend, args.scheduled_options(jobs, rules))?;
            (Some(Arc::new(scheduled)), None, None)
        }
        StrategyKind::Server | StrategyKind::ServerMulti => {
            let (url, server) = match &args.server_url {
                Some(url) => (url.clone(), None),
                None => {
                    let server = ServerProcess::start(
                        &locate_binary(args.ratelimiterd.as_deref()),
                        args.tigerbeetle_addresses.as_deref(),
                    )
                    .await?;
                    (server.url().to_owned(), Some(server))
                }
            };
            define_limits(&url, &definitions).await?;
            let strategy: Option<Arc<dyn strategy::Strategy>> = if args.strategy == StrategyKind::Server {
                let client = Arc::new(server_process::client(&url)?);
                Some(Arc::new(Scheduled::new(
                    caller,
                    client,
                    args.scheduled_options(jobs, rules),
                )?))
            } else {
                None
            };
            (strategy, Some(url), server)
        }
    };
    Ok(Prepared {
        strategy,
        server_url,
        _server: server,
    })
}

/// The library's profile of the provider's profile, fed the numbers the provider
/// publishes (as a user enters them: nothing tuned).
pub fn library_profile(args: &Args, limits: &ProviderLimits) -> Result<LlmProfile, String> {
    let sim = args.sim_profile(limits)?;
    if args.strategy == StrategyKind::ServerMulti {
        return Err("--limiter-profile: server-multi children do not take a profile".to_owned());
    }
    let name = serde_json::to_value(sim.name).expect("serializes");
    let name = name.as_str().expect("a name");
    let anthropic = sim.name == ProfileName::Anthropic;
    let published = Published {
        rpm: Some(limits.rpm),
        tpm: (!anthropic).then_some(limits.tpm),
        input_tpm: anthropic.then_some(limits.tpm),
        output_tpm: anthropic.then_some(sim.output_tpm),
        rpd: (sim.name == ProfileName::Gemini).then_some(sim.requests_per_day),
        concurrency: Some(limits.concurrency),
        ..Published::default()
    };
    let mut profile = llm_profile(name, MODEL, &published).map_err(|e| format!("--limiter-profile: {e}"))?;
    if args.profile_windows == ProfileWindows::Rolling {
        profile.definitions = (profile.definitions.into_iter())
            .map(bucket_as_rolling)
            .collect::<Result<_, _>>()?;
    }
    Ok(profile)
}

/// `definition`, a bucket, as a rolling limit of the same capacity, window,
/// margin and overage (other kinds unchanged): `--profile-windows rolling`, the
/// reference a bucket profile is measured against.
pub fn bucket_as_rolling(definition: LimitDefinition) -> Result<LimitDefinition, String> {
    if definition.kind() != LimitKind::Bucket {
        return Ok(definition);
    }
    let fields = DefinitionFields {
        kind: LimitKind::Rolling,
        ..definition.fields().clone()
    };
    LimitDefinition::new(fields).map_err(|e| format!("--profile-windows rolling: {e}"))
}

/// Runs the replay `args` describe and returns its summary.
pub async fn run(args: &Args) -> Result<Summary, String> {
    let limits = args.provider_limits()?;
    let trace = load_trace(args)?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let provider = ProviderServer::new(limits, Arc::clone(&clock));
    provider.set_profile(args.sim_profile(&limits)?);
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("provider bind: {e}"))?;
    let provider_url = format!("http://{}", listener.local_addr().map_err(|e| e.to_string())?);
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(Arc::clone(&provider).serve(listener, async {
        let _ = stopped.await;
    }));
    let prepared = prepare(args, &trace, &provider_url, &clock).await;
    let (plan, outcomes) = match prepared {
        Ok(prepared) => replay_prepared(args, &trace, &prepared, &provider, &provider_url, &clock).await,
        Err(message) => (None, Err(message)),
    };
    let _ = stop.send(());
    server
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("provider: {e}"))?;
    let (plan, outcomes) = (plan.expect("a plan exists once prepared"), outcomes?);
    let saved = SavedRun {
        title: title(args),
        limits,
        start_unix_ms: plan.start_unix_ms,
        counts: provider.counts(),
        token_limits: provider.token_limits(),
        admissions: provider.admissions(),
        outcomes,
    };
    if let Some(path) = &args.record_json {
        saved.save(path)?;
    }
    report(args, &saved)
}

/// The plot title for a run of `args`.
fn title(args: &Args) -> String {
    let name = args
        .trace
        .as_deref()
        .and_then(|t| t.file_stem())
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let strategy = clap::ValueEnum::to_possible_value(&args.strategy).expect("no skipped values");
    let kind = match args.profile_windows {
        ProfileWindows::Profile => "",
        ProfileWindows::Rolling => " (profile's buckets as rolling windows)",
    };
    format!(
        "{name}, strategy {}{kind}, speed-up {}",
        strategy.get_name(),
        args.speedup
    )
}

/// Summarizes `saved` and writes the reports `args` ask for.
fn report(args: &Args, saved: &SavedRun) -> Result<Summary, String> {
    let record = saved.record();
    let summary = summary::summarize(&record);
    write_reports(args, &record, &summary, &saved.title)?;
    Ok(summary)
}

async fn replay_prepared(
    args: &Args,
    trace: &Trace,
    prepared: &Prepared,
    provider: &Arc<ProviderServer>,
    provider_url: &str,
    clock: &Arc<dyn Clock>,
) -> (Option<Plan>, Result<Vec<RequestOutcome>, String>) {
    let delay_ms = if prepared.strategy.is_some() {
        START_DELAY_MS
    } else {
        MULTI_START_DELAY_MS
    };
    let plan = Plan {
        start_unix_ms: clock.now_unix_ms() + delay_ms,
        speedup: args.speedup,
        max_tokens: args.max_output_tokens,
        shard: (0, 1),
    };
    let progress = progress_bar(trace.records().len(), args.quiet);
    let outcomes = match (&prepared.strategy, &prepared.server_url) {
        (Some(strategy), _) => {
            Ok(replayer::replay(plan.requests(trace), Arc::clone(strategy), Arc::clone(clock), progress).await)
        }
        (None, Some(url)) => {
            let parent_flags = args.child_flags();
            let children = ChildRun {
                parent_flags: &parent_flags,
                clients: args.clients,
                server_url: url,
                provider_url,
                start_unix_ms: plan.start_unix_ms,
            };
            server_multi::run(&children, provider, progress).await
        }
        (None, None) => unreachable!("prepare sets a strategy or a server"),
    };
    (Some(plan), outcomes)
}

/// `server-multi` child mode: replays this child's shard through the shared
/// server and writes the outcomes for the parent.
pub async fn run_worker(args: &Args) -> Result<(), String> {
    let limits = args.provider_limits()?;
    let trace = load_trace(args)?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let worker = args.worker()?;
    let caller = Caller::new(
        ProviderClient::new(&worker.provider_url, MODEL),
        Arc::clone(&clock),
        limits.accounting,
    );
    let client = Arc::new(server_process::client(&worker.server_url)?);
    let options = args.scheduled_options(trace.records().len(), None);
    let strategy = Arc::new(Scheduled::new(caller, client, options)?);
    let plan = Plan {
        start_unix_ms: worker.start_unix_ms,
        speedup: args.speedup,
        max_tokens: args.max_output_tokens,
        shard: worker.shard,
    };
    let outcomes = replayer::replay(plan.requests(&trace), strategy, clock, ProgressBar::hidden()).await;
    let path = args
        .outcomes_jsonl
        .as_deref()
        .ok_or("a worker needs --outcomes-jsonl")?;
    write_outcomes(path, &outcomes)
}

fn write_outcomes(path: &std::path::Path, outcomes: &[RequestOutcome]) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for outcome in outcomes {
        serde_json::to_writer(&mut out, outcome).expect("an outcome serializes");
        out.write_all(b"\n").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    out.flush().map_err(|e| format!("{}: {e}", path.display()))
}

fn write_reports(args: &Args, record: &RunRecord<'_>, summary: &Summary, title: &str) -> Result<(), String> {
    if let Some(path) = &args.summary_json {
        let json = serde_json::to_string_pretty(summary).expect("a summary serializes");
        std::fs::write(path, json + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &args.outcomes_jsonl {
        write_outcomes(path, record.outcomes)?;
    }
    if let Some(path) = &args.plot {
        let end = record
            .outcomes
            .iter()
            .map(|o| o.done_unix_ms)
            .max()
            .unwrap_or(record.start_unix_ms);
        // The binding limit's picture; the demand is drawn when in its units (the
        // first token limit's: prompt plus output).
        let index = (record.token_limits.iter())
            .position(|l| Some(l.dimension) == summary.binding_limit)
            .unwrap_or(0);
        let binding = record.token_limits.get(index).ok_or("the run kept no token limit")?;
        let (admitted, offered) = plot::trailing_window_series(
            record.admissions,
            index,
            record.outcomes,
            record.limits.window_ms,
            record.start_unix_ms,
            end,
        );
        let limit = plot::PlottedLimit {
            name: binding.dimension.label(),
            capacity: binding.capacity,
            window_ms: record.limits.window_ms,
        };
        plot::draw(path, title, &limit, &admitted, (index == 0).then_some(&offered[..]))?;
    }
    Ok(())
}

/// The command's entry: runs, prints the summary, and reports errors as text.
pub async fn main(args: Args) -> Result<(), String> {
    if args.worker_shard.is_some() {
        return run_worker(&args).await;
    }
    let summary = match &args.from_record {
        Some(path) => report(&args, &SavedRun::load(path)?)?,
        None => run(&args).await?,
    };
    println!(
        "{}",
        serde_json::to_string_pretty(&summary).expect("a summary serializes")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn anthropic_profile(extra: &[&str]) -> Result<LlmProfile, String> {
        let base = [
            "replay",
            "--trace",
            "t.csv",
            "--provider-profile",
            "anthropic",
            "--provider-tpm",
            "850000",
        ];
        let args = Args::try_parse_from(base.iter().chain(extra)).map_err(|e| e.to_string())?;
        let limits = args.provider_limits()?;
        library_profile(&args, &limits)
    }

    fn shape(profile: &LlmProfile) -> Vec<(LimitKind, String, u64, u64, Option<u64>)> {
        (profile.definitions.iter())
            .map(|d| {
                let key = d.key().as_str().to_owned();
                (d.kind(), key, d.capacity(), d.window_seconds(), d.window_margin_ms())
            })
            .collect()
    }

    #[test]
    fn profile_windows_rolling_turns_only_the_buckets_into_rolling_limits_of_the_same_size() {
        let buckets = anthropic_profile(&["--limiter-profile"]).unwrap();
        let rolling = anthropic_profile(&["--limiter-profile", "--profile-windows", "rolling"]).unwrap();
        let (buckets, rolling) = (shape(&buckets), shape(&rolling));
        assert_eq!(buckets.len(), rolling.len());
        assert!(buckets.iter().any(|d| d.0 == LimitKind::Bucket), "{buckets:?}");
        for (bucket, window) in buckets.iter().zip(&rolling) {
            let expected = match bucket.0 {
                LimitKind::Bucket => LimitKind::Rolling,
                other => other,
            };
            assert_eq!(window.0, expected, "{window:?}");
            let size = |d: &(LimitKind, String, u64, u64, Option<u64>)| (d.1.clone(), d.2, d.3, d.4);
            assert_eq!(size(bucket), size(window), "same key, capacity, window and margin");
        }
        let refused = anthropic_profile(&["--profile-windows", "rolling"]).unwrap_err();
        assert!(refused.contains("--limiter-profile"), "{refused}");
    }
}
