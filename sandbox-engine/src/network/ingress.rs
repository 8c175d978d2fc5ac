//! A way in (issue 43): a port of a sandbox reachable from the host as a
//! loopback URL, the preview-URL model of the services. **Off unless the
//! operator enables it** (`createos-local --ingress`).
//!
//! Each opened port of a sandbox gets a listener of its own on the
//! host's `127.0.0.1` (an origin of its own, so an app's absolute links
//! and WebSockets work). A connection's first request head must carry the
//! port's secret token in `X-Sandbox-Preview-Token` (or Daytona's
//! `X-Daytona-Preview-Token`), unless the sandbox was made public
//! (Daytona's `public`); a missing or wrong token is a 401 and nothing
//! reaches the sandbox. An admitted connection is relayed byte for byte
//! to `127.0.0.1:PORT` inside the sandbox's network namespace, through a
//! socket made in that namespace by the machine ([`Dial`]): nothing of
//! the host's own network is ever dialled. Nothing listening there (or
//! no machine running) is a 502 saying so. A sandbox holds at most
//! [`MAX_CONNECTIONS`] relayed connections per port; its listeners close
//! when it is deleted ([`Ports::close`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::AsyncWriteExt;

/// Most relayed connections one opened port holds at once.
pub const MAX_CONNECTIONS: usize = 64;

/// The header that carries a port's token.
pub const TOKEN_HEADER: &str = "x-sandbox-preview-token";

/// Daytona's name for the same header.
pub const DAYTONA_TOKEN_HEADER: &str = "x-daytona-preview-token";

/// Makes a TCP socket, not yet connected, inside a sandbox's network
/// namespace (the machine's part: [`crate::machine`] hands one in).
pub type Dial = Arc<dyn Fn() -> std::io::Result<std::os::fd::OwnedFd> + Send + Sync>;

/// An opened port: where it is reached, and with what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// `http://127.0.0.1:N`.
    pub url: String,
    /// The secret a request carries.
    pub token: String,
    /// Whether a request must carry it (not for a public sandbox).
    pub required: bool,
}

struct Door {
    opened: Opened,
    task: tokio::task::JoinHandle<()>,
}

/// The ports a server has opened, by sandbox root: the server's state
/// owns it (one per server, no process-wide registry).
#[derive(Default)]
pub struct Ports {
    doors: Mutex<HashMap<PathBuf, HashMap<u16, Door>>>,
}

impl std::fmt::Debug for Ports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let open: usize = self.lock().values().map(HashMap::len).sum();
        write!(f, "Ports({open} open)")
    }
}

impl Ports {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, HashMap<u16, Door>>> {
        self.doors.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens `port` of the sandbox at `root` (named `sandbox` in
    /// messages), or answers the one opened before: its URL and token.
    /// `dial` makes a socket in the sandbox's network namespace for each
    /// connection.
    pub fn open(
        &self,
        root: &Path,
        sandbox: &str,
        port: u16,
        public: bool,
        dial: Dial,
    ) -> std::io::Result<Opened> {
        let mut all = self.lock();
        if let Some(door) = all.get(root).and_then(|ports| ports.get(&port)) {
            if !door.task.is_finished() {
                return Ok(door.opened.clone());
            }
        }
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| std::io::Error::other("no runtime for the ingress listener"))?;
        let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let url = format!("http://{}", listener.local_addr()?);
        let token = crate::util::random_hex(16);
        let _guard = handle.enter();
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let task = handle.spawn(serve(
            listener,
            sandbox.to_string(),
            port,
            (!public).then(|| token.clone()),
            dial,
        ));
        let opened = Opened {
            url,
            token,
            required: !public,
        };
        all.entry(root.to_path_buf()).or_default().insert(
            port,
            Door {
                opened: opened.clone(),
                task,
            },
        );
        Ok(opened)
    }

