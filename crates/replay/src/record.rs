//! A run's raw record: the provider's admissions and counts and every request's
//! outcome, saved by `--record-json` so that a summary and a plot can be made
//! again later (`--from-record`) without replaying.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::outcome::RequestOutcome;
use crate::sim::limits::ProviderLimits;
use crate::sim::profile::Dimension;
use crate::sim::provider::{Admission, LedgerCounts, TokenLimit};
use crate::summary::RunRecord;

/// Everything a summary and a plot are made from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedRun {
    /// The plot's title: trace, strategy, speed-up.
    pub title: String,
    /// The provider's limits.
    pub limits: ProviderLimits,
    /// When the first request arrived, Unix ms.
    pub start_unix_ms: u64,
    /// The provider's counts.
    pub counts: LedgerCounts,
    /// The provider's token limits, in the order of each admission's `settled_tokens`
    /// (missing from records saved before it existed: then `tpm` alone).
    #[serde(default)]
    pub token_limits: Vec<TokenLimit>,
    /// The provider's admissions in time order.
    pub admissions: Vec<Admission>,
    /// Every request's outcome in trace order.
    pub outcomes: Vec<RequestOutcome>,
}

impl SavedRun {
    /// The borrowed view the summary reads.
    pub fn record(&self) -> RunRecord<'_> {
        RunRecord {
            outcomes: &self.outcomes,
            admissions: &self.admissions,
            token_limits: &self.token_limits,
            limits: self.limits,
            provider_429: self.counts.throttled,
            provider_429_by_limit: [
                self.counts.throttled_requests,
                self.counts.throttled_tokens,
                self.counts.throttled_concurrency,
            ],
            start_unix_ms: self.start_unix_ms,
        }
    }

    /// Writes the record to `path` as JSON.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::to_writer(std::io::BufWriter::new(file), self).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Reads a record written by [`SavedRun::save`]. A record saved before the
    /// token limits were recorded kept only `tpm` and its admission charges: it reads
    /// as that one limit, settled at its admission charge.
    pub fn load(path: &Path) -> Result<Self, String> {
        let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut saved: Self =
            serde_json::from_reader(std::io::BufReader::new(file)).map_err(|e| format!("{}: {e}", path.display()))?;
        if saved.token_limits.is_empty() {
            saved.token_limits = vec![TokenLimit {
                dimension: Dimension::Tokens,
                capacity: saved.limits.tpm,
            }];
            for admission in &mut saved.admissions {
                admission.settled_tokens[0] = admission.charged_tokens;
            }
        }
        Ok(saved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::limits::Accounting;
    use crate::summary::summarize;

    #[test]
    fn a_saved_run_loads_back_to_the_same_summary() {
        let outcome = RequestOutcome {
            index: 0,
            arrival_unix_ms: 1_000,
            sent_unix_ms: 1_500,
            done_unix_ms: 1_600,
            attempts: 2,
            throttled: 1,
            completed: true,
            error: None,
            offered_tokens: 30,
            served_tokens: 30,
            granted_unix_ms: 1_490,
            admitted_unix_ms: 1_502,
        };
        let saved = SavedRun {
            title: "t".to_owned(),
            limits: ProviderLimits {
                rpm: 5,
                tpm: 100,
                window_ms: 1_000,
                concurrency: 2,
                ms_per_output_token: 1,
                accounting: Accounting::Openai,
            },
            start_unix_ms: 1_000,
            counts: LedgerCounts {
                admitted: 1,
                throttled: 1,
                throttled_tokens: 1,
                charged_tokens: 30,
                ..Default::default()
            },
            token_limits: vec![TokenLimit {
                dimension: Dimension::Tokens,
                capacity: 100,
            }],
            admissions: vec![Admission {
                at_unix_ms: 1_500,
                charged_tokens: 30,
                settled_tokens: [30, 0],
            }],
            outcomes: vec![outcome],
        };
        let path = std::env::temp_dir().join(format!("replay-record-{}.json", std::process::id()));
        saved.save(&path).unwrap();
        let loaded = SavedRun::load(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(loaded, saved);
        assert_eq!(summarize(&loaded.record()), summarize(&saved.record()));
        assert_eq!(summarize(&loaded.record()).provider_429_by_limit, [0, 1, 0]);
        // A record saved before the token limits were recorded reads as `tpm` alone,
        // settled at its admission charges.
        let mut old = serde_json::to_value(&saved).unwrap();
        old.as_object_mut().unwrap().remove("token_limits");
        old["admissions"][0].as_object_mut().unwrap().remove("settled_tokens");
        std::fs::write(&path, old.to_string()).unwrap();
        let mended = SavedRun::load(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(mended, saved);
        assert!(SavedRun::load(Path::new("/nonexistent.json"))
            .unwrap_err()
            .starts_with("/nonexistent.json: "));
    }
}
