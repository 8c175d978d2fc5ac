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
//! `*.domain:port` (host names or IP literals, `[v6]:port`), and address
//! ranges `10.0.0.0/8` (any port; a name is resolved and only addresses
//! inside a range are dialled). A range inside a host-local block
//! (`127.0.0.0/8`) names those addresses exactly.
//!
//! The operator's list is the ceiling of every sandbox; a sandbox may
//! have a list of its own (issue 43: CreateOS `egress`, Daytona's
//! network settings) that only narrows it: a destination passes both.
//! The proxy reads the sandbox's list for each connection, so a
//! replaced list applies at once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::AsyncWriteExt;

/// The port of the proxy on each machine's loopback.
pub const PROXY_PORT: u16 = 3128;
/// Most proxied connections one sandbox holds at once.
pub const MAX_CONNECTIONS: usize = 64;

/// The most entries a sandbox's own allow-list may hold.
pub const MAX_SANDBOX_ENTRIES: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Any,
    Host {
        host: String,
        port: Option<u16>,
    },
    Suffix {
        suffix: String,
        port: Option<u16>,
    },
    /// An address range (`10.0.0.0/8`, `fd00::/8`), any port.
    Net(ipnet::IpNet),
}

/// How a policy admits `host:port` before the name is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admit {
    /// An entry names the host itself.
    Exact,
    /// `any`, a wildcard or an address range admits it.
    Pattern,
    /// Only address ranges could admit it: decided per resolved address.
    ByAddress,
}

/// Whose list a refusal names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Whose {
    Engine,
    Sandbox,
}

impl Whose {
    fn list(self) -> &'static str {
        match self {
            Whose::Engine => "the engine's egress allow-list",
            Whose::Sandbox => "this sandbox's own egress allow-list",
        }
    }
}

/// An allow-list entry, or a sandbox's own list, that cannot be used: the
/// operator's `--egress` stops the start, a sandbox's list is a 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadAllowList {
    /// Neither a host pattern nor an address range.
    #[error(
        "egress entry {entry:?} is not a host pattern or an address range (any, host, \
         host:port, *.domain, *.domain:port, 10.0.0.0/8)"
    )]
    NotAPattern {
        /// The entry as given.
        entry: String,
    },
    /// A sandbox's list longer than [`MAX_SANDBOX_ENTRIES`].
    #[error(
        "the egress allow-list has {count} entries; at most {MAX_SANDBOX_ENTRIES} are allowed"
    )]
    TooMany {
        /// How many it has.
        count: usize,
    },
    /// An entry with control characters.
    #[error("egress entry {entry:?} holds control characters")]
    ControlCharacters {
        /// The entry as given.
        entry: String,
    },
    /// An empty entry.
    #[error("egress entries cannot be empty")]
    Empty,
    /// `*` (allow all) together with other entries.
    #[error("egress entry \"*\" (allow all) cannot stand beside other entries")]
    AllBesideOthers,
}

/// Why the proxy refuses a destination: the body of its `403 Forbidden`
/// and the line in the server's log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Denied {
    /// No entry of a list admits the host and port.
    #[error("{host}:{port} is not in {}", .whose.list())]
    NotListed {
        /// The host asked for (lower case).
        host: String,
        port: u16,
        whose: Whose,
    },
    /// The name resolved only to addresses outside a list's ranges.
    #[error(
        "{host}:{port} resolves to {ip}, outside every address range of {}",
        .whose.list()
    )]
    OutsideRanges {
        host: String,
        port: u16,
        ip: std::net::IpAddr,
        whose: Whose,
    },
    /// A host-local address admitted only by a pattern or a wide range.
    #[error(
        "{host}:{port} is on the host's loopback; only an entry naming it exactly allows that"
    )]
    HostLocal { host: String, port: u16 },
    /// The name resolved to no address at all.
    #[error("{host}:{port} has no address")]
    NoAddress { host: String, port: u16 },
}

/// An allow-list: the operator's (`--egress`, the ceiling of every
/// sandbox) or a sandbox's own (which only narrows the operator's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    entries: Vec<Entry>,
}

impl Policy {
    /// Parses the operator's allow-list entries (see the module docs;
    /// an item may hold several, comma-separated); a clear error for an
    /// entry that is not a host pattern or an address range.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, BadAllowList> {
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

