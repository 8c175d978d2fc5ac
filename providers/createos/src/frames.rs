//! The NDJSON frames of `GET .../processes/{pid}/connect`.
//!
//! [`LineSplitter`] cuts a byte stream into lines (bounded at 1 MiB);
//! [`parse_frame`] turns one line into a [`Frame`] or a [`FrameError`].

use base64::Engine as _;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;
use std::ops::ControlFlow;

/// The longest line accepted, without its newline.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

/// The longest signal name accepted in an exit frame (real names, such as
/// `SIGRTMIN15` or `SIGVTALRM`, are far shorter).
pub const MAX_SIGNAL_BYTES: usize = 32;

pub use provider_sdk::platform::StreamId;

/// How a process ended, from its exit frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this code.
    Code(i32),
    /// A signal (for example `SIGKILL`) ended it.
    Signal(String),
}

/// One frame of the output stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Output bytes of one stream.
    Data {
        /// The frame's sequence number (>= 1).
        seq: u64,
        /// The stream the bytes belong to.
        stream: StreamId,
        /// The decoded bytes.
        bytes: Vec<u8>,
    },
    /// The terminal frame.
    Exit(ExitStatus),
    /// A keep-alive; ignored.
    Heartbeat,
    /// The server reports a fatal stream error (for example `output_offset_expired`).
    Error(String),
}

/// Why a line is not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The line is longer than [`MAX_LINE_BYTES`].
    LineTooLong,
    /// The line is not a JSON object.
    NotJson,
    /// The `type` is missing or not one of the known ones.
    UnknownType,
    /// A data frame's `seq` is missing, not an integer, or below 1.
    InvalidSeq,
    /// A data frame's `stream` is missing or unknown.
    InvalidStream,
    /// A data frame's `data_base64` is missing or not padded standard base64.
    InvalidBase64,
    /// An exit frame has neither an integer `exit_code` nor a `signal`.
    MissingExitStatus,
    /// An exit frame's `signal` is not a signal name (`SIG[A-Z0-9]+`, at
    /// most [`MAX_SIGNAL_BYTES`] bytes).
    InvalidSignal,
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FrameError::LineTooLong => "an output frame is longer than 1 MiB",
            FrameError::NotJson => "an output frame is not a JSON object",
            FrameError::UnknownType => "an output frame has an unknown type",
            FrameError::InvalidSeq => "a data frame has an invalid seq",
            FrameError::InvalidStream => "a data frame has an invalid stream",
            FrameError::InvalidBase64 => "a data frame has invalid base64",
            FrameError::MissingExitStatus => "the exit frame has no exit status",
            FrameError::InvalidSignal => "the exit frame has an invalid signal name",
        })
    }
}

/// A JSON string field, borrowed from the line when it has no escapes, or
/// whatever else the field held (kept apart, so a wrong type is the
/// field's typed error rather than "not JSON").
enum Loose<'a> {
    Str(Cow<'a, str>),
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for Loose<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LooseVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for LooseVisitor<'a> {
            type Value = Loose<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Loose::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Loose::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Loose::Str(Cow::Owned(v)))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Loose::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Loose::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Loose::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Loose::Other)
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Loose::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Loose::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Loose::Other)
            }
        }
        deserializer.deserialize_any(LooseVisitor(std::marker::PhantomData))
    }
}

impl<'a> Loose<'a> {
    fn as_str(&self) -> Option<&str> {
        match self {
            Loose::Str(s) => Some(s),
            Loose::Other => None,
        }
    }
}

/// One frame as it is on the wire: every field optional and borrowed where
/// it can be, so a data frame costs no allocation but its decoded bytes.
#[derive(Deserialize)]
struct WireFrame<'a> {
    #[serde(rename = "type", borrow = "'a", default)]
    kind: Option<Loose<'a>>,
    #[serde(default)]
    seq: Option<Value>,
    #[serde(borrow = "'a", default)]
    stream: Option<Loose<'a>>,
    #[serde(borrow = "'a", default)]
    data_base64: Option<Loose<'a>>,
    #[serde(default)]
    exit_code: Option<Value>,
    #[serde(borrow = "'a", default)]
    signal: Option<Loose<'a>>,
    #[serde(borrow = "'a", default)]
    error: Option<Loose<'a>>,
}

/// Parses one line (without its newline). Blank lines give `Ok(None)`.
pub fn parse_frame(line: &[u8]) -> Result<Option<Frame>, FrameError> {
    if line.len() > MAX_LINE_BYTES {
        return Err(FrameError::LineTooLong);
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    // A struct also deserializes from a JSON array: only an object is a frame.
    if line.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(FrameError::NotJson);
    }
    // The hot path: a data frame as servers write it, read without serde.
    // It only ever accepts what the general parser below accepts, with the
    // same result; anything else (escapes, unknown or repeated keys, odd
    // numbers, bad base64) goes to the general parser and its typed errors.
    if let Some(frame) = plain_data_frame(line) {
        return Ok(Some(frame));
    }
    parse_general(line)
}

