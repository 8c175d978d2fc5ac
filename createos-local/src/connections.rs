//! The HTTP/1.1 accept loop: a cap on concurrent connections (the ones over
//! it get a JSend 503 and are closed), timeouts so that idle or trickling
//! connections cannot pin the server, and a graceful stop that lets open
//! requests and `/connect` streams finish.
//!
//! Two timeouts: a new connection must send its first bytes within
//! [`ConnectionLimits::first_request_timeout`] (idle connection floods), and
//! every request's headers must be complete within
//! [`ConnectionLimits::header_read_timeout`], which also closes idle
//! keep-alive connections. The latter is longer than the usual client pool
//! idle timeout (90 s), so that a keep-alive client closes an idle
//! connection first instead of racing the server's close with a new request
//! (which it would see as a failed request).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

/// Limits of the accept loop.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Most connections served at once.
    pub max_connections: usize,
    /// How long a new connection may stay silent before its first request.
    pub first_request_timeout: Duration,
    /// How long a client may take to send a request's headers (also how
    /// long an idle keep-alive connection stays open).
    pub header_read_timeout: Duration,
}

/// Default cap on concurrent connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// Default time a new connection may stay silent.
pub const DEFAULT_FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Default header-read (and keep-alive idle) timeout.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(120);

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            first_request_timeout: DEFAULT_FIRST_REQUEST_TIMEOUT,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
        }
    }
}

/// The answer to a connection over the cap.
const BUSY: &str = concat!(
    r#"{"status":"error","message":"the server is at its connection limit; "#,
    r#"retry when other connections have closed","code":"too_many_connections"}"#
);

/// Serves `app` on `listener` until `stop` turns true, then stops accepting
/// and waits for the open connections to finish their current requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut open = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = stopped(&mut stop) => break,
            accepted = listener.accept() => accepted,
        };
        while open.try_join_next().is_some() {}
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of descriptors or a connection reset before accept:
                // back off briefly instead of spinning.
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        match slots.clone().try_acquire_owned() {
            Ok(slot) => {
                let app = app.clone();
                let stop = stop.clone();
                open.spawn(async move {
                    serve_one(stream, app, limits, stop).await;
                    drop(slot);
                });
            }
            Err(_) => {
                open.spawn(refuse(stream));
            }
        }
    }
    while open.join_next().await.is_some() {}
}

async fn serve_one(
    stream: TcpStream,
    app: Router,
    limits: ConnectionLimits,
    mut stop: watch::Receiver<bool>,
) {
    let mut first_byte = [0u8; 1];
    let first = tokio::select! {
        first = tokio::time::timeout(limits.first_request_timeout, stream.peek(&mut first_byte)) => first,
        _ = stopped(&mut stop) => return,
    };
    if !matches!(first, Ok(Ok(n)) if n > 0) {
        return;
    }
    let service = TowerToHyperService::new(app);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = stopped(&mut stop) => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Resolves once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Answers 503 and closes. What the client sent first is read (briefly)
/// and discarded, so that closing does not reset the connection before the
/// client has read the answer.
async fn refuse(mut stream: TcpStream) {
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{BUSY}",
        BUSY.len()
    );
    let mut sink = [0u8; 16 * 1024];
    let _ = tokio::time::timeout(Duration::from_millis(100), stream.read(&mut sink)).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = stream.write_all(answer.as_bytes()).await;
        let _ = stream.shutdown().await;
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// Raises the soft limit on open descriptors towards the hard limit (at
/// most to `want`), so that the connection cap and the pipes of many
/// processes fit. Returns the soft limit in force afterwards.
pub fn raise_descriptor_limit(want: u64) -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut lim = getrlimit(Resource::Nofile);
    let current = lim.current?;
    let target = match lim.maximum {
        Some(max) => want.min(max),
        None => want,
    };
    if current >= target {
        return Some(current);
    }
    lim.current = Some(target);
    match setrlimit(Resource::Nofile, lim) {
        Ok(()) => Some(target),
        Err(_) => Some(current),
    }
}
