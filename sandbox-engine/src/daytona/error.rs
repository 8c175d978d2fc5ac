//! The error body of the Daytona face: `{"statusCode":N,"message":...,
//! "error":"Not Found","code":"not_found"}` (the shape of the real API's
//! NestJS errors, plus the machine-readable `code` the CreateOS face calls
//! `reason`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::http::error::ApiError;

/// An error answer of the Daytona face. Every helper of the CreateOS face
/// that returns an [`ApiError`] converts into it with `?`.
#[derive(Debug, Clone)]
pub struct DaytonaError(pub ApiError);

impl From<ApiError> for DaytonaError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl DaytonaError {
    /// An error with a status, machine-readable code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self(ApiError::new(status, code, message))
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self(ApiError::bad_request(message))
    }

    /// 404 naming what was not found.
    pub fn not_found(what: &str) -> Self {
        Self(ApiError::not_found(what))
    }

    /// 409.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self(ApiError::conflict(message))
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self(ApiError::internal(message))
    }
}

impl IntoResponse for DaytonaError {
    fn into_response(self) -> Response {
        body(self.0.status, self.0.reason, &self.0.message, self.0.extra)
    }
}

/// The error body for any non-success status.
pub fn body(status: StatusCode, code: &str, message: &str, extra: Option<Value>) -> Response {
    let mut v = json!({
        "statusCode": status.as_u16(),
        "message": message,
        "error": status.canonical_reason().unwrap_or("Error"),
        "code": code,
    });
    if let (Some(Value::Object(extra)), Value::Object(map)) = (extra, &mut v) {
        map.extend(extra);
    }
    (status, Json(v)).into_response()
}
