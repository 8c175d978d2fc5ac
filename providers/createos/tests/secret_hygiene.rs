//! Secret hygiene with a canary API key: the host resolves and injects it,
//! the server receives it, and it appears nowhere else — not in the context
//! or lease the component is given, not in any result, error, probe report,
//! lease record or durable lease store, not in the backend's data files,
//! not in a sandboxed process's environment, and not in the component's own
//! linear memory (scanned in `/proc/self/mem` while the instance is alive).
//! A hostile server that reflects the key into every answer cannot make the
//! component put it into an error either.

#![allow(clippy::result_large_err)]

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sandbox_engine::{BackgroundServer, FaultAction, FaultRule, Server};
use sandbox_host::types::*;
use sandbox_host::{
    Guard, HostOptions, NetworkTransport, Policy, SandboxRuntime, ScriptedChunk, ScriptedResponse,
    ScriptedTransport, Secrets, SqliteLeases,
};
use serde_json::json;

/// The canary: if these bytes show up anywhere but the server, a secret leaked.
const CANARY: &str = "canary-key-7Hq2xZ9vQmW4";

use test_support::components::createos as component;
use test_support::RequestExt;

fn assert_clean(what: &str, text: &str) {
    assert!(
        !text.contains(CANARY),
        "the API key leaked into {what}: {text}"
    );
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("secret-hygiene-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(path),
                Ok(t) if t.is_file() => found.push(path),
                _ => {}
            }
        }
    }
    found
}

fn exec(program: &str, args: &[&str], timeout_ms: Option<u64>) -> ExecuteRequest {
    test_support::command(program, args)
        .stdin(b"stdin bytes\n")
        .timeout(timeout_ms)
}

