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
        while let Some(i) = rest.iter().position(|b| *b == b'\n') {
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
        while let Some(i) = rest.iter().position(|b| *b == b'\n') {
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