/// [`parse_frame`] for any line that is not a plain data frame: the whole
/// line through `serde_json`.
fn parse_general(line: &[u8]) -> Result<Option<Frame>, FrameError> {
    let wire: WireFrame = serde_json::from_slice(line).map_err(|_| FrameError::NotJson)?;
    let str_of = |field: &Option<Loose>| field.as_ref().and_then(|f| f.as_str().map(str::to_owned));
    let frame = match wire.kind.as_ref().and_then(Loose::as_str) {
        Some("data") => {
            let seq = wire
                .seq
                .as_ref()
                .and_then(Value::as_u64)
                .filter(|seq| *seq >= 1)
                .ok_or(FrameError::InvalidSeq)?;
            let stream = match wire.stream.as_ref().and_then(Loose::as_str) {
                Some("stdout") => StreamId::Stdout,
                Some("stderr") => StreamId::Stderr,
                // A terminal's one stream (a `kind: "pty"` process).
                Some("pty") => StreamId::Terminal,
                _ => return Err(FrameError::InvalidStream),
            };
            let encoded = wire
                .data_base64
                .as_ref()
                .and_then(Loose::as_str)
                .ok_or(FrameError::InvalidBase64)?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|_| FrameError::InvalidBase64)?;
            Frame::Data { seq, stream, bytes }
        }
        Some("exit") => {
            let code = wire.exit_code.as_ref().filter(|v| !v.is_null());
            let signal = wire.signal.as_ref();
            match (code, signal) {
                (Some(code), _) => Frame::Exit(ExitStatus::Code(
                    code.as_i64()
                        .and_then(|c| i32::try_from(c).ok())
                        .ok_or(FrameError::MissingExitStatus)?,
                )),
                (None, Some(signal)) => Frame::Exit(ExitStatus::Signal(
                    signal
                        .as_str()
                        .filter(|s| is_signal_name(s))
                        .ok_or(FrameError::InvalidSignal)?
                        .to_string(),
                )),
                (None, None) => return Err(FrameError::MissingExitStatus),
            }
        }
        Some("heartbeat") => Frame::Heartbeat,
        // Only a well-formed error code is kept: the text is server data and
        // must not carry anything (a reflected secret, a body) into errors.
        Some("error") => Frame::Error(
            str_of(&wire.error)
                .filter(|code| {
                    (1..=64).contains(&code.len())
                        && code
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                })
                .unwrap_or_else(|| "unrecognised".to_string()),
        ),
        _ => return Err(FrameError::UnknownType),
    };
    Ok(Some(frame))
}

/// A data frame in its plain form: one flat JSON object with exactly the
/// keys `type` (`"data"`), `seq` (a positive integer without sign, fraction
/// or exponent), `stream` (`"stdout"` or `"stderr"`) and `data_base64`
/// (padded standard base64), in any order, no escapes, JSON whitespace
/// between tokens. `None` for anything else, so the caller's general
/// parser decides. Costs one scan for the payload's closing quote and the
/// base64 decode; no allocation but the decoded bytes.
fn plain_data_frame(line: &[u8]) -> Option<Frame> {
    (line.first() == Some(&b'{')).then_some(())?;
    let mut at = 1;
    let (mut kind, mut seq, mut stream, mut data) = (None, None, None, None);
    loop {
        at = skip_ws(line, at);
        let key = plain_string(line, &mut at)?;
        at = skip_ws(line, at);
        (line.get(at) == Some(&b':')).then_some(())?;
        at = skip_ws(line, at + 1);
        match key {
            b"type" if kind.is_none() => kind = Some(plain_string(line, &mut at)?),
            b"seq" if seq.is_none() => {
                let digits = line[at..].iter().take_while(|b| b.is_ascii_digit()).count();
                let text = &line[at..at + digits];
                if text.is_empty() || text[0] == b'0' {
                    return None;
                }
                seq = Some(std::str::from_utf8(text).ok()?.parse::<u64>().ok()?);
                at += digits;
            }
            b"stream" if stream.is_none() => {
                stream = Some(match plain_string(line, &mut at)? {
                    b"stdout" => StreamId::Stdout,
                    b"stderr" => StreamId::Stderr,
                    b"pty" => StreamId::Terminal,
                    _ => return None,
                })
            }
            b"data_base64" if data.is_none() => data = Some(base64_string(line, &mut at)?),
            _ => return None,
        }
        at = skip_ws(line, at);
        match line.get(at) {
            Some(b',') => at += 1,
            Some(b'}') => break,
            _ => return None,
        }
    }
    if kind != Some(&b"data"[..]) || skip_ws(line, at + 1) != line.len() {
        return None;
    }
    Some(Frame::Data {
        seq: seq?,
        stream: stream?,
        bytes: data?,
    })
}

