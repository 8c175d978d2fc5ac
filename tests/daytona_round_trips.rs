//! Issue 25 (performance): how many toolbox requests one command of the
//! Daytona component costs against the local engine, counted by the
//! engine's own request record. Each round trip is a CLI's wait; none may
//! be cut that a proof needs (a confirmed exit with all of its output, a
//! confirmed session delete after a timeout).

// `ProviderError` is the contract's variant, returned as it is.
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use sandbox_engine::{BackgroundServer, Server};
use sandbox_host::types::*;
use sandbox_host::{
    shared_engine, CancelToken, Environment, NetworkTransport, ProviderComponent, SandboxRuntime,
    Secrets, SqliteLeases,
};

const KEY: &str = "daytona-trips-key-51c0";

struct Local {
    server: BackgroundServer,
    runtime: SandboxRuntime,
    env: Environment,
}

impl Local {
    fn start() -> Local {
        let path = sandbox_conformance::built_component("daytona_provider.wasm");
        assert!(
            path.exists(),
            "{} is missing: run ./build.sh first",
            path.display()
        );
        let component = ProviderComponent::load(&shared_engine().unwrap(), &path).unwrap();
        let server =
            BackgroundServer::start(Server::builder().api_key(KEY).toolbox_port(0).quiet(true))
                .expect("server starts");
        let runtime = SandboxRuntime::new(
            component,
            Arc::new(SqliteLeases::open_in_memory().unwrap()),
            Arc::new(NetworkTransport::new()),
        )
        .unwrap();
        let config = serde_json::json!({
            "apiUrl": server.daytona_api_url(),
            "toolboxUrl": server.toolbox_url(),
            "timeoutMs": 60_000,
            "requestTimeoutMs": 15_000,
        });
        let env = runtime
            .environment(
                "company",
                "env-daytona",
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
        let request = AcquireRequest {
            run_id: "run".into(),
            requested_cwd: None,
            workspace_mode: None,
            requested_expires_at: None,
        };
        self.runtime
            .acquire(&self.env, &request)
            .unwrap()
            .expect("lease acquired")
            .id
    }

    fn run(&self, lease: &str, script: &str, timeout_ms: u64) -> ExecuteResult {
        let request = ExecuteRequest {
            command: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            cwd: None,
            env: vec![],
            stdin: None,
            timeout_ms: Some(timeout_ms),
        };
        self.runtime
            .execute(&self.env, lease, &request, None, CancelToken::new())
            .unwrap()
            .expect("the command ran")
    }

    /// The toolbox requests recorded since the last call, as `METHOD
    /// kind` (the ids left out).
    fn requests(&self) -> Vec<String> {
        let faults = self.server.faults();
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
}

/// On the local engine a followed logs body ends only once the command
/// exited and all of its output was sent (its offset header says it is
/// that engine): the exit code read after it is the proof, and a second
/// logs read would answer nothing new. One command is four requests:
/// session, exec, followed logs, exit code (it was five, with that last
/// read). The output and the exit code are whole all the same.
#[test]
fn a_command_costs_four_toolbox_requests_on_the_local_engine() {
    let local = Local::start();
    let lease = local.acquire();
    local.requests();
    let script = "printf out; printf err >&2; i=0; while [ $i -lt 3 ]; do echo line$i; i=$((i+1)); done; exit 3";
    let result = local.run(&lease, script, 30_000);
    assert_eq!(
        (
            result.exit_code,
            result.stdout.as_str(),
            result.stderr.as_str()
        ),
        (Some(3), "outline0\nline1\nline2\n", "err")
    );
    assert_eq!(
        local.requests(),
        [
            "POST session".to_string(),
            "POST exec".to_string(),
            "GET logs".to_string(),
            // The command's record: `GET .../command/{cmdId}`.
            format!("GET {}", result.process_id),
        ],
    );
    // A timeout still ends with the confirmed session delete.
    let result = local.run(&lease, "echo started; sleep 30", 1_000);
    assert!(result.timed_out, "{result:?}");
    let trips = local.requests();
    assert!(
        trips.last().is_some_and(|t| t.starts_with("DELETE ")),
        "no session delete after a timeout: {trips:?}"
    );
    local.runtime.destroy(&local.env, &lease).unwrap().unwrap();
    let report = local.server.shutdown();
    assert!(report.all_exited(), "{report:?}");
}
