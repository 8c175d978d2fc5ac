//! Outbound network by policy (issue 25 item 3): **off by default**.
//!
//! With a policy, every sandbox machine (see [`crate::machine`]) gets an
//! HTTP proxy on its own loopback, `127.0.0.1:3128`, and its commands get
//! `HTTP_PROXY`, `HTTPS_PROXY`, `http_proxy`, `https_proxy` pointing there
//! and `NO_PROXY=localhost,127.0.0.1`. The listener is created by a forked
//! helper that joined the machine's user and network namespaces and sent
//! it back to the server (`SCM_RIGHTS`, see
//! [`crate::machine::join::listener_in`]): one path for a root server and
//! one that is not; connections out
//! are made by the server from the host after the destination passed the
//! allow-list. `CONNECT host:port` (HTTPS and any TCP) and plain
//! `http://` requests are relayed. A denied or unresolvable destination
//! gets `403 Forbidden` with the reason in the body, and a line in the
//! server's log. A destination that resolves to a loopback, unspecified
//! or link-local address (the engine's own API, other host services, cloud
//! metadata) is allowed only by an entry that names that host exactly,
//! never by `any` or a wildcard.
//! Each sandbox has at most [`MAX_CONNECTIONS`] proxied connections at
//! once.
//!
//! Allow-list entries: `any`, `host`, `host:port`, `*.domain`,
//! `*.domain:port` (host names or IP literals, `[v6]:port`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The port of the proxy on each machine's loopback.
pub const PROXY_PORT: u16 = 3128;
/// Most proxied connections one sandbox holds at once.
pub const MAX_CONNECTIONS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Any,
    Host { host: String, port: Option<u16> },
    Suffix { suffix: String, port: Option<u16> },
}

/// An operator's allow-list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    entries: Vec<Entry>,
}

impl Policy {
    /// Parses allow-list entries (see the module docs); a clear error for
    /// an entry that is not a host pattern.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, String> {
        let mut out = Vec::new();
        for raw in entries {
            for e in raw.as_ref().split(',') {
                let e = e.trim();
                if e.is_empty() {
                    continue;
                }
                out.push(parse_entry(e)?);
            }
        }
        Ok(Self { entries: out })
    }

    /// Whether the policy allows anything (egress is on).
    pub fn enabled(&self) -> bool {
        !self.entries.is_empty()
    }

    /// The policy in words, for the server's startup line: `off`, or the
    /// allow-list.
    pub fn describe(&self) -> String {
        if self.entries.is_empty() {
            return "off".into();
        }
        let entries: Vec<String> = self
            .entries
            .iter()
            .map(|e| {
                let (name, port) = match e {
                    Entry::Any => return "any".to_string(),
                    Entry::Host { host, port } if host.contains(':') => (format!("[{host}]"), port),
                    Entry::Host { host, port } => (host.clone(), port),
                    Entry::Suffix { suffix, port } => (format!("*.{suffix}"), port),
                };
                match port {
                    Some(p) => format!("{name}:{p}"),
                    None => name,
                }
            })
            .collect();
        format!("allow-list {}", entries.join(", "))
    }

    /// `Ok(exact)` when `host:port` is allowed (`exact`: an entry names the
    /// host itself), or the reason it is not.
    fn check(&self, host: &str, port: u16) -> Result<bool, String> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let mut allowed = None;
        for e in &self.entries {
            let (hit, exact) = match e {
                Entry::Any => (true, false),
                Entry::Host { host: h, port: p } => {
                    (*h == host && p.is_none_or(|p| p == port), true)
                }
                Entry::Suffix { suffix, port: p } => (
                    host.ends_with(&format!(".{suffix}")) && p.is_none_or(|p| p == port),
                    false,
                ),
            };
            if hit {
                allowed = Some(allowed.unwrap_or(false) || exact);
            }
        }
        allowed.ok_or_else(|| format!("{host}:{port} is not in the sandbox's egress allow-list"))
    }
}

fn parse_entry(e: &str) -> Result<Entry, String> {
    if e.eq_ignore_ascii_case("any") {
        return Ok(Entry::Any);
    }
    let bad = || {
        format!(
            "egress entry {e:?} is not a host pattern (any, host, host:port, *.domain, *.domain:port)"
        )
    };
    let (host, port) = split_host_port(e).ok_or_else(bad)?;
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(bad)?),
        None => None,
    };
    let host = host.to_ascii_lowercase();
    let (suffix, name) = match host.strip_prefix("*.") {
        Some(rest) => (true, rest.to_string()),
        None => (false, host.clone()),
    };
    let valid_name = !name.is_empty()
        && name.len() <= 253
        && (name.parse::<std::net::IpAddr>().is_ok()
            || name.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            }));
    if !valid_name {
        return Err(bad());
    }
    Ok(if suffix {
        Entry::Suffix { suffix: name, port }
    } else {
        Entry::Host { host: name, port }
    })
}

