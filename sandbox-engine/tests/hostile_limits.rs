//! Issue 24, the host-wide limits a sandbox must meet from inside: its
//! own disk (a full `/tmp` is ENOSPC inside, never a full host disk),
//! bwrap's own failures answered as server failures, and the process
//! budget taken atomically. Each test failed on the code before its fix.

mod common;

use std::time::Duration;

use common::{Harness, KEY};
use reqwest::StatusCode;
use serde_json::json;

/// Whether this host should be able to give sandboxes disks of their own
/// (root, loop devices, mkfs.ext4): then a server without them is a
/// failure, not a skip.
fn disks_expected_here() -> bool {
    rustix::process::geteuid().is_root()
        && std::path::Path::new("/dev/loop-control").exists()
        && ["/sbin/mkfs.ext4", "/usr/sbin/mkfs.ext4"]
            .iter()
            .any(|p| std::path::Path::new(p).exists())
}

/// Size of the regular file at `path` on the host, 0 when absent.
fn host_size(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Issue 24 item 3 (disk): a sandbox wrote 4 GiB into its `/tmp`, all of
/// it on the host's disk (no quota). Now each sandbox has a disk of its
/// own (here 64 MiB): writing 200 MiB stops with ENOSPC inside, on both
/// faces; the host file holds at most the disk's size; a host-side upload
/// into the full sandbox fails without filling anything either; other
/// sandboxes and the server carry on, and deleting the sandbox frees its
/// disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_filling_its_disk_gets_enospc_inside_and_the_host_disk_stays_free() {
    const DISK: u64 = 64 << 20;
    let h = Harness::start_builder(sandbox_engine::Server::builder().sandbox_disk(DISK)).await;
    if !h.bwrap() {
        test_support::skipped("commands are not confined here (process-group mode)");
        return;
    }
    if h.server.sandbox_disk().is_none() {
        assert!(
            !disks_expected_here(),
            "a root server with loop devices and mkfs.ext4 gave sandboxes no disk of their own"
        );
        test_support::skipped("this host cannot mount sandbox disks");
        return;
    }
    let full = h.sandbox().await;
    let other = h.sandbox().await;
    let out = h
        .exec(
            &full,
            "dd if=/dev/zero of=/tmp/big bs=1M count=200 2>&1; echo rc=$?",
        )
        .await;
    let text = out["stdout"].as_str().expect("stdout");
    assert!(text.contains("No space left on device"), "{out}");
    assert!(!text.contains("rc=0"), "{out}");
    let big = h.server.data_dir().join(&full).join("tmp/big");
    assert!(
        host_size(&big) <= DISK,
        "{} bytes on the host",
        host_size(&big)
    );

    // The server's own writes into the sandbox count against its disk (a
    // client of its own: the server may close a connection whose upload
    // it stopped reading).
    let sent = reqwest::Client::new()
        .put(format!("{}/v1/sandboxes/{full}/files", h.base))
        .query(&[("path", "/tmp/upload")])
        .header("X-Api-Key", KEY)
        .body(vec![7u8; 8 << 20])
        .send()
        .await;
    match sent {
        Ok(resp) => {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            assert!(!status.is_success(), "{status} {body}");
            assert!(body.contains("No space left"), "{status} {body}");
        }
        // The server answered and closed while this client was still
        // writing (a loaded machine): the answer is lost with the
        // connection, but the upload must not have landed whole.
        Err(error) if error.is_request() => {
            let out = h
                .exec(&full, "stat -c %s /tmp/upload 2>/dev/null || echo none")
                .await;
            let size = out["stdout"].as_str().unwrap_or("").trim().to_owned();
            assert!(
                size == "none" || size.parse::<u64>().is_ok_and(|n| n < 8 << 20),
                "the upload cut by the server left {size} bytes ({error})"
            );
        }
        Err(error) => panic!("upload: {error}"),
    }

    // Everything else carries on.
    let out = h
        .exec(&other, "echo alive > /tmp/x && cat /tmp/x && df -k /tmp")
        .await;
    assert_eq!(out["exit_code"], 0, "{out}");
    assert!(
        out["stdout"].as_str().unwrap_or("").starts_with("alive\n"),
        "{out}"
    );
    let out = h.exec(&full, "rm /tmp/big && echo freed").await;
    assert_eq!(out["stdout"], "freed\n", "{out}");

    // Deleting the sandbox removes its disk.
    let image = h
        .server
        .data_dir()
        .join(".disks")
        .join(format!("{full}.img"));
    assert!(image.exists(), "no disk image at {}", image.display());
    let (st, v) = h.delete(&format!("/v1/sandboxes/{full}")).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert!(!image.exists(), "the disk image outlived its sandbox");
    assert!(!h.server.data_dir().join(&full).exists());

    // The Daytona face: the same write through `process/execute`.
    let sb = h.daytona_sandbox().await;
    let (st, v) = h
        .daytona_execute(
            &sb,
            "sh -c 'head -c 209715200 /dev/zero > /tmp/big; echo rc=$?'",
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let result = v["result"].as_str().unwrap_or("");
    assert!(result.contains("No space left on device"), "{v}");
    assert!(!result.contains("rc=0"), "{v}");
    let root = h.server.data_dir().join(format!("daytona-{sb}"));
    assert!(host_size(&root.join("tmp/big")) <= DISK);
    let (st, v) = h.daytona_delete(&sb).await;
    assert!(st.is_success(), "{st} {v}");
    let out = h.exec(&other, "echo still").await;
    assert_eq!(out["stdout"], "still\n", "{out}");
    let report = h.server.shutdown().await;
    assert!(report.all_exited(), "{report:?}");
}

/// Issue 24 item 4 (process budget, atomic): the budget was checked, then
/// the start counted, so requests arriving together all passed the check.
/// Now 16 starts at once against `--max-processes 3` never leave more
/// than 3 processes live; the rest are 429 `process_limit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_starts_never_exceed_the_process_budget() {
    let h = Harness::start_builder(sandbox_engine::Server::builder().max_processes(3)).await;
    let sb = h.sandbox().await;
    let path = format!("/v1/sandboxes/{sb}/processes");
    let starts = (0..16).map(|_| h.post(&path, json!({"cmd": "/bin/sleep", "args": ["30"]})));
    let answers = futures_join_all(starts).await;
    let created = answers
        .iter()
        .filter(|(st, _)| *st == StatusCode::CREATED)
        .count();
    for (st, v) in &answers {
        assert!(
            *st == StatusCode::CREATED
                || (*st == StatusCode::TOO_MANY_REQUESTS && v["data"]["reason"] == "process_limit"),
            "{st} {v}"
        );
    }
    assert!(created >= 1, "no start was admitted: {answers:?}");
    assert!(
        created <= 3,
        "{created} processes started against a budget of 3"
    );
    let report = h.server.shutdown().await;
    assert!(report.all_exited(), "{report:?}");
}

