//! A `sandbox` process killed mid-command, against a real backend
//! (createos-local in this test process) and the durable lease store.
//! Skipped until ./build.sh has built the provider.

#![cfg(feature = "local-backend")]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use sandbox_engine::{BackgroundServer, Server};
use test_support::cli::{key_dir, SandboxCli};
use test_support::eventually;
use test_support::procs::exact;

mod common;

const KEY: &str = "host-death-key";
/// The liveness settings the CLIs run with: a host whose heartbeat is
/// older than the expiry is gone.
const HEARTBEAT: &str = "100ms";
const EXPIRY: &str = "1s";

/// The CLI as one host runs it: its own data directory, the key in a
/// file, the short liveness settings.
fn cli(provider: PathBuf, server: &BackgroundServer, name: &str) -> SandboxCli {
    let dir = key_dir(&format!("sandbox-death-{name}"), KEY);
    test_support::sandbox_cli!("sandbox-death")
        .data_dir(dir.join("data"))
        .provider(provider)
        .env("SANDBOX_HEARTBEAT", HEARTBEAT)
        .env("SANDBOX_HOST_EXPIRY", EXPIRY)
        .api(server.base_url(), dir.join("key"))
}

/// Pins issue 9 item 1: a lease whose command may still run was reused
/// after its host died. Today a `kill -9` of the CLI mid-command leaves a
/// busy mark with a dead pid that the next `lease exec` silently overwrites
/// (and the command keeps running). Required: the next operation finds the
/// mark of a host whose heartbeat expired, poisons the lease durably and
/// refuses with a message naming the fix; `sweep` then destroys the
/// sandbox and nothing of the command survives.
#[test]
fn a_cli_killed_mid_command_poisons_its_lease_and_sweep_kills_the_command() {
    let provider = common::built_provider();
    let server = BackgroundServer::start(Server::builder().api_key(KEY).quiet(true)).unwrap();
    let cli = cli(provider, &server, "kill9");

    let lease = cli.acquire();

    let duration = format!("1000.{}", std::process::id());
    let mut doomed = cli.exec_sleeper(&lease, &duration);
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    // `started` is printed before the shell execs `sleep`: wait for it.
    eventually(Duration::from_secs(30), || {
        !exact(&["sleep", &duration]).is_empty()
    });
    assert_eq!(
        exact(&["sleep", &duration]).len(),
        1,
        "the command must still run after its CLI was killed (the scenario)"
    );

    // Past the dead host's expiry: its mark is the mark of a gone host.
    std::thread::sleep(Duration::from_millis(1500));
    let refused = cli.output(&["lease", "exec", &lease, "--", "true"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "reused a lease in doubt: {refused:?}"
    );
    assert!(
        stderr.contains("sandbox lease destroy") || stderr.contains("sandbox lease sweep"),
        "{stderr}"
    );
    assert_eq!(cli.lease_state(&lease), "poisoned");

    let swept = cli.output(&["lease", "sweep"]);
    assert!(swept.status.success(), "{swept:?}");
    assert_eq!(cli.lease_state(&lease), "destroyed");
    assert!(
        exact(&["sleep", &duration]).is_empty(),
        "the dead host's command survived the sweep"
    );
    let report = server.shutdown();
    assert!(report.all_exited(), "{report:?}");
}

/// Pins the gap left in issue 9 item 4: a host that died mid-probe (or
/// mid-acquire) after the sandbox was created left a record that sweep
/// could only mark `unknown` ("no id to clean it up with"), and the
/// sandbox stayed. With contract 0.2.0 the provider reports the sandbox id
/// through `host.record-sandbox` as soon as it exists; the host writes it
/// to the store first, so `sweep` on a later CLI deletes that sandbox.
#[test]
fn a_cli_killed_mid_probe_leaves_a_sandbox_that_sweep_deletes() {
    use sandbox_engine::{FaultAction, FaultRule};
    let provider = common::built_provider();
    let server = BackgroundServer::start(Server::builder().api_key(KEY).quiet(true)).unwrap();
    // The probe's command never starts: the CLI is still inside the probe,
    // with its sandbox created, when it is killed.
    server.faults().add(FaultRule::new(
        "POST",
        "/v1/sandboxes/*/exec",
        FaultAction::Delay { ms: 120_000 },
    ));
    let cli = cli(provider, &server, "probe-kill9");
    let mut doomed = cli
        .command(&["probe"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The host has recorded the probe's sandbox (what the provider reported
    // through `host.record-sandbox`) once the record shows its id.
    let recorded = || {
        cli.leases().iter().any(|l| {
            l["runId"] == "probe" && l["providerLeaseId"].is_string() && l["state"] == "acquiring"
        })
    };
    while !recorded() {
        if let Some(status) = doomed.try_wait().unwrap() {
            let mut stderr = String::new();
            std::io::Read::read_to_string(&mut doomed.stderr.take().unwrap(), &mut stderr).unwrap();
            panic!("the probe ended ({status}) before its sandbox was recorded: {stderr}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    assert_eq!(server.faults().count("DELETE", "/v1/sandboxes/*"), 0);

    // Past the dead host's expiry, sweep finds the probe's sandbox.
    std::thread::sleep(Duration::from_millis(1500));
    let swept = cli.output(&["lease", "sweep"]);
    assert!(swept.status.success(), "{swept:?}");
    assert_eq!(server.faults().count("DELETE", "/v1/sandboxes/*"), 1);
    let leases = cli.leases();
    let probe = leases
        .iter()
        .find(|l| l["runId"] == "probe")
        .unwrap_or_else(|| panic!("no probe record in {leases:?}"));
    assert_eq!(probe["state"], "destroyed", "{probe}");
    let report = server.shutdown();
    assert!(report.all_exited(), "{report:?}");
}
