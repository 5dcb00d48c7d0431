//! Provider profiles of the simulated provider: which limits a provider keeps,
//! how each is enforced ([`crate::sim::enforcement`]), what a request is charged at
//! admission and at its end, whether refused requests count, and the headers and
//! 429 bodies the provider answers with. docs/provider-profiles.md quotes the
//! provider documentation each rule comes from.

use serde_json::{json, Value};

use crate::sim::enforcement::MeterSpec;
use crate::sim::limits::{Accounting, ProviderLimits};

/// A minute, the window every provider publishes its per-minute limits over.
pub const MINUTE_MS: u64 = 60_000;
/// A day, Gemini's requests-per-day period.
pub const DAY_MS: u64 = 86_400_000;
/// Pacific standard time, where Gemini's day starts ("Requests per day (RPD) quotas
/// reset at midnight Pacific time"): UTC-8. Daylight saving time is not modelled.
pub const PACIFIC_OFFSET_MS: i64 = -8 * 3_600_000;
/// OpenAI's quantum in its own example: "60,000 requests/minute may be enforced as
/// 1,000 requests/second".
pub const OPENAI_QUANTUM_MS_DEFAULT: u64 = 1_000;
/// Azure checks requests "over 1 or 10 second" periods; 10 s by default here, the
/// period the issue measured; `--provider-quantum-ms 1000` gives the other.
pub const AZURE_QUANTUM_MS_DEFAULT: u64 = 10_000;
/// Bedrock's output token burndown for Claude 3.7 and later models: "1 output
/// token consumes 5 tokens from your quotas".
pub const BEDROCK_OUTPUT_BURNDOWN: u64 = 5;

/// The providers whose enforcement the simulator reproduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ProfileName {
    /// A sliding log per limit over the window, charging as `--provider-accounting` says (the original simulator).
    Sliding,
    /// OpenAI: RPM and TPM quantized to short fixed periods; prompt estimate plus `max_tokens`; refused requests count.
    Openai,
    /// Azure OpenAI: RPM checked over 1 s or 10 s periods; a token count reset every minute; `max_tokens * best_of`.
    Azure,
    /// Anthropic: token buckets for RPM, input TPM (cache reads excluded) and output TPM (`max_tokens`, settled to the output).
    Anthropic,
    /// Gemini: RPM and input TPM, and requests per day from midnight Pacific time.
    Gemini,
    /// Bedrock: input plus `max_tokens` held at admission, settled to input plus 5x output.
    Bedrock,
}

/// A limit a profile keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// Requests per minute.
    Requests,
    /// Tokens per minute (input and output, as the profile charges them).
    Tokens,
    /// Anthropic's input tokens per minute.
    InputTokens,
    /// Anthropic's output tokens per minute.
    OutputTokens,
    /// Gemini's requests per day.
    RequestsPerDay,
}

impl Dimension {
    /// Its name in the run's report and picture.
    pub fn label(self) -> &'static str {
        match self {
            Dimension::Requests => "requests",
            Dimension::Tokens => "tokens",
            Dimension::InputTokens => "input tokens",
            Dimension::OutputTokens => "output tokens",
            Dimension::RequestsPerDay => "requests per day",
        }
    }

    /// Whether it counts requests (else tokens).
    pub fn is_requests(self) -> bool {
        matches!(self, Dimension::Requests | Dimension::RequestsPerDay)
    }
}

/// What one call asks and uses, as the provider sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallShape {
    /// The provider's count of the prompt. The simulator's tokenizer is the
    /// four-characters estimate OpenAI charges at admission, so the two agree.
    pub prompt_tokens: u64,
    /// Of the prompt, tokens read from the prompt cache.
    pub cache_read_tokens: u64,
    /// The output bound sent.
    pub max_tokens: u64,
    /// The output generated (at most `max_tokens`).
    pub output_tokens: u64,
    /// Azure's `best_of` (1 when absent).
    pub best_of: u64,
}

/// A provider profile with its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SimProfile {
    /// Which provider.
    pub name: ProfileName,
    /// OpenAI, Azure: the period per-minute limits are quantized to, in ms.
    pub quantum_ms: u64,
    /// Anthropic: output tokens per minute.
    pub output_tpm: u64,
    /// Gemini: requests per day.
    pub requests_per_day: u64,
}

