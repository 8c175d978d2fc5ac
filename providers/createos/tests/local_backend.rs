//! The real component, under wasmtime, against the real local backend
//! (`createos-local`) running real processes: the HTTP capability is the
//! host's network transport behind its policy guard, with the API key
//! injected by the host and never seen by the component.

use std::time::Duration;

use sandbox_engine::{BackgroundServer, Server};
use sandbox_host::types::*;
use sandbox_host::{Guard, HostOptions, NetworkTransport, Policy, ProviderInstance};
use std::sync::Arc;

const KEY: &str = "local-test-key-3f9c";

use test_support::components::createos as component;
use test_support::procs::survivors;
use test_support::{command, RequestExt};

struct Local {
    server: BackgroundServer,
    ctx: EnvironmentContext,
}

impl Local {
    fn start() -> Local {
        let server = BackgroundServer::start(Server::builder().api_key(KEY).quiet(true))
            .expect("server starts");
        let config = serde_json::json!({
            "apiUrl": server.base_url(),
            "timeoutMs": 60_000,
            "requestTimeoutMs": 15_000,
        });
        let ctx = EnvironmentContext {
            driver_key: "createos".into(),
            company_id: "company".into(),
            environment_id: "env-local".into(),
            issue_id: None,
            config: config.to_string(),
        };
        Local { server, ctx }
    }

    fn instance(&self) -> ProviderInstance {
        let policy = Policy::for_origin(&self.server.base_url())
            .unwrap()
            .with_secret_header("X-Api-Key", KEY)
            .unwrap()
            .with_rate_limit(Some(sandbox_host::RateLimit::new(
                300,
                Duration::from_secs(60),
            )));
        let guard = Guard::new(policy, Arc::new(NetworkTransport::new()));
        component()
            .instantiate(HostOptions::new().with_transport(Arc::new(guard)))
            .unwrap()
    }

    fn acquire(&self) -> Lease {
        let request = test_support::acquire("run");
        self.instance()
            .acquire_lease(&self.ctx, &request)
            .unwrap()
            .expect("lease acquired")
    }

    fn run(
        &self,
        lease: &Lease,
        program: &str,
        args: &[&str],
        timeout_ms: Option<u64>,
    ) -> ExecuteResult {
        let request = command(program, args).timeout(timeout_ms);
        self.instance()
            .execute(&self.ctx, lease, &request)
            .unwrap()
            .expect("confirmed result")
    }
}

#[test]
fn echo_background_children_and_sigterm_ignorers_leave_no_survivor() {
    let local = Local::start();
    let lease = local.acquire();

    let echo = local.run(&lease, "echo", &["hello"], None);
    assert_eq!(echo.exit_code, Some(0));
    assert_eq!(echo.stdout, "hello\n");
    assert!(!echo.timed_out);

    let exit7 = local.run(
        &lease,
        "sh",
        &["-c", "echo out; echo err >&2; exit 7"],
        None,
    );
    assert_eq!(
        (
            exit7.exit_code,
            exit7.stdout.as_str(),
            exit7.stderr.as_str()
        ),
        (Some(7), "out\n", "err\n")
    );

    let children = local.run(
        &lease,
        "sh",
        &["-c", "sleep 6171 & sleep 6172"],
        Some(1_000),
    );
    assert!(children.timed_out, "{children:?}");
    assert_eq!(children.exit_code, None);
    assert!(
        survivors("sleep 617").is_empty(),
        "{:?}",
        survivors("sleep 617")
    );

    let stubborn = local.run(
        &lease,
        "sh",
        &["-c", "trap '' TERM; echo ready; sleep 6173; sleep 6174"],
        Some(1_000),
    );
    assert!(stubborn.timed_out);
    assert_eq!(stubborn.stdout, "ready\n", "partial output kept");
    assert!(
        survivors("sleep 617").is_empty(),
        "{:?}",
        survivors("sleep 617")
    );

    let receipt = local
        .instance()
        .destroy_lease(&local.ctx, &lease)
        .unwrap()
        .unwrap();
    assert_eq!(receipt.action, TerminationAction::Deleted);
    let report = local.server.shutdown();
    assert!(report.all_exited(), "{report:?}");
}

