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
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

/// A connection's place under the connection cap, in every request's
/// extensions. A request that upgrades the connection (a WebSocket) takes
/// the place with it, so that the upgraded connection still counts until
/// it closes; otherwise the place is freed when the connection ends.
#[derive(Clone)]
pub struct ConnectionSlot(Arc<std::sync::Mutex<Option<OwnedSemaphorePermit>>>);

impl ConnectionSlot {
    fn new(permit: OwnedSemaphorePermit) -> Self {
        Self(Arc::new(std::sync::Mutex::new(Some(permit))))
    }

    /// Takes the place out of the connection (at most once; `None` after).
    pub fn take(&self) -> Option<OwnedSemaphorePermit> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

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

/// The answer to a connection taken while the server is out of
/// descriptors (see [`crate::network::accept::Reserve`]).
const OUT_OF_DESCRIPTORS: &str = concat!(
    r#"{"status":"error","message":"the server is out of file descriptors and "#,
    r#"takes no new work; retry later","code":"out_of_descriptors"}"#
);

/// Tells whether a request's headers carry the API key.
pub type KeyCheck = Arc<dyn Fn(&axum::http::HeaderMap) -> bool + Send + Sync>;

/// The open connections that have not (yet) sent a request with the key,
/// oldest first: when every slot is taken, a new connection evicts the
/// oldest of them, so that unauthenticated (for example half-sent)
/// connections can never keep an authenticated client out.
#[derive(Default)]
struct Unauthenticated {
    next: u64,
    open: std::collections::VecDeque<(
        u64,
        std::time::Instant,
        Arc<std::sync::atomic::AtomicBool>,
        Arc<tokio::sync::Notify>,
    )>,
}

/// A connection is evicted only once it has been open this long without
/// sending the key: a burst of new connections is refused (503) as before,
/// and a client whose request is on its way is not cut off.
const EVICT_MIN_AGE: Duration = Duration::from_secs(2);

impl Unauthenticated {
    fn add(
        &mut self,
    ) -> (
        u64,
        Arc<std::sync::atomic::AtomicBool>,
        Arc<tokio::sync::Notify>,
    ) {
        self.next += 1;
        let (authed, evict): (Arc<std::sync::atomic::AtomicBool>, Arc<tokio::sync::Notify>) =
            (Arc::default(), Arc::default());
        self.open.push_back((
            self.next,
            std::time::Instant::now(),
            authed.clone(),
            evict.clone(),
        ));
        (self.next, authed, evict)
    }

    fn remove(&mut self, id: u64) {
        self.open.retain(|(i, _, _, _)| *i != id);
    }

