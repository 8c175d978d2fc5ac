//! Output at real volume (issue 23): every byte a command prints reaches
//! the host's live output sink, in order per stream, on both providers,
//! against the real local engine at its default journal (1 MiB, like the
//! service). The live stream is never capped; the result's 4 Mi-character
//! tail is.
//!
//! Volumes are kept to what the issue names; these tests run a debug-built
//! engine and host, so each takes seconds, not milliseconds.

// `ProviderError` is the contract's variant, returned as it is.
#![allow(clippy::result_large_err)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use createos_local::{BackgroundServer, Server};
use sandbox_host::types::*;
use sandbox_host::{
    CancelToken, Environment, NetworkTransport, OutputSink, SandboxRuntime, Secrets, SqliteLeases,
};
use test_support::RequestExt;

const KEY: &str = "output-volume-key-51c7";

#[derive(Clone, Copy, Debug)]
enum Provider {
    CreateOs,
    Daytona,
}

struct Local {
    server: BackgroundServer,
    runtime: SandboxRuntime,
    env: Environment,
}

impl Local {
    /// The engine at its default journal, and a runtime of `provider`.
    fn start(provider: Provider) -> Local {
        let server =
            BackgroundServer::start(Server::builder().api_key(KEY).toolbox_port(0).quiet(true))
                .expect("server starts");
        let (component, config) = match provider {
            Provider::CreateOs => (
                test_support::components::createos(),
                serde_json::json!({
                    "apiUrl": server.base_url(),
                    "timeoutMs": 300_000,
                    "requestTimeoutMs": 30_000,
                }),
            ),
            Provider::Daytona => (
                test_support::components::daytona(),
                serde_json::json!({
                    "apiUrl": server.daytona_api_url(),
                    "toolboxUrl": server.toolbox_url(),
                    "timeoutMs": 300_000,
                    "requestTimeoutMs": 30_000,
                }),
            ),
        };
        let runtime = SandboxRuntime::new(
            component.clone(),
            Arc::new(SqliteLeases::open_in_memory().unwrap()),
            Arc::new(NetworkTransport::new()),
        )
        .unwrap();
        let env = runtime
            .environment(
                "company",
                "env-output",
                &config.to_string(),
                &Secrets::none().with("apiKey", KEY),
            )
            .unwrap();
        Local {
            server,
            runtime,
            env,
        }
    }

    fn acquire(&self) -> String {
        let request = test_support::acquire("run");
        self.runtime
            .acquire(&self.env, &request)
            .unwrap()
            .expect("lease acquired")
            .id
    }

    /// Runs `request` with a live sink that records both streams; the sink
    /// sleeps `first_delay` before taking its first chunk (a consumer that
    /// is not reading yet).
    fn run(
        &self,
        lease: &str,
        request: &ExecuteRequest,
        first_delay: Duration,
    ) -> (Result<ExecuteResult, ProviderError>, Live) {
        let live = Live::default();
        let outcome = self
            .runtime
            .execute(
                &self.env,
                lease,
                request,
                Some(live.sink(first_delay)),
                CancelToken::new(),
            )
            .unwrap();
        (outcome, live)
    }
}

/// What the live sink received, per stream.
#[derive(Clone, Default)]
struct Live {
    streams: Arc<Mutex<Received>>,
}

/// Stdout, stderr, and whether the sink has taken a chunk yet.
type Received = (Vec<u8>, Vec<u8>, bool);

impl Live {
    fn sink(&self, first_delay: Duration) -> OutputSink {
        let streams = self.streams.clone();
        Arc::new(move |stream, chunk: &str| {
            let mut s = streams.lock().unwrap();
            if !s.2 {
                s.2 = true;
                std::thread::sleep(first_delay);
            }
            match stream {
                OutputStream::Stdout => s.0.extend_from_slice(chunk.as_bytes()),
                OutputStream::Stderr => s.1.extend_from_slice(chunk.as_bytes()),
            }
        })
    }

    fn stdout(&self) -> Vec<u8> {
        self.streams.lock().unwrap().0.clone()
    }

    fn stderr(&self) -> Vec<u8> {
        self.streams.lock().unwrap().1.clone()
    }
}

fn command(script: &str) -> ExecuteRequest {
    test_support::sh(script).timeout_ms(300_000)
}

