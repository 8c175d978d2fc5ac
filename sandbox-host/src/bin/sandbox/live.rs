//! The command's live output on this process's stdout and stderr.
//!
//! The runtime calls the sink on a relay thread of its own, behind a
//! bounded queue (`SandboxRuntime::execute`): a consumer that reads slowly
//! slows the command down (backpressure, never loss), and one that never
//! reads cannot hold the command past its timeout; the runtime then
//! reports the output it could not hand over as an `output-lost` of
//! operation `output-sink`, which `exec` explains. So the sink here only
//! writes, in order per stream, and may block.
//!
//! Output is written byte for byte as the provider forwarded it: a
//! component of contract 0.4.0 forwards the exact bytes the command
//! printed. One built for an older contract forwards text, in which bytes
//! that were not UTF-8 became U+FFFD; only then are those counted, so
//! `exec` can say the output was altered ([`Live::replacement_characters`]).
//!
//! A write that fails (the reader closed the pipe, the disk behind a
//! redirect is full) means the output can no longer reach the user: the
//! command is cancelled at once (as a pipeline's writer ends with SIGPIPE),
//! what it prints afterwards is counted as undelivered, and `exec` never
//! reports the run as a clean exit ([`Live::undelivered`]).

use std::io::Write;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sandbox_host::types::OutputStream;
use sandbox_host::{CancelToken, OutputSink};

/// The live output of one command (see the module docs).
pub struct Live {
    streamed: Arc<AtomicBool>,
    failure: Arc<Mutex<Option<Undelivered>>>,
    replaced: Arc<AtomicU64>,
}

/// Output that could not be written to this process's stdout or stderr.
#[derive(Debug, Clone)]
pub struct Undelivered {
    /// The stream whose write failed first.
    pub stream: OutputStream,
    /// Why it failed.
    pub error: std::io::ErrorKind,
    /// The error as the system words it.
    pub message: String,
    /// Bytes not written: the chunk whose write failed (part of it may
    /// have been written) and all output after it.
    pub bytes: u64,
}

impl Undelivered {
    /// The reader of the stream closed it (`EPIPE`): as for a pipeline's
    /// writer, not an error to explain, only a status (141).
    pub fn reader_closed(&self) -> bool {
        self.error == std::io::ErrorKind::BrokenPipe
    }

    /// The stream's name for messages.
    pub fn stream_name(&self) -> &'static str {
        match self.stream {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
            OutputStream::Terminal => "terminal output",
        }
    }
}

impl Live {
    /// The sink writing to this process's stdout and stderr; a failed write
    /// cancels the command through `cancel`. `text` says the component
    /// forwards text (a contract before 0.4.0), whose U+FFFD are counted.
    pub fn start(cancel: CancelToken, text: bool) -> (OutputSink, Live) {
        let streamed = Arc::new(AtomicBool::new(false));
        let failure: Arc<Mutex<Option<Undelivered>>> = Arc::default();
        let replaced = Arc::new(AtomicU64::new(0));
        // Standard output goes straight to file descriptor 1, one `write`
        // per chunk: std's stdout is line-buffered and would cut every
        // chunk at its last newline into two writes.
        let _ = std::io::stdout().flush();
        let direct = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .ok()
            .map(std::fs::File::from);
        let sink: OutputSink = {
            let streamed = streamed.clone();
            let failure = failure.clone();
            let replaced = replaced.clone();
            Arc::new(move |stream, chunk: &[u8]| {
                streamed.store(true, Ordering::Relaxed);
                if text {
                    let marks = replacement_characters(chunk);
                    if marks > 0 {
                        replaced.fetch_add(marks as u64, Ordering::Relaxed);
                    }
                }
                // Not held during the write: a write that blocks forever
                // (a reader never resumed) must not block `undelivered`.
                if let Some(undelivered) = lock(&failure).as_mut() {
                    undelivered.bytes += chunk.len() as u64;
                    return;
                }
                let written = match stream {
                    // A terminal's output is shown where a terminal is.
                    OutputStream::Stdout | OutputStream::Terminal => match &direct {
                        Some(file) => (&*file).write_all(chunk),
                        None => write(&mut std::io::stdout().lock(), chunk),
                    },
                    OutputStream::Stderr => write(&mut std::io::stderr().lock(), chunk),
                };
                if let Err(error) = written {
                    *lock(&failure) = Some(Undelivered {
                        stream,
                        error: error.kind(),
                        message: error.to_string(),
                        bytes: chunk.len() as u64,
                    });
                    cancel.cancel();
                }
            })
        };
        (
            sink,
            Live {
                streamed,
                failure,
                replaced,
            },
        )
    }

    /// Whether any output arrived live.
    pub fn streamed(&self) -> bool {
        self.streamed.load(Ordering::Relaxed)
    }

    /// How many U+FFFD characters the live output of a component that
    /// forwards text held (0 for one of contract 0.4.0 or later, which
    /// forwards bytes): its bytes that were not UTF-8 arrived replaced by
    /// U+FFFD (a command may also print U+FFFD itself).
    pub fn replacement_characters(&self) -> u64 {
        self.replaced.load(Ordering::Relaxed)
    }

    /// Output that could not be written, if a write failed.
    pub fn undelivered(&self) -> Option<Undelivered> {
        lock(&self.failure).clone()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write(out: &mut impl Write, chunk: &[u8]) -> std::io::Result<()> {
    out.write_all(chunk)?;
    out.flush()
}

/// The U+FFFD characters (UTF-8 `EF BF BD`) in `bytes`.
pub fn replacement_characters(bytes: &[u8]) -> usize {
    bytes
        .windows(3)
        .filter(|w| *w == "\u{fffd}".as_bytes())
        .count()
}

#[cfg(test)]
mod tests {
    use super::replacement_characters;

    #[test]
    fn replacement_characters_are_counted_in_bytes() {
        assert_eq!(replacement_characters(b""), 0);
        assert_eq!(replacement_characters("a\u{fffd}b\u{fffd}".as_bytes()), 2);
        // Bytes that are not UTF-8 are not U+FFFD: a 0.4.0 component's
        // binary output is never counted as replaced.
        assert_eq!(replacement_characters(&[0xff, 0xef, 0xbf, 0x00, 0xbd]), 0);
    }
}
