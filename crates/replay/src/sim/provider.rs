//! The simulated provider's rate-limit ledger: requests and tokens per window
//! and calls in flight, enforced the way a provider enforces them (a sliding log by
//! default, or a provider's profile: [`crate::sim::profile`]), with the hints a
//! provider sends back. The HTTP face is in [`crate::sim::server`].

use std::collections::BTreeMap;

use crate::sim::enforcement::Meter;
use crate::sim::limits::ProviderLimits;
use crate::sim::profile::{CallShape, Dimension, LimitState, ProfileName, SimProfile};

/// The most admissions the ledger records for the run's report: more than the
/// largest trace the replay accepts, so a report is never cut.
pub const ADMISSIONS_LOG_MAX: usize = 4_000_000;

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

/// The most limits a profile keeps besides concurrency (Gemini: requests,
/// tokens and requests per day; Anthropic: requests, input and output tokens).
pub const METERS_MAX: usize = 3;

/// An admitted call's claim on a concurrency slot, with what it holds on each
/// limit and what the provider settles it to when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    ends_at_ms: u64,
    sequence: u64,
    admitted_ms: u64,
    held: [u64; METERS_MAX],
    settled: [u64; METERS_MAX],
}

/// The most token limits a profile keeps (Anthropic: input and output tokens).
pub const TOKEN_LIMITS_MAX: usize = 2;

/// One admitted request, for the run's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Admission {
    /// When it was admitted, Unix ms.
    pub at_unix_ms: u64,
    /// Tokens charged at admission against the first token limit (the one `tpm` sets).
    pub charged_tokens: u64,
    /// What the provider finally charges the call on each token limit, in the order of
    /// [`Ledger::token_limits`] (0 past the profile's last): the admission charge as the
    /// provider settles it when the call ends (Bedrock's input plus 5x output, Anthropic's
    /// output estimate adjusted to the output), counted from the admission, as the
    /// provider's own window counts it. Records saved before it existed read as zeros
    /// and are mended on load ([`crate::record::SavedRun::load`]).
    #[serde(default)]
    pub settled_tokens: [u64; TOKEN_LIMITS_MAX],
}

/// One token limit the provider keeps, for the run's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenLimit {
    /// Which limit.
    pub dimension: Dimension,
    /// Its published capacity per window.
    pub capacity: u64,
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

/// The provider's accounting: one [`Meter`] per limit, enforced as the
/// provider's profile says ([`SimProfile`]; [`Ledger::new`] keeps a sliding log
/// per limit: each admission counts for exactly `window_ms` after it, so no window
/// of that length ever holds more than the limits), and the calls in flight.
#[derive(Debug)]
pub struct Ledger {
    limits: ProviderLimits,
    profile: SimProfile,
    meters: Vec<(Dimension, Meter)>,
    sequence: u64,
    /// The latest time seen: handlers read the clock before they take the ledger's
    /// lock, so calls can arrive with times out of order; the ledger never goes back.
    latest_ms: u64,
    in_flight: BTreeMap<u64, u64>,
    in_flight_count: u64,
    log: Vec<Admission>,
    counts: LedgerCounts,
}

impl Ledger {
    /// An empty ledger enforcing `limits` with a sliding log per limit.
    pub fn new(limits: ProviderLimits) -> Self {
        Self::with_profile(limits, SimProfile::with_defaults(ProfileName::Sliding, &limits), 0)
    }

