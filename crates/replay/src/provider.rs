//! The simulated provider's rate-limit ledger: requests and tokens per rolling
//! window and calls in flight, enforced the way a provider enforces them, with the
//! hints a provider sends back. The HTTP face is in [`crate::provider_server`].

use std::collections::{BTreeMap, VecDeque};

/// The provider's own token count: one token per 4 bytes of text, rounded up, as
/// English text averages under OpenAI's tokenizers.
pub const BYTES_PER_TOKEN: u64 = 4;
/// The most admissions the ledger records for the run's report: more than the
/// largest trace the replay accepts, so a report is never cut.
pub const ADMISSIONS_LOG_MAX: usize = 4_000_000;

/// How the provider charges a request against its token limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Accounting {
    /// Charge the tokens really read and written (prompt + generated output).
    Actual,
    /// Charge as OpenAI documents: the estimated prompt tokens plus `max_tokens`,
    /// at admission, whatever the model then generates.
    Openai,
}

impl Accounting {
    /// The tokens charged for a call of `prompt_tokens` with a `max_tokens` bound that
    /// generates `output_tokens` (never more than `max_tokens`).
    pub fn charge(self, prompt_tokens: u64, max_tokens: u64, output_tokens: u64) -> u64 {
        assert!(output_tokens <= max_tokens, "the model never writes past max_tokens");
        match self {
            Accounting::Actual => prompt_tokens + output_tokens,
            Accounting::Openai => prompt_tokens + max_tokens,
        }
    }
}

/// The provider's limits and speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProviderLimits {
    /// Requests admitted per window.
    pub rpm: u64,
    /// Tokens charged per window.
    pub tpm: u64,
    /// The rolling window, in ms.
    pub window_ms: u64,
    /// Calls in flight at once.
    pub concurrency: u64,
    /// Time the model takes per output token, in ms.
    pub ms_per_output_token: u64,
    /// How tokens are charged.
    pub accounting: Accounting,
}

/// The provider's token count of `text`.
pub fn count_tokens(text: &str) -> u64 {
    u64::try_from(text.len())
        .expect("usize fits u64")
        .div_ceil(BYTES_PER_TOKEN)
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// Requests per window.
    Requests,
    /// Tokens per window.
    Tokens,
    /// Calls in flight.
    Concurrency,
}

/// What is left of each rolling limit, sent back in `x-ratelimit-remaining-*` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remaining {
    /// Requests still admissible in the current window.
    pub requests: u64,
    /// Tokens still chargeable in the current window.
    pub tokens: u64,
}

/// The ledger's answer to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted: the call holds a slot until [`Ledger::release`] with this ticket.
    Admitted {
        /// Pass back to [`Ledger::release`].
        ticket: Ticket,
        /// What is left after this request.
        remaining: Remaining,
    },
    /// Refused for now (HTTP 429).
    Throttled {
        /// The first limit that refused it.
        limit: LimitKind,
        /// When the request would fit, in ms (at least 1).
        retry_after_ms: u64,
        /// What is left now.
        remaining: Remaining,
    },
    /// Refused for good: the charge exceeds the whole token limit.
    TooLarge {
        /// The tokens the request would be charged.
        charge: u64,
    },
}

/// An admitted call's claim on a concurrency slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    ends_at_ms: u64,
}

/// One admitted request, for the run's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Admission {
    /// When it was admitted, Unix ms.
    pub at_unix_ms: u64,
    /// Tokens charged against the token limit.
    pub charged_tokens: u64,
}

/// The provider's counts over the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LedgerCounts {
    /// Requests admitted.
    pub admitted: u64,
    /// 429 answers.
    pub throttled: u64,
    /// Of those, refused by the request limit.
    pub throttled_requests: u64,
    /// Of those, refused by the token limit.
    pub throttled_tokens: u64,
    /// Of those, refused by the concurrency limit.
    pub throttled_concurrency: u64,
    /// Requests refused as too large.
    pub too_large: u64,
    /// Tokens charged in all.
    pub charged_tokens: u64,
}

/// Rolling-window and concurrency accounting. A sliding log: each admission
/// counts for exactly `window_ms` after it, so no window of that length ever
/// holds more than the limits.
#[derive(Debug)]
pub struct Ledger {
    limits: ProviderLimits,
    window: VecDeque<Admission>,
    tokens_in_window: u64,
    in_flight: BTreeMap<u64, u64>,
    in_flight_count: u64,
    log: Vec<Admission>,
    counts: LedgerCounts,
}

