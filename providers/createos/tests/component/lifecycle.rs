//! acquire, resume, release, destroy, probe and realize.

use crate::support::*;
use sandbox_host::types::*;
use sandbox_host::ScriptedResponse;
use serde_json::{json, Value};

fn sandbox_path() -> String {
    format!("/v1/sandboxes/{SANDBOX}")
}

fn acquire_request() -> AcquireRequest {
    AcquireRequest {
        run_id: "run-1".into(),
        requested_cwd: Some("project".into()),
        workspace_mode: None,
        requested_expires_at: None,
        egress: None,
        adapter_type: None,
        image: None,
        template: None,
    }
}

/// An acquire against `fake` (a trap fails the test).
fn acquire(fake: &Fake) -> Result<Lease, ProviderError> {
    fake.instance()
        .acquire_lease(&ctx(), &acquire_request())
        .unwrap()
}

/// The provider error of an acquire against `fake`.
fn acquire_error(fake: &Fake) -> ProviderError {
    acquire(fake).unwrap_err()
}

/// `realize-workspace` of `request` on the test lease against `fake`.
fn realize(fake: &Fake, request: &WorkspaceRequest) -> Result<String, ProviderError> {
    fake.instance()
        .realize_workspace(&ctx(), &lease(), request)
        .unwrap()
}

fn status(s: &str) -> ScriptedResponse {
    ScriptedResponse::jsend_success(json!({"id": SANDBOX, "status": s, "shape": "s-1vcpu-1gb"}))
}

fn is_get_sandbox(req: &sandbox_host::RecordedRequest) -> bool {
    req.method == "GET" && req.path() == sandbox_path()
}

#[test]
fn acquire_creates_waits_prepares_and_marks() {
    let fake = Fake::with(|req, n| (is_get_sandbox(req) && n < 2).then(|| status("creating")));
    let lease = fake
        .instance()
        .acquire_lease(&ctx(), &acquire_request())
        .unwrap()
        .unwrap();
    assert_eq!(lease.provider_lease_id, SANDBOX);
    let create = &fake.requests_to("POST /v1/sandboxes")[0];
    assert_eq!(
        create.body_json().unwrap(),
        json!({"shape": "s-1vcpu-1gb", "ingress_enabled": false})
    );
    assert_eq!(fake.sandbox_calls("GET", ""), 3, "polled until running");
    let mkdir = &fake.requests_to(&format!("POST {}/exec", sandbox_path()))[0];
    assert_eq!(
        mkdir.body_json().unwrap(),
        json!({"cmd": "/bin/mkdir", "args": ["-p", "--", "/paperclip-workspace", "/paperclip-workspace/project"]})
    );
    let marker = &fake.requests_to(&format!("PUT {}/files", sandbox_path()))[0];
    assert_eq!(
        query_param(marker, "path"),
        "/paperclip-workspace/.paperclip-lease-marker"
    );
    let metadata: Value = serde_json::from_str(&lease.metadata).unwrap();
    assert_eq!(metadata["sandboxId"], SANDBOX);
    assert_eq!(metadata["environmentId"], "env-1");
    assert_eq!(metadata["cwd"], "/paperclip-workspace/project");
    assert_eq!(
        metadata["marker"].as_str().unwrap().as_bytes(),
        &marker.body[..]
    );
    assert!(fake.sandbox_calls("DELETE", "") == 0);
}

/// Issue 41 item 2: where the working directory is the workspace root
/// (no `requested_cwd`), writing the marker makes it (the Files API creates
/// a file's parents): acquire runs no `mkdir`.
#[test]
fn acquire_in_the_workspace_root_makes_it_by_writing_the_marker() {
    let fake = Fake::new();
    let request = AcquireRequest {
        requested_cwd: None,
        ..acquire_request()
    };
    let lease = fake
        .instance()
        .acquire_lease(&ctx(), &request)
        .unwrap()
        .unwrap();
    assert!(fake
        .requests_to(&format!("POST {}/exec", sandbox_path()))
        .is_empty());
    let marker = &fake.requests_to(&format!("PUT {}/files", sandbox_path()))[0];
    assert_eq!(
        query_param(marker, "path"),
        "/paperclip-workspace/.paperclip-lease-marker"
    );
    let metadata: Value = serde_json::from_str(&lease.metadata).unwrap();
    assert_eq!(metadata["cwd"], "/paperclip-workspace");
}

