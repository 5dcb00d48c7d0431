//! The `replay` command line.

use std::path::PathBuf;

use clap::Parser;
use ratelimiter::profile::ProfileRules;

use crate::sim::limits::{Accounting, ProviderLimits};
use crate::sim::profile::{ProfileName, SimProfile};
use crate::strategy::scheduled::{PromptSizing, ScheduledOptions};
use crate::strategy::server_multi::Worker;
use crate::strategy::StrategyKind;
use crate::trace::TraceFormat;

/// Replays an LLM request trace against a simulated provider through a strategy.
#[derive(Debug, Clone, Parser)]
#[command(name = "replay", version)]
pub struct Args {
    /// The trace file (required unless `--from-record`).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// The trace's format.
    #[arg(long, value_enum, default_value = "azure")]
    pub format: TraceFormat,
    /// How requests reach the provider.
    #[arg(long, value_enum, default_value = "local")]
    pub strategy: StrategyKind,
    /// Trace time is divided by this (compresses arrivals so the trace saturates the provider).
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Replay only the first N requests.
    #[arg(long)]
    pub requests: Option<usize>,
    /// The `max_tokens` bound each request sends.
    #[arg(long, default_value_t = 1024)]
    pub max_output_tokens: u64,
    /// The provider's requests per window.
    #[arg(long, default_value_t = 3_000)]
    pub provider_rpm: u64,
    /// The provider's tokens per window.
    #[arg(long, default_value_t = 1_000_000)]
    pub provider_tpm: u64,
    /// The provider's rolling window, in seconds.
    #[arg(long, default_value_t = 60)]
    pub provider_window_seconds: u64,
    /// The provider's calls in flight.
    #[arg(long, default_value_t = 64)]
    pub provider_concurrency: u64,
    /// The provider's time per output token, in ms.
    #[arg(long, default_value_t = 5)]
    pub provider_ms_per_output_token: u64,
    /// How the provider charges tokens.
    #[arg(long, value_enum, default_value = "actual")]
    pub provider_accounting: Accounting,
    /// How the provider enforces its limits: a sliding log per limit (`sliding`), or as
    /// a provider documents it (docs/provider-profiles.md).
    #[arg(long, value_enum, default_value = "sliding")]
    pub provider_profile: ProfileName,
    /// `openai`, `azure`: the period per-minute limits are quantized to, in ms
    /// (default: 1000 for OpenAI, 10000 for Azure).
    #[arg(long)]
    pub provider_quantum_ms: Option<u64>,
    /// `anthropic`: output tokens per minute (default: a fifth of `--provider-tpm`).
    #[arg(long)]
    pub provider_output_tpm: Option<u64>,
    /// `gemini`: requests per day (default: a day of `--provider-rpm`).
    #[arg(long)]
    pub provider_rpd: Option<u64>,
    /// Writes the run's summary here as JSON.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
    /// Draws admitted tokens per window against the provider's limit into this PNG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Saves the run's raw record here (admissions and outcomes), for `--from-record`.
    #[arg(long)]
    pub record_json: Option<PathBuf>,
    /// Replays nothing: makes the summary and plot again from a saved record.
    #[arg(long, conflicts_with = "trace")]
    pub from_record: Option<PathBuf>,
    /// Writes every request's outcome here as JSON lines.
    #[arg(long)]
    pub outcomes_jsonl: Option<PathBuf>,
    /// Our strategies: how the reservation counts the prompt's tokens.
    #[arg(long, value_enum, default_value = "counted")]
    pub prompt_estimate: PromptEstimate,
    /// Our strategies: the limits' `window_margin_ms`, how long each rolling reservation is
    /// held beyond the provider's window (0..=60000). The provider starts a request's window
    /// when the call reaches it, a moment after the grant; see `definitions.rs`. Default: the
    /// definitions give none, so the backend's default applies (the library's
    /// WINDOW_MARGIN_MS_DEFAULT in process, `defaults.window_margin_ms` in ratelimiterd).
    #[arg(long)]
    pub limiter_window_margin_ms: Option<u64>,
    /// Our strategies: take the limits and the reservation rules from the library's profile of
    /// `--provider-profile` (`ratelimiter::profile::llm_profile`) fed the provider's published
    /// numbers (`--provider-rpm`, `--provider-tpm`, and the profile's own), instead of one rolling
    /// limit per provider limit over its window.
    #[arg(long)]
    pub limiter_profile: bool,
    /// With `--limiter-profile`: `profile` keeps the profile's definitions as the library
    /// makes them; `rolling` turns each of its `bucket` limits (Anthropic's) into a rolling
    /// limit of the same capacity, window and margin, the same run's reference for what
    /// the bucket kind changes (BENCHMARKS.md, "Provider profiles").
    #[arg(long, value_enum, default_value = "profile")]
    pub profile_windows: ProfileWindows,
    /// Scheduler workers per client process (our strategies); default: the provider's concurrency.
    #[arg(long)]
    pub workers: Option<usize>,
    /// `server` and `server-multi`: the `ratelimiterd` to use; without it the replay starts one.
    #[arg(long)]
    pub server_url: Option<String>,
    /// The `ratelimiterd` binary to start; default: beside this binary, else on PATH.
    #[arg(long)]
    pub ratelimiterd: Option<PathBuf>,
    /// `server` and `server-multi` without `--server-url`: the started `ratelimiterd` keeps its
    /// limits in the TigerBeetle cluster at these comma-separated addresses instead of in
    /// memory (the binary must be built with the `tigerbeetle` feature).
    #[arg(long, conflicts_with = "server_url")]
    pub tigerbeetle_addresses: Option<String>,
    /// `server-multi`: client processes sharing the server.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Hides the progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Internal (`server-multi` children): the provider to call.
    #[arg(long, hide = true)]
    pub worker_provider_url: Option<String>,
    /// Internal (`server-multi` children): the shared start time, Unix ms.
    #[arg(long, hide = true)]
    pub worker_start_unix_ms: Option<u64>,
    /// Internal (`server-multi` children): this child's shard, `i/n`.
    #[arg(long, hide = true)]
    pub worker_shard: Option<String>,
}

