//! The command line: `ratelimiterd [--config PATH]` runs the server; subcommands
//! talk to a running server through [`HttpClient`] (define and inspect limits, try
//! a reservation, complete a lease).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ratelimiter::httpclient::{HttpClient, HttpClientConfig};
use ratelimiter::{
    Actual, CompleteRequest, DefinitionFields, LeaseId, LimitDefinition, LimitKey, LimitKind, Limiter, Overage,
    Requirement, ReserveOutcome, ReserveRequest, ReserveResponse,
};

use crate::config::Config;

/// Exit status of `reserve` when the reservation was denied.
pub const EXIT_DENIED: u8 = 3;

const ABOUT: &str = "Rate limiting server for LLM workloads (RPM, TPM, concurrency, budgets).";
const LONG_ABOUT: &str = "\
Rate limiting server for LLM workloads (RPM, TPM, concurrency, budgets).

Without a subcommand, runs the server. Without --config, it serves the memory backend on
127.0.0.1:8080 with ./data/limits.json as registry. The configuration file is YAML:

  server:
    listen_addr: \"127.0.0.1:8080\"     # host:port, or :port for every interface
    backend: memory                    # or tigerbeetle (needs --features tigerbeetle)
    admin_token: \"...\"                 # guards /v1/admin/* (Authorization: Bearer)
    client_tokens: [\"...\"]             # guards /v1/reserve and /v1/complete
    # or scoped: [{token_env: SEARCH_TOKEN, key_prefixes: [\"svc:search:\"]}]
    body_bytes_max: 65536              # larger bodies get 413
    request_timeout_ms: 5000           # slower requests get 503 backend_unavailable
    concurrent_requests_max: 4096      # more get 503 overloaded at once
    connections_max: 10000             # more are closed at once; idle ones close after 30 s
    shutdown_grace_ms: 10000           # time in-flight requests get on SIGTERM/Ctrl-C
    echo_route: false                  # POST /v1/echo, the benchmark's reference
  registry:
    path: ./data/limits.json
  memory:
    leases_max: 100000                 # live leases kept for reconciliation
    settled_leases_max: 1000000        # completed lease ids remembered for idempotent retries
    failed_leases_max: 500000          # denied lease ids remembered
    snapshot_interval_ms: 1000         # live state saved beside the registry (0: only at a graceful stop)
    damaged_snapshot: start_fresh      # or refuse: a damaged snapshot at start is moved aside, or stops it
  directory:
    key_retention_days: 30             # revoked and expired gateway keys listed this long, then forgotten
  tigerbeetle:
    cluster_id: \"0\"
    addresses: [\"127.0.0.1:3000\"]
    sessions: 1                        # one batch out at a time: fewer, larger commits
    max_batch_events: 8000
    flush_interval_micros: 0           # 0: wait for a batch to fill only when that pays (adaptive)
    submit_mode: batching              # or direct
    request_timeout_ms: 5000           # TigerBeetle answer unknown after this: 503
    queue_depth_max: 65536             # submitter queue; full answers 503 at once
    lease_cache_max: 1000000           # leases remembered for Complete
    lease_share_percent: 25            # of them, one owner's live leases at most
  retry_policy:                        # retry hints of denials (ADR 0010)
    concurrency: {base_ms: 50, max_ms: 2000, factor: 2.0, jitter_ms: 25}
    rolling: {base_ms: 100, max_ms: 1000, factor: 1.5, jitter_ms: 50, window_fraction: 0.1}
  decrease:
    retry_ms: 10000                    # retry hint of limit_decreasing denials
    check_interval_ms: 1000            # how often pending decreases are tried
  defaults:                            # for definitions that leave the field out
    window_margin_ms: 50               # rolling holds last window + this, or 0.4 % of the
                                       # window when longer (0: none): the provider's
                                       # window starts when the call reaches it
  log:
    format: text                       # or json
    level: info                        # RUST_LOG overrides it

Every entry is optional; unknown entries are errors. /healthz and /metrics need no token.";

/// `ratelimiterd`: the server and its operator commands.
#[derive(Debug, Parser)]
#[command(name = "ratelimiterd", version, about = ABOUT, long_about = LONG_ABOUT)]
pub struct Cli {
    /// YAML configuration file (see --help for every entry). Default: built-in defaults.
    #[arg(long, short = 'c', value_name = "PATH", global = true)]
    pub config: Option<PathBuf>,
    /// How the operator commands reach the server: global, so `--url` and
    /// `--token` go before or after the subcommand alike, as `--config` does.
    #[command(flatten)]
    pub remote: Remote,
    /// What to do; default: run the server.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server (the default).
    Serve,
    /// Check the configuration file and the gateway's key variables, and
    /// exit: 0 when `serve` would start on them.
    CheckConfig,
    /// Define and inspect limits on a running server.
    Limits {
        /// Which limits operation.
        #[command(subcommand)]
        command: LimitsCommand,
    },
    /// The gateway's tenants on a running server: create, list, get, update, delete.
    Tenants {
        /// Which tenants operation.
        #[command(subcommand)]
        command: crate::cli_directory::TenantsCommand,
    },
    /// The gateway's keys on a running server: create, list, get, update, revoke, rotate.
    Keys {
        /// Which keys operation.
        #[command(subcommand)]
        command: crate::cli_directory::KeysCommand,
    },
    /// The gateway's spend on a running server, summed over days and grouped;
    /// prints the report in JSON or CSV.
    Spend(crate::cli_spend::SpendArgs),
    /// Try one reservation on a running server; prints the answer. Exit 0 when
    /// allowed, 3 when denied, 1 on error.
    Reserve {
        /// A requirement `KEY=AMOUNT`; repeat for several.
        #[arg(long = "require", short = 'r', value_name = "KEY=AMOUNT", required = true, value_parser = parse_requirement)]
        requirements: Vec<Requirement>,
        /// The lease id (a ULID); default: a new one.
        #[arg(long)]
        lease_id: Option<LeaseId>,
        /// The logical job id, for logs.
        #[arg(long)]
        job_id: Option<String>,
    },
    /// Complete a lease on a running server.
    Complete {
        /// The lease id given to reserve.
        #[arg(long)]
        lease_id: LeaseId,
        /// An actual usage `KEY=AMOUNT` of a rolling limit; repeat for several.
        #[arg(long = "actual", short = 'a', value_name = "KEY=AMOUNT", value_parser = parse_actual)]
        actuals: Vec<Actual>,
    },
}

/// `limits` operations.
#[derive(Debug, Subcommand)]
pub enum LimitsCommand {
    /// Create or change a limit (PUT /v1/admin/limits); prints its state.
    Put(PutArgs),
    /// List every limit with its usage.
    List,
    /// Show one limit with its usage.
    Get {
        /// The limit key.
        key: LimitKey,
    },
}

/// A limit definition on the command line (docs/http-api.md, "LimitDefinition").
#[derive(Debug, Args)]
pub struct PutArgs {
    /// The limit key, 1..=256 bytes of [A-Za-z0-9:_.@/-].
    #[arg(long)]
    pub key: LimitKey,
    /// rolling (expires after the window), concurrency (held until complete) or
    /// bucket (a token bucket refilled over the window: docs/bucket-limits.md).
    #[arg(long, value_enum)]
    pub kind: KindArg,
    /// The most units granted at once.
    #[arg(long)]
    pub capacity: u64,
    /// Rolling window, or a bucket's time to refill from empty to full, 1..=2678400
    /// seconds (rolling and bucket only).
    #[arg(long, default_value_t = 0)]
    pub window_seconds: u64,
    /// Hold reservations this many ms beyond the window, 0..=60000 and at most the
    /// window (rolling and bucket only); default: the server's `defaults.window_margin_ms`.
    #[arg(long)]
    pub window_margin_ms: Option<u64>,
    /// Hold timeout, 1..=86400 seconds (concurrency only).
    #[arg(long, default_value_t = 0)]
    pub timeout_seconds: u64,
    /// A label such as requests, tokens, inflight.
    #[arg(long, default_value = "")]
    pub unit: String,
    /// What the limit is for.
    #[arg(long, default_value = "")]
    pub description: String,
    /// What completes above the reservation do: none (drop) or debt (record).
    #[arg(long, value_enum, default_value_t = OverageArg::None)]
    pub overage: OverageArg,
}

/// `--kind` values.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum KindArg {
    /// Rolling window.
    Rolling,
    /// Concurrency.
    Concurrency,
    /// Token bucket, as Anthropic enforces its limits (docs/bucket-limits.md).
    Bucket,
}

/// `--overage` values.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OverageArg {
    /// Drop usage above the reservation.
    None,
    /// Record it as debt.
    Debt,
    /// Record it as debt and refuse every reservation until the window or
    /// period it belongs to ends (a budget).
    Owe,
}

