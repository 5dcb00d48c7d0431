//! `ratelimiterd tenants …` and `ratelimiterd keys …`: the gateway's tenants
//! and keys on a running server (docs/http-api.md, "Tenants and keys"),
//! printing the server's JSON answer like the other operator commands.

use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};

/// `tenants` operations.
#[derive(Debug, Subcommand)]
pub enum TenantsCommand {
    /// Create a tenant (POST /v1/admin/gateway/tenants); prints it.
    Create {
        /// Its name: 1..=64 of [A-Za-z0-9_.-], starting with a letter or digit.
        name: String,
        /// Its settings.
        #[command(flatten)]
        fields: TenantArgs,
    },
    /// List every tenant, the configuration's included.
    List,
    /// Show one tenant.
    Get {
        /// Its name.
        name: String,
    },
    /// Change a tenant's settings; the others stay.
    Update {
        /// Its name.
        name: String,
        /// The settings to change.
        #[command(flatten)]
        fields: TenantArgs,
        /// A setting to remove (no limit, every model, the lowest class); repeat for several.
        #[arg(long = "clear", value_name = "FIELD")]
        clear: Vec<String>,
    },
    /// Delete a tenant and revoke its keys.
    Delete {
        /// Its name.
        name: String,
    },
}

/// A tenant's settings on the command line.
#[derive(Debug, Args)]
pub struct TenantArgs {
    /// Its priority class (an entry of gateway.classes).
    #[arg(long)]
    pub class: Option<String>,
    /// Requests per minute over every model.
    #[arg(long)]
    pub rpm: Option<u64>,
    /// Calls in flight over every model.
    #[arg(long)]
    pub concurrency: Option<u64>,
    /// Tokens per rolling day.
    #[arg(long)]
    pub daily_tokens: Option<u64>,
    /// Calls open at once.
    #[arg(long)]
    pub connections_max: Option<u64>,
    /// Calls waiting in queues at once.
    #[arg(long)]
    pub queued_max: Option<u64>,
    /// A model it may use; repeat for several (none: every model).
    #[arg(long = "model", value_name = "MODEL")]
    pub models: Vec<String>,
    /// A budget in money, USD/PERIOD with PERIOD day, week, month or a
    /// rolling window such as 3600s (`500/month`); repeat for several (at
    /// most 3). On update, the budgets given replace the tenant's.
    #[arg(long = "budget", value_name = "USD/PERIOD", value_parser = parse_budget)]
    pub budgets: Vec<Value>,
}

/// `keys` operations.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key (POST /v1/admin/gateway/keys); prints it with the key, shown this once.
    Create(KeyArgs),
    /// List keys (never their text).
    List {
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Show one key.
    Get {
        /// Its id.
        id: String,
    },
    /// Change a key's budgets (PATCH /v1/admin/gateway/keys/ID): the budgets
    /// given replace the key's; its other settings are set at its creation.
    Update {
        /// Its id.
        id: String,
        /// A budget in money, USD/PERIOD with PERIOD day, week, month or a
        /// rolling window such as 3600s (`5/day`); repeat for several (at most 3).
        #[arg(long = "budget", value_name = "USD/PERIOD", value_parser = parse_budget)]
        budgets: Vec<Value>,
        /// `budgets`: remove every budget of the key.
        #[arg(long = "clear", value_name = "FIELD")]
        clear: Vec<String>,
    },
    /// Revoke a key: refused by every server of the fleet within a second.
    Revoke {
        /// Its id.
        id: String,
    },
    /// Replace a key by a new one of the same tenant, scope and limits; prints the new key.
    Rotate {
        /// Its id.
        id: String,
        /// How long the old key keeps working, in seconds.
        #[arg(long, default_value_t = 0)]
        grace_seconds: u64,
    },
}

