//! Scenarios for the lease runtime: durable poison, sweep, cancellation
//! before release, secrets kept from the component.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use sandbox_host::types::{ExecuteRequest, OutputStream, ProviderError};
use sandbox_host::{
    CancelToken, LeaseState, OutputCapture, RequestPacer, SandboxRuntime, ScriptedResponse,
    ScriptedTransport, Secrets, SqliteLeases,
};

mod common;
use common::{short_liveness, test_provider};
use test_support::{acquire, RequestExt};

fn store_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sandbox-host-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir.join("leases.sqlite")
}

fn runtime(store: Arc<SqliteLeases>, script: &ScriptedTransport) -> SandboxRuntime {
    SandboxRuntime::new(test_provider().clone(), store, script.shared())
        .unwrap()
        .with_request_pacer(RequestPacer::in_memory())
}

fn command(program: &str, args: &[&str]) -> ExecuteRequest {
    test_support::command(program, args).timeout_ms(10_000)
}

fn no_http() -> ScriptedTransport {
    ScriptedTransport::new(|_| ScriptedResponse::status(500))
}

#[test]
fn cleanup_failed_poisons_durably_and_sweep_destroys() {
    let path = store_path("poison");
    let script = no_http();
    let lease_id = {
        let rt = runtime(Arc::new(SqliteLeases::open(&path).unwrap()), &script);
        let env = rt.environment("co", "env", "{}", &Secrets::none()).unwrap();
        let record = rt.acquire(&env, &acquire("r1")).unwrap().unwrap();
        assert_eq!(record.state, LeaseState::Active);
        assert_eq!(record.lease.as_ref().unwrap().provider_lease_id, "sb-r1");

        let outcome = rt
            .execute(
                &env,
                &record.id,
                &command("cleanup-fail", &[]),
                None,
                CancelToken::new(),
            )
            .unwrap();
        assert!(
            matches!(outcome, Err(ProviderError::CleanupFailed(_))),
            "{outcome:?}"
        );
        let poisoned = rt.store().get(&record.id).unwrap().unwrap();
        assert!(
            poisoned
                .reason
                .as_deref()
                .unwrap()
                .contains("was not confirmed"),
            "{poisoned:?}"
        );
        assert_eq!(poisoned.state, LeaseState::Poisoned);

        let refused = rt
            .execute(
                &env,
                &record.id,
                &command("echo", &["hi"]),
                None,
                CancelToken::new(),
            )
            .unwrap_err();
        assert!(format!("{refused:#}").contains("poisoned"), "{refused:#}");
        assert!(rt.release(&env, &record.id).is_err());
        assert!(rt.resume(&env, &record.id).is_err());
        record.id
    };

    // A new store on the same file (as a restarted host would open it).
    let rt = runtime(Arc::new(SqliteLeases::open(&path).unwrap()), &script);
    let record = rt.store().get(&lease_id).unwrap().unwrap();
    assert_eq!(record.state, LeaseState::Poisoned);
    assert!(record.reason.unwrap().contains("may still run"));

    let env = rt.environment("co", "env", "{}", &Secrets::none()).unwrap();
    let swept = rt.sweep(&env).unwrap();
    assert_eq!(swept.len(), 1);
    assert!(swept[0].1.is_ok(), "{swept:?}");
    assert_eq!(swept[0].0.state, LeaseState::Destroyed);
    assert!(rt.sweep(&env).unwrap().is_empty());
}