/// How to reach a running server. Every option is global: it may come before
/// or after the subcommand (`ratelimiterd --url U limits list` and
/// `ratelimiterd limits list --url U` are the same command).
#[derive(Debug, Args)]
pub struct Remote {
    /// The server's base URL, or the servers of a fleet in failover order:
    /// repeat `--url` or separate with commas (at most 16). A transport error
    /// or a 503 is retried on the next server with the same lease id.
    #[arg(
        long = "url",
        env = "RATELIMITERD_URL",
        default_value = "http://127.0.0.1:8080",
        value_delimiter = ',',
        global = true
    )]
    pub urls: Vec<String>,
    /// Bearer token (admin token for `limits`, client or admin token otherwise).
    #[arg(long, env = "RATELIMITERD_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Timeout of one attempt, in ms.
    #[arg(long, default_value_t = 5_000, global = true)]
    pub timeout_ms: u64,
}

fn parse_key_amount(text: &str) -> Result<(LimitKey, u64), String> {
    let (key, amount) = text.rsplit_once('=').ok_or("expected KEY=AMOUNT")?;
    let key = LimitKey::new(key).map_err(|e| e.to_string())?;
    let amount = amount.parse::<u64>().map_err(|e| format!("amount {amount:?}: {e}"))?;
    Ok((key, amount))
}