/// A key's settings on the command line.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The tenant it charges.
    #[arg(long)]
    pub tenant: String,
    /// A label for people.
    #[arg(long)]
    pub name: Option<String>,
    /// A model it may use, within its tenant's; repeat for several.
    #[arg(long = "model", value_name = "MODEL")]
    pub models: Vec<String>,
    /// Its life, in seconds (none: until revoked).
    #[arg(long)]
    pub expires_in_seconds: Option<u64>,
    /// Its own requests per minute.
    #[arg(long)]
    pub rpm: Option<u64>,
    /// Its own calls in flight.
    #[arg(long)]
    pub concurrency: Option<u64>,
    /// Its own tokens per rolling day.
    #[arg(long)]
    pub daily_tokens: Option<u64>,
    /// Its own budget in money, USD/PERIOD with PERIOD day, week, month or a
    /// rolling window such as 3600s (`5/day`); repeat for several (at most 3).
    /// `keys update` changes them later.
    #[arg(long = "budget", value_name = "USD/PERIOD", value_parser = parse_budget)]
    pub budgets: Vec<Value>,
}

/// The suffix of a rolling window in a `--budget`'s PERIOD (`3600s`).
const WINDOW_SUFFIX: char = 's';

/// A `--budget USD/PERIOD` as the API's budget entry: `{"usd": 500, "period":
/// "month"}` or `{"usd": 5, "window_seconds": 3600}`. Refused here, before
/// anything is sent, when malformed; the server checks the ranges.
pub fn parse_budget(text: &str) -> Result<Value, String> {
    let usage =
        "expected USD/PERIOD, PERIOD one of day, week, month or a window in seconds such as 3600s (500/month, 5/3600s)";
    let (usd, period) = text.split_once('/').ok_or_else(|| format!("{text:?}: {usage}"))?;
    let amount: serde_json::Number =
        (usd.trim().parse()).map_err(|_| format!("{text:?}: the amount {usd:?} is not a number of USD; {usage}"))?;
    if amount.as_f64().is_none_or(|v| !v.is_finite() || v < 0.0) {
        return Err(format!(
            "{text:?}: the amount {usd:?} must be a number of USD, at least 0"
        ));
    }
    let period = period.trim();
    match period {
        "day" | "week" | "month" => Ok(json!({"usd": amount, "period": period})),
        _ => {
            let seconds = (period.strip_suffix(WINDOW_SUFFIX))
                .and_then(|digits| digits.parse::<u64>().ok())
                .filter(|seconds| *seconds > 0)
                .ok_or_else(|| format!("{text:?}: the period {period:?} is not one; {usage}"))?;
            Ok(json!({"usd": amount, "window_seconds": seconds}))
        }
    }
}

/// Inserts `value` under `name` when given.
fn put(body: &mut Map<String, Value>, name: &str, value: Option<Value>) {
    if let Some(value) = value {
        body.insert(name.to_owned(), value);
    }
}

impl TenantArgs {
    /// The body fields given on the command line.
    pub fn body(&self) -> Map<String, Value> {
        let mut body = Map::new();
        put(&mut body, "class", self.class.as_ref().map(|v| json!(v)));
        put(&mut body, "rpm", self.rpm.map(|v| json!(v)));
        put(&mut body, "concurrency", self.concurrency.map(|v| json!(v)));
        put(&mut body, "daily_tokens", self.daily_tokens.map(|v| json!(v)));
        put(&mut body, "connections_max", self.connections_max.map(|v| json!(v)));
        put(&mut body, "queued_max", self.queued_max.map(|v| json!(v)));
        put(
            &mut body,
            "models",
            (!self.models.is_empty()).then(|| json!(self.models)),
        );
        put(
            &mut body,
            "budgets",
            (!self.budgets.is_empty()).then(|| json!(self.budgets)),
        );
        body
    }
}

impl KeyArgs {
    /// The body of the create request.
    pub fn body(&self) -> Map<String, Value> {
        let mut body = Map::new();
        body.insert("tenant".to_owned(), json!(self.tenant));
        put(&mut body, "name", self.name.as_ref().map(|v| json!(v)));
        put(
            &mut body,
            "models",
            (!self.models.is_empty()).then(|| json!(self.models)),
        );
        put(
            &mut body,
            "expires_in_seconds",
            self.expires_in_seconds.map(|v| json!(v)),
        );
        put(&mut body, "rpm", self.rpm.map(|v| json!(v)));
        put(&mut body, "concurrency", self.concurrency.map(|v| json!(v)));
        put(&mut body, "daily_tokens", self.daily_tokens.map(|v| json!(v)));
        put(
            &mut body,
            "budgets",
            (!self.budgets.is_empty()).then(|| json!(self.budgets)),
        );
        body
    }
}