impl SimProfile {
    /// `name` with its documented defaults: the quantum its provider names, an
    /// output limit of a fifth of `tpm` (Anthropic's tier 4 ratio, 400,000 output
    /// to 2,000,000 input), and no daily limit below the day's worth of `rpm`.
    pub fn with_defaults(name: ProfileName, limits: &ProviderLimits) -> Self {
        Self {
            name,
            quantum_ms: match name {
                ProfileName::Azure => AZURE_QUANTUM_MS_DEFAULT,
                _ => OPENAI_QUANTUM_MS_DEFAULT,
            },
            output_tpm: (limits.tpm / 5).max(1),
            requests_per_day: limits.rpm.saturating_mul(24 * 60),
        }
    }

    /// The limits kept, each with its capacity and enforcement.
    pub fn meters(&self, limits: &ProviderLimits) -> Vec<(Dimension, u64, MeterSpec)> {
        let sliding = MeterSpec::SlidingLog {
            window_ms: limits.window_ms,
        };
        let quantized = MeterSpec::Fixed {
            window_ms: MINUTE_MS,
            period_ms: self.quantum_ms,
            offset_ms: 0,
        };
        let bucket = MeterSpec::TokenBucket {
            refill_window_ms: MINUTE_MS,
        };
        let minute = MeterSpec::Fixed {
            window_ms: MINUTE_MS,
            period_ms: MINUTE_MS,
            offset_ms: 0,
        };
        let (requests, tokens) = (limits.rpm, limits.tpm);
        match self.name {
            ProfileName::Sliding => vec![
                (Dimension::Requests, requests, sliding),
                (Dimension::Tokens, tokens, sliding),
            ],
            ProfileName::Openai => vec![
                (Dimension::Requests, requests, quantized),
                (Dimension::Tokens, tokens, quantized),
            ],
            ProfileName::Azure => vec![
                (Dimension::Requests, requests, quantized),
                (Dimension::Tokens, tokens, minute),
            ],
            ProfileName::Anthropic => vec![
                (Dimension::Requests, requests, bucket),
                (Dimension::InputTokens, tokens, bucket),
                (Dimension::OutputTokens, self.output_tpm, bucket),
            ],
            ProfileName::Gemini => vec![
                (Dimension::Requests, requests, sliding),
                (Dimension::Tokens, tokens, sliding),
                (
                    Dimension::RequestsPerDay,
                    self.requests_per_day,
                    MeterSpec::Fixed {
                        window_ms: DAY_MS,
                        period_ms: DAY_MS,
                        offset_ms: PACIFIC_OFFSET_MS,
                    },
                ),
            ],
            ProfileName::Bedrock => vec![
                (Dimension::Requests, requests, sliding),
                (Dimension::Tokens, tokens, sliding),
            ],
        }
    }

    /// What `call` is charged on `dimension` at admission.
    pub fn admission_charge(&self, accounting: Accounting, dimension: Dimension, call: &CallShape) -> u64 {
        match dimension {
            Dimension::Requests | Dimension::RequestsPerDay => 1,
            Dimension::InputTokens => call.prompt_tokens.saturating_sub(call.cache_read_tokens),
            Dimension::OutputTokens => call.max_tokens,
            Dimension::Tokens => match self.name {
                ProfileName::Sliding => accounting.charge(call.prompt_tokens, call.max_tokens, call.output_tokens),
                ProfileName::Openai | ProfileName::Bedrock => call.prompt_tokens + call.max_tokens,
                ProfileName::Azure => call.prompt_tokens + call.max_tokens * call.best_of.max(1),
                ProfileName::Gemini => call.prompt_tokens,
                ProfileName::Anthropic => unreachable!("Anthropic splits input and output"),
            },
        }
    }

    /// What `call` is charged on `dimension` once it ended: Anthropic's output
    /// estimate adjusted to the output, Bedrock's hold settled to input plus 5x
    /// output; the admission charge elsewhere.
    pub fn final_charge(&self, accounting: Accounting, dimension: Dimension, call: &CallShape) -> u64 {
        match (self.name, dimension) {
            (ProfileName::Anthropic, Dimension::OutputTokens) => call.output_tokens,
            (ProfileName::Bedrock, Dimension::Tokens) => {
                call.prompt_tokens + BEDROCK_OUTPUT_BURNDOWN * call.output_tokens
            }
            _ => self.admission_charge(accounting, dimension, call),
        }
    }

    /// Whether a refused request still counts against the request limits
    /// (OpenAI: "unsuccessful requests contribute to your per-minute limit").
    pub fn counts_refused(&self) -> bool {
        self.name == ProfileName::Openai
    }
}

