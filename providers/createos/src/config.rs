//! The provider config: parsing, defaults and the API URL rules of the spec.
//!
//! Secret fields (`apiKey`) are the host's business: the host removes them
//! before the component sees the config, so they are accepted and left
//! untouched here, never read.

use provider_sdk::config::{name_for, Budget, ConfigObject, ProviderConfig, Validation};
use provider_sdk::egress::Egress;
use provider_sdk::types::OperationBudget;
use serde_json::{json, Map, Value};

/// The CreateOS API origin used when the config names none.
pub const DEFAULT_API_URL: &str = "https://api.sb.createos.sh";
/// The shape used when the config names none.
pub const DEFAULT_SHAPE: &str = "s-1vcpu-1gb";
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
    "hardExpiry",
    "rootfsByAdapter",
    "egressAllowlist",
    "autoPauseAfterSeconds",
    "ingress",
];

/// The shortest and longest idle window (`autoPauseAfterSeconds`) the
/// service takes.
pub const AUTO_PAUSE_SECONDS: (u64, u64) = (60, 86_400);

// Shaped like Daytona's config (optional names, budgets, `reuseLease`):
// the fields are each API's own; the reading rules are the SDK's.
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
    /// The budgets: a lifecycle operation's and a command's default
    /// timeout, and each request's.
    pub budget: Budget,
    /// Whether released leases are paused for reuse instead of deleted.
    pub reuse_lease: bool,
    /// Whether the backend gives a sandbox a hard expiry it attests
    /// (`expires_at`, as createos-local does): only then is an acquire's
    /// `requested-expires-at` honoured. The CreateOS service has none.
    pub hard_expiry: bool,
    /// The root filesystem per agent adapter (`rootfsByAdapter`), before
    /// `rootfs`.
    pub rootfs_by_adapter: Map<String, Value>,
    /// The base egress allow-list (`egressAllowlist`), in force when an
    /// acquire asks for no policy of its own.
    pub egress_allowlist: Option<Egress>,
    /// The idle window after which the service pauses a sandbox
    /// (`autoPauseAfterSeconds`); a reusable lease is then released by
    /// leaving it running (`idle-pause`).
    pub auto_pause_after_seconds: Option<u64>,
    /// Whether sandboxes are created with `ingress_enabled`, so that their
    /// ports can be opened (`ingress`).
    pub ingress: bool,
}

impl Config {
    /// The root filesystem the config names for an adapter: its
    /// `rootfsByAdapter` entry, else `rootfs` (none: the service's default).
    pub fn rootfs_for(&self, adapter: Option<&str>) -> Option<&str> {
        name_for(&self.rootfs_by_adapter, adapter, self.rootfs.as_ref())
    }

    /// The base egress list as the config writes it (`["*"]` for
    /// unrestricted), as a lease records it.
    pub fn egress_allowlist_entries(&self) -> Option<Vec<String>> {
        self.egress_allowlist.as_ref().map(Egress::to_entries)
    }
}

