//! What `describe` says: identity, config schema, capabilities, the API
//! key (a `Bearer` token for both origins), the two origin fields, and no
//! declared rate limit.

use crate::config::{DEFAULT_API_URL, DEFAULT_TOOLBOX_URL, SECRET_FIELD};
use provider_sdk::config::{DEFAULT_REQUEST_TIMEOUT_MS, DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS};
use provider_sdk::types::{Capabilities, OriginField, ProviderDescription, SecretField};
use serde_json::json;

/// The header the API key travels in (`Authorization: Bearer <key>`).
pub const SECRET_HEADER: &str = "Authorization";
/// Where operators usually keep the key.
pub const SECRET_ENV_VAR: &str = "DAYTONA_API_KEY";

/// The provider description.
pub fn description() -> ProviderDescription {
    ProviderDescription {
        driver_key: "daytona".into(),
        display_name: "Daytona".into(),
        config_schema: config_schema(),
        // Terminals (allocated in the sandbox by script(1), resized with
        // stty) and pipes kept open, over a session command's text input
        // and a controller in the sandbox (`crate::interact`): the image
        // needs bash, coreutils and util-linux, as Daytona's default ones
        // have.
        capabilities: Capabilities::REUSABLE_LEASES
            | Capabilities::INCREMENTAL_OUTPUT
            | Capabilities::LOGIN_PTY
            | Capabilities::DUPLEX_CHANNELS
            | Capabilities::TERMINAL_RESIZE
            // Egress as the network settings (no entry with a port), an
            // image as the snapshot to start from, ports as preview URLs,
            // templates as snapshots of a stopped sandbox (`GET
            // /snapshots` lists them). Not `idle-pause`: the engine's face
            // runs no auto-stop timer.
            | Capabilities::EGRESS_POLICY
            | Capabilities::IMAGES
            | Capabilities::PORTS
            | Capabilities::TEMPLATES,
        secrets: vec![SecretField {
            config_field: SECRET_FIELD.into(),
            header: SECRET_HEADER.into(),
            scheme: Some("Bearer".into()),
            env_var: Some(SECRET_ENV_VAR.into()),
        }],
        origin_fields: vec![
            OriginField {
                config_field: "apiUrl".into(),
                default_url: Some(DEFAULT_API_URL.into()),
                secrets: vec![SECRET_FIELD.into()],
            },
            OriginField {
                config_field: "toolboxUrl".into(),
                default_url: Some(DEFAULT_TOOLBOX_URL.into()),
                secrets: vec![SECRET_FIELD.into()],
            },
        ],
        // Daytona publishes per-organization quotas, not a request rate a
        // host could spend; a host may still impose one (`--rate-limit`).
        rate_limit: None,
    }
}

/// What an `egressAllowlist` entry may look like in the schema: no port.
/// Either no colon at all, or two or more (an IPv6 address or range), and
/// no leading `[` (a bracketed IPv6 address comes with a port).
pub const NO_PORT_PATTERN: &str = r"^(?:[^\[:][^:]*|(?:[^\[:][^:]*)?:[^:]*:.*)$";

/// The JSON Schema of the config object.
pub fn config_schema() -> String {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Daytona sandbox provider config",
        "type": "object",
        "properties": {
            "apiUrl": {"type": "string", "default": DEFAULT_API_URL,
                "description": "The Daytona API (https, or http on a loopback host), with its base path"},
            "toolboxUrl": {"type": "string", "default": DEFAULT_TOOLBOX_URL,
                "description": "The toolbox proxy that runs commands and moves files"},
            "apiKey": {"description": "The API key; the host resolves it and sends it as a Bearer token to both URLs", "format": "secret-ref"},
            "organizationId": {"type": "string", "description": "Sent as X-Daytona-Organization-ID"},
            "snapshot": {"type": "string", "description": "The snapshot sandboxes are created from"},
            "target": {"type": "string", "description": "The region sandboxes are created in"},
            "timeoutMs": {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_MS, "default": DEFAULT_TIMEOUT_MS},
            "requestTimeoutMs": {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_MS, "default": DEFAULT_REQUEST_TIMEOUT_MS},
            "reuseLease": {"type": "boolean", "default": false,
                "description": "Stop released sandboxes for reuse instead of deleting them"},
            "snapshotByAdapter": {"type": "object", "additionalProperties": {"type": "string", "minLength": 1, "maxLength": 200},
                "propertyNames": {"pattern": "^[A-Za-z0-9_-]{1,64}$"},
                "description": "The snapshot per agent adapter type, before snapshot; a change expires reusable leases of that adapter"},
            // An entry with a port (`host:port`, `address:port`,
            // `[v6]:port`: one colon, or a leading `[`) is refused, as
            // validate-config does; bare IPv6 addresses have two colons or more.
            "egressAllowlist": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1,
                    "pattern": NO_PORT_PATTERN},
                "description": "What sandboxes may reach when a run asks for no policy: domains (*.example.com), addresses and address/prefix ranges, no ports; [\"*\"] for the default; a change expires reusable leases"}
        },
        "additionalProperties": true
    })
    .to_string()
}