/// `host[:port]` or `[v6][:port]`.
fn split_host_port(s: &str) -> Option<(String, Option<&str>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        return Some((h.to_string(), port));
    }
    if s.matches(':').count() > 1 {
        return Some((s.to_string(), None));
    }
    match s.split_once(':') {
        Some((h, p)) => Some((h.to_string(), Some(p))),
        None => Some((s.to_string(), None)),
    }
}

fn policies() -> &'static Mutex<HashMap<PathBuf, Arc<Policy>>> {
    static P: OnceLock<Mutex<HashMap<PathBuf, Arc<Policy>>>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Sets the egress policy of the server whose data directory is
/// `data_dir` (its sandboxes' roots are directly under it), or clears it
/// (`None`: egress off). The server does this at start from
/// [`crate::ServerBuilder::egress`].
pub(crate) fn set_policy(data_dir: &Path, policy: Option<Policy>) {
    let key = data_dir
        .canonicalize()
        .unwrap_or_else(|_| data_dir.to_path_buf());
    let mut all = policies().lock().unwrap_or_else(|p| p.into_inner());
    match policy {
        Some(policy) => {
            all.insert(key, Arc::new(policy));
        }
        None => {
            all.remove(&key);
        }
    }
}

/// The policy that applies to the sandbox at `root`, when egress is on.
pub fn policy_for(root: &Path) -> Option<Arc<Policy>> {
    let parent = root.parent()?;
    let key = parent
        .canonicalize()
        .unwrap_or_else(|_| parent.to_path_buf());
    policies()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
        .cloned()
        .filter(|p| p.enabled())
}

/// The environment commands get when egress is on.
pub fn proxy_env() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{PROXY_PORT}");
    let mut env = Vec::new();
    for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        env.push((k.to_string(), url.clone()));
    }
    for k in ["NO_PROXY", "no_proxy"] {
        env.push((k.to_string(), "localhost,127.0.0.1".to_string()));
    }
    env
}

/// Starts the proxy of a machine on `listener`, a socket bound to
/// `127.0.0.1:`[`PROXY_PORT`] in the machine's network namespace (made by
/// [`crate::machine::join::listener_in`]). Returns the task serving it
/// (abort it when the machine ends).
pub fn start_proxy(
    listener: std::net::TcpListener,
    sandbox: String,
    policy: Arc<Policy>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let handle = tokio::runtime::Handle::try_current()
        .map_err(|_| std::io::Error::other("no runtime for the egress proxy"))?;
    listener.set_nonblocking(true)?;
    let _guard = handle.enter();
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    Ok(handle.spawn(async move {
        loop {
            // Short of descriptors, the engine takes no more of the
            // sandbox's connections (they wait in the queue): what is left
            // is kept for proving sandboxes gone (issue 40 item 2).
            if crate::trees::fds::headroom_fast() < crate::trees::fds::NEW_WORK_RESERVE {
                tokio::time::sleep(crate::network::accept::BACKOFF).await;
                continue;
            }
            let conn = match listener.accept().await {
                Ok((conn, _)) => conn,
                Err(e) => {
                    crate::network::accept::after_failure(&e).await;
                    continue;
                }
            };
            let policy = policy.clone();
            let sandbox = sandbox.clone();
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                let mut conn = conn;
                tokio::spawn(async move {
                    let _ = refuse(
                        &mut conn,
                        429,
                        "Too Many Requests",
                        "too many proxied connections from this sandbox",
                    )
                    .await;
                });
                continue;
            };
            tokio::spawn(async move {
                let _slot = slot;
                serve(conn, &policy, &sandbox).await;
            });
        }
    }))
}

/// Loopback, unspecified and link-local addresses (the host's own
/// services, cloud metadata at 169.254.169.254): reachable only through
/// an entry naming the host exactly.
fn host_local(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4.is_loopback() || v4.is_unspecified() || v4.is_link_local(),
        std::net::IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6.to_ipv4_mapped().is_some_and(|v4| host_local(v4.into()))
        }
    }
}

