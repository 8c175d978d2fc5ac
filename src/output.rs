//! Command output: UTF-8 decoding across frames and a capped tail.

use std::collections::VecDeque;

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
#[derive(Debug)]
pub struct Tail {
    cap: usize,
    chunks: VecDeque<String>,
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
            chunks: VecDeque::new(),
            chars: 0,
            truncated: false,
        }
    }

    /// Appends text, dropping the oldest characters beyond the cap.
    pub fn push(&mut self, text: &str) {
        self.push_owned(text.to_owned());
    }

    /// Appends text it takes ownership of (no copy).
    pub fn push_owned(&mut self, text: String) {
        if text.is_empty() {
            return;
        }
        self.chars += text.chars().count();
        self.chunks.push_back(text);
        while self.chars > self.cap {
            let excess = self.chars - self.cap;
            let Some(front) = self.chunks.front_mut() else {
                break;
            };
            let front_chars = front.chars().count();
            self.truncated = true;
            if front_chars <= excess {
                self.chars -= front_chars;
                self.chunks.pop_front();
            } else {
                let cut = front
                    .char_indices()
                    .nth(excess)
                    .map_or(front.len(), |(i, _)| i);
                front.drain(..cut);
                self.chars -= excess;
            }
        }
    }

    /// True when characters were dropped.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The kept text.
    pub fn text(&self) -> String {
        let mut text = String::with_capacity(self.chunks.iter().map(String::len).sum());
        for chunk in &self.chunks {
            text.push_str(chunk);
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_split_across_chunks_is_decoded_once() {
        let euro = "€".as_bytes();
        let mut decoder = Utf8Decoder::default();
        assert_eq!(decoder.push(&[b'a', euro[0]]), "a");
        assert_eq!(decoder.push(&euro[1..2]), "");
        assert_eq!(decoder.push(&[euro[2], b'b']), "€b");
        assert_eq!(decoder.finish(), "");
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut decoder = Utf8Decoder::default();
        assert_eq!(decoder.push(&[b'x', 0xff, b'y', 0xc3]), "x\u{fffd}y");
        assert_eq!(decoder.finish(), "\u{fffd}");
    }

    #[test]
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

    #[test]
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

    #[test]
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
