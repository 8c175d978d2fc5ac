//! Contract 0.7.0's environment policy (issue 43), the CreateOS component
//! under wasmtime against the real engine (`createos-local`) running real
//! processes: an egress allow-list holds (and holds again after a pause
//! and resume), two adapters get two images, a template captured from a
//! lease holding a file starts a new lease that sees it (and deleting the
//! template leaves that lease alone), an opened port answers with its
//! token only, and a released lease with an idle window is left running
//! until the engine pauses it. Every network destination is a server this
//! test starts on the host's loopback.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_engine::{BackgroundServer, IsolationMode, IsolationPreference, Server};
use sandbox_host::types::*;
use sandbox_host::{Guard, HostOptions, NetworkTransport, Policy, ProviderInstance};

use test_support::components::createos as component;
use test_support::{command, RequestExt};

const KEY: &str = "local-policy-key-7d21";

struct Local {
    server: BackgroundServer,
}

impl Local {
    /// An engine whose egress ceiling is the host's 127.0.0.1 (any port),
    /// with ingress on and idle windows of a second allowed; `None`
    /// (skipped, and said) where sandboxes get no machine of their own.
    fn start() -> Option<Local> {
        if !sandbox_engine::machine::enabled_here() {
            test_support::skipped("no sandbox machines on this host (user namespaces refused)");
            return None;
        }
        let server = BackgroundServer::start(
            Server::builder()
                .api_key(KEY)
                .quiet(true)
                .isolation(IsolationPreference::RequireBwrap)
                .ingress(true)
                .egress(
                    sandbox_engine::network::egress::Policy::parse(&["127.0.0.1"]).expect("policy"),
                ),
        )
        .expect("server starts");
        assert_eq!(*server.isolation(), IsolationMode::Bwrap);
        Some(Local { server })
    }

    fn ctx(&self, fields: serde_json::Value) -> EnvironmentContext {
        let mut config = serde_json::json!({
            "apiUrl": self.server.base_url(),
            "timeoutMs": 60_000,
            "requestTimeoutMs": 15_000,
        });
        for (key, value) in fields.as_object().expect("an object") {
            config[key] = value.clone();
        }
        EnvironmentContext {
            driver_key: "createos".into(),
            company_id: "company".into(),
            environment_id: "env-policy".into(),
            issue_id: None,
            config: config.to_string(),
        }
    }

    fn instance(&self) -> ProviderInstance {
        let policy = Policy::for_origin(&self.server.base_url())
            .unwrap()
            .with_secret_header("X-Api-Key", KEY)
            .unwrap();
        let guard = Guard::new(policy, Arc::new(NetworkTransport::new()));
        component()
            .instantiate(HostOptions::new().with_transport(Arc::new(guard)))
            .unwrap()
    }

    fn acquire(&self, ctx: &EnvironmentContext, request: AcquireRequest) -> Lease {
        self.instance()
            .acquire_lease(ctx, &request)
            .unwrap()
            .expect("lease acquired")
    }

    fn sh(&self, ctx: &EnvironmentContext, lease: &Lease, script: &str) -> String {
        let result = self
            .instance()
            .execute(
                ctx,
                lease,
                &command("/bin/bash", &["-c", script]).timeout(Some(30_000)),
            )
            .unwrap()
            .expect("confirmed result");
        assert_eq!(result.exit_code, Some(0), "{script}: {}", result.stderr);
        result.stdout
    }

    fn destroy(&self, ctx: &EnvironmentContext, lease: &Lease) {
        self.instance()
            .destroy_lease(ctx, lease)
            .unwrap()
            .expect("destroyed");
    }

    /// A sandbox's state as the engine says (`GET /v1/sandboxes/{id}`).
    fn status(&self, id: &str) -> String {
        let (code, body) = http_get(
            &format!("{}/v1/sandboxes/{id}", self.server.base_url()),
            Some(("X-Api-Key", KEY)),
        );
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["data"]["status"].as_str().unwrap_or_default().to_string()
    }
}

fn request() -> AcquireRequest {
    test_support::acquire("run")
}

/// A server on the host's 127.0.0.1 answering every request with `body`.
fn host_server(body: &'static str) -> u16 {
    test_support::http::serve_text("127.0.0.1", |_| body.to_string())
}

use test_support::http::get as http_get;

