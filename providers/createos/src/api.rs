//! CreateOS requests: the JSend envelope, ids, and how failures map onto
//! the contract's error cases.
//!
//! Nothing here puts a response body, a URL or a secret into an error: a
//! rejection carries the operation and the status only.

use crate::platform::{Method, Platform, Request, Response, Wait};
pub use provider_sdk::errors::{cleanup_cause, encode_query_value, with_partial, ApiError};
use serde_json::{Map, Value};

/// The largest non-streamed response body accepted (8 MiB).
pub const MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;

/// True for an id the spec allows: `^[A-Za-z0-9_-]{1,200}$`.
pub fn is_valid_id(id: &str) -> bool {
    (1..=200).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Builds a request with an optional JSON body.
pub fn json_request(method: Method, path: String, body: Option<Value>) -> Request {
    Request {
        method,
        origin: None,
        headers: Vec::new(),
        path,
        body: body.map(|b| ("application/json", b.to_string().into_bytes())),
    }
}

/// Reads a success envelope `{"status":"success","data":{...}}` from a
/// response; any other answer is an [`ApiError`].
pub fn parse_envelope(response: &Response) -> Result<Map<String, Value>, ApiError> {
    if !(200..300).contains(&response.status) {
        return Err(ApiError::Status(response.status));
    }
    let value: Value = serde_json::from_slice(&response.body)
        .map_err(|_| ApiError::Invalid("the response is not JSON".into()))?;
    let Value::Object(mut envelope) = value else {
        return Err(ApiError::Invalid(
            "the response is not a JSON object".into(),
        ));
    };
    if envelope.get("status").and_then(Value::as_str) != Some("success") {
        return Err(ApiError::Invalid(
            "the response envelope is not a success".into(),
        ));
    }
    match envelope.remove("data") {
        Some(Value::Object(data)) => Ok(data),
        _ => Err(ApiError::Invalid(
            "the response envelope has no data object".into(),
        )),
    }
}

/// Sends a request and reads its success envelope.
pub fn call(
    platform: &mut dyn Platform,
    request: &Request,
    wait: Wait,
) -> Result<Map<String, Value>, ApiError> {
    let response = platform
        .send(request, wait, MAX_RESPONSE_BYTES)
        .map_err(ApiError::Transport)?;
    parse_envelope(&response)
}

/// Sends a request whose success answer is raw bytes (`GET /files`).
pub fn call_raw(
    platform: &mut dyn Platform,
    request: &Request,
    wait: Wait,
) -> Result<Vec<u8>, ApiError> {
    let response = platform
        .send(request, wait, MAX_RESPONSE_BYTES)
        .map_err(ApiError::Transport)?;
    if (200..300).contains(&response.status) {
        Ok(response.body)
    } else {
        Err(ApiError::Status(response.status))
    }
}

/// A string field of `data`.
pub fn string_field<'a>(data: &'a Map<String, Value>, field: &str) -> Result<&'a str, ApiError> {
    data.get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::Invalid(format!("the response has no string `{field}`")))
}

/// An id field of `data`, checked against the id pattern.
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

/// The path of a sandbox.
pub fn sandbox_path(sandbox_id: &str) -> String {
    format!("/v1/sandboxes/{sandbox_id}")
}

/// The path of a managed process.
pub fn process_path(sandbox_id: &str, process_id: &str) -> String {
    format!("/v1/sandboxes/{sandbox_id}/processes/{process_id}")
}

/// The `/files` path of a file in a sandbox.
pub fn file_path(sandbox_id: &str, path: &str) -> String {
    format!(
        "/v1/sandboxes/{sandbox_id}/files?path={}",
        encode_query_value(path)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn response(status: u16, body: &str) -> Response {
        Response {
            status,
            body: body.as_bytes().to_vec(),
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_success_envelope_gives_its_data() {
        let data = parse_envelope(&response(
            201,
            r#"{"status":"success","data":{"id":"sb-1"}}"#,
        ))
        .unwrap();
        assert_eq!(id_field(&data, "id").unwrap(), "sb-1");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn anything_else_is_an_error_without_the_body() {
        assert_eq!(
            parse_envelope(&response(500, "secret body")),
            Err(ApiError::Status(500))
        );
        assert_eq!(
            parse_envelope(&response(302, "")),
            Err(ApiError::Status(302))
        );
        for body in [
            "secret body",
            "[]",
            r#"{"status":"fail","data":{}}"#,
            r#"{"status":"success","data":[]}"#,
            r#"{"status":"success"}"#,
        ] {
            match parse_envelope(&response(200, body)) {
                Err(ApiError::Invalid(reason)) => assert!(!reason.contains("secret")),
                other => panic!("{body}: {other:?}"),
            }
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn ids_are_checked() {
        assert!(is_valid_id("sb_1-A"));
        assert!(!is_valid_id(""));
        assert!(!is_valid_id("../x"));
        assert!(!is_valid_id(&"a".repeat(201)));
        let data: Map<String, Value> = serde_json::from_str(r#"{"id":"a/b","n":1}"#).unwrap();
        assert!(matches!(id_field(&data, "id"), Err(ApiError::Invalid(_))));
        assert!(matches!(id_field(&data, "n"), Err(ApiError::Invalid(_))));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn query_values_are_percent_encoded() {
        assert_eq!(
            encode_query_value("/tmp/a b&c=d%€"),
            "/tmp/a%20b%26c%3Dd%25%E2%82%AC"
        );
    }
}
