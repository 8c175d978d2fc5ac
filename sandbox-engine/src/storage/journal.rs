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
//!
//! A [`Retention::Streamed`] journal (managed processes, session commands)
//! adds backpressure: frames an attached reader has not received yet are
//! never evicted, and [`Journal::room`] tells the pipe readers to stop
//! reading (so the command blocks on write, as under ssh or a terminal)
//! while such frames fill the capacity. The same hold covers the moments
//! a reader is expected but not attached: from the process's start until
//! its first reader attaches, and after the last reader detaches (a
//! reconnect), each for at most [`READER_GRACE`]. With no reader and no
//! grace left, the journal is the service's bounded replay again.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;

/// Default payload capacity: about 1 MiB, like the real service.
pub const DEFAULT_CAPACITY: usize = 1024 * 1024;

/// How long a [`Retention::Streamed`] journal holds unread output for a
/// reader that is expected but not attached: after the process started
/// (until its first reader attaches) and after the last reader detached
/// (until one attaches again). Covers a client's create-then-connect gap
/// and its reconnect pause, with room for a loaded machine and a paced
/// request budget.
pub const READER_GRACE: Duration = Duration::from_secs(15);

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
    /// Like [`Retention::Total`], with reader backpressure (see the module
    /// docs): unread frames are kept, and the pipes wait for room.
    Streamed(usize),
}

/// An attached reader of a [`Retention::Streamed`] journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReaderId(u64);

/// Whether the pipe readers may read more output now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// Read.
    Open,
    /// Unread output fills the journal: wait until a reader takes some
    /// (the journal's owner announces that), or until `Some(instant)`,
    /// when the hold of an absent reader lapses.
    Full(Option<Instant>),
}