/// One limit's state for the headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitState {
    /// Which limit.
    pub dimension: Dimension,
    /// Its published capacity.
    pub limit: u64,
    /// What is left now.
    pub remaining: u64,
    /// Ms until it is whole again.
    pub reset_ms: u64,
}

/// OpenAI's duration format of `x-ratelimit-reset-*`: `20ms`, `1s`, `1.5s`, `6m0s`.
pub fn openai_duration(ms: u64) -> String {
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let (minutes, rest_ms) = (ms / 60_000, ms % 60_000);
    let seconds = if rest_ms % 1_000 == 0 {
        format!("{}s", rest_ms / 1_000)
    } else {
        format!("{}s", (rest_ms as f64 / 1_000.0 * 1_000.0).round() / 1_000.0)
    };
    if minutes == 0 {
        seconds
    } else {
        format!("{minutes}m{seconds}")
    }
}

/// `unix_ms` as an RFC 3339 UTC timestamp to the second, as Anthropic's `reset` headers are.
pub fn rfc3339(unix_ms: u64) -> String {
    let days = i64::try_from(unix_ms / DAY_MS).expect("days fit i64");
    let second_of_day = (unix_ms % DAY_MS) / 1_000;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        second_of_day / 3_600,
        second_of_day / 60 % 60,
        second_of_day % 60
    )
}

impl SimProfile {
    /// The rate-limit headers of every answer, in the provider's names.
    pub fn headers(&self, now_ms: u64, states: &[LimitState]) -> Vec<(String, String)> {
        let mut headers = Vec::new();
        for state in states {
            match self.name {
                ProfileName::Sliding | ProfileName::Openai | ProfileName::Azure => {
                    let unit = if state.dimension.is_requests() {
                        "requests"
                    } else {
                        "tokens"
                    };
                    headers.push((format!("x-ratelimit-limit-{unit}"), state.limit.to_string()));
                    headers.push((format!("x-ratelimit-remaining-{unit}"), state.remaining.to_string()));
                    headers.push((format!("x-ratelimit-reset-{unit}"), openai_duration(state.reset_ms)));
                }
                ProfileName::Anthropic => {
                    let unit = match state.dimension {
                        Dimension::InputTokens => "input-tokens",
                        Dimension::OutputTokens => "output-tokens",
                        _ => "requests",
                    };
                    let name = |field: &str| format!("anthropic-ratelimit-{unit}-{field}");
                    headers.push((name("limit"), state.limit.to_string()));
                    headers.push((name("remaining"), state.remaining.to_string()));
                    headers.push((name("reset"), rfc3339(now_ms + state.reset_ms)));
                }
                // Gemini and Bedrock send no rate-limit headers.
                ProfileName::Gemini | ProfileName::Bedrock => {}
            }
        }
        headers
    }

