//! The `/connect` NDJSON path: `LineSplitter` over arbitrarily chunked
//! bytes, `parse_frame` on every line, and the data frames' bytes through
//! `Tail` (bytes in, the last characters of their lossy decoding out),
//! checked against simple reference models.
//!
//! Input: byte 0 seeds the chunking, byte 1 picks the tail's cap; the rest
//! is the stream.
#![no_main]

use createos_provider::frames::{
    is_signal_name, parse_frame, ExitStatus, Frame, LineSplitter, StreamId, MAX_LINE_BYTES,
    MAX_SIGNAL_BYTES,
};
use libfuzzer_sys::fuzz_target;
use provider_sdk::output::Tail;

/// Cuts `body` into chunks whose sizes come from a tiny PRNG seeded by `seed`.
fn chunks(seed: u8, body: &[u8]) -> Vec<&[u8]> {
    let mut state = u32::from(seed) | 0x9e37_0000;
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let size = match state % 8 {
            0 => 1,
            1 => 2,
            2 => 3,
            7 => rest.len(),
            _ => 1 + (state >> 8) as usize % 97,
        };
        let (chunk, tail) = rest.split_at(size.min(rest.len()));
        out.push(chunk);
        rest = tail;
    }
    out
}

/// The tail of one stream, next to the bytes it was given.
struct Model {
    tail: Tail,
    cap: usize,
    bytes: Vec<u8>,
}

impl Model {
    fn new(cap: usize) -> Model {
        Model {
            tail: Tail::with_cap(cap),
            cap,
            bytes: Vec::new(),
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
        self.tail.push(bytes);
    }

    fn check(self) {
        // The tail is the end of a lossy decoding of the whole stream.
        let decoded = String::from_utf8_lossy(&self.bytes);
        let total = decoded.chars().count();
        let keep = total.min(self.cap);
        let expected: String = decoded.chars().skip(total - keep).collect();
        assert_eq!(self.tail.text(), expected);
        assert_eq!(self.tail.truncated(), total > self.cap);
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let (seed, cap, body) = (data[0], 1 + usize::from(data[1] % 16), &data[2..]);
    let pieces = chunks(seed, body);

    // Lines: what the splitter emits equals splitting the whole stream.
    let mut splitter = LineSplitter::default();
    let mut lines = Vec::new();
    let mut too_long = false;
    for piece in &pieces {
        match splitter.push(piece) {
            Ok(complete) => lines.extend(complete),
            Err(_) => {
                too_long = true;
                break;
            }
        }
    }
    let mut reference: Vec<Vec<u8>> = body.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect();
    let unfinished = reference.pop().unwrap_or_default();
    for line in &mut reference {
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
    if too_long {
        assert!(
            reference.iter().any(|l| l.len() > MAX_LINE_BYTES) || unfinished.len() > MAX_LINE_BYTES,
            "a line over the limit was reported where none is"
        );
    } else {
        assert_eq!(lines, reference);
        let last = splitter.finish();
        assert_eq!(last, (!unfinished.is_empty()).then_some(unfinished));
        lines.extend(last);
    }

    // Frames: every line is a frame or a typed error, never a panic.
    let mut stdout = Model::new(cap);
    let mut stderr = Model::new(cap);
    for line in &lines {
        match parse_frame(line) {
            Ok(Some(Frame::Data { seq, stream, bytes })) => {
                assert!(seq >= 1);
                match stream {
                    // A terminal is one stream, kept as stdout (as the SDK keeps it).
                    StreamId::Stdout | StreamId::Terminal => stdout.push(&bytes),
                    StreamId::Stderr => stderr.push(&bytes),
                }
            }
            Ok(Some(Frame::Error(message))) => {
                assert!(message.chars().count() <= 100);
                assert!(!message.chars().any(char::is_control));
            }
            Ok(Some(Frame::Exit(ExitStatus::Signal(signal)))) => {
                // Only a signal name passes: `SIG[A-Z0-9]+`, bounded.
                assert!(is_signal_name(&signal) && signal.len() <= MAX_SIGNAL_BYTES);
                assert!(signal.starts_with("SIG") && signal.len() > 3);
                assert!(signal.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()));
            }
            Ok(Some(Frame::Exit(ExitStatus::Code(_)) | Frame::Heartbeat)) | Ok(None) => {}
            Err(error) => assert!(!error.to_string().is_empty()),
        }
    }
    stdout.check();
    stderr.check();

    // The raw stream through a tail in the same chunks.
    let mut raw = Model::new(cap);
    for piece in &pieces {
        raw.push(piece);
    }
    raw.check();
});
