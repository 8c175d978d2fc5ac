//! The README's example provider (`crates/provider-sdk/examples/
//! minimal_provider.rs`, under 150 lines) is a real component: the host
//! loads it, injects its key as a Bearer token, and it acquires, runs and
//! destroys against its (scripted) API.

use std::sync::Arc;

use sandbox_host::types::*;
use sandbox_host::{
    CancelToken, ProviderComponent, SandboxRuntime, ScriptedResponse, ScriptedTransport, Secrets,
    SqliteLeases,
};

fn component() -> ProviderComponent {
    test_support::components::load("examples/minimal_provider.wasm")
}

#[test]
fn the_example_provider_acquires_runs_and_destroys() {
    let script = ScriptedTransport::new(|req| match (req.method.as_str(), req.path()) {
        ("POST", "/sandboxes") => ScriptedResponse::json(201, r#"{"id":"sb-1"}"#),
        ("POST", "/sandboxes/sb-1/run") => {
            ScriptedResponse::json(200, r#"{"exitCode":3,"stdout":"hi\n","stderr":""}"#)
        }
        ("DELETE", "/sandboxes/sb-1") => ScriptedResponse::status(204),
        _ => ScriptedResponse::status(404),
    });
    let runtime = SandboxRuntime::new(
        component(),
        Arc::new(SqliteLeases::open_in_memory().unwrap()),
        script.shared(),
    )
    .unwrap();
    let env = runtime
        .environment(
            "co",
            "env",
            r#"{"apiUrl":"https://api.minimal.test"}"#,
            &Secrets::none().with("apiKey", "k-1"),
        )
        .unwrap();
    let request = AcquireRequest {
        run_id: "r".into(),
        requested_cwd: None,
        workspace_mode: None,
        requested_expires_at: None,
        egress: None,
        adapter_type: None,
        image: None,
        template: None,
    };
    let lease = runtime.acquire(&env, &request).unwrap().unwrap();
    let command = test_support::command("echo", &["hi"]);
    let result = runtime
        .execute(&env, &lease.id, &command, None, CancelToken::new())
        .unwrap()
        .unwrap();
    assert_eq!(
        (result.exit_code, result.stdout.as_str()),
        (Some(3), "hi\n")
    );
    assert!(!result.output_truncated);
    // Contract 0.5.0: the result keeps the characters the request asks for.
    let mut command = command;
    command.result_chars = Some(1);
    let result = runtime
        .execute(&env, &lease.id, &command, None, CancelToken::new())
        .unwrap()
        .unwrap();
    assert_eq!(
        (result.stdout.as_str(), result.output_truncated),
        ("\n", true)
    );
    let receipt = runtime.destroy(&env, &lease.id).unwrap().unwrap();
    assert_eq!(receipt.action, TerminationAction::Deleted);
    let requests = script.requests();
    assert!(requests
        .iter()
        .all(|r| r.header("authorization") == Some("Bearer k-1")));
    let run = requests
        .iter()
        .find(|r| r.path().ends_with("/run"))
        .unwrap();
    assert!(run.body_json().unwrap()["script"]
        .as_str()
        .unwrap()
        .contains("'echo' 'hi'"));
}
