//! Provider configs: the rules every provider's config follows (a JSON
//! object, unknown fields warned about, the secret field left as given,
//! budgets in milliseconds) and what `validate-config` reports.
//!
//! A provider describes its own fields: it implements [`ProviderConfig`]
//! with a [`ConfigObject`] that reads each field and collects every
//! problem, so one answer names them all.

use crate::acquire::check_adapter_type;
use crate::egress::{normalize_list, Egress};
use crate::types::{ConfigValidation, OperationBudget};
use serde_json::{Map, Value};

/// A lifecycle operation's budget and a command's default timeout, when
/// the config sets no `timeoutMs`.
pub const DEFAULT_TIMEOUT_MS: u64 = 300_000;
/// One request's budget, and each cleanup request's, when the config sets
/// no `requestTimeoutMs`.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 30_000;
/// The longest budget or timeout accepted (24 hours).
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;

/// A config's time budgets (`timeoutMs`, `requestTimeoutMs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// `timeoutMs`: a lifecycle operation's budget and a command's default
    /// timeout.
    pub timeout_ms: u64,
    /// `requestTimeoutMs`: each request's budget outside a command's run,
    /// and each cleanup request's, afresh.
    pub request_timeout_ms: u64,
}

impl Budget {
    /// As the contract reports it.
    pub fn contract(self) -> OperationBudget {
        OperationBudget {
            operation_ms: self.timeout_ms,
            request_ms: self.request_timeout_ms,
        }
    }
}

/// A provider's parsed config.
pub trait ProviderConfig: Sized {
    /// Checks and normalises a config JSON object without any request.
    fn validate(json: &str) -> Validation<Self>;

    /// The API origins the host must allow, the one requests go to by
    /// default first (the order of `describe`'s origin fields).
    fn api_origins(&self) -> Vec<String>;

    /// The operation and request budgets; `None` leaves them to the host.
    fn budget(&self) -> Option<OperationBudget> {
        None
    }

    /// Parses a config for an operation; any problem is an error message.
    fn parse(json: &str) -> Result<Self, Vec<String>> {
        let validation = Self::validate(json);
        match validation.config {
            Some(config) if validation.errors.is_empty() => Ok(config),
            _ => Err(validation.errors),
        }
    }
}

/// The outcome of validating a config: what `validate-config` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validation<C> {
    /// The config, when it is usable.
    pub config: Option<C>,
    /// The normalised JSON object, when it is usable.
    pub normalized: Option<String>,
    /// Problems that do not stop the config from being used.
    pub warnings: Vec<String>,
    /// Problems that make it unusable.
    pub errors: Vec<String>,
}

impl<C: ProviderConfig> Validation<C> {
    /// What `validate-config` reports.
    pub fn into_contract(self) -> ConfigValidation {
        ConfigValidation {
            ok: self.errors.is_empty() && self.normalized.is_some(),
            api_origins: self
                .config
                .iter()
                .flat_map(ProviderConfig::api_origins)
                .collect(),
            budget: self.config.as_ref().and_then(ProviderConfig::budget),
            warnings: self.warnings,
            errors: self.errors,
            normalized_config: self.normalized,
        }
    }
}

/// A config JSON object being read: each read records its field's
/// problem and goes on, so that every problem is reported at once.
#[derive(Debug)]
pub struct ConfigObject {
    object: Map<String, Value>,
    /// Problems that make the config unusable.
    pub errors: Vec<String>,
    /// Problems that do not.
    pub warnings: Vec<String>,
}

impl ConfigObject {
    /// Reads a JSON object and warns about each field not in `known`.
    /// Anything but a JSON object is the one problem reported: the object
    /// is then empty.
    pub fn parse(json: &str, known: &[&str]) -> ConfigObject {
        let (object, errors) = match serde_json::from_str::<Value>(json) {
            Ok(Value::Object(object)) => (object, Vec::new()),
            Ok(_) => (Map::new(), vec!["config must be a JSON object".into()]),
            Err(e) => (
                Map::new(),
                vec![format!(
                    "config is not valid JSON (line {}, column {})",
                    e.line(),
                    e.column()
                )],
            ),
        };
        let warnings = object
            .keys()
            .filter(|key| !known.contains(&key.as_str()))
            .map(|key| format!("unknown config field `{key}` is ignored"))
            .collect();
        ConfigObject {
            object,
            errors,
            warnings,
        }
    }