/// The request a `tenants` command sends: method, path and body; an update
/// that both sets and clears one field is refused before anything is sent
/// (which of the two the operator meant cannot be told).
pub fn tenants_request(command: &TenantsCommand) -> Result<(&'static str, String, Option<Value>), String> {
    const BASE: &str = "/v1/admin/gateway/tenants";
    Ok(match command {
        TenantsCommand::Create { name, fields } => {
            let mut body = fields.body();
            body.insert("name".to_owned(), json!(name));
            ("POST", BASE.to_owned(), Some(Value::Object(body)))
        }
        TenantsCommand::List => ("GET", BASE.to_owned(), None),
        TenantsCommand::Get { name } => ("GET", format!("{BASE}/{name}"), None),
        TenantsCommand::Update { name, fields, clear } => {
            let mut body = fields.body();
            for field in clear {
                if body.contains_key(field) {
                    return Err(format!(
                        "invalid_argument: --clear {field} and a new {field} in one update; give one of the two"
                    ));
                }
                body.insert(field.clone(), Value::Null);
            }
            ("PATCH", format!("{BASE}/{name}"), Some(Value::Object(body)))
        }
        TenantsCommand::Delete { name } => ("DELETE", format!("{BASE}/{name}"), None),
    })
}

/// The request a `keys` command sends: method, path and body. A key named by
/// anything but its id (its secret text, most likely) is refused here, before
/// the text leaves the machine in a URL a server or proxy may log.
pub fn keys_request(command: &KeysCommand) -> Result<(&'static str, String, Option<Value>), String> {
    const BASE: &str = "/v1/admin/gateway/keys";
    let named = |id: &str| {
        if crate::directory_api::is_key_id(id) {
            Ok(())
        } else {
            Err(format!("invalid_argument: {}", crate::directory_api::shown_key_id(id)))
        }
    };
    Ok(match command {
        KeysCommand::Create(args) => ("POST", BASE.to_owned(), Some(Value::Object(args.body()))),
        KeysCommand::List { tenant: None } => ("GET", BASE.to_owned(), None),
        KeysCommand::List { tenant: Some(tenant) } => ("GET", format!("{BASE}?tenant={tenant}"), None),
        KeysCommand::Get { id } => {
            named(id)?;
            ("GET", format!("{BASE}/{id}"), None)
        }
        KeysCommand::Update { id, budgets, clear } => {
            named(id)?;
            ("PATCH", format!("{BASE}/{id}"), Some(key_update_body(budgets, clear)?))
        }
        KeysCommand::Revoke { id } => {
            named(id)?;
            ("DELETE", format!("{BASE}/{id}"), None)
        }
        KeysCommand::Rotate { id, grace_seconds } => {
            named(id)?;
            (
                "POST",
                format!("{BASE}/{id}/rotate"),
                Some(json!({"grace_seconds": grace_seconds})),
            )
        }
    })
}

/// The body of `keys update`: the budgets given, or none with `--clear
/// budgets`; refused before anything is sent when it changes nothing, clears
/// another field, or both sets and clears the budgets.
fn key_update_body(budgets: &[Value], clear: &[String]) -> Result<Value, String> {
    if let Some(other) = clear.iter().find(|f| *f != "budgets") {
        return Err(format!(
            "invalid_argument: --clear {other}: only a key's budgets change after its creation"
        ));
    }
    match (budgets.is_empty(), clear.is_empty()) {
        (false, true) => Ok(json!({ "budgets": budgets })),
        (true, false) => Ok(json!({ "budgets": null })),
        (false, false) => {
            Err("invalid_argument: --clear budgets and a new --budget in one update; give one of the two".to_owned())
        }
        (true, true) => Err(
            "invalid_argument: nothing to change: give --budget USD/PERIOD (repeatable) or --clear budgets".to_owned(),
        ),
    }
}

