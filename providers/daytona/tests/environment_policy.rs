//! Contract 0.7.0's environment policy (issue 43), the Daytona component
//! under the real host (`SandboxRuntime`) against the engine's Daytona
//! face with real processes: an egress allow-list as network settings
//! holds, holds again after a stop and start, and can be replaced; an
//! entry with a port is refused before anything is made; two adapters get
//! two snapshots; an opened port answers with its token only; a template
//! (a snapshot of the stopped sandbox) is listed in its environment only,
//! starts a lease with its files, and its deletion leaves that lease
//! alone. Every
//! network destination is a server this test starts on the host's
//! loopback.

// `ProviderError` is the contract's variant, returned as it is.
#![allow(clippy::result_large_err)]

use sandbox_engine::{IsolationPreference, Server};
use sandbox_host::types::*;
use test_support::local::{Face, LocalRuntime};
use test_support::RequestExt;

const KEY: &str = "daytona-policy-key-5e02";

/// The Daytona face with an egress ceiling of the host's 127.0.0.1 and
/// ingress on; `None` (skipped, and said) where sandboxes get no machine.
fn start(config: serde_json::Value) -> Option<LocalRuntime> {
    if !sandbox_engine::machine::enabled_here() {
        test_support::skipped("no sandbox machines on this host (user namespaces refused)");
        return None;
    }
    let builder = Server::builder()
        .isolation(IsolationPreference::RequireBwrap)
        .ingress(true)
        .egress(sandbox_engine::network::egress::Policy::parse(&["127.0.0.1"]).expect("policy"));
    Some(LocalRuntime::start_with(
        Face::Daytona,
        builder,
        KEY,
        "env-daytona-policy",
        config,
        |rt| rt,
    ))
}

fn sh(local: &LocalRuntime, lease: &str, script: &str) -> String {
    let request = test_support::command("/bin/bash", &["-c", script]).timeout_ms(30_000);
    let result = local.execute(lease, &request, None).expect("runs");
    assert_eq!(result.exit_code, Some(0), "{script}: {}", result.stderr);
    result.stdout
}

/// A server on the host's 127.0.0.1 answering every request with `body`.
fn host_server(body: &'static str) -> u16 {
    test_support::http::serve_text("127.0.0.1", |_| body.to_string())
}

use test_support::http::get as http_get;

/// What `curl` in the sandbox gets from each port of the host's 127.0.0.1:
/// the body, or `refused` when the engine's proxy refuses (403) or no
/// connection is made.
fn reach(local: &LocalRuntime, lease: &str, ports: &[u16]) -> String {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    sh(
        local,
        lease,
        &format!(
            "for p in {}; do out=$(curl -s --max-time 10 --noproxy '' -w ' %{{http_code}}' \
             http://127.0.0.1:$p/); case \"$out\" in *' 403'|*' 000') echo refused;; *) echo \"$out\";; esac; done",
            ports.join(" ")
        ),
    )
}

