//! `server-multi`: several client processes, each running our scheduler against
//! one shared `ratelimiterd`, together replaying the trace (request `i` goes to
//! client `i mod n`). The parent runs the provider, starts the children with a
//! shared start time, and gathers their outcomes.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use indicatif::ProgressBar;
use tokio::process::Command;

use crate::cli::Args;
use crate::outcome::RequestOutcome;
use crate::provider_server::ProviderServer;

/// How often the parent's progress bar reads the provider's count, in ms.
pub const PROGRESS_POLL_MS: u64 = 200;

/// What the children of one run share.
#[derive(Debug, Clone, Copy)]
pub struct ChildRun<'a> {
    /// The parent's arguments (trace, speed-up, limits).
    pub args: &'a Args,
    /// The shared `ratelimiterd`.
    pub server_url: &'a str,
    /// The parent's provider.
    pub provider_url: &'a str,
    /// When the first request arrives, Unix ms.
    pub start_unix_ms: u64,
}

impl ChildRun<'_> {
    /// The command line of child `shard` of `shards`, writing to `outcomes`.
    pub fn child_args(&self, shard: usize, shards: usize, outcomes: &std::path::Path) -> Vec<String> {
        let a = self.args;
        let mut args: Vec<String> = vec![
            "--trace".into(),
            a.trace.as_deref().expect("a replay has a trace").display().to_string(),
            "--format".into(),
            value_name(a.format),
            "--strategy".into(),
            "server".into(),
            "--server-url".into(),
            self.server_url.into(),
            "--worker-provider-url".into(),
            self.provider_url.into(),
            "--worker-start-unix-ms".into(),
            self.start_unix_ms.to_string(),
            "--worker-shard".into(),
            format!("{shard}/{shards}"),
            "--outcomes-jsonl".into(),
            outcomes.display().to_string(),
            "--quiet".into(),
        ];
        let numbers = [
            ("--speedup", a.speedup.to_string()),
            ("--max-output-tokens", a.max_output_tokens.to_string()),
            ("--provider-rpm", a.provider_rpm.to_string()),
            ("--provider-tpm", a.provider_tpm.to_string()),
            ("--provider-window-seconds", a.provider_window_seconds.to_string()),
            ("--provider-concurrency", a.provider_concurrency.to_string()),
            (
                "--provider-ms-per-output-token",
                a.provider_ms_per_output_token.to_string(),
            ),
            ("--provider-accounting", value_name(a.provider_accounting)),
            ("--workers", a.workers().to_string()),
            ("--prompt-estimate", value_name(a.prompt_estimate)),
        ];
        for (flag, value) in numbers {
            args.push(flag.into());
            args.push(value);
        }
        if let Some(n) = a.requests {
            args.extend(["--requests".into(), n.to_string()]);
        }
        args
    }
}

fn value_name(value: impl clap::ValueEnum) -> String {
    value
        .to_possible_value()
        .expect("no skipped values")
        .get_name()
        .to_owned()
}

/// A child's settings: provider URL, server URL, start time and shard.
pub fn worker_settings(args: &Args) -> Result<(String, String, u64, (usize, usize)), String> {
    let missing = |flag: &str| format!("a server-multi child needs {flag}");
    let provider = args
        .worker_provider_url
        .clone()
        .ok_or_else(|| missing("--worker-provider-url"))?;
    let server = args.server_url.clone().ok_or_else(|| missing("--server-url"))?;
    let start = args
        .worker_start_unix_ms
        .ok_or_else(|| missing("--worker-start-unix-ms"))?;
    let shard = args.worker_shard.as_deref().ok_or_else(|| missing("--worker-shard"))?;
    let bad = || format!("--worker-shard {shard:?} is not i/n with i < n");
    let (i, n) = shard.split_once('/').ok_or_else(bad)?;
    let (i, n): (usize, usize) = (i.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?);
    if i >= n {
        return Err(bad());
    }
    Ok((provider, server, start, (i, n)))
}

/// Runs `args.clients` children and returns every outcome in trace order.
pub async fn run(
    run: &ChildRun<'_>,
    provider: &Arc<ProviderServer>,
    progress: ProgressBar,
) -> Result<Vec<RequestOutcome>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the replay binary: {e}"))?;
    let shards = run.args.clients;
    let dir = std::env::temp_dir().join(format!("replay-multi-{}-{}", std::process::id(), run.start_unix_ms));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let files: Vec<PathBuf> = (0..shards).map(|i| dir.join(format!("outcomes-{i}.jsonl"))).collect();
    let mut children = Vec::with_capacity(shards);
    for (shard, file) in files.iter().enumerate() {
        let child = Command::new(&exe)
            .args(run.child_args(shard, shards, file))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start client {shard}: {e}"))?;
        children.push(child);
    }
    let ticker = {
        let (provider, progress) = (Arc::clone(provider), progress.clone());
        tokio::spawn(async move {
            loop {
                progress.set_position(provider.counts().admitted);
                tokio::time::sleep(Duration::from_millis(PROGRESS_POLL_MS)).await;
            }
        })
    };
    let mut failures = Vec::new();
    for (shard, mut child) in children.into_iter().enumerate() {
        match child.wait().await {
            Ok(status) if status.success() => {}
            Ok(status) => failures.push(format!("client {shard} exited with {status}")),
            Err(e) => failures.push(format!("client {shard}: {e}")),
        }
    }
    ticker.abort();
    progress.finish_and_clear();
    let outcomes = if failures.is_empty() {
        read_outcomes(&files)
    } else {
        Err(failures.join("; "))
    };
    let _ = std::fs::remove_dir_all(&dir);
    outcomes
}

fn read_outcomes(files: &[PathBuf]) -> Result<Vec<RequestOutcome>, String> {
    let mut outcomes = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        for (n, line) in text.lines().enumerate() {
            let outcome = serde_json::from_str(line).map_err(|e| format!("{}:{}: {e}", file.display(), n + 1))?;
            outcomes.push(outcome);
        }
    }
    outcomes.sort_by_key(|o: &RequestOutcome| o.index);
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

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
        let run = ChildRun {
            args: &args,
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
        let (provider, server, start, shard) = worker_settings(&child).unwrap();
        assert_eq!(
            (provider.as_str(), server.as_str(), start, shard),
            ("http://p", "http://s", 42, (1, 3))
        );
        let bad = Args::parse_from(["replay", "--trace", "t", "--worker-shard", "3/3"]);
        assert!(worker_settings(&bad).is_err());
    }
}
