//! Reading API answers the same way in every provider: a 2xx body, its
//! JSON, its string and id fields. Anything else is an [`ApiError`] that
//! never carries the body.

use crate::errors::ApiError;
use crate::platform::{Platform, Request, Wait};
use crate::types::{CleanupPhase, ProviderError};
use serde_json::{Map, Value};

/// The largest non-streamed response body accepted (8 MiB).
pub const MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;

/// Sends a request and returns the body of its 2xx answer; any other
/// status is [`ApiError::Status`] (redirects are never followed).
pub fn call_bytes(
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

/// Sends a request and reads its 2xx answer as JSON (`null` for an empty
/// body, as a 201/204 has).
pub fn call_json(
    platform: &mut dyn Platform,
    request: &Request,
    wait: Wait,
) -> Result<Value, ApiError> {
    let body = call_bytes(platform, request, wait)?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&body).map_err(|_| ApiError::Invalid("the response is not JSON".into()))
}

/// An answer that must be a JSON object.
pub fn object(value: Value) -> Result<Map<String, Value>, ApiError> {
    match value {
        Value::Object(object) => Ok(object),
        _ => Err(ApiError::Invalid(
            "the response is not a JSON object".into(),
        )),
    }
}

/// True for an id safe to put in a path: `^[A-Za-z0-9_-]{1,200}$`.
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

/// An id field of an answer, checked with [`is_valid_id`].
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

/// The id (field `field`) of what a create request made, from its answer:
/// a definite failure is the API's error for `operation`; no answer, or
/// one without a valid id, leaves something that may exist and cannot be
/// found: `cleanup-failed` in `phase` (naming `sandbox_id`, when known).
pub fn created_id(
    answer: Result<Map<String, Value>, ApiError>,
    field: &str,
    operation: &str,
    sandbox_id: Option<&str>,
    phase: CleanupPhase,
) -> Result<String, ProviderError> {
    answer
        .and_then(|data| id_field(&data, field))
        .map_err(|error| error.into_creation_error(operation, sandbox_id, phase))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn ids_are_checked_before_they_reach_a_path() {
        assert!(is_valid_id("sb_1-A"));
        assert!(is_valid_id("3f1c9a0e-0b7d-4c59-9d4e-0a8f2f7c1b2a"));
        for bad in ["", "../x", "a/b", "a b", &"x".repeat(201)] {
            assert!(!is_valid_id(bad), "{bad}");
        }
        let data: Map<String, Value> = serde_json::from_str(r#"{"id":"a/b","n":1}"#).unwrap();
        assert!(matches!(id_field(&data, "id"), Err(ApiError::Invalid(_))));
        assert!(matches!(id_field(&data, "n"), Err(ApiError::Invalid(_))));
    }
}
