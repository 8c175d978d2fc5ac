//! The real network transport, on wasmtime-wasi-http's hyper client.

use std::io::ErrorKind;

use http_body_util::{BodyExt, Full};
use wasmtime_wasi_http::p2::bindings::http::types::DnsErrorPayload;
use wasmtime_wasi_http::p2::hyper_response_error;
use wasmtime_wasi_http::{default_send_request, Error as HttpError, RequestOptions};

use crate::network::body::ResponseBody;
use crate::network::transport::{
    ErrorCode, OutgoingRequest, Transport, TransportFuture, TransportResponse,
};

/// Sends requests over the network (HTTP/1.1, TLS with the webpki roots).
///
/// It connects to whatever the URI names and follows no redirect; put it
/// behind a [`Guard`](crate::Guard) to restrict it to one origin. Timeouts
/// come from the request (a guard always sets them).
#[derive(Debug, Clone, Copy, Default)]
pub struct NetworkTransport;

impl NetworkTransport {
    /// A network transport.
    pub fn new() -> Self {
        NetworkTransport
    }
}

impl Transport for NetworkTransport {
    fn send(&self, request: OutgoingRequest) -> TransportFuture {
        Box::pin(async move {
            let mut builder = http::Request::builder()
                .method(request.method)
                .uri(request.uri);
            if let Some(headers) = builder.headers_mut() {
                *headers = request.headers;
            }
            let body = Full::new(request.body).map_err(|never| match never {});
            let outgoing = builder
                .body(body)
                .map_err(|e| ErrorCode::InternalError(Some(e.to_string())))?;
            let options = RequestOptions {
                connect_timeout: request.timeouts.connect,
                first_byte_timeout: request.timeouts.first_byte,
                between_bytes_timeout: request.timeouts.between_bytes,
            };
            let (response, connection) = default_send_request(outgoing, Some(options))
                .await
                .map_err(error_code)?;
            // The connection task drives the response body; it ends when the
            // body is finished or dropped.
            tokio::spawn(async move {
                let _ = connection.await;
            });
            let (parts, body) = response.into_parts();
            Ok(TransportResponse {
                status: parts.status,
                headers: parts.headers,
                body: ResponseBody::new(body.map_err(error_code)),
            })
        })
    }
}

/// Maps the embedder error of wasmtime-wasi-http to the guest's error code.
fn error_code(error: HttpError) -> ErrorCode {
    match error {
        HttpError::Hyper(e) => hyper_response_error(e),
        HttpError::Connect(e) => {
            if e.kind() == ErrorKind::AddrNotAvailable
                || e.to_string()
                    .starts_with("failed to lookup address information")
            {
                ErrorCode::DnsError(DnsErrorPayload {
                    rcode: Some("address not available".into()),
                    info_code: None,
                })
            } else {
                ErrorCode::ConnectionRefused
            }
        }
        HttpError::Tls(_) => ErrorCode::TlsProtocolError,
        HttpError::InvalidDnsNameError(_) => ErrorCode::DnsError(DnsErrorPayload {
            rcode: Some("invalid dns name".into()),
            info_code: None,
        }),
        HttpError::ConnectionRefused => ErrorCode::ConnectionRefused,
        HttpError::ConnectionTerminated => ErrorCode::ConnectionTerminated,
        HttpError::ConnectionTimeout => ErrorCode::ConnectionTimeout,
        HttpError::ConnectionReadTimeout => ErrorCode::ConnectionReadTimeout,
        HttpError::ConnectionWriteTimeout => ErrorCode::ConnectionWriteTimeout,
        HttpError::HttpResponseTimeout => ErrorCode::HttpResponseTimeout,
        HttpError::HttpResponseIncomplete => ErrorCode::HttpResponseIncomplete,
        HttpError::HttpRequestUriInvalid => ErrorCode::HttpRequestUriInvalid,
        HttpError::HttpRequestDenied => ErrorCode::HttpRequestDenied,
        HttpError::HttpProtocolError => ErrorCode::HttpProtocolError,
        HttpError::InternalError(message) => ErrorCode::InternalError(message),
        other => ErrorCode::InternalError(Some(other.to_string())),
    }
}
