//! The per-process output journal behind `/connect`.
//!
//! Every chunk read from the process's stdout or stderr becomes one frame with
//! a sequence number; numbering starts at 1 and is shared by both streams. The
//! journal keeps at most [`Journal::capacity`] bytes of frame payload and
//! evicts the oldest frames first (the newest frame is always kept, even if it
//! alone is larger than the capacity). A reader that asks for frames after a
//! cursor older than `oldest_seq - 1` has lost output: the server answers 410
//! (at connect time) or an `output_offset_expired` error frame (while
//! following).

use std::collections::VecDeque;

use bytes::Bytes;
use serde::Serialize;

/// Default payload capacity: about 1 MiB, like the real service.
pub const DEFAULT_CAPACITY: usize = 1024 * 1024;

/// Which output stream a frame came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamKind {
    /// The process's standard output.
    Stdout,
    /// The process's standard error.
    Stderr,
}

/// One retained output chunk.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Sequence number, ≥ 1, shared across both streams.
    pub seq: u64,
    /// Stream the bytes came from.
    pub stream: StreamKind,
    /// The raw bytes (any binary content; UTF-8 may be split).
    pub data: Bytes,
}

/// How the leader of a process ended, as reported in the exit frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitStatus {
    /// Normal exit with a code.
    Code(i32),
    /// Killed by a signal (name such as `SIGKILL`).
    Signal(String),
}

/// The result of asking for frames after a cursor.
#[derive(Debug)]
pub enum Replay {
    /// Frames with `seq > after` (possibly none), in order.
    Frames(Vec<Frame>),
    /// Output after the cursor has been evicted.
    Expired,
}

/// What a journal keeps when it is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// At most this many payload bytes over both streams; the oldest frames
    /// (of either stream) go first. Used for managed processes (`/connect`).
    Total(usize),
    /// At most this many payload bytes per stream; each stream keeps its own
    /// newest bytes. Used for one-shot `exec`, whose result reports how much
    /// of each stream was dropped.
    PerStream(usize),
}

/// Bounded, sequence-numbered output journal of one process.
#[derive(Debug)]
pub struct Journal {
    /// Retained frames per stream (`[stdout, stderr]`), oldest first.
    frames: [VecDeque<Frame>; 2],
    bytes: [usize; 2],
    dropped: [u64; 2],
    retention: Retention,
    next_seq: u64,
    /// The highest seq evicted so far (0: nothing was evicted). A cursor
    /// below it has lost output.
    evicted_through: u64,
    exit: Option<ExitStatus>,
}

fn index(stream: StreamKind) -> usize {
    match stream {
        StreamKind::Stdout => 0,
        StreamKind::Stderr => 1,
    }
}

impl Journal {
    /// An empty journal keeping about `capacity` bytes of payload over both
    /// streams.
    pub fn new(capacity: usize) -> Self {
        Self::with_retention(Retention::Total(capacity))
    }

    /// An empty journal with the given retention.
    pub fn with_retention(retention: Retention) -> Self {
        let retention = match retention {
            Retention::Total(c) => Retention::Total(c.max(1)),
            Retention::PerStream(c) => Retention::PerStream(c.max(1)),
        };
        Self {
            frames: [VecDeque::new(), VecDeque::new()],
            bytes: [0, 0],
            dropped: [0, 0],
            retention,
            next_seq: 1,
            evicted_through: 0,
            exit: None,
        }
    }

    /// Payload capacity in bytes (per stream for [`Retention::PerStream`]).
    pub fn capacity(&self) -> usize {
        match self.retention {
            Retention::Total(c) | Retention::PerStream(c) => c,
        }
    }