/// Contract 0.2.0 (`host.record-sandbox`): the provider reports the new
/// sandbox's id as soon as the creation answer names it, before any other
/// request, so a host that dies mid-acquire can still delete it.
#[test]
fn acquire_records_its_sandbox_before_any_other_request() {
    use std::sync::{Arc, Mutex};
    let fake = Fake::new();
    let recorded: Arc<Mutex<Vec<(String, usize)>>> = Arc::default();
    let recorder = {
        let (recorded, transport) = (recorded.clone(), fake.transport.clone());
        Arc::new(move |id: &str| {
            let sent = transport.requests().len();
            recorded.lock().unwrap().push((id.to_owned(), sent));
            Ok(())
        })
    };
    let lease = component()
        .instantiate(
            sandbox_host::HostOptions::new()
                .with_transport(fake.transport.shared())
                .with_sandbox_recorder(recorder),
        )
        .unwrap()
        .acquire_lease(&ctx(), &acquire_request())
        .unwrap()
        .unwrap();
    assert_eq!(lease.provider_lease_id, SANDBOX);
    assert_eq!(
        *recorded.lock().unwrap(),
        vec![(SANDBOX.to_owned(), 1)],
        "recorded once, right after the creation request"
    );
}

#[test]
fn acquire_refuses_an_expiry_before_creating_anything() {
    let fake = Fake::new();
    let mut request = acquire_request();
    request.requested_expires_at = Some("2030-01-01T00:00:00Z".into());
    let error = fake
        .instance()
        .acquire_lease(&ctx(), &request)
        .unwrap()
        .unwrap_err();
    assert!(matches!(error, ProviderError::Unsupported(_)), "{error:?}");
    assert!(fake.calls().is_empty());
}

/// `hardExpiry` (a backend that attests a hard expiry, as createos-local
/// does): the expiry asked is sent with the creation, and a lease is
/// given only with an attested expiry at or before it; otherwise the
/// sandbox is deleted and the acquire fails (Paperclip fails closed
/// without one, and an unbounded sandbox must not stay behind).
#[test]
fn a_requested_expiry_needs_the_backends_attestation() {
    let asked = "2030-01-01T00:00:08.500Z";
    let hard_expiry = || {
        ctx_with(
            json!({"apiUrl": API_URL, "timeoutMs": 20_000, "requestTimeoutMs": 1_500, "hardExpiry": true})
                .to_string(),
        )
    };
    let mut request = acquire_request();
    request.requested_expires_at = Some(asked.into());
    let answering = |expires_at: Value| {
        Fake::with(move |req, _| {
            (req.method == "POST" && req.path() == "/v1/sandboxes").then(|| {
                ScriptedResponse::jsend_success(
                    json!({"id": SANDBOX, "status": "creating", "expires_at": expires_at}),
                )
            })
        })
    };

    // Attested, in whole seconds (and the same instant as another offset reads).
    for attested in ["2030-01-01T00:00:08Z", "2030-01-01T01:00:08.5+01:00"] {
        let fake = answering(attested.into());
        let lease = fake
            .instance()
            .acquire_lease(&hard_expiry(), &request)
            .unwrap()
            .unwrap();
        assert_eq!(lease.expires_at.as_deref(), Some(attested));
        let create = &fake.requests_to("POST /v1/sandboxes")[0];
        assert_eq!(create.body_json().unwrap()["expires_at"], asked);
        assert_eq!(fake.sandbox_calls("DELETE", ""), 0);
    }

    // Not attested, later than asked, or unreadable: deleted, and an error.
    for attested in [
        Value::Null,
        "2030-01-01T00:00:09Z".into(),
        "2030-01-01T00:00:08.5001Z".into(),
        "soon".into(),
    ] {
        let fake = answering(attested.clone());
        let error = fake
            .instance()
            .acquire_lease(&hard_expiry(), &request)
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(&error, ProviderError::InvalidResponse(r) if r.reason.contains("expiry")),
            "{attested}: {error:?}"
        );
        assert_eq!(fake.sandbox_calls("DELETE", ""), 1, "{attested}: deleted");
    }

    // An expiry that is not a time is refused before any request.
    let fake = Fake::new();
    request.requested_expires_at = Some("tomorrow".into());
    let error = fake
        .instance()
        .acquire_lease(&hard_expiry(), &request)
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(error, ProviderError::InvalidRequest(_)),
        "{error:?}"
    );
    assert!(fake.calls().is_empty());
}

