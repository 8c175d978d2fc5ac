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
    /// An incomplete character at the end of the last chunk (at most 3 bytes).
    pending: Vec<u8>,
    /// The carried character joined with the next chunk (reused).
    joined: Vec<u8>,
    /// Decoded text that could not borrow its chunk (reused).
    text: String,
}

impl Utf8Decoder {
    /// Decodes a chunk; the result never ends inside a character.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.decode(bytes).to_owned()
    }

    /// Like [`Utf8Decoder::push`], without allocating: a chunk of whole
    /// valid text (or one cut only inside its last character) is borrowed
    /// as it is, checked by one `from_utf8` pass (which skips ASCII a word
    /// at a time); anything else is decoded into a buffer the decoder
    /// reuses.
    pub fn decode<'s>(&'s mut self, bytes: &'s [u8]) -> &'s str {
        let input: &[u8] = if self.pending.is_empty() {
            bytes
        } else {
            self.joined.clear();
            self.joined.append(&mut self.pending);
            self.joined.extend_from_slice(bytes);
            &self.joined
        };
        let (whole, cut) = input.split_at(whole_prefix(input));
        if cut.is_empty() || is_incomplete(cut) {
            if let Ok(text) = simdutf8::basic::from_utf8(whole) {
                self.pending.extend_from_slice(cut);
                return text;
            }
        }
        self.text.clear();
        let mut chunks = input.utf8_chunks().peekable();
        while let Some(chunk) = chunks.next() {
            self.text.push_str(chunk.valid());
            let invalid = chunk.invalid();
            if invalid.is_empty() {
                continue;
            }
            if chunks.peek().is_none() && is_incomplete(invalid) {
                self.pending.extend_from_slice(invalid);
            } else {
                self.text.push(char::REPLACEMENT_CHARACTER);
            }
        }
        &self.text
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

/// The length of `bytes` without a character its end may cut (the lead
/// byte of the last character, within the last 3 bytes, announces more
/// bytes than follow it); whether that cut is really the start of a
/// character is for the caller to check.
fn whole_prefix(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=n.min(3) {
        let byte = bytes[n - back];
        if byte & 0xC0 != 0x80 {
            let width = match byte {
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                0xF0..=0xF7 => 4,
                _ => 1,
            };
            return if width > back { n - back } else { n };
        }
    }
    n
}

/// The number of characters of `text`: its bytes that are not UTF-8
/// continuation bytes, 16 at a time with wasm SIMD (std's count goes a
/// word at a time, about 3% of the 50 MB run under Cranelift).
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
fn count_chars(text: &str) -> usize {
    use core::arch::wasm32::*;
    let bytes = text.as_bytes();
    let blocks = bytes.chunks_exact(16);
    let rest = blocks.remainder();
    // Continuation bytes are 0x80..=0xBF: -128..=-65 as signed bytes.
    let last_continuation = i8x16_splat(-65);
    let mut count = 0;
    for block in blocks {
        // SAFETY: `block` is 16 readable bytes; unaligned loads are allowed.
        let v = unsafe { v128_load(block.as_ptr().cast()) };
        count += i8x16_bitmask(i8x16_gt(v, last_continuation)).count_ones() as usize;
    }
    count + rest.iter().filter(|&&b| (b as i8) > -65).count()
}

#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
fn count_chars(text: &str) -> usize {
    text.chars().count()
}

/// True when `bytes` (a maximal invalid run from `utf8_chunks`) is the
/// start of a character that the next bytes may still complete.
fn is_incomplete(bytes: &[u8]) -> bool {
    std::str::from_utf8(bytes).is_err_and(|e| e.error_len().is_none())
}

/// The last [`MAX_OUTPUT_CHARS`] characters of a stream (or another cap).
///
/// The kept text is a queue of segments (each one string and its character
/// count), so its memory is bounded per character (at most 4 bytes each,
/// plus one segment), however the output was cut into chunks: small pushes
/// are appended to the last segment (a million one-byte frames cost a
/// million bytes, not a million allocations). Pushing costs one character
/// count and one copy; whole segments leave the front at once, and the
/// characters beyond the cap inside the first segment are skipped only when
/// the text is read, so no byte is visited twice on the hot path.
#[derive(Debug)]
pub struct Tail {
    cap: usize,
    segments: VecDeque<Segment>,
    /// Characters held in `segments`; those beyond `cap` are at the front
    /// of the first segment.
    chars: usize,
    truncated: bool,
}

/// One piece of kept text and its character count.
#[derive(Debug)]
struct Segment {
    text: String,
    chars: usize,
}

/// The size of a new segment that small pushes are appended to.
const SEGMENT_BYTES: usize = 64 * 1024;

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
            segments: VecDeque::new(),
            chars: 0,
            truncated: false,
        }
    }

    /// Appends text, dropping the oldest characters beyond the cap.
    pub fn push(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let count = count_chars(text);
        if count >= self.cap {
            // Everything kept so far goes: keep only the end of `text`.
            self.truncated |= count > self.cap || self.chars > 0;
            let skip = text
                .char_indices()
                .nth(count - self.cap)
                .map_or(text.len(), |(i, _)| i);
            self.segments.clear();
            self.segments.push_back(Segment {
                text: text[skip..].to_owned(),
                chars: self.cap,
            });
            self.chars = self.cap;
            return;
        }
        match self.segments.back_mut() {
            // Appended only without growing: a segment's allocation is fixed.
            Some(last) if last.text.capacity() - last.text.len() >= text.len() => {
                last.text.push_str(text);
                last.chars += count;
            }
            _ => {
                let mut segment = String::with_capacity(text.len().max(SEGMENT_BYTES));
                segment.push_str(text);
                self.segments.push_back(Segment {
                    text: segment,
                    chars: count,
                });
            }
        }
        self.chars += count;
        while let Some(front) = self.segments.front() {
            if self.chars - front.chars < self.cap {
                break;
            }
            self.chars -= front.chars;
            self.segments.pop_front();
            self.truncated = true;
        }
        if self.chars > self.cap {
            self.truncated = true;
        }
    }

    /// True when characters were dropped.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The kept text.
    pub fn text(&self) -> String {
        let excess = self.chars.saturating_sub(self.cap);
        let mut text = String::with_capacity(self.segments.iter().map(|s| s.text.len()).sum());
        for (i, segment) in self.segments.iter().enumerate() {
            let skip = if i == 0 && excess > 0 {
                segment
                    .text
                    .char_indices()
                    .nth(excess)
                    .map_or(segment.text.len(), |(at, _)| at)
            } else {
                0
            };
            text.push_str(&segment.text[skip..]);
        }
        text
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
/// kept as a bounded tail for the result, and forwarded live to the host.
///
/// Live output is handed over in batches: [`CommandOutput::push`] keeps the
/// decoded text of consecutive pushes of one stream, and
/// [`CommandOutput::flush`] (which a provider calls after each body chunk
/// it has read) or a push of the other stream hands it to the host in one
/// call. Servers cut output into small frames (a pipe read each, often
/// 4 KiB); one host call, and one write by the host, per frame was the
/// main cost of a fast stream. The tails are updated at once, so a result
/// or partial output never lacks what was pushed.
#[derive(Debug)]
pub struct CommandOutput {
    stdout: (Utf8Decoder, Tail),
    stderr: (Utf8Decoder, Tail),
    /// Decoded text not yet handed to the host, all of stream `unsent_id`.
    unsent: String,
    unsent_id: StreamId,
}

impl Default for CommandOutput {
    fn default() -> Self {
        CommandOutput {
            stdout: Default::default(),
            stderr: Default::default(),
            unsent: String::new(),
            unsent_id: StreamId::Stdout,
        }
    }
}

/// Unsent text beyond this is handed to the host at once.
const MAX_UNSENT_BYTES: usize = 1024 * 1024;
/// Text at least this long, with nothing unsent before it, goes to the host
/// at once, without a copy: batching pays only for small pieces.
const DIRECT_BYTES: usize = 32 * 1024;

impl CommandOutput {
    fn stream(&mut self, id: StreamId) -> &mut (Utf8Decoder, Tail) {
        match id {
            StreamId::Stdout => &mut self.stdout,
            StreamId::Stderr => &mut self.stderr,
        }
    }

    /// Decodes `bytes` of stream `id` and keeps the text in that stream's
    /// tail; the text goes to the host with the next [`CommandOutput::flush`]
    /// (or before text of the other stream, so the order is kept).
    pub fn push(&mut self, platform: &mut dyn Platform, id: StreamId, bytes: &[u8]) {
        let CommandOutput {
            stdout,
            stderr,
            unsent,
            unsent_id,
        } = self;
        let (decoder, tail) = match id {
            StreamId::Stdout => stdout,
            StreamId::Stderr => stderr,
        };
        let text = decoder.decode(bytes);
        if text.is_empty() {
            return;
        }
        tail.push(text);
        if *unsent_id != id || unsent.len() + text.len() > MAX_UNSENT_BYTES {
            if !unsent.is_empty() {
                platform.emit_output(*unsent_id, unsent);
                unsent.clear();
            }
            *unsent_id = id;
        }
        if unsent.is_empty() && text.len() >= DIRECT_BYTES {
            platform.emit_output(id, text);
        } else {
            unsent.push_str(text);
        }
    }

    /// Hands the text pushed since the last flush to the host.
    pub fn flush(&mut self, platform: &mut dyn Platform) {
        if !self.unsent.is_empty() {
            platform.emit_output(self.unsent_id, &self.unsent);
            self.unsent.clear();
        }
    }

    /// Ends both streams: an incomplete trailing character becomes U+FFFD.
    /// Everything pushed reaches the host.
    pub fn finish(&mut self, platform: &mut dyn Platform) {
        self.flush(platform);
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

    /// The tail's character count (SIMD in the wasm build) agrees with
    /// std's on text of every length and mix of widths.
    #[wasm_bindgen_test(unsupported = test)]
    fn characters_are_counted_like_std() {
        let pieces = [
            "a", "é", "€", "𝄞", "\u{7f}", "\u{80}", "\u{7ff}", "\u{800}", "\u{ffff}",
        ];
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for len in 0..300 {
            let mut text = String::new();
            for _ in 0..len {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                text.push_str(pieces[(state % pieces.len() as u64) as usize]);
            }
            for start in 0..text.len().min(20) {
                if let Some(part) = text.get(start..) {
                    assert_eq!(count_chars(part), part.chars().count(), "{part:?}");
                }
            }
        }
    }

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

    /// However bytes are cut into chunks, the decoder gives what a lossy
    /// decoding of the whole gives (valid text, cut characters, stray
    /// continuation bytes, bad lead bytes, overlong and surrogate forms).
    #[wasm_bindgen_test(unsupported = test)]
    fn any_cut_of_any_bytes_decodes_like_a_lossy_decoding_of_the_whole() {
        let pieces: [&[u8]; 10] = [
            b"ab",
            "é".as_bytes(),
            "€".as_bytes(),
            "𝄞".as_bytes(),
            b"\x80",
            b"\xff",
            b"\xe2\x82",
            b"\xc0\xaf",
            b"\xed\xa0\x80",
            b"\xf0\x9d",
        ];
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as usize % n
        };
        for _ in 0..3000 {
            let mut bytes = Vec::new();
            for _ in 0..next(12) {
                bytes.extend_from_slice(pieces[next(pieces.len())]);
            }
            let mut decoder = Utf8Decoder::default();
            let mut out = String::new();
            let mut rest = bytes.as_slice();
            while !rest.is_empty() {
                let (chunk, after) = rest.split_at(1 + next(rest.len().min(7)));
                out.push_str(decoder.decode(chunk));
                rest = after;
            }
            out.push_str(&decoder.finish());
            assert_eq!(out, String::from_utf8_lossy(&bytes), "{bytes:x?}");
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

    /// The segmented tail keeps exactly what a plain string cut to its last
    /// `cap` characters keeps, and says `truncated` exactly when that cut
    /// dropped something, for pushes of every size (small ones appended to
    /// a segment, large ones, ones over the cap) in a fixed pseudo-random mix.
    #[wasm_bindgen_test(unsupported = test)]
    fn the_tail_matches_a_plain_cut_of_everything_pushed() {
        let pieces = ["a", "€", "𝄞x", "hello wörld\n", "", "z", "0123456"];
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        for cap in [1usize, 3, 7, 14, 64, 1000, 2800] {
            let mut tail = Tail::with_cap(cap);
            let mut all = String::new();
            for _ in 0..120 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let repeat = [1, 1, 2, 5, 40, 300, 1200][(seed >> 8) as usize % 7];
                let text = pieces[seed as usize % pieces.len()].repeat(repeat);
                tail.push(&text);
                all.push_str(&text);
                let total = all.chars().count();
                let kept: String = all.chars().skip(total.saturating_sub(cap)).collect();
                assert_eq!(tail.text(), kept, "cap {cap}");
                assert_eq!(tail.truncated(), total > cap, "cap {cap}");
            }
        }
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
