//! Daytona requests: the two bases (API and toolbox), plain JSON answers
//! and the organization header. Failures map onto the contract through
//! the SDK's [`ApiError`].

use crate::config::Config;
use provider_sdk::errors::ApiError;
use provider_sdk::http;
use provider_sdk::platform::{Method, Platform, Request, Wait};
use serde_json::{Map, Value};

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
        request = request.with_json(&body);
    }
    if let Some(organization) = &config.organization_id {
        request = request.with_header(ORGANIZATION_HEADER, organization);
    }
    request
}

/// Sends a request and reads its 2xx answer: plain JSON (`null` for an
/// empty body, as a 201/204 has).
pub fn call(platform: &mut dyn Platform, request: &Request, wait: Wait) -> Result<Value, ApiError> {
    http::call_json(platform, request, wait)
}

/// Like [`call`], requiring a JSON object.
pub fn call_object(
    platform: &mut dyn Platform,
    request: &Request,
    wait: Wait,
) -> Result<Map<String, Value>, ApiError> {
    call(platform, request, wait).and_then(http::object)
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
    use provider_sdk::config::ProviderConfig;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn requests_go_to_their_face_with_the_organization_header() {
        let config = Config::parse(
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
}
