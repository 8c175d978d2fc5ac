//! The Daytona provider's config: two API URLs (the API and the toolbox
//! proxy), the sandbox's snapshot and target, and the time budgets.

use provider_sdk::origin::{split_url, Origin};
use provider_sdk::types::{ConfigValidation, OperationBudget};
use serde_json::{Map, Value};

/// The public API (`apiUrl`).
pub const DEFAULT_API_URL: &str = "https://app.daytona.io/api";
/// The public toolbox proxy (`toolboxUrl`).
pub const DEFAULT_TOOLBOX_URL: &str = "https://proxy.app.daytona.io/toolbox";
/// A lifecycle operation's budget and a command's default timeout.
pub const DEFAULT_TIMEOUT_MS: u64 = 300_000;
/// One request's budget, and each cleanup request's.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 30_000;
/// The longest budget accepted (24 hours).
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;
/// The config field holding the API key (removed by the host).
pub const SECRET_FIELD: &str = "apiKey";

const KNOWN_FIELDS: &[&str] = &[
    "apiUrl",
    "toolboxUrl",
    SECRET_FIELD,
    "organizationId",
    "snapshot",
    "target",
    "timeoutMs",
    "requestTimeoutMs",
    "reuseLease",
];

/// One API base: where requests go and the path they start with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base {
    /// `scheme://host[:port]`, normalised.
    pub origin: String,
    /// The base path (`/api`), without a trailing slash; may be empty.
    pub path: String,
}

impl Base {
    fn parse(field: &str, url: &str, errors: &mut Vec<String>) -> Base {
        match split_url(url) {
            Ok((origin, path)) => Base { origin, path },
            Err(message) => {
                errors.push(format!("{field}: {message}"));
                Base {
                    origin: String::new(),
                    path: String::new(),
                }
            }
        }
    }

    /// The origin, parsed for the platform.
    pub fn origin(&self) -> Origin {
        // Normalised by `split_url`, so it always parses.
        Origin::parse(&self.origin).unwrap_or(Origin {
            https: true,
            authority: String::new(),
        })
    }

    fn url(&self) -> String {
        format!("{}{}", self.origin, self.path)
    }
}

/// A valid config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The main API (`/sandbox`...).
    pub api: Base,
    /// The toolbox proxy (`/{sandboxId}/process/...`).
    pub toolbox: Base,
    /// Sent as `X-Daytona-Organization-ID` when set.
    pub organization_id: Option<String>,
    /// The snapshot sandboxes are created from (the service's default when unset).
    pub snapshot: Option<String>,
    /// The region (`target`) sandboxes are created in.
    pub target: Option<String>,
    /// A lifecycle operation's budget and a command's default timeout.
    pub timeout_ms: u64,
    /// One request's budget, and each cleanup request's.
    pub request_timeout_ms: u64,
    /// Whether a release stops the sandbox for reuse instead of deleting it.
    pub reuse_lease: bool,
}

/// The outcome of validating a config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validation {
    /// The config, when usable.
    pub config: Option<Config>,
    /// The normalised JSON, when usable.
    pub normalized: Option<String>,
    /// Problems that do not stop the config from being used.
    pub warnings: Vec<String>,
    /// Problems that make it unusable.
    pub errors: Vec<String>,
}

impl Validation {
    /// What `validate-config` reports: the API origin first, then the
    /// toolbox origin (the order of `describe`'s origin fields).
    pub fn into_contract(self) -> ConfigValidation {
        ConfigValidation {
            ok: self.errors.is_empty() && self.normalized.is_some(),
            api_origins: self
                .config
                .iter()
                .flat_map(|c| [c.api.origin.clone(), c.toolbox.origin.clone()])
                .collect(),
            budget: self.config.as_ref().map(|c| OperationBudget {
                operation_ms: c.timeout_ms,
                request_ms: c.request_timeout_ms,
            }),
            warnings: self.warnings,
            errors: self.errors,
            normalized_config: self.normalized,
        }
    }
}

/// Parses a config for an operation; any problem is an error message.
pub fn parse(json: &str) -> Result<Config, Vec<String>> {
    let validation = validate(json);
    match validation.config {
        Some(config) => Ok(config),
        None => Err(validation.errors),
    }
}

