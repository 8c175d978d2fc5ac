//! The toolbox's log WebSocket, as the official SDKs follow a session
//! command's logs (`getSessionCommandLogs` with callbacks): binary
//! messages, labelled for an SDK that demuxes, combined otherwise, a normal
//! close only once the command has exited and every byte was sent,
//! backpressure for a client that stops reading, and the socket counted
//! under the connection cap. Against real processes.

mod common;

use std::time::Duration;

use common::{Harness, KEY};
use futures_util::StreamExt;
use reqwest::StatusCode;
use sandbox_engine::{Server, STDERR_PREFIX, STDOUT_PREFIX};
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A sandbox with one session, `s1`; returns the sandbox id.
async fn sandbox_with_session(h: &Harness) -> String {
    let sb = h.daytona_sandbox().await;
    let (st, v) = h.daytona_session(&sb, "s1").await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    sb
}

/// Starts `command` in the background in session `s1`; its command id.
async fn start(h: &Harness, sb: &str, command: &str) -> String {
    let (st, v) = h
        .daytona_session_exec(sb, "s1", json!({"command": command, "runAsync": true}))
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{v}");
    v["cmdId"].as_str().expect("cmdId").to_string()
}

/// Opens the log socket of command `cmd` with the key and `headers`.
async fn open(
    h: &Harness,
    sb: &str,
    cmd: &str,
    follow: bool,
    headers: &[(&'static str, &str)],
) -> (
    Socket,
    tokio_tungstenite::tungstenite::handshake::client::Response,
) {
    let url = format!(
        "{}/{sb}/process/session/s1/command/{cmd}/logs{}",
        h.server.toolbox_url().replacen("http://", "ws://", 1),
        if follow { "?follow=true" } else { "" }
    );
    let mut request = url.into_client_request().expect("request");
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {KEY}").parse().expect("header"),
    );
    for (name, value) in headers {
        request
            .headers_mut()
            .insert(*name, value.parse().expect("header"));
    }
    tokio_tungstenite::connect_async(request)
        .await
        .expect("the log socket opens")
}

/// Reads binary messages until the close; the bytes and the close code.
async fn read_to_close(socket: &mut Socket) -> (Vec<u8>, Option<CloseCode>) {
    let mut log = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(60), socket.next())
            .await
            .expect("a message within 60 s");
        match message {
            Some(Ok(Message::Binary(bytes))) => log.extend_from_slice(&bytes),
            Some(Ok(Message::Close(frame))) => return (log, frame.map(|f| f.code)),
            Some(Ok(other)) => panic!("unexpected message {other:?}"),
            Some(Err(e)) => panic!("socket failed before its close: {e}"),
            None => return (log, None),
        }
    }
}

/// Splits labelled log bytes into (stdout, stderr) as the SDK does.
fn demux(log: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut to_err = None;
    let mut i = 0;
    while i < log.len() {
        if log[i..].starts_with(STDOUT_PREFIX) {
            to_err = Some(false);
            i += STDOUT_PREFIX.len();
        } else if log[i..].starts_with(STDERR_PREFIX) {
            to_err = Some(true);
            i += STDERR_PREFIX.len();
        } else {
            match to_err.expect("log bytes before any marker") {
                false => out.push(log[i]),
                true => err.push(log[i]),
            }
            i += 1;
        }
    }
    (out, err)
}

fn expected(prefix: &str, lines: usize) -> Vec<u8> {
    (1..=lines)
        .map(|i| format!("{prefix} {i}\n"))
        .collect::<String>()
        .into_bytes()
}

/// An SDK (version header) follows a running command: every byte of both
/// streams, labelled, the SDK version echoed as the subprotocol it
/// offered, and a normal close only after the command's last line.
#[tokio::test]
async fn an_sdk_follows_a_running_command_to_its_end_with_every_byte_labelled() {
    let h = Harness::start_builder(Server::builder().toolbox_port(0)).await;
    let sb = sandbox_with_session(&h).await;
    let cmd = start(
        &h,
        &sb,
        "sleep 0.3; for i in $(seq 1 3000); do echo out $i; echo err $i >&2; done; \
         sleep 0.3; echo last",
    )
    .await;
    let (mut socket, answer) = open(
        &h,
        &sb,
        &cmd,
        true,
        &[
            ("x-daytona-sdk-version", "0.218.0"),
            ("sec-websocket-protocol", "X-Daytona-SDK-Version~0.218.0"),
        ],
    )
    .await;
    assert_eq!(
        answer
            .headers()
            .get("sec-websocket-protocol")
            .map(|v| v.to_str().unwrap()),
        Some("X-Daytona-SDK-Version~0.218.0")
    );
    let (log, close) = read_to_close(&mut socket).await;
    assert_eq!(close, Some(CloseCode::Normal));
    let (out, err) = demux(&log);
    let mut want_out = expected("out", 3000);
    want_out.extend_from_slice(b"last\n");
    assert_eq!(out, want_out);
    assert_eq!(err, expected("err", 3000));
    // The command had exited when the socket closed.
    let url = format!(
        "{}/{sb}/process/session/s1/command/{cmd}",
        h.server.toolbox_url()
    );
    let (st, v) = h.daytona(reqwest::Method::GET, url, None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["exitCode"], 0, "{v}");
}

