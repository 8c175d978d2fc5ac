//! Issue 23, "Bad input", for the library host: an embedder's output sink
//! that never returns (a reader that is never resumed) must not keep the
//! command blocked forever. The command's own timeout still ends it (its
//! tree deleted with proof), and the outcome says how many bytes the sink
//! did not consume: never a clean result. Against the real local engine,
//! both providers.

// `ProviderError` is the contract's variant, returned as it is.
#![allow(clippy::result_large_err)]

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandbox_host::types::*;
use sandbox_host::{loss_text, OutputSink};
use serde_json::json;
use test_support::local::{Face, LocalRuntime};
use test_support::requests::{self, RequestExt};

const KEY: &str = "output-unconsumed-key-93d1";

#[derive(Clone, Copy, Debug)]
enum Provider {
    CreateOs,
    Daytona,
}

fn start(provider: Provider) -> Arc<LocalRuntime> {
    let face = match provider {
        Provider::CreateOs => Face::CreateOs,
        Provider::Daytona => Face::Daytona,
    };
    Arc::new(LocalRuntime::start(face, KEY, "env-unconsumed", json!({})))
}

/// Stops the engine once the runner thread let go of `local`: whether
/// every process it started exited.
fn shut_down(mut local: Arc<LocalRuntime>) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match Arc::try_unwrap(local) {
            Ok(only) => return only.server.shutdown().all_exited(),
            Err(shared) if Instant::now() < deadline => {
                local = shared;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(_) => panic!("the runner thread still holds the engine after 30 s"),
        }
    }
}

/// A sink that takes nothing: its first call blocks until the test drops
/// the returned sender (a reader that is never resumed).
fn stuck_sink() -> (OutputSink, Sender<()>, Arc<Mutex<bool>>) {
    let (release, wait): (Sender<()>, Receiver<()>) = mpsc::channel();
    let wait = Mutex::new(wait);
    let called = Arc::new(Mutex::new(false));
    let seen = called.clone();
    let sink: OutputSink = Arc::new(move |_, _| {
        *seen.lock().unwrap() = true;
        let _ = wait.lock().unwrap().recv();
    });
    (sink, release, called)
}

/// Runs `script` with a stuck sink and `timeout_ms`; fails (instead of
/// hanging) when the outcome does not come within two minutes.
fn run_stuck(
    local: &Arc<LocalRuntime>,
    script: &str,
    timeout_ms: u64,
) -> (Result<ExecuteResult, ProviderError>, Duration) {
    let lease = local.acquire(&requests::acquire("run"));
    let request = requests::sh(script).timeout_ms(timeout_ms);
    let (sink, release, called) = stuck_sink();
    let (done, outcome) = mpsc::channel();
    let runner = local.clone();
    let started = Instant::now();
    std::thread::spawn(move || {
        let _ = done.send(runner.execute(&lease, &request, Some(sink)));
    });
    let outcome = outcome
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| {
            panic!(
                "execute still running 120 s after its {timeout_ms} ms timeout: a sink that \
                 never returns held the command (sink called: {})",
                called.lock().unwrap()
            )
        });
    let took = started.elapsed();
    drop(release);
    (outcome, took)
}

fn unconsumed(outcome: Result<ExecuteResult, ProviderError>, provider: Provider) -> OutputLoss {
    match outcome {
        Err(ProviderError::OutputLost(loss)) => loss,
        Ok(result) => panic!(
            "{provider:?}: a clean result (exit {:?}, timed out {}) although the sink consumed \
             nothing",
            result.exit_code, result.timed_out
        ),
        Err(other) => panic!("{provider:?}: {}", sandbox_host::error_text(&other)),
    }
}

