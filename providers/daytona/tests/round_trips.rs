//! Issue 25 (performance): how many toolbox requests one command of the
//! Daytona component costs against the local engine, counted by the
//! engine's own request record. Each round trip is a CLI's wait; none may
//! be cut that a proof needs (a confirmed exit with all of its output, a
//! confirmed session delete after a timeout).

use serde_json::json;
use test_support::local::{Face, LocalRuntime};
use test_support::requests::{self, RequestExt};

const KEY: &str = "daytona-trips-key-51c0";

/// The toolbox requests `local`'s engine recorded since the last call, as
/// `METHOD kind` (the ids left out).
fn toolbox_requests(local: &LocalRuntime) -> Vec<String> {
    let faults = local.server.faults();
    let all = faults.requests();
    faults.clear_requests();
    all.iter()
        .filter(|r| r.path.starts_with("/toolbox/"))
        .map(|r| {
            let kind = r.path.rsplit('/').next().unwrap_or_default();
            format!("{} {kind}", r.method)
        })
        .collect()
}

/// On the local engine a followed logs body ends only once the command
/// exited and all of its output was sent (its offset header says it is
/// that engine): the exit code read after it is the proof, and a second
/// logs read would answer nothing new. One command is four requests:
/// session, exec, followed logs, exit code (it was five, with that last
/// read). The output and the exit code are whole all the same.
#[test]
fn a_command_costs_four_toolbox_requests_on_the_local_engine() {
    let local = LocalRuntime::start(Face::Daytona, KEY, "env-daytona", json!({}));
    let lease = local.acquire(&requests::acquire("run"));
    toolbox_requests(&local);
    let script = "printf out; printf err >&2; i=0; while [ $i -lt 3 ]; do echo line$i; i=$((i+1)); done; exit 3";
    let result = local
        .execute(&lease, &requests::sh(script).timeout_ms(30_000), None)
        .expect("the command ran");
    assert_eq!(
        (
            result.exit_code,
            result.stdout.as_str(),
            result.stderr.as_str()
        ),
        (Some(3), "outline0\nline1\nline2\n", "err")
    );
    assert_eq!(
        toolbox_requests(&local),
        [
            "POST session".to_string(),
            "POST exec".to_string(),
            "GET logs".to_string(),
            // The command's record: `GET .../command/{cmdId}`.
            format!("GET {}", result.process_id),
        ],
    );
    // A timeout still ends with the confirmed session delete.
    let result = local
        .execute(
            &lease,
            &requests::sh("echo started; sleep 30").timeout_ms(1_000),
            None,
        )
        .expect("the command ran");
    assert!(result.timed_out, "{result:?}");
    let trips = toolbox_requests(&local);
    assert!(
        trips.last().is_some_and(|t| t.starts_with("DELETE ")),
        "no session delete after a timeout: {trips:?}"
    );
    local.runtime.destroy(&local.env, &lease).unwrap().unwrap();
    let report = local.server.shutdown();
    assert!(report.all_exited(), "{report:?}");
}
