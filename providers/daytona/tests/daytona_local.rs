//! The Daytona component under the real host (`SandboxRuntime`: policy,
//! secrets, lease store) against createos-local's Daytona face with real
//! processes: the API and the toolbox on two origins, the key injected by
//! the host as a Bearer token to both and never seen by the component.

// `ProviderError` is the contract's variant, returned as it is.
#![allow(clippy::result_large_err)]

use sandbox_engine::{FaultAction, FaultRule};
use sandbox_host::types::*;
use sandbox_host::{CancelToken, LeaseState, OutputCapture};
use test_support::local::{Face, LocalRuntime};
use test_support::RequestExt;

const KEY: &str = "daytona-local-key-7d21";

/// The engine's Daytona face and a runtime of the Daytona component;
/// `extra` adds to the provider config.
fn start(extra: serde_json::Value) -> LocalRuntime {
    LocalRuntime::start(Face::Daytona, KEY, "env-daytona", extra)
}

/// A lease whose workspace is `project`.
fn acquire(local: &LocalRuntime) -> String {
    let mut request = test_support::acquire("run");
    request.requested_cwd = Some("project".into());
    local.acquire(&request)
}

fn command(program: &str, args: &[&str]) -> ExecuteRequest {
    test_support::command(program, args).timeout_ms(30_000)
}

#[test]
fn a_command_runs_with_its_input_environment_and_exit_code() {
    let local = start(serde_json::json!({}));
    let lease = acquire(&local);
    let mut request = command(
        "/bin/sh",
        &["-c", "pwd; cat; echo \"$GREETING\" >&2; exit 3"],
    );
    request.env = vec![("GREETING".into(), "héllo 'there'".into())];
    request.stdin = Some(b"from stdin\n".to_vec());
    let result = local.execute(&lease, &request, None).expect("runs");
    assert_eq!(result.exit_code, Some(3), "{result:?}");
    assert!(!result.timed_out);
    assert!(
        result
            .stdout
            .ends_with("/paperclip-workspace/project\nfrom stdin\n"),
        "{result:?}"
    );
    assert_eq!(result.stderr, "héllo 'there'\n");
    // Both origins received the key, as a Bearer token the host added.
    let requests = local.server.faults().requests();
    assert!(requests
        .iter()
        .any(|r| r.path.starts_with("/daytona/api/sandbox")));
    assert!(requests.iter().any(|r| r.path.starts_with("/toolbox/")));
    let destroyed = local.runtime.destroy(&local.env, &lease).unwrap().unwrap();
    assert_eq!(destroyed.action, TerminationAction::Deleted);
    assert!(local.server.shutdown().all_exited());
}

#[test]
fn live_output_arrives_before_the_result_and_a_timeout_leaves_nothing() {
    let local = start(serde_json::json!({}));
    let lease = acquire(&local);
    let output = OutputCapture::new();
    let marker = format!("daytona-timeout-{}", std::process::id());
    let mut request = command("/bin/sh", &["-c", "echo started; exec sleep 1000", &marker]);
    request.timeout_ms = Some(1_500);
    let result = local
        .runtime
        .execute(
            &local.env,
            &lease,
            &request,
            Some(output.sink()),
            CancelToken::new(),
        )
        .unwrap()
        .expect("a timeout is a result");
    assert!(result.timed_out, "{result:?}");
    assert_eq!(result.stdout, "started\n");
    assert!(output.text(OutputStream::Stdout).contains("started"));
    local.runtime.destroy(&local.env, &lease).unwrap().unwrap();
    let report = local.server.shutdown();
    assert!(report.all_exited(), "{report:?}");
}

#[test]
fn a_reusable_lease_is_stopped_and_started_again() {
    let local = start(serde_json::json!({"reuseLease": true}));
    let lease = acquire(&local);
    local
        .execute(
            &lease,
            &command("/bin/sh", &["-c", "echo kept > kept.txt"]),
            None,
        )
        .unwrap();
    let receipt = local.runtime.release(&local.env, &lease).unwrap().unwrap();
    assert_eq!(receipt.action, TerminationAction::Paused);
    let resumed = local.runtime.resume(&local.env, &lease).unwrap().unwrap();
    assert!(matches!(resumed, ResumeOutcome::Resumed(_)), "{resumed:?}");
    let result = local
        .execute(&lease, &command("cat", &["kept.txt"]), None)
        .unwrap();
    assert_eq!(result.stdout, "kept\n");
    local.runtime.destroy(&local.env, &lease).unwrap().unwrap();
}

/// A session delete that fails leaves the command's processes running:
/// `cleanup-failed`, the lease poisoned; sweep destroys the sandbox once the
/// fault is gone, and nothing survives. (The session is deleted when the
/// command timed out; after a normal exit it is kept, see
/// `a_normal_exit_keeps_the_session_and_its_background_processes`.)
#[test]
fn an_unconfirmed_session_delete_poisons_the_lease_and_sweep_cleans_up() {
    let local = start(serde_json::json!({}));
    let lease = acquire(&local);
    local.server.faults().add(
        FaultRule::new(
            "DELETE",
            "/toolbox/*/process/session/*",
            FaultAction::Status { status: 503 },
        )
        .always(),
    );
    let mut request = command("/bin/sh", &["-c", "sleep 1000 & echo bg; sleep 1000"]);
    request.timeout_ms = Some(2_000);
    let error = local.execute(&lease, &request, None).unwrap_err();
    assert!(
        matches!(&error, ProviderError::CleanupFailed(f) if f.phase == CleanupPhase::ProcessTermination),
        "{error:?}"
    );
    let record = local.runtime.store().get(&lease).unwrap().unwrap();
    assert_eq!(record.state, LeaseState::Poisoned);
    let refused = local.runtime.execute(
        &local.env,
        &lease,
        &command("true", &[]),
        None,
        CancelToken::new(),
    );
    assert!(refused.is_err(), "a poisoned lease ran a command");
    local.server.faults().clear();
    let swept = local.runtime.sweep(&local.env).unwrap();
    assert_eq!(swept.len(), 1);
    assert!(swept[0].1.is_ok(), "{:?}", swept[0].1);
    let report = local.server.shutdown();
    assert!(report.all_exited(), "{report:?}");
}

/// Waits up to 30 s for `done`.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !done() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    true
}

/// The host's processes whose command line is exactly `words`.
fn processes(words: &[&str]) -> usize {
    test_support::procs::exact(words).len()
}

/// Issue 25 through the Daytona component: a command that exits normally
/// keeps its session, so what it left in the background keeps running
/// (as on the service, where only a session delete terminates it); the
/// lease's destruction ends it.
#[test]
fn a_normal_exit_keeps_the_session_and_its_background_processes() {
    let local = start(serde_json::json!({}));
    let lease = acquire(&local);
    let tag = format!("3000.{}", std::process::id());
    let result = local
        .execute(
            &lease,
            &command("/bin/sh", &["-c", &format!("sleep {tag} & echo bg")]),
            None,
        )
        .unwrap();
    assert_eq!(
        (result.exit_code, result.stdout.as_str()),
        (Some(0), "bg\n")
    );
    assert_eq!(
        local
            .server
            .faults()
            .count("DELETE", "/toolbox/*/process/session/*"),
        0
    );
    assert!(eventually(|| processes(&["sleep", &tag]) == 1));
    local.runtime.destroy(&local.env, &lease).unwrap().unwrap();
    assert!(eventually(|| processes(&["sleep", &tag]) == 0));
    let report = local.server.shutdown();
    assert!(report.all_exited(), "{report:?}");
}
