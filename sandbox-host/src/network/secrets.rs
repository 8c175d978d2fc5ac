//! Secrets are the operator's: which config fields hold them, which
//! environment variables may be read, and which origins may receive them.
//! The provider component only declares which config fields name its API
//! origins (`origin-field`) and which header carries each secret; it never
//! chooses where a secret goes or what the host reads.
//!
//! Rules (checked by [`SandboxRuntime::environment`](crate::SandboxRuntime::environment)):
//! - A secret goes only to the origins whose `origin-field` lists it, and
//!   each such origin is the one the operator's config names in that field.
//!   When the config leaves the field out, the provider's default URL
//!   receives secrets only if the operator trusts that default
//!   ([`Secrets::trust_default_origin`]); the origins the component asks
//!   for in `validate-config` must be exactly these.
//! - Such an origin must be `https:`; plain `http:` only on a loopback address.
//! - An environment variable is read only if the operator named it; the
//!   `sandbox` CLI's defaults (`CREATEOS_API_KEY`, `DAYTONA_API_KEY`) are
//!   sent only to the trusted default origins, unless the operator names
//!   another origin for them (`SANDBOX_API_KEY_ORIGIN`). The `env-var` a
//!   provider declares is documentation and never read.
//! - Several secrets for one origin each go in their own header; two in
//!   the same header of one origin are refused, naming both fields.
//! - An empty or blank secret, or one with a line break or NUL, is refused.
//!
//! The Node host (`node/src/secrets.ts`) follows the same rules; the shared
//! table `node/test/scenarios/secret-routing.json` holds them for both
//! (`docs/secret-routing.md`).

use std::collections::{BTreeSet, HashMap};
use std::fmt;

use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};

use crate::network::policy::Origin;

/// What the secret rules read from a provider's `describe()`: the config
/// fields that hold secrets and the ones that name API origins. Built from
/// the contract's `provider-description` (`From<&ProviderDescription>`, in
/// the wasm bindings), so these rules stay plain data and know nothing of
/// the component model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecretLayout {
    /// The config fields the provider declares as secrets (`secrets`).
    pub secret_fields: Vec<String>,
    /// The config fields naming its API origins (`origin-fields`), in order.
    pub origin_fields: Vec<OriginFieldLayout>,
}

/// One `origin-field` of a provider: the config field, its default URL,
/// and the secret fields its requests carry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OriginFieldLayout {
    /// The config field holding the URL.
    pub config_field: String,
    /// The URL when the config leaves the field out, if any.
    pub default_url: Option<String>,
    /// The secret config fields whose secrets requests to this origin carry.
    pub secrets: Vec<String>,
}

/// An origin (besides the trusted defaults) the operator allows to receive
/// a key read from one of the CLI's default variables.
pub const KEY_ORIGIN_VAR: &str = "SANDBOX_API_KEY_ORIGIN";

/// The `sandbox` CLI's operator defaults, per driver key: the variable the
/// API key is read from, and the provider default origins trusted with it.
pub const CLI_KEY_DEFAULTS: &[(&str, &str, &[&str])] = &[
    (
        "createos",
        "CREATEOS_API_KEY",
        &["https://api.sb.createos.sh"],
    ),
    (
        "daytona",
        "DAYTONA_API_KEY",
        &["https://app.daytona.io", "https://proxy.app.daytona.io"],
    ),
];

/// Which origins may receive a secret read from an environment variable.
#[derive(Clone, Debug, PartialEq, Eq)]
enum EnvScope {
    /// Only the trusted default origins.
    Default,
    /// The trusted default origins and this one.
    Also(Origin),
    /// Whatever origins the config names (the operator named the variable
    /// for this environment explicitly).
    Any,
}

#[derive(Clone, Debug)]
struct EnvSecret {
    field: String,
    var: String,
    scope: EnvScope,
}

/// One API origin of a config: where it came from and which secrets its
/// requests carry.
#[derive(Clone, Debug)]
pub(crate) struct ConfigOrigin {
    /// The config field that names it.
    pub field: String,
    /// The origin.
    pub origin: Origin,
    /// True when the config named it; false for the provider's default.
    pub named_by_config: bool,
    /// The secret config fields whose values its requests carry.
    pub secret_fields: Vec<String>,
}

/// A config with its secrets taken out.
pub(crate) struct SplitConfig {
    /// The config without any secret field.
    pub config: String,
    /// The API origins, in the provider's `origin-fields` order.
    pub origins: Vec<ConfigOrigin>,
    /// `(config field, secret)` for each secret resolved.
    pub resolved: Vec<(String, String)>,
}

/// The operator's secret settings for an environment.
#[derive(Clone)]
pub struct Secrets {
    values: HashMap<String, String>,
    env: Vec<EnvSecret>,
    fields: BTreeSet<String>,
    trusted_defaults: Vec<Origin>,
}

