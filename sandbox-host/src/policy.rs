//! The HTTP policy layer: one allowed origin, the secret header for it,
//! request-start spacing, clamped timeouts and a response size cap. A
//! [`Guard`] applies a [`Policy`] in front of any [`Transport`].

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use http::{HeaderName, HeaderValue, Uri};

use crate::pacing::Pacer;
use crate::transport::{ErrorCode, OutgoingRequest, RequestTimeouts, Transport, TransportFuture};

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

/// What a [`Guard`] enforces for one environment's provider.
#[derive(Clone, Debug)]
pub struct Policy {
    origin: Origin,
    secret: Option<SecretHeader>,
    spacing: Duration,
    pacer: Pacer,
    max_timeout: Option<Duration>,
    max_response_bytes: u64,
}

impl Policy {
    /// Default cap on one response body (streamed bodies count too, so it
    /// is generous: NDJSON output streams of long commands are large).
    pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 1024 * 1024 * 1024;

    /// Allows only `origin`; no secret, no spacing, the global [`Pacer`].
    pub fn new(origin: Origin) -> Self {
        Policy {
            origin,
            secret: None,
            spacing: Duration::ZERO,
            pacer: Pacer::global(),
            max_timeout: None,
            max_response_bytes: Self::DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    /// [`Policy::new`] from the `api-origin` text `validate-config` returned.
    pub fn for_origin(origin: &str) -> Result<Self> {
        Ok(Self::new(Origin::parse(origin)?))
    }

    /// Adds `name: value` to every allowed request, replacing any value the
    /// guest set. The value is marked sensitive and never printed.
    pub fn with_secret_header(mut self, name: &str, value: &str) -> Result<Self> {
        let name = HeaderName::from_bytes(name.as_bytes())
            .with_context(|| format!("invalid secret header name {name:?}"))?;
        let mut value =
            HeaderValue::from_str(value).context("the secret is not a valid header value")?;
        value.set_sensitive(true);
        self.secret = Some(SecretHeader { name, value });
        Ok(self)
    }

    /// Spaces the *starts* of requests to the origin at least `spacing` apart
    /// (`describe`'s `request-spacing-ms`), across everything sharing the pacer.
    pub fn with_request_spacing(mut self, spacing: Duration) -> Self {
        self.spacing = spacing;
        self
    }

    /// Uses `pacer` instead of [`Pacer::global`].
    pub fn with_pacer(mut self, pacer: Pacer) -> Self {
        self.pacer = pacer;
        self
    }

    /// Clamps every per-phase timeout to at most `max`. Without it, only the
    /// operation's remaining deadline bounds them (long polls such as a
    /// process `wait` legitimately take minutes).
    pub fn with_max_timeout(mut self, max: Duration) -> Self {
        self.max_timeout = Some(max);
        self
    }

    /// Fails a response body with `HTTP-response-body-size` beyond `max` bytes.
    pub fn with_max_response_bytes(mut self, max: u64) -> Self {
        self.max_response_bytes = max;
        self
    }

    /// The allowed origin.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// Whether `uri` is on the allowed origin.
    pub fn allows(&self, uri: &Uri) -> bool {
        Origin::of_uri(uri).as_ref() == Some(&self.origin)
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
/// - another origin: `HTTP-request-denied`, and `inner` never sees it;
/// - the secret header is added only here, so only for the allowed origin;
/// - request starts are spaced with the policy's pacer;
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
        if !self.policy.allows(&request.uri) {
            return Box::pin(async { Err(ErrorCode::HttpRequestDenied) });
        }
        if let Some(secret) = &self.policy.secret {
            request
                .headers
                .insert(secret.name.clone(), secret.value.clone());
        }
        let policy = self.policy.clone();
        let inner = self.inner.clone();
        Box::pin(async move {
            let deadline = request.deadline;
            let key = policy.origin.to_string();
            match deadline {
                Some(deadline) => {
                    tokio::time::timeout_at(
                        deadline.into(),
                        policy.pacer.wait_turn(&key, policy.spacing),
                    )
                    .await
                    .map_err(|_| ErrorCode::ConnectionTimeout)?;
                }
                None => policy.pacer.wait_turn(&key, policy.spacing).await,
            }
            let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            request.timeouts = RequestTimeouts {
                connect: policy.clamp(request.timeouts.connect, remaining),
                first_byte: policy.clamp(request.timeouts.first_byte, remaining),
                between_bytes: policy.clamp(request.timeouts.between_bytes, remaining),
            };
            let sent = inner.send(request);
            let mut response = match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline.into(), sent)
                    .await
                    .map_err(|_| ErrorCode::HttpResponseTimeout)??,
                None => sent.await?,
            };
            response.body = response.body.limit_size(policy.max_response_bytes);
            if let Some(deadline) = deadline {
                response.body = response.body.deadline(deadline);
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Origin;

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
