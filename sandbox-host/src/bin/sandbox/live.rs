//! The command's live output on this process's stdout and stderr.
//!
//! A writer thread writes the chunks in order per stream; the sink hands
//! them over through a bounded queue, so a consumer that reads slowly slows
//! the command down (backpressure, never loss). A consumer that never
//! reads cannot hold the command past its timeout: once the timeout has
//! passed, a chunk the full queue cannot take is counted instead of waited
//! for, so the provider gets control back, ends the command as timed out,
//! and the run reports how much output was not consumed.

use std::io::Write;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_host::types::OutputStream;
use sandbox_host::OutputSink;

/// Chunks queued ahead of the writer before the sink waits.
const QUEUE: usize = 64;
/// How often a sink waiting on a full queue looks at the clock.
const RETRY: Duration = Duration::from_millis(2);

/// The live output of one command (see the module docs).
pub struct Live {
    queue: Option<SyncSender<(OutputStream, String)>>,
    written: Receiver<()>,
    streamed: Arc<AtomicBool>,
    queued: Arc<AtomicU64>,
    delivered: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
    limit: Instant,
}

impl Live {
    /// Starts the writer; the sink stops waiting on a full queue at `limit`
    /// (the command's timeout).
    pub fn start(limit: Instant) -> (OutputSink, Live) {
        let (queue, chunks) = mpsc::sync_channel::<(OutputStream, String)>(QUEUE);
        let (done, written) = mpsc::channel();
        let delivered = Arc::new(AtomicU64::new(0));
        {
            let delivered = delivered.clone();
            // Standard output goes straight to file descriptor 1, one
            // `write` per chunk: std's stdout is line-buffered and would
            // cut every chunk at its last newline into two writes.
            let _ = std::io::stdout().flush();
            let direct = std::io::stdout()
                .as_fd()
                .try_clone_to_owned()
                .ok()
                .map(std::fs::File::from);
            // No handle is kept: a writer blocked on a stdout nobody reads
            // must not hold the CLI's exit.
            let _ = std::thread::Builder::new()
                .name("live-output".into())
                .spawn(move || {
                    for (stream, chunk) in chunks {
                        let _ = match stream {
                            OutputStream::Stdout => match &direct {
                                Some(file) => (&*file).write_all(chunk.as_bytes()),
                                None => write(&mut std::io::stdout().lock(), &chunk),
                            },
                            OutputStream::Stderr => write(&mut std::io::stderr().lock(), &chunk),
                        };
                        delivered.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    }
                    let _ = done.send(());
                });
        }
        let live = Live {
            queue: Some(queue.clone()),
            written,
            streamed: Arc::new(AtomicBool::new(false)),
            queued: Arc::new(AtomicU64::new(0)),
            delivered,
            dropped: Arc::new(AtomicU64::new(0)),
            limit,
        };
        let sink: OutputSink = {
            let (streamed, queued, dropped) = (
                live.streamed.clone(),
                live.queued.clone(),
                live.dropped.clone(),
            );
            Arc::new(move |stream, chunk: &str| {
                streamed.store(true, Ordering::Relaxed);
                let mut item = (stream, chunk.to_owned());
                loop {
                    match queue.try_send(item) {
                        Ok(()) => {
                            queued.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                            return;
                        }
                        Err(TrySendError::Full(back)) if Instant::now() < limit => {
                            item = back;
                            std::thread::sleep(RETRY);
                        }
                        Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                            dropped.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                            return;
                        }
                    }
                }
            })
        };
        (sink, live)
    }

    /// Whether any output arrived live.
    pub fn streamed(&self) -> bool {
        self.streamed.load(Ordering::Relaxed)
    }

    /// Waits until everything queued is written (or, once the command's
    /// timeout has passed, gives up on a consumer that does not read) and
    /// returns how many bytes of output were not consumed.
    pub fn finish(mut self) -> u64 {
        self.queue = None;
        let wait = self.limit.saturating_duration_since(Instant::now());
        let all_written = match self.written.recv_timeout(wait) {
            Ok(()) => true,
            // Past the timeout: a last short grace for a slow consumer.
            Err(_) => self.written.recv_timeout(Duration::from_secs(1)).is_ok(),
        };
        let queued = self.queued.load(Ordering::Relaxed);
        let unwritten = if all_written {
            0
        } else {
            queued.saturating_sub(self.delivered.load(Ordering::Relaxed))
        };
        self.dropped.load(Ordering::Relaxed) + unwritten
    }
}

fn write(out: &mut impl Write, chunk: &str) -> std::io::Result<()> {
    out.write_all(chunk.as_bytes())?;
    out.flush()
}
