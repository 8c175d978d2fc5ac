//! Plain HTTP/1.1 on loopback for the egress and port tests: a server that
//! answers every request with one text, and a `GET` that returns the status
//! and body. Only loopback addresses the test chose are ever used.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// Listens on `address` (a loopback address) at a free port and answers
/// every request, in a thread, with the text `body` makes of that port;
/// the port.
pub fn serve_text(address: &str, body: impl FnOnce(u16) -> String) -> u16 {
    let listener = TcpListener::bind((address, 0)).expect("listen on loopback");
    let port = listener.local_addr().expect("its address").port();
    let body = body(port);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let reply = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(reply.as_bytes());
        }
    });
    port
}

/// `GET url` (an `http://` URL on loopback) with an optional header: the
/// status (0 when the answer had none) and the body.
pub fn get(url: &str, header: Option<(&str, &str)>) -> (u16, String) {
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let mut conn = TcpStream::connect(authority).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("a read timeout");
    let extra = header
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .unwrap_or_default();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\n{extra}Connection: close\r\n\r\n"
    )
    .expect("the request is sent");
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}
