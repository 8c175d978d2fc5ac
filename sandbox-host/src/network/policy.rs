//! The HTTP policy layer: one allowed origin, the secret header for it,
//! the origin's request pacer, clamped timeouts and a response size cap. A
//! [`Guard`] applies a [`Policy`] in front of any [`Transport`].

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use http::{HeaderName, HeaderValue, Method, StatusCode, Uri};

use crate::network::request_pacer::{Priority, RateLimit, RequestPacer};
#[cfg(test)]
use crate::network::request_pacer::{ENGINE_HEADER, ENGINE_RATE_LIMIT_HEADER};
use crate::network::transport::{
    ErrorCode, OutgoingRequest, RequestTimeouts, Transport, TransportFuture,
};

/// An origin: scheme, lower-case host and explicit port.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Origin {
    scheme: String,
    host: String,
    port: u16,
}

impl Origin {
    /// Parses `scheme://host[:port]` (a trailing `/` is tolerated). Only
    /// `http` and `https` are accepted; user-info, path, query and fragment
    /// are rejected.
    pub fn parse(text: &str) -> Result<Origin> {
        let uri: Uri = text
            .parse()
            .with_context(|| format!("invalid origin {text:?}"))?;
        let origin = Origin::of_uri(&uri).with_context(|| {
            format!("invalid origin {text:?}: expected scheme://host[:port] with http or https")
        })?;
        let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("");
        if !(path.is_empty() || path == "/") || text.contains('#') {
            bail!("invalid origin {text:?}: it must not have a path, query or fragment");
        }
        Ok(origin)
    }

    /// The origin of an absolute `http`/`https` URI without user-info.
    pub fn of_uri(uri: &Uri) -> Option<Origin> {
        let scheme = uri.scheme_str()?.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return None,
        };
        let authority = uri.authority()?;
        if authority.as_str().contains('@') {
            return None;
        }
        let host = authority.host();
        if host.is_empty() {
            return None;
        }
        Some(Origin {
            scheme,
            host: host.to_ascii_lowercase(),
            port: authority.port_u16().unwrap_or(default_port),
        })
    }

    /// The scheme (`http` or `https`).
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The host, lower-case (IPv6 literals keep their brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port, explicit or the scheme's default.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
    }
}

/// A header holding a secret. Its `Debug` never shows the value.
#[derive(Clone)]
struct SecretHeader {
    name: HeaderName,
    value: HeaderValue,
}

impl fmt::Debug for SecretHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretHeader({}: <redacted>)", self.name)
    }
}

/// One origin a provider may reach, and the secret headers its requests carry.
#[derive(Clone, Debug)]
struct AllowedOrigin {
    origin: Origin,
    secrets: Vec<SecretHeader>,
}

/// What a [`Guard`] enforces for one environment's provider.
#[derive(Clone, Debug)]
pub struct Policy {
    origins: Vec<AllowedOrigin>,
    rate_limit: Option<RateLimit>,
    /// `rate_limit` is the provider's declaration (not the operator's):
    /// an origin that answers as the engine does not spend it.
    rate_limit_declared: bool,
    pacer: RequestPacer,
    max_timeout: Option<Duration>,
    max_throttle_wait: Option<Duration>,
    max_response_bytes: Option<u64>,
}

impl Policy {
    /// How many times a request answered 429 is repeated (each after the
    /// pause the answer asked for), deadline permitting.
    pub const MAX_THROTTLED_REPEATS: u32 = 3;
    /// The longest pause a 429's `Retry-After` can impose.
    pub const MAX_THROTTLE_PAUSE: Duration = Duration::from_secs(300);

    /// Allows only `origin`; no secret, no rate limit, the global [`RequestPacer`].
    pub fn new(origin: Origin) -> Self {
        Policy {
            origins: vec![AllowedOrigin {
                origin,
                secrets: Vec::new(),
            }],
            rate_limit: None,
            rate_limit_declared: false,
            pacer: RequestPacer::global(),
            max_timeout: None,
            max_throttle_wait: None,
            // No cap on a body's size by default: a command's output
            // stream is as long as the command prints (`yes` passes 1 GiB
            // in seconds), its life is bounded by the operation's deadline
            // and its memory by reading chunk by chunk. A cap cut such a
            // stream, and the reconnect could not recover what was in
            // flight: output lost.
            max_response_bytes: None,
        }
    }