#[test]
fn a_wrong_key_is_a_typed_rejection() {
    let local = Local::start();
    let policy = Policy::for_origin(&local.server.base_url())
        .unwrap()
        .with_secret_header("X-Api-Key", "wrong")
        .unwrap();
    let guard = Guard::new(policy, Arc::new(NetworkTransport::new()));
    let mut instance = component()
        .instantiate(HostOptions::new().with_transport(Arc::new(guard)))
        .unwrap();
    let error = instance
        .acquire_lease(&local.ctx, &test_support::acquire("r"))
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(&error, ProviderError::ApiRejected(r) if r.status == 401),
        "{error:?}"
    );
    assert!(!format!("{error:?}").contains("wrong"));
}

/// The RFC 3339 text of `secs` seconds from now as Paperclip sends it
/// (`Date.toISOString()`: milliseconds and `Z`), written by `date` so the
/// test shares no formatter with the engine or the provider.
fn in_seconds(secs: u64) -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_secs(secs);
    let out = std::process::Command::new("date")
        .args([
            "-u",
            "-d",
            &format!("@{}", at.as_secs()),
            "+%Y-%m-%dT%H:%M:%S",
        ])
        .output()
        .expect("date runs");
    let whole = String::from_utf8(out.stdout).unwrap();
    format!("{}.{:03}Z", whole.trim(), at.subsec_millis())
}

