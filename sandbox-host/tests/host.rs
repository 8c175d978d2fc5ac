//! Scenarios for the host runtime, run against a tiny test provider
//! component (tests/fixtures/test-provider, built on first use) and, when
//! it has been built, the real CreateOS provider.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sandbox_host::types::{OutputStream, ProviderError, TransportKind};
use sandbox_host::{
    shared_engine, trap_of, CancelToken, ErrorCode, HostOptions, NetworkTransport, OutputCapture,
    Policy, ProviderComponent, RateLimit, RequestPacer, ScriptedChunk, ScriptedResponse,
    ScriptedTransport, Transport, Trap, PROVIDER_INTERFACE,
};

mod common;
use common::{ctx, lease, test_provider, workspace_dir};
use test_support::RequestExt;

const API: &str = "http://api.test";

/// A scripted API behind a guard that allows only `API` and injects the key.
fn guarded(
    script: &ScriptedTransport,
    budget: RequestPacer,
    limit: Option<RateLimit>,
) -> Arc<dyn Transport> {
    let policy = Policy::for_origin(API)
        .unwrap()
        .with_secret_header("X-Api-Key", "sekret-123")
        .unwrap()
        .with_request_pacer(budget)
        .with_rate_limit(limit);
    Arc::new(policy.guard(script.shared()))
}

fn transport_kind(outcome: Result<impl std::fmt::Debug, ProviderError>) -> TransportKind {
    match outcome {
        Err(ProviderError::TransportFailed(failure)) => failure.kind,
        other => panic!("expected transport-failed, got {other:?}"),
    }
}

#[test]
fn describe_returns_the_providers_description() {
    let mut instance = test_provider().instantiate(HostOptions::new()).unwrap();
    let description = instance.describe().unwrap();
    assert_eq!(description.driver_key, "test");
    assert_eq!(description.secrets[0].header, "X-Api-Key");
}

#[test]
fn a_component_without_the_provider_export_is_refused_clearly() {
    // An empty component: magic, component version, component layer.
    let empty = b"\0asm\x0d\x00\x01\x00";
    let engine = shared_engine().unwrap();
    let error = ProviderComponent::from_bytes(&engine, empty)
        .err()
        .expect("must be refused");
    let message = format!("{error:#}");
    assert!(message.contains(PROVIDER_INTERFACE), "{message}");
}

#[test]
fn requests_are_recorded_with_the_secret_and_bodies_stream_to_output() {
    let script = ScriptedTransport::new(|_| {
        ScriptedResponse::ndjson(
            vec![
                ScriptedChunk::now("{\"seq\":1}\n"),
                ScriptedChunk::after(Duration::from_millis(50), "{\"seq\":2}\n"),
            ],
            None,
        )
    });
    let output = OutputCapture::new();
    let options = HostOptions::new()
        .with_transport(guarded(&script, RequestPacer::in_memory(), None))
        .with_output_sink(output.sink());
    let mut instance = test_provider().instantiate(options).unwrap();

    let report = instance
        .probe(&ctx("http://api.test/v1/things?limit=1"))
        .unwrap()
        .unwrap();

    assert!(report.ok, "{report:?}");
    assert_eq!(report.diagnostics, vec!["{\"seq\":1}\n{\"seq\":2}\n"]);
    assert_eq!(
        output.chunks(),
        vec![
            (OutputStream::Stdout, b"{\"seq\":1}\n".to_vec()),
            (OutputStream::Stdout, b"{\"seq\":2}\n".to_vec()),
        ]
    );
    let requests = script.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.method, "GET");
    assert_eq!(request.path_and_query, "/v1/things?limit=1");
    assert_eq!(request.path(), "/v1/things");
    assert_eq!(request.header("x-api-key"), Some("sekret-123"));
    assert_eq!(request.header("x-test"), Some("fixture"));
}

