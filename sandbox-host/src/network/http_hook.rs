//! The wasi-http `send_request` hook: collects the guest's request body and
//! hands the request to the instance's [`Transport`].

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use crate::network::transport::{OutgoingRequest, RequestTimeouts, Transport};

type IoFuture = Box<dyn Future<Output = Result<(), HttpError>> + Send>;

pub(crate) struct HttpHooks {
    transport: Arc<dyn Transport>,
    deadline: Option<Instant>,
}

impl HttpHooks {
    pub(crate) fn new(transport: Arc<dyn Transport>, deadline: Option<Instant>) -> Self {
        HttpHooks {
            transport,
            deadline,
        }
    }
}

impl WasiHttpHooks for HttpHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _request_result: IoFuture,
    ) -> Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), HttpError>> + Send>
    {
        let transport = self.transport.clone();
        let deadline = self.deadline;
        Box::new(async move {
            let (parts, body) = request.into_parts();
            let body = body.collect().await?.to_bytes();
            let options = options.unwrap_or_default();
            let outgoing = OutgoingRequest {
                method: parts.method,
                uri: parts.uri,
                headers: parts.headers,
                body,
                timeouts: RequestTimeouts {
                    connect: options.connect_timeout,
                    first_byte: options.first_byte_timeout,
                    between_bytes: options.between_bytes_timeout,
                },
                deadline,
            };
            let answer = transport.send(outgoing).await?;
            let body = answer
                .body
                .into_inner()
                .map_err(HttpError::from)
                .boxed_unsync();
            let mut response = http::Response::new(body);
            *response.status_mut() = answer.status;
            *response.headers_mut() = answer.headers;
            Ok((response, Box::new(async { Ok(()) }) as IoFuture))
        })
    }
}
