//! What the engine's two byte relays (the egress proxy, [`crate::network::egress`],
//! and the ingress, [`crate::network::ingress`]) read and say before they
//! relay: a client's first request head, and a short plain-text answer
//! that closes the connection.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Longest request head read.
pub const MAX_HEAD: usize = 16 * 1024;

/// How long a client has to send its request head.
pub const HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The request head `conn` sends first (up to and with its blank line,
/// and whatever came after it in the same reads), or `None` when the
/// client closes, stalls past [`HEAD_TIMEOUT`] or sends more than
/// [`MAX_HEAD`] without one.
pub async fn read(conn: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(HEAD_TIMEOUT, async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut buf).await?;
            if n == 0 || head.len() > MAX_HEAD {
                return Err(std::io::Error::other("no request head"));
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<(), std::io::Error>(())
    })
    .await;
    matches!(read, Ok(Ok(()))).then_some(head)
}

/// Answers `code text` with `who: reason` as a plain-text body, and
/// closes the connection.
pub async fn answer(
    conn: &mut tokio::net::TcpStream,
    code: u16,
    text: &str,
    who: &str,
    reason: &str,
) -> std::io::Result<()> {
    let body = format!("{who}: {reason}\n");
    let head = format!(
        "HTTP/1.1 {code} {text}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(body.as_bytes()).await?;
    conn.shutdown().await
}