    /// Appends a chunk and evicts the oldest frames beyond capacity.
    /// Empty chunks and chunks after the exit frame are ignored (output that
    /// orphans write after the leader exited is not part of the command's
    /// output). Returns the new frame's seq, if any.
    pub fn push(&mut self, stream: StreamKind, data: Bytes) -> Option<u64> {
        if data.is_empty() || self.exit.is_some() {
            return None;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let i = index(stream);
        self.bytes[i] += data.len();
        self.frames[i].push_back(Frame { seq, stream, data });
        match self.retention {
            Retention::Total(cap) => {
                while self.bytes[0] + self.bytes[1] > cap && self.frame_count() > 1 {
                    let oldest = match (self.frames[0].front(), self.frames[1].front()) {
                        (Some(a), Some(b)) => usize::from(b.seq < a.seq),
                        (Some(_), None) => 0,
                        _ => 1,
                    };
                    self.evict_front(oldest);
                }
            }
            Retention::PerStream(cap) => {
                while self.bytes[i] > cap && self.frames[i].len() > 1 {
                    self.evict_front(i);
                }
            }
        }
        Some(seq)
    }

    fn frame_count(&self) -> usize {
        self.frames[0].len() + self.frames[1].len()
    }

    fn evict_front(&mut self, i: usize) {
        if let Some(old) = self.frames[i].pop_front() {
            self.bytes[i] -= old.data.len();
            self.dropped[i] += old.data.len() as u64;
            self.evicted_through = self.evicted_through.max(old.seq);
        }
    }

    /// Records the leader's exit; the first call wins.
    pub fn set_exit(&mut self, status: ExitStatus) {
        if self.exit.is_none() {
            self.exit = Some(status);
        }
    }

    /// The recorded exit, if the leader has exited.
    pub fn exit(&self) -> Option<&ExitStatus> {
        self.exit.as_ref()
    }

    /// Sequence number of the oldest retained frame (0 when none is retained).
    pub fn oldest_seq(&self) -> u64 {
        self.frames
            .iter()
            .filter_map(|f| f.front().map(|f| f.seq))
            .min()
            .unwrap_or(0)
    }

    /// Sequence number of the newest frame written (0 when none).
    pub fn newest_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Bytes of payload currently retained.
    pub fn retained_bytes(&self) -> usize {
        self.bytes[0] + self.bytes[1]
    }

    /// Bytes of `stream` evicted so far.
    pub fn dropped_bytes(&self, stream: StreamKind) -> u64 {
        self.dropped[index(stream)]
    }

    /// The retained bytes of one stream, in order (the newest bytes when
    /// some were dropped).
    pub fn stream_tail(&self, stream: StreamKind) -> Vec<u8> {
        let i = index(stream);
        let mut out = Vec::with_capacity(self.bytes[i]);
        for f in &self.frames[i] {
            out.extend_from_slice(&f.data);
        }
        out
    }

    /// Frames with `seq > after`, or [`Replay::Expired`] when some of them
    /// were evicted. (A cursor beyond [`Journal::newest_seq`] simply gets no
    /// frames here; the API refuses such cursors before asking.)
    pub fn after(&self, after: u64) -> Replay {
        if after < self.evicted_through {
            return Replay::Expired;
        }
        let [out, err] = &self.frames;
        let mut a = out.iter().filter(|f| f.seq > after).peekable();
        let mut b = err.iter().filter(|f| f.seq > after).peekable();
        let mut merged = Vec::new();
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) if x.seq < y.seq => a.next(),
                (Some(_), Some(_)) => b.next(),
                (Some(_), None) => a.next(),
                (None, Some(_)) => b.next(),
                (None, None) => break,
            };
            merged.extend(next.cloned());
        }
        Replay::Frames(merged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_is_shared_across_streams_and_starts_at_one() {
        let mut j = Journal::new(100);
        assert_eq!(
            j.push(StreamKind::Stdout, Bytes::from_static(b"a")),
            Some(1)
        );
        assert_eq!(
            j.push(StreamKind::Stderr, Bytes::from_static(b"b")),
            Some(2)
        );
        assert_eq!(j.newest_seq(), 2);
        match j.after(1) {
            Replay::Frames(f) => assert_eq!(f.len(), 1),
            Replay::Expired => panic!("not expired"),
        }
    }

    #[test]
    fn eviction_makes_old_cursors_expire() {
        let mut j = Journal::new(10);
        for _ in 0..5 {
            j.push(StreamKind::Stdout, Bytes::from_static(b"12345"));
        }
        assert_eq!(j.oldest_seq(), 4);
        assert!(j.retained_bytes() <= 10);
        assert!(matches!(j.after(2), Replay::Expired));
        assert!(matches!(j.after(3), Replay::Frames(ref f) if f.len() == 2));
    }

    #[test]
    fn per_stream_retention_keeps_each_tail_and_counts_drops() {
        let mut j = Journal::with_retention(Retention::PerStream(4));
        j.push(StreamKind::Stdout, Bytes::from_static(b"ab"));
        j.push(StreamKind::Stderr, Bytes::from_static(b"E"));
        j.push(StreamKind::Stdout, Bytes::from_static(b"cd"));
        j.push(StreamKind::Stdout, Bytes::from_static(b"ef"));
        assert_eq!(j.stream_tail(StreamKind::Stdout), b"cdef");
        assert_eq!(j.dropped_bytes(StreamKind::Stdout), 2);
        assert_eq!(j.stream_tail(StreamKind::Stderr), b"E");
        assert_eq!(j.dropped_bytes(StreamKind::Stderr), 0);
        assert!(matches!(j.after(0), Replay::Expired));
        assert!(matches!(j.after(1), Replay::Frames(ref f) if f.len() == 3));
    }

    #[test]
    fn the_largest_cursor_does_not_overflow() {
        let mut j = Journal::new(10);
        j.push(StreamKind::Stdout, Bytes::from_static(b"x"));
        assert!(matches!(j.after(u64::MAX), Replay::Frames(ref f) if f.is_empty()));
    }

    #[test]
    fn output_after_exit_is_dropped() {
        let mut j = Journal::new(10);
        j.set_exit(ExitStatus::Code(0));
        assert_eq!(j.push(StreamKind::Stdout, Bytes::from_static(b"x")), None);
    }
}