    /// A field's value as given (`None` when absent).
    pub fn get(&self, field: &str) -> Option<&Value> {
        self.object.get(field)
    }

    /// Records a problem with the config.
    pub fn error(&mut self, message: String) {
        self.errors.push(message);
    }

    /// An optional string field (absent or `null`: `None`).
    pub fn string(&mut self, field: &str) -> Option<String> {
        match self.object.get(field) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                self.error(format!("{field}: must be a string"));
                None
            }
        }
    }

    /// An optional name (an image, a region, an id): 1 to 200 printable
    /// characters.
    pub fn name(&mut self, field: &str) -> Option<String> {
        let value = self.string(field)?;
        if value.is_empty() || value.len() > 200 || value.chars().any(char::is_control) {
            self.error(format!("{field}: must be 1 to 200 printable characters"));
        }
        Some(value)
    }

    /// A duration in milliseconds, from 1 to [`MAX_TIMEOUT_MS`]; `default`
    /// when absent.
    pub fn milliseconds(&mut self, field: &str, default: u64) -> u64 {
        match self.object.get(field) {
            None | Some(Value::Null) => default,
            Some(value) => match value.as_u64() {
                Some(ms) if (1..=MAX_TIMEOUT_MS).contains(&ms) => ms,
                _ => {
                    self.error(format!(
                        "{field}: must be a whole number of milliseconds from 1 to {MAX_TIMEOUT_MS}"
                    ));
                    default
                }
            },
        }
    }

    /// The budgets (`timeoutMs`, `requestTimeoutMs`), the defaults when
    /// absent.
    pub fn budget(&mut self) -> Budget {
        Budget {
            timeout_ms: self.milliseconds("timeoutMs", DEFAULT_TIMEOUT_MS),
            request_timeout_ms: self.milliseconds("requestTimeoutMs", DEFAULT_REQUEST_TIMEOUT_MS),
        }
    }

    /// A boolean field, `false` when absent.
    pub fn flag(&mut self, field: &str) -> bool {
        match self.object.get(field) {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                self.error(format!("{field}: must be true or false"));
                false
            }
        }
    }

    /// An optional whole number from `min` to `max` (seconds, say).
    pub fn bounded(&mut self, field: &str, min: u64, max: u64) -> Option<u64> {
        match self.object.get(field) {
            None | Some(Value::Null) => None,
            Some(value) => match value.as_u64() {
                Some(n) if (min..=max).contains(&n) => Some(n),
                _ => {
                    self.error(format!(
                        "{field}: must be a whole number from {min} to {max}"
                    ));
                    None
                }
            },
        }
    }

    /// An optional egress allow-list (an array of strings), normalised as
    /// [`crate::egress::normalize_list`] does (`["*"]` is unrestricted).
    pub fn egress_list(&mut self, field: &str) -> Option<Egress> {
        let list: Option<Vec<String>> = match self.object.get(field) {
            None | Some(Value::Null) => return None,
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| item.as_str().map(str::to_string))
                .collect(),
            Some(_) => None,
        };
        let Some(list) = list else {
            self.error(format!("{field}: must be an array of strings"));
            return None;
        };
        match normalize_list(&list) {
            Ok(egress) => Some(egress),
            Err(message) => {
                self.error(format!("{field}: {message}"));
                None
            }
        }
    }

    /// An optional object from adapter types
    /// ([`crate::acquire::check_adapter_type`]) to names ([`Self::name`]'s
    /// rules): an image per agent adapter ([`name_for`] reads it). Empty
    /// when absent or bad.
    pub fn names_by_adapter(&mut self, field: &str) -> Map<String, Value> {
        let map = match self.object.get(field) {
            None | Some(Value::Null) => return Map::new(),
            Some(Value::Object(map)) => map.clone(),
            Some(_) => Map::new(),
        };
        let good = |(adapter, value): (&String, &Value)| {
            let name = value.as_str().unwrap_or_default();
            check_adapter_type(adapter).is_ok()
                && !name.is_empty()
                && name.len() <= 200
                && !name.chars().any(char::is_control)
        };
        if matches!(self.object.get(field), Some(Value::Object(_))) && map.iter().all(good) {
            return map;
        }
        self.error(format!(
            "{field}: must be an object mapping adapter types (1-64 of letters, digits, '_', '-') to names of 1 to 200 printable characters"
        ));
        Map::new()
    }

    /// The outcome: with any problem, no config; otherwise `config` and
    /// its normalised JSON, the fields of `normalized` (a JSON object)
    /// without their `null`s, and `secret_field` exactly as given (a
    /// secret reference, usually: the host owns it).
    pub fn finish<C>(self, config: C, normalized: Value, secret_field: &str) -> Validation<C> {
        if !self.errors.is_empty() {
            return Validation {
                config: None,
                normalized: None,
                warnings: self.warnings,
                errors: self.errors,
            };
        }
        let mut object = match normalized {
            Value::Object(object) => object,
            _ => Map::new(),
        };
        object.retain(|_, value| !value.is_null());
        if let Some(secret) = self.object.get(secret_field) {
            object.insert(secret_field.into(), secret.clone());
        }
        Validation {
            config: Some(config),
            normalized: Some(Value::Object(object).to_string()),
            warnings: self.warnings,
            errors: self.errors,
        }
    }
}

