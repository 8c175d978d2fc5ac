//! CreateOS requests: the JSend envelope, ids, and how failures map onto
//! the contract's error cases.
//!
//! Nothing here puts a response body, a URL or a secret into an error: a
//! rejection carries the operation and the status only.

use provider_sdk::errors::{encode_query_value, ApiError};
use provider_sdk::http::{self, MAX_RESPONSE_BYTES};
use provider_sdk::platform::{Method, Platform, Request, Response, Wait};
use serde_json::{Map, Value};

/// Builds a request with an optional JSON body.
pub fn json_request(method: Method, path: String, body: Option<Value>) -> Request {
    match body {
        Some(body) => Request::new(method, path).with_json(&body),
        None => Request::new(method, path),
    }
}

/// Reads a success envelope `{"status":"success","data":{...}}` from a
/// response; any other answer is an [`ApiError`].
pub fn parse_envelope(response: &Response) -> Result<Map<String, Value>, ApiError> {
    match parse_envelope_data(response)? {
        Value::Object(data) => Ok(data),
        _ => Err(ApiError::Invalid(
            "the response envelope has no data object".into(),
        )),
    }
}

/// The `data` of a success envelope, whatever JSON it is (a list, for
/// `GET /v1/templates`).
pub fn parse_envelope_data(response: &Response) -> Result<Value, ApiError> {
    if !(200..300).contains(&response.status) {
        return Err(ApiError::Status(response.status));
    }
    let value: Value = serde_json::from_slice(&response.body)
        .map_err(|_| ApiError::Invalid("the response is not JSON".into()))?;
    let mut envelope = http::object(value)?;
    if envelope.get("status").and_then(Value::as_str) != Some("success") {
        return Err(ApiError::Invalid(
            "the response envelope is not a success".into(),
        ));
    }
    envelope
        .remove("data")
        .ok_or_else(|| ApiError::Invalid("the response envelope has no data".into()))
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

/// Sends a request and reads its success envelope's `data`, whatever it is.
pub fn call_data(
    platform: &mut dyn Platform,
    request: &Request,
    wait: Wait,
) -> Result<Value, ApiError> {
    let response = platform
        .send(request, wait, MAX_RESPONSE_BYTES)
        .map_err(ApiError::Transport)?;
    parse_envelope_data(&response)
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
    use provider_sdk::http::id_field;
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
    fn query_values_are_percent_encoded() {
        assert_eq!(
            encode_query_value("/tmp/a b&c=d%€"),
            "/tmp/a%20b%26c%3Dd%25%E2%82%AC"
        );
    }
}