#[test]
fn a_failed_destroy_keeps_the_lease_poisoned() {
    let script = no_http();
    let rt = runtime(Arc::new(SqliteLeases::open_in_memory().unwrap()), &script);
    let env = rt
        .environment("co", "env", r#"{"mode":"destroy-fails"}"#, &Secrets::none())
        .unwrap();
    let record = rt.acquire(&env, &acquire("r2")).unwrap().unwrap();
    let outcome = rt.destroy(&env, &record.id).unwrap();
    assert!(matches!(outcome, Err(ProviderError::CleanupFailed(_))));
    assert_eq!(
        rt.store().get(&record.id).unwrap().unwrap().state,
        LeaseState::Poisoned
    );
}

#[test]
fn a_trap_during_execute_poisons_the_lease() {
    let script = no_http();
    let rt = runtime(Arc::new(SqliteLeases::open_in_memory().unwrap()), &script);
    let env = rt.environment("co", "env", "{}", &Secrets::none()).unwrap();
    let record = rt.acquire(&env, &acquire("r3")).unwrap().unwrap();
    let error = rt
        .execute(
            &env,
            &record.id,
            &command("trap", &[]),
            None,
            CancelToken::new(),
        )
        .unwrap_err();
    assert!(sandbox_host::trap_of(&error).is_some(), "{error:#}");
    let record = rt.store().get(&record.id).unwrap().unwrap();
    assert_eq!(record.state, LeaseState::Poisoned);
    assert!(record.reason.unwrap().contains("trapped"));
}

#[test]
fn a_spin_or_unbounded_allocation_during_execute_poisons_durably() {
    for (name, guest) in [("spin", "spin"), ("alloc", "alloc"), ("trap", "trap")] {
        let path = store_path(name);
        let script = no_http();
        let lease_id = {
            let rt = runtime(Arc::new(SqliteLeases::open(&path).unwrap()), &script)
                .with_grace(Duration::from_millis(500));
            // Cleanup requests get 100 ms each: the host stops the guest at
            // 100 ms + 5 × 100 ms + 500 ms.
            let env = rt
                .environment("co", "env", r#"{"requestTimeoutMs":100}"#, &Secrets::none())
                .unwrap();
            let record = rt.acquire(&env, &acquire(name)).unwrap().unwrap();
            let mut request = command(guest, &[]);
            request.timeout_ms = Some(100);
            // The outer error: a trap (epoch interrupt) or the memory
            // limit's growth failure, never a typed result.
            let outcome = rt.execute(&env, &record.id, &request, None, CancelToken::new());
            assert!(outcome.is_err(), "{name}: {outcome:?}");
            record.id
        };
        // A new store on the same file, as after a host restart.
        let store = SqliteLeases::open(&path).unwrap();
        let record = store.get(&lease_id).unwrap().unwrap();
        assert_eq!(record.state, LeaseState::Poisoned, "{name}");
        assert!(
            record.reason.unwrap().contains("termination unknown"),
            "{name}"
        );
    }
}

#[test]
fn an_acquire_whose_cleanup_failed_is_poisoned_for_sweep() {
    let script = no_http();
    let rt = runtime(Arc::new(SqliteLeases::open_in_memory().unwrap()), &script);
    let env = rt.environment("co", "env", "{}", &Secrets::none()).unwrap();
    let outcome = rt.acquire(&env, &acquire("fail-cleanup")).unwrap();
    assert!(matches!(outcome, Err(ProviderError::CleanupFailed(_))));
    let records = rt.store().needing_sweep().unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].state, LeaseState::Poisoned);
    assert_eq!(
        records[0].lease.as_ref().unwrap().provider_lease_id,
        "sb-half"
    );
}

#[test]
fn release_cancels_a_running_command_and_waits_for_it() {
    let script = no_http();
    let rt = Arc::new(runtime(
        Arc::new(SqliteLeases::open_in_memory().unwrap()),
        &script,
    ));
    let env = rt.environment("co", "env", "{}", &Secrets::none()).unwrap();
    let record = rt.acquire(&env, &acquire("r4")).unwrap().unwrap();

    let output = OutputCapture::new();
    let worker = {
        let (rt, env, id, sink) = (rt.clone(), env.clone(), record.id.clone(), output.sink());
        thread::spawn(move || {
            rt.execute(
                &env,
                &id,
                &command("wait-cancel", &[]),
                Some(sink),
                CancelToken::new(),
            )
        })
    };
    thread::sleep(Duration::from_millis(300));
    assert!(!worker.is_finished());
    let receipt = rt.release(&env, &record.id).unwrap().unwrap();
    assert_eq!(
        output.text(OutputStream::Stderr),
        "cleanup done\n",
        "release returned before the command's cleanup did"
    );
    let outcome = worker.join().unwrap().unwrap();
    assert!(
        matches!(outcome, Err(ProviderError::Cancelled(_))),
        "{outcome:?}"
    );
    assert_eq!(receipt.sandbox_id, "sb-r4");
    assert_eq!(
        rt.store().get(&record.id).unwrap().unwrap().state,
        LeaseState::Released
    );
}