/// Sends `request` and prints the answer; an answer that is not a success is
/// the error (its JSON printed as the message).
pub async fn run(
    client: &ratelimiter::httpclient::HttpClient,
    (method, path, body): (&'static str, String, Option<Value>),
) -> Result<(), String> {
    // Names are checked by the server; a name that needs escaping is refused there.
    let (status, answer) = client
        .admin_json(method, &path, body.as_ref())
        .await
        .map_err(|e| e.to_string())?;
    let text = serde_json::to_string_pretty(&answer).expect("json");
    if (200..300).contains(&status) {
        println!("{text}");
        Ok(())
    } else {
        Err(format!("{status}: {text}"))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// The `tenants` and `keys` subcommands parsed alone, as the command line
    /// (`cli.rs`) parses them under `ratelimiterd`.
    #[derive(Debug, Parser)]
    enum DirectoryLine {
        Tenants {
            #[command(subcommand)]
            command: TenantsCommand,
        },
        Keys {
            #[command(subcommand)]
            command: KeysCommand,
        },
    }

    /// The method, path and body the command line `args` send.
    /// A key's id as the directory makes them (a ULID).
    const KEY_ID: &str = "01JD0000000000000000000001";

    fn request(args: &[&str]) -> (&'static str, String, Option<Value>) {
        match DirectoryLine::try_parse_from(std::iter::once("ratelimiterd").chain(args.iter().copied())).unwrap() {
            DirectoryLine::Tenants { command } => tenants_request(&command).unwrap(),
            DirectoryLine::Keys { command } => keys_request(&command).unwrap(),
        }
    }

    #[test]
    fn each_command_sends_its_method_path_and_body() {
        let (method, path, body) = request(&[
            "tenants", "create", "search", "--rpm", "60", "--model", "a", "--model", "b",
        ]);
        assert_eq!((method, path.as_str()), ("POST", "/v1/admin/gateway/tenants"));
        assert_eq!(
            body.unwrap(),
            json!({"name": "search", "rpm": 60, "models": ["a", "b"]})
        );
        let (method, path, body) = request(&["tenants", "update", "search", "--concurrency", "2", "--clear", "rpm"]);
        assert_eq!((method, path.as_str()), ("PATCH", "/v1/admin/gateway/tenants/search"));
        assert_eq!(body.unwrap(), json!({"concurrency": 2, "rpm": null}));
        assert_eq!(request(&["tenants", "delete", "search"]).0, "DELETE");
        let (method, _, body) = request(&["keys", "create", "--tenant", "search", "--expires-in-seconds", "60"]);
        assert_eq!(
            (method, body.unwrap()),
            ("POST", json!({"tenant": "search", "expires_in_seconds": 60}))
        );
        assert_eq!(
            request(&["keys", "list", "--tenant", "search"]).1,
            "/v1/admin/gateway/keys?tenant=search"
        );
        assert_eq!(
            request(&["keys", "revoke", KEY_ID]),
            ("DELETE", format!("/v1/admin/gateway/keys/{KEY_ID}"), None)
        );
        let (method, path, body) = request(&["keys", "rotate", KEY_ID, "--grace-seconds", "30"]);
        assert_eq!(
            (method, path, body.unwrap()),
            (
                "POST",
                format!("/v1/admin/gateway/keys/{KEY_ID}/rotate"),
                json!({"grace_seconds": 30})
            )
        );
    }

    #[test]
    fn budgets_are_sent_with_their_periods_and_a_malformed_one_is_refused_before_sending() {
        let (_, _, body) = request(&[
            "tenants",
            "create",
            "search",
            "--budget",
            "500/month",
            "--budget",
            "40/day",
            "--budget",
            "2.5/3600s",
        ]);
        assert_eq!(
            body.unwrap(),
            json!({"name": "search", "budgets": [{"usd": 500, "period": "month"},
                {"usd": 40, "period": "day"}, {"usd": 2.5, "window_seconds": 3600}]})
        );
        let (method, path, body) = request(&["tenants", "update", "search", "--budget", "10/week"]);
        assert_eq!((method, path.as_str()), ("PATCH", "/v1/admin/gateway/tenants/search"));
        assert_eq!(body.unwrap(), json!({"budgets": [{"usd": 10, "period": "week"}]}));
        let (_, _, body) = request(&["keys", "create", "--tenant", "search", "--budget", "5/day"]);
        assert_eq!(
            body.unwrap(),
            json!({"tenant": "search", "budgets": [{"usd": 5, "period": "day"}]})
        );
        let (method, path, body) = request(&["keys", "update", KEY_ID, "--budget", "5/day", "--budget", "1/3600s"]);
        assert_eq!(
            (method, path, body.unwrap()),
            (
                "PATCH",
                format!("/v1/admin/gateway/keys/{KEY_ID}"),
                json!({"budgets": [{"usd": 5, "period": "day"}, {"usd": 1, "window_seconds": 3600}]})
            )
        );
        let (_, _, body) = request(&["keys", "update", KEY_ID, "--clear", "budgets"]);
        assert_eq!(body.unwrap(), json!({"budgets": null}));
        for (args, expected) in [
            (&["--clear", "rpm"][..], "only a key's budgets"),
            (&["--budget", "5/day", "--clear", "budgets"][..], "one of the two"),
            (&[][..], "nothing to change"),
        ] {
            let line = [&["ratelimiterd", "keys", "update", KEY_ID][..], args].concat();
            let DirectoryLine::Keys { command } = DirectoryLine::try_parse_from(line).unwrap() else {
                panic!("a keys command");
            };
            let error = keys_request(&command).unwrap_err();
            assert!(error.contains(expected), "{args:?}: {error}");
        }
        for bad in ["500", "500/fortnight", "five/day", "-1/day", "5/0s", "5/s", "5/3600"] {
            let flag = format!("--budget={bad}");
            let line = ["ratelimiterd", "tenants", "create", "t", flag.as_str()];
            let error = DirectoryLine::try_parse_from(line).unwrap_err().to_string();
            assert!(
                error.contains("USD/PERIOD") || error.contains("at least 0"),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn an_update_that_sets_and_clears_one_field_is_refused_before_sending() {
        let line = [
            "ratelimiterd",
            "tenants",
            "update",
            "t",
            "--budget",
            "5/day",
            "--clear",
            "budgets",
        ];
        let DirectoryLine::Tenants { command } = DirectoryLine::try_parse_from(line).unwrap() else {
            panic!("a tenants command");
        };
        let error = tenants_request(&command).unwrap_err();
        assert!(error.contains("--clear budgets"), "{error}");
        let line = [
            "ratelimiterd",
            "tenants",
            "update",
            "t",
            "--rpm",
            "5",
            "--clear",
            "budgets",
        ];
        let DirectoryLine::Tenants { command } = DirectoryLine::try_parse_from(line).unwrap() else {
            panic!("a tenants command");
        };
        let (_, _, body) = tenants_request(&command).unwrap();
        assert_eq!(body.unwrap(), json!({"rpm": 5, "budgets": null}));
    }

    #[test]
    fn a_key_named_by_its_text_is_refused_before_sending_showing_four_characters() {
        let text = "rlk-SecretTextOfAKey0123456789wxyz";
        for verb in ["get", "revoke", "rotate"] {
            let line = ["ratelimiterd", "keys", verb, text];
            let DirectoryLine::Keys { command } = DirectoryLine::try_parse_from(line).unwrap() else {
                panic!("a keys command");
            };
            let error = keys_request(&command).unwrap_err();
            assert!(
                error.contains("…wxyz") && !error.contains("SecretText"),
                "{verb}: {error}"
            );
        }
        let (_, path, _) = request(&["keys", "revoke", KEY_ID]);
        assert_eq!(path, format!("/v1/admin/gateway/keys/{KEY_ID}"));
    }
}
