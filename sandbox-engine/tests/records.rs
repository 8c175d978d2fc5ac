//! An engine with a state directory records its sandboxes, and its
//! successor on that directory proves a predecessor's sandboxes gone
//! (killing what is left of them) before it answers 404 for them, or
//! answers 500 while it cannot prove it. Real servers, real processes.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::Harness;
use reqwest::StatusCode;
use sandbox_engine::storage::records::{namespace_identity, Face, Record, TreeId, HISTORY};
use sandbox_engine::Server;

/// A fresh directory for one test.
fn fresh(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "records-{tag}-{}-{}",
        std::process::id(),
        common::marker("d")
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A server on `data` keeping its records in `state`.
async fn engine(data: &Path, state: &Path) -> Harness {
    Harness::start_builder(Server::builder().data_dir(data).state_dir(state)).await
}

fn record_path(state: &Path, id: &str) -> PathBuf {
    state.join(format!("sandboxes/{id}.json"))
}

fn read_record(state: &Path, id: &str) -> Record {
    let text = std::fs::read(state.join(format!("sandboxes/{id}.json"))).expect("a record");
    serde_json::from_slice(&text).expect("a record is JSON")
}

/// Writes the record of a sandbox `id` an engine before this one made
/// under `data` (its root exists), as that engine would have.
fn plant_record(state: &Path, data: &Path, id: &str, uid: Option<u32>, trees: Vec<TreeId>) {
    std::fs::create_dir_all(state.join("sandboxes")).unwrap();
    std::fs::write(state.join(HISTORY), "").unwrap();
    let root = data.join(id);
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    let record = Record {
        id: id.to_string(),
        face: Face::CreateOs,
        root,
        data_dir: data.to_path_buf(),
        owned_data_dir: false,
        uid,
        trees,
        deleted: false,
    };
    std::fs::write(
        state.join(format!("sandboxes/{id}.json")),
        serde_json::to_vec(&record).unwrap(),
    )
    .unwrap();
}

/// `sleep` as PID 1 of a PID namespace of its own (`unshare --pid
/// --fork`): the unshare process and the namespace as a recorded tree.
fn namespace_with_sleep() -> (Child, i32, TreeId) {
    let child = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "sleep", "1001"])
        .spawn()
        .expect("unshare");
    let outer = child.id() as i32;
    let deadline = Instant::now() + Duration::from_secs(20);
    let init = loop {
        let kids = std::fs::read_to_string(format!("/proc/{outer}/task/{outer}/children"))
            .unwrap_or_default();
        if let Some(pid) = kids.split_whitespace().next().and_then(|p| p.parse().ok()) {
            if namespace_identity(pid).is_some()
                && namespace_identity(pid) != namespace_identity(outer)
            {
                break pid;
            }
        }
        assert!(Instant::now() < deadline, "unshare did not fork");
        std::thread::sleep(Duration::from_millis(10));
    };
    let (dev, ino) = namespace_identity(init).unwrap();
    let start = std::fs::read_to_string(format!("/proc/{init}/stat")).unwrap();
    let start: u64 = start[start.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    let tree = TreeId::Namespace {
        init_pid: init,
        init_start: Some(start),
        dev: Some(dev),
        ino,
    };
    (child, init, tree)
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !matches!(
            s[s.rfind(')').unwrap() + 2..].chars().next(),
            Some('Z' | 'X')
        )
    })
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The record of a sandbox is written before its create is answered,
/// names the trees its commands ran in, and is removed by a delete (the
/// directory's history is complete: what it does not hold is a 404); after
/// the engine, its successor proves a sandbox it never saw deleted gone,
/// removes its files and record, and answers 404 for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_proves_the_sandboxes_of_the_engine_before_it_gone() {
    let dir = fresh("successor");
    let (data, state) = (dir.join("data"), dir.join("state"));
    let first = engine(&data, &state).await;
    let kept = first.sandbox().await;
    let deleted = first.sandbox().await;
    let record = read_record(&state, &kept);
    assert_eq!(record.face, Face::CreateOs);
    assert!(!record.deleted);
    let ran = first.exec(&kept, "echo hi").await;
    assert_eq!(ran["exit_code"], 0, "{ran}");
    if first.bwrap() {
        assert!(
            !read_record(&state, &kept).trees.is_empty(),
            "the tree the command ran in is recorded"
        );
    }
    let (st, _) = first.delete(&format!("/v1/sandboxes/{deleted}")).await;
    assert_eq!(st, StatusCode::OK);
    assert!(
        !record_path(&state, &deleted).exists(),
        "the record of a deleted sandbox is removed on a complete history"
    );
    let report = first.server.shutdown().await;
    assert!(report.all_exited(), "{report:?}");
    // Files of `kept` left behind, as an engine that died leaves them.
    let root = record.root.clone();
    std::fs::create_dir_all(root.join("tmp")).unwrap();

    // The successor has a data directory of its own, as each `sandbox
    // engine` has (machines are found by their root's path: a probe machine
    // of the first engine may still idle at the same path).
    let second = engine(&dir.join("data2"), &state).await;
    for id in [&kept, &deleted] {
        let (st, v) = second.get(&format!("/v1/sandboxes/{id}")).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{id}: {v}");
        let (st, v) = second.delete(&format!("/v1/sandboxes/{id}")).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{id}: {v}");
    }
    assert!(
        !record_path(&state, &kept).exists(),
        "the record of a sandbox proven gone is removed on a complete history"
    );
    assert!(
        !root.exists(),
        "the files of a sandbox proven gone are removed"
    );
    // An id never issued on this state directory.
    let (st, _) = second.get("/v1/sandboxes/sb-0000000000000000").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // Two engines never share one state directory.
    let refused = Server::builder()
        .api_key("k")
        .data_dir(dir.join("other"))
        .state_dir(&state)
        .quiet(true)
        .start()
        .await;
    assert!(
        refused.is_err(),
        "a second engine on the state directory started"
    );
    let report = second.server.shutdown().await;
    assert!(report.all_exited(), "{report:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A predecessor's sandbox whose PID namespace still has a live process
/// (a `sleep` as its init) is killed by the successor before it answers
/// 404 for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_namespace_of_a_dead_engine_is_killed_before_its_sandbox_is_called_gone() {
    if !is_root() {
        test_support::skipped("unshare --pid needs root here");
        return;
    }
    let dir = fresh("live");
    let (data, state) = (dir.join("data"), dir.join("state"));
    let (mut unshare, init, tree) = namespace_with_sleep();
    let id = "sb-00000000000000a1";
    plant_record(&state, &data, id, None, vec![tree]);
    assert!(alive(init));

    let second = engine(&data, &state).await;
    assert!(
        !alive(init),
        "the successor answers with the namespace's init alive"
    );
    let (st, v) = second.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    assert!(!record_path(&state, id).exists(), "its record is ended");
    assert!(!data.join(id).exists());
    let _ = unshare.wait();
    let _ = second.server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A predecessor's sandbox the successor cannot prove gone (a process of
/// its uid still runs: it may be a tree no record names) is answered 500
/// `unconfirmed`, never 404; a DELETE once that process is gone proves it
/// and answers `destroyed`, and then it is a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_not_proven_gone_answers_500_until_a_delete_proves_it() {
    if !is_root() {
        test_support::skipped("running a process as another uid needs root");
        return;
    }
    let dir = fresh("unproven");
    let (data, state) = (dir.join("data"), dir.join("state"));
    // A uid no engine gives a sandbox (no range starts there, see sandbox_engine::trees::id_map).
    let uid = 2_070_000 + std::process::id() % 1000;
    let mut straggler = {
        use std::os::unix::process::CommandExt;
        Command::new("sleep")
            .arg("1002")
            .uid(uid)
            .gid(uid)
            .spawn()
            .unwrap()
    };
    let id = "sb-00000000000000b2";
    plant_record(&state, &data, id, Some(uid), Vec::new());

    let second = engine(&data, &state).await;
    assert!(
        alive(straggler.id() as i32),
        "a process not provably its own was killed"
    );
    let (st, v) = second.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
    assert_eq!(v["code"], "unconfirmed", "{v}");
    let (st, v) = second.delete(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
    assert!(!read_record(&state, id).deleted);

    straggler.kill().unwrap();
    straggler.wait().unwrap();
    let (st, v) = second.delete(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["status"], "destroyed", "{v}");
    let (st, _) = second.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert!(!record_path(&state, id).exists(), "its record is ended");
    let _ = second.server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A state directory the engine did not make itself (an embedder made it
/// to say that engines before kept no records) cannot vouch for ids it
/// does not know: they are answered 500, on both faces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_id_is_not_called_gone_without_a_complete_history() {
    let dir = fresh("history");
    let (data, state) = (dir.join("data"), dir.join("state"));
    std::fs::create_dir_all(&state).unwrap();
    let h = engine(&data, &state).await;
    let (st, v) = h.get("/v1/sandboxes/sb-00000000000000c3").await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
    assert_eq!(v["code"], "unconfirmed", "{v}");
    let (st, v) = h
        .daytona(
            reqwest::Method::DELETE,
            &format!(
                "{}/sandbox/{}",
                h.server.daytona_api_url(),
                "00000000-0000-4000-8000-0000000000c3"
            ),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
    // Its own sandboxes are known: created, deleted, then 404.
    let id = h.sandbox().await;
    let (st, _) = h.delete(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(st, StatusCode::OK);
    let (st, _) = h.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let _ = h.server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts the `createos-local` binary with `args`; it and its base URL.
fn binary(args: &[&str]) -> (std::process::Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_createos-local"))
        .args(args)
        .env("CREATEOS_API_KEY", common::KEY)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn createos-local");
    let (base, _) = test_support::local::listening(&mut child);
    (child, base)
}

/// The binary killed with SIGKILL (its guard ends its sandbox's
/// processes): the next one on its state directory and port answers 404
/// for that sandbox, once proven, and nothing of it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_killed_with_sigkill_has_its_sandboxes_proven_gone_by_the_next_one() {
    let dir = fresh("binary");
    let state = dir.join("state");
    let state_arg = state.display().to_string();
    let (mut first, base) = binary(&["--port", "0", "--state-dir", &state_arg]);
    let http = reqwest::Client::new();
    let call = |method: reqwest::Method, url: String| {
        http.request(method, url)
            .header("X-Api-Key", common::KEY)
            .send()
    };
    let m = common::marker("rec");
    let created: serde_json::Value = http
        .post(format!("{base}/v1/sandboxes"))
        .header("X-Api-Key", common::KEY)
        .json(&serde_json::json!({"shape": "s-1vcpu-256mb", "env": {"TEST_MARKER": m}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["data"]["id"].as_str().expect("id").to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v: serde_json::Value = call(reqwest::Method::GET, format!("{base}/v1/sandboxes/{id}"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if v["data"]["status"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "{v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = http
        .post(format!("{base}/v1/sandboxes/{id}/processes"))
        .header("X-Api-Key", common::KEY)
        .json(&serde_json::json!({"cmd": "/bin/sleep", "args": ["60"]}))
        .send()
        .await
        .unwrap();
    assert!(started.status().is_success(), "{started:?}");
    assert!(
        !common::wait_marked(&m, 1).await.is_empty(),
        "the command runs"
    );
    let record = read_record(&state, &id);
    first.kill().unwrap();
    first.wait().unwrap();

    let port = base.rsplit(':').next().unwrap().to_string();
    let (mut second, base2) = binary(&["--port", &port, "--state-dir", &state_arg]);
    assert_eq!(base2, base);
    assert!(
        common::marked_pids(&m).is_empty(),
        "served while the command runs"
    );
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let resp = call(method, format!("{base}/v1/sandboxes/{id}"))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    }
    assert!(!record_path(&state, &id).exists(), "its record is ended");
    assert!(record.owned_data_dir);
    assert!(
        !record.data_dir.exists(),
        "the dead engine's own data directory is left"
    );
    let _ = Command::new("kill")
        .args(["-TERM", &second.id().to_string()])
        .status();
    let status = second.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