/// What `curl` in the sandbox gets from each port of the host's 127.0.0.1
/// (through the engine's egress proxy): the body, or `refused` when the
/// proxy refuses (403) or no connection is made.
fn reach(local: &Local, ctx: &EnvironmentContext, lease: &Lease, ports: &[u16]) -> String {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    local.sh(
        ctx,
        lease,
        &format!(
            "for p in {}; do out=$(curl -s --max-time 10 --noproxy '' -w ' %{{http_code}}' \
             http://127.0.0.1:$p/); case \"$out\" in *' 403'|*' 000') echo refused;; *) echo \"$out\";; esac; done",
            ports.join(" ")
        ),
    )
}

#[test]
fn an_egress_allow_list_holds_across_pause_and_resume_and_can_be_replaced() {
    let Some(local) = Local::start() else { return };
    let a = host_server("a");
    let b = host_server("b");
    let ctx = local.ctx(serde_json::json!({ "reuseLease": true }));
    let lease = local.acquire(
        &ctx,
        AcquireRequest {
            egress: Some(EgressPolicy::Allow(vec![format!(" 127.0.0.1:{a} ")])),
            ..request()
        },
    );
    assert_eq!(reach(&local, &ctx, &lease, &[a, b]), "a 200\nrefused\n");
    let receipt = local
        .instance()
        .release_lease(&ctx, &lease)
        .unwrap()
        .expect("released");
    assert_eq!(receipt.action, TerminationAction::Paused);
    let lease = match local.instance().resume_lease(&ctx, &lease).unwrap() {
        Ok(ResumeOutcome::Resumed(lease)) => lease,
        other => panic!("not resumed: {other:?}"),
    };
    assert_eq!(reach(&local, &ctx, &lease, &[a, b]), "a 200\nrefused\n");
    // Replaced on the live lease: now only b.
    let lease = local
        .instance()
        .set_egress(
            &ctx,
            &lease,
            &EgressPolicy::Allow(vec![format!("127.0.0.1:{b}")]),
        )
        .unwrap()
        .expect("replaced");
    assert_eq!(reach(&local, &ctx, &lease, &[a, b]), "refused\nb 200\n");
    // What CreateOS cannot carry is refused before any request.
    match local
        .instance()
        .set_egress(&ctx, &lease, &EgressPolicy::BlockAll)
        .unwrap()
    {
        Err(ProviderError::Unsupported(message)) => assert!(message.contains("deny-all")),
        other => panic!("{other:?}"),
    }
    local.destroy(&ctx, &lease);
}

#[test]
fn two_adapters_get_two_images_and_a_changed_image_expires_the_lease() {
    let Some(local) = Local::start() else { return };
    let images = serde_json::json!({
        "reuseLease": true,
        "rootfs": "base-image",
        "rootfsByAdapter": { "claude_local": "claude-image", "codex_local": "codex-image" },
    });
    let ctx = local.ctx(images);
    let with_adapter = |adapter: &str| AcquireRequest {
        adapter_type: Some(adapter.into()),
        ..request()
    };
    let claude = local.acquire(&ctx, with_adapter("claude_local"));
    let codex = local.acquire(&ctx, with_adapter("codex_local"));
    let rootfs = |lease: &Lease| {
        let v: serde_json::Value = serde_json::from_str(&lease.metadata).unwrap();
        v["rootfs"].as_str().unwrap_or_default().to_string()
    };
    assert_eq!(rootfs(&claude), "claude-image");
    assert_eq!(rootfs(&codex), "codex-image");
    // The engine created each from its image.
    for (lease, image) in [(&claude, "claude-image"), (&codex, "codex-image")] {
        let (code, body) = http_get(
            &format!(
                "{}/v1/sandboxes/{}",
                local.server.base_url(),
                lease.provider_lease_id
            ),
            Some(("X-Api-Key", KEY)),
        );
        assert_eq!(code, 200);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["data"]["rootfs"], image, "{v}");
    }
    for lease in [&claude, &codex] {
        local
            .instance()
            .release_lease(&ctx, lease)
            .unwrap()
            .expect("released");
    }
    // The config now names another image for claude only.
    let changed = local.ctx(serde_json::json!({
        "reuseLease": true,
        "rootfs": "base-image",
        "rootfsByAdapter": { "claude_local": "claude-image-2", "codex_local": "codex-image" },
    }));
    match local.instance().resume_lease(&changed, &claude).unwrap() {
        Ok(ResumeOutcome::Expired(reason)) => assert!(reason.contains("image"), "{reason}"),
        other => panic!("claude's lease is not expired: {other:?}"),
    }
    assert_eq!(
        local.status(&claude.provider_lease_id),
        "paused",
        "not woken"
    );
    match local.instance().resume_lease(&changed, &codex).unwrap() {
        Ok(ResumeOutcome::Resumed(_)) => {}
        other => panic!("codex's lease is not resumed: {other:?}"),
    }
    local.destroy(&changed, &claude);
    local.destroy(&changed, &codex);
}