impl Secrets {
    /// No secret besides those the config holds (in the fields the
    /// provider declares, and `apiKey`); no environment variable is read;
    /// no provider default origin is trusted with a secret.
    pub fn none() -> Self {
        Secrets {
            values: HashMap::new(),
            env: Vec::new(),
            fields: BTreeSet::from(["apiKey".to_owned()]),
            trusted_defaults: Vec::new(),
        }
    }

    /// The environment variable this CLI reads the `apiKey` secret of
    /// `driver_key`'s provider from ([`CLI_KEY_DEFAULTS`]), if any. A
    /// provider's own `env-var` in `describe()` is never read.
    pub fn cli_key_variable(driver_key: &str) -> Option<&'static str> {
        CLI_KEY_DEFAULTS
            .iter()
            .find(|(k, _, _)| *k == driver_key)
            .map(|(_, var, _)| *var)
    }

    /// The `sandbox` CLI's operator defaults for provider `driver_key`
    /// ([`CLI_KEY_DEFAULTS`]): [`none`](Self::none), plus that provider's
    /// well-known default origins trusted, and its key read from its
    /// variable for those origins only (and for the origin in
    /// `SANDBOX_API_KEY_ORIGIN`, when the operator sets it).
    pub fn from_env_for(driver_key: &str) -> Self {
        let mut secrets = Self::none();
        let Some((_, var, origins)) = CLI_KEY_DEFAULTS.iter().find(|(k, _, _)| *k == driver_key)
        else {
            return secrets;
        };
        secrets.trusted_defaults = origins
            .iter()
            .filter_map(|o| Origin::parse(o).ok())
            .collect();
        let scope = match std::env::var(KEY_ORIGIN_VAR)
            .ok()
            .and_then(|o| Origin::parse(&o).ok())
        {
            Some(origin) => EnvScope::Also(origin),
            None => EnvScope::Default,
        };
        secrets.env.push(EnvSecret {
            field: "apiKey".into(),
            var: (*var).into(),
            scope,
        });
        secrets
    }

    /// [`from_env_for`](Self::from_env_for) the CreateOS provider.
    pub fn from_env() -> Self {
        Self::from_env_for("createos")
    }

    /// Uses `value` for the secret of config field `config_field`.
    pub fn with(mut self, config_field: &str, value: impl Into<String>) -> Self {
        self.fields.insert(config_field.to_owned());
        self.values.insert(config_field.to_owned(), value.into());
        self
    }

    /// Reads the secret of `config_field` from environment variable `var`
    /// when neither the config nor [`with`](Self::with) gives it; sent to
    /// whatever origins the config names (subject to the https rule).
    pub fn with_env(mut self, config_field: &str, var: &str) -> Self {
        self.fields.insert(config_field.to_owned());
        self.env.push(EnvSecret {
            field: config_field.into(),
            var: var.into(),
            scope: EnvScope::Any,
        });
        self
    }

    /// Reads the secret of `config_field` from environment variable `var`,
    /// sent only to the origins the operator trusts (the scope of the
    /// `sandbox` CLI's own variables, and of the Node worker's
    /// `PAPERCLIP_WASM_SECRET_ENV`). For the shared secret-routing table.
    #[cfg(test)]
    pub(crate) fn with_env_for_trusted(mut self, config_field: &str, var: &str) -> Self {
        self.fields.insert(config_field.to_owned());
        self.env.push(EnvSecret {
            field: config_field.into(),
            var: var.into(),
            scope: EnvScope::Default,
        });
        self
    }

    /// Trusts `origin`, when it is a provider's default URL, with that
    /// provider's secrets although the config does not name it.
    pub fn trust_default_origin(mut self, origin: &str) -> Result<Self> {
        self.trusted_defaults.push(Origin::parse(origin)?);
        Ok(self)
    }

    /// Whether a provider default `origin` may receive secrets.
    pub(crate) fn trusts(&self, origin: &Origin) -> bool {
        self.trusted_defaults.contains(origin)
    }

    /// Removes every secret field (the operator's and those the provider
    /// declared) from `config`. Returns the rest, the API origins the
    /// config names (field by field, else the provider's defaults), and the
    /// secrets resolved per config field.
    pub(crate) fn split(
        &self,
        config: &str,
        description: impl Into<SecretLayout>,
    ) -> Result<SplitConfig> {
        let description = description.into();
        let mut value: Value = serde_json::from_str(config).context("the config is not JSON")?;
        let object = value
            .as_object_mut()
            .context("the config is not a JSON object")?;
        let origins = config_origins(object, &description)?;
        let mut fields = self.fields.clone();
        fields.extend(description.secret_fields.iter().cloned());
        let mut resolved = Vec::new();
        for field in &fields {
            let receivers: Vec<&ConfigOrigin> = origins
                .iter()
                .filter(|o| o.secret_fields.contains(field))
                .collect();
            let secret = match object.remove(field) {
                Some(Value::Null) | None => None,
                Some(reference) => Some(resolve_secret(field, &reference)?),
            }
            .or_else(|| self.values.get(field).cloned())
            .or_else(|| self.read_named_variables(field, &receivers));
            if let Some(secret) = secret {
                check_secret_value(field, &secret)?;
                resolved.push((field.clone(), secret));
            }
        }
        Ok(SplitConfig {
            config: value.to_string(),
            origins,
            resolved,
        })
    }

    /// The keys these settings withhold: `(variable, origin)` for each
    /// variable that is set and would be read for a secret the config does
    /// not give, but whose scope does not include an origin the config
    /// names (for example `CREATEOS_API_KEY` with an `apiUrl` that is not
    /// the provider's own). Lets a CLI say why no key was sent before the
    /// API answers 401.
    pub fn withheld_keys(
        &self,
        config: &str,
        description: impl Into<SecretLayout>,
    ) -> Result<Vec<(String, Origin)>> {
        let description = description.into();
        let value: Value = serde_json::from_str(config).context("the config is not JSON")?;
        let object = value
            .as_object()
            .context("the config is not a JSON object")?;
        let origins = config_origins(object, &description)?;
        let mut fields = self.fields.clone();
        fields.extend(description.secret_fields.iter().cloned());
        let mut withheld = Vec::new();
        for field in &fields {
            let given = !matches!(object.get(field), None | Some(Value::Null))
                || self.values.contains_key(field);
            if given {
                continue;
            }
            for secret in self.env.iter().filter(|e| &e.field == field) {
                if std::env::var(&secret.var).map_or(true, |v| v.is_empty()) {
                    continue;
                }
                for receiver in origins.iter().filter(|o| o.secret_fields.contains(field)) {
                    let allowed = match &secret.scope {
                        EnvScope::Any => true,
                        EnvScope::Default => self.trusts(&receiver.origin),
                        EnvScope::Also(also) => {
                            self.trusts(&receiver.origin) || &receiver.origin == also
                        }
                    };
                    if !allowed {
                        withheld.push((secret.var.clone(), receiver.origin.clone()));
                    }
                }
            }
        }
        Ok(withheld)
    }

    fn read_named_variables(&self, field: &str, receivers: &[&ConfigOrigin]) -> Option<String> {
        if receivers.is_empty() {
            return None;
        }
        self.env
            .iter()
            .filter(|e| e.field == field)
            .filter(|e| {
                receivers.iter().all(|r| {
                    let trusted = self.trusts(&r.origin);
                    match &e.scope {
                        EnvScope::Any => true,
                        EnvScope::Default => trusted,
                        EnvScope::Also(also) => trusted || &r.origin == also,
                    }
                })
            })
            .find_map(|e| std::env::var(&e.var).ok().filter(|v| !v.is_empty()))
    }
}