/// The name a [`ConfigObject::names_by_adapter`] object gives `adapter`,
/// else `default`.
pub fn name_for<'c>(
    by_adapter: &'c Map<String, Value>,
    adapter: Option<&str>,
    default: Option<&'c String>,
) -> Option<&'c str> {
    adapter
        .and_then(|adapter| by_adapter.get(adapter)?.as_str())
        .or(default.map(String::as_str))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn every_problem_is_named_once_and_nulls_are_absent() {
        let mut object = ConfigObject::parse(
            r#"{"a":5,"b":"","ms":0,"flag":"y","extra":1,"key":{"env":"K"}}"#,
            &["a", "b", "ms", "flag", "key"],
        );
        assert_eq!(object.string("a"), None);
        assert_eq!(object.name("b").as_deref(), Some(""));
        assert_eq!(object.milliseconds("ms", 7), 7);
        assert!(!object.flag("flag"));
        assert_eq!(object.errors.len(), 4, "{:?}", object.errors);
        assert_eq!(object.warnings, ["unknown config field `extra` is ignored"]);
        let clean = ConfigObject::parse(r#"{"key":{"env":"K"}}"#, &["key"]);
        let done = clean.finish((), serde_json::json!({"x": 1, "y": null}), "key");
        assert_eq!(done.normalized.unwrap(), r#"{"key":{"env":"K"},"x":1}"#);
        let mut policy = ConfigObject::parse(
            r#"{"s":59,"t":60,"e":[" a.com "],"star":["*"],"bad":["*","a"],"m":{"claude_local":"img"},"mb":{"bad key":"x"},"mn":{"a":""}}"#,
            &[],
        );
        assert_eq!(policy.bounded("s", 60, 86_400), None);
        assert_eq!(policy.bounded("t", 60, 86_400), Some(60));
        assert_eq!(policy.bounded("absent", 60, 86_400), None);
        assert_eq!(
            policy.egress_list("e"),
            Some(normalize_list(&["a.com".into()]).unwrap())
        );
        assert_eq!(policy.egress_list("star"), Some(Egress::Unrestricted));
        assert_eq!(policy.egress_list("bad"), None);
        let by_adapter = policy.names_by_adapter("m");
        assert_eq!(
            name_for(&by_adapter, Some("claude_local"), None),
            Some("img")
        );
        let fallback = "base".to_string();
        assert_eq!(
            name_for(&by_adapter, Some("other"), Some(&fallback)),
            Some("base")
        );
        assert_eq!(name_for(&by_adapter, None, None), None);
        assert!(policy.names_by_adapter("mb").is_empty());
        assert!(policy.names_by_adapter("mn").is_empty());
        assert_eq!(policy.errors.len(), 4, "{:?}", policy.errors);
        let mut not_object = ConfigObject::parse("[]", &[]);
        assert_eq!(not_object.milliseconds("ms", 7), 7);
        let failed = not_object.finish((), serde_json::json!({}), "key");
        assert_eq!(failed.errors, ["config must be a JSON object"]);
        assert!(failed.config.is_none() && failed.normalized.is_none());
    }
}