fn parse_requirement(text: &str) -> Result<Requirement, String> {
    parse_key_amount(text).map(|(key, amount)| Requirement { key, amount })
}

fn parse_actual(text: &str) -> Result<Actual, String> {
    parse_key_amount(text).map(|(key, actual_amount)| Actual { key, actual_amount })
}

impl Remote {
    fn client(&self) -> Result<HttpClient, String> {
        HttpClient::new(HttpClientConfig {
            token: self.token.clone(),
            request_timeout_ms: self.timeout_ms,
            ..HttpClientConfig::fleet(self.urls.iter().cloned())
        })
        .map_err(|e| e.to_string())
    }
}

impl PutArgs {
    fn definition(&self) -> Result<LimitDefinition, String> {
        // The server refuses it too; refused here before anything is sent.
        crate::admin::refuse_budget_key(&self.key)?;
        LimitDefinition::new(DefinitionFields {
            key: self.key.clone(),
            kind: match self.kind {
                KindArg::Rolling => LimitKind::Rolling,
                KindArg::Concurrency => LimitKind::Concurrency,
                KindArg::Bucket => LimitKind::Bucket,
            },
            capacity: self.capacity,
            window_seconds: self.window_seconds,
            window_margin_ms: self.window_margin_ms,
            timeout_seconds: self.timeout_seconds,
            unit: self.unit.clone(),
            description: self.description.clone(),
            overage: match self.overage {
                OverageArg::None => Overage::None,
                OverageArg::Debt => Overage::Debt,
                OverageArg::Owe => Overage::Owe,
            },
            period: None,
        })
        .map_err(|e| e.to_string())
    }
}

/// Loads `--config`, or the defaults without it.
pub fn load_config(path: Option<&PathBuf>) -> Result<Config, String> {
    match path {
        Some(path) => Config::load(path).map_err(|e| e.to_string()),
        None => Ok(Config::defaults()),
    }
}

/// `check-config`: the configuration at `path` loaded and validated, and the
/// gateway's keys read from the environment as `serve` reads them, so that a
/// configuration it passes does not fail at start for an unset key variable.
pub fn check_config(path: Option<&PathBuf>) -> Result<(), String> {
    let config = load_config(path)?;
    if let Some(gateway) = &config.gateway {
        gateway::Gateway::check_keys(gateway)?;
    }
    Ok(())
}