/// The origin each of the provider's `origin-fields` names in `config`, or
/// its default URL when the config leaves the field out.
fn config_origins(
    config: &Map<String, Value>,
    description: &SecretLayout,
) -> Result<Vec<ConfigOrigin>> {
    let mut origins = Vec::new();
    for field in &description.origin_fields {
        let name = &field.config_field;
        let (url, named_by_config) = match config.get(name) {
            None | Some(Value::Null) => match &field.default_url {
                Some(url) => (url.clone(), false),
                None => bail!("config field {name} is required: the API URL to use"),
            },
            Some(Value::String(url)) => (url.clone(), true),
            Some(_) => bail!("config field {name} must be a string"),
        };
        let uri: http::Uri = url.parse().with_context(|| {
            if named_by_config {
                format!("config field {name} is not a URL")
            } else {
                format!("the provider's default URL for config field {name} is not a URL")
            }
        })?;
        let origin = Origin::of_uri(&uri).with_context(|| {
            format!(
                "config field {name} must be an http or https URL without user name or password"
            )
        })?;
        origins.push(ConfigOrigin {
            field: name.clone(),
            origin,
            named_by_config,
            secret_fields: field.secrets.clone(),
        });
    }
    Ok(origins)
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
            .field("trusted_defaults", &self.trusted_defaults)
            .finish()
    }
}

/// Refuses a secret no header can carry as meant: empty or blank (the API
/// would see a header without a key, or `Bearer ` alone), or with a line
/// break or NUL. Names the field, never the secret.
fn check_secret_value(field: &str, secret: &str) -> Result<()> {
    if secret.trim().is_empty() || secret.contains(['\r', '\n', '\0']) {
        bail!("config field {field}: the secret is empty or contains a line break or NUL");
    }
    Ok(())
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