/// Runs the futures concurrently and collects their outputs in order.
async fn futures_join_all<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<_> = futs.map(|f| Some(Box::pin(f))).collect();
    let mut results: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (i, slot) in pending.iter_mut().enumerate() {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        results[i] = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    results.into_iter().flatten().collect()
}

/// Issue 24 item 4 (process budget, every task): the budget counted only
/// processes started through the API, so one process forking many
/// children used one slot. Where the kernel counts a command's tasks (a
/// pids group per command), a start is refused once the tasks of the
/// running commands reach the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_budget_counts_every_task_of_running_commands() {
    let h = Harness::start_builder(sandbox_engine::Server::builder().max_processes(4)).await;
    if !h.bwrap() || !sandbox_engine::machine::enabled_here() {
        test_support::skipped("commands have no pids group of their own here");
        return;
    }
    let sb = h.sandbox().await;
    let p = h
        .spawn(
            &sb,
            "for i in 1 2 3 4 5 6; do sleep 60 & done; touch /tmp/forked; wait",
        )
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let resp = h
            .http
            .get(format!("{}/v1/sandboxes/{sb}/files", h.base))
            .query(&[("path", "/tmp/forked")])
            .header("X-Api-Key", KEY)
            .send()
            .await
            .expect("files");
        if resp.status() == StatusCode::OK {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the command never forked"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    h.assert_process_limit(&sb).await;
    // Fairness (issue 40 item 2): the tasks one sandbox forked do not
    // starve another: a sandbox under its fair share of the budget
    // (budget / sandboxes, at least one) still starts a command.
    let other = h.sandbox().await;
    let out = h.exec(&other, "echo not starved").await;
    assert_eq!(out["stdout"], "not starved\n", "{out}");
    h.assert_process_limit(&sb).await;
    let (st, v) = h.delete_process(&sb, &p, 100).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let out = h.exec(&sb, "echo room").await;
    assert_eq!(out["stdout"], "room\n", "{out}");
    let report = h.server.shutdown().await;
    assert!(report.all_exited(), "{report:?}");
}