#[test]
fn the_secret_reaches_the_server_but_never_the_component() {
    let script = ScriptedTransport::new(|_| ScriptedResponse::text(200, "pong"));
    let rt = runtime(Arc::new(SqliteLeases::open_in_memory().unwrap()), &script);
    let config = r#"{"apiKey":"only-the-host-knows","apiUrl":"https://api.test","url":"https://api.test/v1/ping"}"#;
    let env = rt
        .environment("co", "env", config, &Secrets::none())
        .unwrap();
    assert!(!env.context().config.contains("only-the-host-knows"));

    let output = OutputCapture::new();
    let report = rt.probe(&env, Some(output.sink())).unwrap().unwrap();

    // The server got the key; the component (which reports everything it
    // read and received) never had it.
    let requests = script.requests();
    assert_eq!(requests[0].header("x-api-key"), Some("only-the-host-knows"));
    assert!(report.ok);
    assert!(!format!("{report:?}").contains("only-the-host-knows"));
    for stream in [OutputStream::Stdout, OutputStream::Stderr] {
        assert!(!output.text(stream).contains("only-the-host-knows"));
    }
}

#[test]
fn exit_codes_and_output_come_back_from_execute() {
    let script = no_http();
    let rt = runtime(Arc::new(SqliteLeases::open_in_memory().unwrap()), &script);
    let env = rt.environment("co", "env", "{}", &Secrets::none()).unwrap();
    let record = rt.acquire(&env, &acquire("r5")).unwrap().unwrap();
    let output = OutputCapture::new();
    let result = rt
        .execute(
            &env,
            &record.id,
            &command("echo", &["hello", "world"]),
            Some(output.sink()),
            CancelToken::new(),
        )
        .unwrap()
        .unwrap();
    assert_eq!(result.exit_code, Some(0));
    assert_eq!(output.text(OutputStream::Stdout), "hello world\n");
    let result = rt
        .execute(
            &env,
            &record.id,
            &command("exit", &["7"]),
            None,
            CancelToken::new(),
        )
        .unwrap()
        .unwrap();
    assert_eq!(result.exit_code, Some(7));
}

const CHILD_ENV: &str = "SANDBOX_HOST_TEST_CHILD_STORE";

/// Run in a child process: acquire, start a command that never ends, and
/// signal readiness; the parent kills this process.
fn child_host(path: &str) {
    let script = no_http();
    let rt = runtime(Arc::new(SqliteLeases::open(path).unwrap()), &script);
    rt.set_liveness(short_liveness()).unwrap();
    let env = rt.environment("co", "env", "{}", &Secrets::none()).unwrap();
    let record = rt.acquire(&env, &acquire("doomed")).unwrap().unwrap();
    let ready = format!("{path}.ready");
    thread::spawn(move || {
        thread::sleep(Duration::from_millis(500));
        std::fs::write(ready, "").unwrap();
    });
    let _ = rt.execute(
        &env,
        &record.id,
        &command("wait-cancel", &[]),
        None,
        CancelToken::new(),
    );
    panic!("the parent should have killed this process");
}

#[test]
fn a_host_killed_mid_command_leaves_the_lease_for_sweep() {
    if let Ok(path) = std::env::var(CHILD_ENV) {
        child_host(&path);
        return;
    }
    let path = store_path("killed");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_host_killed_mid_command_leaves_the_lease_for_sweep",
        ])
        .env(CHILD_ENV, &path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ready = PathBuf::from(format!("{}.ready", path.display()));
    let started = std::time::Instant::now();
    while !ready.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the child never got ready"
        );
        assert!(child.try_wait().unwrap().is_none(), "the child ended early");
        thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // Past the dead host's expiry.
    thread::sleep(short_liveness().expiry + Duration::from_millis(500));

    let script = no_http();
    let rt = runtime(Arc::new(SqliteLeases::open(&path).unwrap()), &script);
    let env = rt.environment("co", "env", "{}", &Secrets::none()).unwrap();
    // Any operation finds the dead host's mark first and poisons the lease.
    let lease_id = rt.store().list().unwrap()[0].id.clone();
    let refused = rt
        .execute(
            &env,
            &lease_id,
            &command("echo", &["hi"]),
            None,
            CancelToken::new(),
        )
        .unwrap_err();
    assert!(
        format!("{refused:#}").contains("sandbox lease destroy"),
        "{refused:#}"
    );
    assert_eq!(
        rt.store().get(&lease_id).unwrap().unwrap().state,
        LeaseState::Poisoned
    );
    let swept = rt.sweep(&env).unwrap();
    assert_eq!(swept.len(), 1, "{swept:?}");
    assert!(swept[0].1.is_ok(), "{swept:?}");
    let record = &swept[0].0;
    assert_eq!(record.state, LeaseState::Destroyed);
    assert_eq!(
        record.lease.as_ref().unwrap().provider_lease_id,
        "sb-doomed"
    );
}

