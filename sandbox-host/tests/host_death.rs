//! A `sandbox` process killed mid-command, against a real backend
//! (createos-local in this test process) and the durable lease store.
//! Skipped until ./build.sh has built the provider.

#![cfg(feature = "local-backend")]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use createos_local::{BackgroundServer, Server};

mod common;

const KEY: &str = "host-death-key";
/// The liveness settings the CLIs run with: a host whose heartbeat is
/// older than the expiry is gone.
const HEARTBEAT: &str = "100ms";
const EXPIRY: &str = "1s";

fn provider() -> Option<PathBuf> {
    let wasm = common::workspace_dir().join("target/wasm32-wasip2/release/createos_provider.wasm");
    if wasm.is_file() {
        Some(wasm)
    } else {
        eprintln!("skipped: {} not built yet (run ./build.sh)", wasm.display());
        None
    }
}

struct Cli {
    provider: PathBuf,
    data: PathBuf,
    key_file: PathBuf,
    api_url: String,
}

impl Cli {
    fn new(provider: PathBuf, server: &BackgroundServer, name: &str) -> Cli {
        let dir = std::env::temp_dir().join(format!("sandbox-death-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let key_file = dir.join("key");
        std::fs::write(&key_file, KEY).unwrap();
        Cli {
            provider,
            data: dir.join("data"),
            key_file,
            api_url: server.base_url(),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sandbox"));
        command
            .env("SANDBOX_PROVIDER", &self.provider)
            .env("SANDBOX_DATA_DIR", &self.data)
            .env("SANDBOX_HEARTBEAT", HEARTBEAT)
            .env("SANDBOX_HOST_EXPIRY", EXPIRY)
            .env_remove("CREATEOS_API_KEY")
            .stdin(Stdio::null())
            .arg("--api-url")
            .arg(&self.api_url)
            .arg("--api-key-file")
            .arg(&self.key_file)
            .args(args);
        command
    }

    fn output(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("running sandbox")
    }

    fn lease_state(&self, lease: &str) -> String {
        let output = self.output(&["lease", "list", "--json"]);
        assert!(output.status.success(), "{output:?}");
        let leases: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        leases
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["id"] == lease)
            .map(|l| l["state"].as_str().unwrap().to_owned())
            .unwrap_or_default()
    }
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
    let Some(provider) = provider() else { return };
    let server = BackgroundServer::start(Server::builder().api_key(KEY).quiet(true)).unwrap();
    let cli = Cli::new(provider, &server, "kill9");

    let acquired = cli.output(&["lease", "acquire"]);
    assert!(acquired.status.success(), "{acquired:?}");
    let lease = String::from_utf8(acquired.stdout)
        .unwrap()
        .trim()
        .to_owned();

    let duration = format!("1000.{}", std::process::id());
    let mut doomed = cli
        .command(&[
            "lease",
            "exec",
            &lease,
            "--",
            "sh",
            "-c",
            "echo started; exec sleep \"$0\"",
            &duration,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(doomed.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "started\n");
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    // `started` is printed before the shell execs `sleep`: wait for it.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while common::processes(&["sleep", &duration]).is_empty()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        common::processes(&["sleep", &duration]).len(),
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
        common::processes(&["sleep", &duration]).is_empty(),
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
    use createos_local::{FaultAction, FaultRule};
    let Some(provider) = provider() else { return };
    let server = BackgroundServer::start(Server::builder().api_key(KEY).quiet(true)).unwrap();
    // The probe's command never starts: the CLI is still inside the probe,
    // with its sandbox created, when it is killed.
    server.faults().add(FaultRule::new(
        "POST",
        "/v1/sandboxes/*/exec",
        FaultAction::Delay { ms: 120_000 },
    ));
    let cli = Cli::new(provider, &server, "probe-kill9");
    let mut doomed = cli
        .command(&["probe"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The host has recorded the probe's sandbox (what the provider reported
    // through `host.record-sandbox`) once the record shows its id.
    let recorded = || {
        let output = cli.output(&["lease", "list", "--json"]);
        let leases: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        leases.as_array().unwrap().iter().any(|l| {
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
    let output = cli.output(&["lease", "list", "--json"]);
    let leases: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let probe = leases
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["runId"] == "probe")
        .unwrap_or_else(|| panic!("no probe record in {leases}"));
    assert_eq!(probe["state"], "destroyed", "{probe}");
    let report = server.shutdown();
    assert!(report.all_exited(), "{report:?}");
}