/// A JSON string at `at` holding padded standard base64, decoded in the
/// same pass that finds its closing quote (neither `"` nor `\\` is in the
/// alphabet, so the payload ends at the first byte outside it); moves `at`
/// past the quote. `None` for anything else.
fn base64_string(line: &[u8], at: &mut usize) -> Option<Vec<u8>> {
    (line.get(*at) == Some(&b'"')).then_some(())?;
    let start = *at + 1;
    let rest = line.get(start..)?;
    // Whole quads of alphabet characters, decoded as they are read into
    // room for the longest payload the line can hold.
    let mut out = vec![0u8; rest.len() / 4 * 3];
    // Whole blocks of 16 alphabet characters first, 16 at a time where the
    // build has SIMD; the quads after them one by one.
    let mut written = simd_base64::decode_blocks(rest, &mut out) / 4 * 3;
    for (quad, bytes) in rest[written / 3 * 4..]
        .chunks_exact(4)
        .zip(out[written..].chunks_exact_mut(3))
    {
        let Some(n) = sextets(quad[0], quad[1], quad[2], quad[3]) else {
            break;
        };
        bytes[0] = (n >> 16) as u8;
        bytes[1] = (n >> 8) as u8;
        bytes[2] = n as u8;
        written += 3;
    }
    out.truncate(written);
    let end = written / 3 * 4;
    // What follows is the closing quote, or a padded last quad and then the
    // quote; the last whole quad read may also have been the end quad.
    let tail = &rest[end..];
    let (last, len) = match tail {
        [b'"', ..] => (None, 0),
        [a, b, b'=', b'=', b'"', ..] => (Some([*a, *b, b'=', b'=']), 4),
        [a, b, c, b'=', b'"', ..] => (Some([*a, *b, *c, b'=']), 4),
        _ => return None,
    };
    if let Some(quad) = last {
        out.extend_from_slice(&decode_base64(&quad)?);
    }
    *at = start + end + len + 1;
    Some(out)
}

/// JSON whitespace from `at` on; returns the first other position.
fn skip_ws(line: &[u8], mut at: usize) -> usize {
    while matches!(line.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// A JSON string at `at` without escapes or control characters; moves
/// `at` past its closing quote.
fn plain_string<'a>(line: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    (line.get(*at) == Some(&b'"')).then_some(())?;
    let start = *at + 1;
    let len = memchr::memchr2(b'"', b'\\', line.get(start..)?)?;
    let text = &line[start..start + len];
    (line[start + len] == b'"').then_some(())?;
    // No check for control characters: every string read here is compared
    // with a known name or decoded as base64, which accepts neither.
    *at = start + len + 1;
    Some(text)
}

/// Padded standard base64 (RFC 4648 alphabet, `=` padding required, zero
/// trailing bits), as `base64`'s `STANDARD` engine decodes it; `None` for
/// anything it would refuse. Four characters at a time, no per-byte
/// allocation or library call.
pub fn decode_base64(input: &[u8]) -> Option<Vec<u8>> {
    if !input.len().is_multiple_of(4) {
        return None;
    }
    let Some(last) = input.len().checked_sub(4) else {
        return Some(Vec::new());
    };
    let (body, end) = input.split_at(last);
    let mut out = vec![0u8; body.len() / 4 * 3];
    for (quad, bytes) in body.chunks_exact(4).zip(out.chunks_exact_mut(3)) {
        let n = sextets(quad[0], quad[1], quad[2], quad[3])?;
        bytes[0] = (n >> 16) as u8;
        bytes[1] = (n >> 8) as u8;
        bytes[2] = n as u8;
    }
    match *end {
        [a, b, b'=', b'='] => {
            let n = sextets(a, b, b'A', b'A')?;
            (n & 0xFFFF == 0).then_some(())?;
            out.push((n >> 16) as u8);
        }
        [a, b, c, b'='] => {
            let n = sextets(a, b, c, b'A')?;
            (n & 0xFF == 0).then_some(())?;
            out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8]);
        }
        [a, b, c, d] => {
            let n = sextets(a, b, c, d)?;
            out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8]);
        }
        _ => return None,
    }
    Some(out)
}

