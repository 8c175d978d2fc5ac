//! What `describe` says about the CreateOS provider.

use crate::config::{DEFAULT_API_URL, DEFAULT_SHAPE, SECRET_FIELD, SHAPES};
use provider_sdk::config::{DEFAULT_REQUEST_TIMEOUT_MS, DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS};
use provider_sdk::types::{Capabilities, OriginField, ProviderDescription, RateLimit, SecretField};

/// The header that carries the API key.
pub const SECRET_HEADER: &str = "X-Api-Key";
/// The host environment variable that may hold the API key.
pub const SECRET_ENV_VAR: &str = "CREATEOS_API_KEY";
/// CreateOS's rate limit: about 300 requests per minute per client.
pub const RATE_LIMIT_REQUESTS: u32 = 300;
/// The window of [`RATE_LIMIT_REQUESTS`], in milliseconds.
pub const RATE_LIMIT_WINDOW_MS: u32 = 60_000;

/// The provider's description.
pub fn description() -> ProviderDescription {
    ProviderDescription {
        driver_key: "createos".into(),
        display_name: "CreateOS".into(),
        config_schema: config_schema(),
        // Terminals and pipes kept open, over managed processes; not
        // `terminal-resize`: the service has no resize (the local engine's
        // is an extension), so a terminal keeps the size it opened with.
        capabilities: Capabilities::REUSABLE_LEASES
            | Capabilities::INCREMENTAL_OUTPUT
            | Capabilities::NATIVE_SYNC
            | Capabilities::LOGIN_PTY
            | Capabilities::DUPLEX_CHANNELS
            // Contract 0.7.0: egress lists (not block-all: the service has
            // no deny-all rule), images per adapter, templates, the
            // service's idle pause, ports (config `ingress`), and sync-in
            // and sync-out at once (each is its own file requests;
            // tests/environment_policy.rs overlaps them byte-exact).
            | Capabilities::EGRESS_POLICY
            | Capabilities::IMAGES
            | Capabilities::TEMPLATES
            | Capabilities::IDLE_PAUSE
            | Capabilities::PORTS
            | Capabilities::CONCURRENT_SYNC,
        secrets: vec![SecretField {
            config_field: SECRET_FIELD.into(),
            header: SECRET_HEADER.into(),
            scheme: None,
            env_var: Some(SECRET_ENV_VAR.into()),
        }],
        origin_fields: vec![OriginField {
            config_field: "apiUrl".into(),
            default_url: Some(crate::config::DEFAULT_API_URL.into()),
            secrets: vec![SECRET_FIELD.into()],
        }],
        rate_limit: Some(RateLimit {
            requests: RATE_LIMIT_REQUESTS,
            window_ms: RATE_LIMIT_WINDOW_MS,
            per_second: None,
        }),
    }
}

