//! The data of one store: WASI context (nothing ambient), wasi-http context
//! with our hook, limits, and what the `host` interface needs.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::AsyncWrite;
use wasmtime::component::ResourceTable;
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::network::http_hook::HttpHooks;
use crate::wasm::cancel::CancelToken;
use crate::wasm::options::{ChunkSink, GuestStderr, HostOptions};

/// The `T` of `Store<T>` for provider instances.
pub(crate) struct HostState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    pub(crate) table: ResourceTable,
    hooks: HttpHooks,
    pub(crate) limits: StoreLimits,
    pub(crate) output: ChunkSink,
    pub(crate) cancel: CancelToken,
    pub(crate) stderr: Option<CapturedStderr>,
    pub(crate) sandbox_recorder: crate::wasm::options::SandboxRecorder,
    pub(crate) interaction: crate::wasm::interaction::Interaction,
}

impl HostState {
    pub(crate) fn new(options: &HostOptions, deadline: Instant) -> Self {
        let mut builder = WasiCtx::builder();
        // No preopens, no env, no args, no sockets, no name lookup.
        builder
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }));
        let stderr = match options.stderr {
            GuestStderr::Discard => None,
            GuestStderr::Inherit => {
                builder.inherit_stderr();
                None
            }
            GuestStderr::Capture => {
                let captured = CapturedStderr::default();
                builder.stderr(captured.clone());
                Some(captured)
            }
        };
        HostState {
            wasi: builder.build(),
            http: WasiHttpCtx::new(),
            table: ResourceTable::new(),
            hooks: HttpHooks::new(options.transport.clone(), Some(deadline)),
            limits: StoreLimitsBuilder::new()
                .memory_size(options.memory_limit)
                .trap_on_grow_failure(true)
                .build(),
            output: options.output.clone(),
            cancel: options.cancel.clone(),
            stderr,
            sandbox_recorder: options.sandbox_recorder.clone(),
            interaction: options.interaction.clone(),
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// Keeps the guest's stderr in memory, dropping what exceeds the cap
/// (never trapping the guest for logging too much).
#[derive(Clone, Default)]
pub(crate) struct CapturedStderr {
    buffer: Arc<Mutex<Vec<u8>>>,
}

impl CapturedStderr {
    const CAP: usize = 1024 * 1024;

    pub(crate) fn contents(&self) -> String {
        String::from_utf8_lossy(&self.buffer.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

impl IsTerminal for CapturedStderr {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturedStderr {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl AsyncWrite for CapturedStderr {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let mut buffer = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        let room = Self::CAP.saturating_sub(buffer.len());
        buffer.extend_from_slice(&buf[..buf.len().min(room)]);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