impl Ledger {
    /// An empty ledger enforcing `limits`.
    pub fn new(limits: ProviderLimits) -> Self {
        assert!(limits.rpm >= 1 && limits.tpm >= 1 && limits.concurrency >= 1 && limits.window_ms >= 1);
        Self {
            limits,
            window: VecDeque::new(),
            tokens_in_window: 0,
            in_flight: BTreeMap::new(),
            in_flight_count: 0,
            log: Vec::new(),
            counts: LedgerCounts::default(),
        }
    }

    /// The limits enforced.
    pub fn limits(&self) -> &ProviderLimits {
        &self.limits
    }

    /// Admits a request charged `charge` tokens that will be busy for `busy_ms`,
    /// or says which limit refuses it and when it would fit.
    pub fn admit(&mut self, now_ms: u64, charge: u64, busy_ms: u64) -> Verdict {
        if charge > self.limits.tpm {
            self.counts.too_large += 1;
            return Verdict::TooLarge { charge };
        }
        self.expire(now_ms);
        let refusal = if self.window.len() as u64 >= self.limits.rpm {
            Some((
                LimitKind::Requests,
                self.window[0].at_unix_ms + self.limits.window_ms - now_ms,
            ))
        } else if self.tokens_in_window + charge > self.limits.tpm {
            Some((LimitKind::Tokens, self.tokens_fit_in_ms(now_ms, charge)))
        } else if self.in_flight_count >= self.limits.concurrency {
            let (&first_end, _) = self.in_flight.first_key_value().expect("slots are held");
            Some((LimitKind::Concurrency, first_end.saturating_sub(now_ms)))
        } else {
            None
        };
        if let Some((limit, retry_after_ms)) = refusal {
            self.counts.throttled += 1;
            *match limit {
                LimitKind::Requests => &mut self.counts.throttled_requests,
                LimitKind::Tokens => &mut self.counts.throttled_tokens,
                LimitKind::Concurrency => &mut self.counts.throttled_concurrency,
            } += 1;
            return Verdict::Throttled {
                limit,
                retry_after_ms: retry_after_ms.max(1),
                remaining: self.remaining(),
            };
        }
        let admission = Admission {
            at_unix_ms: now_ms,
            charged_tokens: charge,
        };
        self.window.push_back(admission);
        self.tokens_in_window += charge;
        if self.log.len() < ADMISSIONS_LOG_MAX {
            self.log.push(admission);
        }
        self.counts.admitted += 1;
        self.counts.charged_tokens += charge;
        let ends_at_ms = now_ms + busy_ms;
        *self.in_flight.entry(ends_at_ms).or_default() += 1;
        self.in_flight_count += 1;
        Verdict::Admitted {
            ticket: Ticket { ends_at_ms },
            remaining: self.remaining(),
        }
    }

    /// Frees the concurrency slot of a finished (or abandoned) call.
    pub fn release(&mut self, ticket: Ticket) {
        let held = self
            .in_flight
            .get_mut(&ticket.ends_at_ms)
            .expect("a ticket is released once");
        *held -= 1;
        if *held == 0 {
            self.in_flight.remove(&ticket.ends_at_ms);
        }
        self.in_flight_count -= 1;
    }

    /// Every admission so far, in order.
    pub fn admissions(&self) -> &[Admission] {
        &self.log
    }

    /// The counts so far.
    pub fn counts(&self) -> LedgerCounts {
        self.counts
    }