/// Issue 24 item 7 (launcher failures): in a sandbox whose commands hold
/// every task its limit allows, a new command's launcher cannot fork; the
/// exec answered 200 with exit 1 and the launcher's error as the command's
/// stderr. Now that is the server's failure: 503 `start_failed` with a
/// message on the CreateOS face and a 5xx on the Daytona face; the
/// sandbox works again once its tasks are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launcher_that_cannot_start_the_command_is_a_server_failure() {
    // A host-wide budget above the sandbox's own task limit: the sandbox
    // fills up before the server's budget refuses anything.
    let h = Harness::start_builder(sandbox_engine::Server::builder().max_processes(100_000)).await;
    if !h.bwrap() {
        test_support::skipped("commands are not confined here (process-group mode)");
        return;
    }
    let sb = h.daytona_sandbox().await;
    let core = h.server.data_dir().join(format!("daytona-{sb}"));
    assert!(core.exists());
    // Fill the sandbox's task limit with sleeping processes (bash retries
    // a failed fork quietly, so the limit stays full).
    let (st, v) = h.daytona_session(&sb, "bomb").await;
    assert!(st.is_success(), "{st} {v}");
    let (st, v) = h
        .daytona_session_exec(
            &sb,
            "bomb",
            json!({
                "command": "bash -c 'while true; do sleep 300 & done' 2>/dev/null",
                "runAsync": true
            }),
        )
        .await;
    assert!(st.is_success(), "{st} {v}");
    // Wait until the sandbox is full: a fork inside fails.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let last = loop {
        let answer = h.daytona_execute(&sb, "echo hi").await;
        if answer.0 != StatusCode::OK || answer.1["exitCode"] != 0 {
            break answer;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox never filled up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(last.0.is_server_error(), "{last:?}");
    let message = last.1["message"].as_str().unwrap_or("");
    assert!(!message.is_empty(), "{last:?}");
    // A synchronous session command the same way.
    let (st, v) = h
        .daytona_session_exec(&sb, "bomb", json!({"command": "echo hi"}))
        .await;
    assert!(st.is_server_error(), "{st} {v}");
    let (st, v) = h.daytona_delete(&sb).await;
    assert!(st.is_success(), "{st} {v}");

    // The CreateOS face: the same through `exec`.
    let sb = h.sandbox().await;
    h.spawn(&sb, "while true; do sleep 300 & done 2>/dev/null")
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let last = loop {
        let (st, v) = h
            .post(
                &format!("/v1/sandboxes/{sb}/exec"),
                json!({"cmd": "/bin/echo", "args": ["hi"]}),
            )
            .await;
        if st != StatusCode::OK || v["data"]["result"]["exit_code"] != 0 {
            break (st, v);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox never filled up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(last.0, StatusCode::SERVICE_UNAVAILABLE, "{last:?}");
    assert_eq!(last.1["code"], "start_failed", "{last:?}");
    assert!(last.1["message"]
        .as_str()
        .is_some_and(|m| m.contains("nothing ran")));
    let (st, v) = h.delete(&format!("/v1/sandboxes/{sb}")).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let report = h.server.shutdown().await;
    assert!(report.all_exited(), "{report:?}");
}

/// Issue 24 item 3 (disk, host-wide): sandbox disks are sparse, so many
/// could promise more than the host has. A creation whose disk the host
/// could not hold (with every other sandbox disk filled) is a 429
/// `disk_limit` on both faces, with nothing created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_disk_the_host_could_not_hold_is_refused_with_429() {
    let h = Harness::start_builder(sandbox_engine::Server::builder().sandbox_disk(1 << 50)).await;
    if h.server.sandbox_disk().is_none() {
        assert!(
            !h.bwrap() || !disks_expected_here(),
            "a root server with loop devices and mkfs.ext4 gave sandboxes no disk of their own"
        );
        test_support::skipped("this host cannot mount sandbox disks");
        return;
    }
    let (st, v) = h.create_sandbox(json!({})).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["data"]["reason"], "disk_limit", "{v}");
    assert!(
        v["data"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("--sandbox-disk")),
        "{v}"
    );
    let (st, v) = h.daytona_create(json!({"snapshot": "daytona-small"})).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["code"], "disk_limit", "{v}");
    let leftovers: Vec<_> = std::fs::read_dir(h.server.data_dir())
        .expect("data dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("sb-") || n.starts_with("daytona-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The bytes of the file at `path` (sparse regions read as zeros).
fn file_bytes(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The source of the loop device mounted on `root` (`/dev/loopN`), from
/// this process's mount table.
fn mounted_device(root: &std::path::Path) -> Option<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let at = root.to_str()?;
    table.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let dash = fields.iter().position(|f| *f == "-")?;
        (fields.get(4) == Some(&at))
            .then(|| fields.get(dash + 2).map(|s| s.to_string()))
            .flatten()
    })
}

