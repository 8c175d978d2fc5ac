//! What a host gives one provider instance: transport, output sink,
//! cancellation, limits.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::network::transport::{DenyAll, Transport};
use crate::wasm::bindings::types::OutputStream;
use crate::wasm::cancel::CancelToken;
use crate::wasm::interaction::Interaction;

/// Receives the live output a guest forwards with `host.emit-output`: the
/// bytes the command printed on the stream, as they are (a chunk may end
/// inside a UTF-8 character; decode per stream, carrying it over, to show
/// text).
pub type OutputSink = Arc<dyn Fn(OutputStream, &[u8]) + Send + Sync>;

/// What an instance hands each `host.emit-output` chunk to: the bytes as
/// lifted from the guest, owned, so a relay can queue them without a copy.
pub(crate) type ChunkSink = Arc<dyn Fn(OutputStream, Vec<u8>) + Send + Sync>;

/// An embedder's sink as a [`ChunkSink`].
pub(crate) fn chunk_sink(sink: OutputSink) -> ChunkSink {
    Arc::new(move |stream, chunk: Vec<u8>| sink(stream, &chunk))
}

/// What happens to the guest's own standard error (its debug prints).
/// The guest's stdout is always discarded and its stdin is empty.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GuestStderr {
    /// Dropped (the default).
    #[default]
    Discard,
    /// Written to the host's stderr.
    Inherit,
    /// Kept in memory (up to 1 MiB, the rest dropped); read it with
    /// [`ProviderInstance::guest_stderr`](crate::ProviderInstance::guest_stderr).
    Capture,
}

/// Options for one instance (one operation). Cheap to clone.
#[derive(Clone)]
pub struct HostOptions {
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) output: ChunkSink,
    pub(crate) cancel: CancelToken,
    pub(crate) memory_limit: usize,
    pub(crate) deadline: Duration,
    pub(crate) stderr: GuestStderr,
    pub(crate) sandbox_recorder: SandboxRecorder,
    pub(crate) interaction: Interaction,
}

/// Receives the sandbox ids a provider reports through
/// `host.record-sandbox`; an error traps the instance (the operation must
/// not go on with a sandbox the host could not record).
pub type SandboxRecorder = Arc<dyn Fn(&str) -> anyhow::Result<()> + Send + Sync>;

impl HostOptions {
    /// Default cap on the instance's linear memory.
    pub const DEFAULT_MEMORY_LIMIT: usize = 256 * 1024 * 1024;
    /// Default wall-clock deadline of the instance.
    pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(15 * 60);

    /// Deny-all transport, output discarded, a fresh cancel token, 256 MiB,
    /// 15 minutes, guest stderr discarded.
    pub fn new() -> Self {
        HostOptions {
            transport: Arc::new(DenyAll),
            output: Arc::new(|_, _| {}),
            cancel: CancelToken::new(),
            memory_limit: Self::DEFAULT_MEMORY_LIMIT,
            deadline: Self::DEFAULT_DEADLINE,
            stderr: GuestStderr::Discard,
            sandbox_recorder: Arc::new(|_| Ok(())),
            interaction: Interaction::new(),
        }
    }

    /// The events of the interactive process an `interact` call on this
    /// instance runs (see [`Interaction`]); without one, the guest finds
    /// no event.
    pub fn with_interaction(mut self, interaction: Interaction) -> Self {
        self.interaction = interaction;
        self
    }

    /// Where the guest's `wasi:http` requests go (usually a [`Guard`](crate::Guard)).
    pub fn with_transport(mut self, transport: Arc<dyn Transport>) -> Self {
        self.transport = transport;
        self
    }

    /// Calls `sink` for each `host.emit-output` chunk, in order, on the
    /// thread running the operation.
    pub fn with_output(
        mut self,
        sink: impl Fn(OutputStream, &[u8]) + Send + Sync + 'static,
    ) -> Self {
        self.output = chunk_sink(Arc::new(sink));
        self
    }

    /// Like [`with_output`](Self::with_output) with a shared sink.
    pub fn with_output_sink(mut self, sink: OutputSink) -> Self {
        self.output = chunk_sink(sink);
        self
    }

    /// Hands each chunk, owned, to `sink` (the runtime's relay).
    pub(crate) fn with_chunk_sink(mut self, sink: ChunkSink) -> Self {
        self.output = sink;
        self
    }

    /// The token whose [`cancel`](CancelToken::cancel) makes the guest's
    /// `host.cancellation()` pollable ready.
    pub fn with_cancel(mut self, token: CancelToken) -> Self {
        self.cancel = token;
        self
    }

    /// Caps the instance's linear memory; growing beyond traps.
    pub fn with_memory_limit(mut self, bytes: usize) -> Self {
        self.memory_limit = bytes;
        self
    }

    /// Traps the guest once `deadline` has passed since instantiation (epoch
    /// interruption, checked while guest code runs, so a guest blocked in a
    /// host call is stopped when that call returns). The HTTP requests of
    /// the instance are bounded by the same deadline.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// What happens to the guest's stderr.
    pub fn with_guest_stderr(mut self, stderr: GuestStderr) -> Self {
        self.stderr = stderr;
        self
    }

    /// Calls `recorder` with each sandbox id the provider reports
    /// (`host.record-sandbox`) before the operation goes on.
    pub fn with_sandbox_recorder(mut self, recorder: SandboxRecorder) -> Self {
        self.sandbox_recorder = recorder;
        self
    }

    /// The cancel token these options carry.
    pub fn cancel_token(&self) -> &CancelToken {
        &self.cancel
    }
}

impl Default for HostOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for HostOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostOptions")
            .field("cancel", &self.cancel)
            .field("memory_limit", &self.memory_limit)
            .field("deadline", &self.deadline)
            .field("stderr", &self.stderr)
            .finish_non_exhaustive()
    }
}

/// One emitted chunk: its stream and bytes.
type Chunk = (OutputStream, Vec<u8>);

/// Collects emitted output in order; give [`sink`](Self::sink) to
/// [`HostOptions::with_output_sink`]. Clones share the record.
#[derive(Clone, Default)]
pub struct OutputCapture {
    chunks: Arc<Mutex<Vec<Chunk>>>,
}

impl OutputCapture {
    /// An empty capture.
    pub fn new() -> Self {
        Self::default()
    }

    /// A sink appending to this capture.
    pub fn sink(&self) -> OutputSink {
        let chunks = self.chunks.clone();
        Arc::new(move |stream, chunk| {
            chunks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((stream, chunk.to_vec()));
        })
    }

    /// Every chunk so far, in the order emitted.
    pub fn chunks(&self) -> Vec<(OutputStream, Vec<u8>)> {
        self.chunks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The concatenated chunks of one stream: the bytes as emitted.
    pub fn bytes(&self, stream: OutputStream) -> Vec<u8> {
        self.chunks()
            .into_iter()
            .filter(|(s, _)| *s == stream)
            .flat_map(|(_, c)| c)
            .collect()
    }

    /// The concatenated chunks of one stream as text (lossy UTF-8 over the
    /// whole stream, so a character split between chunks stays whole).
    pub fn text(&self, stream: OutputStream) -> String {
        String::from_utf8_lossy(&self.bytes(stream)).into_owned()
    }
}

impl fmt::Debug for OutputCapture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutputCapture")
            .field("chunks", &self.chunks().len())
            .finish()
    }
}
