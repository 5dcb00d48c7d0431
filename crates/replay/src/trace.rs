//! Request traces: when each request arrived and how many tokens it read and wrote.
//!
//! Two formats are read: the Azure LLM inference traces of 2023
//! (`TIMESTAMP,ContextTokens,GeneratedTokens`, wall-clock timestamps with a 7-digit
//! fraction) and JSON lines (`{"timestamp_ms": 0, "input_tokens": 10, "output_tokens": 5}`).
//! Every bad line is an error that names the file and the line.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The most records one trace may hold. The Azure traces hold 8,819 and 19,366;
/// a bound keeps a wrong file from exhausting memory.
pub const RECORDS_MAX: usize = 2_000_000;
/// The longest line accepted, in bytes: a record is three numbers.
pub const LINE_BYTES_MAX: usize = 1024;
/// The most tokens one request may read or write. The largest models take about
/// two million tokens of context; more is a corrupt line, not a request.
pub const TOKENS_PER_REQUEST_MAX: u64 = 2_000_000;
/// The Azure CSV header, exactly as the dataset spells it.
pub const AZURE_HEADER: &str = "TIMESTAMP,ContextTokens,GeneratedTokens";

/// One request of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRecord {
    /// When the request arrived, in ms after the trace's first request.
    pub offset_ms: u64,
    /// Prompt tokens the request sent.
    pub input_tokens: u64,
    /// Tokens the model generated for it.
    pub output_tokens: u64,
}

/// A trace: records in arrival order, the first at offset 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    records: Vec<TraceRecord>,
}

/// The formats `replay --format` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceFormat {
    /// Azure LLM inference trace CSV.
    Azure,
    /// One JSON object per line.
    Jsonl,
}

