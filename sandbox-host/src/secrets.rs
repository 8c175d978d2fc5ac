//! Secrets are the operator's: which config fields hold them, which
//! environment variables may be read, and which origin may receive them.
//! The provider component only declares the header a secret travels in; it
//! never chooses where a secret goes or what the host reads.
//!
//! Rules (checked by [`SandboxRuntime::environment`](crate::SandboxRuntime::environment)):
//! - The secret goes only to the origin the config's own URL field names
//!   (`apiUrl` by default), or to the operator's default origin when the
//!   config names none. The origin the component asks for must be that one.
//! - That origin must be `https:`; plain `http:` only on a loopback address.
//! - An environment variable is read only if the operator named it; the
//!   default `CREATEOS_API_KEY` is sent only to the default origin, unless
//!   the operator names another origin for it (`SANDBOX_API_KEY_ORIGIN`).

use std::collections::{BTreeSet, HashMap};
use std::fmt;

use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};

use crate::policy::Origin;

/// The CreateOS provider's default API origin.
pub const CREATEOS_DEFAULT_ORIGIN: &str = "https://api.sb.createos.sh";
/// The environment variable the operator defaults read the key from.
pub const CREATEOS_KEY_VAR: &str = "CREATEOS_API_KEY";
/// An origin (besides the default one) the operator allows to receive the
/// key read from `CREATEOS_API_KEY`.
pub const KEY_ORIGIN_VAR: &str = "SANDBOX_API_KEY_ORIGIN";

/// Which origins may receive a secret read from an environment variable.
#[derive(Clone, Debug, PartialEq, Eq)]
enum EnvScope {
    /// Only the operator's default origin.
    Default,
    /// The default origin and this one.
    Also(Origin),
    /// Whatever origin the config names (the operator named the variable
    /// for this environment explicitly).
    Any,
}

#[derive(Clone, Debug)]
struct EnvSecret {
    field: String,
    var: String,
    scope: EnvScope,
}

/// A config with its secrets taken out.
pub(crate) struct SplitConfig {
    /// The config without any secret field.
    pub config: String,
    /// The origin the operator allows (the config's URL field, else the
    /// default origin), if any.
    pub origin: Option<Origin>,
    /// `(config field, secret)` for each secret resolved.
    pub resolved: Vec<(String, String)>,
}

/// The operator's secret settings for an environment.
#[derive(Clone)]
pub struct Secrets {
    values: HashMap<String, String>,
    env: Vec<EnvSecret>,
    fields: BTreeSet<String>,
    url_field: String,
    default_origin: Option<Origin>,
}

impl Secrets {
    /// No secret besides those the config holds (in field `apiKey`); the
    /// config's `apiUrl` names the origin; no environment variable is read
    /// and there is no default origin.
    pub fn none() -> Self {
        Secrets {
            values: HashMap::new(),
            env: Vec::new(),
            fields: BTreeSet::from(["apiKey".to_owned()]),
            url_field: "apiUrl".to_owned(),
            default_origin: None,
        }
    }

    /// The `sandbox` CLI's operator defaults: [`none`](Self::none), plus
    /// default origin `https://api.sb.createos.sh` and the key from
    /// `CREATEOS_API_KEY` for that origin only (and for the origin in
    /// `SANDBOX_API_KEY_ORIGIN`, when the operator sets it).
    pub fn from_env() -> Self {
        let mut secrets = Self::none();
        secrets.default_origin = Origin::parse(CREATEOS_DEFAULT_ORIGIN).ok();
        let scope = match std::env::var(KEY_ORIGIN_VAR)
            .ok()
            .and_then(|o| Origin::parse(&o).ok())
        {
            Some(origin) => EnvScope::Also(origin),
            None => EnvScope::Default,
        };
        secrets.env.push(EnvSecret {
            field: "apiKey".into(),
            var: CREATEOS_KEY_VAR.into(),
            scope,
        });
        secrets
    }

    /// Uses `value` for the secret of config field `config_field`.
    pub fn with(mut self, config_field: &str, value: impl Into<String>) -> Self {
        self.fields.insert(config_field.to_owned());
        self.values.insert(config_field.to_owned(), value.into());
        self
    }

    /// Reads the secret of `config_field` from environment variable `var`
    /// when neither the config nor [`with`](Self::with) gives it; sent to
    /// whatever origin the config names (subject to the https rule).
    pub fn with_env(mut self, config_field: &str, var: &str) -> Self {
        self.fields.insert(config_field.to_owned());
        self.env.push(EnvSecret {
            field: config_field.into(),
            var: var.into(),
            scope: EnvScope::Any,
        });
        self
    }

    /// The config field whose URL names the origin that may receive the
    /// secrets (default `apiUrl`).
    pub fn with_url_field(mut self, field: &str) -> Self {
        self.url_field = field.to_owned();
        self
    }

    /// The origin secrets go to when the config names none.
    pub fn with_default_origin(mut self, origin: &str) -> Result<Self> {
        self.default_origin = Some(Origin::parse(origin)?);
        Ok(self)
    }

    /// Removes every secret field (the operator's and those the provider
    /// declared) from `config`. Returns the rest, the origin the operator
    /// allows (from the config's URL field, else the default origin), and
    /// the secrets resolved per config field.
    pub(crate) fn split(&self, config: &str, declared: &[String]) -> Result<SplitConfig> {
        let mut value: Value = serde_json::from_str(config).context("the config is not JSON")?;
        let object = value
            .as_object_mut()
            .context("the config is not a JSON object")?;
        let origin = self.origin(object)?;
        let mut fields = self.fields.clone();
        fields.extend(declared.iter().cloned());
        let mut resolved = Vec::new();
        for field in &fields {
            let secret = match object.remove(field) {
                Some(Value::Null) | None => None,
                Some(reference) => Some(resolve_secret(field, &reference)?),
            }
            .or_else(|| self.values.get(field).cloned())
            .or_else(|| self.read_named_variables(field, origin.as_ref()));
            if let Some(secret) = secret {
                resolved.push((field.clone(), secret));
            }
        }
        Ok(SplitConfig {
            config: value.to_string(),
            origin,
            resolved,
        })
    }

