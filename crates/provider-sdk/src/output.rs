//! Command output: UTF-8 decoding across frames and a capped tail.

use std::collections::VecDeque;

use crate::platform::{Platform, StreamId};
use crate::types::PartialOutput;

/// How many characters of each stream are kept (the last ones): 4 Mi.
pub const MAX_OUTPUT_CHARS: usize = 4 * 1024 * 1024;

/// Decodes one stream's bytes into text, carrying an incomplete UTF-8
/// character over to the next chunk (frames and reconnects may split one).
/// Invalid bytes become U+FFFD.
#[derive(Debug, Default)]
pub struct Utf8Decoder {
    pending: Vec<u8>,
}

impl Utf8Decoder {
    /// Decodes a chunk; the result never ends inside a character.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        if self.pending.is_empty() {
            // The common case: no character carried over, so no copy first.
            if let Ok(text) = std::str::from_utf8(bytes) {
                return text.to_owned();
            }
        }
        let mut input = std::mem::take(&mut self.pending);
        input.extend_from_slice(bytes);
        let mut text = String::with_capacity(input.len());
        let mut rest = input.as_slice();
        loop {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    text.push_str(valid);
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // The prefix was just checked, so this cannot fail.
                    text.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(len) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[len..];
                        }
                        None => {
                            self.pending = after.to_vec();
                            break;
                        }
                    }
                }
            }
        }
        text
    }

    /// Ends the stream: an incomplete trailing character becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        if self.pending.is_empty() {
            String::new()
        } else {
            self.pending.clear();
            char::REPLACEMENT_CHARACTER.to_string()
        }
    }
}

/// The last [`MAX_OUTPUT_CHARS`] characters of a stream (or another cap).
///
/// The kept text is one ring of UTF-8 bytes, so its memory is bounded per
/// character (at most 4 bytes each, plus the ring's growth), however the
/// output was cut into chunks: a million one-byte frames cost a million
/// bytes, not a million allocations.
#[derive(Debug)]
pub struct Tail {
    cap: usize,
    bytes: VecDeque<u8>,
    chars: usize,
    truncated: bool,
}

impl Default for Tail {
    fn default() -> Self {
        Tail::with_cap(MAX_OUTPUT_CHARS)
    }
}

impl Tail {
    /// A tail keeping at most `cap` characters.
    pub fn with_cap(cap: usize) -> Tail {
        Tail {
            cap,
            bytes: VecDeque::new(),
            chars: 0,
            truncated: false,
        }
    }

    /// Appends text, dropping the oldest characters beyond the cap.
    pub fn push(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let count = text.chars().count();
        if count >= self.cap {
            // Everything kept so far goes: keep only the end of `text`.
            self.truncated |= count > self.cap || self.chars > 0;
            let skip = text
                .char_indices()
                .nth(count - self.cap)
                .map_or(text.len(), |(i, _)| i);
            self.bytes.clear();
            self.bytes.extend(text[skip..].bytes());
            self.chars = self.cap;
            return;
        }
        self.bytes.extend(text.bytes());
        self.chars += count;
        if self.chars > self.cap {
            self.drop_front(self.chars - self.cap);
        }
    }

    /// Drops the `n` oldest characters.
    fn drop_front(&mut self, n: usize) {
        let mut seen = 0;
        // The byte index of the first character kept: the start of
        // character number `n` (a start is any byte but a continuation byte).
        let cut = self
            .bytes
            .iter()
            .position(|b| {
                if b & 0xC0 != 0x80 {
                    seen += 1;
                }
                seen > n
            })
            .unwrap_or(self.bytes.len());
        self.bytes.drain(..cut);
        self.chars -= n;
        self.truncated = true;
    }

    /// True when characters were dropped.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The kept text.
    pub fn text(&self) -> String {
        let (front, back) = self.bytes.as_slices();
        let mut bytes = Vec::with_capacity(self.bytes.len());
        bytes.extend_from_slice(front);
        bytes.extend_from_slice(back);
        // Only whole characters of valid `str`s are kept, so this is valid UTF-8.
        String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }
}

/// A global allocator for this crate's unit tests that counts the bytes
/// each thread holds, so a test can measure what a structure costs.
#[cfg(test)]
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static LIVE: Cell<isize> = const { Cell::new(0) };
    }

    struct Counting;

    fn count(delta: isize) {
        // `try_with`: the thread-local may already be gone while the thread exits.
        let _ = LIVE.try_with(|live| live.set(live.get() + delta));
    }

    // SAFETY: every call is forwarded unchanged to the system allocator.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let ptr = unsafe { System.alloc(layout) };
            if !ptr.is_null() {
                count(layout.size() as isize);
            }
            ptr
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            unsafe { System.dealloc(ptr, layout) };
            count(-(layout.size() as isize));
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    /// The bytes the current thread has allocated and not yet freed.
    pub fn live_bytes() -> isize {
        LIVE.with(Cell::get)
    }
}

