//! Issue 25 (performance): a command joins its sandbox's machine in one
//! step, the server's own fork ([`sandbox_engine::machine::join`]), instead of
//! `nsenter` + `setpriv` + `env`. What those tools guaranteed must still
//! hold, proven with real processes: only the sandbox root's own
//! capabilities (issue 44) and `no_new_privs` inside, exactly the given environment, the `PATH` search of `execvp`
//! (a script without `#!` runs under `/bin/sh`), a shell's 127 for a
//! missing program, the command's signal as its end, and nothing of the
//! server's descriptors.

mod common;

use common::Harness;
use reqwest::StatusCode;
use sandbox_engine::{IsolationMode, IsolationPreference, Server};
use serde_json::{json, Value};

async fn machine() -> Option<Harness> {
    let h = Harness::start_builder(Server::builder().isolation(IsolationPreference::RequireBwrap))
        .await;
    assert_eq!(*h.server.isolation(), IsolationMode::Bwrap);
    if !sandbox_engine::machine::enabled_here() {
        test_support::skipped("no machine per sandbox here (not root, or no cgroup v1 pids)");
        return None;
    }
    Some(h)
}

async fn run(h: &Harness, sb: &str, body: Value) -> Value {
    let (st, v) = h.post(&format!("/v1/sandboxes/{sb}/exec"), body).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    v["data"]["result"].clone()
}

/// The root of a machine holds exactly the sandbox's capabilities
/// (`chown` and the like, issue 44 item 1), nothing to pass on, and no way
/// to gain more (`no_new_privs`).
#[tokio::test]
async fn a_joined_command_has_only_the_sandbox_capabilities_and_no_new_privileges() {
    let Some(h) = machine().await else { return };
    let sb = h.sandbox().await;
    let r = h
        .exec(
            &sb,
            "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Uid):' /proc/self/status; id -u; \
             hostname; readlink /proc/1/ns/pid /proc/self/ns/pid",
        )
        .await;
    let out = r["stdout"].as_str().expect("stdout");
    let root_set = format!(
        "{:016x}",
        sandbox_engine::machine::join::SANDBOX_CAPABILITIES
    );
    for (cap, expected) in [
        ("CapInh", "0000000000000000"),
        ("CapPrm", root_set.as_str()),
        ("CapEff", root_set.as_str()),
        ("CapBnd", root_set.as_str()),
        ("CapAmb", "0000000000000000"),
    ] {
        let line = out
            .lines()
            .find(|l| l.starts_with(cap))
            .unwrap_or_else(|| panic!("{cap} missing: {r}"));
        assert!(
            line.split_whitespace().nth(1) == Some(expected),
            "{line}: {r}"
        );
    }
    assert!(out.contains("NoNewPrivs:\t1"), "{r}");
    // uid 0 of the machine, in its UTS and PID namespaces.
    assert!(out.contains("\n0\nsandbox\n"), "{r}");
    let ns: Vec<&str> = out.lines().filter(|l| l.starts_with("pid:[")).collect();
    assert_eq!(ns.len(), 2, "{r}");
    assert_eq!(
        ns[0], ns[1],
        "the command is in the machine's PID namespace: {r}"
    );
    assert!(h.server.shutdown().await.all_exited());
}

