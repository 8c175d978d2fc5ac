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
use sandbox_host::types::*;
use sandbox_host::OutputSink;
use test_support::local::{Face, LocalRuntime};
use test_support::RequestExt;

const KEY: &str = "output-volume-key-51c7";

/// The engine at its default journal, and a runtime of the provider of
/// `face` (5 min command, 30 s request timeouts).
fn start(face: Face) -> LocalRuntime {
    LocalRuntime::start(
        face,
        KEY,
        "env-output",
        serde_json::json!({"timeoutMs": 300_000, "requestTimeoutMs": 30_000}),
    )
}

/// Runs `request` with a live sink that records both streams; the sink
/// sleeps `first_delay` before taking its first chunk (a consumer that is
/// not reading yet).
fn run(
    local: &LocalRuntime,
    lease: &str,
    request: &ExecuteRequest,
    first_delay: Duration,
) -> (Result<ExecuteResult, ProviderError>, Live) {
    let live = Live::default();
    let outcome = local.execute(lease, request, Some(live.sink(first_delay)));
    (outcome, live)
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
        Arc::new(move |stream, chunk: &[u8]| {
            let mut s = streams.lock().unwrap();
            if !s.2 {
                s.2 = true;
                std::thread::sleep(first_delay);
            }
            match stream {
                OutputStream::Stdout | OutputStream::Terminal => s.0.extend_from_slice(chunk),
                OutputStream::Stderr => s.1.extend_from_slice(chunk),
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
fn short(face: Face, error: &ProviderError) -> String {
    let text = format!("{face:?}: {error:?}");
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

fn large_random_base64_is_byte_exact(face: Face) {
    let local = start(face);
    let lease = local.acquire(&test_support::acquire("run"));
    // 37.5 MB of random bytes: 50.6 MB of base64 lines.
    let input = random_bytes(37_500_000, 0x9e37_79b9_7f4a_7c15);
    let want = base64_lines(&input);
    let mut request = command("base64 -w 100");
    request.stdin = Some(input);
    let (outcome, live) = run(&local, &lease, &request, Duration::ZERO);
    let result = outcome.unwrap_or_else(|e| panic!("{}", short(face, &e)));
    assert_eq!(result.exit_code, Some(0), "{face:?}");
    assert_same(&format!("{face:?} live stdout"), &live.stdout(), &want);
    assert!(live.stderr().is_empty(), "{face:?}");
    // The result keeps the last 4 Mi characters, and says so.
    assert!(result.output_truncated, "{face:?}");
    assert!(want.ends_with(result.stdout.as_bytes()), "{face:?}");
    local.server.shutdown();
}

#[test]
fn fifty_megabytes_of_random_base64_arrive_byte_exact_on_createos() {
    large_random_base64_is_byte_exact(Face::CreateOs);
}

#[test]
fn fifty_megabytes_of_random_base64_arrive_byte_exact_on_daytona() {
    large_random_base64_is_byte_exact(Face::Daytona);
}

fn seq_three_million_is_byte_exact(face: Face) {
    let local = start(face);
    let lease = local.acquire(&test_support::acquire("run"));
    let (outcome, live) = run(&local, &lease, &command("seq 1 3000000"), Duration::ZERO);
    let result = outcome.unwrap_or_else(|e| panic!("{}", short(face, &e)));
    assert_eq!(result.exit_code, Some(0), "{face:?}");
    assert_same(
        &format!("{face:?} live stdout"),
        &live.stdout(),
        &seq_text(3_000_000),
    );
    local.server.shutdown();
}

#[test]
fn seq_to_three_million_arrives_byte_exact_on_createos() {
    seq_three_million_is_byte_exact(Face::CreateOs);
}

#[test]
fn seq_to_three_million_arrives_byte_exact_on_daytona() {
    seq_three_million_is_byte_exact(Face::Daytona);
}

fn both_streams_complete_and_separate(face: Face) {
    let local = start(face);
    let lease = local.acquire(&test_support::acquire("run"));
    // 10 MB on each stream, written at the same time.
    let (outcome, live) = run(
        &local,
        &lease,
        &command("seq 1 1300000 & seq 2000001 3300000 >&2; wait"),
        Duration::ZERO,
    );
    let result = outcome.unwrap_or_else(|e| panic!("{}", short(face, &e)));
    assert_eq!(result.exit_code, Some(0), "{face:?}");
    let want_out = seq_text(1_300_000);
    let want_err: Vec<u8> = (2_000_001..=3_300_000u32)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect();
    assert!(want_out.len() > 9_000_000 && want_err.len() > 10_000_000);
    assert_same(&format!("{face:?} stdout"), &live.stdout(), &want_out);
    assert_same(&format!("{face:?} stderr"), &live.stderr(), &want_err);
    local.server.shutdown();
}

#[test]
fn ten_megabytes_on_each_stream_arrive_complete_and_apart_on_createos() {
    both_streams_complete_and_separate(Face::CreateOs);
}

#[test]
fn ten_megabytes_on_each_stream_arrive_complete_and_apart_on_daytona() {
    both_streams_complete_and_separate(Face::Daytona);
}

fn a_consumer_that_sleeps_first_gets_every_byte(face: Face) {
    let local = start(face);
    let lease = local.acquire(&test_support::acquire("run"));
    // The sink blocks 3 s on its first chunk: meanwhile the command keeps
    // printing, far more than the journal holds.
    let (outcome, live) = run(
        &local,
        &lease,
        &command("seq 1 1000000"),
        Duration::from_secs(3),
    );
    let result = outcome.unwrap_or_else(|e| panic!("{}", short(face, &e)));
    assert_eq!(result.exit_code, Some(0), "{face:?}");
    assert_same(
        &format!("{face:?} live stdout"),
        &live.stdout(),
        &seq_text(1_000_000),
    );
    local.server.shutdown();
}

#[test]
fn a_consumer_sleeping_three_seconds_first_gets_every_byte_on_createos() {
    a_consumer_that_sleeps_first_gets_every_byte(Face::CreateOs);
}

#[test]
fn a_consumer_sleeping_three_seconds_first_gets_every_byte_on_daytona() {
    a_consumer_that_sleeps_first_gets_every_byte(Face::Daytona);
}

fn ten_concurrent_commands_complete(face: Face) {
    let local = start(face);
    let leases: Vec<String> = (0..10)
        .map(|_| local.acquire(&test_support::acquire("run")))
        .collect();
    // About 20 MB each.
    let want = seq_text(2_700_000);
    assert!(want.len() > 20_000_000);
    std::thread::scope(|scope| {
        let runs: Vec<_> = leases
            .iter()
            .map(|lease| {
                let local = &local;
                scope.spawn(move || run(local, lease, &command("seq 1 2700000"), Duration::ZERO))
            })
            .collect();
        for (i, run) in runs.into_iter().enumerate() {
            let (outcome, live) = run.join().unwrap();
            let result = outcome.unwrap_or_else(|e| panic!("#{i} {}", short(face, &e)));
            assert_eq!(result.exit_code, Some(0), "{face:?} #{i}");
            assert_same(&format!("{face:?} #{i}"), &live.stdout(), &want);
        }
    });
    local.server.shutdown();
}

#[test]
fn ten_concurrent_twenty_megabyte_commands_all_complete_on_createos() {
    ten_concurrent_commands_complete(Face::CreateOs);
}

#[test]
fn ten_concurrent_twenty_megabyte_commands_all_complete_on_daytona() {
    ten_concurrent_commands_complete(Face::Daytona);
}

/// Bad input: a consumer that takes each chunk slowly (one per 500 ms)
/// holds the command back but does not keep it past its timeout: the
/// result is a timeout, after the command's tree was removed.
fn a_stalled_consumer_does_not_outlive_the_timeout(face: Face) {
    let local = start(face);
    let lease = local.acquire(&test_support::acquire("run"));
    let mut request = command("yes");
    request.timeout_ms = Some(3_000);
    let live = Live::default();
    let slow = {
        let inner = live.sink(Duration::ZERO);
        let sink: OutputSink = Arc::new(move |stream, chunk: &[u8]| {
            std::thread::sleep(Duration::from_millis(500));
            inner(stream, chunk);
        });
        sink
    };
    let outcome = local.execute(&lease, &request, Some(slow));
    let result = outcome.unwrap_or_else(|e| panic!("{}", short(face, &e)));
    assert!(result.timed_out, "{face:?}");
    assert!(!live.stdout().is_empty(), "{face:?}");
    assert!(local.server.shutdown().all_exited(), "{face:?}");
}

#[test]
fn a_stalled_consumer_does_not_outlive_the_timeout_on_createos() {
    a_stalled_consumer_does_not_outlive_the_timeout(Face::CreateOs);
}

#[test]
fn a_stalled_consumer_does_not_outlive_the_timeout_on_daytona() {
    a_stalled_consumer_does_not_outlive_the_timeout(Face::Daytona);
}
