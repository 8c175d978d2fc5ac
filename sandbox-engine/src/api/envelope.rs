//! The JSend envelope the CreateOS API speaks.
//!
//! - success: `{"status":"success","data":{...}}` (2xx)
//! - client failure: `{"status":"fail","data":{"message":...,"reason":...}}` (4xx)
//! - server error: `{"status":"error","message":...,"code":...}` (5xx)

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::{json, Value};

use crate::http::error::ApiError;

/// A success envelope around `data` (which must serialize to an object).
pub fn success<T: Serialize>(status: StatusCode, data: T) -> Response {
    let data =
        serde_json::to_value(data).unwrap_or_else(|e| json!({ "serialize_error": e.to_string() }));
    (status, Json(json!({ "status": "success", "data": data }))).into_response()
}

/// `200 OK` success envelope.
pub fn ok<T: Serialize>(data: T) -> Response {
    success(StatusCode::OK, data)
}

/// The CreateOS face renders the shared error as the JSend envelope (its
/// handlers return [`ApiError`] as is).
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        envelope_for(self.status, self.reason, &self.message, self.extra)
    }
}

/// Builds the envelope for any non-success status.
pub fn envelope_for(
    status: StatusCode,
    reason: &str,
    message: &str,
    extra: Option<Value>,
) -> Response {
    if status.is_server_error() {
        (
            status,
            Json(json!({ "status": "error", "message": message, "code": reason })),
        )
            .into_response()
    } else if status.is_client_error() {
        let mut data = json!({ "message": message, "reason": reason });
        if let (Some(Value::Object(extra)), Value::Object(map)) = (extra, &mut data) {
            map.extend(extra);
        }
        (status, Json(json!({ "status": "fail", "data": data }))).into_response()
    } else {
        status.into_response()
    }
}
