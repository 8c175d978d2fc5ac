//! Contract 0.7.0's environment policy, the host's side: the acquire
//! request's egress policy, adapter, image and template reach a current
//! component; `set-egress`, `open-port` and the template operations run
//! through the runtime with its bookkeeping; a release answered with
//! `idle-pause` leaves a reusable lease. A 0.6.0 component claims none of
//! the new capabilities, answers `unsupported` to the new operations
//! without being entered, and an acquire asking for what it cannot carry
//! is refused before it runs (never silently dropped).

mod common;

use std::sync::{Arc, OnceLock};

use sandbox_host::types::{
    AcquireRequest, Capabilities, EgressPolicy, InteractionRequest, ProviderError, TemplateDeletion,
};
use sandbox_host::{
    HostOptions, LeaseState, ProviderComponent, RequestPacer, SandboxRuntime, ScriptedResponse,
    ScriptedTransport, Secrets, SqliteLeases,
};

use common::{ctx, lease};

/// The six capabilities 0.7.0 added.
fn policy_capabilities() -> Capabilities {
    Capabilities::EGRESS_POLICY
        | Capabilities::IMAGES
        | Capabilities::TEMPLATES
        | Capabilities::IDLE_PAUSE
        | Capabilities::PORTS
        | Capabilities::CONCURRENT_SYNC
}

fn fixture(name: &str) -> ProviderComponent {
    let wasm = common::build_fixture(name);
    let engine = sandbox_host::shared_engine().unwrap();
    ProviderComponent::load(&engine, &wasm).unwrap_or_else(|e| panic!("{e:#}"))
}

fn current() -> &'static ProviderComponent {
    static COMPONENT: OnceLock<ProviderComponent> = OnceLock::new();
    COMPONENT.get_or_init(|| fixture("contract-v0-7"))
}

fn before_0_7() -> &'static ProviderComponent {
    static COMPONENT: OnceLock<ProviderComponent> = OnceLock::new();
    COMPONENT.get_or_init(|| fixture("contract-v0-6"))
}

fn request(run_id: &str) -> AcquireRequest {
    test_support::acquire(run_id)
}

/// A runtime over an in-memory store; no request leaves it.
fn runtime(component: &ProviderComponent) -> (SandboxRuntime, Arc<SqliteLeases>) {
    let store = Arc::new(SqliteLeases::open_in_memory().unwrap());
    let script = ScriptedTransport::new(|_| ScriptedResponse::status(500));
    let runtime = SandboxRuntime::new(component.clone(), store.clone(), script.shared())
        .unwrap()
        .with_request_pacer(RequestPacer::in_memory());
    (runtime, store)
}

fn unsupported<T: std::fmt::Debug>(answer: Result<T, ProviderError>) -> String {
    match answer {
        Err(ProviderError::Unsupported(why)) => why,
        other => panic!("expected unsupported, got {other:?}"),
    }
}

#[test]
fn a_current_component_gets_the_acquire_policy_and_the_new_operations() {
    let component = current();
    assert_eq!(component.contract(), sandbox_host::PROVIDER_INTERFACE);
    assert_eq!(component.contract(), "sandbox:provider/provider@0.7.0");
    let mut instance = component.instantiate(HostOptions::new()).unwrap();
    let description = instance.describe().unwrap();
    assert!(description.capabilities.contains(policy_capabilities()));

    let asked = AcquireRequest {
        egress: Some(EgressPolicy::Allow(vec![
            "api.example.test:443".into(),
            "10.0.0.0/8".into(),
        ])),
        adapter_type: Some("claude_local".into()),
        image: Some("node:22".into()),
        ..request("r1")
    };
    let made = instance.acquire_lease(&ctx("{}"), &asked).unwrap().unwrap();
    assert_eq!(
        made.metadata,
        r#"{"egress":"allow api.example.test:443,10.0.0.0/8","adapter":"claude_local","image":"node:22","template":"none"}"#
    );

    let changed = instance
        .set_egress(&ctx("{}"), &made, &EgressPolicy::BlockAll)
        .unwrap()
        .unwrap();
    assert!(
        changed.metadata.contains(r#""egress":"block-all""#),
        "{}",
        changed.metadata
    );
    assert_eq!(changed.provider_lease_id, made.provider_lease_id);

    let port = instance
        .open_port(&ctx("{}"), &made, 8000)
        .unwrap()
        .unwrap();
    assert_eq!(port.port, 8000);
    assert_eq!(port.url, "http://8000.sandbox.test/");
    assert_eq!(
        port.headers,
        [("x-sandbox-port-token".to_owned(), "token-8000".to_owned())]
    );

    let template = instance
        .capture_template(&ctx("{}"), &made, "setup-1")
        .unwrap()
        .unwrap();
    assert_eq!(template.name, "setup-1");
    assert_eq!(template.template_ref, "tpl/company/env/setup-1");
    match instance
        .capture_template(&ctx("{}"), &made, "taken")
        .unwrap()
    {
        Err(ProviderError::ApiRejected(rejection)) => assert_eq!(rejection.status, 409),
        other => panic!("{other:?}"),
    }
    let listed = instance.list_templates(&ctx("{}")).unwrap().unwrap();
    let names: Vec<&str> = listed.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["base", "node"]);
    assert!(matches!(
        instance
            .delete_template(&ctx("{}"), "tpl/company/env/base")
            .unwrap(),
        Ok(TemplateDeletion::Deleted)
    ));
    assert!(matches!(
        instance
            .delete_template(&ctx("{}"), "tpl/company/env/gone")
            .unwrap(),
        Ok(TemplateDeletion::AlreadyGone)
    ));
    assert!(matches!(
        instance
            .delete_template(&ctx("{}"), "tpl/other/env/base")
            .unwrap(),
        Err(ProviderError::InvalidRequest(_))
    ));
    assert!(!instance.has_trapped());
}