async fn refuse(
    conn: &mut tokio::net::TcpStream,
    code: u16,
    text: &str,
    reason: &str,
) -> std::io::Result<()> {
    let body = format!("createos-local egress: {reason}\n");
    let head = format!(
        "HTTP/1.1 {code} {text}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(body.as_bytes()).await?;
    conn.shutdown().await
}

/// One proxied connection: read the request head, check, connect, relay.
async fn serve(mut conn: tokio::net::TcpStream, policy: &Policy, sandbox: &str) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut buf).await?;
            if n == 0 || head.len() > 16 * 1024 {
                return Err(std::io::Error::other("no request head"));
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<(), std::io::Error>(())
    })
    .await;
    if !matches!(read, Ok(Ok(()))) {
        return;
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let first = text.lines().next().unwrap_or_default().to_string();
    let mut parts = first.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (authority, connect, rest) = if method.eq_ignore_ascii_case("CONNECT") {
        (target.to_string(), true, String::new())
    } else if let Some(after) = target.strip_prefix("http://") {
        let (auth, path) = match after.find('/') {
            Some(i) => (&after[..i], &after[i..]),
            None => (after, "/"),
        };
        (auth.to_string(), false, path.to_string())
    } else {
        let _ = refuse(
            &mut conn,
            400,
            "Bad Request",
            "only CONNECT and http:// requests are proxied",
        )
        .await;
        return;
    };
    let (host, port) = match split_host_port(&authority) {
        Some((h, Some(p))) => (h, p.parse::<u16>().unwrap_or(0)),
        Some((h, None)) => (h, if connect { 443 } else { 80 }),
        None => (String::new(), 0),
    };
    let deny = |reason: String| async move {
        eprintln!("createos-local: egress denied for sandbox {sandbox}: {reason}");
        reason
    };
    let exact = match policy.check(&host, port) {
        Ok(exact) if port != 0 && !host.is_empty() => exact,
        Ok(_) => {
            let reason = deny(format!("bad destination {authority:?}")).await;
            let _ = refuse(&mut conn, 403, "Forbidden", &reason).await;
            return;
        }
        Err(reason) => {
            let reason = deny(reason).await;
            let _ = refuse(&mut conn, 403, "Forbidden", &reason).await;
            return;
        }
    };
    let addrs: Vec<SocketAddr> = match tokio::net::lookup_host((host.as_str(), port)).await {
        Ok(a) => a.collect(),
        Err(e) => {
            let reason = deny(format!("cannot resolve {host}: {e}")).await;
            let _ = refuse(&mut conn, 403, "Forbidden", &reason).await;
            return;
        }
    };
    if !exact && addrs.iter().any(|a| host_local(a.ip())) {
        let reason = deny(format!(
            "{host}:{port} is on the host's loopback; only an entry naming it exactly allows that"
        ))
        .await;
        let _ = refuse(&mut conn, 403, "Forbidden", &reason).await;
        return;
    }
    let upstream = match tokio::time::timeout(
        std::time::Duration::from_secs(30),
        tokio::net::TcpStream::connect(&addrs[..]),
    )
    .await
    {
        Ok(Ok(s)) => s,
        _ => {
            let _ = refuse(
                &mut conn,
                502,
                "Bad Gateway",
                &format!("cannot connect to {host}:{port}"),
            )
            .await;
            return;
        }
    };
    let mut upstream = upstream;
    if connect {
        if conn
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
        // Bytes the client sent after the head belong to the tunnel.
        let end = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) + 4;
        if upstream.write_all(&head[end..]).await.is_err() {
            return;
        }
    } else {
        // Forward in origin form: the request line's path, the rest as is.
        let line_end = head.windows(2).position(|w| w == b"\r\n").unwrap_or(0);
        let version = first.split_whitespace().nth(2).unwrap_or("HTTP/1.1");
        let mut out = format!("{method} {rest} {version}").into_bytes();
        out.extend_from_slice(&head[line_end..]);
        if upstream.write_all(&out).await.is_err() {
            return;
        }
    }
    let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_entries() {
        let p = Policy::parse(&["example.com:443", "*.pypi.org", "10.0.0.1"]).expect("parse");
        assert_eq!(p.check("example.com", 443), Ok(true));
        assert!(p.check("example.com", 80).is_err());
        assert_eq!(p.check("files.pypi.org", 443), Ok(false));
        assert!(p.check("pypi.org.evil.com", 443).is_err());
        assert_eq!(p.check("10.0.0.1", 22), Ok(true));
        assert!(Policy::parse(&["http://x"]).is_err());
        assert!(Policy::parse(&["host:0"]).is_err());
        assert!(Policy::parse(&["a b"]).is_err());
        assert!(!Policy::parse::<&str>(&[]).expect("empty").enabled());
        assert_eq!(
            Policy::parse(&["any"]).expect("any").check("x", 1),
            Ok(false)
        );
    }
}