/// Sandbox disks are copies of one pre-formatted template per server
/// (made at start instead of a `mkfs.ext4` per sandbox). The copies must
/// keep every promise of a disk made for the sandbox alone: each is the
/// sandbox's size and ENOSPC at it; two sandboxes' disks are independent
/// (different loop devices, one's files and fill absent from the other);
/// no sandbox can reach or change the template (it is outside every
/// root, its bytes the same after a sandbox filled its copy); and nothing
/// of it outlives the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_disks_are_independent_copies_of_a_template_no_sandbox_can_change() {
    const DISK: u64 = 48 << 20;
    let h = Harness::start_builder(sandbox_engine::Server::builder().sandbox_disk(DISK)).await;
    if !h.bwrap() {
        test_support::skipped("commands are not confined here (process-group mode)");
        return;
    }
    if h.server.sandbox_disk().is_none() {
        assert!(
            !disks_expected_here(),
            "a root server with loop devices and mkfs.ext4 gave sandboxes no disk of their own"
        );
        test_support::skipped("this host cannot mount sandbox disks");
        return;
    }
    let data_dir = h.server.data_dir().to_path_buf();
    let template = data_dir.join(".disks").join("template.ext4");
    assert_eq!(
        host_size(&template),
        DISK,
        "the template is the disks' size"
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(data_dir.join(".disks"))
            .expect(".disks")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "only root may enter .disks: {mode:o}");
    }
    let before = file_bytes(&template);
    // Where /dev/shm is a tmpfs the template is kept there, behind a link.
    let in_memory = std::fs::read_link(&template).ok();

    let a = h.sandbox().await;
    let b = h.sandbox().await;
    let (dev_a, dev_b) = (
        mounted_device(&data_dir.join(&a)),
        mounted_device(&data_dir.join(&b)),
    );
    assert!(
        dev_a.as_deref().is_some_and(|d| d.starts_with("/dev/loop")),
        "{dev_a:?}"
    );
    assert!(
        dev_b.as_deref().is_some_and(|d| d.starts_with("/dev/loop")),
        "{dev_b:?}"
    );
    assert_ne!(dev_a, dev_b, "two sandboxes share one disk");

    // The template's host path is nowhere inside a sandbox.
    let out = h
        .exec(
            &a,
            &format!(
                "test -e '{}' && echo reachable; test -e /.disks && echo disks; echo checked",
                template.display()
            ),
        )
        .await;
    assert_eq!(out["stdout"], "checked\n", "{out}");

    // A fills its copy: ENOSPC at its own size.
    let out = h
        .exec(
            &a,
            "echo mine > /tmp/a-only; dd if=/dev/urandom of=/tmp/fill bs=1M count=100 2>&1; \
             echo rc=$?; df -k / | tail -1",
        )
        .await;
    let text = out["stdout"].as_str().expect("stdout");
    assert!(text.contains("No space left on device"), "{out}");
    assert!(!text.contains("rc=0"), "{out}");
    let filled = host_size(&data_dir.join(&a).join("tmp/fill"));
    assert!(
        filled <= DISK && filled > DISK / 2,
        "{filled} bytes written of {DISK}"
    );

    // B sees none of it: its disk is empty and has its whole room.
    let out = h
        .exec(
            &b,
            "test -e /tmp/a-only && echo leaked; test -e /tmp/fill && echo leaked; \
             dd if=/dev/zero of=/tmp/b bs=1M count=16 >/dev/null 2>&1; echo rc=$?",
        )
        .await;
    assert_eq!(out["stdout"], "rc=0\n", "{out}");

    // The template did not change.
    assert!(
        file_bytes(&template) == before,
        "a sandbox changed the template"
    );

    let (st, v) = h.delete(&format!("/v1/sandboxes/{a}")).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let out = h.exec(&b, "test -e /tmp/b && echo kept").await;
    assert_eq!(out["stdout"], "kept\n", "{out}");

    // Nothing of the disks outlives the server.
    let report = h.server.shutdown().await;
    assert!(report.all_exited(), "{report:?}");
    assert!(!template.exists(), "the template outlived the server");
    if let Some(file) = in_memory {
        assert!(
            !file.exists(),
            "the template {} outlived the server",
            file.display()
        );
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = data_dir.display().to_string();
    assert!(
        !mounts.lines().any(|l| l.contains(&prefix)),
        "a sandbox disk is still mounted"
    );
    let images: Vec<_> = std::fs::read_dir(data_dir.join(".disks"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(images.is_empty(), "{images:?}");
}
