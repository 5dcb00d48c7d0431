//! The rules of the names the directory stores: tenants' names (which are a
//! component of limit keys, `tenant:<name>:llm:rpm`), keys' names and model
//! names. A name breaking them is refused by field before anything changes.

use super::DirectoryError;

/// The longest tenant or key name: long enough for `team-search-prod-eu-west`
/// and its like, short enough to stay readable in logs and limit keys.
pub const NAME_BYTES_MAX: usize = 64;
/// The longest model name a scope may list: the gateway's model names are
/// limit-key components, themselves at most a limit key's 256 bytes; real
/// names (`claude-sonnet-4-5-20250929`) are far shorter.
pub const MODEL_NAME_BYTES_MAX: usize = 128;
/// The most models one scope lists: a scope names the models a team may use,
/// and a longer list is a mistake more likely than a need (the body stays
/// under the API's small size limit).
pub const SCOPE_MODELS_MAX: usize = 64;

/// Checks a tenant's name: 1..=[`NAME_BYTES_MAX`] bytes of `[A-Za-z0-9_.-]`,
/// starting with a letter or digit, so it is a valid limit-key component and
/// safe in a URL path, a log line and a metric label.
pub fn check_tenant_name(field: &str, name: &str) -> Result<(), DirectoryError> {
    check_name(field, name, false)
}

/// Checks a key's name: empty (no name), or the rule of a tenant's name.
pub fn check_key_name(field: &str, name: &str) -> Result<(), DirectoryError> {
    check_name(field, name, true)
}

fn check_name(field: &str, name: &str, empty_allowed: bool) -> Result<(), DirectoryError> {
    if name.is_empty() {
        return match empty_allowed {
            true => Ok(()),
            false => Err(DirectoryError::invalid(field, "must not be empty")),
        };
    }
    if name.len() > NAME_BYTES_MAX {
        return Err(DirectoryError::invalid(
            field,
            format!("is {} bytes, more than {NAME_BYTES_MAX}", name.len()),
        ));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) || !name.chars().all(allowed) {
        return Err(DirectoryError::invalid(
            field,
            "must be letters, digits, '_', '.' or '-', starting with a letter or digit",
        ));
    }
    Ok(())
}

/// Checks a scope's model list (`None`: every model): at most
/// [`SCOPE_MODELS_MAX`] names, each 1..=[`MODEL_NAME_BYTES_MAX`] bytes of a
/// limit key's characters without `:` (the gateway's rule for model names),
/// none twice. Whether each names a configured model is the server's check.
pub fn check_models(field: &str, models: &[String]) -> Result<(), DirectoryError> {
    if models.len() > SCOPE_MODELS_MAX {
        return Err(DirectoryError::invalid(
            field,
            format!("lists {} models, more than {SCOPE_MODELS_MAX}", models.len()),
        ));
    }
    for (i, model) in models.iter().enumerate() {
        let entry = format!("{field}[{i}]");
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '@' | '/' | '-');
        if model.is_empty() || model.len() > MODEL_NAME_BYTES_MAX || !model.chars().all(allowed) {
            return Err(DirectoryError::invalid(
                entry,
                format!("must be 1..={MODEL_NAME_BYTES_MAX} bytes of [A-Za-z0-9_.@/-]"),
            ));
        }
        if models[..i].contains(model) {
            return Err(DirectoryError::invalid(entry, format!("{model} appears twice")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_refused_by_length_and_characters() {
        assert!(check_tenant_name("name", "team-search_2.eu").is_ok());
        for bad in ["", "-lead", "a:b", "a b", "é", &"x".repeat(NAME_BYTES_MAX + 1)] {
            let error = check_tenant_name("name", bad).unwrap_err();
            assert!(error.to_string().starts_with("name: "), "{bad:?}: {error}");
        }
        assert!(check_key_name("name", "").is_ok(), "a key may have no name");
        assert!(check_key_name("name", "a/b").is_err());
    }

    #[test]
    fn model_lists_are_checked_entry_by_entry() {
        let models = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert!(check_models("models", &models(&["gpt-4o-mini", "meta/llama-3.1"])).is_ok());
        let error = check_models("models", &models(&["a", "b:c"])).unwrap_err();
        assert!(error.to_string().starts_with("models[1]: "), "{error}");
        let error = check_models("models", &models(&["a", "a"])).unwrap_err();
        assert!(error.to_string().contains("twice"), "{error}");
        let many: Vec<String> = (0..=SCOPE_MODELS_MAX).map(|i| format!("m{i}")).collect();
        assert!(check_models("models", &many).is_err());
    }
}