/// Pins issue 9 item 4: the host cut the instance before the provider's own
/// cleanup could run. The provider spends its `timeoutMs`, then sends a
/// cleanup request that gets a fresh `requestTimeoutMs` (the server answers
/// in 1.5 s); the host used to stop everything `timeout + grace` after the
/// start, so the cleanup request was refused. The host's deadline now
/// covers the provider's plan plus a cleanup reserve.
#[test]
fn the_host_deadline_leaves_room_for_the_providers_cleanup_request() {
    let script = ScriptedTransport::new(|request| {
        if request.path() == "/cleanup" {
            ScriptedResponse::Streamed {
                status: 200,
                headers: vec![],
                chunks: vec![sandbox_host::ScriptedChunk::after(
                    Duration::from_millis(1500),
                    "cleaned",
                )],
                end: None,
            }
        } else {
            ScriptedResponse::status(404)
        }
    });
    let rt = runtime(Arc::new(SqliteLeases::open_in_memory().unwrap()), &script)
        .with_grace(Duration::from_millis(500));
    let env = rt
        .environment(
            "co",
            "env",
            r#"{"timeoutMs":300,"requestTimeoutMs":5000}"#,
            &Secrets::none(),
        )
        .unwrap();
    let record = rt.acquire(&env, &acquire("late")).unwrap().unwrap();
    let mut request = command("late-cleanup", &[]);
    request.timeout_ms = None;
    let outcome = rt
        .execute(&env, &record.id, &request, None, CancelToken::new())
        .unwrap();
    let result = outcome.unwrap();
    assert_eq!(result.exit_code, Some(0));
    assert_eq!(
        rt.store().get(&record.id).unwrap().unwrap().state,
        LeaseState::Active
    );
}

/// Pins issue 9 item 4 (probe): a probe's sandbox was known to no store, so
/// a host death mid-probe left a sandbox nobody would sweep. The probe is
/// now recorded (`acquiring`, owned by this host) while it runs.
#[test]
fn a_probe_is_recorded_while_its_sandbox_may_exist() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let store = Arc::new(SqliteLeases::open_in_memory().unwrap());
    let script = {
        let (seen, store) = (seen.clone(), store.clone());
        ScriptedTransport::new(move |_| {
            let states: Vec<(String, LeaseState)> = store
                .list()
                .unwrap()
                .into_iter()
                .map(|r| (r.run_id, r.state))
                .collect();
            seen.lock().unwrap().push(states);
            ScriptedResponse::text(200, "pong")
        })
    };
    let rt = runtime(store, &script);
    let env = rt
        .environment(
            "co",
            "env",
            r#"{"url":"https://api.test/ping"}"#,
            &Secrets::none(),
        )
        .unwrap();
    let report = rt.probe(&env, None).unwrap().unwrap();
    assert!(report.ok);
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen[0],
        vec![("probe".to_owned(), LeaseState::Acquiring)],
        "while the probe ran"
    );
    let after = rt.store().list().unwrap();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].state, LeaseState::Destroyed);
    assert!(after[0].busy_owner.is_none());
}

/// Pins issue 9 item 5: the host injected the key into whatever origin the
/// component's `validate-config` returned. A hostile component now gets an
/// error, and no request (so no key) goes anywhere.
#[test]
fn a_hostile_component_cannot_send_the_key_to_its_own_origin() {
    let script = ScriptedTransport::new(|_| ScriptedResponse::text(200, "pong"));
    let rt = runtime(Arc::new(SqliteLeases::open_in_memory().unwrap()), &script);
    let config = r#"{"apiKey":"canary-key","apiUrl":"https://api.test","mode":"hostile-origin"}"#;
    let error = rt
        .environment("co", "env", config, &Secrets::none())
        .unwrap_err();
    let text = format!("{error:#}");
    assert!(text.contains("https://evil.test"), "{text}");
    assert!(!text.contains("canary-key"), "{text}");
    assert!(script.requests().is_empty());
}

