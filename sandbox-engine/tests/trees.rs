//! Process trees against real processes, in both isolation modes: DELETE
//! must terminate the whole tree, and `tree_exited: true` is checked against
//! a scan of `/proc` for the test's marker (in argv and environment).

mod common;

use common::{exit_frame, marked_pids, marker, wait_marked, Harness};
use reqwest::StatusCode;
use sandbox_engine::IsolationPreference;
use serde_json::json;

/// Spawns `script` with a marker, waits for `min` marked processes, deletes
/// the process and proves nothing marked is left.
async fn delete_kills_tree(pref: IsolationPreference, name: &str, script: &str, min: usize) {
    let h = Harness::start_with(pref).await;
    let m = marker(name);
    let sb = h.sandbox_with_env(json!({ "TEST_MARKER": m })).await;
    let pid = h
        .spawn_body(
            &sb,
            json!({"cmd": "/bin/bash", "args": ["-c", script, m.clone()]}),
        )
        .await;
    let seen = wait_marked(&m, min).await;
    assert!(
        seen.len() >= min,
        "expected at least {min} marked processes, saw {seen:?}"
    );
    let (st, v) = h.delete_process(&sb, &pid, 500).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["tree_exited"], true, "{v}");
    assert_eq!(v["data"]["leader_exited"], true, "{v}");
    let left = marked_pids(&m);
    assert!(
        left.is_empty(),
        "processes survived a verified delete: {left:?}"
    );
    let (st, _) = h.get(&format!("/v1/sandboxes/{sb}/processes/{pid}")).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = h.delete_process(&sb, &pid, 500).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "second delete: already gone");
    let report = h.server.shutdown().await;
    assert!(report.all_exited(), "{report:?}");
}

/// The leader exits while a background child lives on: the exit frame
/// comes at once, `tree_exited` stays false until DELETE.
async fn leader_exit_with_orphan(pref: IsolationPreference) {
    let h = Harness::start_with(pref).await;
    let m = marker("orphan");
    let sb = h.sandbox_with_env(json!({ "TEST_MARKER": m })).await;
    let pid = h.spawn(&sb, "sleep 60 & echo started; exit 7").await;
    let (st, frames) = h.connect(&sb, &pid, 0).await.expect("connect");
    assert_eq!(st, StatusCode::OK);
    assert_eq!(exit_frame(&frames)["exit_code"], 7, "{frames:?}");
    assert_eq!(common::stream_bytes(&frames, "stdout", 0), b"started\n");
    let (_, v) = h.get(&format!("/v1/sandboxes/{sb}/processes/{pid}")).await;
    assert_eq!(v["data"]["leader_exited"], true, "{v}");
    assert_eq!(v["data"]["tree_exited"], false, "{v}");
    assert_eq!(v["data"]["state"], "exited", "{v}");
    assert_eq!(v["data"]["exit_code"], 7, "{v}");
    let (st, v) = h
        .get(&format!(
            "/v1/sandboxes/{sb}/processes/{pid}/wait?scope=tree&timeout_ms=300"
        ))
        .await;
    assert_eq!(st, StatusCode::REQUEST_TIMEOUT, "{v}");
    assert_eq!(v["status"], "fail");
    assert!(!marked_pids(&m).is_empty());
    let (st, v) = h.delete_process(&sb, &pid, 1000).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["data"]["tree_exited"], true, "{v}");
    assert!(marked_pids(&m).is_empty());
    assert!(h.server.shutdown().await.all_exited());
}

/// Shutdown terminates trees that ignore SIGTERM and reports success.
async fn shutdown_terminates_everything(pref: IsolationPreference) {
    let h = Harness::start_with(pref).await;
    let m = marker("shutdown");
    let sb = h.sandbox_with_env(json!({ "TEST_MARKER": m })).await;
    h.spawn(&sb, "trap '' TERM; sleep 60 & sleep 60; :").await;
    h.spawn(&sb, "while :; do :; done").await;
    assert!(wait_marked(&m, 3).await.len() >= 3);
    let root = h.server.data_dir().join(&sb);
    assert!(root.exists());
    let report = h.server.shutdown().await;
    assert_eq!(report.processes, 2);
    assert!(report.all_exited(), "{report:?}");
    assert!(marked_pids(&m).is_empty());
    assert!(!root.exists(), "sandbox root removed at shutdown");
}

const GRANDCHILDREN: &str = "sleep 60 & (sleep 60 & sleep 60; :) & wait";
const IGNORES_TERM: &str = "trap '' TERM; sleep 60; :";
const SETSID_DOUBLE_FORK: &str = "( setsid bash -c 'sleep 61; :' & ) ; sleep 60; :";
const BUSY_LOOP: &str = "while :; do :; done";

macro_rules! both_modes {
    ($($name:ident => $body:expr;)*) => {
        mod bwrap_or_auto {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let pref = IsolationPreference::Auto;
                    ($body)(pref).await;
                }
            )*
        }
        mod process_group {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let pref = IsolationPreference::ProcessGroup;
                    ($body)(pref).await;
                }
            )*
        }
    };
}

both_modes! {
    grandchildren => |p| delete_kills_tree(p, "grandchildren", GRANDCHILDREN, 4);
    ignores_sigterm => |p| delete_kills_tree(p, "ignoreterm", IGNORES_TERM, 2);
    setsid_double_fork => |p| delete_kills_tree(p, "setsid", SETSID_DOUBLE_FORK, 4);
    busy_loop => |p| delete_kills_tree(p, "busy", BUSY_LOOP, 1);
    orphan_keeps_tree_alive => leader_exit_with_orphan;
    shutdown => shutdown_terminates_everything;
}

/// A server dropped without `shutdown()` (e.g. a panicking test) still kills
/// what it started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_server_kills_its_trees() {
    let h = Harness::start().await;
    let m = marker("dropped-server");
    let sb = h.sandbox_with_env(json!({ "TEST_MARKER": m })).await;
    h.spawn(&sb, "trap '' TERM; sleep 60 & sleep 60; :").await;
    assert!(wait_marked(&m, 2).await.len() >= 2);
    drop(h);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !marked_pids(&m).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            marked_pids(&m)
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