    /// Closes the oldest connection that has not authenticated, if it is
    /// at least [`EVICT_MIN_AGE`] old; `false` when there is none.
    fn evict_oldest(&mut self) -> bool {
        use std::sync::atomic::Ordering;
        self.open
            .retain(|(_, _, authed, _)| !authed.load(Ordering::SeqCst));
        match self.open.front() {
            Some((_, since, _, _)) if since.elapsed() >= EVICT_MIN_AGE => {}
            _ => return false,
        }
        match self.open.pop_front() {
            Some((_, _, _, evict)) => {
                evict.notify_one();
                true
            }
            None => false,
        }
    }
}

fn lock(m: &std::sync::Mutex<Unauthenticated>) -> std::sync::MutexGuard<'_, Unauthenticated> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Serves `app` on `listener` until `stop` turns true, then stops accepting
/// and waits for the open connections to finish their current requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    check: KeyCheck,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let unauthenticated = Arc::new(std::sync::Mutex::new(Unauthenticated::default()));
    let mut open = JoinSet::new();
    let mut reserve = crate::network::accept::Reserve::new();
    // One 503 for lack of descriptors at a time: each holds a descriptor
    // until the client has read it.
    let refusing = Arc::new(Semaphore::new(1));
    loop {
        reserve.refill();
        let accepted = tokio::select! {
            _ = stopped(&mut stop) => break,
            accepted = listener.accept() => accepted,
        };
        while open.try_join_next().is_some() {}
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors: the reserve lets one waiting client
                // be told so instead of waiting for nothing.
                if crate::network::accept::out_of_descriptors(&e) && reserve.release() {
                    use futures_util::FutureExt;
                    if let Some(Ok((stream, _))) = listener.accept().now_or_never() {
                        refuse_for_descriptors(&mut open, &refusing, stream);
                    }
                }
                tokio::select! {
                    _ = stopped(&mut stop) => break,
                    _ = crate::network::accept::after_failure(&e) => {}
                }
                continue;
            }
        };
        // Short of descriptors: what is left is kept for proving sandboxes
        // gone (issue 40 item 2). The oldest connection that never sent
        // the key makes room, as when every slot is taken (a flood of
        // half-open connections cannot keep a client out); without one,
        // the connection is told so and closed, and the loop waits before
        // it takes the next one.
        if crate::trees::fds::headroom_fast() < crate::trees::fds::CONNECTION_RESERVE
            && !lock(&unauthenticated).evict_oldest()
        {
            refuse_for_descriptors(&mut open, &refusing, stream);
            tokio::select! {
                _ = stopped(&mut stop) => break,
                _ = tokio::time::sleep(crate::network::accept::BACKOFF) => {}
            }
            continue;
        }
        let _ = stream.set_nodelay(true);
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => Some(slot),
            // Full: make room by closing the oldest unauthenticated
            // connection (its slot comes back when its task ends).
            Err(_) if lock(&unauthenticated).evict_oldest() => None,
            Err(_) => {
                open.spawn(refuse(stream, BUSY));
                continue;
            }
        };
        let app = app.clone();
        let stop = stop.clone();
        let check = check.clone();
        let slots = slots.clone();
        let unauthenticated = unauthenticated.clone();
        open.spawn(async move {
            let slot = match slot {
                Some(slot) => slot,
                None => match tokio::time::timeout(Duration::from_secs(2), slots.acquire_owned())
                    .await
                {
                    Ok(Ok(slot)) => slot,
                    _ => return refuse(stream, BUSY).await,
                },
            };
            let slot = ConnectionSlot::new(slot);
            let (id, authed, evict) = lock(&unauthenticated).add();
            tokio::select! {
                _ = serve_one(stream, app, limits, check, authed, stop, slot.clone()) => {}
                _ = evict.notified() => {}
            }
            lock(&unauthenticated).remove(id);
            drop(slot);
        });
    }
    while open.join_next().await.is_some() {}
}

async fn serve_one(
    stream: TcpStream,
    app: Router,
    limits: ConnectionLimits,
    check: KeyCheck,
    authed: Arc<std::sync::atomic::AtomicBool>,
    mut stop: watch::Receiver<bool>,
    slot: ConnectionSlot,
) {
    let mut first_byte = [0u8; 1];
    let first = tokio::select! {
        first = tokio::time::timeout(limits.first_request_timeout, stream.peek(&mut first_byte)) => first,
        _ = stopped(&mut stop) => return,
    };
    if !matches!(first, Ok(Ok(n)) if n > 0) {
        return;
    }
    let inner = TowerToHyperService::new(app);
    // A request with the key makes the connection authenticated: it is
    // never evicted for a newcomer (see `Unauthenticated`).
    let service =
        hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            if check(req.headers()) {
                authed.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            req.extensions_mut().insert(slot.clone());
            hyper::service::Service::call(&inner, req)
        });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    // Upgrades (the Daytona toolbox's log WebSocket) are handed the
    // connection; the rest is plain HTTP/1.1.
    let conn = builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = stopped(&mut stop) => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Answers `stream` 503 `out_of_descriptors` unless such an answer is
/// already on its way (then it is closed at once: each answer holds a
/// descriptor until the client has read it).
fn refuse_for_descriptors(open: &mut JoinSet<()>, refusing: &Arc<Semaphore>, stream: TcpStream) {
    if let Ok(permit) = refusing.clone().try_acquire_owned() {
        open.spawn(async move {
            refuse(stream, OUT_OF_DESCRIPTORS).await;
            drop(permit);
        });
    }
}

/// Resolves once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Answers 503 with `body` and closes. What the client sent first is read
/// (briefly) and discarded, so that closing does not reset the connection
/// before the client has read the answer.
async fn refuse(mut stream: TcpStream, body: &'static str) {
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
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