    /// A 429's extra headers and body: `retry_after_ms` until `dimension` (limit
    /// `limit`, `remaining` left) would admit what `model` asked.
    pub fn throttled(&self, model: &str, refused: &LimitState, retry_after_ms: u64) -> (Vec<(String, String)>, Value) {
        let seconds = retry_after_ms.div_ceil(1_000).to_string();
        let what = match refused.dimension {
            Dimension::Requests => "requests per min (RPM)",
            Dimension::Tokens => "tokens per min (TPM)",
            Dimension::InputTokens => "input tokens per minute",
            Dimension::OutputTokens => "output tokens per minute",
            Dimension::RequestsPerDay => "requests per day (RPD)",
        };
        let message = format!(
            "Rate limit reached for {model} on {what}: Limit {}, Remaining {}. Please try again in {}.",
            refused.limit,
            refused.remaining,
            openai_duration(retry_after_ms)
        );
        match self.name {
            ProfileName::Sliding | ProfileName::Openai => (
                vec![("retry-after".into(), seconds)],
                json!({ "error": { "message": message, "type": if refused.dimension.is_requests() { "requests" } else { "tokens" }, "param": null, "code": "rate_limit_exceeded" } }),
            ),
            ProfileName::Azure => (
                vec![
                    ("retry-after".into(), seconds),
                    ("retry-after-ms".into(), retry_after_ms.to_string()),
                ],
                json!({ "error": { "code": "429", "message": message } }),
            ),
            ProfileName::Anthropic => (
                vec![("retry-after".into(), seconds)],
                json!({ "type": "error", "error": { "type": "rate_limit_error", "message": message } }),
            ),
            ProfileName::Gemini => (
                Vec::new(),
                json!({ "error": { "code": 429, "message": message, "status": "RESOURCE_EXHAUSTED", "details": [
                    { "@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": format!("{seconds}s") }
                ] } }),
            ),
            ProfileName::Bedrock => (
                vec![("x-amzn-errortype".into(), "ThrottlingException".into())],
                json!({ "message": if refused.dimension.is_requests() { "Too many requests, please wait before trying again." } else { "Too many tokens, please wait before trying again." } }),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ProviderLimits {
        ProviderLimits {
            rpm: 600,
            tpm: 100_000,
            window_ms: MINUTE_MS,
            concurrency: 8,
            ms_per_output_token: 1,
            accounting: Accounting::Actual,
        }
    }

    #[test]
    fn each_profile_charges_as_its_provider_documents() {
        let call = CallShape {
            prompt_tokens: 1_000,
            cache_read_tokens: 400,
            max_tokens: 500,
            output_tokens: 100,
            best_of: 2,
        };
        let charges = |name: ProfileName| -> Vec<(Dimension, u64, u64)> {
            let profile = SimProfile::with_defaults(name, &limits());
            (profile.meters(&limits()).iter())
                .map(|&(d, _, _)| {
                    let accounting = Accounting::Actual;
                    (
                        d,
                        profile.admission_charge(accounting, d, &call),
                        profile.final_charge(accounting, d, &call),
                    )
                })
                .collect()
        };
        use Dimension::*;
        assert_eq!(
            charges(ProfileName::Sliding),
            [(Requests, 1, 1), (Tokens, 1_100, 1_100)]
        );
        assert_eq!(charges(ProfileName::Openai), [(Requests, 1, 1), (Tokens, 1_500, 1_500)]);
        assert_eq!(charges(ProfileName::Azure), [(Requests, 1, 1), (Tokens, 2_000, 2_000)]);
        assert_eq!(
            charges(ProfileName::Anthropic),
            [(Requests, 1, 1), (InputTokens, 600, 600), (OutputTokens, 500, 100)]
        );
        assert_eq!(
            charges(ProfileName::Gemini),
            [(Requests, 1, 1), (Tokens, 1_000, 1_000), (RequestsPerDay, 1, 1)]
        );
        assert_eq!(
            charges(ProfileName::Bedrock),
            [(Requests, 1, 1), (Tokens, 1_500, 1_500)]
        );
        assert!(SimProfile::with_defaults(ProfileName::Openai, &limits()).counts_refused());
        assert!(!SimProfile::with_defaults(ProfileName::Azure, &limits()).counts_refused());
    }

    #[test]
    fn headers_use_each_providers_names_and_formats() {
        assert_eq!(openai_duration(20), "20ms");
        assert_eq!(openai_duration(1_000), "1s");
        assert_eq!(openai_duration(1_500), "1.5s");
        assert_eq!(openai_duration(360_000), "6m0s");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_729_000_000_000), "2024-10-15T13:46:40Z");
        let state = LimitState {
            dimension: Dimension::OutputTokens,
            limit: 8_000,
            remaining: 10,
            reset_ms: 2_000,
        };
        let anthropic = SimProfile::with_defaults(ProfileName::Anthropic, &limits());
        let headers = anthropic.headers(0, &[state]);
        assert_eq!(
            headers[0],
            ("anthropic-ratelimit-output-tokens-limit".into(), "8000".into())
        );
        assert_eq!(
            headers[2],
            (
                "anthropic-ratelimit-output-tokens-reset".into(),
                "1970-01-01T00:00:02Z".into()
            )
        );
        let (extra, body) = anthropic.throttled("claude", &state, 1_200);
        assert_eq!(extra, [("retry-after".to_owned(), "2".to_owned())]);
        assert_eq!(body["error"]["type"], "rate_limit_error");
        let azure = SimProfile::with_defaults(ProfileName::Azure, &limits());
        let (extra, _) = azure.throttled("gpt-4o", &state, 1_200);
        assert_eq!(extra[1], ("retry-after-ms".to_owned(), "1200".to_owned()));
        let gemini = SimProfile::with_defaults(ProfileName::Gemini, &limits());
        let (_, body) = gemini.throttled("gemini", &state, 1_200);
        assert_eq!(body["error"]["details"][0]["retryDelay"], "2s");
        assert!(gemini.headers(0, &[state]).is_empty());
    }
}