    /// An empty ledger enforcing `limits` as `profile`'s provider does, from
    /// `now_ms` (where a token bucket starts full).
    pub fn with_profile(limits: ProviderLimits, profile: SimProfile, now_ms: u64) -> Self {
        assert!(limits.rpm >= 1 && limits.tpm >= 1 && limits.concurrency >= 1 && limits.window_ms >= 1);
        let meters: Vec<(Dimension, Meter)> = (profile.meters(&limits).into_iter())
            .map(|(dimension, capacity, spec)| (dimension, spec.build(capacity, now_ms)))
            .collect();
        assert!(meters.len() <= METERS_MAX);
        assert!(meters.iter().filter(|(d, _)| !d.is_requests()).count() <= TOKEN_LIMITS_MAX);
        Self {
            limits,
            profile,
            meters,
            sequence: 0,
            latest_ms: now_ms,
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

    /// The profile enforced.
    pub fn profile(&self) -> &SimProfile {
        &self.profile
    }

    /// Admits a request charged `charge` tokens that will be busy for `busy_ms`,
    /// or says which limit refuses it and when it would fit. The charge goes to the
    /// profile's first token limit; [`Ledger::admit_call`] charges each limit as the
    /// provider does.
    pub fn admit(&mut self, now_ms: u64, charge: u64, busy_ms: u64) -> Verdict {
        let mut charges = [0; METERS_MAX];
        let mut tokens_charged = false;
        for (slot, (dimension, _)) in charges.iter_mut().zip(&self.meters) {
            if dimension.is_requests() {
                *slot = 1;
            } else if !tokens_charged {
                (*slot, tokens_charged) = (charge, true);
            }
        }
        self.admit_charges(now_ms, charges, charges, busy_ms)
    }

    /// Admits `call` as the profile's provider counts it: each limit charged what
    /// the provider charges at admission, settled to its final charge when the
    /// call's ticket is released.
    pub fn admit_call(&mut self, now_ms: u64, call: &CallShape, busy_ms: u64) -> Verdict {
        let (mut held, mut settled) = ([0; METERS_MAX], [0; METERS_MAX]);
        for (i, (dimension, _)) in self.meters.iter().enumerate() {
            held[i] = self.profile.admission_charge(self.limits.accounting, *dimension, call);
            settled[i] = self.profile.final_charge(self.limits.accounting, *dimension, call);
        }
        self.admit_charges(now_ms, held, settled, busy_ms)
    }

    fn admit_charges(
        &mut self,
        now_ms: u64,
        held: [u64; METERS_MAX],
        settled: [u64; METERS_MAX],
        busy_ms: u64,
    ) -> Verdict {
        // Handlers read the clock before the lock: an admission is stamped no
        // earlier than the last, so the log stays in time order.
        let now_ms = self.now(now_ms);
        for (i, (_, meter)) in self.meters.iter().enumerate() {
            if held[i] > meter.quota() {
                self.counts.too_large += 1;
                return Verdict::TooLarge { charge: held[i] };
            }
        }
        self.meters.iter_mut().for_each(|(_, meter)| meter.advance(now_ms));
        if let Some((limit, retry_after_ms)) = self.refusal(now_ms, &held) {
            self.count_refusal(now_ms, limit);
            return Verdict::Throttled {
                limit,
                retry_after_ms: retry_after_ms.max(1),
                remaining: self.remaining(),
            };
        }
        self.sequence += 1;
        for (i, (_, meter)) in self.meters.iter_mut().enumerate() {
            meter.take(self.sequence, now_ms, held[i]);
        }
        // The report compares admissions with every token limit, on what the provider
        // finally charges (known now: the ticket carries it), and with `tpm` at admission.
        let tokens = held[self.tokens_index()];
        let mut settled_tokens = [0; TOKEN_LIMITS_MAX];
        for (slot, i) in settled_tokens.iter_mut().zip(self.token_indices()) {
            *slot = settled[i];
        }
        let admission = Admission {
            at_unix_ms: now_ms,
            charged_tokens: tokens,
            settled_tokens,
        };
        if self.log.len() < ADMISSIONS_LOG_MAX {
            self.log.push(admission);
        }
        self.counts.admitted += 1;
        self.counts.charged_tokens += tokens;
        let ends_at_ms = now_ms + busy_ms;
        *self.in_flight.entry(ends_at_ms).or_default() += 1;
        self.in_flight_count += 1;
        Verdict::Admitted {
            ticket: Ticket {
                ends_at_ms,
                sequence: self.sequence,
                admitted_ms: now_ms,
                held,
                settled,
            },
            remaining: self.remaining(),
        }
    }

    /// The first limit that refuses `held` now, with the ms until it would fit.
    fn refusal(&self, now_ms: u64, held: &[u64; METERS_MAX]) -> Option<(LimitKind, u64)> {
        for (i, (dimension, meter)) in self.meters.iter().enumerate() {
            if let Err(wait_ms) = meter.check(now_ms, held[i]) {
                let kind = if dimension.is_requests() {
                    LimitKind::Requests
                } else {
                    LimitKind::Tokens
                };
                return Some((kind, wait_ms.expect("quotas were checked first")));
            }
        }
        if self.in_flight_count >= self.limits.concurrency {
            let (&first_end, _) = self.in_flight.first_key_value().expect("slots are held");
            return Some((LimitKind::Concurrency, first_end.saturating_sub(now_ms)));
        }
        None
    }

    fn count_refusal(&mut self, now_ms: u64, limit: LimitKind) {
        self.counts.throttled += 1;
        *match limit {
            LimitKind::Requests => &mut self.counts.throttled_requests,
            LimitKind::Tokens => &mut self.counts.throttled_tokens,
            LimitKind::Concurrency => &mut self.counts.throttled_concurrency,
        } += 1;
        if self.profile.counts_refused() {
            self.sequence += 1;
            for (dimension, meter) in &mut self.meters {
                if dimension.is_requests() {
                    meter.take(self.sequence, now_ms, 1);
                }
            }
        }
    }

    /// Frees the concurrency slot of a finished (or abandoned) call, and settles
    /// each limit to what the provider finally charges for it.
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
        let tokens_index = self.tokens_index();
        for (i, (_, meter)) in self.meters.iter_mut().enumerate() {
            let (from, to) = (ticket.held[i], ticket.settled[i]);
            if from != to {
                meter.settle(ticket.sequence, ticket.admitted_ms, from, to);
                if i == tokens_index {
                    self.counts.charged_tokens = (self.counts.charged_tokens + to).saturating_sub(from);
                }
            }
        }
    }

    /// Every limit's state at `now_ms`, for the provider's headers.
    pub fn limit_states(&mut self, now_ms: u64) -> Vec<LimitState> {
        let now_ms = self.now(now_ms);
        (self.meters.iter_mut())
            .map(|(dimension, meter)| {
                meter.advance(now_ms);
                LimitState {
                    dimension: *dimension,
                    limit: meter.capacity(),
                    remaining: meter.remaining(),
                    reset_ms: meter.reset_ms(now_ms),
                }
            })
            .collect()
    }

    /// Every admission so far, in order, with its admission charge.
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

    /// `now_ms`, or the latest time seen when that is later.
    fn now(&mut self, now_ms: u64) -> u64 {
        self.latest_ms = self.latest_ms.max(now_ms);
        self.latest_ms
    }

    /// Where the limit `tpm` sets is among the meters: the first token limit.
    fn tokens_index(&self) -> usize {
        self.token_indices().next().expect("every profile keeps a token limit")
    }

    /// Where the token limits are among the meters, in order.
    fn token_indices(&self) -> impl Iterator<Item = usize> + '_ {
        (self.meters.iter().enumerate())
            .filter(|(_, (d, _))| !d.is_requests())
            .map(|(i, _)| i)
    }

