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

/// An error answer: 4xx become `fail`, 5xx become `error` envelopes.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Short machine-readable reason (`not_found`, `conflict`, …).
    pub reason: &'static str,
    /// Human-readable message (never contains secrets).
    pub message: String,
    /// Extra `data` fields for `fail` answers.
    pub extra: Option<Value>,
}

impl ApiError {
    /// An error with a status, reason and message.
    pub fn new(status: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            reason,
            message: message.into(),
            extra: None,
        }
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 404.
    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} not found"),
        )
    }

    /// 409.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// Adds `data` fields to a `fail` answer.
    pub fn with_extra(mut self, extra: Value) -> Self {
        self.extra = Some(extra);
        self
    }
}

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