    /// A sandbox's own list, one entry per item, as the service takes it
    /// on create: `Ok(None)` for allow-all (no list, `[]` or `["*"]`),
    /// which leaves the sandbox at the operator's list. Refused with the
    /// reason: an empty entry, control characters, `*` beside other
    /// entries, more than [`MAX_SANDBOX_ENTRIES`], anything that is not a
    /// host pattern or an address range.
    pub fn parse_sandbox_list<S: AsRef<str>>(items: &[S]) -> Result<Option<Self>, BadAllowList> {
        if items.len() > MAX_SANDBOX_ENTRIES {
            return Err(BadAllowList::TooMany { count: items.len() });
        }
        let mut entries = Vec::new();
        let mut star = false;
        for item in items {
            let raw = item.as_ref();
            if raw.chars().any(char::is_control) {
                return Err(BadAllowList::ControlCharacters {
                    entry: raw.to_string(),
                });
            }
            let e = raw.trim();
            if e.is_empty() {
                return Err(BadAllowList::Empty);
            }
            if e == "*" {
                star = true;
                continue;
            }
            let entry = parse_entry(e)?;
            if !entries.contains(&entry) {
                entries.push(entry);
            }
        }
        match (star, entries.is_empty()) {
            (true, false) => Err(BadAllowList::AllBesideOthers),
            (_, true) => Ok(None),
            (false, false) => Ok(Some(Self { entries })),
        }
    }

    /// A list that allows nothing (Daytona's `networkBlockAll`).
    pub fn nothing() -> Self {
        Self::default()
    }

    /// Whether the policy allows anything (egress is on).
    pub fn enabled(&self) -> bool {
        !self.entries.is_empty()
    }

    /// The entries in their normal written form.
    pub fn entries(&self) -> Vec<String> {
        self.entries
            .iter()
            .map(|e| {
                let (name, port) = match e {
                    Entry::Any => return "any".to_string(),
                    Entry::Net(net) => return net.to_string(),
                    Entry::Host { host, port } if host.contains(':') => (format!("[{host}]"), port),
                    Entry::Host { host, port } => (host.clone(), port),
                    Entry::Suffix { suffix, port } => (format!("*.{suffix}"), port),
                };
                match port {
                    Some(p) => format!("{name}:{p}"),
                    None => name,
                }
            })
            .collect()
    }

    /// The policy in words, for the server's startup line: `off`, or the
    /// allow-list.
    pub fn describe(&self) -> String {
        if self.entries.is_empty() {
            return "off".into();
        }
        format!("allow-list {}", self.entries().join(", "))
    }

    /// How `host:port` is admitted, or the reason it is not.
    fn admit(&self, host: &str, port: u16, whose: Whose) -> Result<Admit, Denied> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let literal = host.parse::<std::net::IpAddr>().ok();
        let mut admitted = None;
        let mut ranges = false;
        for e in &self.entries {
            let hit = match e {
                Entry::Any => Some(Admit::Pattern),
                Entry::Host { host: h, port: p } => {
                    (*h == host && p.is_none_or(|p| p == port)).then_some(Admit::Exact)
                }
                Entry::Suffix { suffix, port: p } => (host.ends_with(&format!(".{suffix}"))
                    && p.is_none_or(|p| p == port))
                .then_some(Admit::Pattern),
                Entry::Net(net) => {
                    ranges = true;
                    literal.and_then(|ip| in_range(net, ip))
                }
            };
            admitted = match (admitted, hit) {
                (Some(Admit::Exact), _) | (_, Some(Admit::Exact)) => Some(Admit::Exact),
                (None, h) => h,
                (a, _) => a,
            };
        }
        match admitted {
            Some(a) => Ok(a),
            None if ranges && literal.is_none() => Ok(Admit::ByAddress),
            None => Err(Denied::NotListed { host, port, whose }),
        }
    }

    /// Whether an address range of the policy holds `ip`: `Some(exact)`.
    fn admits_address(&self, ip: std::net::IpAddr) -> Option<Admit> {
        let mut best = None;
        for e in &self.entries {
            if let Entry::Net(net) = e {
                match in_range(net, ip) {
                    Some(Admit::Exact) => return Some(Admit::Exact),
                    Some(a) => best = Some(a),
                    None => {}
                }
            }
        }
        best
    }
}

/// Host-local address blocks: a range inside one of them names the
/// host's own addresses as exactly as a host entry does.
const HOST_LOCAL_BLOCKS: &[&str] = &[
    "127.0.0.0/8",
    "169.254.0.0/16",
    "0.0.0.0/32",
    "::1/128",
    "::/128",
    "fe80::/10",
    "::ffff:127.0.0.0/104",
    "::ffff:169.254.0.0/112",
];