/// Issue 44 item 1: the sandbox's root owns a whole range of ids and the
/// capabilities to use them, and they reach nothing outside the sandbox:
/// a file it gives to uid 1001 belongs to an id of the sandbox's own
/// range on the host (never the host's uid 1001); a host file only the
/// host's root may read stays unreadable (its owner is no id of the
/// sandbox); no id outside the range can be taken.
#[tokio::test]
async fn the_sandbox_root_owns_its_range_and_nothing_else() {
    if !rustix::process::geteuid().is_root() {
        // Without root a sandbox has one id (the server's), not a range.
        test_support::skipped("the_sandbox_root_owns_its_range_and_nothing_else: needs root");
        return;
    }
    let Some(h) = machine().await else { return };
    let sb = h.sandbox().await;
    let root = h.server.data_dir().join(&sb);
    let ids = sandbox_engine::trees::host_processes::sandbox_ids(&root).expect("a range of ids");
    assert_eq!(ids.count, sandbox_engine::trees::id_map::IDS_PER_SANDBOX);
    let secret = std::path::PathBuf::from(format!("/opt/{}-secret", common::marker("caps")));
    std::fs::write(&secret, "host only\n").expect("write a host file");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let r = h
        .exec(
            &sb,
            &format!(
                "touch /tmp/given && chown 1001:1002 /tmp/given && echo given; \
                 cat {} 2>&1 || echo unreadable; \
                 python3 -c 'import os; os.setuid(70000)' 2>/dev/null || echo no-foreign-uid; \
                 setpriv --reuid 1001 --regid 1001 --clear-groups id -u",
                secret.display()
            ),
        )
        .await;
    let _ = std::fs::remove_file(&secret);
    let out = r["stdout"].as_str().expect("stdout");
    assert!(out.contains("given\n"), "{r}");
    assert!(
        out.contains("unreadable\n") && !out.contains("host only"),
        "{r}"
    );
    assert!(out.contains("no-foreign-uid\n"), "{r}");
    assert!(out.ends_with("1001\n"), "{r}");
    use std::os::unix::fs::MetadataExt;
    let given = std::fs::metadata(root.join("tmp/given")).expect("the file on the host");
    assert_eq!(
        (given.uid(), given.gid()),
        (ids.first + 1001, ids.first + 1002),
        "{r}"
    );
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn a_joined_command_gets_exactly_its_environment_and_cwd() {
    let Some(h) = machine().await else { return };
    let sb = h.sandbox_with_env(json!({ "ONLY": "mine" })).await;
    let r = run(
        &h,
        &sb,
        json!({"cmd": "/usr/bin/env", "args": [], "cwd": "/tmp"}),
    )
    .await;
    let out = r["stdout"].as_str().expect("stdout");
    let names: Vec<&str> = out.lines().filter_map(|l| l.split('=').next()).collect();
    for name in &names {
        assert!(
            [
                "PATH",
                "HOME",
                "LANG",
                "CREATEOS_LOCAL_ISOLATION",
                "CREATEOS_LOCAL_MARKER",
                "ONLY"
            ]
            .contains(name),
            "{name} leaked into the command: {r}"
        );
    }
    assert!(out.contains("ONLY=mine\n"), "{r}");
    let r = run(&h, &sb, json!({"cmd": "pwd", "args": [], "cwd": "/tmp"})).await;
    assert_eq!(r["stdout"], "/tmp\n", "{r}");
    // Only stdio reaches the command.
    let r = h.exec(&sb, "ls /proc/self/fd").await;
    assert_eq!(r["stdout"], "0\n1\n2\n3\n", "{r}");
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn programs_are_found_and_started_like_execvp() {
    let Some(h) = machine().await else { return };
    let sb = h.sandbox().await;
    // Through PATH.
    let r = run(&h, &sb, json!({"cmd": "echo", "args": ["found"]})).await;
    assert_eq!(
        (r["exit_code"].clone(), r["stdout"].clone()),
        (json!(0), json!("found\n")),
        "{r}"
    );
    // A missing program: a shell's 127, the reason on stderr.
    let r = run(&h, &sb, json!({"cmd": "no-such-program-here", "args": []})).await;
    assert_eq!(r["exit_code"], 127, "{r}");
    let err = r["stderr"].as_str().expect("stderr");
    assert!(
        err.contains("no-such-program-here") && err.contains("No such file or directory"),
        "{r}"
    );
    // Found but not executable: 126.
    h.exec(&sb, "printf 'echo x\\n' > /tmp/noexec").await;
    let r = run(&h, &sb, json!({"cmd": "/tmp/noexec", "args": []})).await;
    assert_eq!(r["exit_code"], 126, "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .expect("stderr")
            .contains("Permission denied"),
        "{r}"
    );
    // A script without `#!` runs under /bin/sh, with its arguments.
    h.exec(
        &sb,
        "printf 'echo script \"$1\"\\n' > /tmp/plain; chmod +x /tmp/plain",
    )
    .await;
    let r = run(&h, &sb, json!({"cmd": "/tmp/plain", "args": ["arg"]})).await;
    assert_eq!(r["stdout"], "script arg\n", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn a_command_killed_by_a_signal_ends_with_that_signal() {
    let Some(h) = machine().await else { return };
    let sb = h.sandbox().await;
    let id = h
        .spawn_body(
            &sb,
            json!({"cmd": "/bin/sh", "args": ["-c", "kill -TERM $$"]}),
        )
        .await;
    let p = h.wait_tree(&sb, &id).await;
    assert_eq!(p["signal"], "SIGTERM", "{p}");
    // exec reports it as a shell would.
    let r = run(
        &h,
        &sb,
        json!({"cmd": "/bin/sh", "args": ["-c", "kill -KILL $$"]}),
    )
    .await;
    assert_eq!(r["exit_code"], 128 + 9, "{r}");
    let r = run(&h, &sb, json!({"cmd": "/bin/sh", "args": ["-c", "exit 7"]})).await;
    assert_eq!(r["exit_code"], 7, "{r}");
    assert!(h.server.shutdown().await.all_exited());
}