    /// Calls in flight now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight_count
    }

    fn remaining(&self) -> Remaining {
        Remaining {
            requests: self.limits.rpm.saturating_sub(self.window.len() as u64),
            tokens: self.limits.tpm.saturating_sub(self.tokens_in_window),
        }
    }

    fn expire(&mut self, now_ms: u64) {
        while let Some(oldest) = self.window.front() {
            if oldest.at_unix_ms + self.limits.window_ms > now_ms {
                break;
            }
            self.tokens_in_window -= oldest.charged_tokens;
            self.window.pop_front();
        }
    }

    /// The time until enough admissions expire for `charge` more tokens to fit.
    fn tokens_fit_in_ms(&self, now_ms: u64, charge: u64) -> u64 {
        let mut in_window = self.tokens_in_window;
        for admission in &self.window {
            in_window -= admission.charged_tokens;
            if in_window + charge <= self.limits.tpm {
                return admission.at_unix_ms + self.limits.window_ms - now_ms;
            }
        }
        unreachable!("a charge within the limit fits once the window is empty")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rpm: u64, tpm: u64, concurrency: u64) -> ProviderLimits {
        ProviderLimits {
            rpm,
            tpm,
            window_ms: 60_000,
            concurrency,
            ms_per_output_token: 1,
            accounting: Accounting::Actual,
        }
    }

    fn admitted(verdict: Verdict) -> Ticket {
        match verdict {
            Verdict::Admitted { ticket, .. } => ticket,
            other => panic!("expected admission, got {other:?}"),
        }
    }

    #[test]
    fn tokens_are_counted_four_bytes_to_a_token() {
        assert_eq!(count_tokens(""), 0);
        assert_eq!(count_tokens("abc"), 1);
        assert_eq!(count_tokens("abcd"), 1);
        assert_eq!(count_tokens("abcde"), 2);
        assert_eq!(Accounting::Actual.charge(100, 50, 20), 120);
        assert_eq!(Accounting::Openai.charge(100, 50, 20), 150);
    }

    #[test]
    fn requests_per_window_refuse_until_the_oldest_expires() {
        let mut ledger = Ledger::new(limits(2, 1_000, 10));
        admitted(ledger.admit(1_000, 1, 0));
        let Verdict::Admitted { remaining, .. } = ledger.admit(1_500, 1, 0) else {
            panic!()
        };
        assert_eq!(
            remaining,
            Remaining {
                requests: 0,
                tokens: 998
            }
        );
        assert_eq!(
            ledger.admit(2_000, 1, 0),
            Verdict::Throttled {
                limit: LimitKind::Requests,
                retry_after_ms: 59_000,
                remaining: Remaining {
                    requests: 0,
                    tokens: 998
                }
            }
        );
        // Still inside the first admission's window one ms before it ends.
        assert!(matches!(
            ledger.admit(60_999, 1, 0),
            Verdict::Throttled { retry_after_ms: 1, .. }
        ));
        admitted(ledger.admit(61_000, 1, 0));
        assert_eq!(
            ledger.counts(),
            LedgerCounts {
                admitted: 3,
                throttled: 2,
                throttled_requests: 2,
                throttled_tokens: 0,
                throttled_concurrency: 0,
                too_large: 0,
                charged_tokens: 3
            }
        );
    }

    #[test]
    fn tokens_per_window_give_the_exact_time_enough_expires() {
        let mut ledger = Ledger::new(limits(100, 100, 10));
        admitted(ledger.admit(0, 40, 0));
        admitted(ledger.admit(10_000, 30, 0));
        admitted(ledger.admit(20_000, 30, 0));
        // 50 more tokens need the first two admissions gone: the second ends at 70 s.
        let verdict = ledger.admit(30_000, 50, 0);
        assert_eq!(
            verdict,
            Verdict::Throttled {
                limit: LimitKind::Tokens,
                retry_after_ms: 40_000,
                remaining: Remaining {
                    requests: 97,
                    tokens: 0
                }
            }
        );
        assert!(matches!(
            ledger.admit(69_999, 50, 0),
            Verdict::Throttled {
                limit: LimitKind::Tokens,
                ..
            }
        ));
        admitted(ledger.admit(70_000, 50, 0));
        assert_eq!(ledger.admit(70_000, 101, 0), Verdict::TooLarge { charge: 101 });
    }

    #[test]
    fn concurrency_holds_until_release_and_hints_the_first_end() {
        let mut ledger = Ledger::new(limits(100, 1_000, 2));
        let a = admitted(ledger.admit(0, 1, 500));
        let b = admitted(ledger.admit(0, 1, 200));
        assert_eq!(
            ledger.admit(50, 1, 10),
            Verdict::Throttled {
                limit: LimitKind::Concurrency,
                retry_after_ms: 150,
                remaining: Remaining {
                    requests: 98,
                    tokens: 998
                }
            }
        );
        ledger.release(b);
        assert_eq!(ledger.in_flight(), 1);
        let c = admitted(ledger.admit(60, 1, 10));
        ledger.release(a);
        ledger.release(c);
        assert_eq!(ledger.in_flight(), 0);
        assert_eq!(ledger.admissions().len(), 3);
    }

    #[test]
    fn a_refused_request_changes_nothing() {
        let mut ledger = Ledger::new(limits(1, 10, 1));
        admitted(ledger.admit(0, 10, 5));
        for charge in [1, 10] {
            assert!(matches!(ledger.admit(1, charge, 0), Verdict::Throttled { .. }));
        }
        assert_eq!(ledger.admissions().len(), 1);
        assert_eq!(ledger.in_flight(), 1);
        assert_eq!(ledger.counts().charged_tokens, 10);
    }
}
