//! Issue 40 item 1: "destroyed", "stopped" and "none survived" only with
//! proof. A sandbox delete (both faces) and a Daytona stop answered 200
//! while the sandbox's machine (its `bwrap` processes and the holder)
//! still ran, about 3 s more; an engine stop said "none survived" with
//! the machines of live sandboxes still running. Through the real binary:
//! right after each 200, and right after the engine exits, nothing of the
//! sandbox's machine runs (nothing in its PID namespace or below it, not
//! its outer `bwrap`, and as root nothing of its range of ids), and
//! nothing of its disk is mounted or attached.
//!
//! The machine is found by its own identity, never by a uid alone: an
//! engine that is not root runs every sandbox as its own uid (issue 37),
//! so "a process of the sandbox's uid" would be the test itself.

#[path = "common/binary.rs"]
mod binary;

use binary::{disk_remains, machines_under, owner, Engine, MachineSeen, KEY};
use serde_json::{json, Value};

/// Whether sandboxes are machines here (user namespaces work); says so
/// when not, and the test is skipped.
fn machines_here() -> bool {
    let here = sandbox_engine::machine::enabled_here();
    if !here {
        test_support::skipped("no sandbox machines on this host (user namespaces refused)");
    }
    here
}

impl Engine {
    async fn daytona(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}/daytona/{path}", self.base))
            .bearer_auth(KEY);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("the engine answers");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// The machines running under this engine now.
    fn known_machines(&self) -> std::collections::HashSet<u64> {
        machines_under(self.pid()).into_keys().collect()
    }