    /// Closes every opened port of the sandbox at `root` (its delete).
    pub fn close(&self, root: &Path) {
        if let Some(ports) = self.lock().remove(root) {
            for door in ports.into_values() {
                door.task.abort();
            }
        }
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    sandbox: String,
    port: u16,
    token: Option<String>,
    dial: Dial,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        // Short of descriptors, no more connections are taken: what is
        // left is kept for proving sandboxes gone (issue 40 item 2).
        if crate::trees::fds::headroom_fast() < crate::trees::fds::NEW_WORK_RESERVE {
            tokio::time::sleep(crate::network::accept::BACKOFF).await;
            continue;
        }
        let mut conn = match listener.accept().await {
            Ok((conn, _)) => conn,
            Err(e) => {
                crate::network::accept::after_failure(&e).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tokio::spawn(async move {
                let _ = answer(
                    &mut conn,
                    429,
                    "Too Many Requests",
                    "too many connections to this port",
                )
                .await;
            });
            continue;
        };
        let (sandbox, token, dial) = (sandbox.clone(), token.clone(), dial.clone());
        tokio::spawn(async move {
            let _slot = slot;
            relay(conn, &sandbox, port, token.as_deref(), dial).await;
        });
    }
}

async fn answer(
    conn: &mut tokio::net::TcpStream,
    code: u16,
    text: &str,
    reason: &str,
) -> std::io::Result<()> {
    crate::network::head::answer(conn, code, text, "createos-local ingress", reason).await
}

/// Whether the request head carries `token` in one of the token headers.
fn carries(head: &[u8], token: &str) -> bool {
    let text = String::from_utf8_lossy(head);
    text.split("\r\n").skip(1).any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            let name = name.trim().to_ascii_lowercase();
            (name == TOKEN_HEADER || name == DAYTONA_TOKEN_HEADER) && value.trim() == token
        })
    })
}

/// One connection: read its first request head, check the token, dial
/// the sandbox's port, relay.
async fn relay(
    mut conn: tokio::net::TcpStream,
    sandbox: &str,
    port: u16,
    token: Option<&str>,
    dial: Dial,
) {
    let Some(head) = crate::network::head::read(&mut conn).await else {
        return;
    };
    if let Some(token) = token {
        if !carries(&head, token) {
            let _ = answer(
                &mut conn,
                401,
                "Unauthorized",
                &format!("this port of sandbox {sandbox} needs its token in {TOKEN_HEADER}"),
            )
            .await;
            return;
        }
    }
    let unreachable =
        |why: String| format!("nothing answers on port {port} in sandbox {sandbox} ({why})");
    let socket = match tokio::task::spawn_blocking(move || dial()).await {
        Ok(Ok(fd)) => fd,
        Ok(Err(e)) => {
            let _ = answer(&mut conn, 502, "Bad Gateway", &unreachable(e.to_string())).await;
            return;
        }
        Err(_) => return,
    };
    let stream = std::net::TcpStream::from(socket);
    let upstream = async {
        stream.set_nonblocking(true)?;
        let socket = tokio::net::TcpSocket::from_std_stream(stream);
        socket
            .connect((std::net::Ipv4Addr::LOCALHOST, port).into())
            .await
    };
    let mut upstream =
        match tokio::time::timeout(std::time::Duration::from_secs(10), upstream).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                let _ = answer(&mut conn, 502, "Bad Gateway", &unreachable(e.to_string())).await;
                return;
            }
            Err(_) => {
                let _ = answer(
                    &mut conn,
                    502,
                    "Bad Gateway",
                    &unreachable("no answer within 10 s".into()),
                )
                .await;
                return;
            }
        };
    if upstream.write_all(&head).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_token_is_read_from_either_header_and_only_whole() {
        let head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Sandbox-Preview-Token: abc\r\n\r\n";
        assert!(super::carries(head, "abc"));
        assert!(!super::carries(head, "ab"));
        let head = b"GET / HTTP/1.1\r\nx-daytona-preview-token:  abc \r\n\r\n";
        assert!(super::carries(head, "abc"));
        let head = b"GET /?x-sandbox-preview-token: abc HTTP/1.1\r\n\r\n";
        assert!(
            !super::carries(head, "abc"),
            "the request line is not a header"
        );
    }
}