    /// [`Policy::new`] from an origin's text (`scheme://host[:port]`).
    pub fn for_origin(origin: &str) -> Result<Self> {
        Ok(Self::new(Origin::parse(origin)?))
    }

    /// Allows `origin` too (a provider with several API origins), with no
    /// secret until [`with_origin_secret`](Self::with_origin_secret).
    pub fn also_allow(mut self, origin: Origin) -> Self {
        if !self.origins.iter().any(|a| a.origin == origin) {
            self.origins.push(AllowedOrigin {
                origin,
                secrets: Vec::new(),
            });
        }
        self
    }

    /// Adds `name: value` to every request for the first allowed origin
    /// (the one [`Policy::new`] named), replacing any value the guest set.
    /// The value is marked sensitive and never printed.
    pub fn with_secret_header(self, name: &str, value: &str) -> Result<Self> {
        let first = self.origins[0].origin.clone();
        self.with_origin_secret(&first, name, value)
    }

    /// Adds `name: value` to every request for `origin` (which must be
    /// allowed), replacing any value the guest set. The value is marked
    /// sensitive and never printed.
    pub fn with_origin_secret(mut self, origin: &Origin, name: &str, value: &str) -> Result<Self> {
        let name = HeaderName::from_bytes(name.as_bytes())
            .with_context(|| format!("invalid secret header name {name:?}"))?;
        let mut value =
            HeaderValue::from_str(value).context("the secret is not a valid header value")?;
        value.set_sensitive(true);
        let allowed = self
            .origins
            .iter_mut()
            .find(|a| &a.origin == origin)
            .with_context(|| format!("{origin} is not an allowed origin"))?;
        allowed.secrets.retain(|s| s.name != name);
        allowed.secrets.push(SecretHeader { name, value });
        Ok(self)
    }

    /// Spends `limit` (`describe`'s `rate-limit`) on requests to the origin,
    /// across everything sharing the budget; `None`: no limit.
    pub fn with_rate_limit(mut self, limit: Option<RateLimit>) -> Self {
        self.rate_limit = limit;
        self.rate_limit_declared = false;
        self
    }

    /// Spends `limit`, the provider's declared `rate-limit`, on requests
    /// to the origin, except on an origin whose answers say they come from
    /// the embedded engine: there the engine's own budget, or none (see
    /// [`RequestPacer::note_answer`]). [`Policy::with_rate_limit`] is for
    /// the operator's limit, spent everywhere.
    pub fn with_declared_rate_limit(mut self, limit: Option<RateLimit>) -> Self {
        self.rate_limit = limit;
        self.rate_limit_declared = true;
        self
    }

    /// The budget a request to `origin` spends now.
    fn limit_for(&self, origin: &str) -> Option<RateLimit> {
        if !self.rate_limit_declared {
            return self.rate_limit;
        }
        match self.pacer.engine_budget(origin) {
            Some(own) => own,
            None => self.rate_limit,
        }
    }

    /// Uses `pacer` instead of [`RequestPacer::global`].
    pub fn with_request_pacer(mut self, pacer: RequestPacer) -> Self {
        self.pacer = pacer;
        self
    }

    /// The rate limit spent, if any.
    pub fn rate_limit(&self) -> Option<&RateLimit> {
        self.rate_limit.as_ref()
    }

    /// Repeats a request answered 429 only when the pause it asks for is
    /// at most `max` (the provider's own budget for one request): a longer
    /// pause would outlast the provider's wait, which would then count a
    /// request the 429 proved never ran as unanswered. Beyond it the 429
    /// goes to the provider at once.
    pub fn with_max_throttle_wait(mut self, max: Duration) -> Self {
        self.max_throttle_wait = Some(max);
        self
    }

