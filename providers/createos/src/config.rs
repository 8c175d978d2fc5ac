//! The provider config: parsing, defaults and the API URL rules of the spec.
//!
//! Secret fields (`apiKey`) are the host's business: the host removes them
//! before the component sees the config, so they are accepted and left
//! untouched here, never read.

use serde_json::{Map, Value};

/// The CreateOS API origin used when the config names none.
pub const DEFAULT_API_URL: &str = "https://api.sb.createos.sh";
/// The shape used when the config names none.
pub const DEFAULT_SHAPE: &str = "s-1vcpu-1gb";
/// The command timeout used when neither the config nor the request sets one.
pub const DEFAULT_TIMEOUT_MS: u64 = 300_000;
/// The budget of one API request (and of each cleanup request) by default.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 30_000;
/// The longest timeout accepted (24 hours).
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;
/// The config field that holds the API key (removed by the host).
pub const SECRET_FIELD: &str = "apiKey";

/// The shapes of the CreateOS catalog (as of 2026-09).
pub const SHAPES: &[&str] = &[
    "s-1vcpu-256mb",
    "s-0.25vcpu-512mb",
    "s-0.5vcpu-1gb",
    "s-1vcpu-1gb",
    "s-1vcpu-2gb",
    "s-2vcpu-2gb",
    "s-2vcpu-4gb",
    "s-4vcpu-4gb",
    "s-4vcpu-8gb",
    "s-8vcpu-8gb",
    "s-8vcpu-16gb",
];

const KNOWN_FIELDS: &[&str] = &[
    "apiUrl",
    SECRET_FIELD,
    "shape",
    "rootfs",
    "region",
    "timeoutMs",
    "requestTimeoutMs",
    "reuseLease",
];

/// A validated provider config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The API origin, `scheme://host[:port]`, without `/v1`.
    pub api_origin: String,
    /// The sandbox shape.
    pub shape: String,
    /// The root filesystem image, when not the service's default.
    pub rootfs: Option<String>,
    /// The region, when not the service's default.
    pub region: Option<String>,
    /// The default command timeout and the lifecycle operation budget.
    pub timeout_ms: u64,
    /// The budget of each API request outside a command's run, and the
    /// fresh budget of each cleanup request.
    pub request_timeout_ms: u64,
    /// Whether released leases are paused for reuse instead of deleted.
    pub reuse_lease: bool,
}

/// The outcome of validating a config: what `validate-config` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validation {
    /// The config, when it is usable.
    pub config: Option<Config>,
    /// The normalised JSON object, when it is usable.
    pub normalized: Option<String>,
    /// Problems that do not stop the config from being used.
    pub warnings: Vec<String>,
    /// Problems that make it unusable.
    pub errors: Vec<String>,
}

/// Parses a config for an operation; any problem is an error message.
pub fn parse(json: &str) -> Result<Config, Vec<String>> {
    let validation = validate(json);
    match validation.config {
        Some(config) if validation.errors.is_empty() => Ok(config),
        _ => Err(validation.errors),
    }
}

/// Validates and normalises a config JSON object without any request.
pub fn validate(json: &str) -> Validation {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let object = match serde_json::from_str::<Value>(json) {
        Ok(Value::Object(object)) => object,
        Ok(_) => {
            errors.push("config must be a JSON object".to_string());
            return Validation::failed(errors);
        }
        Err(e) => {
            errors.push(format!(
                "config is not valid JSON (line {}, column {})",
                e.line(),
                e.column()
            ));
            return Validation::failed(errors);
        }
    };
    for key in object.keys() {
        if !KNOWN_FIELDS.contains(&key.as_str()) {
            warnings.push(format!("unknown config field `{key}` is ignored"));
        }
    }
    let api_origin = match optional_string(&object, "apiUrl", &mut errors) {
        Some(url) => normalize_api_url(&url).unwrap_or_else(|message| {
            errors.push(format!("apiUrl: {message}"));
            String::new()
        }),
        None => DEFAULT_API_URL.to_string(),
    };
    let shape =
        optional_string(&object, "shape", &mut errors).unwrap_or_else(|| DEFAULT_SHAPE.to_string());
    if !SHAPES.contains(&shape.as_str()) {
        errors.push(format!(
            "shape: `{}` is not a CreateOS shape (one of {})",
            printable(&shape),
            SHAPES.join(", ")
        ));
    }
    let rootfs = optional_string(&object, "rootfs", &mut errors);
    let region = optional_string(&object, "region", &mut errors);
    for (field, value) in [("rootfs", &rootfs), ("region", &region)] {
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
            errors.push("reuseLease: must be true or false".to_string());
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
        api_origin,
        shape,
        rootfs,
        region,
        timeout_ms,
        request_timeout_ms,
        reuse_lease,
    };
    let mut normalized = Map::new();
    normalized.insert("apiUrl".into(), Value::String(config.api_origin.clone()));
    if let Some(secret) = object.get(SECRET_FIELD) {
        // Left exactly as given (a secret reference, usually): the host owns it.
        normalized.insert(SECRET_FIELD.into(), secret.clone());
    }
    normalized.insert("shape".into(), Value::String(config.shape.clone()));
    if let Some(rootfs) = &config.rootfs {
        normalized.insert("rootfs".into(), Value::String(rootfs.clone()));
    }
    if let Some(region) = &config.region {
        normalized.insert("region".into(), Value::String(region.clone()));
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

impl Validation {
    /// What `validate-config` reports.
    pub fn into_contract(self) -> crate::types::ConfigValidation {
        crate::types::ConfigValidation {
            ok: self.errors.is_empty() && self.normalized.is_some(),
            api_origins: self.config.iter().map(|c| c.api_origin.clone()).collect(),
            budget: self.config.as_ref().map(|c| crate::types::OperationBudget {
                operation_ms: c.timeout_ms,
                request_ms: c.request_timeout_ms,
            }),
            warnings: self.warnings,
            errors: self.errors,
            normalized_config: self.normalized,
        }
    }

    fn failed(errors: Vec<String>) -> Validation {
        Validation {
            config: None,
            normalized: None,
            warnings: Vec::new(),
            errors,
        }
    }
}

fn optional_string(
    object: &Map<String, Value>,
    field: &str,
    errors: &mut Vec<String>,
) -> Option<String> {
    match object.get(field) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            errors.push(format!("{field}: must be a string"));
            None
        }
    }
}

