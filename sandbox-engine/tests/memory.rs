//! Issue 44 item 2: a sandbox is limited by the memory it *uses* (its
//! memory group), never by the address space its programs *reserve*; a
//! command that goes past the limit is killed by the kernel inside its own
//! sandbox, reported as such, and the sandbox and the engine go on.
//!
//! Its own test binary: the memory limit is process-wide
//! (`ServerBuilder::sandbox_memory`), and the small one set here must not
//! reach the other suites' sandboxes.

mod common;

use common::Harness;
use sandbox_engine::{IsolationMode, IsolationPreference, Server};

const LIMIT: u64 = 256 << 20;

#[tokio::test]
async fn a_sandbox_is_limited_by_what_it_uses_not_by_what_it_reserves() {
    if !rustix::process::geteuid().is_root()
        || sandbox_engine::trees::process_limits::memory_cgroup_base().is_none()
    {
        test_support::skipped("no cgroup v1 memory hierarchy this (root) server can use");
        return;
    }
    let h = Harness::start_builder(
        Server::builder()
            .isolation(IsolationPreference::RequireBwrap)
            .sandbox_memory(LIMIT),
    )
    .await;
    assert_eq!(*h.server.isolation(), IsolationMode::Bwrap);
    let sb = h.sandbox().await;

    // No address-space limit: 16 GiB reserved (64 times the limit) is fine.
    let r = h
        .exec(
            &sb,
            "ulimit -v; python3 -c 'import mmap; m = mmap.mmap(-1, 16 << 30, \
             flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=0); print(\"reserved\", len(m))'",
        )
        .await;
    assert_eq!(r["stdout"], "unlimited\nreserved 17179869184\n", "{r}");

    // Using 1 GiB (every page written) is four times the limit: the kernel
    // kills the command inside the sandbox, and the engine says why.
    let r = h
        .exec(
            &sb,
            "python3 -c 'b = b\"x\" * (1 << 30); print(\"used\", len(b))'",
        )
        .await;
    assert_eq!(r["stdout"], "", "{r}");
    let killed = r["signal"] == "SIGKILL" || r["exit_code"] == 137;
    assert!(killed, "not killed by SIGKILL: {r}");
    let stderr = r["stderr"].as_str().unwrap_or_default();
    assert!(
        stderr.contains("the sandbox reached its memory limit (256 MiB)"),
        "{r}"
    );

    // Within the limit, memory is there to use; the sandbox goes on.
    let r = h
        .exec(
            &sb,
            "python3 -c 'b = b\"x\" * (64 << 20); print(\"used\", len(b))'",
        )
        .await;
    assert_eq!(r["stdout"], "used 67108864\n", "{r}");
    assert!(h.server.shutdown().await.all_exited());
}

/// A sandbox proven gone leaves no group behind: its pids group (with its
/// command groups) and its memory group are removed with it, and its
/// range of ids is given up. Before, one
/// of each stayed per sandbox ever made (thousands after a soak).
#[tokio::test]
async fn a_deleted_sandbox_leaves_no_cgroup_behind() {
    let (Some(pids), Some(memory)) = (
        sandbox_engine::trees::process_limits::pids_cgroup_base(),
        sandbox_engine::trees::process_limits::memory_cgroup_base(),
    ) else {
        test_support::skipped(
            "no cgroup v1 pids and memory hierarchies this (root) server can use",
        );
        return;
    };
    let h = Harness::start_builder(Server::builder().isolation(IsolationPreference::RequireBwrap))
        .await;
    let sb = h.sandbox().await;
    let r = h.exec(&sb, "sleep 0.1 & echo started").await;
    assert_eq!(r["stdout"], "started\n", "{r}");
    let owner = sandbox_engine::trees::host_processes::sandbox_uid(&h.server.data_dir().join(&sb))
        .expect("a sandbox of its own ids");
    let name = format!("sandbox-{owner}");
    assert!(pids.join(&name).is_dir() && memory.join(&name).is_dir());
    let (st, v) = h.delete(&format!("/v1/sandboxes/{sb}")).await;
    assert_eq!(st, reqwest::StatusCode::OK, "{v}");
    assert!(!pids.join(&name).exists(), "its pids group stays");
    assert!(!memory.join(&name).exists(), "its memory group stays");
    // Its range of ids is given up (no engine holds its claim any more).
    let claim = std::fs::File::open(
        std::path::Path::new(sandbox_engine::trees::id_map::CLAIMS_DIR).join(owner.to_string()),
    )
    .expect("the range was claimed");
    assert!(
        rustix::fs::flock(&claim, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok(),
        "the range of a deleted sandbox stays claimed"
    );
    assert!(h.server.shutdown().await.all_exited());
}
