//! The command's live output on this process's stdout and stderr.
//!
//! The runtime calls the sink on a relay thread of its own, behind a
//! bounded queue (`SandboxRuntime::execute`): a consumer that reads slowly
//! slows the command down (backpressure, never loss), and one that never
//! reads cannot hold the command past its timeout; the runtime then
//! reports the output it could not hand over as an `output-lost` of
//! operation `output-sink`, which `exec` explains. So the sink here only
//! writes, in order per stream, and may block.

use std::io::Write;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sandbox_host::types::OutputStream;
use sandbox_host::OutputSink;

/// The live output of one command (see the module docs).
pub struct Live {
    streamed: Arc<AtomicBool>,
}

impl Live {
    /// The sink writing to this process's stdout and stderr.
    pub fn start() -> (OutputSink, Live) {
        let streamed = Arc::new(AtomicBool::new(false));
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
            Arc::new(move |stream, chunk: &str| {
                streamed.store(true, Ordering::Relaxed);
                let _ = match stream {
                    OutputStream::Stdout => match &direct {
                        Some(file) => (&*file).write_all(chunk.as_bytes()),
                        None => write(&mut std::io::stdout().lock(), chunk),
                    },
                    OutputStream::Stderr => write(&mut std::io::stderr().lock(), chunk),
                };
            })
        };
        (sink, Live { streamed })
    }

    /// Whether any output arrived live.
    pub fn streamed(&self) -> bool {
        self.streamed.load(Ordering::Relaxed)
    }
}

fn write(out: &mut impl Write, chunk: &str) -> std::io::Result<()> {
    out.write_all(chunk.as_bytes())?;
    out.flush()
}