/// A duration field in milliseconds, from 1 to [`MAX_TIMEOUT_MS`].
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
                    "{field}: must be an integer from 1 to {MAX_TIMEOUT_MS}"
                ));
                default
            }
        },
    }
}

/// Shows a config value in a message without control characters or
/// unbounded length.
fn printable(value: &str) -> String {
    value
        .chars()
        .take(64)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Normalises a configured API URL to its origin: `https:` only, or
/// `http:` for loopback hosts; no user-info, query, fragment, or path other
/// than `/`, `/v1` or `/v1/`. Messages never repeat the URL.
pub fn normalize_api_url(url: &str) -> Result<String, String> {
    provider_sdk::origin::normalize_url(url, &["", "/", "/v1", "/v1/"])
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn api_url_is_normalised_to_its_origin() {
        for (url, origin) in [
            ("https://api.sb.createos.sh", "https://api.sb.createos.sh"),
            ("https://api.sb.createos.sh/", "https://api.sb.createos.sh"),
            (
                "https://API.sb.createos.sh/v1",
                "https://api.sb.createos.sh",
            ),
            (
                "https://api.sb.createos.sh/v1/",
                "https://api.sb.createos.sh",
            ),
            (
                "https://api.sb.createos.sh:443/v1",
                "https://api.sb.createos.sh",
            ),
            (
                "https://api.example.com:8443",
                "https://api.example.com:8443",
            ),
            ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080"),
            ("http://localhost:9", "http://localhost:9"),
            ("http://[::1]:7000/", "http://[::1]:7000"),
        ] {
            assert_eq!(normalize_api_url(url).as_deref(), Ok(origin), "{url}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn unsafe_api_urls_are_rejected_without_echoing_them() {
        for url in [
            "http://api.sb.createos.sh",
            "http://10.0.0.1",
            "ftp://api.sb.createos.sh",
            "api.sb.createos.sh",
            "https://user:secret@api.sb.createos.sh",
            "https://api.sb.createos.sh/v1?key=secret",
            "https://api.sb.createos.sh/#secret",
            "https://api.sb.createos.sh/v2",
            "https://api.sb.createos.sh/v1/sandboxes",
            "https://",
            "https://bad_host",
            "https://api.sb.createos.sh:0",
            "https://api.sb.createos.sh:99999",
            "https://api.sb.createos.sh:+1",
            "http://localhost.evil.com",
        ] {
            let err = normalize_api_url(url).expect_err(url);
            assert!(
                !err.contains("secret") && !err.contains("createos"),
                "{err}"
            );
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn defaults_apply_and_normalised_config_round_trips() {
        let v = validate(r#"{"apiKey":{"secretRef":"s1"}}"#);
        assert!(v.errors.is_empty(), "{:?}", v.errors);
        let config = v.config.unwrap();
        assert_eq!(config.api_origin, DEFAULT_API_URL);
        assert_eq!(config.shape, DEFAULT_SHAPE);
        assert_eq!(config.timeout_ms, DEFAULT_TIMEOUT_MS);
        assert!(!config.reuse_lease);
        let normalized = v.normalized.unwrap();
        assert!(normalized.contains(r#""apiKey":{"secretRef":"s1"}"#));
        assert_eq!(parse(&normalized), Ok(config));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn every_problem_is_reported() {
        let v = validate(
            r#"{"apiUrl":"ftp://x","shape":"huge","timeoutMs":0,"reuseLease":"yes","rootfs":5,"extra":1}"#,
        );
        assert_eq!(v.errors.len(), 5, "{:?}", v.errors);
        assert_eq!(v.warnings, vec!["unknown config field `extra` is ignored"]);
        assert!(v.config.is_none() && v.normalized.is_none());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn non_objects_are_rejected() {
        assert_eq!(validate("[]").errors, vec!["config must be a JSON object"]);
        assert!(validate("{").errors[0].starts_with("config is not valid JSON"));
        assert!(parse("null").is_err());
    }
}