#[test]
fn another_origin_is_denied_before_reaching_the_transport() {
    let script = ScriptedTransport::new(|_| ScriptedResponse::status(200));
    let options =
        HostOptions::new().with_transport(guarded(&script, RequestPacer::in_memory(), None));
    let mut instance = test_provider().instantiate(options).unwrap();

    for url in [
        "http://evil.test/v1",
        "https://api.test/v1",
        "http://api.test:8080/",
    ] {
        let outcome = instance.probe(&ctx(url)).unwrap();
        assert_eq!(transport_kind(outcome), TransportKind::Denied, "{url}");
    }
    assert!(script.requests().is_empty());
}

#[test]
fn a_reset_mid_body_reaches_the_guest_as_a_connection_error() {
    let script = ScriptedTransport::new(|_| {
        ScriptedResponse::ndjson(
            vec![ScriptedChunk::now("{\"seq\":1}\n")],
            Some(ErrorCode::ConnectionTerminated),
        )
    });
    let output = OutputCapture::new();
    let options = HostOptions::new()
        .with_transport(guarded(&script, RequestPacer::in_memory(), None))
        .with_output_sink(output.sink());
    let mut instance = test_provider().instantiate(options).unwrap();

    let outcome = instance.probe(&ctx("http://api.test/v1")).unwrap();

    // wasmtime-wasi-http 48 turns a body error into an `io-error` whose
    // `http-error-code` is none; its debug text names the cause.
    match outcome {
        Err(ProviderError::TransportFailed(failure)) => {
            assert_eq!(failure.kind, TransportKind::Connection);
            assert!(
                failure.detail.contains("connection terminated"),
                "{failure:?}"
            );
        }
        other => panic!("expected transport-failed, got {other:?}"),
    }
    assert_eq!(output.text(OutputStream::Stdout), "{\"seq\":1}\n");
}

#[test]
fn an_error_code_from_the_transport_reaches_the_guest() {
    let script = ScriptedTransport::new(|_| ScriptedResponse::Error(ErrorCode::ConnectionRefused));
    let options =
        HostOptions::new().with_transport(guarded(&script, RequestPacer::in_memory(), None));
    let mut instance = test_provider().instantiate(options).unwrap();
    let outcome = instance.probe(&ctx("http://api.test/v1")).unwrap();
    assert_eq!(transport_kind(outcome), TransportKind::Connection);
}

#[test]
fn cancelling_wakes_a_guest_waiting_on_a_request_that_never_answers() {
    let script = ScriptedTransport::new(|_| ScriptedResponse::Hang);
    let cancel = CancelToken::new();
    let options = HostOptions::new()
        .with_transport(guarded(&script, RequestPacer::in_memory(), None))
        .with_cancel(cancel.clone());
    let mut instance = test_provider().instantiate(options).unwrap();

    let started = Instant::now();
    let canceller = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        cancel.cancel();
    });
    let outcome = instance.probe(&ctx("http://api.test/v1")).unwrap();
    canceller.join().unwrap();

    assert!(
        matches!(outcome, Err(ProviderError::Cancelled(_))),
        "{outcome:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(script.requests().len(), 1);
}

#[test]
fn execute_returns_once_cancelled_from_another_thread() {
    let mut instance = test_provider().instantiate(HostOptions::new()).unwrap();
    let cancel = instance.cancel_token();
    let canceller = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        cancel.cancel();
    });
    let request = test_support::command("wait-cancel", &[]);
    let outcome = instance.execute(&ctx(""), &lease(), &request).unwrap();
    canceller.join().unwrap();
    assert!(
        matches!(outcome, Err(ProviderError::Cancelled(_))),
        "{outcome:?}"
    );
}

#[test]
fn an_already_cancelled_token_is_ready_at_once() {
    let cancel = CancelToken::new();
    cancel.cancel();
    let script = ScriptedTransport::new(|_| ScriptedResponse::Hang);
    let options = HostOptions::new()
        .with_transport(guarded(&script, RequestPacer::in_memory(), None))
        .with_cancel(cancel);
    let mut instance = test_provider().instantiate(options).unwrap();
    let outcome = instance.probe(&ctx("http://api.test/v1")).unwrap();
    assert!(
        matches!(outcome, Err(ProviderError::Cancelled(_))),
        "{outcome:?}"
    );
}