    fn origin(&self, config: &Map<String, Value>) -> Result<Option<Origin>> {
        match config.get(&self.url_field) {
            None | Some(Value::Null) => Ok(self.default_origin.clone()),
            Some(Value::String(url)) => {
                let uri: http::Uri = url
                    .parse()
                    .with_context(|| format!("config field {} is not a URL", self.url_field))?;
                Origin::of_uri(&uri).map(Some).with_context(|| {
                    format!(
                        "config field {} must be an http or https URL without user name or password",
                        self.url_field
                    )
                })
            }
            Some(_) => bail!("config field {} must be a string", self.url_field),
        }
    }

    fn read_named_variables(&self, field: &str, origin: Option<&Origin>) -> Option<String> {
        self.env
            .iter()
            .filter(|e| e.field == field)
            .filter(|e| {
                let is_default = origin.is_some() && origin == self.default_origin.as_ref();
                match &e.scope {
                    EnvScope::Any => true,
                    EnvScope::Default => is_default,
                    EnvScope::Also(also) => is_default || origin == Some(also),
                }
            })
            .find_map(|e| std::env::var(&e.var).ok().filter(|v| !v.is_empty()))
    }
}

impl Default for Secrets {
    fn default() -> Self {
        Self::none()
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secrets")
            .field("fields", &self.fields)
            .field("given", &self.values.keys().collect::<Vec<_>>())
            .field(
                "variables",
                &self.env.iter().map(|e| &e.var).collect::<Vec<_>>(),
            )
            .field("url_field", &self.url_field)
            .field("default_origin", &self.default_origin)
            .finish()
    }
}

/// Whether a secret may travel to `origin`: https, or http on loopback.
pub(crate) fn check_secret_origin(origin: &Origin) -> Result<()> {
    match origin.scheme() {
        "https" => Ok(()),
        "http" if is_loopback(origin.host()) => Ok(()),
        _ => bail!(
            "the API key would be sent to {origin} in plain text; use an https URL \
             (plain http is allowed only for localhost, 127.0.0.1 or [::1])"
        ),
    }
}

fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Resolves a secret config value: the secret itself (a string), or a
/// reference `{"env": "VAR"}` (an environment variable of the host) or
/// `{"file": "/path"}` (a file's contents, trailing newline removed). The
/// config is the operator's, so the variable or file it names is the
/// operator's choice. Errors name the field and the reference, never a
/// secret.
fn resolve_secret(field: &str, value: &Value) -> Result<String> {
    let reference = match value {
        Value::String(secret) => return Ok(secret.clone()),
        Value::Object(reference) if reference.len() == 1 => reference,
        _ => bail!(
            "config field {field} must be the secret, {{\"env\": \"VAR\"}} or {{\"file\": \"/path\"}}"
        ),
    };
    match (reference.get("env"), reference.get("file")) {
        (Some(Value::String(var)), _) => std::env::var(var)
            .with_context(|| format!("config field {field}: environment variable {var} is not set")),
        (_, Some(Value::String(path))) => std::fs::read_to_string(path)
            .map(|text| text.trim_end_matches(['\n', '\r']).to_string())
            .with_context(|| format!("config field {field}: cannot read secret file {path}")),
        _ => bail!(
            "config field {field} must be the secret, {{\"env\": \"VAR\"}} or {{\"file\": \"/path\"}}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_resolve_from_values_env_and_files() {
        assert_eq!(resolve_secret("apiKey", &json!("k1")).unwrap(), "k1");
        std::env::set_var("SANDBOX_HOST_TEST_SECRET", "k2");
        assert_eq!(
            resolve_secret("apiKey", &json!({"env": "SANDBOX_HOST_TEST_SECRET"})).unwrap(),
            "k2"
        );
        let file = std::env::temp_dir().join(format!("sandbox-host-secret-{}", std::process::id()));
        std::fs::write(&file, "k3\n").unwrap();
        assert_eq!(
            resolve_secret("apiKey", &json!({"file": file})).unwrap(),
            "k3"
        );
        std::fs::remove_file(&file).unwrap();
    }

    #[test]
    fn bad_references_are_clear_errors_without_secrets() {
        for bad in [
            json!(5),
            json!({"env": "SANDBOX_HOST_UNSET_VAR"}),
            json!({"file": "/nonexistent/x"}),
            json!({"vault": "x"}),
        ] {
            let error = resolve_secret("apiKey", &bad).unwrap_err();
            assert!(format!("{error:#}").contains("apiKey"), "{error:#}");
        }
    }

    #[test]
    fn secrets_travel_only_over_https_or_loopback_http() {
        for ok in [
            "https://api.example.com",
            "http://127.0.0.1:8080",
            "http://localhost:1",
            "http://[::1]:2",
        ] {
            assert!(
                check_secret_origin(&Origin::parse(ok).unwrap()).is_ok(),
                "{ok}"
            );
        }
        for bad in [
            "http://api.example.com",
            "http://10.0.0.1",
            "http://127.0.0.1.evil.test",
        ] {
            assert!(
                check_secret_origin(&Origin::parse(bad).unwrap()).is_err(),
                "{bad}"
            );
        }
    }
}
