//! The labelled log stream of a session command: each chunk of output is
//! preceded by `01 01 01` (stdout) or `02 02 02` (stderr). A label may be
//! split across body chunks; [`Demux`] carries the partial label over.
//!
//! Output that itself contains three `01` or `02` bytes in a row is
//! indistinguishable from a label (the service's own format has the same
//! limit); such bytes are read as a stream switch.

use provider_sdk::platform::StreamId;

const STDOUT_LABEL: u8 = 1;
const STDERR_LABEL: u8 = 2;
const LABEL_LEN: usize = 3;

/// Splits a labelled byte stream into per-stream chunks.
#[derive(Debug)]
pub struct Demux {
    current: StreamId,
    /// Bytes that may begin a label, held until the next chunk decides.
    pending: Vec<u8>,
}

impl Default for Demux {
    fn default() -> Self {
        Demux {
            current: StreamId::Stdout,
            pending: Vec::new(),
        }
    }
}

impl Demux {
    /// The output in `chunk`, in order, as `(stream, bytes)` runs. Runs
    /// are copied slice by slice between label candidates (bytes `01` and
    /// `02`), found by `memchr`, so plain output costs no per-byte work.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<(StreamId, Vec<u8>)> {
        let joined;
        let input: &[u8] = if self.pending.is_empty() {
            chunk
        } else {
            let mut bytes = std::mem::take(&mut self.pending);
            bytes.extend_from_slice(chunk);
            joined = bytes;
            &joined
        };
        let mut runs: Vec<(StreamId, Vec<u8>)> = Vec::new();
        let mut run = Vec::new();
        let mut i = 0;
        while i < input.len() {
            let Some(at) = memchr::memchr2(STDOUT_LABEL, STDERR_LABEL, &input[i..]) else {
                run.extend_from_slice(&input[i..]);
                break;
            };
            run.extend_from_slice(&input[i..i + at]);
            i += at;
            let byte = input[i];
            let rest = &input[i..];
            let same = rest
                .iter()
                .take(LABEL_LEN)
                .take_while(|b| **b == byte)
                .count();
            if same == LABEL_LEN {
                let next = if byte == STDOUT_LABEL {
                    StreamId::Stdout
                } else {
                    StreamId::Stderr
                };
                // A label of the same stream (the server labels every
                // chunk) continues the run.
                if next != self.current && !run.is_empty() {
                    runs.push((self.current, std::mem::take(&mut run)));
                }
                self.current = next;
                i += LABEL_LEN;
                continue;
            }
            if same == rest.len() {
                // The chunk ends inside what may be a label.
                self.pending = rest.to_vec();
                break;
            }
            run.push(byte);
            i += 1;
        }
        if !run.is_empty() {
            runs.push((self.current, run));
        }
        runs
    }

    /// Ends the stream: held bytes that never became a label are output.
    pub fn finish(&mut self) -> Option<(StreamId, Vec<u8>)> {
        let rest = std::mem::take(&mut self.pending);
        (!rest.is_empty()).then_some((self.current, rest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn all(demux: &mut Demux, chunks: &[&[u8]]) -> Vec<(StreamId, Vec<u8>)> {
        let mut out: Vec<(StreamId, Vec<u8>)> = Vec::new();
        for chunk in chunks {
            for (stream, bytes) in demux.push(chunk).into_iter().chain(None) {
                match out.last_mut() {
                    Some((last, run)) if *last == stream => run.extend(bytes),
                    _ => out.push((stream, bytes)),
                }
            }
        }
        if let Some((stream, bytes)) = demux.finish() {
            match out.last_mut() {
                Some((last, run)) if *last == stream => run.extend(bytes),
                _ => out.push((stream, bytes)),
            }
        }
        out
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn labels_switch_streams_even_when_split_across_chunks() {
        let stream = b"\x01\x01\x01out1\n\x02\x02\x02err\n\x01\x01\x01out2\n";
        let expected = vec![
            (StreamId::Stdout, b"out1\n".to_vec()),
            (StreamId::Stderr, b"err\n".to_vec()),
            (StreamId::Stdout, b"out2\n".to_vec()),
        ];
        assert_eq!(all(&mut Demux::default(), &[stream]), expected);
        // Every split point, including inside a label.
        for cut in 0..stream.len() {
            let (a, b) = stream.split_at(cut);
            assert_eq!(all(&mut Demux::default(), &[a, b]), expected, "cut {cut}");
        }
        // One byte at a time.
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(all(&mut Demux::default(), &bytes), expected);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn lone_control_bytes_are_output() {
        let out = all(
            &mut Demux::default(),
            &[b"\x01\x01\x01a\x01b\x02\x02c", b"\x01"],
        );
        assert_eq!(
            out,
            vec![(StreamId::Stdout, b"a\x01b\x02\x02c\x01".to_vec())]
        );
    }
}