/// The JSON Schema of the config object. Written out as text: the same
/// object built with `serde_json::json!` cost about 10 KiB of code in the
/// component, which is held to 400 KiB (`build.sh`); a unit test checks
/// the text against that object.
pub fn config_schema() -> String {
    let mut shapes = String::new();
    for shape in SHAPES {
        if !shapes.is_empty() {
            shapes.push(',');
        }
        shapes.push('"');
        shapes.push_str(shape);
        shapes.push('"');
    }
    format!(
        concat!(
            r#"{{"$schema":"https://json-schema.org/draft/2020-12/schema","#,
            r#""title":"CreateOS sandbox provider config","type":"object","properties":{{"#,
            r#""apiUrl":{{"type":"string","default":"{api_url}","#,
            r#""description":"CreateOS API URL: https, or http for loopback hosts; optional /v1 suffix."}},"#,
            r#""apiKey":{{"description":"The API key or a secret reference. Resolved and sent by the host; never given to the provider. Defaults to the host's CREATEOS_API_KEY."}},"#,
            r#""shape":{{"type":"string","enum":[{shapes}],"default":"{shape}"}},"#,
            r#""rootfs":{{"type":"string","minLength":1,"maxLength":200}},"#,
            r#""region":{{"type":"string","minLength":1,"maxLength":200}},"#,
            r#""timeoutMs":{{"type":"integer","minimum":1,"maximum":{max},"default":{timeout},"#,
            r#""description":"Default command timeout, and the budget of each lifecycle operation."}},"#,
            r#""requestTimeoutMs":{{"type":"integer","minimum":1,"maximum":{max},"default":{request},"#,
            r#""description":"Budget of each API request outside a command's run; each cleanup request gets it afresh."}},"#,
            r#""reuseLease":{{"type":"boolean","default":false,"#,
            r#""description":"Pause released sandboxes for reuse instead of deleting them."}},"#,
            r#""hardExpiry":{{"type":"boolean","default":false,"#,
            r#""description":"The backend attests a hard expiry for a sandbox (createos-local does; the CreateOS service does not): only then is a requested expiry honoured, else refused."}},"#,
            r#""rootfsByAdapter":{{"type":"object","additionalProperties":{{"type":"string","minLength":1,"maxLength":200}},"propertyNames":{{"pattern":"^[A-Za-z0-9_-]{{1,64}}$"}},"#,
            r#""description":"The root filesystem per agent adapter type, before rootfs; a change expires reusable leases of that adapter."}},"#,
            r#""egressAllowlist":{{"type":"array","minItems":1,"items":{{"type":"string","minLength":1}},"#,
            r#""description":"What sandboxes may reach when a run asks for no policy: host[:port], *.domain[:port], IP, [v6]:port, address/prefix; [\"*\"] for the default; a change expires reusable leases."}},"#,
            r#""autoPauseAfterSeconds":{{"type":"integer","minimum":60,"maximum":86400,"#,
            r#""description":"Idle window after which the service pauses a sandbox; a released reusable lease is left running until then."}},"#,
            r#""ingress":{{"type":"boolean","default":false,"#,
            r#""description":"Create sandboxes with ingress enabled, so that their ports can be opened."}}"#,
            r#"}},"additionalProperties":true}}"#,
        ),
        api_url = DEFAULT_API_URL,
        shapes = shapes,
        shape = DEFAULT_SHAPE,
        max = MAX_TIMEOUT_MS,
        timeout = DEFAULT_TIMEOUT_MS,
        request = DEFAULT_REQUEST_TIMEOUT_MS,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    /// The schema's text is the object it always was.
    #[wasm_bindgen_test(unsupported = test)]
    fn config_schema_is_the_schema_object() {
        let text: serde_json::Value = serde_json::from_str(&config_schema()).unwrap();
        let object = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "CreateOS sandbox provider config",
            "type": "object",
            "properties": {
                "apiUrl": {
                    "type": "string",
                    "default": DEFAULT_API_URL,
                    "description": "CreateOS API URL: https, or http for loopback hosts; optional /v1 suffix."
                },
                "apiKey": {
                    "description": "The API key or a secret reference. Resolved and sent by the host; never given to the provider. Defaults to the host's CREATEOS_API_KEY."
                },
                "shape": { "type": "string", "enum": SHAPES, "default": DEFAULT_SHAPE },
                "rootfs": { "type": "string", "minLength": 1, "maxLength": 200 },
                "region": { "type": "string", "minLength": 1, "maxLength": 200 },
                "timeoutMs": {
                    "type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_MS, "default": DEFAULT_TIMEOUT_MS,
                    "description": "Default command timeout, and the budget of each lifecycle operation."
                },
                "requestTimeoutMs": {
                    "type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_MS, "default": DEFAULT_REQUEST_TIMEOUT_MS,
                    "description": "Budget of each API request outside a command's run; each cleanup request gets it afresh."
                },
                "reuseLease": {
                    "type": "boolean", "default": false,
                    "description": "Pause released sandboxes for reuse instead of deleting them."
                },
                "hardExpiry": {
                    "type": "boolean", "default": false,
                    "description": "The backend attests a hard expiry for a sandbox (createos-local does; the CreateOS service does not): only then is a requested expiry honoured, else refused."
                },
                "rootfsByAdapter": {
                    "type": "object",
                    "additionalProperties": { "type": "string", "minLength": 1, "maxLength": 200 },
                    "propertyNames": { "pattern": "^[A-Za-z0-9_-]{1,64}$" },
                    "description": "The root filesystem per agent adapter type, before rootfs; a change expires reusable leases of that adapter."
                },
                "egressAllowlist": {
                    "type": "array", "minItems": 1, "items": { "type": "string", "minLength": 1 },
                    "description": "What sandboxes may reach when a run asks for no policy: host[:port], *.domain[:port], IP, [v6]:port, address/prefix; [\"*\"] for the default; a change expires reusable leases."
                },
                "autoPauseAfterSeconds": {
                    "type": "integer", "minimum": 60, "maximum": 86400,
                    "description": "Idle window after which the service pauses a sandbox; a released reusable lease is left running until then."
                },
                "ingress": {
                    "type": "boolean", "default": false,
                    "description": "Create sandboxes with ingress enabled, so that their ports can be opened."
                }
            },
            "additionalProperties": true
        });
        assert_eq!(text, object);
    }
}