    /// Clamps every per-phase timeout to at most `max`. Without it, only the
    /// operation's remaining deadline bounds them (long polls such as a
    /// process `wait` legitimately take minutes).
    pub fn with_max_timeout(mut self, max: Duration) -> Self {
        self.max_timeout = Some(max);
        self
    }

    /// Fails a response body with `HTTP-response-body-size` beyond `max`
    /// bytes. None by default: a command's output stream is as long as the
    /// command prints, so a cap here ends long streams with lost output.
    pub fn with_max_response_bytes(mut self, max: u64) -> Self {
        self.max_response_bytes = Some(max);
        self
    }

    /// The first allowed origin (the provider's main API).
    pub fn origin(&self) -> &Origin {
        &self.origins[0].origin
    }

    /// Every allowed origin, the first one first.
    pub fn origins(&self) -> impl Iterator<Item = &Origin> {
        self.origins.iter().map(|a| &a.origin)
    }

    /// `(origin, header, value)` of every secret header, for the shared
    /// decision table's tests only (values are secrets).
    #[cfg(test)]
    pub(crate) fn secret_headers(&self) -> Vec<(Origin, String, String)> {
        self.origins
            .iter()
            .flat_map(|a| {
                a.secrets.iter().map(|s| {
                    let value = s.value.to_str().unwrap_or_default().to_owned();
                    (a.origin.clone(), s.name.to_string(), value)
                })
            })
            .collect()
    }

    /// Whether `uri` is on an allowed origin.
    pub fn allows(&self, uri: &Uri) -> bool {
        self.allowed(uri).is_some()
    }

    fn allowed(&self, uri: &Uri) -> Option<&AllowedOrigin> {
        let origin = Origin::of_uri(uri)?;
        self.origins.iter().find(|a| a.origin == origin)
    }

    /// Puts this policy in front of `inner`.
    pub fn guard(self, inner: Arc<dyn Transport>) -> Guard {
        Guard::new(self, inner)
    }

    /// The smallest of what the guest asked for, the policy maximum and the
    /// remaining deadline (none of them: no limit is set).
    fn clamp(&self, requested: Option<Duration>, remaining: Option<Duration>) -> Option<Duration> {
        [requested, self.max_timeout, remaining]
            .into_iter()
            .flatten()
            .min()
    }
}

/// A [`Transport`] that enforces a [`Policy`] and then delegates.
///
/// - an origin not allowed: `HTTP-request-denied`, and `inner` never sees it;
/// - secret headers are added only here, each only for its own origin;
/// - with a rate limit, a request starts only when the origin's budget
///   allows (DELETE requests, which clean up, go first); a 429 pauses the
///   origin for its `Retry-After` (else one window) and the same request
///   is repeated after the pause, at most [`Policy::MAX_THROTTLED_REPEATS`]
///   times and never past the deadline (the contract's `rate-limit` says a
///   429 means the API did not carry the request out);
/// - per-phase timeouts are clamped to the policy maximum (if any) and the
///   operation's remaining deadline; a response head that has not come by the
///   deadline is `HTTP-response-timeout`, and so is a body not done by then;
/// - the response body is capped.
///
/// Redirects are never followed: no transport of this crate follows them,
/// and a 3xx reaches the guest as a plain response.
#[derive(Clone)]
pub struct Guard {
    policy: Arc<Policy>,
    inner: Arc<dyn Transport>,
}

impl Guard {
    /// Enforces `policy` in front of `inner`.
    pub fn new(policy: Policy, inner: Arc<dyn Transport>) -> Self {
        Guard {
            policy: Arc::new(policy),
            inner,
        }
    }

