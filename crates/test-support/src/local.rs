//! The engine (`createos-local`) in this process and a host runtime of one
//! provider component against it: how the provider suites start.

use std::sync::Arc;

use sandbox_engine::{BackgroundServer, Server, ServerBuilder};
use sandbox_host::types::{AcquireRequest, ExecuteRequest, ExecuteResult, ProviderError};
use sandbox_host::{
    CancelToken, Environment, NetworkTransport, OutputSink, SandboxRuntime, Secrets, SqliteLeases,
};
use serde_json::{json, Value};

use crate::components;

/// A face of the engine, and the provider component that speaks to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Face {
    /// `/v1`, served to `createos_provider.wasm`.
    CreateOs,
    /// `/daytona/api` and the toolbox, served to `daytona_provider.wasm`.
    Daytona,
}

/// The engine with `key`, a runtime of the face's provider (real network
/// transport, in-memory lease store) and one environment whose secret
/// `apiKey` is `key`.
pub struct LocalRuntime {
    /// The engine.
    pub server: BackgroundServer,
    /// The host runtime of the provider.
    pub runtime: SandboxRuntime,
    /// The environment the test runs in.
    pub env: Environment,
}

impl LocalRuntime {
    /// [`LocalRuntime::start_with`] with `Server::builder()` and the
    /// runtime as it is.
    pub fn start(face: Face, key: &str, environment_id: &str, config: Value) -> LocalRuntime {
        Self::start_with(face, Server::builder(), key, environment_id, config, |rt| {
            rt
        })
    }

    /// Starts `builder` (given `key`, quiet, and a toolbox for Daytona),
    /// then the runtime (`runtime` may add a rate limit or budget) and the
    /// environment `environment_id`. The provider config names the face's
    /// URLs, a 60 s command and 15 s request timeout; `config`'s fields
    /// override or add to it.
    pub fn start_with(
        face: Face,
        builder: ServerBuilder,
        key: &str,
        environment_id: &str,
        config: Value,
        runtime: impl FnOnce(SandboxRuntime) -> SandboxRuntime,
    ) -> LocalRuntime {
        let builder = builder.api_key(key).quiet(true);
        let (builder, component) = match face {
            Face::CreateOs => (builder, components::createos()),
            Face::Daytona => (builder.toolbox_port(0), components::daytona()),
        };
        let server = BackgroundServer::start(builder).expect("the engine starts");
        let mut merged = match face {
            Face::CreateOs => json!({ "apiUrl": server.base_url() }),
            Face::Daytona => json!({
                "apiUrl": server.daytona_api_url(),
                "toolboxUrl": server.toolbox_url(),
            }),
        };
        merged["timeoutMs"] = json!(60_000);
        merged["requestTimeoutMs"] = json!(15_000);
        for (name, value) in config.as_object().expect("a config object") {
            merged[name] = value.clone();
        }
        let runtime = runtime(
            SandboxRuntime::new(
                component.clone(),
                Arc::new(SqliteLeases::open_in_memory().unwrap()),
                Arc::new(NetworkTransport::new()),
            )
            .unwrap(),
        );
        let env = runtime
            .environment(
                "company",
                environment_id,
                &merged.to_string(),
                &Secrets::none().with("apiKey", key),
            )
            .unwrap();
        LocalRuntime {
            server,
            runtime,
            env,
        }
    }

    /// Acquires a lease with `request`, which must succeed: its id.
    pub fn acquire(&self, request: &AcquireRequest) -> String {
        self.runtime
            .acquire(&self.env, request)
            .unwrap()
            .expect("lease acquired")
            .id
    }

    /// Runs `request` on `lease` (its live output to `sink`, if any); a
    /// trap fails the test.
    // `ProviderError` is the contract's variant, returned as it is.
    #[allow(clippy::result_large_err)]
    pub fn execute(
        &self,
        lease: &str,
        request: &ExecuteRequest,
        sink: Option<OutputSink>,
    ) -> Result<ExecuteResult, ProviderError> {
        self.runtime
            .execute(&self.env, lease, request, sink, CancelToken::new())
            .unwrap()
    }
}

/// Reads what the `createos-local` binary `child` (stdout piped) prints
/// first, `listening on <url>`: the URL, and its further lines (the
/// toolbox line, the machine model...).
pub fn listening(
    child: &mut std::process::Child,
) -> (
    String,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
) {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("the engine's stdout is piped");
    let mut lines = std::io::BufReader::new(stdout).lines();
    let first = lines
        .next()
        .expect("the engine prints a line")
        .expect("a UTF-8 line");
    let url = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("not a `listening on` line: {first:?}"))
        .to_string();
    (url, lines)
}

/// Starts the `createos-local` binary at `bin` with `args` and the API
/// key `key` (stdout piped, stderr inherited) and waits for its
/// `listening on` line: the running engine and its URL.
pub fn start_binary<I, S>(bin: &str, args: I, key: &str) -> (std::process::Child, String)
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut child = std::process::Command::new(bin)
        .args(args)
        .env("CREATEOS_API_KEY", key)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("start createos-local");
    let (url, _) = listening(&mut child);
    (child, url)
}