/// The host runtime with a durable store, against the local backend whose
/// key is the canary, given in the config itself (the host must strip it).
#[test]
fn the_key_reaches_the_server_and_nothing_else() {
    let dir = temp_dir("runtime");
    let server = BackgroundServer::start(
        Server::builder()
            .api_key(CANARY)
            .data_dir(dir.join("backend"))
            .quiet(true),
    )
    .expect("server starts");
    let db = dir.join("leases.sqlite");
    let runtime = SandboxRuntime::new(
        component().clone(),
        Arc::new(SqliteLeases::open(&db).unwrap()),
        Arc::new(NetworkTransport::new()),
    )
    .unwrap()
    .with_rate_limit(None);
    let config = json!({
        "apiUrl": server.base_url(),
        "apiKey": CANARY,
        "timeoutMs": 60_000,
        "requestTimeoutMs": 15_000,
    })
    .to_string();
    let validation = runtime.validate_config(&config).unwrap();
    assert_clean("validate-config", &format!("{validation:?}"));
    let env = runtime
        .environment("company", "env-secret", &config, &Secrets::none())
        .expect("environment");
    assert_clean(
        "the context given to the component",
        &format!("{:?}", env.context()),
    );

    let mut seen = Vec::new();
    let probe = runtime.probe(&env, None).unwrap();
    assert!(matches!(&probe, Ok(report) if report.ok), "{probe:?}");
    seen.push(format!("{probe:?}"));

    let record = runtime
        .acquire(
            &env,
            &AcquireRequest {
                run_id: "run-secret".into(),
                requested_cwd: Some("work".into()),
                workspace_mode: None,
                requested_expires_at: None,
                egress: None,
                adapter_type: None,
                image: None,
                template: None,
            },
        )
        .unwrap()
        .expect("lease");
    seen.push(format!("{record:?}"));
    let lease_id = record.id.clone();

    // The key is not in the sandbox either: not in a process's environment.
    let run = |request: ExecuteRequest| {
        let outcome = runtime
            .execute(
                &env,
                &lease_id,
                &request,
                None,
                sandbox_host::CancelToken::new(),
            )
            .unwrap();
        format!("{outcome:?}")
    };
    let env_dump = run(exec("sh", &["-c", "env; cat"], None));
    assert!(env_dump.contains("stdin bytes"), "{env_dump}");
    seen.push(env_dump);
    seen.push(run(exec(
        "sh",
        &["-c", "echo out; echo err >&2; exit 3"],
        None,
    )));
    seen.push(run(exec("sleep", &["30"], Some(500))));
    seen.push(run(exec("/no/such/command", &[], None)));
    seen.push(format!(
        "{:?}",
        runtime.realize_workspace(
            &env,
            &lease_id,
            &WorkspaceRequest {
                remote_path: Some("sub".into())
            }
        )
    ));

    // A failed cleanup: the poison reason is durable, and must be clean too.
    server.faults().add(
        FaultRule::new(
            "DELETE",
            "/v1/sandboxes/*/processes/*",
            FaultAction::Status { status: 503 },
        )
        .times(1),
    );
    let poisoned = run(exec("sleep", &["30"], Some(500)));
    assert!(poisoned.contains("CleanupFailed"), "{poisoned}");
    seen.push(poisoned);
    seen.push(format!("{:?}", runtime.release(&env, &lease_id)));
    seen.push(format!("{:?}", runtime.destroy(&env, &lease_id)));
    seen.push(format!("{:?}", runtime.store().list().unwrap()));

    for text in &seen {
        assert_clean("an outcome or lease record", text);
    }
    let requests = server.faults().requests();
    assert!(requests.len() > 10, "the server was reached: {requests:?}");
    assert!(
        requests.iter().all(|r| r.status != 401),
        "every request carried the key"
    );

    drop(runtime);
    let report = server.shutdown();
    assert!(report.all_exited(), "{report:?}");
    // The durable lease store (with its journal files) and the backend's
    // own files hold no copy of the key.
    for file in files_under(&dir) {
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            !contains(&bytes, CANARY.as_bytes()),
            "the API key is stored in {}",
            file.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The readable parts of this process's wasm linear memories: read-write
/// anonymous mappings followed by a reservation of at least 1 GiB (how
/// wasmtime lays out a linear memory on 64-bit Linux).
fn linear_memories() -> Vec<(u64, u64)> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let entries: Vec<(u64, u64, String, bool)> = maps
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let (start, end) = parts.next()?.split_once('-')?;
            let perms = parts.next()?.to_string();
            let anonymous = parts.nth(3).is_none();
            Some((
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
                perms,
                anonymous,
            ))
        })
        .collect();
    entries
        .windows(2)
        .filter(|w| {
            let (a, b) = (&w[0], &w[1]);
            a.2.starts_with("rw")
                && a.3
                && b.2.starts_with("---")
                && b.0 == a.1
                && b.1 - a.0 >= 1 << 30
        })
        .map(|w| (w[0].0, w[0].1))
        .collect()
}

fn memory_contains(regions: &[(u64, u64)], needle: &[u8]) -> bool {
    let mem = std::fs::File::open("/proc/self/mem").unwrap();
    regions.iter().any(|&(start, end)| {
        let mut bytes = vec![0; (end - start) as usize];
        mem.read_exact_at(&mut bytes, start).is_ok() && contains(&bytes, needle)
    })
}

