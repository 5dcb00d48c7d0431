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

use crate::outcome::RequestOutcome;
use crate::sim::server::ProviderServer;

/// How often the parent's progress bar reads the provider's count, in ms.
pub const PROGRESS_POLL_MS: u64 = 200;

/// What the children of one run share.
#[derive(Debug, Clone, Copy)]
pub struct ChildRun<'a> {
    /// The flags every child repeats from the parent's command line (trace,
    /// speed-up, limits, workers, prompt sizing), as the command line writes them.
    pub parent_flags: &'a [String],
    /// How many children: the trace is split into this many shards.
    pub clients: usize,
    /// The shared `ratelimiterd`.
    pub server_url: &'a str,
    /// The parent's provider.
    pub provider_url: &'a str,
    /// When the first request arrives, Unix ms.
    pub start_unix_ms: u64,
}

impl ChildRun<'_> {
    /// The command line of child `shard` of `shards`, writing to `outcomes`: the
    /// parent's flags, then the child's own ([`Worker`]).
    pub fn child_args(&self, shard: usize, shards: usize, outcomes: &std::path::Path) -> Vec<String> {
        let mut args = self.parent_flags.to_vec();
        args.extend([
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
        ]);
        args
    }
}

/// What one child is told by its command line ([`ChildRun::child_args`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worker {
    /// The parent's provider, to call.
    pub provider_url: String,
    /// The shared `ratelimiterd`.
    pub server_url: String,
    /// The shared start time, Unix ms.
    pub start_unix_ms: u64,
    /// This child's shard: `(i, n)` with `i < n`.
    pub shard: (usize, usize),
}

/// Runs `run.clients` children and returns every outcome in trace order.
pub async fn run(
    run: &ChildRun<'_>,
    provider: &Arc<ProviderServer>,
    progress: ProgressBar,
) -> Result<Vec<RequestOutcome>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the replay binary: {e}"))?;
    let shards = run.clients;
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