#[test]
fn network_settings_hold_across_stop_and_start_and_can_be_replaced() {
    let Some(local) = start(serde_json::json!({ "reuseLease": true })) else {
        return;
    };
    let a = host_server("a");
    let b = host_server("b");
    // Daytona's lists take no port: refused before anything is made.
    let mut with_port = test_support::acquire("run");
    with_port.egress = Some(EgressPolicy::Allow(vec![format!("127.0.0.1:{a}")]));
    match local.runtime.acquire(&local.env, &with_port).unwrap() {
        Err(ProviderError::Unsupported(message)) => assert!(message.contains("port"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert!(local.server.faults().requests().is_empty());
    let mut request = test_support::acquire("run");
    request.egress = Some(EgressPolicy::Allow(vec!["127.0.0.1".into()]));
    let lease = local.acquire(&request);
    assert_eq!(reach(&local, &lease, &[a, b]), "a 200\nb 200\n");
    // Block everything: nothing reachable.
    local
        .runtime
        .set_egress(&local.env, &lease, &EgressPolicy::BlockAll)
        .unwrap()
        .expect("replaced");
    assert_eq!(reach(&local, &lease, &[a, b]), "refused\nrefused\n");
    let receipt = local.runtime.release(&local.env, &lease).unwrap().unwrap();
    assert_eq!(receipt.action, TerminationAction::Paused);
    match local.runtime.resume(&local.env, &lease).unwrap() {
        Ok(ResumeOutcome::Resumed(_)) => {}
        other => panic!("not resumed: {other:?}"),
    }
    assert_eq!(reach(&local, &lease, &[a, b]), "refused\nrefused\n");
    local.runtime.destroy(&local.env, &lease).unwrap().unwrap();
}

#[test]
fn two_adapters_get_two_snapshots_and_a_port_answers_with_its_token_only() {
    let Some(local) = start(serde_json::json!({
        "snapshotByAdapter": { "claude_local": "claude-snap", "codex_local": "codex-snap" },
    })) else {
        return;
    };
    // Each lease's id, and the snapshot its metadata records.
    let with_adapter = |adapter: &str| {
        let mut request = test_support::acquire("run");
        request.adapter_type = Some(adapter.into());
        let record = local
            .runtime
            .acquire(&local.env, &request)
            .unwrap()
            .expect("lease acquired");
        let lease = record.lease.expect("a lease");
        let metadata: serde_json::Value = serde_json::from_str(&lease.metadata).unwrap();
        (record.id, metadata["snapshot"].clone())
    };
    let (claude, snapshot) = with_adapter("claude_local");
    assert_eq!(snapshot, "claude-snap");
    let (codex, snapshot) = with_adapter("codex_local");
    assert_eq!(snapshot, "codex-snap");
    sh(
        &local,
        &claude,
        "mkdir -p /tmp/www && cd /tmp/www && echo hello from inside > hello.txt && \
         (setsid nohup python3 -m http.server 8000 >/dev/null 2>&1 &) && \
         for i in $(seq 100); do (echo > /dev/tcp/127.0.0.1/8000) 2>/dev/null && break; sleep 0.1; done",
    );
    let port = local
        .runtime
        .open_port(&local.env, &claude, 8000)
        .unwrap()
        .expect("opened");
    let (name, token) = &port.headers[0];
    assert_eq!(name, "X-Daytona-Preview-Token");
    let file = format!("{}/hello.txt", port.url.trim_end_matches('/'));
    assert_eq!(
        http_get(&file, Some((name, token))),
        (200, "hello from inside\n".to_string())
    );
    let (status, body) = http_get(&file, None);
    assert_eq!(status, 401, "{body}");
    for lease in [&claude, &codex] {
        local.runtime.destroy(&local.env, lease).unwrap().unwrap();
    }
}

#[test]
fn a_template_is_listed_starts_a_lease_with_its_files_and_its_deletion_leaves_that_lease_alone() {
    let Some(local) = start(serde_json::json!({})) else {
        return;
    };
    let runtime = &local.runtime;
    let setup = local.acquire(&test_support::acquire("setup"));
    sh(
        &local,
        &setup,
        "echo made in setup > /paperclip-workspace/setup.txt",
    );
    let info = runtime
        .capture_template(&local.env, &setup, "setup-1")
        .unwrap()
        .expect("captured");
    assert_eq!(info.name, "setup-1");
    let second = runtime
        .capture_template(&local.env, &setup, "setup-2")
        .unwrap()
        .expect("captured again");
    let listed = runtime.list_templates(&local.env).unwrap().expect("listed");
    let listed: Vec<_> = listed
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                t.template_ref.as_str(),
                t.created_at.is_some(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("setup-1", info.template_ref.as_str(), true),
            ("setup-2", second.template_ref.as_str(), true)
        ],
        "oldest first, with their times"
    );
    // Another environment of the same key sees none of them, and can
    // neither start from one nor delete it.
    let other = runtime
        .environment(
            "company",
            "env-daytona-policy-other",
            &local.env.context().config,
            &sandbox_host::Secrets::none().with("apiKey", KEY),
        )
        .unwrap();
    assert!(runtime.list_templates(&other).unwrap().unwrap().is_empty());
    let mut from_template = test_support::acquire("run");
    from_template.template = Some(info.template_ref.clone());
    assert!(matches!(
        runtime.acquire(&other, &from_template).unwrap(),
        Err(ProviderError::InvalidRequest(_))
    ));
    assert!(matches!(
        runtime.delete_template(&other, &info.template_ref).unwrap(),
        Err(ProviderError::InvalidRequest(_))
    ));
    let fork = local.acquire(&from_template);
    assert_eq!(
        sh(&local, &fork, "cat /paperclip-workspace/setup.txt"),
        "made in setup\n"
    );
    for template in [&info, &second] {
        let deleted = runtime
            .delete_template(&local.env, &template.template_ref)
            .unwrap()
            .expect("deleted");
        assert_eq!(deleted, TemplateDeletion::Deleted);
    }
    assert_eq!(
        sh(&local, &fork, "cat /paperclip-workspace/setup.txt"),
        "made in setup\n",
        "the fork keeps its files"
    );
    let again = runtime
        .delete_template(&local.env, &info.template_ref)
        .unwrap()
        .expect("answered");
    assert_eq!(again, TemplateDeletion::AlreadyGone);
    assert!(runtime
        .list_templates(&local.env)
        .unwrap()
        .unwrap()
        .is_empty());
    for lease in [&setup, &fork] {
        runtime.destroy(&local.env, lease).unwrap().unwrap();
    }
}