/// One instance runs a whole lease's life against the local backend (key
/// injected by the host's guard); while it is still alive its linear memory
/// holds what it handled — the command's output — but never the key.
#[test]
fn the_components_memory_never_holds_the_key() {
    let server = BackgroundServer::start(Server::builder().api_key(CANARY).quiet(true))
        .expect("server starts");
    let ctx = EnvironmentContext {
        driver_key: "createos".into(),
        company_id: "company".into(),
        environment_id: "env-memory".into(),
        issue_id: None,
        config: json!({"apiUrl": server.base_url(), "requestTimeoutMs": 15_000}).to_string(),
    };
    let policy = Policy::for_origin(&server.base_url())
        .unwrap()
        .with_secret_header("X-Api-Key", CANARY)
        .unwrap();
    let transport = Arc::new(Guard::new(policy, Arc::new(NetworkTransport::new())));
    let mut instance = component()
        .instantiate(
            HostOptions::new()
                .with_transport(transport)
                .with_guest_stderr(sandbox_host::GuestStderr::Capture),
        )
        .unwrap();
    let lease = instance
        .acquire_lease(&ctx, &test_support::acquire("run"))
        .unwrap()
        .expect("lease");
    let marker = "guest-memory-witness-5b1e";
    let result = instance
        .execute(&ctx, &lease, &exec("echo", &[marker], None))
        .unwrap()
        .expect("result");
    assert_eq!(result.stdout.trim_end(), marker);
    let destroyed = instance.destroy_lease(&ctx, &lease).unwrap();
    assert!(destroyed.is_ok(), "{destroyed:?}");

    let regions = linear_memories();
    assert!(
        !regions.is_empty(),
        "no wasm linear memory found in /proc/self/maps"
    );
    // The scan finds what the component handled, so it reads the right
    // memory; the key is not there.
    assert!(
        memory_contains(&regions, marker.as_bytes()),
        "the command's output is not in any linear memory: the scan is not looking at the component"
    );
    assert!(
        !memory_contains(&regions, CANARY.as_bytes()),
        "the API key is in the component's memory"
    );
    assert_clean(
        "the guest's stderr",
        &instance.guest_stderr().unwrap_or_default(),
    );
    drop(instance);
    server.shutdown();
}

/// A hostile server echoes the key it received into its answers: error
/// bodies, redirects, invalid JSON, invalid ids, stream error frames,
/// malformed frames. None of it may reach an error (bodies never do), a
/// receipt or a probe report. (The stream error frame case found a leak —
/// its text was copied into the error — fixed in 47272be.)
#[test]
fn a_server_reflecting_the_key_cannot_make_an_error_carry_it() {
    let leaks = reflected_leaks();
    assert!(
        leaks.is_empty(),
        "the reflected key reached the host in:\n{}",
        leaks.join("\n")
    );
}

/// How a hostile server answers, given the key it received.
type Reflect = fn(&str) -> ScriptedResponse;