/// Base64 decoding 16 characters at a time with wasm SIMD (`simd128`, on
/// for the components in .cargo/config.toml): the per-quad loop was the
/// largest cost left in the component's frame parsing. Other builds (the
/// native tests and baselines) decode every quad one by one.
mod simd_base64 {
    /// Decodes the leading blocks of 16 characters of `input` that are all
    /// in the alphabet (no padding) into `out`, 12 bytes per block, and
    /// returns how many characters it decoded (a multiple of 16). `out`
    /// must hold `input.len() / 4 * 3` bytes.
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    pub fn decode_blocks(input: &[u8], out: &mut [u8]) -> usize {
        use core::arch::wasm32::*;
        let lo_lut = v128_from(&LO_CLASSES);
        let hi_lut = v128_from(&HI_CLASSES);
        let roll_lut = v128_from(&ROLL);
        let nibble = u8x16_splat(0x0F);
        let slash = u8x16_splat(b'/');
        let byte = u16x8_splat(0x00FF);
        let half = u32x4_splat(0xFFFF);
        // Bytes 2, 1, 0 of each 32-bit lane (the 24 bits, most significant
        // first); the last four indexes give zeros and are not stored.
        let order = i8x16(2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1);
        let mut done = 0;
        for (block, bytes) in input.chunks_exact(16).zip(out.chunks_exact_mut(12)) {
            // SAFETY: `block` is 16 readable bytes; an unaligned v128 load is
            // allowed in wasm.
            let v = unsafe { v128_load(block.as_ptr().cast()) };
            let hi = u8x16_shr(v, 4);
            let lo = v128_and(v, nibble);
            // A byte is outside the alphabet when its low nibble's classes
            // meet its high nibble's class.
            let bad = v128_and(u8x16_swizzle(lo_lut, lo), u8x16_swizzle(hi_lut, hi));
            if v128_any_true(bad) {
                break;
            }
            // Each character's value: its byte plus the offset of its range
            // (by high nibble; `/` shares `+`'s nibble and takes index 1).
            let roll = u8x16_swizzle(roll_lut, i8x16_add(hi, u8x16_eq(v, slash)));
            let values = i8x16_add(v, roll);
            // Two 6-bit values per 16-bit lane, then two 12-bit ones per
            // 32-bit lane: 24 bits per 4 characters.
            let pairs = v128_or(i16x8_shl(v128_and(values, byte), 6), u16x8_shr(values, 8));
            let quads = v128_or(i32x4_shl(v128_and(pairs, half), 12), u32x4_shr(pairs, 16));
            let packed = u8x16_swizzle(quads, order);
            // Stored as 8 + 4 bytes: a 12-byte `copy_from_slice` would be a
            // `memory.copy`, which Cranelift calls out of line every time.
            // SAFETY: `bytes` is 12 writable bytes; unaligned lane stores
            // are allowed in wasm.
            unsafe {
                v128_store64_lane::<0>(packed, bytes.as_mut_ptr().cast());
                v128_store32_lane::<2>(packed, bytes.as_mut_ptr().add(8).cast());
            }
            done += 16;
        }
        done
    }

    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    pub fn decode_blocks(_input: &[u8], _out: &mut [u8]) -> usize {
        0
    }

    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    fn v128_from(bytes: &[u8; 16]) -> core::arch::wasm32::v128 {
        // SAFETY: 16 readable bytes.
        unsafe { core::arch::wasm32::v128_load(bytes.as_ptr().cast()) }
    }

    /// Each high nibble's class as one bit: `2x` (`+`, `/`), `3x`
    /// (digits), `4x` and `6x` (letters from 1), `5x` and `7x` (letters to
    /// A), and every other high nibble, which holds no character of the
    /// alphabet.
    #[cfg_attr(
        not(all(target_arch = "wasm32", target_feature = "simd128")),
        allow(dead_code)
    )]
    pub const HI_CLASSES: [u8; 16] = {
        let mut t = [0x10u8; 16];
        t[2] = 0x01;
        t[3] = 0x02;
        t[4] = 0x04;
        t[6] = 0x04;
        t[5] = 0x08;
        t[7] = 0x08;
        t
    };

    /// For each low nibble, the classes of high nibbles with which it is
    /// not a character of the alphabet (so that both tables meet exactly
    /// on the bytes outside it: checked for all 256 bytes by the tests).
    #[cfg_attr(
        not(all(target_arch = "wasm32", target_feature = "simd128")),
        allow(dead_code)
    )]
    pub const LO_CLASSES: [u8; 16] = {
        let mut t = [0u8; 16];
        let mut byte = 0;
        while byte < 256 {
            if super::BASE64_VALUES[byte] == 0xFF {
                t[byte & 0xF] |= HI_CLASSES[byte >> 4];
            }
            byte += 1;
        }
        t
    };

    /// The value minus the byte, by high nibble (index 1: `/`).
    #[cfg_attr(
        not(all(target_arch = "wasm32", target_feature = "simd128")),
        allow(dead_code)
    )]
    pub const ROLL: [u8; 16] = {
        let mut t = [0u8; 16];
        let mut byte = 0;
        while byte < 256 {
            let value = super::BASE64_VALUES[byte];
            if value != 0xFF {
                let at = if byte == b'/' as usize { 1 } else { byte >> 4 };
                t[at] = value.wrapping_sub(byte as u8);
            }
            byte += 1;
        }
        t
    };
}