/// A request starts at once while the budget allows, and waits until the
/// oldest start leaves the window when it is spent (issue 18: a budget, not
/// a fixed gap).
#[test]
fn requests_spend_the_budget_and_wait_only_when_it_is_spent() {
    let starts = Arc::new(Mutex::new(Vec::new()));
    let script = {
        let starts = starts.clone();
        ScriptedTransport::new(move |_| {
            starts.lock().unwrap().push(Instant::now());
            ScriptedResponse::status(200)
        })
    };
    let budget = RequestPacer::in_memory();
    let window = Duration::from_millis(400);
    let transport = guarded(&script, budget.clone(), Some(RateLimit::new(2, window)));
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let transport = transport.clone();
            thread::spawn(move || {
                let options = HostOptions::new().with_transport(transport);
                let mut instance = test_provider().instantiate(options).unwrap();
                instance.probe(&ctx("http://api.test/v1")).unwrap().unwrap()
            })
        })
        .collect();
    for worker in workers {
        assert!(worker.join().unwrap().ok);
    }
    let mut starts = starts.lock().unwrap().clone();
    starts.sort();
    assert_eq!(starts.len(), 3);
    // Two fit the budget; the third waited for the first to leave the window.
    assert!(starts[2] - starts[0] >= window, "{starts:?}");
    let stats = budget.stats();
    assert_eq!((stats.started, stats.waited), (3, 1), "{stats:?}");
}

#[test]
fn a_guest_panic_is_a_trap_and_the_instance_is_then_refused() {
    let mut instance = test_provider().instantiate(HostOptions::new()).unwrap();
    let error = instance.validate_config("trap").unwrap_err();
    assert_eq!(
        trap_of(&error),
        Some(Trap::UnreachableCodeReached),
        "{error:#}"
    );
    assert!(instance.has_trapped());
    let again = instance.describe().unwrap_err();
    assert!(
        format!("{again:#}").contains("trapped earlier"),
        "{again:#}"
    );
}

