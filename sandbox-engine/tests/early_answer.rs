//! A request answered before its body is read (an injected fault, a 429
//! from the rate limit) still reaches the client: the server reads what is
//! left of the body before it closes, so the client's write never meets a
//! reset and its answer is never thrown away with the connection (the
//! "lingering close" of common servers). A host then sees the 429 and can
//! send the request again, instead of failing with EPIPE.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Harness, KEY};
use sandbox_engine::faults::{FaultAction, FaultRule};

/// Sends a PUT with a `len`-byte body all the way through, then reads the
/// answer's status line. `Err` says what broke (a reset while writing, or
/// no answer).
fn put_whole_body(addr: &str, path: &str, len: usize) -> Result<String, String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let head = format!(
        "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nX-Api-Key: {KEY}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: {len}\r\n\r\n"
    );
    stream
        .write_all(head.as_bytes())
        .map_err(|e| format!("head: {e}"))?;
    let chunk = vec![b'x'; 64 * 1024];
    let mut sent = 0;
    while sent < len {
        let n = chunk.len().min(len - sent);
        stream
            .write_all(&chunk[..n])
            .map_err(|e| format!("body write failed after {sent} bytes: {e}"))?;
        sent += n;
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            Err(e) => return Err(format!("reading the answer: {e}")),
        }
    }
    let text = String::from_utf8_lossy(&answer);
    text.lines()
        .next()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .ok_or_else(|| "the connection closed without an answer".to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_injected_429_on_a_large_upload_reaches_the_client_whole() {
    let (h, sb) = Harness::with_sandbox().await;
    h.server.faults().add(
        FaultRule::new(
            "PUT",
            "/v1/sandboxes/*/files",
            FaultAction::Status { status: 429 },
        )
        .times(1),
    );
    let addr = h.base.trim_start_matches("http://").to_string();
    let path = format!("/v1/sandboxes/{sb}/files?path=/tmp/big.bin");
    let status = tokio::task::spawn_blocking(move || put_whole_body(&addr, &path, 16 << 20))
        .await
        .unwrap();
    assert_eq!(status.as_deref(), Ok("HTTP/1.1 429 Too Many Requests"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rate_limit_429_on_a_large_upload_reaches_the_client_whole() {
    let h = Harness::start_builder(
        sandbox_engine::Server::builder().rate_limit(40, Duration::from_secs(60)),
    )
    .await;
    let sb = h.sandbox().await;
    let addr = h.base.trim_start_matches("http://").to_string();
    let path = format!("/v1/sandboxes/{sb}/files?path=/tmp/big.bin");
    let status = tokio::task::spawn_blocking(move || {
        // Small uploads spend the budget until one is refused.
        let spent = (0..40).any(|_| {
            put_whole_body(&addr, &path, 1024).as_deref() == Ok("HTTP/1.1 429 Too Many Requests")
        });
        assert!(spent, "the budget of 40 requests was spent");
        put_whole_body(&addr, &path, 16 << 20)
    })
    .await
    .unwrap();
    assert_eq!(status.as_deref(), Ok("HTTP/1.1 429 Too Many Requests"));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unauthenticated_upload_is_not_read_to_its_end() {
    // No key: the server answers 401 and does not spend its time reading
    // a stranger's body; the client may see a reset. Only what a keyed
    // client sends is drained.
    let h = Harness::start().await;
    let addr = h.base.trim_start_matches("http://").to_string();
    let status = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(&addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let head = format!(
            "PUT /v1/sandboxes/x/files?path=/a HTTP/1.1\r\nHost: {addr}\r\n\
             Content-Length: 100\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).unwrap();
        let mut buf = [0u8; 256];
        let n = stream.read(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .next()
            .unwrap_or("")
            .to_string()
    })
    .await
    .unwrap();
    assert_eq!(status, "HTTP/1.1 401 Unauthorized");
}