/// Runs a client subcommand and prints its JSON answer on standard output.
pub async fn run_client(command: Command, remote: &Remote) -> Result<ExitCode, String> {
    let print = |value: serde_json::Value| println!("{}", serde_json::to_string_pretty(&value).expect("json"));
    match command {
        Command::Limits { command } => {
            let client = remote.client()?;
            match command {
                LimitsCommand::Put(args) => print(json(&client.put_limit(&args.definition()?).await.map_err(err)?)),
                LimitsCommand::List => print(json(&client.limits().await.map_err(err)?)),
                LimitsCommand::Get { key } => match client.limit(&key).await.map_err(err)? {
                    Some(report) => print(json(&report)),
                    None => return Err(format!("unknown_limit_key: {key}")),
                },
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Tenants { command } => {
            let request = crate::cli_directory::tenants_request(&command)?;
            crate::cli_directory::run(&remote.client()?, request).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Keys { command } => {
            let request = crate::cli_directory::keys_request(&command)?;
            crate::cli_directory::run(&remote.client()?, request).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Spend(args) => {
            crate::cli_spend::run(&remote.client()?, &args).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Reserve {
            requirements,
            lease_id,
            job_id,
        } => {
            let lease_id = lease_id.unwrap_or_else(LeaseId::generate);
            let request = ReserveRequest::new(lease_id, job_id, requirements).map_err(|e| e.to_string())?;
            let outcome = remote.client()?.reserve(&request).await.map_err(err)?;
            let mut answer = json(&ReserveResponse::from(&outcome));
            answer["lease_id"] = lease_id.to_string().into();
            print(answer);
            Ok(match outcome {
                ReserveOutcome::Allowed { .. } => ExitCode::SUCCESS,
                ReserveOutcome::Denied(_) => ExitCode::from(EXIT_DENIED),
            })
        }
        Command::Complete { lease_id, actuals } => {
            let request = CompleteRequest::new(lease_id, None, actuals).map_err(|e| e.to_string())?;
            remote.client()?.complete(&request).await.map_err(err)?;
            print(serde_json::json!({"ok": true}));
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve | Command::CheckConfig => unreachable!("server commands are not client commands"),
    }
}

fn err(e: ratelimiter::LimiterError) -> String {
    e.to_string()
}

fn json<T: serde::Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).expect("answers serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("ratelimiterd").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn remote_options_go_before_or_after_the_subcommand() {
        let url = "http://127.0.0.1:9999";
        let token = "operator-token-0123456789";
        for args in [
            &["--url", url, "--token", token, "limits", "list"][..],
            &["limits", "--url", url, "--token", token, "list"],
            &["limits", "list", "--url", url, "--token", token],
            &["--url", url, "limits", "list", "--token", token],
        ] {
            let cli = parse(args);
            assert_eq!(cli.remote.urls, [url], "{args:?}");
            assert_eq!(cli.remote.token.as_deref(), Some(token), "{args:?}");
            assert!(matches!(
                cli.command,
                Some(Command::Limits {
                    command: LimitsCommand::List
                })
            ));
        }
        let fleet = ["http://127.0.0.1:8080", "http://127.0.0.1:8081"];
        for args in [
            &["--url", "http://127.0.0.1:8080,http://127.0.0.1:8081", "limits", "list"][..],
            &["limits", "list", "--url", fleet[0], "--url", fleet[1]],
        ] {
            assert_eq!(parse(args).remote.urls, fleet, "a fleet's servers in order: {args:?}");
        }
        let cli = parse(&["--timeout-ms", "7", "reserve", "-r", "k=1"]);
        assert_eq!(cli.remote.timeout_ms, 7);
        let cli = parse(&[
            "complete",
            "--lease-id",
            "01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "--timeout-ms",
            "9",
        ]);
        assert_eq!(cli.remote.timeout_ms, 9);
        let cli = parse(&["check-config", "--config", "/etc/rl.yaml"]);
        assert_eq!(cli.config.as_deref(), Some(std::path::Path::new("/etc/rl.yaml")));
    }

    fn put_definition(args: &[&str]) -> Result<LimitDefinition, String> {
        put_definition_of("global:llm:anthropic:m:otpm", args)
    }

    /// What `limits put --key KEY ARGS` would define.
    fn put_definition_of(key: &str, args: &[&str]) -> Result<LimitDefinition, String> {
        let base = ["limits", "put", "--key", key];
        let cli = parse(&[&base[..], args].concat());
        match cli.command {
            Some(Command::Limits {
                command: LimitsCommand::Put(put),
            }) => put.definition(),
            other => panic!("not a put: {other:?}"),
        }
    }

    #[test]
    fn limits_put_defines_a_bucket_and_refuses_one_without_burst() {
        let bucket = put_definition(&["--kind", "bucket", "--capacity", "80000", "--window-seconds", "60"]).unwrap();
        assert_eq!(bucket.kind(), LimitKind::Bucket);
        assert_eq!((bucket.capacity(), bucket.window_seconds()), (80_000, 60));
        // Capacity 1 refilled over 1 s keeps no burst: refused before any request is sent.
        let refused = put_definition(&["--kind", "bucket", "--capacity", "1", "--window-seconds", "1"]).unwrap_err();
        assert!(refused.contains("keeps no burst"), "{refused}");
    }

    #[test]
    fn limits_put_refuses_a_budget_in_money_pointing_at_the_budget_commands() {
        let rolling_args = ["--kind", "rolling", "--capacity", "5", "--window-seconds", "60"];
        for key in [
            "tenant:search:usd:day",
            "key:01KB2M9Y3R4VQ8H6ZJ1N5T7C0D:usd:window3600",
            "global:usd:month",
        ] {
            let refused = put_definition_of(key, &rolling_args).unwrap_err();
            assert!(
                refused.contains("--budget USD/PERIOD") && refused.contains(key),
                "{refused}"
            );
        }
        // A key merely containing the letters is not a budget.
        let rolling = put_definition(&rolling_args);
        assert!(rolling.is_ok(), "{rolling:?}");
        // The server's predicate, the gateway's: the rate of a tenant named
        // `usd` is no budget, and the CLI does not refuse it either.
        assert!(put_definition_of("tenant:usd:llm:rpm", &rolling_args).is_ok());
    }
}