/// Pins issue 9 item 5: a key was sent over plain http to any host. Only
/// https, or http on a loopback address, may carry it.
#[test]
fn the_key_travels_only_over_https_or_loopback_http() {
    let script = ScriptedTransport::new(|_| ScriptedResponse::text(200, "pong"));
    let rt = runtime(Arc::new(SqliteLeases::open_in_memory().unwrap()), &script);
    let plain = r#"{"apiKey":"canary-key","apiUrl":"http://api.test"}"#;
    let error = rt
        .environment("co", "env", plain, &Secrets::none())
        .unwrap_err();
    assert!(format!("{error:#}").contains("https"), "{error:#}");
    for allowed in [
        r#"{"apiKey":"k","apiUrl":"https://api.test"}"#,
        r#"{"apiKey":"k","apiUrl":"http://127.0.0.1:9"}"#,
        r#"{"apiKey":"k","apiUrl":"http://localhost:9"}"#,
    ] {
        rt.environment("co", "env", allowed, &Secrets::none())
            .unwrap_or_else(|e| panic!("{allowed}: {e:#}"));
    }
}

/// Pins issue 9 item 5: `describe()` chose which host environment variable
/// the host read (a hostile component could read any). The fixture asks
/// for `SANDBOX_TEST_STOLEN`; the operator named no such variable, so its
/// value goes nowhere.
#[test]
fn the_component_cannot_choose_which_variable_the_host_reads() {
    std::env::set_var("SANDBOX_TEST_STOLEN", "stolen-canary");
    let script = ScriptedTransport::new(|_| ScriptedResponse::text(200, "pong"));
    let rt = runtime(Arc::new(SqliteLeases::open_in_memory().unwrap()), &script);
    let config = r#"{"apiUrl":"https://api.test","url":"https://api.test/v1/ping"}"#;
    let env = rt
        .environment("co", "env", config, &Secrets::from_env())
        .unwrap();
    let report = rt.probe(&env, None).unwrap().unwrap();
    assert!(report.ok);
    let requests = script.requests();
    assert!(!requests.is_empty());
    for request in &requests {
        assert!(
            !format!("{:?}", request.headers).contains("stolen-canary"),
            "{request:?}"
        );
        assert_eq!(request.header("x-api-key"), None);
    }
    // The operator can name it.
    let env = rt
        .environment(
            "co",
            "env",
            config,
            &Secrets::none().with_env("apiKey", "SANDBOX_TEST_STOLEN"),
        )
        .unwrap();
    script.clear();
    rt.probe(&env, None).unwrap().unwrap();
    assert_eq!(
        script.requests()[0].header("x-api-key"),
        Some("stolen-canary")
    );
}

/// Pins the gap left in issue 9 item 4: an acquire that stopped in the host
/// after the provider created its sandbox was recorded `unknown` ("no id
/// to clean it up with"). The provider now reports the id first
/// (`host.record-sandbox`), so the lease is poisoned with that id and
/// sweep destroys it.
#[test]
fn an_acquire_that_traps_after_recording_its_sandbox_is_poisoned_and_swept() {
    let script = no_http();
    let rt = runtime(Arc::new(SqliteLeases::open_in_memory().unwrap()), &script);
    let env = rt.environment("co", "env", "{}", &Secrets::none()).unwrap();
    assert!(rt.acquire(&env, &acquire("record-then-trap")).is_err());
    let records = rt.store().needing_sweep().unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].state, LeaseState::Poisoned);
    assert_eq!(
        records[0].lease.as_ref().unwrap().provider_lease_id,
        "sb-recorded"
    );
    let swept = rt.sweep(&env).unwrap();
    assert_eq!(swept.len(), 1);
    assert!(swept[0].1.is_ok(), "{:?}", swept[0].1);
    assert_eq!(swept[0].0.state, LeaseState::Destroyed);
}

/// Contract 0.2.0: a provider's default URL receives a secret only when the
/// operator trusts it; a hostile component declaring its own default gets
/// an error and no request.
#[test]
fn a_provider_default_origin_gets_no_secret_unless_the_operator_trusts_it() {
    let script = ScriptedTransport::new(|_| ScriptedResponse::text(200, "pong"));
    let rt = runtime(Arc::new(SqliteLeases::open_in_memory().unwrap()), &script);
    let error = rt
        .environment("co", "env", r#"{"apiKey":"canary-key"}"#, &Secrets::none())
        .unwrap_err();
    let text = format!("{error:#}");
    assert!(text.contains("apiUrl"), "{text}");
    assert!(!text.contains("canary-key"), "{text}");
    let trusted = Secrets::none()
        .trust_default_origin("https://api.test")
        .unwrap();
    rt.environment("co", "env", r#"{"apiKey":"k"}"#, &trusted)
        .unwrap();
    assert!(script.requests().is_empty());
}