/// Without an SDK version or the split header the socket carries the
/// combined text, markers removed, as the daemon sends it; without
/// `follow` it sends the log so far and closes.
#[tokio::test]
async fn a_plain_client_gets_combined_text_and_a_snapshot_without_follow() {
    let h = Harness::start_builder(Server::builder().toolbox_port(0)).await;
    let sb = sandbox_with_session(&h).await;
    let cmd = start(&h, &sb, "echo one; echo two >&2; sleep 30").await;
    // Wait until both lines are in the log.
    let url = format!(
        "{}/{sb}/process/session/s1/command/{cmd}/logs",
        h.server.toolbox_url()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, _, body) = h.daytona_raw(reqwest::Method::GET, &url, None, false).await;
        if body.len() >= 8 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no output in 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (mut socket, answer) = open(&h, &sb, &cmd, false, &[]).await;
    assert!(answer.headers().get("sec-websocket-protocol").is_none());
    let (log, close) = read_to_close(&mut socket).await;
    assert_eq!(close, Some(CloseCode::Normal));
    let text = String::from_utf8(log).expect("utf8");
    assert!(
        text == "one\ntwo\n" || text == "two\none\n",
        "combined text without markers, got {text:?}"
    );
}

/// A client that stops reading holds the command, not its output: 8 MiB
/// through a 1 MiB journal while nobody reads for two seconds still
/// arrives whole, in order, with a normal close.
#[tokio::test]
async fn a_follower_that_stops_reading_slows_the_command_and_loses_nothing() {
    let h = Harness::start_builder(
        Server::builder()
            .toolbox_port(0)
            .journal_capacity(1024 * 1024),
    )
    .await;
    let sb = sandbox_with_session(&h).await;
    let cmd = start(&h, &sb, "sleep 0.3; seq 1 1000000").await;
    let (mut socket, _) = open(&h, &sb, &cmd, true, &[("x-daytona-split-output", "true")]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (log, close) = read_to_close(&mut socket).await;
    assert_eq!(close, Some(CloseCode::Normal));
    let (out, err) = demux(&log);
    assert!(err.is_empty());
    let want: String = (1..=1_000_000).map(|i| format!("{i}\n")).collect();
    assert_eq!(out.len(), want.len());
    assert!(out == want.as_bytes(), "stdout differs from seq's output");
}

/// An open log socket keeps its connection's place under the cap: with
/// the cap taken by sockets (and the harness's own keep-alive
/// connection), the next connection is refused (503); once the sockets
/// close, requests are served again.
#[tokio::test]
async fn open_log_sockets_count_under_the_connection_cap() {
    const CAP: usize = 4;
    let h = Harness::start_builder(Server::builder().toolbox_port(0).max_connections(CAP)).await;
    let sb = sandbox_with_session(&h).await;
    let cmd = start(&h, &sb, "sleep 60").await;
    let mut sockets = Vec::new();
    let refusal = loop {
        match try_open(&h, &sb, &cmd).await {
            Ok(socket) => sockets.push(socket),
            Err(refusal) => break refusal,
        }
        assert!(
            sockets.len() <= CAP,
            "{} sockets open under a cap of {CAP} connections",
            sockets.len()
        );
    };
    assert!(!sockets.is_empty(), "no socket opened: {refusal}");
    assert!(refusal.contains("503"), "{refusal}");
    for mut socket in sockets {
        socket.close(None).await.expect("close");
        while socket.next().await.is_some() {}
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while let Err(refusal) = try_open(&h, &sb, &cmd).await {
        assert!(
            std::time::Instant::now() < deadline,
            "still refused 10 s after the sockets closed: {refusal}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Opens a follow socket; the refusal as text when the server refuses.
async fn try_open(h: &Harness, sb: &str, cmd: &str) -> Result<Socket, String> {
    let url = format!(
        "{}/{sb}/process/session/s1/command/{cmd}/logs?follow=true",
        h.server.toolbox_url().replacen("http://", "ws://", 1)
    );
    let mut request = url.into_client_request().expect("request");
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {KEY}").parse().expect("header"),
    );
    match tokio_tungstenite::connect_async(request).await {
        Ok((socket, _)) => Ok(socket),
        Err(tokio_tungstenite::tungstenite::Error::Http(answer)) => {
            Err(format!("HTTP {}", answer.status().as_u16()))
        }
        Err(e) => Err(e.to_string()),
    }
}