    /// A CreateOS sandbox whose machine runs (a command ran in it), and
    /// that machine.
    async fn createos_machine(&self) -> (String, MachineSeen) {
        let known = self.known_machines();
        let sb = self.sandbox().await;
        let (st, v) = self
            .call(
                reqwest::Method::POST,
                &format!("/v1/sandboxes/{sb}/exec"),
                Some(json!({"cmd": "/bin/true"})),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        let machine = MachineSeen::new_under(self.pid(), &known, owner(&self.root(&sb)));
        assert!(
            !machine.survivors().is_empty(),
            "the machine runs after a command"
        );
        (sb, machine)
    }

    /// A Daytona sandbox whose machine runs, and that machine.
    async fn daytona_machine(&self) -> (String, MachineSeen) {
        let known = self.known_machines();
        let (st, v) = self
            .daytona(reqwest::Method::POST, "api/sandbox", Some(json!({})))
            .await;
        assert_eq!(st, 200, "{v}");
        let sb = v["id"].as_str().expect("id").to_string();
        let (st, v) = self
            .daytona(
                reqwest::Method::POST,
                &format!("toolbox/{sb}/process/execute"),
                Some(json!({"command": "true"})),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        let machine = MachineSeen::new_under(
            self.pid(),
            &known,
            owner(&self.root(&format!("daytona-{sb}"))),
        );
        assert!(
            !machine.survivors().is_empty(),
            "the machine runs after a command"
        );
        (sb, machine)
    }
}

/// `root` is the name of the sandbox's root in the data directory (a
/// Daytona sandbox's is `daytona-<id>`).
fn assert_nothing_left(
    what: &str,
    engine_data: &std::path::Path,
    root: &str,
    machine: &MachineSeen,
) {
    let procs = machine.survivors();
    assert!(
        procs.is_empty(),
        "{what}, yet the sandbox's processes run: {procs:?}"
    );
    let disk = disk_remains(engine_data, root);
    assert!(disk.is_empty(), "{what}, yet its disk is left: {disk:?}");
}

#[tokio::test]
async fn a_createos_delete_answers_only_once_the_machine_is_gone() {
    if !machines_here() {
        return;
    }
    let engine = Engine::start("gone-createos", &[], None);
    let (sb, machine) = engine.createos_machine().await;
    let (st, v) = engine
        .call(
            reqwest::Method::DELETE,
            &format!("/v1/sandboxes/{sb}"),
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"]["status"], "destroyed", "{v}");
    assert_nothing_left("answered destroyed", &engine.data, &sb, &machine);
    let data = engine.data.clone();
    let (ok, err) = engine.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(data);
}

#[tokio::test]
async fn a_daytona_delete_and_stop_answer_only_once_the_machine_is_gone() {
    if !machines_here() {
        return;
    }
    let engine = Engine::start("gone-daytona", &[], None);
    let (sb, machine) = engine.daytona_machine().await;
    let (st, v) = engine
        .daytona(reqwest::Method::DELETE, &format!("api/sandbox/{sb}"), None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["state"], "destroyed", "{v}");
    assert_nothing_left(
        "answered destroyed",
        &engine.data,
        &format!("daytona-{sb}"),
        &machine,
    );

    let (sb, machine) = engine.daytona_machine().await;
    let (st, v) = engine
        .daytona(
            reqwest::Method::POST,
            &format!("api/sandbox/{sb}/stop"),
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["state"], "stopped", "{v}");
    let procs = machine.survivors();
    assert!(
        procs.is_empty(),
        "answered stopped, yet the sandbox's processes run: {procs:?}"
    );
    let data = engine.data.clone();
    let (ok, err) = engine.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(data);
}

#[tokio::test]
async fn none_survived_means_no_machine_of_any_live_sandbox_runs() {
    if !machines_here() {
        return;
    }
    let engine = Engine::start("gone-shutdown", &[], None);
    let (a, machine_a) = engine.createos_machine().await;
    let (b, machine_b) = engine.daytona_machine().await;
    // A command still running in one of them, too.
    engine.spawn(&a, "sleep 600").await;
    let data = engine.data.clone();
    let (ok, err) = engine.stop();
    assert!(ok, "{err}");
    assert!(err.contains("none survived"), "{err}");
    assert_nothing_left("the engine said none survived", &data, &a, &machine_a);
    assert_nothing_left(
        "the engine said none survived",
        &data,
        &format!("daytona-{b}"),
        &machine_b,
    );
    // Both sandboxes' machines (and the start-up probe's, if it still ran).
    let machines: usize = err
        .split(" machine(s)")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        machines >= 2,
        "the shutdown line counts both machines: {err}"
    );
    let _ = std::fs::remove_dir_all(data);
}

/// Issue 40 item 1, the other side: when the proof cannot be had, the
/// delete is a 500 saying what is left, the sandbox stays (`error`), and
/// a retry proves it. Here the sandbox's disk is kept busy by a file the
/// host holds open in it (a lazy unmount leaves the loop device attached
/// until that file is closed); the delete used to answer 200 regardless.
#[tokio::test]
async fn a_delete_whose_disk_stays_attached_is_a_500_and_a_retry_proves_it() {
    if !machines_here() {
        return;
    }
    let engine = Engine::start("gone-busy-disk", &[], None);
    let (sb, machine) = engine.createos_machine().await;
    if disk_remains(&engine.data, &sb).is_empty() {
        test_support::skipped("sandboxes have no disk of their own on this host");
        return;
    }
    let held =
        std::fs::File::create(engine.root(&sb).join("tmp/held")).expect("a file in the sandbox");
    let (st, v) = engine
        .call(
            reqwest::Method::DELETE,
            &format!("/v1/sandboxes/{sb}"),
            None,
        )
        .await;
    assert_eq!(st, 500, "{v}");
    let message = v["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("disk") && message.contains("/dev/loop"),
        "{v}"
    );
    let (st, v) = engine
        .call(reqwest::Method::GET, &format!("/v1/sandboxes/{sb}"), None)
        .await;
    assert_eq!(st, 200, "the sandbox stays: {v}");
    assert_eq!(v["data"]["status"], "error", "{v}");
    drop(held);
    let (st, v) = engine
        .call(
            reqwest::Method::DELETE,
            &format!("/v1/sandboxes/{sb}"),
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_nothing_left(
        "answered destroyed on the retry",
        &engine.data,
        &sb,
        &machine,
    );
    let data = engine.data.clone();
    let (ok, err) = engine.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(data);
}

/// A Daytona sandbox whose delete could not be proven (its disk kept
/// busy, then lazily unmounted) cannot be started again: its root is no
/// longer its disk. Only a delete may follow, which proves it once the
/// disk is free. `start` used to answer 200 `started` for it.
#[tokio::test]
async fn a_daytona_sandbox_whose_delete_failed_can_only_be_deleted() {
    if !machines_here() {
        return;
    }
    let engine = Engine::start("gone-busy-daytona", &[], None);
    let (sb, machine) = engine.daytona_machine().await;
    let root = format!("daytona-{sb}");
    if disk_remains(&engine.data, &root).is_empty() {
        test_support::skipped("sandboxes have no disk of their own on this host");
        return;
    }
    let held =
        std::fs::File::create(engine.root(&root).join("tmp/held")).expect("a file in the sandbox");
    let (st, v) = engine
        .daytona(reqwest::Method::DELETE, &format!("api/sandbox/{sb}"), None)
        .await;
    assert_eq!(st, 500, "{v}");
    let (st, v) = engine
        .daytona(
            reqwest::Method::POST,
            &format!("api/sandbox/{sb}/start"),
            None,
        )
        .await;
    assert_eq!(
        st, 409,
        "a sandbox whose delete failed was started again: {v}"
    );
    drop(held);
    let (st, v) = engine
        .daytona(reqwest::Method::DELETE, &format!("api/sandbox/{sb}"), None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_nothing_left(
        "answered destroyed on the retry",
        &engine.data,
        &root,
        &machine,
    );
    let data = engine.data.clone();
    let (ok, err) = engine.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(data);
}

/// Issue 40 item 6, in part (no workload generator yet): an engine killed
/// with SIGKILL while both faces' sandboxes have machines, disks and a
/// running command; the next engine on its state directory answers for
/// them only once nothing of them is left: nothing of their machines, no
/// mount or loop device of their disks, and 404 on both faces.
#[tokio::test]
async fn after_a_sigkill_the_successor_finds_nothing_of_the_sandboxes_left() {
    if !machines_here() {
        return;
    }
    let state = std::env::temp_dir().join(format!("cl-gone-crash-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let state_arg = state.display().to_string();
    let mut first = Engine::start("gone-crash", &["--state-dir", &state_arg], None);
    let (a, machine_a) = first.createos_machine().await;
    first.spawn(&a, "sleep 600").await;
    let (b, machine_b) = first.daytona_machine().await;
    let data = first.data.clone();
    let _ = first.child.kill();
    let _ = first.child.wait();
    let second = Engine::start("gone-crash-next", &["--state-dir", &state_arg], None);
    // The successor answers once the predecessor's sandboxes are proven
    // gone (or unconfirmed): nothing of them may be left by then.
    let (st, v) = second
        .call(reqwest::Method::GET, &format!("/v1/sandboxes/{a}"), None)
        .await;
    assert_nothing_left("the successor serves", &data, &a, &machine_a);
    assert_nothing_left(
        "the successor serves",
        &data,
        &format!("daytona-{b}"),
        &machine_b,
    );
    assert_eq!(st, 404, "{v}");
    let (st, v) = second
        .daytona(reqwest::Method::GET, &format!("api/sandbox/{b}"), None)
        .await;
    assert_eq!(st, 404, "{v}");
    let data2 = second.data.clone();
    let (ok, err) = second.stop();
    assert!(ok, "{err}");
    for dir in [data, data2, state] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Issue 40 item 1, at the engine's kill instant: an engine killed with
/// SIGKILL while machines are starting leaves none of them running. The
/// death guard learns of a machine only once its init is known; a
/// machine whose bwrap was forked before that moment ran on, recorded
/// nowhere, so no successor could prove it gone. Its outer bwrap and init
/// are found by the sandbox root on their command line.
#[tokio::test(flavor = "multi_thread")]
async fn a_sigkill_while_machines_start_leaves_none_running() {
    use std::time::{Duration, Instant};
    if !machines_here() {
        return;
    }
    for round in 0..6u64 {
        let mut engine = Engine::start("gone-starting", &[], None);
        let data = engine.data.clone();
        let needle = data.display().to_string();
        let mut sandboxes = Vec::new();
        for _ in 0..4 {
            sandboxes.push(engine.sandbox().await);
        }
        // Each sandbox's first command starts its machine: all at once.
        let starts: Vec<_> = sandboxes
            .iter()
            .map(|sb| {
                let request = engine
                    .http
                    .post(format!("{}/v1/sandboxes/{sb}/exec", engine.base))
                    .header("X-Api-Key", KEY)
                    .json(&json!({"cmd": "/bin/true"}));
                tokio::spawn(async move {
                    let _ = request.send().await;
                })
            })
            .collect();
        // A different instant each round, from the first forks on.
        tokio::time::sleep(Duration::from_millis(2 + round * 9)).await;
        let _ = engine.child.kill();
        let _ = engine.child.wait();
        for start in starts {
            let _ = start.await;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let left = loop {
            let left: Vec<String> = test_support::procs::live()
                .into_iter()
                .filter(|p| p.cmdline_contains(&needle))
                .map(|p| format!("{}: {}", p.pid, p.command_line()))
                .collect();
            if left.is_empty() || Instant::now() >= deadline {
                break left;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            left.is_empty(),
            "round {round}: 5 s after the engine was killed, machines it was starting still run: {left:#?}"
        );
        drop(engine);
        let _ = std::fs::remove_dir_all(&data);
    }
}