    /// The policy enforced.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Transport for Guard {
    fn send(&self, mut request: OutgoingRequest) -> TransportFuture {
        let Some(allowed) = self.policy.allowed(&request.uri) else {
            return Box::pin(async { Err(ErrorCode::HttpRequestDenied) });
        };
        for secret in &allowed.secrets {
            request
                .headers
                .insert(secret.name.clone(), secret.value.clone());
        }
        let key = allowed.origin.to_string();
        let policy = self.policy.clone();
        let inner = self.inner.clone();
        Box::pin(async move {
            let deadline = request.deadline;
            let priority = if request.method == Method::DELETE {
                Priority::Cleanup
            } else {
                Priority::Work
            };
            let mut repeats = 0;
            loop {
                let limit = policy.limit_for(&key);
                let grant = match &limit {
                    Some(limit) => {
                        let turn = policy.pacer.acquire(&key, limit, priority);
                        let granted = match deadline {
                            Some(deadline) => tokio::time::timeout_at(deadline.into(), turn)
                                .await
                                .map_err(|_| ErrorCode::ConnectionTimeout)?,
                            None => turn.await,
                        };
                        // The host could not read its own budget: it refuses
                        // to send rather than risk the provider's limit.
                        Some(granted.map_err(|_| ErrorCode::HttpRequestDenied)?)
                    }
                    None => None,
                };
                let mut attempt = request.clone();
                let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                attempt.timeouts = RequestTimeouts {
                    connect: policy.clamp(request.timeouts.connect, remaining),
                    first_byte: policy.clamp(request.timeouts.first_byte, remaining),
                    between_bytes: policy.clamp(request.timeouts.between_bytes, remaining),
                };
                let sent = inner.send(attempt);
                let answer = match deadline {
                    Some(deadline) => tokio::time::timeout_at(deadline.into(), sent)
                        .await
                        .unwrap_or(Err(ErrorCode::HttpResponseTimeout)),
                    None => sent.await,
                };
                // The API counted the request when it arrived, before this.
                drop(grant);
                let mut response = answer?;
                policy.pacer.note_answer(&key, &response.headers);
                if let (StatusCode::TOO_MANY_REQUESTS, Some(limit)) = (response.status, &limit) {
                    let header = response
                        .headers
                        .get(http::header::RETRY_AFTER)
                        .and_then(|value| value.to_str().ok());
                    let pause = throttle_pause(header, limit.window);
                    // Without a working budget the 429 goes to the provider.
                    let recorded = policy.pacer.throttled(&key, pause).is_ok();
                    let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                    let repeat = throttle_repeat_allowed(
                        repeats,
                        pause,
                        remaining,
                        policy.max_throttle_wait,
                    );
                    if recorded && repeat {
                        repeats += 1;
                        continue;
                    }
                }
                if let Some(max) = policy.max_response_bytes {
                    response.body = response.body.limit_size(max);
                }
                if let Some(deadline) = deadline {
                    response.body = response.body.deadline(deadline);
                }
                return Ok(response);
            }
        })
    }
}

/// A `Retry-After` value: only delta-seconds (ASCII digits, no sign; an
/// HTTP date is not trusted: clocks differ). A value too large for any
/// clock still counts (the pause is capped anyway).
fn retry_after(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Duration::from_secs(text.parse().unwrap_or(u64::MAX)))
}

/// How long a 429 pauses its origin: its `Retry-After` (seconds), else one
/// window, at most [`Policy::MAX_THROTTLE_PAUSE`]. The Node host's
/// `throttlePauseMs`; the shared decision table
/// (`node/test/scenarios/policy-decisions.json`) holds both.
pub(crate) fn throttle_pause(retry_after_header: Option<&str>, window: Duration) -> Duration {
    retry_after_header
        .and_then(retry_after)
        .unwrap_or(window)
        .min(Policy::MAX_THROTTLE_PAUSE)
}

/// Whether a request answered 429 is sent again: while repeats are left,
/// the pause ends before the operation's deadline (`remaining` of it), and
/// the pause fits one request's budget (`max_wait`). Otherwise the 429 goes
/// to the provider at once, a definite rejection. The Node host's
/// `throttleRepeatAllowed`; the shared decision table holds both.
pub(crate) fn throttle_repeat_allowed(
    repeats: u32,
    pause: Duration,
    remaining: Option<Duration>,
    max_wait: Option<Duration>,
) -> bool {
    repeats < Policy::MAX_THROTTLED_REPEATS
        && remaining.is_none_or(|remaining| pause < remaining)
        && max_wait.is_none_or(|max| pause <= max)
}

#[cfg(test)]
mod tests {
    use super::{throttle_pause, throttle_repeat_allowed, Origin};
    use crate::network::transport::Transport as _;
    use std::time::Duration;

