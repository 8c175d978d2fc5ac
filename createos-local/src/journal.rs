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

/// Bounded, sequence-numbered output journal of one process.
#[derive(Debug)]
pub struct Journal {
    frames: VecDeque<Frame>,
    bytes: usize,
    capacity: usize,
    next_seq: u64,
    exit: Option<ExitStatus>,
}

impl Journal {
    /// An empty journal keeping about `capacity` bytes of payload.
    pub fn new(capacity: usize) -> Self {
        Self {
            frames: VecDeque::new(),
            bytes: 0,
            capacity: capacity.max(1),
            next_seq: 1,
            exit: None,
        }
    }

    /// Payload capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
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
        self.bytes += data.len();
        self.frames.push_back(Frame { seq, stream, data });
        while self.bytes > self.capacity && self.frames.len() > 1 {
            if let Some(old) = self.frames.pop_front() {
                self.bytes -= old.data.len();
            }
        }
        Some(seq)
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

    /// Sequence number of the oldest retained frame (0 when none was ever written).
    pub fn oldest_seq(&self) -> u64 {
        self.frames.front().map_or(0, |f| f.seq)
    }

    /// Sequence number of the newest frame written (0 when none).
    pub fn newest_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Bytes of payload currently retained.
    pub fn retained_bytes(&self) -> usize {
        self.bytes
    }

    /// Frames with `seq > after`, or [`Replay::Expired`] when some of them
    /// were evicted.
    pub fn after(&self, after: u64) -> Replay {
        match self.frames.front() {
            Some(first) if after + 1 < first.seq => Replay::Expired,
            Some(_) => Replay::Frames(
                self.frames
                    .iter()
                    .filter(|f| f.seq > after)
                    .cloned()
                    .collect(),
            ),
            None => Replay::Frames(Vec::new()),
        }
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
    fn output_after_exit_is_dropped() {
        let mut j = Journal::new(10);
        j.set_exit(ExitStatus::Code(0));
        assert_eq!(j.push(StreamKind::Stdout, Bytes::from_static(b"x")), None);
    }
}