#[test]
fn a_template_starts_a_lease_with_its_files_and_its_deletion_leaves_that_lease_alone() {
    let Some(local) = Local::start() else { return };
    let ctx = local.ctx(serde_json::json!({}));
    let setup = local.acquire(&ctx, request());
    local.sh(
        &ctx,
        &setup,
        "echo made in setup > /paperclip-workspace/setup.txt",
    );
    let info = local
        .instance()
        .capture_template(&ctx, &setup, "setup-1")
        .unwrap()
        .expect("captured");
    assert_eq!(info.name, "setup-1");
    assert_eq!(local.status(&setup.provider_lease_id), "paused");
    let listed = local
        .instance()
        .list_templates(&ctx)
        .unwrap()
        .expect("listed");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].template_ref, info.template_ref);
    // Another environment sees none of them, and cannot use or delete it.
    let other = EnvironmentContext {
        environment_id: "env-other".into(),
        ..ctx.clone()
    };
    assert!(local
        .instance()
        .list_templates(&other)
        .unwrap()
        .unwrap()
        .is_empty());
    let foreign = AcquireRequest {
        template: Some(info.template_ref.clone()),
        ..request()
    };
    assert!(matches!(
        local.instance().acquire_lease(&other, &foreign).unwrap(),
        Err(ProviderError::InvalidRequest(_))
    ));
    assert!(matches!(
        local
            .instance()
            .delete_template(&other, &info.template_ref)
            .unwrap(),
        Err(ProviderError::InvalidRequest(_))
    ));
    let fork = local.acquire(&ctx, foreign);
    assert_eq!(
        local.sh(&ctx, &fork, "cat /paperclip-workspace/setup.txt"),
        "made in setup\n"
    );
    let deleted = local
        .instance()
        .delete_template(&ctx, &info.template_ref)
        .unwrap()
        .expect("deleted");
    assert_eq!(deleted, TemplateDeletion::Deleted);
    assert_eq!(
        local.sh(&ctx, &fork, "cat /paperclip-workspace/setup.txt"),
        "made in setup\n"
    );
    let again = local
        .instance()
        .delete_template(&ctx, &info.template_ref)
        .unwrap()
        .expect("answered");
    assert_eq!(again, TemplateDeletion::AlreadyGone);
    assert!(local
        .instance()
        .list_templates(&ctx)
        .unwrap()
        .unwrap()
        .is_empty());
    local.destroy(&ctx, &setup);
    local.destroy(&ctx, &fork);
}

#[test]
fn an_opened_port_answers_with_its_token_only() {
    let Some(local) = Local::start() else { return };
    // Without the config's ingress: refused before any request.
    let closed = local.ctx(serde_json::json!({}));
    let lease = local.acquire(&closed, request());
    match local.instance().open_port(&closed, &lease, 8000).unwrap() {
        Err(ProviderError::Unsupported(message)) => assert!(message.contains("ingress")),
        other => panic!("{other:?}"),
    }
    local.destroy(&closed, &lease);
    let ctx = local.ctx(serde_json::json!({ "ingress": true }));
    let lease = local.acquire(&ctx, request());
    local.sh(
        &ctx,
        &lease,
        "mkdir -p /tmp/www && cd /tmp/www && echo hello from inside > hello.txt && \
         (setsid nohup python3 -m http.server 8000 >/dev/null 2>&1 &) && \
         for i in $(seq 100); do (echo > /dev/tcp/127.0.0.1/8000) 2>/dev/null && break; sleep 0.1; done",
    );
    let port = local
        .instance()
        .open_port(&ctx, &lease, 8000)
        .unwrap()
        .expect("opened");
    assert_eq!(port.port, 8000);
    assert_eq!(port.headers.len(), 1);
    let (name, token) = &port.headers[0];
    let file = format!("{}/hello.txt", port.url.trim_end_matches('/'));
    assert_eq!(
        http_get(&file, Some((name, token))),
        (200, "hello from inside\n".to_string())
    );
    let (status, body) = http_get(&file, None);
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains("hello from inside"));
    local.destroy(&ctx, &lease);
}