/// The readers of a streamed journal and the hold they imply.
#[derive(Debug)]
struct Readers {
    /// Attached readers and the seq each has received up to.
    attached: BTreeMap<ReaderId, u64>,
    next_id: u64,
    /// With no reader attached: output after `.1` is held until `.0`.
    grace: Option<(Instant, u64)>,
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
    /// How many frames were evicted.
    evicted_frames: u64,
    /// `Some` for [`Retention::Streamed`].
    readers: Option<Readers>,
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
            Retention::Streamed(c) => Retention::Streamed(c.max(1)),
        };
        let readers = matches!(retention, Retention::Streamed(_)).then(|| Readers {
            attached: BTreeMap::new(),
            next_id: 0,
            grace: Some((Instant::now() + READER_GRACE, 0)),
        });
        Self {
            frames: [VecDeque::new(), VecDeque::new()],
            bytes: [0, 0],
            dropped: [0, 0],
            retention,
            next_seq: 1,
            evicted_through: 0,
            evicted_frames: 0,
            readers,
            exit: None,
        }
    }

    /// Payload capacity in bytes (per stream for [`Retention::PerStream`]).
    pub fn capacity(&self) -> usize {
        match self.retention {
            Retention::Total(c) | Retention::PerStream(c) | Retention::Streamed(c) => c,
        }
    }

    /// The seq after which no frame may be evicted now (`None`: no hold).
    fn hold(&self, now: Instant) -> Option<u64> {
        let readers = self.readers.as_ref()?;
        if let Some(min) = readers.attached.values().min() {
            return Some(*min);
        }
        match readers.grace {
            Some((until, floor)) if now < until => Some(floor),
            _ => None,
        }
    }

    /// Bytes of the retained frames with `seq > after`.
    fn bytes_after(&self, after: u64) -> usize {
        self.frames
            .iter()
            .map(|f| {
                f.iter()
                    .rev()
                    .take_while(|f| f.seq > after)
                    .map(|f| f.data.len())
                    .sum::<usize>()
            })
            .sum()
    }

    /// Whether the pipes may be read now: always, but for a streamed
    /// journal whose held (unread) output fills its capacity.
    pub fn room(&self) -> Room {
        let now = Instant::now();
        let Some(hold) = self.hold(now) else {
            return Room::Open;
        };
        if self.exit.is_some() || self.bytes_after(hold) < self.capacity() {
            return Room::Open;
        }
        let until = match &self.readers {
            Some(r) if r.attached.is_empty() => r.grace.map(|(until, _)| until),
            _ => None,
        };
        Room::Full(until)
    }

    /// Attaches a reader that has received everything up to `after`
    /// (streamed journals only; `None` otherwise).
    pub fn attach(&mut self, after: u64) -> Option<ReaderId> {
        let readers = self.readers.as_mut()?;
        let id = ReaderId(readers.next_id);
        readers.next_id += 1;
        readers.attached.insert(id, after);
        readers.grace = None;
        Some(id)
    }

    /// Records that reader `id` has received every frame up to `seq`, and
    /// evicts what is no longer held.
    pub fn advance(&mut self, id: ReaderId, seq: u64) {
        if let Some(cursor) = self.readers.as_mut().and_then(|r| r.attached.get_mut(&id)) {
            *cursor = (*cursor).max(seq);
        }
        self.trim();
    }

    /// Detaches reader `id`. When it was the last one, what it had not
    /// received stays held for [`READER_GRACE`] (for its reconnect).
    pub fn detach(&mut self, id: ReaderId) {
        if let Some(readers) = self.readers.as_mut() {
            if let Some(cursor) = readers.attached.remove(&id) {
                if readers.attached.is_empty() {
                    readers.grace = Some((Instant::now() + READER_GRACE, cursor));
                }
            }
        }
        self.trim();
    }

    /// Evicts the oldest frames beyond capacity, as far as the hold allows.
    fn trim(&mut self) {
        let hold = self.hold(Instant::now());
        match self.retention {
            Retention::Total(cap) | Retention::Streamed(cap) => {
                while self.bytes[0] + self.bytes[1] > cap && self.frame_count() > 1 {
                    let oldest = match (self.frames[0].front(), self.frames[1].front()) {
                        (Some(a), Some(b)) => usize::from(b.seq < a.seq),
                        (Some(_), None) => 0,
                        _ => 1,
                    };
                    let seq = self.frames[oldest].front().map_or(0, |f| f.seq);
                    if hold.is_some_and(|h| seq > h) {
                        break;
                    }
                    self.evict_front(oldest);
                }
            }
            Retention::PerStream(cap) => {
                for i in 0..2 {
                    while self.bytes[i] > cap && self.frames[i].len() > 1 {
                        self.evict_front(i);
                    }
                }
            }
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
        self.trim();
        Some(seq)
    }

    fn frame_count(&self) -> usize {
        self.frames[0].len() + self.frames[1].len()
    }

    fn evict_front(&mut self, i: usize) {
        if let Some(old) = self.frames[i].pop_front() {
            self.bytes[i] -= old.data.len();
            self.dropped[i] += old.data.len() as u64;
            self.evicted_frames += 1;
            self.evicted_through = self.evicted_through.max(old.seq);
        }
    }

    /// Evicts every retained frame (the engine-wide budget of finished
    /// output, [`crate::sandboxes::output_budget`]): a replay from before it is then
    /// [`Replay::Expired`]; the exit stays. `None`, and nothing evicted,
    /// while a reader is attached; otherwise the bytes freed.
    pub fn evict_all(&mut self) -> Option<usize> {
        if self
            .readers
            .as_ref()
            .is_some_and(|r| !r.attached.is_empty())
        {
            return None;
        }
        let freed = self.retained_bytes();
        for i in 0..2 {
            while !self.frames[i].is_empty() {
                self.evict_front(i);
            }
        }
        Some(freed)
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

    /// How many bytes precede the first retained frame in a log where each
    /// frame is preceded by a `label`-byte marker (the Daytona face's
    /// labelled log): the evicted payload plus one marker per evicted frame.
    pub fn evicted_log_bytes(&self, label: u64) -> u64 {
        self.dropped[0] + self.dropped[1] + self.evicted_frames * label
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
    fn evicting_everything_expires_every_earlier_cursor_but_spares_a_reader() {
        let mut j = Journal::with_retention(Retention::Streamed(100));
        j.push(StreamKind::Stdout, Bytes::from_static(b"12345"));
        j.push(StreamKind::Stderr, Bytes::from_static(b"678"));
        j.set_exit(ExitStatus::Code(0));
        let reader = j.attach(0).expect("a streamed journal takes readers");
        assert_eq!(j.evict_all(), None, "a reader is attached");
        assert_eq!(j.retained_bytes(), 8);
        j.detach(reader);
        assert_eq!(j.evict_all(), Some(8));
        assert_eq!(j.retained_bytes(), 0);
        assert!(matches!(j.after(0), Replay::Expired));
        assert!(matches!(j.after(2), Replay::Frames(ref f) if f.is_empty()));
        assert_eq!(j.exit(), Some(&ExitStatus::Code(0)));
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
    fn a_streamed_journal_never_evicts_what_its_reader_has_not_received() {
        let mut j = Journal::with_retention(Retention::Streamed(10));
        let reader = j.attach(0).unwrap();
        for _ in 0..4 {
            j.push(StreamKind::Stdout, Bytes::from_static(b"12345"));
        }
        // 20 unread bytes in a 10-byte journal: all kept, and no room.
        assert_eq!(j.retained_bytes(), 20);
        assert_eq!(j.room(), Room::Full(None));
        assert!(matches!(j.after(0), Replay::Frames(ref f) if f.len() == 4));
        // The reader took three frames: those may go, and there is room.
        j.advance(reader, 3);
        assert_eq!(j.room(), Room::Open);
        assert_eq!(j.retained_bytes(), 10);
        assert!(matches!(j.after(3), Replay::Frames(ref f) if f.len() == 1));
        // Detached: its cursor stays held for the grace period.
        j.detach(reader);
        for _ in 0..2 {
            j.push(StreamKind::Stderr, Bytes::from_static(b"abcde"));
        }
        assert!(matches!(j.after(3), Replay::Frames(ref f) if f.len() == 3));
        assert!(matches!(j.room(), Room::Full(Some(_))));
        assert_eq!(j.evicted_log_bytes(3), 3 * 3 + 15);
    }

    #[test]
    fn a_streamed_journal_holds_output_for_its_first_reader() {
        let mut j = Journal::with_retention(Retention::Streamed(4));
        j.push(StreamKind::Stdout, Bytes::from_static(b"abc"));
        j.push(StreamKind::Stdout, Bytes::from_static(b"def"));
        assert!(matches!(j.room(), Room::Full(Some(_))));
        let reader = j.attach(0).unwrap();
        assert!(matches!(j.after(0), Replay::Frames(ref f) if f.len() == 2));
        j.advance(reader, 2);
        assert_eq!(j.room(), Room::Open);
    }

    #[test]
    fn without_a_reader_past_the_grace_the_journal_is_bounded_replay_again() {
        let mut j = Journal::with_retention(Retention::Streamed(4));
        j.push(StreamKind::Stdout, Bytes::from_static(b"abc"));
        j.push(StreamKind::Stdout, Bytes::from_static(b"def"));
        assert!(matches!(j.room(), Room::Full(Some(_))));
        // The grace of the reader expected after the start has lapsed.
        if let Some(r) = j.readers.as_mut() {
            r.grace = Some((Instant::now() - Duration::from_millis(1), 0));
        }
        assert_eq!(j.room(), Room::Open);
        j.push(StreamKind::Stdout, Bytes::from_static(b"g"));
        assert!(j.retained_bytes() <= 4);
        assert!(matches!(j.after(0), Replay::Expired));
    }

    #[test]
    fn other_journals_take_no_readers() {
        let mut j = Journal::new(4);
        assert!(j.attach(0).is_none());
        j.push(StreamKind::Stdout, Bytes::from_static(b"abcdef"));
        assert_eq!(j.room(), Room::Open);
    }

    #[test]
    fn output_after_exit_is_dropped() {
        let mut j = Journal::new(10);
        j.set_exit(ExitStatus::Code(0));
        assert_eq!(j.push(StreamKind::Stdout, Bytes::from_static(b"x")), None);
    }
}
