//! The real network transport, on wasmtime-wasi-http's hyper client.

use std::future::Future;
use std::io::ErrorKind;
use std::pin::Pin;
use std::task::{Context, Poll};

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
            let (parts, body) = response.into_parts();
            let body = DrivenBody {
                body: Box::pin(body),
                connection: Some(Box::pin(connection)),
            };
            Ok(TransportResponse {
                status: parts.status,
                headers: parts.headers,
                body: ResponseBody::new(body.map_err(error_code)),
            })
        })
    }
}

/// A response body that drives its own connection: each poll of the body
/// first lets the connection read from the socket, on the thread that
/// reads the body. A connection spawned as a task of its own handed every
/// frame from a runtime thread to the reading thread and back (the body
/// asks for the next frame only once it has taken one): two thread wake-ups
/// per frame, most of the CPU of a fast output stream (BENCHMARKS.md, issue
/// 41 item 3). Nothing reads the socket while the body is not polled: the
/// server then waits (backpressure). Dropping the body closes the
/// connection.
struct DrivenBody<B, C> {
    body: Pin<Box<B>>,
    /// `None` once the connection has ended (its error, if any, reaches
    /// the body as the body's own error).
    connection: Option<Pin<Box<C>>>,
}

impl<B, C> http_body::Body for DrivenBody<B, C>
where
    B: http_body::Body,
    C: Future<Output = Result<(), HttpError>>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        if let Some(connection) = self.connection.as_mut() {
            if connection.as_mut().poll(cx).is_ready() {
                self.connection = None;
            }
        }
        self.body.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
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
