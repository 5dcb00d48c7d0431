//! `provider-sim`: the simulated LLM provider on its own, for manual runs and for
//! trying clients against it.

use std::collections::BTreeMap;
use std::sync::Arc;

use clap::Parser;
use ratelimiter::SystemClock;
use replay::sim::billing::Billing;
use replay::sim::control::{SimControl, MODELS_DEFAULT, MODELS_MAX};
use replay::sim::limits::{Accounting, ProviderLimits};
use replay::sim::price::Price;
use replay::sim::profile::{ProfileName, SimProfile};
use replay::sim::server::ProviderServer;
use replay::sim::sigv4::AwsKeys;
use replay::sim::vertex_auth::VertexAuth;

/// Serves OpenAI's and Anthropic's endpoints (chat completions, embeddings,
/// responses, models; messages, count_tokens), Azure's and Vertex AI's paths
/// over them, streaming included, enforcing RPM,
/// TPM and concurrency limits over a rolling window; and `GET /sim/stats`,
/// `POST /sim/faults`, `GET /sim/billing` (docs/provider-sim.md).
#[derive(Debug, Parser)]
#[command(name = "provider-sim", version)]
struct Args {
    /// The address to listen on (loopback by default).
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: String,
    /// Requests per window.
    #[arg(long, default_value_t = 3_000)]
    rpm: u64,
    /// Tokens per window.
    #[arg(long, default_value_t = 1_000_000)]
    tpm: u64,
    /// The rolling window, in seconds.
    #[arg(long, default_value_t = 60)]
    window_seconds: u64,
    /// Calls in flight.
    #[arg(long, default_value_t = 64)]
    concurrency: u64,
    /// Time per output token, in ms.
    #[arg(long, default_value_t = 5)]
    ms_per_output_token: u64,
    /// How tokens are charged.
    #[arg(long, value_enum, default_value = "actual")]
    accounting: Accounting,
    /// The models served, comma-separated; others get a 404 (default: sim-model,
    /// gpt-4o-mini, gpt-4o, text-embedding-3-small, claude-haiku-4-5, claude-sonnet-4-5).
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// The environment variable holding the key callers must send (`Authorization:
    /// Bearer` or `x-api-key`); no key is required without it.
    #[arg(long)]
    api_key_env: Option<String>,
    /// Bedrock's routes check every request's AWS Signature Version 4 against
    /// the keys in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and require
    /// AWS_SESSION_TOKEN when set); without it, they take the `--api-key-env`
    /// key as a Bedrock API key, or anything.
    #[arg(long)]
    aws_sigv4: bool,
    /// Serves STS's AssumeRoleWithWebIdentity at `POST /` (point
    /// AWS_ENDPOINT_URL_STS here), its credentials lasting this long and
    /// accepted by Bedrock's routes until they expire.
    #[arg(long)]
    sts_lifetime_ms: Option<u64>,
    /// How the limits are enforced: a sliding log, or as a provider documents it
    /// (docs/provider-profiles.md).
    #[arg(long, value_enum, default_value = "sliding")]
    profile: ProfileName,
    /// `openai`, `azure`: the period per-minute limits are quantized to, in ms.
    #[arg(long)]
    quantum_ms: Option<u64>,
    /// `anthropic`: output tokens per minute.
    #[arg(long)]
    output_tpm: Option<u64>,
    /// `gemini`: requests per day.
    #[arg(long)]
    rpd: Option<u64>,
    /// A model's price, for the bill of `GET /sim/billing`, in USD per million
    /// tokens: `MODEL=input:2.50,output:10,cache_read:1.25,cache_write:3.75`
    /// (repeatable; the cache prices default to the input price).
    #[arg(long = "price")]
    prices: Vec<String>,
    /// A call without `sim_output_tokens` writes a number of tokens drawn uniformly
    /// in 1..=its output bound (`random`), or its whole bound (`bound`).
    #[arg(long, value_enum, default_value = "bound")]
    output_tokens: OutputTokens,
    /// The seed of the `random` output draw.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Vertex AI: the service account's key file (JSON) whose signed
    /// assertions `POST /token` exchanges for access tokens; without it the
    /// Vertex AI paths refuse every call.
    #[arg(long)]
    vertex_service_account: Option<std::path::PathBuf>,
    /// Vertex AI: how long an access token lasts, in seconds.
    #[arg(long, default_value_t = replay::sim::vertex_auth::TOKEN_LIFETIME_S_DEFAULT)]
    vertex_token_lifetime_seconds: u64,
}

/// The Vertex AI token endpoint of `--vertex-service-account`, or the error to exit with.
fn vertex_auth(args: &Args) -> Result<Option<VertexAuth>, String> {
    let Some(path) = &args.vertex_service_account else {
        return Ok(None);
    };
    let context = |e: String| format!("--vertex-service-account {}: {e}", path.display());
    let file = std::fs::read(path).map_err(|e| context(e.to_string()))?;
    VertexAuth::from_key_file(&file, args.vertex_token_lifetime_seconds)
        .map(Some)
        .map_err(context)
}

