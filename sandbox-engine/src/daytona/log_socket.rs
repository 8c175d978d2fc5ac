//! A command's logs over WebSocket, the way the official Daytona SDKs
//! follow them (`getSessionCommandLogs` with callbacks opens
//! `ws://…/process/session/{s}/command/{c}/logs?follow=true`).
//!
//! As the daemon does: each piece of log is one binary message, labelled or
//! combined by the same rule as a plain read ([`super::toolbox::wants_split`]);
//! with `follow=true` the socket stays open until the command has exited
//! and its output was sent, then closes with 1000 (normal closure); without
//! it, the log so far is sent and the socket closes. An SDK version header
//! is echoed as the `X-Daytona-SDK-Version~<version>` subprotocol when the
//! client offers it.
//!
//! What this adds over the daemon, for the engine's own promises:
//! - Output that could not be sent (the follower fell behind an evicting
//!   journal, an injected fault) closes the socket with 1011 (internal
//!   error) and says why, never with a normal closure.
//! - The follower is an attached reader: the next piece is taken only once
//!   the previous one was written to the socket, so a client that stops
//!   reading slows the command (backpressure) instead of losing output.
//! - The socket keeps its connection's place under the connection cap
//!   ([`crate::network::connections::ConnectionSlot`]) until it closes.

use std::io;

use axum::body::Bytes;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::http::HeaderMap;
use axum::response::Response;
use futures_util::{Stream, StreamExt};
use tokio::sync::OwnedSemaphorePermit;

/// The header the official SDKs send with their version.
pub const SDK_VERSION_HEADER: &str = "x-daytona-sdk-version";

/// Close code of a follow that ended with all output sent.
const NORMAL_CLOSURE: u16 = 1000;

/// Close code of a follow that could not send all output.
const INTERNAL_ERROR: u16 = 1011;

/// The subprotocol the daemon accepts for a request carrying an SDK
/// version (the version is echoed back, when the client offers it).
fn sdk_subprotocol(headers: &HeaderMap) -> Option<String> {
    headers
        .get(SDK_VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| format!("X-Daytona-SDK-Version~{v}"))
}

/// Answers the upgrade and, once upgraded, sends `log` piece by piece.
/// `slot` (the connection's place under the cap) is held until the socket
/// closes.
pub fn serve<S>(
    upgrade: WebSocketUpgrade,
    headers: &HeaderMap,
    slot: Option<OwnedSemaphorePermit>,
    log: S,
) -> Response
where
    S: Stream<Item = io::Result<Bytes>> + Send + 'static,
{
    let upgrade = match sdk_subprotocol(headers) {
        Some(protocol) => upgrade.protocols([protocol]),
        None => upgrade,
    };
    upgrade.on_upgrade(move |socket| async move {
        send_log(socket, log).await;
        drop(slot);
    })
}

/// Sends every piece of `log`, then the close frame that says how it
/// ended. Stops early when the client closes or goes away.
async fn send_log<S>(socket: WebSocket, log: S)
where
    S: Stream<Item = io::Result<Bytes>> + Send + 'static,
{
    let (mut to_client, mut from_client) = socket.split();
    let log = log.fuse();
    futures_util::pin_mut!(log);
    let close = loop {
        tokio::select! {
            // A close, an error or the end of the client's side ends the
            // follow; other messages from the client are ignored.
            incoming = from_client.next() => match incoming {
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
                Some(Ok(_)) => continue,
            },
            piece = log.next() => match piece {
                Some(Ok(bytes)) => {
                    if bytes.is_empty() {
                        continue;
                    }
                    if futures_util::SinkExt::send(&mut to_client, Message::Binary(bytes))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Some(Err(e)) => break CloseFrame {
                    code: INTERNAL_ERROR,
                    reason: truncated_reason(&e.to_string()).into(),
                },
                None => break CloseFrame {
                    code: NORMAL_CLOSURE,
                    reason: "".into(),
                },
            },
        }
    };
    let _ = futures_util::SinkExt::send(&mut to_client, Message::Close(Some(close))).await;
    // Wait (briefly) for the client's close so that the connection ends
    // cleanly rather than with a reset that could lose the close frame.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
        while let Some(Ok(message)) = from_client.next().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}

/// A close reason fits in 123 bytes (RFC 6455 §5.5: a control frame's
/// payload is at most 125 bytes, two of which are the code).
fn truncated_reason(reason: &str) -> String {
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_close_reason_is_cut_to_the_protocol_limit_on_a_character_boundary() {
        let long = "é".repeat(100);
        let cut = truncated_reason(&long);
        assert!(cut.len() <= 123);
        assert!(long.starts_with(&cut));
        assert_eq!(truncated_reason("short"), "short");
    }

    #[test]
    fn the_sdk_version_becomes_the_subprotocol_the_daemon_echoes() {
        let mut headers = HeaderMap::new();
        assert_eq!(sdk_subprotocol(&headers), None);
        headers.insert(SDK_VERSION_HEADER, "0.218.0".parse().unwrap());
        assert_eq!(
            sdk_subprotocol(&headers).as_deref(),
            Some("X-Daytona-SDK-Version~0.218.0")
        );
    }
}