    /// The token limits kept, in the order of [`Admission::settled_tokens`].
    pub fn token_limits(&self) -> Vec<TokenLimit> {
        (self.token_indices())
            .map(|i| TokenLimit {
                dimension: self.meters[i].0,
                capacity: self.meters[i].1.capacity(),
            })
            .collect()
    }

    fn remaining(&self) -> Remaining {
        let left = |requests: bool| {
            (self.meters.iter())
                .find(|(d, _)| d.is_requests() == requests)
                .map_or(0, |(_, meter)| meter.remaining())
        };
        Remaining {
            requests: left(true),
            tokens: left(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::limits::Accounting;

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

    fn shape(prompt_tokens: u64, max_tokens: u64, output_tokens: u64) -> CallShape {
        CallShape {
            prompt_tokens,
            max_tokens,
            output_tokens,
            best_of: 1,
            ..CallShape::default()
        }
    }

    #[test]
    fn openai_refuses_a_burst_into_one_second_and_counts_the_refused() {
        let limits = limits(600, 1_000_000, 1_000);
        let profile = SimProfile::with_defaults(ProfileName::Openai, &limits);
        let mut ledger = Ledger::with_profile(limits, profile, 0);
        let admitted_count = (0..600)
            .filter(|&i| matches!(ledger.admit_call(i, &shape(10, 10, 1), 0), Verdict::Admitted { .. }))
            .count();
        assert_eq!(admitted_count, 10, "600 RPM quantized to 1 s admits 10 a second");
        admitted(ledger.admit_call(1_000, &shape(10, 10, 1), 0));
        // A request refused for tokens still counts against the requests of its second.
        let mut ledger = Ledger::with_profile(limits, profile, 0);
        admitted_all(&mut ledger, 5, 0);
        for _ in 0..5 {
            let big = shape(15_600, 1_000, 1);
            assert!(matches!(
                ledger.admit_call(1, &big, 0),
                Verdict::Throttled {
                    limit: LimitKind::Tokens,
                    ..
                }
            ));
        }
        assert!(matches!(
            ledger.admit_call(2, &shape(10, 10, 1), 0),
            Verdict::Throttled {
                limit: LimitKind::Requests,
                retry_after_ms: 998,
                ..
            }
        ));
    }

    #[test]
    fn a_call_stamped_before_the_last_does_not_take_the_ledger_back() {
        // A handler reads the clock before it takes the ledger's lock: a call stamped
        // 999 may come after one stamped 1,000, and must not reopen the past second.
        let limits = limits(600, 1_000_000, 1_000);
        let profile = SimProfile::with_defaults(ProfileName::Openai, &limits);
        let mut ledger = Ledger::with_profile(limits, profile, 0);
        admitted_all(&mut ledger, 10, 1_000);
        for at in [999, 1_000] {
            assert!(matches!(
                ledger.admit_call(at, &shape(10, 10, 1), 0),
                Verdict::Throttled { .. }
            ));
        }
        let admissions: Vec<u64> = ledger.admissions().iter().map(|a| a.at_unix_ms).collect();
        assert!(admissions.windows(2).all(|w| w[0] <= w[1]));
        // Admitted out of order too: the log, which the report reads by binary
        // search, stays in time order.
        let mut ledger = Ledger::with_profile(limits, SimProfile::with_defaults(ProfileName::Openai, &limits), 0);
        for at in [2_000, 1_999] {
            admitted(ledger.admit_call(at, &shape(10, 10, 1), 0));
        }
        let admissions: Vec<u64> = ledger.admissions().iter().map(|a| a.at_unix_ms).collect();
        assert_eq!(admissions, [2_000, 2_000]);
    }

    fn admitted_all(ledger: &mut Ledger, n: u64, now_ms: u64) {
        for _ in 0..n {
            admitted(ledger.admit_call(now_ms, &shape(10, 10, 1), 0));
        }
    }

    #[test]
    fn anthropic_holds_max_tokens_on_output_and_settles_to_the_output() {
        let limits = limits(1_000, 10_000, 10);
        let profile = SimProfile {
            output_tpm: 1_000,
            ..SimProfile::with_defaults(ProfileName::Anthropic, &limits)
        };
        let mut ledger = Ledger::with_profile(limits, profile, 0);
        let call = CallShape {
            cache_read_tokens: 9_000,
            ..shape(10_000, 800, 100)
        };
        let ticket = admitted(ledger.admit_call(0, &call, 0));
        let states = ledger.limit_states(0);
        assert_eq!(
            states.iter().map(|s| (s.dimension, s.remaining)).collect::<Vec<_>>(),
            [
                (Dimension::Requests, 999),
                (Dimension::InputTokens, 9_000),
                (Dimension::OutputTokens, 200)
            ],
            "cache reads are not input; max_tokens is held on output"
        );
        assert!(matches!(ledger.admit_call(0, &call, 0), Verdict::Throttled { .. }));
        ledger.release(ticket);
        assert_eq!(
            ledger.limit_states(0)[2].remaining,
            900,
            "the output estimate is adjusted to the output"
        );
        admitted(ledger.admit_call(0, &call, 0));
        // The report sees both token limits, each at what the provider finally charges.
        assert_eq!(
            ledger.token_limits(),
            [
                TokenLimit {
                    dimension: Dimension::InputTokens,
                    capacity: 10_000
                },
                TokenLimit {
                    dimension: Dimension::OutputTokens,
                    capacity: 1_000
                }
            ]
        );
        let first = ledger.admissions()[0];
        assert_eq!((first.charged_tokens, first.settled_tokens), (1_000, [1_000, 100]));
    }

    #[test]
    fn bedrock_settles_output_at_five_times_its_count() {
        let limits = limits(1_000, 10_000, 10);
        let profile = SimProfile::with_defaults(ProfileName::Bedrock, &limits);
        let mut ledger = Ledger::with_profile(limits, profile, 0);
        let ticket = admitted(ledger.admit_call(0, &shape(1_000, 4_000, 1_000), 0));
        assert_eq!(
            ledger.limit_states(0)[1].remaining,
            5_000,
            "input plus max_tokens at admission"
        );
        ledger.release(ticket);
        assert_eq!(
            ledger.limit_states(0)[1].remaining,
            4_000,
            "input plus 5x output at the end"
        );
        assert_eq!(ledger.counts().charged_tokens, 6_000);
        let admission = ledger.admissions()[0];
        assert_eq!(
            (admission.charged_tokens, admission.settled_tokens),
            (5_000, [6_000, 0]),
            "held at admission, settled for the report"
        );
    }
}