impl ProviderConfig for Config {
    /// Validates and normalises a config JSON object without any request.
    fn validate(json: &str) -> Validation<Config> {
        let mut object = ConfigObject::parse(json, KNOWN_FIELDS);
        let api_origin = match object.string("apiUrl") {
            Some(url) => normalize_api_url(&url).unwrap_or_else(|message| {
                object.error(format!("apiUrl: {message}"));
                String::new()
            }),
            None => DEFAULT_API_URL.to_string(),
        };
        let shape = object
            .string("shape")
            .unwrap_or_else(|| DEFAULT_SHAPE.to_string());
        if !SHAPES.contains(&shape.as_str()) {
            object.error(format!(
                "shape: `{}` is not a CreateOS shape (one of {})",
                printable(&shape),
                SHAPES.join(", ")
            ));
        }
        let config = Config {
            api_origin,
            shape,
            rootfs: object.name("rootfs"),
            region: object.name("region"),
            budget: object.budget(),
            reuse_lease: object.flag("reuseLease"),
            hard_expiry: object.flag("hardExpiry"),
            rootfs_by_adapter: object.names_by_adapter("rootfsByAdapter"),
            egress_allowlist: object.egress_list("egressAllowlist"),
            auto_pause_after_seconds: object.bounded(
                "autoPauseAfterSeconds",
                AUTO_PAUSE_SECONDS.0,
                AUTO_PAUSE_SECONDS.1,
            ),
            ingress: object.flag("ingress"),
        };
        let normalized = json!({
            "apiUrl": config.api_origin,
            "shape": config.shape,
            "rootfs": config.rootfs,
            "region": config.region,
            "timeoutMs": config.budget.timeout_ms,
            "requestTimeoutMs": config.budget.request_timeout_ms,
            "reuseLease": config.reuse_lease,
            "hardExpiry": config.hard_expiry,
            "rootfsByAdapter": (!config.rootfs_by_adapter.is_empty()).then_some(&config.rootfs_by_adapter),
            "egressAllowlist": config.egress_allowlist_entries(),
            "autoPauseAfterSeconds": config.auto_pause_after_seconds,
            "ingress": config.ingress,
        });
        object.finish(config, normalized, SECRET_FIELD)
    }

    fn api_origins(&self) -> Vec<String> {
        vec![self.api_origin.clone()]
    }

    fn budget(&self) -> Option<OperationBudget> {
        Some(self.budget.contract())
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
    use provider_sdk::config::DEFAULT_TIMEOUT_MS;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn validate(json: &str) -> Validation<Config> {
        Config::validate(json)
    }

    fn parse(json: &str) -> Result<Config, Vec<String>> {
        Config::parse(json)
    }

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
        assert_eq!(config.budget.timeout_ms, DEFAULT_TIMEOUT_MS);
        assert!(!config.reuse_lease);
        assert!(!config.hard_expiry);
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
    fn environment_policy_fields_are_read_and_round_trip() {
        let v = validate(
            r#"{"rootfs":"base","rootfsByAdapter":{"claude_local":"claude-img"},"egressAllowlist":[" A.com ","10.0.0.0/8","a.com"],"autoPauseAfterSeconds":60,"ingress":true}"#,
        );
        assert!(v.errors.is_empty(), "{:?}", v.errors);
        let config = v.config.unwrap();
        assert_eq!(
            config.rootfs_for(Some("claude_local")).unwrap(),
            "claude-img"
        );
        assert_eq!(config.rootfs_for(Some("codex_local")).unwrap(), "base");
        assert_eq!(config.rootfs_for(None).unwrap(), "base");
        assert_eq!(
            config.egress_allowlist_entries().unwrap(),
            ["a.com", "10.0.0.0/8"]
        );
        assert_eq!(config.auto_pause_after_seconds, Some(60));
        assert!(config.ingress);
        assert_eq!(parse(&v.normalized.unwrap()), Ok(config));
        let star = parse(r#"{"egressAllowlist":["*"]}"#).unwrap();
        assert_eq!(star.egress_allowlist_entries().unwrap(), ["*"]);
        let v = validate(
            r#"{"rootfsByAdapter":{"bad key":"x"},"egressAllowlist":["*","a.com"],"autoPauseAfterSeconds":59,"ingress":"on"}"#,
        );
        assert_eq!(v.errors.len(), 4, "{:?}", v.errors);
        assert!(validate(r#"{"egressAllowlist":[]}"#).errors[0].contains("empty"));
        assert!(!validate(r#"{"autoPauseAfterSeconds":86401}"#)
            .errors
            .is_empty());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn non_objects_are_rejected() {
        assert_eq!(validate("[]").errors, vec!["config must be a JSON object"]);
        assert!(validate("{").errors[0].starts_with("config is not valid JSON"));
        assert!(parse("null").is_err());
    }
}