/// `yes` into a sink that never returns: the command blocks on its full
/// pipe, its 3 s timeout ends it anyway, its tree is gone, and the outcome
/// is an output loss that counts the bytes the sink never took.
fn a_never_resumed_sink_does_not_hold_the_command(provider: Provider) {
    let local = start(provider);
    let (outcome, took) = run_stuck(&local, "yes", 3_000);
    let loss = unconsumed(outcome, provider);
    assert!(loss.tree_deleted, "{provider:?}: {}", loss_text(&loss));
    assert!(loss.partial.timed_out, "{provider:?}: {}", loss_text(&loss));
    assert!(
        loss.lost_bytes.is_some_and(|n| n > 0),
        "{provider:?}: {}",
        loss_text(&loss)
    );
    let text = loss_text(&loss);
    assert!(text.contains("not consumed"), "{text}");
    assert!(!text.contains("server dropped"), "{text}");
    assert!(
        took < Duration::from_secs(60),
        "{provider:?}: took {took:?}"
    );
    assert!(shut_down(local), "{provider:?}");
}

#[test]
fn a_sink_that_never_returns_does_not_hold_the_command_past_its_timeout_on_createos() {
    a_never_resumed_sink_does_not_hold_the_command(Provider::CreateOs);
}

#[test]
fn a_sink_that_never_returns_does_not_hold_the_command_past_its_timeout_on_daytona() {
    a_never_resumed_sink_does_not_hold_the_command(Provider::Daytona);
}

/// A command that prints a line and exits 0 while the sink takes nothing:
/// the outcome is not a clean exit 0 but says the 6 bytes were not consumed.
fn a_short_command_is_not_clean_when_its_output_was_not_consumed(provider: Provider) {
    let local = start(provider);
    let (outcome, _) = run_stuck(&local, "echo hello", 2_000);
    let loss = unconsumed(outcome, provider);
    assert_eq!(
        loss.lost_bytes,
        Some(6),
        "{provider:?}: {}",
        loss_text(&loss)
    );
    assert!(loss.tree_deleted, "{provider:?}");
    assert!(!loss.partial.timed_out, "{provider:?}");
    assert_eq!(loss.partial.stdout, "hello\n", "{provider:?}");
    assert!(shut_down(local), "{provider:?}");
}

#[test]
fn output_a_sink_never_took_is_never_a_clean_exit_on_createos() {
    a_short_command_is_not_clean_when_its_output_was_not_consumed(Provider::CreateOs);
}

#[test]
fn output_a_sink_never_took_is_never_a_clean_exit_on_daytona() {
    a_short_command_is_not_clean_when_its_output_was_not_consumed(Provider::Daytona);
}

/// A sink that fails (panics on its first chunk) can take nothing more.
/// Before, the relay only counted what followed, so `yes` ran on until its
/// 300 s timeout with its output going nowhere. Now the command is
/// cancelled at once, its tree deleted with proof, and the outcome is the
/// output loss at the sink (never `cancelled`, which the embedder did not
/// ask for, nor a clean result).
fn a_failing_sink_stops_the_command_at_once(provider: Provider) {
    let local = start(provider);
    let lease = local.acquire(&requests::acquire("run"));
    let request = requests::sh("exec yes failing-sink-marker").timeout_ms(300_000);
    let sink: OutputSink = Arc::new(|_, _| panic!("the embedder's log store is gone"));
    let (done, outcome) = mpsc::channel();
    let runner = local.clone();
    std::thread::spawn(move || {
        let _ = done.send(runner.execute(&lease, &request, Some(sink)));
    });
    let outcome = outcome
        .recv_timeout(Duration::from_secs(90))
        .unwrap_or_else(|_| panic!("{provider:?}: still running 90 s after its sink failed"));
    let loss = unconsumed(outcome, provider);
    assert_eq!(loss.operation, sandbox_host::OUTPUT_SINK, "{provider:?}");
    assert!(loss.tree_deleted, "{provider:?}: {}", loss_text(&loss));
    assert!(
        !loss.partial.timed_out,
        "{provider:?}: {}",
        loss_text(&loss)
    );
    assert!(
        loss.lost_bytes.is_some_and(|n| n > 0),
        "{provider:?}: {}",
        loss_text(&loss)
    );
    assert!(shut_down(local), "{provider:?}");
}

#[test]
fn a_failing_sink_stops_the_command_at_once_on_createos() {
    a_failing_sink_stops_the_command_at_once(Provider::CreateOs);
}

#[test]
fn a_failing_sink_stops_the_command_at_once_on_daytona() {
    a_failing_sink_stops_the_command_at_once(Provider::Daytona);
}