/// Which limit kinds the profile's definitions keep (`--profile-windows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProfileWindows {
    /// The kinds the library's profile defines.
    Profile,
    /// Every bucket limit as a rolling limit of the same capacity and window.
    Rolling,
}

/// How our strategies size a prompt's reservation (`--prompt-estimate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PromptEstimate {
    /// The byte estimate of docs/client-library.md, "The LLM helper": one token per byte
    /// (`JobSpec::prompt_tokens` unset).
    Bytes,
    /// The provider's own count, as a client with its tokenizer has it
    /// (`JobSpec::prompt_tokens` set).
    Counted,
}

/// The largest window the provider accepts: one day.
pub const PROVIDER_WINDOW_SECONDS_MAX: u64 = 86_400;
/// The most client processes `server-multi` starts.
pub const CLIENTS_MAX: usize = 64;
/// The most scheduler workers per process.
pub const WORKERS_MAX: usize = 4_096;

impl Args {
    /// The provider's limits, checked.
    pub fn provider_limits(&self) -> Result<ProviderLimits, String> {
        for (name, value) in [
            ("--provider-rpm", self.provider_rpm),
            ("--provider-tpm", self.provider_tpm),
            ("--provider-concurrency", self.provider_concurrency),
            ("--max-output-tokens", self.max_output_tokens),
        ] {
            if value == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        if !(1..=PROVIDER_WINDOW_SECONDS_MAX).contains(&self.provider_window_seconds) {
            return Err(format!(
                "--provider-window-seconds must be 1..={PROVIDER_WINDOW_SECONDS_MAX}"
            ));
        }
        if self.max_output_tokens > crate::sim::wire::MAX_TOKENS_MAX {
            return Err(format!(
                "--max-output-tokens must be at most {}",
                crate::sim::wire::MAX_TOKENS_MAX
            ));
        }
        if !(self.speedup > 0.0 && self.speedup <= crate::replayer::SPEEDUP_MAX) {
            return Err(format!("--speedup must be in (0, {}]", crate::replayer::SPEEDUP_MAX));
        }
        if !(1..=CLIENTS_MAX).contains(&self.clients) {
            return Err(format!("--clients must be 1..={CLIENTS_MAX}"));
        }
        if self.workers.is_some_and(|w| !(1..=WORKERS_MAX).contains(&w)) {
            return Err(format!("--workers must be 1..={WORKERS_MAX}"));
        }
        if self.profile_windows == ProfileWindows::Rolling && !self.limiter_profile {
            return Err("--profile-windows rolling: only with --limiter-profile".to_owned());
        }
        if self.requests == Some(0) {
            return Err("--requests must be at least 1".to_owned());
        }
        Ok(ProviderLimits {
            rpm: self.provider_rpm,
            tpm: self.provider_tpm,
            window_ms: self.provider_window_seconds * 1000,
            concurrency: self.provider_concurrency,
            ms_per_output_token: self.provider_ms_per_output_token,
            accounting: self.provider_accounting,
        })
    }

    /// The provider's profile, checked.
    pub fn sim_profile(&self, limits: &ProviderLimits) -> Result<SimProfile, String> {
        let defaults = SimProfile::with_defaults(self.provider_profile, limits);
        let profile = SimProfile {
            quantum_ms: self.provider_quantum_ms.unwrap_or(defaults.quantum_ms),
            output_tpm: self.provider_output_tpm.unwrap_or(defaults.output_tpm),
            requests_per_day: self.provider_rpd.unwrap_or(defaults.requests_per_day),
            ..defaults
        };
        if !(1..=crate::sim::profile::MINUTE_MS).contains(&profile.quantum_ms) {
            return Err(format!(
                "--provider-quantum-ms must be 1..={}",
                crate::sim::profile::MINUTE_MS
            ));
        }
        if profile.output_tpm == 0 || profile.requests_per_day == 0 {
            return Err("--provider-output-tpm and --provider-rpd must be at least 1".to_owned());
        }
        Ok(profile)
    }

    /// Scheduler workers per process.
    pub fn workers(&self) -> usize {
        self.workers.unwrap_or_else(|| {
            usize::try_from(self.provider_concurrency)
                .unwrap_or(WORKERS_MAX)
                .min(WORKERS_MAX)
        })
    }

    /// The options of our scheduler strategy for a trace of `jobs` requests,
    /// reserving by a profile's `rules` when given.
    pub fn scheduled_options(&self, jobs: usize, rules: Option<ProfileRules>) -> ScheduledOptions {
        ScheduledOptions {
            workers: self.workers(),
            jobs,
            prompt_sizing: match self.prompt_estimate {
                PromptEstimate::Bytes => PromptSizing::Bytes,
                PromptEstimate::Counted => PromptSizing::Counted,
            },
            rules,
        }
    }

    /// The flags a `server-multi` child repeats from this command line: the
    /// trace, the speed-up, the provider's limits, the workers and the prompt sizing.
    pub fn child_flags(&self) -> Vec<String> {
        let trace = self.trace.as_deref().expect("a replay has a trace");
        let mut flags: Vec<String> = vec![
            "--trace".into(),
            trace.display().to_string(),
            "--format".into(),
            value_name(self.format),
        ];
        let numbers = [
            ("--speedup", self.speedup.to_string()),
            ("--max-output-tokens", self.max_output_tokens.to_string()),
            ("--provider-rpm", self.provider_rpm.to_string()),
            ("--provider-tpm", self.provider_tpm.to_string()),
            ("--provider-window-seconds", self.provider_window_seconds.to_string()),
            ("--provider-concurrency", self.provider_concurrency.to_string()),
            (
                "--provider-ms-per-output-token",
                self.provider_ms_per_output_token.to_string(),
            ),
            ("--provider-accounting", value_name(self.provider_accounting)),
            ("--workers", self.workers().to_string()),
            ("--prompt-estimate", value_name(self.prompt_estimate)),
        ];
        for (flag, value) in numbers {
            flags.push(flag.into());
            flags.push(value);
        }
        if let Some(n) = self.requests {
            flags.extend(["--requests".into(), n.to_string()]);
        }
        flags
    }

    /// A `server-multi` child's settings: provider URL, server URL, start time and shard.
    pub fn worker(&self) -> Result<Worker, String> {
        let missing = |flag: &str| format!("a server-multi child needs {flag}");
        let provider_url = (self.worker_provider_url.clone()).ok_or_else(|| missing("--worker-provider-url"))?;
        let server_url = self.server_url.clone().ok_or_else(|| missing("--server-url"))?;
        let start_unix_ms = (self.worker_start_unix_ms).ok_or_else(|| missing("--worker-start-unix-ms"))?;
        let shard = self.worker_shard.as_deref().ok_or_else(|| missing("--worker-shard"))?;
        Ok(Worker {
            provider_url,
            server_url,
            start_unix_ms,
            shard: parse_shard(shard)?,
        })
    }
}

/// A shard written `i/n`, checked (`i < n`).
fn parse_shard(shard: &str) -> Result<(usize, usize), String> {
    let bad = || format!("--worker-shard {shard:?} is not i/n with i < n");
    let (i, n) = shard.split_once('/').ok_or_else(bad)?;
    let (i, n): (usize, usize) = (i.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?);
    if i >= n {
        return Err(bad());
    }
    Ok((i, n))
}

/// The name a value is written with on the command line.
fn value_name(value: impl clap::ValueEnum) -> String {
    value
        .to_possible_value()
        .expect("no skipped values")
        .get_name()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::server_multi::ChildRun;

    #[test]
    fn children_get_their_shard_and_the_parents_limits() {
        let args = Args::parse_from([
            "replay",
            "--trace",
            "t.csv",
            "--strategy",
            "server-multi",
            "--provider-tpm",
            "777",
            "--requests",
            "9",
            "--provider-accounting",
            "openai",
            "--prompt-estimate",
            "bytes",
        ]);
        let parent_flags = args.child_flags();
        let run = ChildRun {
            parent_flags: &parent_flags,
            clients: args.clients,
            server_url: "http://s",
            provider_url: "http://p",
            start_unix_ms: 42,
        };
        let child = Args::parse_from(std::iter::once("replay".to_owned()).chain(run.child_args(
            1,
            3,
            std::path::Path::new("/o.jsonl"),
        )));
        assert_eq!(child.provider_limits().unwrap(), args.provider_limits().unwrap());
        assert_eq!(child.requests, Some(9));
        assert_eq!(child.workers(), args.workers());
        assert_eq!(child.prompt_estimate, args.prompt_estimate);
        let worker = child.worker().unwrap();
        assert_eq!(
            (
                worker.provider_url.as_str(),
                worker.server_url.as_str(),
                worker.start_unix_ms,
                worker.shard
            ),
            ("http://p", "http://s", 42, (1, 3))
        );
        let bad = Args::parse_from(["replay", "--trace", "t", "--worker-shard", "3/3"]);
        assert!(bad.worker().is_err());
    }
}
