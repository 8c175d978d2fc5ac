//! The runtime with the real CreateOS provider against an in-process
//! createos-local with injected faults. Skipped until ./build.sh ran.

#![cfg(feature = "local-backend")]

use std::path::PathBuf;
use std::sync::Arc;

use sandbox_engine::{BackgroundServer, FaultAction, FaultRule, Server};
use sandbox_host::types::ProviderError;
use sandbox_host::{
    shared_engine, CancelToken, LeaseState, NetworkTransport, ProviderComponent, RequestPacer,
    SandboxRuntime, ScriptedResponse, ScriptedTransport, Secrets, SqliteLeases,
};

mod common;
use test_support::RequestExt;

fn provider() -> ProviderComponent {
    let wasm: PathBuf = common::built_provider();
    ProviderComponent::load(&shared_engine().unwrap(), &wasm).unwrap_or_else(|e| panic!("{e:#}"))
}

#[test]
fn an_unconfirmed_termination_poisons_the_lease_durably_and_sweep_destroys_it() {
    let component = provider();
    let server =
        BackgroundServer::start(Server::builder().api_key("real-key").quiet(true)).unwrap();
    server.faults().add(
        FaultRule::new(
            "DELETE",
            "/v1/sandboxes/*/processes/*",
            FaultAction::TreeNotExited,
        )
        .always(),
    );
    let dir = std::env::temp_dir().join(format!("sandbox-real-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("leases.sqlite");
    let config = format!(r#"{{"apiUrl":"{}","timeoutMs":20000}}"#, server.base_url());
    let secrets = Secrets::none().with("apiKey", "real-key");
    let runtime = |store| {
        SandboxRuntime::new(component.clone(), store, Arc::new(NetworkTransport::new()))
            .unwrap()
            .with_request_pacer(RequestPacer::in_memory())
    };

    let lease_id = {
        let rt = runtime(Arc::new(SqliteLeases::open(&path).unwrap()));
        let env = rt.environment("co", "env", &config, &secrets).unwrap();
        let request = test_support::acquire("real");
        let record = rt.acquire(&env, &request).unwrap().unwrap();
        let command = test_support::command("sleep", &["30"]).timeout_ms(1000);
        let outcome = rt
            .execute(&env, &record.id, &command, None, CancelToken::new())
            .unwrap();
        assert!(
            matches!(outcome, Err(ProviderError::CleanupFailed(_))),
            "{outcome:?}"
        );
        record.id
    };

    let rt = runtime(Arc::new(SqliteLeases::open(&path).unwrap()));
    assert_eq!(
        rt.store().get(&lease_id).unwrap().unwrap().state,
        LeaseState::Poisoned
    );
    let env = rt.environment("co", "env", &config, &secrets).unwrap();
    let swept = rt.sweep(&env).unwrap();
    assert_eq!(swept.len(), 1, "{swept:?}");
    assert!(swept[0].1.is_ok(), "{swept:?}");
    assert_eq!(
        rt.store().get(&lease_id).unwrap().unwrap().state,
        LeaseState::Destroyed
    );
    let report = server.shutdown();
    assert!(report.all_exited(), "{report:?}");
}

#[test]
fn a_wrong_api_key_is_a_typed_rejection_and_the_right_one_reaches_the_server() {
    let component = provider();
    let server = BackgroundServer::start(Server::builder().api_key("right").quiet(true)).unwrap();
    let rt = SandboxRuntime::new(
        component,
        Arc::new(SqliteLeases::open_in_memory().unwrap()),
        Arc::new(NetworkTransport::new()),
    )
    .unwrap()
    .with_request_pacer(RequestPacer::in_memory());
    let config = format!(r#"{{"apiUrl":"{}","apiKey":"wrong"}}"#, server.base_url());
    let env = rt
        .environment("co", "env", &config, &Secrets::none())
        .unwrap();
    let outcome = rt.probe(&env, None).unwrap();
    assert!(
        matches!(outcome, Err(ProviderError::ApiRejected(_))),
        "{outcome:?}"
    );

    let config = format!(r#"{{"apiUrl":"{}","apiKey":"right"}}"#, server.base_url());
    let env = rt
        .environment("co", "env", &config, &Secrets::none())
        .unwrap();
    let report = rt.probe(&env, None).unwrap().unwrap();
    assert!(report.ok, "{report:?}");
    server.shutdown();
}

/// Pins issue 9 item 5: the key from `CREATEOS_API_KEY` (the CLI's
/// operator default) was sent to any `apiUrl` a config named. It now goes
/// only to the provider's default origin (or one the operator names in
/// `SANDBOX_API_KEY_ORIGIN`).
#[test]
fn the_environment_key_goes_only_to_the_default_origin() {
    let component = provider();
    std::env::set_var("CREATEOS_API_KEY", "env-canary");
    std::env::remove_var("SANDBOX_API_KEY_ORIGIN");
    let script = ScriptedTransport::new(|_| ScriptedResponse::status(401));
    let rt = SandboxRuntime::new(
        component,
        Arc::new(SqliteLeases::open_in_memory().unwrap()),
        script.shared(),
    )
    .unwrap()
    .with_request_pacer(RequestPacer::in_memory());
    for (config, key) in [
        (r#"{"apiUrl":"https://elsewhere.example"}"#, None),
        ("{}", Some("env-canary")),
        (
            r#"{"apiUrl":"https://api.sb.createos.sh/v1"}"#,
            Some("env-canary"),
        ),
    ] {
        script.clear();
        let env = rt
            .environment("co", "env", config, &Secrets::from_env())
            .unwrap();
        let outcome = rt.probe(&env, None).unwrap();
        assert!(
            matches!(outcome, Err(ProviderError::ApiRejected(_))),
            "{outcome:?}"
        );
        let requests = script.requests();
        assert!(!requests.is_empty());
        for request in &requests {
            assert_eq!(request.header("x-api-key"), key, "{config}");
        }
    }
}