/// Why a trace could not be read. Always names the file, and the line when one is at fault.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("{file}: {source}")]
    Io {
        /// The trace file.
        file: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// One line is malformed.
    #[error("{file}:{line}: {message}")]
    Line {
        /// The trace file.
        file: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The file as a whole is unusable (empty, too many records).
    #[error("{file}: {message}")]
    File {
        /// The trace file.
        file: PathBuf,
        /// What is wrong with it.
        message: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRecord {
    timestamp_ms: u64,
    input_tokens: u64,
    output_tokens: u64,
}

impl Trace {
    /// Reads `path` in `format`.
    pub fn load(path: &Path, format: TraceFormat) -> Result<Self, TraceError> {
        let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
            file: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text, format)
    }

    /// Parses `text`, the content of `file` (named in errors), in `format`.
    pub fn parse(file: &Path, text: &str, format: TraceFormat) -> Result<Self, TraceError> {
        let line_error = |line: usize, message: String| TraceError::Line {
            file: file.to_owned(),
            line,
            message,
        };
        let mut lines = text
            .split('\n')
            .enumerate()
            .map(|(i, l)| (i + 1, l.strip_suffix('\r').unwrap_or(l)));
        if format == TraceFormat::Azure {
            match lines.next() {
                Some((_, header)) if header.trim() == AZURE_HEADER => {}
                Some((n, header)) => {
                    return Err(line_error(
                        n,
                        format!("expected the header {AZURE_HEADER:?}, got {:?}", clip(header)),
                    ))
                }
                None => unreachable!("split yields at least one item"),
            }
        }
        let mut stamped: Vec<(usize, u64, u64, u64)> = Vec::new();
        for (n, line) in lines {
            if line.trim().is_empty() {
                continue;
            }
            if line.len() > LINE_BYTES_MAX {
                return Err(line_error(n, format!("line is longer than {LINE_BYTES_MAX} bytes")));
            }
            if stamped.len() == RECORDS_MAX {
                return Err(TraceError::File {
                    file: file.to_owned(),
                    message: format!("more than {RECORDS_MAX} records"),
                });
            }
            let (stamp_ms, input, output) = match format {
                TraceFormat::Azure => parse_azure_line(line),
                TraceFormat::Jsonl => parse_json_line(line),
            }
            .map_err(|message| line_error(n, message))?;
            for (name, tokens) in [("input tokens", input), ("output tokens", output)] {
                if tokens > TOKENS_PER_REQUEST_MAX {
                    return Err(line_error(
                        n,
                        format!("{name} {tokens} exceed the {TOKENS_PER_REQUEST_MAX} a request can hold"),
                    ));
                }
            }
            if let Some(&(previous_line, previous_ms, _, _)) = stamped.last() {
                if stamp_ms < previous_ms {
                    return Err(line_error(
                        n,
                        format!("timestamp goes back in time from line {previous_line}; a trace is in arrival order"),
                    ));
                }
            }
            stamped.push((n, stamp_ms, input, output));
        }
        let Some(&(_, first_ms, _, _)) = stamped.first() else {
            return Err(TraceError::File {
                file: file.to_owned(),
                message: "the trace holds no records".to_owned(),
            });
        };
        let records = stamped
            .into_iter()
            .map(|(_, ms, input_tokens, output_tokens)| TraceRecord {
                offset_ms: ms - first_ms,
                input_tokens,
                output_tokens,
            })
            .collect();
        Ok(Self { records })
    }

    /// A trace of `records`, which must be in arrival order starting at offset 0.
    pub fn from_records(records: Vec<TraceRecord>) -> Self {
        assert!(!records.is_empty(), "a trace holds at least one record");
        assert_eq!(records[0].offset_ms, 0, "a trace starts at offset 0");
        assert!(records.windows(2).all(|w| w[0].offset_ms <= w[1].offset_ms));
        Self { records }
    }

    /// The records in arrival order.
    pub fn records(&self) -> &[TraceRecord] {
        &self.records
    }

    /// Keeps only the first `n` records (`--requests`).
    pub fn truncate(&mut self, n: usize) {
        assert!(n >= 1, "a trace keeps at least one record");
        self.records.truncate(n);
    }

    /// The time from the first to the last arrival, in ms.
    pub fn span_ms(&self) -> u64 {
        self.records.last().map_or(0, |r| r.offset_ms)
    }
}

fn clip(text: &str) -> String {
    text.chars().take(80).collect()
}

fn parse_json_line(line: &str) -> Result<(u64, u64, u64), String> {
    let record: JsonRecord = serde_json::from_str(line).map_err(|e| format!("bad JSON record: {e}"))?;
    Ok((record.timestamp_ms, record.input_tokens, record.output_tokens))
}

fn parse_azure_line(line: &str) -> Result<(u64, u64, u64), String> {
    let fields: Vec<&str> = line.split(',').collect();
    let [stamp, input, output] = fields[..] else {
        return Err(format!("expected 3 comma-separated fields, got {}", fields.len()));
    };
    let tokens = |name: &str, text: &str| {
        text.trim()
            .parse::<u64>()
            .map_err(|_| format!("{name} {:?} is not a whole number", clip(text)))
    };
    Ok((
        parse_timestamp_ms(stamp.trim())?,
        tokens("ContextTokens", input)?,
        tokens("GeneratedTokens", output)?,
    ))
}

/// Parses `YYYY-MM-DD HH:MM:SS[.fraction]` (UTC) into Unix milliseconds. The
/// fraction may have any number of digits; digits past the millisecond are dropped.
pub fn parse_timestamp_ms(text: &str) -> Result<u64, String> {
    let bad = || format!("timestamp {:?} is not YYYY-MM-DD HH:MM:SS.fffffff", clip(text));
    let (date, time) = text.split_once(' ').ok_or_else(bad)?;
    let number = |part: &str, digits: usize| -> Result<u64, String> {
        if part.len() != digits || !part.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        part.parse().map_err(|_| bad())
    };
    let date: Vec<&str> = date.split('-').collect();
    let [year, month, day] = date[..] else {
        return Err(bad());
    };
    let (year, month, day) = (number(year, 4)?, number(month, 2)?, number(day, 2)?);
    let (clock, fraction) = time.split_once('.').unwrap_or((time, ""));
    let clock: Vec<&str> = clock.split(':').collect();
    let [hour, minute, second] = clock[..] else {
        return Err(bad());
    };
    let (hour, minute, second) = (number(hour, 2)?, number(minute, 2)?, number(second, 2)?);
    if !fraction.bytes().all(|b| b.is_ascii_digit()) || !(1..=12).contains(&month) || day == 0 {
        return Err(bad());
    }
    if day > days_in_month(year, month) || hour > 23 || minute > 59 || second > 60 {
        return Err(bad());
    }
    let millis: u64 = format!("{fraction:0<3}")[..3].parse().map_err(|_| bad())?;
    let days = days_from_civil(year, month, day);
    Ok(((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000 + millis)
}

fn is_leap(year: u64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: u64, month: u64) -> u64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the date, by counting whole years and months: the
/// traces are from 2023, so the loop is short and obviously right.
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let years: u64 = (1970..year).map(|y| if is_leap(y) { 366 } else { 365 }).sum();
    let months: u64 = (1..month).map(|m| days_in_month(year, m)).sum();
    years + months + day - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn azure(text: &str) -> Result<Trace, TraceError> {
        Trace::parse(Path::new("t.csv"), text, TraceFormat::Azure)
    }

    fn jsonl(text: &str) -> Result<Trace, TraceError> {
        Trace::parse(Path::new("t.jsonl"), text, TraceFormat::Jsonl)
    }

    #[test]
    fn timestamps_convert_to_unix_ms() {
        assert_eq!(parse_timestamp_ms("1970-01-01 00:00:00").unwrap(), 0);
        // 2023-11-16 18:17:03 UTC is 1700158623 s after the epoch.
        assert_eq!(
            parse_timestamp_ms("2023-11-16 18:17:03.9799600").unwrap(),
            1_700_158_623_979
        );
        assert_eq!(parse_timestamp_ms("2024-03-01 00:00:00.5").unwrap(), 1_709_251_200_500);
        for bad in [
            "2023-11-16T18:17:03",
            "2023-13-01 00:00:00",
            "2023-02-29 00:00:00",
            "x",
            "2023-11-16 25:00:00",
        ] {
            assert!(parse_timestamp_ms(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn azure_csv_with_crlf_and_no_trailing_newline() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n\
                    2023-11-16 18:17:03.9799600,4808,10\r\n\
                    2023-11-16 18:17:04.0319600,3180,8\r\n\
                    2023-11-16 18:18:04.0319600,110,27";
        let trace = azure(text).unwrap();
        assert_eq!(
            trace.records(),
            &[
                TraceRecord {
                    offset_ms: 0,
                    input_tokens: 4808,
                    output_tokens: 10
                },
                TraceRecord {
                    offset_ms: 52,
                    input_tokens: 3180,
                    output_tokens: 8
                },
                TraceRecord {
                    offset_ms: 60_052,
                    input_tokens: 110,
                    output_tokens: 27
                },
            ]
        );
        assert_eq!(trace.span_ms(), 60_052);
    }

    #[test]
    fn azure_errors_name_file_and_line() {
        let header = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
        let cases = [
            ("TIME,A,B\n".to_owned(), "t.csv:1: expected the header"),
            (
                format!("{header}2023-11-16 18:17:03.9,1,2\n2023-11-16 18:17:04,x,2\n"),
                "t.csv:3: ContextTokens \"x\"",
            ),
            (
                format!("{header}2023-11-16 18:17:03.9,1\n"),
                "t.csv:2: expected 3 comma-separated fields, got 2",
            ),
            (
                format!("{header}2023-11-16 18:17:03,1,-2\n"),
                "t.csv:2: GeneratedTokens \"-2\"",
            ),
            (
                format!("{header}2023-11-16 18:17:05,1,2\n2023-11-16 18:17:04,1,2"),
                "t.csv:3: timestamp goes back",
            ),
            (
                format!("{header}2023-11-16 18:17:05,1,3000000"),
                "t.csv:2: output tokens 3000000 exceed",
            ),
            (format!("{header}\n"), "t.csv: the trace holds no records"),
        ];
        for (text, expected) in cases {
            let error = azure(&text).unwrap_err().to_string();
            assert!(error.starts_with(expected), "{error:?} should start with {expected:?}");
        }
    }

    #[test]
    fn jsonl_parses_and_rebases_offsets() {
        let text = "{\"timestamp_ms\": 1000, \"input_tokens\": 10, \"output_tokens\": 5}\n\n\
                    {\"timestamp_ms\": 1500, \"input_tokens\": 7, \"output_tokens\": 0}\n";
        let trace = jsonl(text).unwrap();
        assert_eq!(
            trace.records(),
            &[
                TraceRecord {
                    offset_ms: 0,
                    input_tokens: 10,
                    output_tokens: 5
                },
                TraceRecord {
                    offset_ms: 500,
                    input_tokens: 7,
                    output_tokens: 0
                },
            ]
        );
    }

    #[test]
    fn jsonl_errors_name_file_and_line() {
        let ok = "{\"timestamp_ms\": 0, \"input_tokens\": 1, \"output_tokens\": 1}\n";
        for (bad, expected) in [
            (
                "{\"timestamp_ms\": 0, \"input_tokens\": 1}",
                "t.jsonl:2: bad JSON record: missing field `output_tokens`",
            ),
            (
                "{\"timestamp_ms\": -1, \"input_tokens\": 1, \"output_tokens\": 1}",
                "t.jsonl:2: bad JSON record",
            ),
            ("not json", "t.jsonl:2: bad JSON record"),
            (
                "{\"timestamp_ms\": 0, \"input_tokens\": 1, \"output_tokens\": 1, \"x\": 1}",
                "t.jsonl:2: bad JSON record: unknown field `x`",
            ),
        ] {
            let error = jsonl(&format!("{ok}{bad}\n")).unwrap_err().to_string();
            assert!(error.starts_with(expected), "{error:?} should start with {expected:?}");
        }
        let long = format!("{ok}{}\n", " ".repeat(10) + &"1".repeat(LINE_BYTES_MAX));
        assert!(jsonl(&long)
            .unwrap_err()
            .to_string()
            .starts_with("t.jsonl:2: line is longer"));
    }

    #[test]
    fn truncate_keeps_the_first_records() {
        let mut trace = jsonl(
            "{\"timestamp_ms\": 0, \"input_tokens\": 1, \"output_tokens\": 1}\n\
             {\"timestamp_ms\": 9, \"input_tokens\": 1, \"output_tokens\": 1}",
        )
        .unwrap();
        trace.truncate(1);
        assert_eq!(trace.records().len(), 1);
        assert_eq!(trace.span_ms(), 0);
    }

    #[test]
    fn the_shipped_azure_excerpt_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/azure_code_excerpt.csv");
        let trace = Trace::load(&path, TraceFormat::Azure).unwrap();
        assert_eq!(trace.records().len(), 400);
        assert_eq!(
            trace.records()[0],
            TraceRecord {
                offset_ms: 0,
                input_tokens: 4808,
                output_tokens: 10
            }
        );
        let missing = Trace::load(Path::new("/nonexistent/trace.csv"), TraceFormat::Azure).unwrap_err();
        assert!(missing.to_string().starts_with("/nonexistent/trace.csv: "));
    }
}