#[test]
fn a_released_lease_with_an_idle_window_runs_until_the_engine_pauses_it() {
    let Some(local) = Local::start() else { return };
    // 60 s is the shortest window the service (and so the provider) takes.
    let ctx = local.ctx(serde_json::json!({ "reuseLease": true, "autoPauseAfterSeconds": 60 }));
    let lease = local.acquire(&ctx, request());
    local.sh(&ctx, &lease, "echo kept > /paperclip-workspace/kept.txt");
    let receipt = local
        .instance()
        .release_lease(&ctx, &lease)
        .unwrap()
        .expect("released");
    assert_eq!(receipt.action, TerminationAction::IdlePause);
    assert_eq!(local.status(&lease.provider_lease_id), "running");
    let start = Instant::now();
    while local.status(&lease.provider_lease_id) != "paused" {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "not paused after its window"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    println!("paused by the engine after {:?}", start.elapsed());
    let lease = match local.instance().resume_lease(&ctx, &lease).unwrap() {
        Ok(ResumeOutcome::Resumed(lease)) => lease,
        other => panic!("not resumed: {other:?}"),
    };
    assert_eq!(
        local.sh(&ctx, &lease, "cat /paperclip-workspace/kept.txt"),
        "kept\n"
    );
    local.destroy(&ctx, &lease);
}

/// Bytes of every value, in a pseudo-random order (`seed` picks it).
fn bytes(seed: u32, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(2_654_435_761).max(1);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect()
}

/// `concurrent-sync`: a sync-in and a sync-out on one lease at the same
/// time (two instances, two threads, their calls overlapping in time),
/// each byte-exact.
#[test]
fn sync_in_and_sync_out_overlap_on_one_lease_byte_exact() {
    let Some(local) = Local::start() else { return };
    let ctx = local.ctx(serde_json::json!({}));
    let lease = local.acquire(&ctx, request());
    let files = |prefix: &str, seed: u32| -> Vec<FileUpload> {
        (0..6)
            .map(|i| FileUpload {
                remote_path: format!("{prefix}/file-{i}.bin"),
                contents: bytes(seed + i, 2 << 20),
            })
            .collect()
    };
    let first = files("first", 1);
    local
        .instance()
        .sync_in(&ctx, &lease, &first)
        .unwrap()
        .expect("written");
    let second = files("second", 100);
    let paths: Vec<String> = first.iter().map(|f| f.remote_path.clone()).collect();
    let (into, out) = std::thread::scope(|scope| {
        let into = scope.spawn(|| {
            let start = Instant::now();
            let report = local.instance().sync_in(&ctx, &lease, &second).unwrap();
            (start, Instant::now(), report)
        });
        let out = scope.spawn(|| {
            let start = Instant::now();
            let read = local.instance().sync_out(&ctx, &lease, &paths).unwrap();
            (start, Instant::now(), read)
        });
        (into.join().unwrap(), out.join().unwrap())
    });
    let (in_start, in_end, report) = into;
    let (out_start, out_end, read) = out;
    assert!(
        in_start < out_end && out_start < in_end,
        "the two calls did not overlap"
    );
    let report = report.expect("written");
    assert_eq!(report.files, 6);
    let read = read.expect("read");
    for (file, got) in first.iter().zip(&read) {
        assert!(
            got.contents == file.contents,
            "{} differs",
            file.remote_path
        );
    }
    let paths: Vec<String> = second.iter().map(|f| f.remote_path.clone()).collect();
    let back = local
        .instance()
        .sync_out(&ctx, &lease, &paths)
        .unwrap()
        .expect("read");
    for (file, got) in second.iter().zip(&back) {
        assert!(
            got.contents == file.contents,
            "{} differs",
            file.remote_path
        );
    }
    local.destroy(&ctx, &lease);
}
