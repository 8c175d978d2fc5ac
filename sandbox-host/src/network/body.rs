//! Response bodies: fixed, scripted (chunks with delays and a final error),
//! channel-fed, and the size/deadline limits a guard puts around them.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use tokio::sync::mpsc;

use crate::network::transport::ErrorCode;

/// A response body: a stream of byte chunks that may end with an
/// [`ErrorCode`] (for example `connection-terminated` for a reset mid-body).
pub struct ResponseBody {
    inner: UnsyncBoxBody<Bytes, ErrorCode>,
}

impl ResponseBody {
    /// Wraps any body whose error type is [`ErrorCode`].
    pub fn new<B>(body: B) -> Self
    where
        B: Body<Data = Bytes, Error = ErrorCode> + Send + 'static,
    {
        ResponseBody {
            inner: body.boxed_unsync(),
        }
    }

    /// An empty body.
    pub fn empty() -> Self {
        Self::new(Empty::new().map_err(|never| match never {}))
    }

    /// A body of exactly `bytes`.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Self::new(Full::new(bytes.into()).map_err(|never| match never {}))
    }

    /// A body that yields each `(delay, chunk)` after sleeping `delay`, then
    /// ends cleanly or, with `end = Some(code)`, fails with `code`.
    pub fn chunks(chunks: Vec<(Duration, Bytes)>, end: Option<ErrorCode>) -> Self {
        if chunks.iter().all(|(delay, _)| delay.is_zero()) {
            return Self::new(ChunkedBody {
                chunks: chunks.into(),
                end,
            });
        }
        // Delays are slept on a thread of their own: the body may be polled
        // outside any tokio runtime, where tokio timers cannot run.
        let (sender, body) = Self::channel();
        std::thread::spawn(move || {
            for (delay, chunk) in chunks {
                std::thread::sleep(delay);
                if !sender.send(chunk) {
                    return;
                }
            }
            if let Some(code) = end {
                sender.fail(code);
            }
        });
        body
    }

    /// A body fed from the returned [`BodySender`], from any thread, frame
    /// by frame. It ends when the sender is dropped or fails.
    pub fn channel() -> (BodySender, ResponseBody) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (BodySender { sender }, Self::new(ChannelBody { receiver }))
    }

    pub(crate) fn into_inner(self) -> UnsyncBoxBody<Bytes, ErrorCode> {
        self.inner
    }

    /// Fails with `http-response-body-size` once more than `max` bytes came.
    pub(crate) fn limit_size(self, max: u64) -> Self {
        Self::new(LimitedBody {
            inner: self.inner,
            max,
            seen: 0,
        })
    }

    /// Fails with `http-response-timeout` if the body is not done by `deadline`.
    pub(crate) fn deadline(self, deadline: Instant) -> Self {
        Self::new(DeadlineBody {
            inner: self.inner,
            sleep: Box::pin(tokio::time::sleep_until(deadline.into())),
        })
    }
}

impl fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody").finish_non_exhaustive()
    }
}

/// The feeding end of [`ResponseBody::channel`].
#[derive(Clone)]
pub struct BodySender {
    sender: mpsc::UnboundedSender<Result<Bytes, ErrorCode>>,
}

impl BodySender {
    /// Sends one chunk; false when the guest already dropped the body.
    pub fn send(&self, chunk: impl Into<Bytes>) -> bool {
        self.sender.send(Ok(chunk.into())).is_ok()
    }

    /// Ends the body with `code` (for example a reset).
    pub fn fail(self, code: ErrorCode) {
        let _ = self.sender.send(Err(code));
    }
}

impl fmt::Debug for BodySender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BodySender").finish_non_exhaustive()
    }
}

/// Chunks that are all ready at once.
struct ChunkedBody {
    chunks: VecDeque<(Duration, Bytes)>,
    end: Option<ErrorCode>,
}

impl Body for ChunkedBody {
    type Data = Bytes;
    type Error = ErrorCode;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ErrorCode>>> {
        let this = &mut *self;
        match this.chunks.pop_front() {
            Some((_, chunk)) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
            None => Poll::Ready(this.end.take().map(Err)),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty() && self.end.is_none()
    }
}

struct ChannelBody {
    receiver: mpsc::UnboundedReceiver<Result<Bytes, ErrorCode>>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = ErrorCode;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ErrorCode>>> {
        self.receiver
            .poll_recv(cx)
            .map(|item| item.map(|chunk| chunk.map(Frame::data)))
    }
}

struct LimitedBody {
    inner: UnsyncBoxBody<Bytes, ErrorCode>,
    max: u64,
    seen: u64,
}

impl Body for LimitedBody {
    type Data = Bytes;
    type Error = ErrorCode;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ErrorCode>>> {
        let this = &mut *self;
        if this.seen > this.max {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.seen = this.seen.saturating_add(data.len() as u64);
                    if this.seen > this.max {
                        return Poll::Ready(Some(Err(ErrorCode::HttpResponseBodySize(Some(
                            this.seen,
                        )))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

struct DeadlineBody {
    inner: UnsyncBoxBody<Bytes, ErrorCode>,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl Body for DeadlineBody {
    type Data = Bytes;
    type Error = ErrorCode;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ErrorCode>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(ErrorCode::HttpResponseTimeout))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