/// A current component's interactive process goes through the current
/// bindings (the same body as the 0.6.0 fixture's).
#[test]
fn a_current_component_still_runs_interactive_processes() {
    let interaction = sandbox_host::Interaction::new();
    let mut instance = current()
        .instantiate(HostOptions::new().with_interaction(interaction.clone()))
        .unwrap();
    interaction.send(sandbox_host::types::InteractionEvent::Input(b"hi".to_vec()));
    interaction.send(sandbox_host::types::InteractionEvent::CloseInput);
    let request = InteractionRequest {
        command: "sh".into(),
        args: vec![],
        cwd: None,
        env: vec![],
        terminal: None,
        timeout_ms: None,
        result_chars: None,
    };
    let result = instance
        .interact(&ctx("{}"), &lease(), &request)
        .unwrap()
        .unwrap();
    assert_eq!(result.exit_code, Some(0));
    assert_eq!(result.stdout, "hi");
}

#[test]
fn the_runtime_records_the_policy_and_keeps_an_idle_paused_lease_reusable() {
    let (runtime, store) = runtime(current());
    let env = runtime
        .environment("co", "env", "{}", &Secrets::none())
        .unwrap();
    let asked = AcquireRequest {
        egress: Some(EgressPolicy::Allow(vec!["127.0.0.1:9".into()])),
        ..request("r2")
    };
    let record = runtime.acquire(&env, &asked).unwrap().unwrap();
    let stored = |id: &str| store.get(id).unwrap().unwrap();
    assert!(stored(&record.id)
        .lease
        .unwrap()
        .metadata
        .contains("allow 127.0.0.1:9"));

    // The lease the provider returns from set-egress replaces the stored one.
    runtime
        .set_egress(&env, &record.id, &EgressPolicy::Unrestricted)
        .unwrap()
        .unwrap();
    let after = stored(&record.id);
    assert_eq!(after.state, LeaseState::Active);
    assert!(after
        .lease
        .unwrap()
        .metadata
        .contains(r#""egress":"unrestricted""#));

    // Port 0 is refused by the host; a port answers its URL and headers.
    match runtime.open_port(&env, &record.id, 0).unwrap() {
        Err(ProviderError::InvalidRequest(why)) => assert!(why.contains("port 0"), "{why}"),
        other => panic!("{other:?}"),
    }
    let port = runtime.open_port(&env, &record.id, 8080).unwrap().unwrap();
    assert_eq!(port.headers.len(), 1);

    let template = runtime
        .capture_template(&env, &record.id, "after-setup")
        .unwrap()
        .unwrap();
    assert_eq!(template.template_ref, "tpl/co/env/after-setup");
    assert_eq!(runtime.list_templates(&env).unwrap().unwrap().len(), 2);
    assert!(matches!(
        runtime
            .delete_template(&env, &template.template_ref)
            .unwrap(),
        Ok(TemplateDeletion::Deleted)
    ));

    // `idle-pause` is a release like `paused`: the lease is reusable.
    let receipt = runtime.release(&env, &record.id).unwrap().unwrap();
    assert_eq!(
        sandbox_host::action_name(receipt.action),
        "left running until idle, then paused"
    );
    let released = stored(&record.id);
    assert_eq!(released.state, LeaseState::Released);
    assert!(
        released.reason.as_deref().unwrap_or("").contains("idle"),
        "{:?}",
        released.reason
    );
    runtime.resume(&env, &record.id).unwrap().unwrap();
    assert_eq!(stored(&record.id).state, LeaseState::Active);

    // An operation on a lease that is not active is refused by the store
    // rules, as any other use.
    runtime.release(&env, &record.id).unwrap().unwrap();
    let error = runtime
        .open_port(&env, &record.id, 8080)
        .unwrap_err()
        .to_string();
    assert!(error.contains("change the network or ports of"), "{error}");
}

#[test]
fn a_0_6_component_claims_none_of_the_new_capabilities_and_is_not_entered_for_them() {
    let component = before_0_7();
    assert_eq!(component.contract(), "sandbox:provider/provider@0.6.0");
    let mut instance = component.instantiate(HostOptions::new()).unwrap();
    let capabilities = instance.describe().unwrap().capabilities;
    assert!(!capabilities.intersects(policy_capabilities()));
    // What it declared before 0.7.0 is kept.
    assert!(capabilities.contains(Capabilities::LOGIN_PTY | Capabilities::TERMINAL_RESIZE));

    let ctx = ctx("{}");
    for why in [
        unsupported(
            instance
                .set_egress(&ctx, &lease(), &EgressPolicy::BlockAll)
                .unwrap(),
        ),
        unsupported(instance.open_port(&ctx, &lease(), 8000).unwrap()),
        unsupported(instance.capture_template(&ctx, &lease(), "t").unwrap()),
        unsupported(instance.list_templates(&ctx).unwrap()),
        unsupported(instance.delete_template(&ctx, "tpl/company/env/t").unwrap()),
    ] {
        assert!(
            why.contains("built for contract 0.6.0") && why.contains("rebuild"),
            "{why}"
        );
    }

    // An acquire it can carry reaches it (the adapter type is dropped:
    // it only picks among the config's images); `unrestricted` is what it
    // gives anyway.
    let carried = AcquireRequest {
        egress: Some(EgressPolicy::Unrestricted),
        adapter_type: Some("claude_local".into()),
        ..request("ok")
    };
    let made = instance.acquire_lease(&ctx, &carried).unwrap().unwrap();
    assert_eq!(made.provider_lease_id, "sb-ok");

    // One it cannot carry is refused by the host before it runs: its own
    // acquire would have made a lease.
    for (asked, word) in [
        (
            AcquireRequest {
                egress: Some(EgressPolicy::BlockAll),
                ..request("a")
            },
            "egress",
        ),
        (
            AcquireRequest {
                egress: Some(EgressPolicy::Allow(vec!["a.test".into()])),
                ..request("b")
            },
            "egress",
        ),
        (
            AcquireRequest {
                image: Some("node:22".into()),
                ..request("c")
            },
            "image",
        ),
        (
            AcquireRequest {
                template: Some("tpl/company/env/t".into()),
                ..request("d")
            },
            "template",
        ),
    ] {
        let why = unsupported(instance.acquire_lease(&ctx, &asked).unwrap());
        assert!(
            why.contains("built for contract 0.6.0") && why.contains(word),
            "{why}"
        );
    }
    assert!(!instance.has_trapped());
}

#[test]
fn the_runtime_refuses_what_the_provider_does_not_claim_before_recording_anything() {
    let (runtime, store) = runtime(before_0_7());
    let env = runtime
        .environment("co", "env", "{}", &Secrets::none())
        .unwrap();
    let asked = AcquireRequest {
        egress: Some(EgressPolicy::BlockAll),
        ..request("refused")
    };
    let why = unsupported(runtime.acquire(&env, &asked).unwrap());
    assert!(
        why.contains("capability `egress-policy`") && why.contains("nothing was asked"),
        "{why}"
    );
    assert!(store.list().unwrap().is_empty(), "nothing recorded");
    let why = unsupported(
        runtime
            .acquire(
                &env,
                &AcquireRequest {
                    template: Some("tpl/co/env/t".into()),
                    ..request("refused")
                },
            )
            .unwrap(),
    );
    assert!(why.contains("capability `templates`"), "{why}");
    assert!(store.list().unwrap().is_empty(), "nothing recorded");

    // A lease it can carry; the new operations on it are refused and
    // leave it active and unmarked.
    let record = runtime.acquire(&env, &request("plain")).unwrap().unwrap();
    for (why, capability) in [
        (
            unsupported(
                runtime
                    .set_egress(&env, &record.id, &EgressPolicy::BlockAll)
                    .unwrap(),
            ),
            "egress-policy",
        ),
        (
            unsupported(runtime.open_port(&env, &record.id, 8000).unwrap()),
            "ports",
        ),
        (
            unsupported(runtime.capture_template(&env, &record.id, "t").unwrap()),
            "templates",
        ),
        (
            unsupported(runtime.list_templates(&env).unwrap()),
            "templates",
        ),
        (
            unsupported(runtime.delete_template(&env, "tpl/co/env/t").unwrap()),
            "templates",
        ),
    ] {
        assert!(why.contains(&format!("capability `{capability}`")), "{why}");
    }
    let after = store.get(&record.id).unwrap().unwrap();
    assert_eq!(after.state, LeaseState::Active);
    assert!(after.busy_owner.is_none());
}