/// Checks and normalises a config (no request).
pub fn validate(json: &str) -> Validation {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let object = match serde_json::from_str::<Value>(json) {
        Ok(Value::Object(object)) => object,
        Ok(_) => return failed("config must be a JSON object".into()),
        Err(e) => {
            return failed(format!(
                "config is not valid JSON (line {}, column {})",
                e.line(),
                e.column()
            ))
        }
    };
    for key in object.keys() {
        if !KNOWN_FIELDS.contains(&key.as_str()) {
            warnings.push(format!("unknown config field `{key}` is ignored"));
        }
    }
    let api_url = string(&object, "apiUrl", &mut errors).unwrap_or_else(|| DEFAULT_API_URL.into());
    let api = Base::parse("apiUrl", &api_url, &mut errors);
    let toolbox_url =
        string(&object, "toolboxUrl", &mut errors).unwrap_or_else(|| DEFAULT_TOOLBOX_URL.into());
    let toolbox = Base::parse("toolboxUrl", &toolbox_url, &mut errors);
    let organization_id = string(&object, "organizationId", &mut errors);
    let snapshot = string(&object, "snapshot", &mut errors);
    let target = string(&object, "target", &mut errors);
    for (field, value) in [
        ("organizationId", &organization_id),
        ("snapshot", &snapshot),
        ("target", &target),
    ] {
        if let Some(value) = value {
            if value.is_empty() || value.len() > 200 || value.chars().any(char::is_control) {
                errors.push(format!("{field}: must be 1 to 200 printable characters"));
            }
        }
    }
    let timeout_ms = milliseconds(&object, "timeoutMs", DEFAULT_TIMEOUT_MS, &mut errors);
    let request_timeout_ms = milliseconds(
        &object,
        "requestTimeoutMs",
        DEFAULT_REQUEST_TIMEOUT_MS,
        &mut errors,
    );
    let reuse_lease = match object.get("reuseLease") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            errors.push("reuseLease: must be true or false".into());
            false
        }
    };
    if !errors.is_empty() {
        return Validation {
            config: None,
            normalized: None,
            warnings,
            errors,
        };
    }
    let config = Config {
        api,
        toolbox,
        organization_id,
        snapshot,
        target,
        timeout_ms,
        request_timeout_ms,
        reuse_lease,
    };
    let mut normalized = Map::new();
    normalized.insert("apiUrl".into(), Value::String(config.api.url()));
    normalized.insert("toolboxUrl".into(), Value::String(config.toolbox.url()));
    if let Some(secret) = object.get(SECRET_FIELD) {
        // Left exactly as given (a secret reference, usually): the host owns it.
        normalized.insert(SECRET_FIELD.into(), secret.clone());
    }
    for (field, value) in [
        ("organizationId", &config.organization_id),
        ("snapshot", &config.snapshot),
        ("target", &config.target),
    ] {
        if let Some(value) = value {
            normalized.insert(field.into(), Value::String(value.clone()));
        }
    }
    normalized.insert("timeoutMs".into(), Value::from(config.timeout_ms));
    normalized.insert(
        "requestTimeoutMs".into(),
        Value::from(config.request_timeout_ms),
    );
    normalized.insert("reuseLease".into(), Value::Bool(config.reuse_lease));
    Validation {
        normalized: Some(Value::Object(normalized).to_string()),
        config: Some(config),
        warnings,
        errors,
    }
}

fn failed(error: String) -> Validation {
    Validation {
        config: None,
        normalized: None,
        warnings: Vec::new(),
        errors: vec![error],
    }
}

fn string(object: &Map<String, Value>, field: &str, errors: &mut Vec<String>) -> Option<String> {
    match object.get(field) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            errors.push(format!("{field}: must be a string"));
            None
        }
    }
}

fn milliseconds(
    object: &Map<String, Value>,
    field: &str,
    default: u64,
    errors: &mut Vec<String>,
) -> u64 {
    match object.get(field) {
        None | Some(Value::Null) => default,
        Some(value) => match value.as_u64() {
            Some(ms) if (1..=MAX_TIMEOUT_MS).contains(&ms) => ms,
            _ => {
                errors.push(format!(
                    "{field}: must be a whole number of milliseconds from 1 to {MAX_TIMEOUT_MS}"
                ));
                default
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn defaults_name_both_public_origins() {
        let v = validate("{}").into_contract();
        assert!(v.ok, "{v:?}");
        assert_eq!(
            v.api_origins,
            vec![
                "https://app.daytona.io".to_string(),
                "https://proxy.app.daytona.io".to_string()
            ]
        );
        let budget = v.budget.unwrap();
        assert_eq!(
            (budget.operation_ms, budget.request_ms),
            (DEFAULT_TIMEOUT_MS, DEFAULT_REQUEST_TIMEOUT_MS)
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn local_urls_keep_their_base_paths_and_validate_again_to_themselves() {
        let json = r#"{"apiUrl":"http://127.0.0.1:9/daytona/api/","toolboxUrl":"http://127.0.0.1:10/toolbox","apiKey":{"env":"K"}}"#;
        let v = validate(json);
        let config = v.config.clone().unwrap();
        assert_eq!(config.api.path, "/daytona/api");
        assert_eq!(config.toolbox.origin, "http://127.0.0.1:10");
        let normalized = v.normalized.unwrap();
        assert_eq!(validate(&normalized).normalized.unwrap(), normalized);
        assert!(normalized.contains(r#""apiKey":{"env":"K"}"#));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn bad_fields_are_named_and_urls_never_repeated() {
        let v = validate(
            r#"{"apiUrl":"http://secret-host.example/api","toolboxUrl":5,"timeoutMs":0,"reuseLease":"y"}"#,
        );
        assert!(v.config.is_none());
        let text = v.errors.join("\n");
        for field in ["apiUrl", "toolboxUrl", "timeoutMs", "reuseLease"] {
            assert!(text.contains(field), "{text}");
        }
        assert!(!text.contains("secret-host"), "{text}");
        assert!(validate("[]").errors[0].contains("JSON object"));
    }
}