#[test]
fn a_failed_setup_deletes_the_sandbox_and_reports_the_setup_error() {
    let fake = Fake::with(|req, _| req.path().ends_with("/exec").then(|| error_answer(500)));
    let error = acquire_error(&fake);
    assert!(
        matches!(&error, ProviderError::ApiRejected(r) if r.status == 500 && r.operation == "create-workspace"),
        "{error:?}"
    );
    assert_no_body(&error);
    assert_eq!(
        fake.calls().last().unwrap(),
        &format!("DELETE {}", sandbox_path())
    );
}

#[test]
fn a_failed_setup_with_a_failed_delete_is_a_cleanup_failure() {
    let fake = Fake::with(|req, _| {
        if req.path().ends_with("/files") {
            return Some(error_answer(503));
        }
        (req.method == "DELETE").then(|| error_answer(500))
    });
    match acquire(&fake) {
        Err(ProviderError::CleanupFailed(failure)) => {
            assert_eq!(failure.phase, CleanupPhase::LeaseSetup);
            assert_eq!(failure.sandbox_id.as_deref(), Some(SANDBOX));
            assert_matches_cause(failure.cause, |c| {
                matches!(c, CleanupCause::HttpStatus(500))
            });
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_sandbox_that_fails_to_start_is_deleted() {
    let fake = Fake::with(|req, _| is_get_sandbox(req).then(|| status("failed")));
    let error = acquire_error(&fake);
    assert!(
        matches!(error, ProviderError::InvalidResponse(_)),
        "{error:?}"
    );
    assert_eq!(
        fake.calls().last().unwrap(),
        &format!("DELETE {}", sandbox_path())
    );
}

#[test]
fn an_ambiguous_sandbox_creation_is_a_cleanup_failure_without_an_id() {
    for answer in [
        error_answer(502),
        ScriptedResponse::Error(ErrorCode::ConnectionTerminated),
        ScriptedResponse::jsend_success(json!({"id": "bad id"})),
    ] {
        let answer = std::sync::Mutex::new(Some(answer));
        let fake = Fake::with(move |req, _| {
            (req.path() == "/v1/sandboxes").then(|| answer.lock().unwrap().take().unwrap())
        });
        match acquire(&fake) {
            Err(ProviderError::CleanupFailed(failure)) => {
                assert_eq!(failure.phase, CleanupPhase::LeaseSetup);
                assert_eq!(failure.sandbox_id, None);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(fake.calls().len(), 1);
    }
}

#[test]
fn a_rejected_sandbox_creation_is_an_api_rejection() {
    let fake = Fake::with(|req, _| (req.path() == "/v1/sandboxes").then(|| error_answer(401)));
    let error = acquire_error(&fake);
    assert!(
        matches!(&error, ProviderError::ApiRejected(r) if r.status == 401 && r.operation == "create-sandbox"),
        "{error:?}"
    );
}

/// A fake whose marker file holds `marker-123`, as the default lease says.
fn with_marker(
    extra: impl Fn(&sandbox_host::RecordedRequest, usize) -> Option<ScriptedResponse>
        + Send
        + Sync
        + 'static,
) -> Fake {
    Fake::with(move |req, n| {
        extra(req, n).or_else(|| {
            (req.method == "GET" && req.path().ends_with("/files")).then(|| {
                ScriptedResponse::Full {
                    status: 200,
                    headers: vec![],
                    body: "marker-123".into(),
                }
            })
        })
    })
}

fn resume(fake: &Fake) -> Result<ResumeOutcome, ProviderError> {
    fake.instance().resume_lease(&ctx(), &lease()).unwrap()
}

#[test]
fn resume_checks_the_marker() {
    let fake = with_marker(|_, _| None);
    assert!(
        matches!(resume(&fake), Ok(ResumeOutcome::Resumed(l)) if l.provider_lease_id == SANDBOX)
    );
    let marker = &fake.requests_to(&format!("GET {}/files", sandbox_path()))[0];
    assert_eq!(
        query_param(marker, "path"),
        "/paperclip-workspace/.paperclip-lease-marker"
    );
}

#[test]
fn resume_wakes_a_paused_sandbox() {
    let fake = with_marker(|req, n| {
        is_get_sandbox(req).then(|| match n {
            0 => status("paused"),
            1 => status("resuming"),
            _ => status("running"),
        })
    });
    assert!(matches!(resume(&fake), Ok(ResumeOutcome::Resumed(_))));
    assert_eq!(fake.sandbox_calls("POST", "/resume"), 1);
}

#[test]
fn resume_waits_for_a_pause_in_progress_before_resuming() {
    let fake = with_marker(|req, n| {
        is_get_sandbox(req).then(|| match n {
            0 | 1 => status("pausing"),
            2 => status("paused"),
            _ => status("running"),
        })
    });
    assert!(matches!(resume(&fake), Ok(ResumeOutcome::Resumed(_))));
    let calls = fake.calls();
    let resume_at = calls
        .iter()
        .position(|c| c.ends_with("/resume"))
        .expect("resumed");
    assert_eq!(resume_at, 3, "resume only once paused: {calls:?}");
}

#[test]
fn resume_expires_only_when_provably_gone() {
    let gone: Vec<Box<dyn Fn() -> ScriptedResponse + Send + Sync>> = vec![
        Box::new(|| error_answer(404)),
        Box::new(|| status("destroyed")),
        Box::new(|| status("failed")),
        Box::new(|| {
            ScriptedResponse::jsend_success(
                json!({"id": SANDBOX, "status": "running", "shape": "s-8vcpu-16gb"}),
            )
        }),
    ];
    for answer in gone {
        let fake = with_marker(move |req, _| is_get_sandbox(req).then(&answer));
        assert!(
            matches!(resume(&fake), Ok(ResumeOutcome::Expired(_))),
            "{:?}",
            resume(&fake)
        );
    }
    let wrong_marker = Fake::with(|req, _| {
        (req.method == "GET" && req.path().ends_with("/files")).then(|| ScriptedResponse::Full {
            status: 200,
            headers: vec![],
            body: "other".into(),
        })
    });
    assert!(matches!(
        resume(&wrong_marker),
        Ok(ResumeOutcome::Expired(_))
    ));
    let no_marker = Fake::new();
    assert!(matches!(resume(&no_marker), Ok(ResumeOutcome::Expired(_))));
}

#[test]
fn transient_failures_on_resume_are_errors_not_expiry() {
    let transient: Vec<Box<dyn Fn() -> ScriptedResponse + Send + Sync>> = vec![
        Box::new(|| error_answer(500)),
        Box::new(|| error_answer(429)),
        Box::new(|| ScriptedResponse::Error(ErrorCode::ConnectionRefused)),
        Box::new(|| {
            ScriptedResponse::jsend_success(json!({"id": "sb-other", "status": "running"}))
        }),
    ];
    for answer in transient {
        let fake = with_marker(move |req, _| is_get_sandbox(req).then(&answer));
        let outcome = resume(&fake);
        assert!(outcome.is_err(), "{outcome:?}");
        assert_no_body(&outcome);
    }
    let marker_500 = Fake::with(|req, _| {
        (req.method == "GET" && req.path().ends_with("/files")).then(|| error_answer(500))
    });
    assert!(resume(&marker_500).is_err());
}

fn reusable_ctx() -> EnvironmentContext {
    ctx_with(json!({"apiUrl": API_URL, "reuseLease": true, "requestTimeoutMs": 1500}).to_string())
}

fn reusable_lease() -> Lease {
    Lease {
        provider_lease_id: SANDBOX.into(),
        metadata: metadata(true).to_string(),
        expires_at: None,
    }
}

#[test]
fn release_pauses_a_reusable_lease() {
    let fake = Fake::with(|req, n| {
        is_get_sandbox(req).then(|| status(["running", "pausing", "paused"][n.min(2)]))
    });
    let receipt = fake
        .instance()
        .release_lease(&reusable_ctx(), &reusable_lease())
        .unwrap()
        .unwrap();
    assert_eq!(receipt.action, TerminationAction::Paused);
    assert_eq!(fake.sandbox_calls("POST", "/pause"), 1);
    assert!(fake.sandbox_calls("DELETE", "") == 0);
}

#[test]
fn release_deletes_a_lease_that_is_not_reusable() {
    let fake = Fake::new();
    let receipt = fake
        .instance()
        .release_lease(&ctx(), &lease())
        .unwrap()
        .unwrap();
    assert_eq!(receipt.action, TerminationAction::Deleted);
    assert_eq!(fake.calls(), vec![format!("DELETE {}", sandbox_path())]);
}

#[test]
fn destroy_treats_404_as_gone_and_failures_as_cleanup_failures() {
    let fake = Fake::new();
    assert_eq!(
        fake.instance()
            .destroy_lease(&ctx(), &lease())
            .unwrap()
            .unwrap()
            .action,
        TerminationAction::Deleted
    );
    let gone = Fake::with(|req, _| (req.method == "DELETE").then(|| error_answer(404)));
    assert_eq!(
        gone.instance()
            .destroy_lease(&ctx(), &lease())
            .unwrap()
            .unwrap()
            .action,
        TerminationAction::AlreadyGone
    );
    for answer in [error_answer(500), error_answer(403)] {
        let answer = std::sync::Mutex::new(Some(answer));
        let failing = Fake::with(move |req, _| {
            (req.method == "DELETE").then(|| answer.lock().unwrap().take().unwrap())
        });
        match failing.instance().destroy_lease(&ctx(), &lease()).unwrap() {
            Err(ProviderError::CleanupFailed(failure)) => {
                assert_eq!(failure.phase, CleanupPhase::SandboxDeletion);
                assert_eq!(failure.sandbox_id.as_deref(), Some(SANDBOX));
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn probe_creates_echoes_and_always_deletes() {
    let fake = Fake::new();
    let report = fake.instance().probe(&ctx()).unwrap().unwrap();
    assert!(report.ok, "{report:?}");
    let echo = &fake.requests_to(&format!("POST {}/exec", sandbox_path()))[0];
    let body = echo.body_json().unwrap();
    assert_eq!(body["cmd"], "/bin/echo");
    assert!(body["args"][0]
        .as_str()
        .unwrap()
        .starts_with("paperclip-probe-"));
    assert_eq!(
        fake.calls().last().unwrap(),
        &format!("DELETE {}", sandbox_path())
    );

    let failing_exec =
        Fake::with(|req, _| req.path().ends_with("/exec").then(|| error_answer(500)));
    assert!(failing_exec.instance().probe(&ctx()).unwrap().is_err());
    assert_eq!(
        failing_exec.calls().last().unwrap(),
        &format!("DELETE {}", sandbox_path()),
        "deleted anyway"
    );

    let failing_delete = Fake::with(|req, _| (req.method == "DELETE").then(|| error_answer(500)));
    let error = failing_delete
        .instance()
        .probe(&ctx())
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(&error, ProviderError::CleanupFailed(f) if f.phase == CleanupPhase::SandboxDeletion),
        "{error:?}"
    );
}

#[test]
fn realize_makes_the_workspace_directory() {
    let fake = Fake::new();
    let request = WorkspaceRequest {
        remote_path: Some("sub/dir".into()),
    };
    let cwd = realize(&fake, &request).unwrap();
    assert_eq!(cwd, "/paperclip-workspace/sub/dir");
    let mkdir = &fake.requests_to(&format!("POST {}/exec", sandbox_path()))[0];
    assert_eq!(
        mkdir.body_json().unwrap(),
        json!({"cmd": "/bin/mkdir", "args": ["-p", "--", "/paperclip-workspace/sub/dir"]})
    );
    let escape = WorkspaceRequest {
        remote_path: Some("../etc".into()),
    };
    let error = realize(&fake, &escape).unwrap_err();
    assert!(matches!(error, ProviderError::InvalidRequest(_)));
}

#[test]
fn sync_in_writes_files_and_sync_out_reads_them_back() {
    let fake = Fake::new();
    let files = vec![
        FileUpload {
            remote_path: "src/main.rs".into(),
            contents: b"fn main() {}".to_vec(),
        },
        FileUpload {
            remote_path: "/tmp/data.bin".into(),
            contents: vec![0, 255, 1],
        },
    ];
    let report = fake
        .instance()
        .sync_in(&ctx(), &lease(), &files)
        .unwrap()
        .unwrap();
    assert_eq!((report.files, report.bytes), (2, 15));
    let puts = fake.requests_to(&format!("PUT {}/files", sandbox_path()));
    assert_eq!(
        query_param(&puts[0], "path"),
        "/paperclip-workspace/src/main.rs"
    );
    assert_eq!(&puts[1].body[..], &[0, 255, 1]);
    let paths = vec!["src/main.rs".to_string(), "/tmp/data.bin".to_string()];
    let downloads = fake
        .instance()
        .sync_out(&ctx(), &lease(), &paths)
        .unwrap()
        .unwrap();
    assert_eq!(downloads[0].remote_path, "/paperclip-workspace/src/main.rs");
    assert_eq!(downloads[0].contents, b"fn main() {}");
    assert_eq!(downloads[1].contents, vec![0, 255, 1]);
}

#[test]
fn sync_refuses_bad_paths_before_any_request_and_reports_missing_files() {
    let fake = Fake::new();
    let files = vec![
        FileUpload {
            remote_path: "ok".into(),
            contents: vec![],
        },
        FileUpload {
            remote_path: "../../etc/passwd".into(),
            contents: vec![],
        },
    ];
    let error = fake
        .instance()
        .sync_in(&ctx(), &lease(), &files)
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(error, ProviderError::InvalidRequest(_)),
        "{error:?}"
    );
    assert!(fake.calls().is_empty());
    let error = fake
        .instance()
        .sync_out(&ctx(), &lease(), &["missing".to_string()])
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(&error, ProviderError::ApiRejected(r) if r.status == 404 && r.operation == "sync-out"),
        "{error:?}"
    );
}

#[test]
fn destroy_accepts_the_bare_sandbox_id_of_a_failed_setup() {
    let fake = Fake::new();
    let record = Lease {
        provider_lease_id: SANDBOX.into(),
        metadata: "{}".into(),
        expires_at: None,
    };
    let receipt = fake
        .instance()
        .destroy_lease(&ctx(), &record)
        .unwrap()
        .unwrap();
    assert_eq!(receipt.action, TerminationAction::Deleted);
    assert_eq!(fake.calls(), vec![format!("DELETE {}", sandbox_path())]);
    let bad = Lease {
        provider_lease_id: "../x".into(),
        metadata: "{}".into(),
        expires_at: None,
    };
    assert!(matches!(
        fake.instance().destroy_lease(&ctx(), &bad).unwrap(),
        Err(ProviderError::ForeignLease(_))
    ));
}

/// Pins issue 9 item 7: a sandbox creation that never reached the server
/// (host denial, DNS, connection refused, connect or TLS failure) was
/// reported as `cleanup-failed` ("creation unconfirmed", sandbox
/// `<unknown>`), so a typo in `apiUrl` looked like a possible leak. Nothing
/// can exist: it is `transport-failed`, and nothing else is sent.
#[test]
fn a_sandbox_creation_that_never_reached_the_server_is_a_transport_failure() {
    for code in never_sent_errors() {
        for probe in [false, true] {
            let answer = code.clone();
            let fake = Fake::with(move |req, _| {
                (req.path() == "/v1/sandboxes").then(|| ScriptedResponse::Error(answer.clone()))
            });
            let mut instance = fake.instance();
            let outcome = if probe {
                instance.probe(&ctx()).unwrap().map(|_| ())
            } else {
                instance
                    .acquire_lease(&ctx(), &acquire_request())
                    .unwrap()
                    .map(|_| ())
            };
            match outcome {
                Err(ProviderError::TransportFailed(failure)) => {
                    assert_eq!(failure.operation, "create-sandbox");
                    let kind = if matches!(code, ErrorCode::HttpRequestDenied) {
                        TransportKind::Denied
                    } else {
                        TransportKind::Unreachable
                    };
                    assert_eq!(failure.kind, kind, "{code:?}");
                    assert!(
                        !failure.detail.contains(&format!("{code:?}")),
                        "a message for people, not a Rust name: {}",
                        failure.detail
                    );
                }
                other => panic!("{code:?} (probe {probe}): {other:?}"),
            }
            assert_eq!(fake.calls(), vec!["POST /v1/sandboxes".to_string()]);
        }
    }
}

/// The other half of issue 9 item 7: a creation that may have reached the
/// server stays "creation unconfirmed".
#[test]
fn a_sandbox_creation_that_broke_after_sending_stays_unconfirmed() {
    for code in after_send_errors() {
        let answer = code.clone();
        let fake = Fake::with(move |req, _| {
            (req.path() == "/v1/sandboxes").then(|| ScriptedResponse::Error(answer.clone()))
        });
        match acquire(&fake) {
            Err(ProviderError::CleanupFailed(failure)) => {
                assert_eq!(failure.phase, CleanupPhase::LeaseSetup, "{code:?}");
                assert_eq!(failure.sandbox_id, None);
            }
            other => panic!("{code:?}: {other:?}"),
        }
    }
}

/// A reusable release against a sandbox whose `at`-th read (from 0) shows
/// `state` and every other `running`.
fn release_reading(at: usize, state: &'static str) -> Result<TerminationReceipt, ProviderError> {
    let fake = Fake::with(move |req, n| {
        is_get_sandbox(req).then(|| status(if n == at { state } else { "running" }))
    });
    fake.instance()
        .release_lease(&reusable_ctx(), &reusable_lease())
        .unwrap()
}

/// Pins issue 9 item 8: `error` and `destroying` were treated as proof that
/// the sandbox is gone — resume answered `expired` and a reusable release
/// `already-gone` — although the sandbox may still exist. Only 404,
/// `destroyed` and `failed` prove absence; these are errors.
#[test]
fn error_and_destroying_states_are_not_proof_of_absence() {
    for state in ["error", "destroying"] {
        // Resume: the first read, and the wait after the resume request.
        for at in [0, 1] {
            let fake = with_marker(move |req, n| {
                is_get_sandbox(req).then(|| match n {
                    n if n == at => status(state),
                    0 => status("paused"),
                    _ => status("running"),
                })
            });
            let outcome = resume(&fake);
            assert!(
                matches!(&outcome, Err(ProviderError::InvalidResponse(r)) if r.reason.contains(state)),
                "resume, {state} at read {at}: {outcome:?}"
            );
        }
        // Reusable release: the first read, and the wait for `paused`.
        for at in [0, 1] {
            let outcome = release_reading(at, state);
            assert!(
                matches!(&outcome, Err(ProviderError::InvalidResponse(r)) if r.reason.contains(state)),
                "release, {state} at read {at}: {outcome:?}"
            );
        }
    }
    // `destroyed` and `failed` still prove absence on release.
    for state in ["destroyed", "failed"] {
        let receipt = release_reading(1, state).unwrap();
        assert_eq!(receipt.action, TerminationAction::AlreadyGone, "{state}");
    }
}

/// Pins issue 9 item 10: resume compared shape, rootfs and region only
/// between the lease and the server's answer, so a lease acquired under
/// another config resumed although the config now asks for another
/// sandbox. The current config must match the lease.
#[test]
fn resume_expires_when_the_config_no_longer_matches_the_lease() {
    for (field, value) in [
        ("shape", "s-2vcpu-4gb"),
        ("rootfs", "ubuntu-24.04"),
        ("region", "eu-central"),
    ] {
        let mut config: Value = serde_json::from_str(&config_json()).unwrap();
        config[field] = Value::String(value.into());
        let fake = with_marker(|_, _| None);
        let outcome = fake
            .instance()
            .resume_lease(&ctx_with(config.to_string()), &lease())
            .unwrap();
        assert!(
            matches!(&outcome, Ok(ResumeOutcome::Expired(reason)) if reason.contains(field)),
            "{field}: {outcome:?}"
        );
    }
}
