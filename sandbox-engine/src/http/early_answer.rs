//! Answering a request before its body is read.
//!
//! A server that answers early (a 429, an injected fault) and closes the
//! connection with the rest of the body unread makes the kernel reset it:
//! the client's next write fails (EPIPE) and the answer already sent is
//! thrown away with the connection, so the client never learns it was
//! throttled and cannot send again. Like the "lingering close" of common
//! servers, the answer is held until what is left of the body has been
//! read and discarded, within a byte and time bound.

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use futures_util::StreamExt;

/// Most bytes read and discarded for one early answer; past it the
/// connection is closed as before.
const MOST_DISCARDED: u64 = 256 * 1024 * 1024;

/// Longest wait for the rest of a body; past it the connection is closed
/// as before.
const LONGEST_WAIT: Duration = Duration::from_secs(30);

/// `answer`, once the rest of `body` is read and discarded (or the bounds
/// are reached, or the body fails).
pub async fn after_reading(body: Body, answer: Response) -> Response {
    let discard = async {
        let mut read: u64 = 0;
        let mut frames = body.into_data_stream();
        while let Some(Ok(data)) = frames.next().await {
            read += data.len() as u64;
            if read > MOST_DISCARDED {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(LONGEST_WAIT, discard).await;
    answer
}