/// `seq 1 n` as it prints it.
fn seq_text(n: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(n as usize * 8);
    for i in 1..=n {
        out.extend_from_slice(i.to_string().as_bytes());
        out.push(b'\n');
    }
    out
}

/// Deterministic pseudo-random bytes (xorshift), so the expected output
/// is known without reading anything back from the sandbox.
fn random_bytes(len: usize, mut state: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// `base64 -w 100` of `bytes`.
fn base64_lines(bytes: &[u8]) -> Vec<u8> {
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    let mut out = Vec::with_capacity(encoded.len() + encoded.len() / 100 + 1);
    for line in encoded.as_bytes().chunks(100) {
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out
}

/// An outcome's error, short (without the partial output it carries).
fn short(provider: Provider, error: &ProviderError) -> String {
    let text = format!("{provider:?}: {error:?}");
    text.chars().take(400).collect()
}

/// Where two byte strings first differ, for a readable failure.
fn assert_same(what: &str, got: &[u8], want: &[u8]) {
    if got == want {
        return;
    }
    let at = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    panic!(
        "{what}: {} bytes received, {} expected; first difference at byte {at}",
        got.len(),
        want.len()
    );
}

fn large_random_base64_is_byte_exact(provider: Provider) {
    let local = Local::start(provider);
    let lease = local.acquire();
    // 37.5 MB of random bytes: 50.6 MB of base64 lines.
    let input = random_bytes(37_500_000, 0x9e37_79b9_7f4a_7c15);
    let want = base64_lines(&input);
    let mut request = command("base64 -w 100");
    request.stdin = Some(input);
    let (outcome, live) = local.run(&lease, &request, Duration::ZERO);
    let result = outcome.unwrap_or_else(|e| panic!("{}", short(provider, &e)));
    assert_eq!(result.exit_code, Some(0), "{provider:?}");
    assert_same(&format!("{provider:?} live stdout"), &live.stdout(), &want);
    assert!(live.stderr().is_empty(), "{provider:?}");
    // The result keeps the last 4 Mi characters, and says so.
    assert!(result.output_truncated, "{provider:?}");
    assert!(want.ends_with(result.stdout.as_bytes()), "{provider:?}");
    local.server.shutdown();
}

#[test]
fn fifty_megabytes_of_random_base64_arrive_byte_exact_on_createos() {
    large_random_base64_is_byte_exact(Provider::CreateOs);
}

#[test]
fn fifty_megabytes_of_random_base64_arrive_byte_exact_on_daytona() {
    large_random_base64_is_byte_exact(Provider::Daytona);
}

fn seq_three_million_is_byte_exact(provider: Provider) {
    let local = Local::start(provider);
    let lease = local.acquire();
    let (outcome, live) = local.run(&lease, &command("seq 1 3000000"), Duration::ZERO);
    let result = outcome.unwrap_or_else(|e| panic!("{}", short(provider, &e)));
    assert_eq!(result.exit_code, Some(0), "{provider:?}");
    assert_same(
        &format!("{provider:?} live stdout"),
        &live.stdout(),
        &seq_text(3_000_000),
    );
    local.server.shutdown();
}

#[test]
fn seq_to_three_million_arrives_byte_exact_on_createos() {
    seq_three_million_is_byte_exact(Provider::CreateOs);
}

#[test]
fn seq_to_three_million_arrives_byte_exact_on_daytona() {
    seq_three_million_is_byte_exact(Provider::Daytona);
}

fn both_streams_complete_and_separate(provider: Provider) {
    let local = Local::start(provider);
    let lease = local.acquire();
    // 10 MB on each stream, written at the same time.
    let (outcome, live) = local.run(
        &lease,
        &command("seq 1 1300000 & seq 2000001 3300000 >&2; wait"),
        Duration::ZERO,
    );
    let result = outcome.unwrap_or_else(|e| panic!("{}", short(provider, &e)));
    assert_eq!(result.exit_code, Some(0), "{provider:?}");
    let want_out = seq_text(1_300_000);
    let want_err: Vec<u8> = (2_000_001..=3_300_000u32)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect();
    assert!(want_out.len() > 9_000_000 && want_err.len() > 10_000_000);
    assert_same(&format!("{provider:?} stdout"), &live.stdout(), &want_out);
    assert_same(&format!("{provider:?} stderr"), &live.stderr(), &want_err);
    local.server.shutdown();
}

#[test]
fn ten_megabytes_on_each_stream_arrive_complete_and_apart_on_createos() {
    both_streams_complete_and_separate(Provider::CreateOs);
}

#[test]
fn ten_megabytes_on_each_stream_arrive_complete_and_apart_on_daytona() {
    both_streams_complete_and_separate(Provider::Daytona);
}

fn a_consumer_that_sleeps_first_gets_every_byte(provider: Provider) {
    let local = Local::start(provider);
    let lease = local.acquire();
    // The sink blocks 3 s on its first chunk: meanwhile the command keeps
    // printing, far more than the journal holds.
    let (outcome, live) = local.run(&lease, &command("seq 1 1000000"), Duration::from_secs(3));
    let result = outcome.unwrap_or_else(|e| panic!("{}", short(provider, &e)));
    assert_eq!(result.exit_code, Some(0), "{provider:?}");
    assert_same(
        &format!("{provider:?} live stdout"),
        &live.stdout(),
        &seq_text(1_000_000),
    );
    local.server.shutdown();
}

#[test]
fn a_consumer_sleeping_three_seconds_first_gets_every_byte_on_createos() {
    a_consumer_that_sleeps_first_gets_every_byte(Provider::CreateOs);
}

#[test]
fn a_consumer_sleeping_three_seconds_first_gets_every_byte_on_daytona() {
    a_consumer_that_sleeps_first_gets_every_byte(Provider::Daytona);
}

fn ten_concurrent_commands_complete(provider: Provider) {
    let local = Local::start(provider);
    let leases: Vec<String> = (0..10).map(|_| local.acquire()).collect();
    // About 20 MB each.
    let want = seq_text(2_700_000);
    assert!(want.len() > 20_000_000);
    std::thread::scope(|scope| {
        let runs: Vec<_> = leases
            .iter()
            .map(|lease| {
                let local = &local;
                scope.spawn(move || local.run(lease, &command("seq 1 2700000"), Duration::ZERO))
            })
            .collect();
        for (i, run) in runs.into_iter().enumerate() {
            let (outcome, live) = run.join().unwrap();
            let result = outcome.unwrap_or_else(|e| panic!("#{i} {}", short(provider, &e)));
            assert_eq!(result.exit_code, Some(0), "{provider:?} #{i}");
            assert_same(&format!("{provider:?} #{i}"), &live.stdout(), &want);
        }
    });
    local.server.shutdown();
}

#[test]
fn ten_concurrent_twenty_megabyte_commands_all_complete_on_createos() {
    ten_concurrent_commands_complete(Provider::CreateOs);
}

#[test]
fn ten_concurrent_twenty_megabyte_commands_all_complete_on_daytona() {
    ten_concurrent_commands_complete(Provider::Daytona);
}

/// Bad input: a consumer that takes each chunk slowly (one per 500 ms)
/// holds the command back but does not keep it past its timeout: the
/// result is a timeout, after the command's tree was removed.
fn a_stalled_consumer_does_not_outlive_the_timeout(provider: Provider) {
    let local = Local::start(provider);
    let lease = local.acquire();
    let mut request = command("yes");
    request.timeout_ms = Some(3_000);
    let live = Live::default();
    let slow = {
        let inner = live.sink(Duration::ZERO);
        let sink: OutputSink = Arc::new(move |stream, chunk: &str| {
            std::thread::sleep(Duration::from_millis(500));
            inner(stream, chunk);
        });
        sink
    };
    let outcome = local
        .runtime
        .execute(&local.env, &lease, &request, Some(slow), CancelToken::new())
        .unwrap();
    let result = outcome.unwrap_or_else(|e| panic!("{}", short(provider, &e)));
    assert!(result.timed_out, "{provider:?}");
    assert!(!live.stdout().is_empty(), "{provider:?}");
    assert!(local.server.shutdown().all_exited(), "{provider:?}");
}

#[test]
fn a_stalled_consumer_does_not_outlive_the_timeout_on_createos() {
    a_stalled_consumer_does_not_outlive_the_timeout(Provider::CreateOs);
}

#[test]
fn a_stalled_consumer_does_not_outlive_the_timeout_on_daytona() {
    a_stalled_consumer_does_not_outlive_the_timeout(Provider::Daytona);
}