/// Four base64 characters as 24 bits; `None` if one is not in the alphabet.
#[inline(always)]
fn sextets(a: u8, b: u8, c: u8, d: u8) -> Option<u32> {
    let a = BASE64_VALUES[a as usize] as u32;
    let b = BASE64_VALUES[b as usize] as u32;
    let c = BASE64_VALUES[c as usize] as u32;
    let d = BASE64_VALUES[d as usize] as u32;
    if (a | b | c | d) & 0x80 != 0 {
        return None;
    }
    Some(a << 18 | b << 12 | c << 6 | d)
}

/// Each byte's value in the base64 alphabet, or 0xFF.
const BASE64_VALUES: [u8; 256] = {
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut table = [0xFFu8; 256];
    let mut i = 0;
    while i < 64 {
        table[alphabet[i] as usize] = i as u8;
        i += 1;
    }
    table
};

/// True for a signal name the host may show and branch on: `SIG` followed
/// by upper-case letters and digits, at most [`MAX_SIGNAL_BYTES`] bytes.
/// Anything else is server data that must not pass as a signal.
pub fn is_signal_name(name: &str) -> bool {
    name.len() <= MAX_SIGNAL_BYTES
        && name.strip_prefix("SIG").is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
        })
}

/// Cuts a byte stream into newline-terminated lines, keeping an unfinished
/// line across chunks. A line over [`MAX_LINE_BYTES`] is an error as soon
/// as it is seen, so memory stays bounded.
#[derive(Debug, Default)]
pub struct LineSplitter {
    partial: Vec<u8>,
}