/// Whether `net` holds `ip`, and how: `Exact` for a range that lies
/// inside a host-local block (`127.0.0.0/8` names the loopback itself;
/// `0.0.0.0/0` does not).
fn in_range(net: &ipnet::IpNet, ip: std::net::IpAddr) -> Option<Admit> {
    let ip = match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map(std::net::IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    if !net.contains(&ip) {
        return None;
    }
    let local_only = HOST_LOCAL_BLOCKS.iter().any(|b| {
        b.parse::<ipnet::IpNet>()
            .is_ok_and(|block| block.contains(net))
    });
    Some(if local_only {
        Admit::Exact
    } else {
        Admit::Pattern
    })
}

fn parse_entry(e: &str) -> Result<Entry, BadAllowList> {
    if e.eq_ignore_ascii_case("any") {
        return Ok(Entry::Any);
    }
    let bad = || BadAllowList::NotAPattern {
        entry: e.to_string(),
    };
    if e.contains('/') {
        let net = e.parse::<ipnet::IpNet>().map_err(|_| bad())?;
        return Ok(Entry::Net(net.trunc()));
    }
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

/// The policies in force in one server: the operator's ceiling and each
/// sandbox's own list (by its root). The server owns it and hands it to
/// its machines and its faces ([`crate::machine::ServerRegistries`]): two
/// servers in one process never see each other's lists.
#[derive(Debug, Default)]
pub struct Policies {
    /// The operator's list, where egress is on and sandboxes are machines.
    ceiling: Option<Arc<Policy>>,
    /// Each sandbox's own list, by its (canonical) root.
    sandboxes: Mutex<HashMap<PathBuf, Arc<Policy>>>,
}

fn key(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

impl Policies {
    /// The policies of a server whose operator's list is `ceiling`
    /// (`None`: egress off). The server makes it at start from
    /// [`crate::ServerBuilder::egress`].
    pub fn with_ceiling(ceiling: Option<Policy>) -> Policies {
        Policies {
            ceiling: ceiling.map(Arc::new),
            sandboxes: Mutex::default(),
        }
    }

    /// The operator's policy (the ceiling) that applies to every sandbox
    /// of the server, when egress is on.
    pub fn ceiling(&self) -> Option<Arc<Policy>> {
        self.ceiling.clone().filter(|p| p.enabled())
    }

    fn sandboxes(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Arc<Policy>>> {
        self.sandboxes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the sandbox at `root`'s own list (`None`: none, the operator's
    /// list alone applies). New connections through its proxy follow it at
    /// once; a pause and resume keep it.
    pub fn set_sandbox(&self, root: &Path, policy: Option<Policy>) {
        let key = key(root);
        let mut all = self.sandboxes();
        match policy {
            Some(policy) => {
                all.insert(key, Arc::new(policy));
            }
            None => {
                all.remove(&key);
            }
        }
    }

    /// The sandbox at `root`'s own list, if it has one.
    pub fn sandbox(&self, root: &Path) -> Option<Arc<Policy>> {
        self.sandboxes().get(&key(root)).cloned()
    }

    /// What the sandbox at `root` may reach, in words (its answer's
    /// `local_egress`).
    pub fn describe_for(&self, root: &Path) -> String {
        let own = self.sandbox(root);
        match (self.ceiling(), own) {
            (None, _) => "off: the engine's outbound network is off (start it with --egress to \
                          allow destinations)"
                .to_string(),
            (Some(ceiling), None) => format!("the engine's {}", ceiling.describe()),
            (Some(ceiling), Some(own)) if !own.enabled() => format!(
                "nothing: this sandbox blocks all outbound network (the engine's {})",
                ceiling.describe()
            ),
            (Some(ceiling), Some(own)) => format!(
                "this sandbox's {}, within the engine's {}",
                own.describe(),
                ceiling.describe()
            ),
        }
    }
}

/// `host:port` admitted by name under the operator's ceiling and, where
/// it has one, the sandbox's own list; its addresses are decided by
/// [`Admission::addresses`] once resolved.
struct Admission<'a> {
    lists: Vec<(&'a Policy, Admit, Whose)>,
}

impl<'a> Admission<'a> {
    /// Every list's answer for `host:port`, or the first refusal.
    fn by_name(
        ceiling: &'a Policy,
        own: Option<&'a Policy>,
        host: &str,
        port: u16,
    ) -> Result<Self, Denied> {
        let mut lists = vec![(
            ceiling,
            ceiling.admit(host, port, Whose::Engine)?,
            Whose::Engine,
        )];
        if let Some(own) = own {
            lists.push((own, own.admit(host, port, Whose::Sandbox)?, Whose::Sandbox));
        }
        Ok(Self { lists })
    }

    /// The resolved `addrs` narrowed to those every address range
    /// admits, or the reason none is. A host-local address is reached
    /// only where every list names it exactly.
    fn addresses(
        &self,
        host: &str,
        port: u16,
        addrs: Vec<SocketAddr>,
    ) -> Result<Vec<SocketAddr>, Denied> {
        let mut kept = Vec::new();
        let mut outside = None;
        for addr in addrs {
            let mut exact = true;
            let mut admitted = true;
            for (list, admit, whose) in &self.lists {
                let how = match admit {
                    Admit::ByAddress => list.admits_address(addr.ip()),
                    a => Some(*a),
                };
                match how {
                    Some(a) => exact &= a == Admit::Exact,
                    None => {
                        admitted = false;
                        outside = Some(Denied::OutsideRanges {
                            host: host.to_string(),
                            port,
                            ip: addr.ip(),
                            whose: *whose,
                        });
                    }
                }
            }
            if !admitted {
                continue;
            }
            if !exact && host_local(addr.ip()) {
                return Err(Denied::HostLocal {
                    host: host.to_string(),
                    port,
                });
            }
            kept.push(addr);
        }
        if kept.is_empty() {
            return Err(outside.unwrap_or_else(|| Denied::NoAddress {
                host: host.to_string(),
                port,
            }));
        }
        Ok(kept)
    }
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
    root: PathBuf,
    ceiling: Arc<Policy>,
    policies: Arc<Policies>,
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
            let ceiling = ceiling.clone();
            let sandbox = sandbox.clone();
            // The sandbox's own list as it is now: a replaced list holds
            // for every connection made after the replacement.
            let own = policies.sandbox(&root);
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
                serve(conn, &ceiling, own.as_deref(), &sandbox).await;
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
    crate::network::head::answer(conn, code, text, "createos-local egress", reason).await
}

/// One proxied connection: read the request head, check against the
/// operator's `ceiling` and the sandbox's `own` list, connect, relay.
async fn serve(
    mut conn: tokio::net::TcpStream,
    ceiling: &Policy,
    own: Option<&Policy>,
    sandbox: &str,
) {
    let Some(head) = crate::network::head::read(&mut conn).await else {
        return;
    };
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
    if port == 0 || host.is_empty() {
        let reason = deny(format!("bad destination {authority:?}")).await;
        let _ = refuse(&mut conn, 403, "Forbidden", &reason).await;
        return;
    }
    // Refused by name before anything is resolved, where a list can tell.
    let admission = match Admission::by_name(ceiling, own, &host, port) {
        Ok(a) => a,
        Err(denied) => {
            let reason = deny(denied.to_string()).await;
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
    let addrs = match admission.addresses(&host, port, addrs) {
        Ok(addrs) => addrs,
        Err(denied) => {
            let reason = deny(denied.to_string()).await;
            let _ = refuse(&mut conn, 403, "Forbidden", &reason).await;
            return;
        }
    };
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

    const E: Whose = Whose::Engine;

    #[test]
    fn allow_list_entries() {
        let p = Policy::parse(&["example.com:443", "*.pypi.org", "10.0.0.1"]).expect("parse");
        assert_eq!(p.admit("example.com", 443, E), Ok(Admit::Exact));
        assert!(p.admit("example.com", 80, E).is_err());
        assert_eq!(p.admit("files.pypi.org", 443, E), Ok(Admit::Pattern));
        assert!(p.admit("pypi.org.evil.com", 443, E).is_err());
        assert_eq!(p.admit("10.0.0.1", 22, E), Ok(Admit::Exact));
        assert!(Policy::parse(&["http://x"]).is_err());
        assert!(Policy::parse(&["host:0"]).is_err());
        assert!(Policy::parse(&["a b"]).is_err());
        assert!(Policy::parse(&["10.0.0.0/33"]).is_err());
        assert!(!Policy::parse::<&str>(&[]).expect("empty").enabled());
        assert_eq!(
            Policy::parse(&["any"]).expect("any").admit("x", 1, E),
            Ok(Admit::Pattern)
        );
    }

    #[test]
    fn address_ranges_admit_literals_at_once_and_names_by_address() {
        let p = Policy::parse(&["10.1.2.3/8", "127.0.0.0/8", "0.0.0.0/0"]).expect("parse");
        assert_eq!(p.entries(), ["10.0.0.0/8", "127.0.0.0/8", "0.0.0.0/0"]);
        assert_eq!(p.admit("10.9.9.9", 1, E), Ok(Admit::Pattern));
        assert_eq!(p.admit("127.0.0.5", 1, E), Ok(Admit::Exact));
        assert_eq!(p.admit("example.com", 1, E), Ok(Admit::ByAddress));
        let narrow = Policy::parse(&["192.168.0.0/16"]).expect("parse");
        assert!(narrow.admit("10.0.0.1", 1, E).is_err());
        assert_eq!(narrow.admit("example.com", 1, E), Ok(Admit::ByAddress));
        let mapped: std::net::IpAddr = "::ffff:192.168.1.1".parse().expect("ip");
        assert_eq!(narrow.admits_address(mapped), Some(Admit::Pattern));
    }

    #[test]
    fn a_sandbox_list_narrows_and_never_opens_the_host() {
        let addr = |s: &str| -> SocketAddr { s.parse().expect("addr") };
        let ceiling = Policy::parse(&["any"]).expect("ceiling");
        let own = Policy::parse_sandbox_list(&["192.168.0.0/16"])
            .expect("own")
            .expect("a list");
        let by_name = Admission::by_name(&ceiling, Some(&own), "svc.example", 80).expect("name");
        assert_eq!(
            by_name
                .addresses(
                    "svc.example",
                    80,
                    vec![addr("10.0.0.1:80"), addr("192.168.3.4:80")]
                )
                .expect("one kept"),
            vec![addr("192.168.3.4:80")]
        );
        let err = by_name
            .addresses("svc.example", 80, vec![addr("10.0.0.1:80")])
            .expect_err("outside");
        assert!(
            err.to_string()
                .contains("this sandbox's own egress allow-list"),
            "{err}"
        );
        // `any` in the ceiling and a wide range of the sandbox's: not the
        // host's loopback.
        let wide = Policy::parse_sandbox_list(&["0.0.0.0/0"])
            .expect("own")
            .expect("list");
        let err = Admission::by_name(&ceiling, Some(&wide), "127.0.0.1", 80)
            .expect("by name")
            .addresses("127.0.0.1", 80, vec![addr("127.0.0.1:80")])
            .expect_err("loopback");
        assert!(err.to_string().contains("loopback"), "{err}");
        // The sandbox's list cannot widen the ceiling.
        let ceiling = Policy::parse(&["example.com"]).expect("ceiling");
        let own = Policy::parse_sandbox_list(&["other.org"]).expect("own");
        let err = Admission::by_name(&ceiling, own.as_ref(), "other.org", 443)
            .err()
            .expect("refused");
        assert!(
            err.to_string().contains("the engine's egress allow-list"),
            "{err}"
        );
    }

    #[test]
    fn each_server_has_policies_of_its_own() {
        let one = Policies::with_ceiling(Some(Policy::parse(&["any"]).expect("ceiling")));
        let other = Policies::default();
        let root = Path::new("/nonexistent/sb-shared-name");
        one.set_sandbox(root, Some(Policy::nothing()));
        assert!(one.sandbox(root).is_some());
        assert!(one.ceiling().is_some());
        assert!(
            other.sandbox(root).is_none(),
            "a list leaked to another server"
        );
        assert!(
            other.ceiling().is_none(),
            "a ceiling leaked to another server"
        );
    }

    #[test]
    fn sandbox_lists_are_normalised_or_refused() {
        assert_eq!(Policy::parse_sandbox_list::<&str>(&[]), Ok(None));
        assert_eq!(Policy::parse_sandbox_list(&["*"]), Ok(None));
        let p = Policy::parse_sandbox_list(&[" Example.COM ", "example.com", "10.0.0.0/8"])
            .expect("parse")
            .expect("list");
        assert_eq!(p.entries(), ["example.com", "10.0.0.0/8"]);
        for bad in [
            &["*", "x.org"][..],
            &[""],
            &["a\u{1b}b"],
            &["a,b"],
            &["http://x/"],
        ] {
            assert!(Policy::parse_sandbox_list(bad).is_err(), "{bad:?}");
        }
        let many: Vec<String> = (0..=MAX_SANDBOX_ENTRIES)
            .map(|i| format!("h{i}.org"))
            .collect();
        assert!(Policy::parse_sandbox_list(&many).is_err());
    }
}