/// Runs every operation against a server that reflects the key in the way
/// of each case; returns the outcomes that carry the key.
fn reflected_leaks() -> Vec<String> {
    const ORIGIN: &str = "https://api.createos.test";
    // Each case: which route reflects, and how.
    let cases: Vec<(&str, Reflect)> = vec![
        ("status 500", |key| {
            ScriptedResponse::json(500, json!({"status": "error", "message": key, "code": key}))
        }),
        ("status 400", |key| {
            ScriptedResponse::json(400, json!({"status": "fail", "data": {"apiKey": key}}))
        }),
        ("redirect", |key| ScriptedResponse::Full {
            status: 307,
            headers: vec![("location".into(), format!("https://evil.test/?k={key}"))],
            body: Default::default(),
        }),
        ("invalid JSON", |key| {
            ScriptedResponse::text(200, format!("{{{key}"))
        }),
        ("bad id", |key| {
            ScriptedResponse::jsend_success(
                json!({"id": format!("{key}!"), "process_id": format!("../{key}"), "status": key}),
            )
        }),
        ("stream error frame", |key| {
            ScriptedResponse::ndjson(
                vec![ScriptedChunk::now(format!(
                    "{}\n",
                    json!({"type": "error", "error": key})
                ))],
                None,
            )
        }),
        ("malformed frame", |key| {
            ScriptedResponse::ndjson(
                vec![ScriptedChunk::now(format!("{{\"type\":\"{key}\"}}\n"))],
                None,
            )
        }),
    ];
    let mut leaks = Vec::new();
    for (name, reflect) in cases {
        // Every route answers normally except the routes the case poisons;
        // the key arrives with each request, injected by the guard.
        let transport = ScriptedTransport::new(move |req| {
            let key = req.header("x-api-key").unwrap_or_default().to_string();
            assert_eq!(key, CANARY, "the guard injects the key");
            let path = req.path();
            let connect = path.ends_with("/connect");
            let normal = match (req.method.as_str(), path) {
                ("POST", "/v1/sandboxes") if name != "bad id" => Some(
                    ScriptedResponse::jsend_success(json!({"id": "sb-1", "status": "creating"})),
                ),
                ("GET", "/v1/sandboxes/sb-1") => Some(ScriptedResponse::jsend_success(
                    json!({"id": "sb-1", "status": "running", "shape": "s-1vcpu-1gb"}),
                )),
                ("POST", p) if p.ends_with("/processes") && name.contains("frame") => Some(
                    ScriptedResponse::jsend_success(json!({"process_id": "p-1"})),
                ),
                ("PUT", p) if p.ends_with("/files") => {
                    Some(ScriptedResponse::jsend_success(json!({})))
                }
                ("POST", p) if p.ends_with("/stdin/close") => {
                    Some(ScriptedResponse::jsend_success(json!({})))
                }
                ("DELETE", _) if name.contains("frame") => Some(ScriptedResponse::jsend_success(
                    json!({"tree_exited": true}),
                )),
                _ => None,
            };
            if connect && !name.contains("frame") {
                return ScriptedResponse::ndjson(
                    vec![ScriptedChunk::now("{\"type\":\"exit\",\"exit_code\":0}\n")],
                    None,
                );
            }
            match normal {
                Some(answer) if !connect => answer,
                _ => reflect(&key),
            }
        });
        let policy = Policy::for_origin(ORIGIN)
            .unwrap()
            .with_secret_header("X-Api-Key", CANARY)
            .unwrap();
        let guard: Arc<dyn sandbox_host::Transport> =
            Arc::new(Guard::new(policy, transport.shared()));
        let ctx = EnvironmentContext {
            driver_key: "createos".into(),
            company_id: "company".into(),
            environment_id: "env-1".into(),
            issue_id: None,
            config: json!({"apiUrl": ORIGIN, "timeoutMs": 10_000, "requestTimeoutMs": 2_000})
                .to_string(),
        };
        let lease = Lease {
            provider_lease_id: "sb-1".into(),
            metadata: json!({
                "provider": "createos", "sandboxId": "sb-1", "environmentId": "env-1",
                "apiOrigin": ORIGIN, "shape": "s-1vcpu-1gb", "rootfs": null, "region": null,
                "workspaceRoot": "/paperclip-workspace", "cwd": "/paperclip-workspace",
                "marker": "m-1", "reusable": false,
            })
            .to_string(),
            expires_at: None,
        };
        let instance = || {
            component()
                .instantiate(HostOptions::new().with_transport(guard.clone()))
                .unwrap()
        };
        let acquire = test_support::acquire("r");
        let outcomes = [
            format!("{:?}", instance().probe(&ctx).unwrap()),
            format!("{:?}", instance().acquire_lease(&ctx, &acquire).unwrap()),
            format!(
                "{:?}",
                instance()
                    .execute(&ctx, &lease, &exec("ls", &[], None))
                    .unwrap()
            ),
            format!("{:?}", instance().resume_lease(&ctx, &lease).unwrap()),
            format!("{:?}", instance().release_lease(&ctx, &lease).unwrap()),
            format!("{:?}", instance().destroy_lease(&ctx, &lease).unwrap()),
            format!(
                "{:?}",
                instance()
                    .realize_workspace(&ctx, &lease, &WorkspaceRequest { remote_path: None })
                    .unwrap()
            ),
        ];
        assert!(!transport.requests().is_empty());
        for outcome in outcomes {
            if outcome.contains(CANARY) {
                leaks.push(format!("{name}: {outcome}"));
            }
        }
    }
    leaks
}