#[test]
fn a_spinning_guest_is_interrupted_at_its_deadline() {
    let options = HostOptions::new().with_deadline(Duration::from_millis(200));
    let mut instance = test_provider().instantiate(options).unwrap();
    let started = Instant::now();
    let error = instance.validate_config("spin").unwrap_err();
    assert_eq!(trap_of(&error), Some(Trap::Interrupt), "{error:#}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn memory_beyond_the_limit_traps() {
    let options = HostOptions::new().with_memory_limit(64 * 1024 * 1024);
    let mut instance = test_provider().instantiate(options).unwrap();
    let error = instance.validate_config("grow").unwrap_err();
    assert!(instance.has_trapped(), "{error:#}");
}

#[test]
fn the_deadline_also_bounds_a_request_that_never_answers() {
    let script = ScriptedTransport::new(|_| ScriptedResponse::Hang);
    let options = HostOptions::new()
        .with_transport(guarded(&script, RequestPacer::in_memory(), None))
        .with_deadline(Duration::from_millis(300));
    let mut instance = test_provider().instantiate(options).unwrap();
    let started = Instant::now();
    // The guest gets `HTTP-response-timeout` at the deadline and is then
    // interrupted by the epoch deadline at its next check: either way the
    // call returns promptly.
    match instance.probe(&ctx("http://api.test/v1")) {
        Err(error) => assert_eq!(trap_of(&error), Some(Trap::Interrupt), "{error:#}"),
        Ok(outcome) => assert_eq!(transport_kind(outcome), TransportKind::Deadline),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn the_real_createos_provider_describes_itself_when_built() {
    let wasm = workspace_dir().join("target/wasm32-wasip2/release/createos_provider.wasm");
    assert!(
        wasm.is_file(),
        "{} is not built: run ./build.sh first",
        wasm.display()
    );
    let engine = shared_engine().unwrap();
    let component = ProviderComponent::load(&engine, &wasm).unwrap_or_else(|e| panic!("{e:#}"));
    // Built for the current contract (0.7.0), or for 0.6.0 until the
    // provider SDK and the providers move to 0.7.0 (issue 43).
    assert!(
        [
            sandbox_host::PROVIDER_INTERFACE,
            "sandbox:provider/provider@0.6.0"
        ]
        .contains(&component.contract()),
        "{}",
        component.contract()
    );
    assert_eq!(
        sandbox_host::SERVED_INTERFACES,
        [
            sandbox_host::PROVIDER_INTERFACE,
            "sandbox:provider/provider@0.6.0",
            "sandbox:provider/provider@0.5.0",
            "sandbox:provider/provider@0.4.0",
            "sandbox:provider/provider@0.3.0",
            "sandbox:provider/provider@0.2.0",
        ],
        "newest first"
    );
    assert!(!component.live_output_is_text());
    let description = component
        .instantiate(HostOptions::new())
        .unwrap()
        .describe()
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(description.driver_key, "createos");
}

/// A minimal HTTP/1.1 server on a loopback port: `/redirect` answers 302 to
/// another origin, `/big` sends 64 KiB, anything else `hello`. Returns the
/// origin and the request heads it received.
fn tiny_server() -> (String, Arc<Mutex<Vec<String>>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&head).into_owned();
            let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
            seen.lock().unwrap().push(head);
            let (status, extra, body) = match path.as_str() {
                "/redirect" => (
                    "302 Found",
                    "location: http://127.0.0.1:1/stolen\r\n",
                    String::new(),
                ),
                "/big" => ("200 OK", "", "x".repeat(64 * 1024)),
                _ => ("200 OK", "", "hello".to_owned()),
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (origin, heads)
}

#[test]
fn the_network_transport_injects_the_secret_and_follows_no_redirect() {
    let (origin, heads) = tiny_server();
    let policy = Policy::for_origin(&origin)
        .unwrap()
        .with_secret_header("X-Api-Key", "net-secret")
        .unwrap()
        .with_request_pacer(RequestPacer::in_memory())
        .with_max_response_bytes(1024);
    let transport: Arc<dyn Transport> = Arc::new(policy.guard(Arc::new(NetworkTransport::new())));
    let options = HostOptions::new().with_transport(transport);
    let mut instance = test_provider().instantiate(options).unwrap();

    let hello = instance
        .probe(&ctx(&format!("{origin}/hello")))
        .unwrap()
        .unwrap();
    assert_eq!(hello.diagnostics, vec!["hello"]);

    let redirect = instance
        .probe(&ctx(&format!("{origin}/redirect")))
        .unwrap()
        .unwrap();
    assert_eq!(redirect.summary, "status 302");

    let big = instance.probe(&ctx(&format!("{origin}/big"))).unwrap();
    match big {
        Err(ProviderError::TransportFailed(failure)) => {
            assert!(failure.detail.contains("size"), "{failure:?}")
        }
        other => panic!("expected the size cap, got {other:?}"),
    }

    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 3, "{heads:?}");
    assert!(heads[0].starts_with("GET /hello HTTP/1.1"), "{}", heads[0]);
    assert!(heads[0]
        .to_ascii_lowercase()
        .contains("x-api-key: net-secret"));
    assert!(heads[1].starts_with("GET /redirect "));
    assert!(heads[2].starts_with("GET /big "));
}

#[test]
fn the_artifact_cache_reuses_a_compiled_component() {
    let dir = std::env::temp_dir().join(format!("sandbox-host-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = sandbox_host::ArtifactCache::new(&dir);
    let engine = shared_engine().unwrap();
    let wasm = workspace_dir()
        .join("target/sandbox-host-fixtures/wasm32-wasip2/release/test_provider.wasm");
    test_provider(); // makes sure it is built
    let bytes = std::fs::read(&wasm).unwrap();
    let artifact = cache.artifact_path(&engine, &bytes);

    let first = ProviderComponent::load_cached(&engine, &wasm, &cache).unwrap();
    assert!(artifact.is_file());
    let stored = std::fs::metadata(&artifact).unwrap().modified().unwrap();
    let second = ProviderComponent::load_cached(&engine, &wasm, &cache).unwrap();
    assert_eq!(
        std::fs::metadata(&artifact).unwrap().modified().unwrap(),
        stored
    );
    for component in [first, second] {
        let description = component
            .instantiate(HostOptions::new())
            .unwrap()
            .describe()
            .unwrap();
        assert_eq!(description.driver_key, "test");
    }

    // A corrupt artifact is recompiled, not trusted.
    std::fs::write(&artifact, b"garbage").unwrap();
    let third = ProviderComponent::load_cached(&engine, &wasm, &cache).unwrap();
    assert!(third
        .instantiate(HostOptions::new())
        .unwrap()
        .describe()
        .is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 13: the host checks the contract version a component exports. A
/// component built for 0.1.0 is refused at load with both versions named
/// and the fix, never half-run.
#[test]
fn a_component_built_for_another_contract_version_is_refused_by_name() {
    let wasm = common::build_fixture("contract-v0-1");
    let engine = sandbox_host::shared_engine().unwrap();
    let error = match sandbox_host::ProviderComponent::load(&engine, &wasm) {
        Ok(_) => panic!("a 0.1.0 component was loaded by a 0.7.0 host"),
        Err(error) => format!("{error:#}"),
    };
    assert!(error.contains("sandbox:provider/provider@0.1.0"), "{error}");
    assert!(error.contains("sandbox:provider/provider@0.7.0"), "{error}");
    assert!(error.contains("sandbox:provider/provider@0.6.0"), "{error}");
    assert!(error.contains("sandbox:provider/provider@0.5.0"), "{error}");
    assert!(error.contains("sandbox:provider/provider@0.4.0"), "{error}");
    assert!(error.contains("sandbox:provider/provider@0.3.0"), "{error}");
    assert!(error.contains("sandbox:provider/provider@0.2.0"), "{error}");
    assert!(error.contains("rebuild"), "{error}");
}

/// Contract 0.3.0 (issue 23 item 4) added `provider-error.output-lost`, and
/// 0.4.0 made live output bytes; a component built for 0.2.0 still loads,
/// and every value crosses intact both ways: the description, the request
/// the host sends, live output (its text as UTF-8 bytes), the result, and a
/// `cleanup-failed` with its partial output.
#[test]
fn a_component_built_for_contract_0_2_still_loads_and_converts_every_value() {
    use sandbox_host::types::{CleanupPhase, FileUpload};
    let (mut instance, output) = fixture_instance("contract-v0-2", "0.2.0", true);

    let upload = FileUpload {
        remote_path: "a".into(),
        contents: vec![7; 300_000],
    };
    let report = instance
        .sync_in(&ctx("{}"), &lease(), &[upload.clone(), upload])
        .unwrap()
        .unwrap();
    assert_eq!((report.files, report.bytes), (2, 600_000));

    let mut request = test_support::command("echo", &["a b", "c"])
        .cwd("/w")
        .env("K", "v")
        .stdin(b"12345")
        .timeout_ms(900);
    let result = instance
        .execute(&ctx("{}"), &lease(), &request)
        .unwrap()
        .unwrap();
    assert_eq!(
        result.stdout,
        "echo a b c env=[(\"K\", \"v\")] stdin=5 timeout=Some(900) cwd=Some(\"/w\") \
         lease=sb-1 company=company"
    );
    assert_eq!(
        (
            result.exit_code,
            result.output_truncated,
            result.stderr.as_str()
        ),
        (Some(3), true, "live")
    );
    assert_eq!(
        output.chunks(),
        vec![(OutputStream::Stderr, b"live".to_vec())]
    );

    request.command = "leave-running".into();
    match instance.execute(&ctx("{}"), &lease(), &request).unwrap() {
        Err(ProviderError::CleanupFailed(failure)) => {
            assert_eq!(failure.phase, CleanupPhase::ProcessTermination);
            assert_eq!(failure.process_id.as_deref(), Some("p-1"));
            let partial = failure.partial.unwrap();
            assert!(partial.timed_out);
            assert!(partial.stdout.starts_with("leave-running a b c"));
        }
        other => panic!("{other:?}"),
    }
}

/// An instance of the fixture `name`, a component built for contract
/// `version` whose live output is text (before 0.4.0) or not, with its
/// live output captured. Every old-contract fixture describes itself the
/// same way (driver key `old-0-<minor>`), which is checked here with its
/// config validation and a resumed lease: those values cross intact.
fn fixture_instance(
    name: &str,
    version: &str,
    text: bool,
) -> (sandbox_host::ProviderInstance, OutputCapture) {
    use sandbox_host::types::{Capabilities, ResumeOutcome};
    let wasm = common::build_fixture(name);
    let engine = sandbox_host::shared_engine().unwrap();
    let component = sandbox_host::ProviderComponent::load(&engine, &wasm).unwrap();
    assert_eq!(
        component.contract(),
        format!("sandbox:provider/provider@{version}")
    );
    assert_eq!(component.live_output_is_text(), text);
    let output = OutputCapture::new();
    let mut instance = component
        .instantiate(HostOptions::new().with_output_sink(output.sink()))
        .unwrap();
    let description = instance.describe().unwrap();
    let minor = version.split('.').nth(1).unwrap();
    assert_eq!(description.driver_key, format!("old-0-{minor}"));
    assert_eq!(
        description.capabilities,
        Capabilities::REUSABLE_LEASES | Capabilities::NATIVE_SYNC
    );
    assert_eq!(description.origin_fields[0].config_field, "apiUrl");
    assert_eq!(description.rate_limit.as_ref().unwrap().requests, 7);
    let validation = instance.validate_config("{}").unwrap();
    assert_eq!(validation.budget.unwrap().operation_ms, 5_000);
    match instance.resume_lease(&ctx("{}"), &lease()).unwrap() {
        Ok(ResumeOutcome::Resumed(back)) => assert_eq!(back.provider_lease_id, "sb-1"),
        other => panic!("{other:?}"),
    }
    (instance, output)
}

/// Contract 0.5.0 added `execute-request.result-chars`; a component built
/// for 0.4.0 still loads, its live bytes arrive exactly (one chunk is not
/// UTF-8), every value crosses intact both ways, and since it cannot be
/// asked for less text, the host cuts its answer to the characters asked
/// for (the result's and an error's partial output alike), saying so with
/// `output-truncated`.
#[test]
fn a_component_built_for_contract_0_4_still_loads_and_its_answer_keeps_the_chars_asked_for() {
    use sandbox_host::types::CleanupPhase;
    let (mut instance, output) = fixture_instance("contract-v0-4", "0.4.0", false);

    let mut request = test_support::command("echo", &["a b", "c"])
        .cwd("/w")
        .env("K", "v")
        .stdin(b"12345")
        .timeout_ms(900);
    let whole = "echo a b c env=[(\"K\", \"v\")] stdin=5 timeout=Some(900) cwd=Some(\"/w\") \
                 lease=sb-1 company=company";
    let result = instance
        .execute(&ctx("{}"), &lease(), &request)
        .unwrap()
        .unwrap();
    assert_eq!(result.stdout, whole);
    assert_eq!(
        (result.exit_code, result.output_truncated),
        (Some(3), false)
    );
    assert_eq!(
        output.chunks(),
        vec![
            (OutputStream::Stderr, b"live".to_vec()),
            (OutputStream::Stdout, "héllo ".as_bytes().to_vec()),
            (OutputStream::Stdout, b"w\xf6rld\n".to_vec()),
        ]
    );

    request.result_chars = Some(12);
    let result = instance
        .execute(&ctx("{}"), &lease(), &request)
        .unwrap()
        .unwrap();
    assert_eq!(result.stdout, "ompany=company"[2..]);
    assert_eq!(result.stderr, "live");
    assert!(result.output_truncated);
    request.result_chars = Some(0);
    let result = instance
        .execute(&ctx("{}"), &lease(), &request)
        .unwrap()
        .unwrap();
    assert_eq!((result.stdout.as_str(), result.stderr.as_str()), ("", ""));
    assert!(result.output_truncated);

    request.command = "lose-output".into();
    request.result_chars = Some(3);
    match instance.execute(&ctx("{}"), &lease(), &request).unwrap() {
        Err(ProviderError::OutputLost(loss)) => {
            assert_eq!((loss.lost_bytes, loss.lost_chunks), (Some(4096), Some(2)));
            assert_eq!(loss.partial.stdout, "d\u{fffd}\n");
            assert_eq!(loss.partial.stderr, "ive");
            assert!(loss.partial.output_truncated);
        }
        other => panic!("{other:?}"),
    }

    request.command = "leave-running".into();
    request.result_chars = None;
    match instance.execute(&ctx("{}"), &lease(), &request).unwrap() {
        Err(ProviderError::CleanupFailed(failure)) => {
            assert_eq!(failure.phase, CleanupPhase::ProcessTermination);
            let partial = failure.partial.unwrap();
            assert!(partial.timed_out && !partial.output_truncated);
            assert!(partial.stdout.starts_with("leave-running a b c"));
        }
        other => panic!("{other:?}"),
    }
}

/// Contract 0.4.0 made `host.emit-output` carry bytes; a component built for
/// 0.3.0 (text) still loads, its live text arrives as its UTF-8 bytes in
/// order on both streams, and every value crosses intact both ways,
/// `output-lost` included (which 0.2.0 lacks).
#[test]
fn a_component_built_for_contract_0_3_still_loads_and_its_output_arrives() {
    use sandbox_host::types::CleanupPhase;
    let (mut instance, output) = fixture_instance("contract-v0-3", "0.3.0", true);

    let mut request = test_support::command("echo", &["a b", "c"])
        .cwd("/w")
        .env("K", "v")
        .stdin(b"12345")
        .timeout_ms(900);
    let result = instance
        .execute(&ctx("{}"), &lease(), &request)
        .unwrap()
        .unwrap();
    assert_eq!(
        result.stdout,
        "echo a b c env=[(\"K\", \"v\")] stdin=5 timeout=Some(900) cwd=Some(\"/w\") \
         lease=sb-1 company=company"
    );
    assert_eq!((result.exit_code, result.output_truncated), (Some(3), true));
    assert_eq!(
        output.chunks(),
        vec![
            (OutputStream::Stderr, b"live".to_vec()),
            (OutputStream::Stdout, "héllo ".as_bytes().to_vec()),
            (OutputStream::Stdout, "wörld\u{fffd}\n".as_bytes().to_vec()),
        ]
    );

    request.command = "lose-output".into();
    match instance.execute(&ctx("{}"), &lease(), &request).unwrap() {
        Err(ProviderError::OutputLost(loss)) => {
            assert_eq!(loss.operation, "connect");
            assert_eq!((loss.lost_bytes, loss.lost_chunks), (Some(4096), Some(2)));
            assert!(!loss.tree_deleted);
            assert_eq!(loss.partial.stdout, "héllo wörld\u{fffd}\n");
            assert!(loss.partial.output_truncated);
        }
        other => panic!("{other:?}"),
    }

    request.command = "leave-running".into();
    match instance.execute(&ctx("{}"), &lease(), &request).unwrap() {
        Err(ProviderError::CleanupFailed(failure)) => {
            assert_eq!(failure.phase, CleanupPhase::ProcessTermination);
            assert!(failure.partial.unwrap().timed_out);
        }
        other => panic!("{other:?}"),
    }
}