/// How many tokens a call without `sim_output_tokens` writes.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum OutputTokens {
    /// Its output bound.
    Bound,
    /// A uniform draw in 1..=its output bound.
    Random,
}

/// `MODEL=PRICES` for each `--price`, or the first bad one's error.
fn parse_prices(prices: &[String]) -> Result<BTreeMap<String, Price>, String> {
    let mut parsed = BTreeMap::new();
    for entry in prices {
        let (model, price) = entry
            .split_once('=')
            .ok_or_else(|| format!("--price {entry}: expected MODEL=input:USD,output:USD,..."))?;
        let price = Price::parse(price).map_err(|e| format!("--price {model}: {e}"))?;
        if parsed.insert(model.to_owned(), price).is_some() {
            return Err(format!("--price {model}: given twice"));
        }
    }
    Ok(parsed)
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if args.rpm == 0 || args.tpm == 0 || args.concurrency == 0 || !(1..=86_400).contains(&args.window_seconds) {
        eprintln!("provider-sim: --rpm, --tpm, --concurrency must be at least 1 and --window-seconds 1..=86400");
        std::process::exit(2);
    }
    let vertex = vertex_auth(&args).unwrap_or_else(|e| {
        eprintln!("provider-sim: {e}");
        std::process::exit(2);
    });
    let limits = ProviderLimits {
        rpm: args.rpm,
        tpm: args.tpm,
        window_ms: args.window_seconds * 1000,
        concurrency: args.concurrency,
        ms_per_output_token: args.ms_per_output_token,
        accounting: args.accounting,
    };
    let listener = match tokio::net::TcpListener::bind(&args.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("provider-sim: cannot listen on {}: {e}", args.listen);
            std::process::exit(1);
        }
    };
    // The bound address, so a caller passing port 0 learns the port.
    let bound = listener.local_addr().map_or(args.listen.clone(), |a| a.to_string());
    eprintln!("provider-sim: serving on http://{bound}");
    let models = if args.models.is_empty() {
        MODELS_DEFAULT.iter().map(|m| (*m).to_owned()).collect()
    } else {
        args.models
    };
    if models.len() > MODELS_MAX || models.iter().any(String::is_empty) {
        eprintln!("provider-sim: --models takes 1..={MODELS_MAX} non-empty names");
        std::process::exit(2);
    }
    let api_key = match args.api_key_env.map(|name| std::env::var(&name).map_err(|_| name)) {
        None => None,
        Some(Ok(key)) => Some(key),
        Some(Err(name)) => {
            eprintln!("provider-sim: --api-key-env names {name}, which is not set");
            std::process::exit(2);
        }
    };
    let prices = parse_prices(&args.prices).unwrap_or_else(|e| {
        eprintln!("provider-sim: {e}");
        std::process::exit(2);
    });
    let mut control = SimControl::new(models, api_key).with_billing(Billing::new(prices));
    if let OutputTokens::Random = args.output_tokens {
        control = control.with_random_output(args.seed);
    }
    if let Some(lifetime_ms) = args.sts_lifetime_ms {
        if lifetime_ms == 0 {
            eprintln!("provider-sim: --sts-lifetime-ms must be at least 1");
            std::process::exit(2);
        }
        control = control.with_sts(std::time::Duration::from_millis(lifetime_ms));
    }
    if args.aws_sigv4 {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let (Some(access_key_id), Some(secret_access_key)) = (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY"))
        else {
            eprintln!("provider-sim: --aws-sigv4 needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY");
            std::process::exit(2);
        };
        control = control.with_aws_keys(AwsKeys {
            access_key_id,
            secret_access_key,
            session_token: var("AWS_SESSION_TOKEN"),
        });
    }
    let defaults = SimProfile::with_defaults(args.profile, &limits);
    let profile = SimProfile {
        quantum_ms: args.quantum_ms.unwrap_or(defaults.quantum_ms),
        output_tpm: args.output_tpm.unwrap_or(defaults.output_tpm),
        requests_per_day: args.rpd.unwrap_or(defaults.requests_per_day),
        ..defaults
    };
    if !(1..=60_000).contains(&profile.quantum_ms) || profile.output_tpm == 0 || profile.requests_per_day == 0 {
        eprintln!("provider-sim: --quantum-ms must be 1..=60000, --output-tpm and --rpd at least 1");
        std::process::exit(2);
    }
    let provider = ProviderServer::with_control(limits, Arc::new(SystemClock::new()), control);
    provider.set_profile(profile);
    if let Some(vertex) = vertex {
        provider.set_vertex_auth(vertex);
    }
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    if let Err(e) = provider.serve(listener, shutdown).await {
        eprintln!("provider-sim: {e}");
        std::process::exit(1);
    }
}
