//! Daytona requests: the two bases (API and toolbox), plain JSON answers,
//! ids, and the organization header. Failures map onto the contract through
//! the SDK's [`ApiError`].

use crate::config::Config;
use provider_sdk::platform::{Method, Platform, Request, Wait};
use serde_json::{Map, Value};

pub use provider_sdk::errors::{cleanup_cause, encode_query_value, with_partial, ApiError};

/// The largest non-streamed response body accepted (8 MiB).
pub const MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;

/// The header naming the organization a request acts for.
pub const ORGANIZATION_HEADER: &str = "X-Daytona-Organization-ID";

/// The header that asks the toolbox for command logs with their stream
/// markers; without it (and without an SDK version header) the service
/// answers stdout and stderr combined, markers removed.
pub const SPLIT_OUTPUT_HEADER: &str = "X-Daytona-Split-Output";

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Face {
    /// The main API (`{apiUrl}/sandbox...`): the platform's default origin.
    Api,
    /// The toolbox proxy (`{toolboxUrl}/{sandboxId}/...`).
    Toolbox,
}

/// Builds a request to `face` for `path` (after the base path), with an
/// optional JSON body and the organization header when configured.
pub fn request(
    config: &Config,
    face: Face,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Request {
    let mut request = match face {
        Face::Api => Request::new(method, format!("{}{path}", config.api.path)),
        Face::Toolbox => Request::new(method, format!("{}{path}", config.toolbox.path))
            .to_origin(config.toolbox.origin()),
    };
    if let Some(body) = body {
        request = request.with_body("application/json", body.to_string().into_bytes());
    }
    if let Some(organization) = &config.organization_id {
        request = request.with_header(ORGANIZATION_HEADER, organization);
    }
    request
}

/// Sends a request and reads its 2xx answer: the JSON value (`null` for an
/// empty body, as a 201/204 has).
pub fn call(platform: &mut dyn Platform, request: &Request, wait: Wait) -> Result<Value, ApiError> {
    let response = platform
        .send(request, wait, MAX_RESPONSE_BYTES)
        .map_err(ApiError::Transport)?;
    if !(200..300).contains(&response.status) {
        return Err(ApiError::Status(response.status));
    }
    if response.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&response.body)
        .map_err(|_| ApiError::Invalid("the response is not JSON".into()))
}

/// Like [`call`], requiring a JSON object.
pub fn call_object(
    platform: &mut dyn Platform,
    request: &Request,
    wait: Wait,
) -> Result<Map<String, Value>, ApiError> {
    match call(platform, request, wait)? {
        Value::Object(object) => Ok(object),
        _ => Err(ApiError::Invalid(
            "the response is not a JSON object".into(),
        )),
    }
}

/// True for an id safe to put in a path: `^[A-Za-z0-9_-]{1,200}$`
/// (Daytona's sandbox and command ids are UUIDs).
pub fn is_valid_id(id: &str) -> bool {
    (1..=200).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A string field of an answer.
pub fn string_field<'a>(data: &'a Map<String, Value>, field: &str) -> Result<&'a str, ApiError> {
    data.get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::Invalid(format!("the response has no string `{field}`")))
}

/// An id field of an answer, checked against the id pattern.
pub fn id_field(data: &Map<String, Value>, field: &str) -> Result<String, ApiError> {
    let id = string_field(data, field)?;
    if is_valid_id(id) {
        Ok(id.to_string())
    } else {
        Err(ApiError::Invalid(format!(
            "the response has an invalid `{field}`"
        )))
    }
}

/// `/sandbox/{id}` (API).
pub fn sandbox_path(sandbox_id: &str) -> String {
    format!("/sandbox/{sandbox_id}")
}

/// `/{id}/process/session/{sessionId}` (toolbox).
pub fn session_path(sandbox_id: &str, session_id: &str) -> String {
    format!("/{sandbox_id}/process/session/{session_id}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn requests_go_to_their_face_with_the_organization_header() {
        let config = config::parse(
            r#"{"apiUrl":"http://127.0.0.1:1/daytona/api","toolboxUrl":"http://127.0.0.1:2/toolbox","organizationId":"org-1"}"#,
        )
        .unwrap();
        let api = request(&config, Face::Api, Method::Get, "/sandbox/x", None);
        assert_eq!(api.path, "/daytona/api/sandbox/x");
        assert_eq!(api.origin, None);
        assert_eq!(
            api.headers,
            vec![(ORGANIZATION_HEADER.to_string(), "org-1".to_string())]
        );
        let toolbox = request(
            &config,
            Face::Toolbox,
            Method::Post,
            "/x/process/session",
            Some(serde_json::json!({})),
        );
        assert_eq!(toolbox.path, "/toolbox/x/process/session");
        assert_eq!(toolbox.origin.unwrap().authority, "127.0.0.1:2");
        assert_eq!(toolbox.body.unwrap().0, "application/json");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn ids_are_checked_before_they_reach_a_path() {
        assert!(is_valid_id("3f1c9a0e-0b7d-4c59-9d4e-0a8f2f7c1b2a"));
        for bad in ["", "../x", "a/b", "a b", &"x".repeat(201)] {
            assert!(!is_valid_id(bad), "{bad}");
        }
    }
}