/// A running command's two output streams: each decoded across chunks,
/// forwarded live to the host, and kept as a bounded tail for the result.
#[derive(Debug, Default)]
pub struct CommandOutput {
    stdout: (Utf8Decoder, Tail),
    stderr: (Utf8Decoder, Tail),
}

impl CommandOutput {
    fn stream(&mut self, id: StreamId) -> &mut (Utf8Decoder, Tail) {
        match id {
            StreamId::Stdout => &mut self.stdout,
            StreamId::Stderr => &mut self.stderr,
        }
    }

    /// Decodes `bytes` of stream `id`, forwards the text to the host and
    /// keeps it in that stream's tail.
    pub fn push(&mut self, platform: &mut dyn Platform, id: StreamId, bytes: &[u8]) {
        let (decoder, tail) = self.stream(id);
        let text = decoder.push(bytes);
        if !text.is_empty() {
            platform.emit_output(id, &text);
            tail.push(&text);
        }
    }

    /// Ends both streams: an incomplete trailing character becomes U+FFFD.
    pub fn finish(&mut self, platform: &mut dyn Platform) {
        for id in [StreamId::Stdout, StreamId::Stderr] {
            let (decoder, tail) = self.stream(id);
            let rest = decoder.finish();
            if !rest.is_empty() {
                platform.emit_output(id, &rest);
                tail.push(&rest);
            }
        }
    }

    /// The kept standard output.
    pub fn stdout(&self) -> String {
        self.stdout.1.text()
    }

    /// The kept standard error.
    pub fn stderr(&self) -> String {
        self.stderr.1.text()
    }

    /// Whether either tail dropped older output.
    pub fn truncated(&self) -> bool {
        self.stdout.1.truncated() || self.stderr.1.truncated()
    }

    /// What the command printed, for an error raised after it existed.
    pub fn partial(&self, timed_out: bool) -> PartialOutput {
        PartialOutput {
            stdout: self.stdout(),
            stderr: self.stderr(),
            timed_out,
            output_truncated: self.truncated(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn a_character_split_across_chunks_is_decoded_once() {
        let euro = "€".as_bytes();
        let mut decoder = Utf8Decoder::default();
        assert_eq!(decoder.push(&[b'a', euro[0]]), "a");
        assert_eq!(decoder.push(&euro[1..2]), "");
        assert_eq!(decoder.push(&[euro[2], b'b']), "€b");
        assert_eq!(decoder.finish(), "");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn invalid_bytes_become_replacement_characters() {
        let mut decoder = Utf8Decoder::default();
        assert_eq!(decoder.push(&[b'x', 0xff, b'y', 0xc3]), "x\u{fffd}y");
        assert_eq!(decoder.finish(), "\u{fffd}");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn every_split_of_mixed_text_decodes_to_the_original() {
        let text = "héllo € 𝄞 wörld";
        let bytes = text.as_bytes();
        for i in 0..=bytes.len() {
            for j in i..=bytes.len() {
                let mut decoder = Utf8Decoder::default();
                let mut out = decoder.push(&bytes[..i]);
                out += &decoder.push(&bytes[i..j]);
                out += &decoder.push(&bytes[j..]);
                out += &decoder.finish();
                assert_eq!(out, text, "split at {i},{j}");
            }
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_tail_keeps_the_last_characters() {
        let mut tail = Tail::with_cap(5);
        tail.push("ab");
        assert_eq!((tail.text().as_str(), tail.truncated()), ("ab", false));
        tail.push("c€€");
        assert_eq!((tail.text().as_str(), tail.truncated()), ("abc€€", false));
        tail.push("d");
        assert_eq!((tail.text().as_str(), tail.truncated()), ("bc€€d", true));
        tail.push("123456789");
        assert_eq!(tail.text(), "56789");
    }

    /// Pins issue 9 item 10: the tail kept one heap string per pushed chunk,
    /// so a server sending millions of one-byte frames made each kept
    /// character cost a whole allocation (about 40 bytes). The tail must
    /// cost at most 4 bytes (one UTF-8 character) per kept character,
    /// however the output was cut.
    #[wasm_bindgen_test(unsupported = test)]
    fn tiny_chunks_cost_no_more_memory_than_their_characters() {
        const CAP: usize = 1 << 20;
        let before = counting::live_bytes();
        let mut tail = Tail::with_cap(CAP);
        for i in 0..2 * CAP {
            tail.push(if i % 2 == 0 { "a" } else { "b" });
        }
        let held = counting::live_bytes() - before;
        assert!(
            held <= (4 * CAP) as isize,
            "{held} bytes held for {CAP} characters"
        );
        assert_eq!(tail.text().len(), CAP);
        assert!(tail.text().starts_with("abab") && tail.truncated());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_default_cap_is_four_mebi_characters() {
        let mut tail = Tail::default();
        let chunk = "€".repeat(1024 * 1024);
        for _ in 0..5 {
            tail.push(&chunk);
        }
        assert!(tail.truncated());
        assert_eq!(tail.text().chars().count(), MAX_OUTPUT_CHARS);
    }
}
