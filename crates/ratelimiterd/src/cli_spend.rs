//! `ratelimiterd spend`: the gateway's spend report on a running server
//! (docs/http-api.md, "Spend"), printed as the server answers it: JSON, or CSV
//! ready for a spreadsheet.

use clap::{Args, ValueEnum};

/// The report's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SpendFormat {
    /// One object with the days, the grouping and a row per group.
    Json,
    /// A header row, then one line per group.
    Csv,
}

/// What `spend` asks for.
#[derive(Debug, Args)]
pub struct SpendArgs {
    /// The first day, YYYY-MM-DD in UTC (default: today).
    #[arg(long)]
    pub from: Option<String>,
    /// The last day, included (default: today).
    #[arg(long)]
    pub to: Option<String>,
    /// Fields to group by, comma-separated: tenant, key, model, deployment, day (none: one row of totals).
    #[arg(long)]
    pub group_by: Option<String>,
    /// The format printed.
    #[arg(long, value_enum, default_value = "json")]
    pub format: SpendFormat,
}

impl SpendArgs {
    /// The path and query of the request; the server checks the values.
    pub fn path(&self) -> String {
        let mut query = Vec::new();
        for (name, value) in [("from", &self.from), ("to", &self.to), ("group_by", &self.group_by)] {
            if let Some(value) = value {
                query.push(format!("{name}={}", encoded(value)));
            }
        }
        if self.format == SpendFormat::Csv {
            query.push("format=csv".to_owned());
        }
        let mut path = "/v1/admin/gateway/spend".to_owned();
        if !query.is_empty() {
            path.push('?');
            path.push_str(&query.join("&"));
        }
        path
    }
}

/// `text` percent-encoded but for letters, digits and `-_.,`.
fn encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b',' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// Sends the request and prints the report; an answer that is not a success
/// is the error (its JSON printed as the message).
pub async fn run(client: &ratelimiter::httpclient::HttpClient, args: &SpendArgs) -> Result<(), String> {
    let (status, answer) = client
        .admin_json("GET", &args.path(), None)
        .await
        .map_err(|e| e.to_string())?;
    let text = match answer {
        // CSV, which is not JSON, comes back as its text.
        serde_json::Value::String(text) => text,
        json => serde_json::to_string_pretty(&json).expect("json") + "\n",
    };
    if (200..300).contains(&status) {
        print!("{text}");
        Ok(())
    } else {
        Err(format!("{status}: {}", text.trim_end()))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// The `spend` subcommand's arguments parsed alone, as the command line
    /// (`cli.rs`) parses them under `ratelimiterd spend`.
    #[derive(Debug, Parser)]
    struct SpendLine {
        #[command(flatten)]
        args: SpendArgs,
    }

    /// The path `args` (the subcommand's name first) ask the server for.
    fn path(args: &[&str]) -> String {
        SpendLine::try_parse_from(args).unwrap().args.path()
    }

    #[test]
    fn each_option_is_a_parameter() {
        assert_eq!(path(&["spend"]), "/v1/admin/gateway/spend");
        assert_eq!(
            path(&[
                "spend",
                "--from",
                "2026-11-01",
                "--group-by",
                "tenant,day",
                "--format",
                "csv"
            ]),
            "/v1/admin/gateway/spend?from=2026-11-01&group_by=tenant,day&format=csv"
        );
        assert_eq!(
            path(&["spend", "--to", "a&b=c"]),
            "/v1/admin/gateway/spend?to=a%26b%3Dc"
        );
    }
}