impl LineSplitter {
    /// Adds a chunk and returns the complete lines it finished.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Vec<u8>>, FrameError> {
        let mut lines = Vec::new();
        let mut rest = chunk;
        while let Some(i) = memchr::memchr(b'\n', rest) {
            let mut line = std::mem::take(&mut self.partial);
            line.extend_from_slice(&rest[..i]);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.len() > MAX_LINE_BYTES {
                return Err(FrameError::LineTooLong);
            }
            lines.push(line);
            rest = &rest[i + 1..];
        }
        self.partial.extend_from_slice(rest);
        if self.partial.len() > MAX_LINE_BYTES + 1 {
            return Err(FrameError::LineTooLong);
        }
        Ok(lines)
    }

    /// Calls `each` with every complete line `chunk` finishes, in order,
    /// without copying lines that lie wholly inside the chunk; stops early
    /// when `each` breaks (the rest of the chunk is then dropped).
    pub fn for_each_line<B>(
        &mut self,
        chunk: &[u8],
        mut each: impl FnMut(&[u8]) -> ControlFlow<B>,
    ) -> Result<ControlFlow<B>, FrameError> {
        let mut rest = chunk;
        while let Some(i) = memchr::memchr(b'\n', rest) {
            let flow = if self.partial.is_empty() {
                let mut line = &rest[..i];
                if line.last() == Some(&b'\r') {
                    line = &line[..line.len() - 1];
                }
                if line.len() > MAX_LINE_BYTES {
                    return Err(FrameError::LineTooLong);
                }
                each(line)
            } else {
                let mut line = std::mem::take(&mut self.partial);
                line.extend_from_slice(&rest[..i]);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                if line.len() > MAX_LINE_BYTES {
                    return Err(FrameError::LineTooLong);
                }
                let flow = each(&line);
                // Keep the allocation for the next partial line.
                line.clear();
                self.partial = line;
                flow
            };
            rest = &rest[i + 1..];
            if flow.is_break() {
                return Ok(flow);
            }
        }
        self.partial.extend_from_slice(rest);
        if self.partial.len() > MAX_LINE_BYTES + 1 {
            return Err(FrameError::LineTooLong);
        }
        Ok(ControlFlow::Continue(()))
    }

    /// Ends the stream: the final line without a newline, if any.
    pub fn finish(&mut self) -> Option<Vec<u8>> {
        let line = std::mem::take(&mut self.partial);
        (!line.is_empty()).then_some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn data_frames_decode() {
        let frame =
            parse_frame(br#"{"type":"data","seq":3,"stream":"stderr","data_base64":"4oKs"}"#);
        assert_eq!(
            frame,
            Ok(Some(Frame::Data {
                seq: 3,
                stream: StreamId::Stderr,
                bytes: "€".as_bytes().to_vec()
            }))
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn exit_heartbeat_and_error_frames_decode() {
        assert_eq!(
            parse_frame(br#"{"type":"exit","exit_code":7}"#),
            Ok(Some(Frame::Exit(ExitStatus::Code(7))))
        );
        assert_eq!(
            parse_frame(br#"{"type":"exit","exit_code":null,"signal":"SIGKILL"}"#),
            Ok(Some(Frame::Exit(ExitStatus::Signal("SIGKILL".into()))))
        );
        assert_eq!(
            parse_frame(br#"{"type":"heartbeat"}"#),
            Ok(Some(Frame::Heartbeat))
        );
        assert_eq!(
            parse_frame(br#"{"type":"error","error":"output_offset_expired"}"#),
            Ok(Some(Frame::Error("output_offset_expired".into())))
        );
        assert_eq!(
            parse_frame(br#"{"type":"error","error":"key sk-123 rejected"}"#),
            Ok(Some(Frame::Error("unrecognised".into())))
        );
        assert_eq!(parse_frame(b"  "), Ok(None));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn invalid_frames_are_typed_errors() {
        let cases: &[(&[u8], FrameError)] = &[
            (b"not json", FrameError::NotJson),
            (b"[1]", FrameError::NotJson),
            (br#"{"type":"bogus"}"#, FrameError::UnknownType),
            (br#"{"seq":1}"#, FrameError::UnknownType),
            (
                br#"{"type":"data","seq":0,"stream":"stdout","data_base64":""}"#,
                FrameError::InvalidSeq,
            ),
            (
                br#"{"type":"data","seq":"1","stream":"stdout","data_base64":""}"#,
                FrameError::InvalidSeq,
            ),
            (
                br#"{"type":"data","seq":1.5,"stream":"stdout","data_base64":""}"#,
                FrameError::InvalidSeq,
            ),
            (
                br#"{"type":"data","seq":1,"stream":"stdin","data_base64":""}"#,
                FrameError::InvalidStream,
            ),
            (
                br#"{"type":"data","seq":1,"stream":"stdout","data_base64":"!!"}"#,
                FrameError::InvalidBase64,
            ),
            (
                br#"{"type":"data","seq":1,"stream":"stdout","data_base64":"4oK"}"#,
                FrameError::InvalidBase64,
            ),
            (
                br#"{"type":"data","seq":1,"stream":"stdout"}"#,
                FrameError::InvalidBase64,
            ),
            (br#"{"type":"exit"}"#, FrameError::MissingExitStatus),
            (
                br#"{"type":"exit","exit_code":"1"}"#,
                FrameError::MissingExitStatus,
            ),
            (
                br#"{"type":"exit","exit_code":99999999999}"#,
                FrameError::MissingExitStatus,
            ),
        ];
        for (line, error) in cases {
            assert_eq!(
                parse_frame(line),
                Err(error.clone()),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        assert_eq!(
            parse_frame(&vec![b' '; MAX_LINE_BYTES + 1]),
            Err(FrameError::LineTooLong)
        );
    }

    /// Pins issue 9 item 10: any string up to 64 bytes was accepted as an
    /// exit signal. Only `SIG[A-Z0-9]+`, at most 32 bytes, is a signal.
    #[wasm_bindgen_test(unsupported = test)]
    fn only_a_well_formed_signal_ends_a_command() {
        for signal in ["SIGKILL", "SIGRTMIN1", &format!("SIG{}", "X".repeat(29))] {
            let line = serde_json::json!({"type": "exit", "signal": signal}).to_string();
            assert_eq!(
                parse_frame(line.as_bytes()),
                Ok(Some(Frame::Exit(ExitStatus::Signal(signal.to_string())))),
                "{signal}"
            );
        }
        for signal in [
            "",
            "SIG",
            "KILL",
            "sigkill",
            "SIGkill",
            "SIG KILL",
            "SIGKILL\n",
            "rm -rf /",
            "SIG-1",
            &format!("SIG{}", "X".repeat(30)),
        ] {
            let line = serde_json::json!({"type": "exit", "signal": signal}).to_string();
            assert_eq!(
                parse_frame(line.as_bytes()),
                Err(FrameError::InvalidSignal),
                "{signal:?}"
            );
        }
        assert_eq!(
            parse_frame(br#"{"type":"exit","signal":9}"#),
            Err(FrameError::InvalidSignal)
        );
    }

    /// A small deterministic generator (xorshift), so the cases below are
    /// the same on every run and under wasm.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// The hand-written decoder of the hot path gives exactly what the
    /// `base64` crate's `STANDARD` engine gives, and refuses what it refuses:
    /// valid encodings of every length, and mutated ones (foreign bytes,
    /// padding in the wrong place, non-zero trailing bits, cut lengths).
    #[wasm_bindgen_test(unsupported = test)]
    fn the_fast_base64_decoder_agrees_with_the_base64_crate() {
        let standard = base64::engine::general_purpose::STANDARD;
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let alphabet =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_ .\"\\\n\x00\xff";
        for round in 0..20_000 {
            let len = rng.below(40);
            let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            let mut text = standard.encode(&bytes).into_bytes();
            match round % 4 {
                0 => {}
                1 if !text.is_empty() => {
                    let i = rng.below(text.len());
                    text[i] = alphabet[rng.below(alphabet.len())];
                }
                2 if !text.is_empty() => {
                    text.truncate(rng.below(text.len()));
                }
                _ => {
                    text = (0..rng.below(13))
                        .map(|_| alphabet[rng.below(alphabet.len())])
                        .collect();
                }
            }
            assert_eq!(
                decode_base64(&text),
                standard.decode(&text).ok(),
                "{:?}",
                String::from_utf8_lossy(&text)
            );
            // The same text as a frame's payload: the hot path (which
            // decodes while it looks for the closing quote) and the
            // general parser agree, whatever key follows it.
            let mut line = br#"{"type":"data","seq":5,"stream":"stdout","data_base64":""#.to_vec();
            line.extend_from_slice(&text);
            line.extend_from_slice(if round % 2 == 0 {
                br#""}"#
            } else {
                br#"" ,"x":1}"#
            });
            assert_eq!(parse_frame(&line), parse_general(&line));
            if round % 4 == 0 {
                assert!(plain_data_frame(&line).is_some(), "the hot path reads it");
            }
            let mut first = br#"{"data_base64":""#.to_vec();
            first.extend_from_slice(&text);
            first.extend_from_slice(br#"","stream":"stderr","seq":9,"type":"data"}"#);
            assert_eq!(parse_frame(&first), parse_general(&first));
        }
        for text in [
            "QQ==", "QR==", "QUI=", "QUJ=", "QUJD", "Q===", "====", "QQ==QUJD", "",
        ] {
            assert_eq!(
                decode_base64(text.as_bytes()),
                standard.decode(text).ok(),
                "{text}"
            );
        }
    }

    /// The SIMD decoder's tables: the two class tables meet exactly on
    /// the bytes outside the alphabet, and each character's offset gives
    /// its value, for all 256 bytes.
    #[wasm_bindgen_test(unsupported = test)]
    fn the_simd_base64_tables_classify_every_byte() {
        use super::simd_base64::{HI_CLASSES, LO_CLASSES, ROLL};
        for byte in 0..=255u8 {
            let value = BASE64_VALUES[byte as usize];
            let outside = LO_CLASSES[(byte & 0xF) as usize] & HI_CLASSES[(byte >> 4) as usize];
            assert_eq!(outside != 0, value == 0xFF, "{byte:#x}");
            if value != 0xFF {
                let at = if byte == b'/' { 1 } else { byte >> 4 };
                assert_eq!(byte.wrapping_add(ROLL[at as usize]), value, "{byte:#x}");
            }
        }
    }

    /// Payloads long enough for the 16-character blocks (the wasm build's
    /// SIMD path): whole, and with every byte value put at a position in
    /// each of a block's 16 places, the frame decodes to what the `base64`
    /// crate gives, or is refused as it refuses it.
    #[wasm_bindgen_test(unsupported = test)]
    fn long_payloads_decode_like_the_base64_crate_at_every_block_position() {
        let standard = base64::engine::general_purpose::STANDARD;
        let mut rng = Rng(0xD1B5_4A32_D192_ED03);
        let frame = |text: &[u8]| {
            let mut line = br#"{"type":"data","seq":5,"stream":"stdout","data_base64":""#.to_vec();
            line.extend_from_slice(text);
            line.extend_from_slice(br#""}"#);
            parse_frame(&line)
        };
        let expect = |text: &[u8]| {
            standard.decode(text).map_err(|_| ()).map(|bytes| {
                Some(Frame::Data {
                    seq: 5,
                    stream: StreamId::Stdout,
                    bytes,
                })
            })
        };
        for len in (0..200).chain([767, 768, 769, 4096, 65_536]) {
            let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            let text = standard.encode(&bytes).into_bytes();
            assert_eq!(frame(&text).map_err(|_| ()), expect(&text), "{len}");
        }
        let bytes: Vec<u8> = (0..60).map(|_| rng.next() as u8).collect();
        let text = standard.encode(&bytes).into_bytes();
        for at in 0..text.len() {
            for byte in 0..=255u8 {
                let mut bad = text.clone();
                bad[at] = byte;
                assert_eq!(
                    frame(&bad).map_err(|_| ()),
                    expect(&bad),
                    "byte {byte:#x} at {at}"
                );
            }
        }
    }

    /// The plain-frame hot path and the general parser agree on every
    /// line, including the ones the hot path hands over (key order,
    /// whitespace, repeated or unknown keys, escapes, odd numbers, bad
    /// streams and payloads).
    #[wasm_bindgen_test(unsupported = test)]
    fn the_plain_frame_path_agrees_with_the_general_parser() {
        let lines: &[&str] = &[
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"aGk="}"#,
            r#"{"data_base64":"aGk=","seq":12,"stream":"stderr","type":"data"}"#,
            r#"{ "type" : "data" , "seq" : 3 , "stream" : "stdout" , "data_base64" : "" }  "#,
            "{\"type\":\"data\",\r\n\t\"seq\":3,\"stream\":\"stdout\",\"data_base64\":\"\"}",
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"aGk=","x":1}"#,
            r#"{"type":"data","type":"data","seq":1,"stream":"stdout","data_base64":"aGk="}"#,
            r#"{"type":"exit","type":"data","seq":1,"stream":"stdout","data_base64":"aGk="}"#,
            r#"{"type":"data","seq":1,"seq":2,"stream":"stdout","data_base64":"aGk="}"#,
            r#"{"type":"d\u0061ta","seq":1,"stream":"stdout","data_base64":"aGk="}"#,
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"aGk\u003d"}"#,
            r#"{"type":"data","seq":01,"stream":"stdout","data_base64":"aGk="}"#,
            r#"{"type":"data","seq":0,"stream":"stdout","data_base64":"aGk="}"#,
            r#"{"type":"data","seq":-1,"stream":"stdout","data_base64":"aGk="}"#,
            r#"{"type":"data","seq":1.0,"stream":"stdout","data_base64":"aGk="}"#,
            r#"{"type":"data","seq":1e2,"stream":"stdout","data_base64":"aGk="}"#,
            r#"{"type":"data","seq":18446744073709551616,"stream":"stdout","data_base64":""}"#,
            r#"{"type":"data","seq":18446744073709551615,"stream":"stdout","data_base64":""}"#,
            r#"{"type":"data","seq":"1","stream":"stdout","data_base64":"aGk="}"#,
            r#"{"type":"data","seq":1,"stream":"stdin","data_base64":"aGk="}"#,
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"aGk"}"#,
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"QUJDQQ=="}"#,
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"QUJDQUI="}"#,
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"QUJDQQ"}"#,
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"QQ==QUJD"}"#,
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"QR=="}"#,
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"QUJD\"}"#,
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"QUJD"#,
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"aG\nk="}"#,
            r#"{"type":"data","seq":1,"stream":"stdout"}"#,
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"aGk="}x"#,
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"aGk=",}"#,
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"aGk="#,
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":null}"#,
            r#"{"type":"heartbeat"}"#,
            r#"{"type":"exit","exit_code":0}"#,
            r#"  {"type":"data","seq":1,"stream":"stdout","data_base64":"aGk="}"#,
        ];
        for line in lines {
            assert_eq!(
                parse_frame(line.as_bytes()),
                parse_general(line.as_bytes()),
                "{line}"
            );
        }
        assert!(plain_data_frame(lines[0].as_bytes()).is_some());
        assert!(plain_data_frame(lines[1].as_bytes()).is_some());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn lines_split_across_chunks_and_final_line_without_newline() {
        let mut splitter = LineSplitter::default();
        assert_eq!(splitter.push(b"ab").unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(
            splitter.push(b"c\r\nde\n\nf").unwrap(),
            vec![b"abc".to_vec(), b"de".to_vec(), b"".to_vec()]
        );
        assert_eq!(splitter.finish(), Some(b"f".to_vec()));
        assert_eq!(splitter.finish(), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn lines_are_visited_in_place_across_chunks_and_a_break_stops_the_chunk() {
        let mut splitter = LineSplitter::default();
        let mut seen: Vec<Vec<u8>> = Vec::new();
        let mut visit = |splitter: &mut LineSplitter, chunk: &[u8], stop_at: &[u8]| {
            splitter
                .for_each_line(chunk, |line| {
                    seen.push(line.to_vec());
                    if line == stop_at {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                })
                .unwrap()
        };
        assert!(visit(&mut splitter, b"a\r\nb", b"-").is_continue());
        assert!(visit(&mut splitter, b"c\nd\n\nx\ny\n", b"x").is_break());
        assert_eq!(
            seen,
            vec![
                b"a".to_vec(),
                b"bc".to_vec(),
                b"d".to_vec(),
                b"".to_vec(),
                b"x".to_vec()
            ]
        );
        let mut endless = LineSplitter::default();
        let long = vec![b'z'; MAX_LINE_BYTES + 2];
        assert_eq!(
            endless.for_each_line(&long, |_| ControlFlow::<()>::Continue(())),
            Err(FrameError::LineTooLong)
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_endless_line_is_refused_with_bounded_memory() {
        let mut splitter = LineSplitter::default();
        let chunk = vec![b'x'; 64 * 1024];
        let mut result = Ok(Vec::new());
        for _ in 0..20 {
            result = splitter.push(&chunk);
            if result.is_err() {
                break;
            }
        }
        assert_eq!(result, Err(FrameError::LineTooLong));
    }
}