/// Issue 38 (Paperclip's login terminal acquires with `requestedExpiresAt`
/// and fails closed without an attested expiry): with `hardExpiry` (a
/// backend that attests one, as createos-local does) the lease carries the
/// backend's expiry, at or before the one asked, and by then the sandbox
/// is gone with whatever ran in it, so the lease resumes as expired.
#[test]
fn a_requested_expiry_is_attested_and_kept_on_the_engine() {
    let mut local = Local::start();
    let mut config: serde_json::Value = serde_json::from_str(&local.ctx.config).unwrap();
    config["hardExpiry"] = true.into();
    local.ctx.config = config.to_string();
    let asked = in_seconds(8);
    let mut request = test_support::acquire("login");
    request.requested_expires_at = Some(asked.clone());
    let lease = local
        .instance()
        .acquire_lease(&local.ctx, &request)
        .unwrap()
        .expect("a lease with an expiry");
    let attested = lease.expires_at.clone().expect("the expiry is attested");
    // Both are UTC: the same second, never later than asked.
    assert_eq!(&attested[..19], &asked[..19], "{attested} for {asked}");
    assert!(attested <= asked, "{attested} is after {asked}");
    // The engine keeps that expiry for the sandbox (it was asked for it).
    let url = format!(
        "{}/v1/sandboxes/{}",
        local.server.base_url(),
        lease.provider_lease_id
    );
    let mut answer = ureq::get(&url).header("X-Api-Key", KEY).call().unwrap();
    let sandbox: serde_json::Value =
        serde_json::from_str(&answer.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(
        sandbox["data"]["expires_at"],
        attested.as_str(),
        "{sandbox}"
    );
    // Something long-running in it, then the expiry passes.
    let ran = local.run(
        &lease,
        "/bin/sh",
        &["-c", "sleep 600 >/dev/null 2>&1 &"],
        None,
    );
    assert_eq!(ran.exit_code, Some(0), "{ran:?}");
    std::thread::sleep(Duration::from_secs(10));
    let resumed = local
        .instance()
        .resume_lease(&local.ctx, &lease)
        .unwrap()
        .expect("resume answers");
    assert!(matches!(&resumed, ResumeOutcome::Expired(_)), "{resumed:?}");
    let report = local.server.shutdown();
    assert!(report.all_exited(), "{report:?}");
}

/// Without `hardExpiry` (the CreateOS service has no hard expiry) a
/// requested expiry is refused before anything is created.
#[test]
fn a_requested_expiry_is_refused_without_hard_expiry() {
    let local = Local::start();
    let mut request = test_support::acquire("login");
    request.requested_expires_at = Some(in_seconds(60));
    let error = local
        .instance()
        .acquire_lease(&local.ctx, &request)
        .unwrap()
        .unwrap_err();
    assert!(matches!(&error, ProviderError::Unsupported(_)), "{error:?}");
    assert_eq!(local.server.faults().count("POST", "/v1/sandboxes"), 0);
}

#[test]
fn probe_against_the_local_backend() {
    let local = Local::start();
    let report = local
        .instance()
        .probe(&local.ctx)
        .unwrap()
        .expect("probe works");
    assert!(report.ok, "{report:?}");
}

/// `realize-workspace` of the workspace root (what `sandbox lease exec`
/// asks before every command) proves the directory by the lease's marker
/// file: no process runs for it (a one-shot `exec` was the largest part of
/// a short `lease exec` on the embedded engine, issue 25). A removed
/// workspace is made again, and a subdirectory still gets `mkdir -p`.
#[test]
fn realizing_the_workspace_root_runs_no_process() {
    let local = Local::start();
    let lease = local.acquire();
    let realize = |remote_path: Option<&str>| {
        local
            .instance()
            .realize_workspace(
                &local.ctx,
                &lease,
                &WorkspaceRequest {
                    remote_path: remote_path.map(str::to_owned),
                },
            )
            .unwrap()
            .expect("realized")
    };
    let execs = || local.server.faults().count("POST", "/v1/sandboxes/*/exec");
    let before = execs();
    assert_eq!(realize(None), "/paperclip-workspace");
    assert_eq!(
        execs(),
        before,
        "a process ran to realize the workspace root"
    );
    // Removed by a command: made again (with a process), and usable.
    let removed = local.run(&lease, "rm", &["-rf", "/paperclip-workspace"], None);
    assert_eq!(removed.exit_code, Some(0), "{removed:?}");
    let before = execs();
    assert_eq!(realize(None), "/paperclip-workspace");
    assert_eq!(execs(), before + 1);
    let listed = local.run(&lease, "ls", &["-d", "/paperclip-workspace"], None);
    assert_eq!(listed.stdout, "/paperclip-workspace\n", "{listed:?}");
    let before = execs();
    assert_eq!(realize(Some("sub/dir")), "/paperclip-workspace/sub/dir");
    assert_eq!(execs(), before + 1);
    let report = local.server.shutdown();
    assert!(report.all_exited(), "{report:?}");
}

/// A terminal on the engine: `stty size` says the size asked, then, after
/// a resize (the engine's `/resize` extension, which the provider carries
/// out though it does not claim `terminal-resize` for the real service),
/// the new size.
#[test]
fn a_terminal_takes_the_size_asked_and_a_resize_on_the_engine() {
    let local = Local::start();
    let description = local.instance().describe().unwrap();
    assert!(
        !description
            .capabilities
            .contains(Capabilities::TERMINAL_RESIZE),
        "the real service has no resize: describe must not claim it"
    );
    let lease = local.acquire();
    let interaction = sandbox_host::Interaction::new();
    let output = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let sink: sandbox_host::OutputSink = {
        let output = output.clone();
        Arc::new(move |_, chunk: &[u8]| output.lock().unwrap().extend_from_slice(chunk))
    };
    let policy = Policy::for_origin(&local.server.base_url())
        .unwrap()
        .with_secret_header("X-Api-Key", KEY)
        .unwrap();
    let guard = Guard::new(policy, Arc::new(NetworkTransport::new()));
    let mut instance = component()
        .instantiate(
            HostOptions::new()
                .with_transport(Arc::new(guard))
                .with_interaction(interaction.clone())
                .with_output_sink(sink),
        )
        .unwrap();
    let request = InteractionRequest {
        command: "sh".into(),
        args: vec!["-c".into(), "stty size; read line; stty size".into()],
        cwd: None,
        env: vec![],
        terminal: Some(TerminalSize {
            columns: 80,
            rows: 24,
        }),
        timeout_ms: Some(60_000),
        result_chars: None,
    };
    let text = || String::from_utf8_lossy(&output.lock().unwrap()).into_owned();
    let result = std::thread::scope(|scope| {
        let typist = scope.spawn(|| {
            assert!(test_support::eventually(Duration::from_secs(60), || text().contains("24 80")));
            interaction.send(InteractionEvent::Resize(TerminalSize {
                columns: 132,
                rows: 43,
            }));
            interaction.send(InteractionEvent::Input(b"\r".to_vec()));
        });
        let outcome = instance.interact(&local.ctx, &lease, &request).unwrap();
        typist.join().unwrap();
        outcome.expect("the terminal's result")
    });
    assert_eq!(result.exit_code, Some(0), "{}", text());
    let after = text();
    let resized = after.split("24 80").nth(1).unwrap_or("");
    assert!(resized.contains("43 132"), "after the resize: {after:?}");
}
