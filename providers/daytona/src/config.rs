//! The Daytona provider's config: two API URLs (the API and the toolbox
//! proxy), the sandbox's snapshot and target, and the time budgets.

use provider_sdk::config::{name_for, Budget, ConfigObject, ProviderConfig, Validation};
use provider_sdk::egress::Egress;
use provider_sdk::origin::{split_url, Origin};
use provider_sdk::types::OperationBudget;
use serde_json::json;
use serde_json::{Map, Value};

/// The public API (`apiUrl`).
pub const DEFAULT_API_URL: &str = "https://app.daytona.io/api";
/// The public toolbox proxy (`toolboxUrl`).
pub const DEFAULT_TOOLBOX_URL: &str = "https://proxy.app.daytona.io/toolbox";
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
    "snapshotByAdapter",
    "egressAllowlist",
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
    fn read(object: &mut ConfigObject, field: &str, default: &str) -> Base {
        let url = object.string(field).unwrap_or_else(|| default.into());
        match split_url(&url) {
            Ok((origin, path)) => Base { origin, path },
            Err(message) => {
                object.error(format!("{field}: {message}"));
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

// Shaped like CreateOS's config (optional names, budgets, `reuseLease`):
// the fields are each API's own; the reading rules are the SDK's.
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
    /// The budgets: a lifecycle operation's and a command's default
    /// timeout, and each request's.
    pub budget: Budget,
    /// Whether a release stops the sandbox for reuse instead of deleting it.
    pub reuse_lease: bool,
    /// The snapshot per agent adapter (`snapshotByAdapter`), before
    /// `snapshot`.
    pub snapshot_by_adapter: Map<String, Value>,
    /// The base egress allow-list (`egressAllowlist`), in force when an
    /// acquire asks for no policy of its own.
    pub egress_allowlist: Option<Egress>,
}

impl Config {
    /// The snapshot the config names for an adapter: its
    /// `snapshotByAdapter` entry, else `snapshot` (none: the service's
    /// default).
    pub fn snapshot_for(&self, adapter: Option<&str>) -> Option<&str> {
        name_for(&self.snapshot_by_adapter, adapter, self.snapshot.as_ref())
    }

    /// The base egress list as the config writes it (`["*"]` for
    /// unrestricted), as a lease records it.
    pub fn egress_allowlist_entries(&self) -> Option<Vec<String>> {
        self.egress_allowlist.as_ref().map(Egress::to_entries)
    }
}

impl ProviderConfig for Config {
    /// Checks and normalises a config (no request).
    fn validate(json: &str) -> Validation<Config> {
        let mut object = ConfigObject::parse(json, KNOWN_FIELDS);
        let egress_allowlist = without_ports(&mut object, "egressAllowlist");
        let config = Config {
            api: Base::read(&mut object, "apiUrl", DEFAULT_API_URL),
            toolbox: Base::read(&mut object, "toolboxUrl", DEFAULT_TOOLBOX_URL),
            organization_id: object.name("organizationId"),
            snapshot: object.name("snapshot"),
            target: object.name("target"),
            budget: object.budget(),
            reuse_lease: object.flag("reuseLease"),
            snapshot_by_adapter: object.names_by_adapter("snapshotByAdapter"),
            egress_allowlist,
        };
        let normalized = json!({
            "apiUrl": config.api.url(),
            "toolboxUrl": config.toolbox.url(),
            "organizationId": config.organization_id,
            "snapshot": config.snapshot,
            "target": config.target,
            "timeoutMs": config.budget.timeout_ms,
            "requestTimeoutMs": config.budget.request_timeout_ms,
            "reuseLease": config.reuse_lease,
            "snapshotByAdapter": (!config.snapshot_by_adapter.is_empty()).then_some(&config.snapshot_by_adapter),
            "egressAllowlist": config.egress_allowlist_entries(),
        });
        object.finish(config, normalized, SECRET_FIELD)
    }

    /// The API origin first, then the toolbox origin (the order of
    /// `describe`'s origin fields).
    fn api_origins(&self) -> Vec<String> {
        vec![self.api.origin.clone(), self.toolbox.origin.clone()]
    }

    fn budget(&self) -> Option<OperationBudget> {
        Some(self.budget.contract())
    }
}

/// The egress list at `field`, each entry with a port named as an error:
/// Daytona's network allow-lists allow every port of an address or domain,
/// so a port could only be dropped (the schema `describe` gives refuses
/// the same entries).
fn without_ports(object: &mut ConfigObject, field: &str) -> Option<Egress> {
    let list = object.egress_list(field);
    if let Some(Egress::Allow(destinations)) = &list {
        for destination in destinations.iter().filter(|d| d.port().is_some()) {
            object.error(format!(
                "{field}: entry '{}' names a port, which Daytona's network allow-lists cannot \
                 carry (they allow every port of an address or domain): remove the port",
                destination.entry
            ));
        }
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;
    use provider_sdk::config::{DEFAULT_REQUEST_TIMEOUT_MS, DEFAULT_TIMEOUT_MS};
    use wasm_bindgen_test::wasm_bindgen_test;

    fn validate(json: &str) -> Validation<Config> {
        Config::validate(json)
    }

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
    fn images_per_adapter_and_the_base_egress_list_round_trip() {
        let v = validate(
            r#"{"snapshot":"base","snapshotByAdapter":{"claude_local":"claude"},"egressAllowlist":["a.com"," a.com"]}"#,
        );
        let config = v.config.clone().unwrap();
        assert_eq!(config.snapshot_for(Some("claude_local")).unwrap(), "claude");
        assert_eq!(config.snapshot_for(Some("other")).unwrap(), "base");
        assert_eq!(config.egress_allowlist_entries().unwrap(), ["a.com"]);
        assert_eq!(Config::parse(&v.normalized.unwrap()), Ok(config));
        let bad = validate(r#"{"snapshotByAdapter":[],"egressAllowlist":["*","a.com"]}"#);
        assert_eq!(bad.errors.len(), 2, "{:?}", bad.errors);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_egress_entry_with_a_port_is_refused() {
        for list in [
            r#"["a.com:443"]"#,
            r#"["a.com","*.b.org:8443"]"#,
            r#"["10.0.0.1:22"]"#,
            r#"["[::1]:443"]"#,
        ] {
            let v = validate(&format!(r#"{{"egressAllowlist":{list}}}"#));
            assert!(v.config.is_none(), "{list}");
            assert_eq!(v.errors.len(), 1, "{list}: {:?}", v.errors);
            assert!(v.errors[0].contains("names a port"), "{:?}", v.errors);
        }
        let ok = validate(r#"{"egressAllowlist":["a.com","::1","2001:db8::/32","10.0.0.0/8"]}"#);
        assert!(ok.config.is_some(), "{:?}", ok.errors);
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