    fn decisions() -> serde_json::Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../node/test/scenarios/policy-decisions.json");
        serde_json::from_str(&std::fs::read_to_string(path).expect("the shared decision table"))
            .expect("the shared decision table is JSON")
    }

    fn ms(value: &serde_json::Value) -> Option<Duration> {
        value.as_u64().map(Duration::from_millis)
    }

    /// The shared decision table's 429 pauses, as the Node host decides them.
    #[test]
    fn shared_decisions_throttle_pause() {
        let table = decisions();
        let cases = table["throttlePause"].as_array().unwrap();
        assert!(cases.len() >= 8);
        for case in cases {
            let pause = throttle_pause(case["retryAfter"].as_str(), ms(&case["windowMs"]).unwrap());
            assert_eq!(Some(pause), ms(&case["pauseMs"]), "{}", case["name"]);
        }
    }

    /// The shared decision table's repeats after a 429.
    #[test]
    fn shared_decisions_throttle_repeat() {
        let table = decisions();
        let cases = table["throttleRepeat"].as_array().unwrap();
        assert!(cases.len() >= 6);
        for case in cases {
            let repeat = throttle_repeat_allowed(
                case["repeats"].as_u64().unwrap() as u32,
                ms(&case["pauseMs"]).unwrap(),
                ms(&case["remainingMs"]),
                ms(&case["maxThrottleWaitMs"]),
            );
            assert_eq!(
                repeat,
                case["repeat"].as_bool().unwrap(),
                "{}",
                case["name"]
            );
        }
    }

    /// A streamed body longer than any fixed cap passes the guard whole by
    /// default: a command's output stream is as long as the command prints
    /// (the 1 GiB cap this replaced cut `yes` after about two seconds, and
    /// the reconnect lost what was in flight). An embedder's own cap still
    /// applies.
    #[test]
    fn a_streamed_body_has_no_size_cap_unless_the_embedder_sets_one() {
        use crate::network::body::ResponseBody;
        use crate::network::request_pacer::RequestPacer;
        use crate::network::transport::{
            OutgoingRequest, RequestTimeouts, Transport, TransportFuture, TransportResponse,
        };
        use http_body_util::BodyExt;
        use std::sync::Arc;

        const CHUNK: usize = 1024 * 1024;
        const CHUNKS: usize = 1100; // more than 1 GiB
        struct Endless;
        impl Transport for Endless {
            fn send(&self, _request: OutgoingRequest) -> TransportFuture {
                let chunk = bytes::Bytes::from(vec![b'y'; CHUNK]);
                let chunks = vec![(Duration::ZERO, chunk); CHUNKS];
                Box::pin(async move {
                    Ok(TransportResponse::new(
                        http::StatusCode::OK,
                        ResponseBody::chunks(chunks, None),
                    ))
                })
            }
        }
        let request = || OutgoingRequest {
            method: http::Method::GET,
            uri: "http://api.test/v1/connect".parse().unwrap(),
            headers: http::HeaderMap::new(),
            body: bytes::Bytes::new(),
            timeouts: RequestTimeouts::default(),
            deadline: None,
        };
        let read = |policy: super::Policy| {
            let guard = policy.guard(Arc::new(Endless));
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let mut body = guard.send(request()).await.unwrap().body.into_inner();
                let mut total = 0u64;
                while let Some(frame) = body.frame().await {
                    match frame {
                        Ok(frame) => total += frame.data_ref().map_or(0, |d| d.len() as u64),
                        Err(code) => return Err((total, code)),
                    }
                }
                Ok(total)
            })
        };
        let policy = || {
            super::Policy::for_origin("http://api.test")
                .unwrap()
                .with_request_pacer(RequestPacer::in_memory())
        };
        let whole = read(policy());
        assert!(
            matches!(whole, Ok(total) if total == (CHUNK * CHUNKS) as u64),
            "{whole:?}"
        );
        let capped = read(policy().with_max_response_bytes(4 * CHUNK as u64));
        assert!(
            matches!(capped, Err((seen, _)) if seen <= 4 * CHUNK as u64),
            "{capped:?}"
        );
    }

    /// A transport whose answers carry the engine's name when the origin
    /// is in `engines` (with that origin's budget header, if any).
    struct Answers {
        engines: Vec<(&'static str, Option<&'static str>)>,
    }

    impl crate::network::transport::Transport for Answers {
        fn send(
            &self,
            request: crate::network::transport::OutgoingRequest,
        ) -> crate::network::transport::TransportFuture {
            let mut response = crate::network::transport::TransportResponse::new(
                http::StatusCode::OK,
                crate::network::body::ResponseBody::chunks(Vec::new(), None),
            );
            let origin = Origin::of_uri(&request.uri).unwrap().to_string();
            if let Some((_, budget)) = self.engines.iter().find(|(o, _)| **o == origin) {
                let headers = &mut response.headers;
                headers.insert(super::ENGINE_HEADER, "createos-local".parse().unwrap());
                if let Some(budget) = budget {
                    headers.insert(super::ENGINE_RATE_LIMIT_HEADER, budget.parse().unwrap());
                }
            }
            Box::pin(async move { Ok(response) })
        }
    }

    /// Sends `count` GETs to `origin` through `policy` over `transport`;
    /// how many requests the pacer let start (spent a budget).
    fn starts(
        policy: super::Policy,
        transport: std::sync::Arc<Answers>,
        origin: &str,
        count: usize,
    ) -> u64 {
        let pacer = crate::network::request_pacer::RequestPacer::in_memory();
        let guard = policy.with_request_pacer(pacer.clone()).guard(transport);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            for _ in 0..count {
                let request = crate::network::transport::OutgoingRequest {
                    method: http::Method::GET,
                    uri: format!("{origin}/v1/sandboxes").parse().unwrap(),
                    headers: http::HeaderMap::new(),
                    body: bytes::Bytes::new(),
                    timeouts: Default::default(),
                    // Far beyond what the test needs; a request the budget
                    // held back for its window (an hour) fails instead of
                    // hanging the test.
                    deadline: Some(std::time::Instant::now() + Duration::from_secs(60)),
                };
                guard.send(request).await.expect(
                    "a request the pacer did not hold for the declared budget's hour answered",
                );
            }
        });
        pacer.stats().started
    }

    fn an_hour(requests: u32) -> crate::RateLimit {
        crate::RateLimit::new(requests, Duration::from_secs(3600))
    }

    /// Issue 44 item 4: an origin that answered as the embedded engine
    /// stops spending the provider's declared budget: only the first
    /// request (before it said so) spent it; with a budget of one per
    /// hour, the later ones would otherwise wait the hour.
    #[test]
    fn the_declared_budget_is_not_spent_on_an_origin_that_said_it_is_the_engine() {
        let engine = std::sync::Arc::new(Answers {
            engines: vec![("http://127.0.0.1:4000", None)],
        });
        let policy = super::Policy::for_origin("http://127.0.0.1:4000")
            .unwrap()
            .with_declared_rate_limit(Some(an_hour(1)));
        assert_eq!(starts(policy, engine, "http://127.0.0.1:4000", 4), 1);
    }

    /// The engine's own budget (its `--rate-limit`) is spent instead of
    /// the declared one, on every request after it named it.
    #[test]
    fn an_engine_that_names_its_own_budget_gets_that_budget() {
        let engine = std::sync::Arc::new(Answers {
            engines: vec![("http://127.0.0.1:4000", Some("50/3600000"))],
        });
        let policy = super::Policy::for_origin("http://127.0.0.1:4000")
            .unwrap()
            .with_declared_rate_limit(Some(an_hour(1)));
        assert_eq!(starts(policy, engine, "http://127.0.0.1:4000", 4), 4);
    }

    /// What the operator set (their account's limit) is theirs to decide:
    /// it is spent on every origin, the engine's included.
    #[test]
    fn an_operator_limit_is_spent_on_the_engine_too() {
        let engine = std::sync::Arc::new(Answers {
            engines: vec![("http://127.0.0.1:4000", None)],
        });
        let policy = super::Policy::for_origin("http://127.0.0.1:4000")
            .unwrap()
            .with_rate_limit(Some(an_hour(10)));
        assert_eq!(starts(policy, engine, "http://127.0.0.1:4000", 4), 4);
    }

    /// The attacker's view: an origin that claims to be the engine loses
    /// pacing for itself only. Another origin, even behind the same pacer
    /// and policy, still spends the declared budget on every request.
    #[test]
    fn a_claim_of_one_origin_never_unpaces_another() {
        let transport = std::sync::Arc::new(Answers {
            engines: vec![("http://127.0.0.1:4000", None)],
        });
        let pacer = crate::network::request_pacer::RequestPacer::in_memory();
        let policy = super::Policy::for_origin("http://127.0.0.1:4000")
            .unwrap()
            .also_allow(Origin::parse("https://api.test").unwrap())
            .with_declared_rate_limit(Some(an_hour(100)))
            .with_request_pacer(pacer.clone());
        let guard = policy.guard(transport);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            for origin in [
                "http://127.0.0.1:4000",
                "https://api.test",
                "http://127.0.0.1:4000",
                "https://api.test",
                "https://api.test",
            ] {
                let request = crate::network::transport::OutgoingRequest {
                    method: http::Method::GET,
                    uri: format!("{origin}/v1/sandboxes").parse().unwrap(),
                    headers: http::HeaderMap::new(),
                    body: bytes::Bytes::new(),
                    timeouts: Default::default(),
                    deadline: None,
                };
                guard.send(request).await.unwrap();
            }
        });
        // The engine's first request, and all three of the other origin.
        assert_eq!(pacer.stats().started, 4);
    }

    /// An answer without the name takes the claim back: the origin is
    /// paced again from its next request.
    #[test]
    fn an_answer_without_the_name_takes_the_claim_back() {
        let pacer = crate::network::request_pacer::RequestPacer::in_memory();
        let origin = "http://127.0.0.1:4000";
        let mut engine_headers = http::HeaderMap::new();
        engine_headers.insert(super::ENGINE_HEADER, "createos-local".parse().unwrap());
        pacer.note_answer(origin, &engine_headers);
        assert_eq!(pacer.engine_budget(origin), Some(None));
        pacer.note_answer(origin, &http::HeaderMap::new());
        assert_eq!(pacer.engine_budget(origin), None);
        let mut budget = engine_headers.clone();
        budget.insert(super::ENGINE_RATE_LIMIT_HEADER, "7/1000".parse().unwrap());
        pacer.note_answer(origin, &budget);
        assert_eq!(
            pacer.engine_budget(origin),
            Some(Some(crate::RateLimit::new(7, Duration::from_secs(1))))
        );
        // A budget it cannot read is no budget: the declared one applies.
        budget.insert(super::ENGINE_RATE_LIMIT_HEADER, "lots".parse().unwrap());
        pacer.note_answer(origin, &budget);
        assert_eq!(pacer.engine_budget(origin), None);
    }

    #[test]
    fn origins_parse_with_default_ports_and_reject_paths() {
        let origin = Origin::parse("https://API.example.com").unwrap();
        assert_eq!(origin.to_string(), "https://api.example.com:443");
        assert_eq!(
            Origin::parse("http://127.0.0.1:8080/").unwrap().to_string(),
            "http://127.0.0.1:8080"
        );
        assert_eq!(Origin::parse("http://[::1]").unwrap().port(), 80);
        for bad in [
            "ftp://x",
            "https://x/v1",
            "https://x?q",
            "https://u:p@x",
            "x",
            "https://x#f",
        ] {
            assert!(Origin::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_origin_matches_only_its_scheme_host_and_port() {
        let origin = Origin::parse("http://api.test").unwrap();
        let of = |uri: &str| Origin::of_uri(&uri.parse().unwrap());
        assert_eq!(of("http://api.test:80/v1?x").as_ref(), Some(&origin));
        assert_ne!(of("https://api.test/v1").as_ref(), Some(&origin));
        assert_ne!(of("http://api.test.evil/v1").as_ref(), Some(&origin));
        assert_eq!(of("http://u@api.test/"), None);
    }
}
