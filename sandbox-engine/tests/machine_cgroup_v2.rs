//! Issue 37 item 3: the engine run by an ordinary user inside a cgroup v2
//! group delegated to it (made here as systemd's `Delegate=yes` makes
//! one: a group under the cgroup2 mount, it and its `cgroup.procs`,
//! `cgroup.subtree_control` and `cgroup.threads` owned by the user, the
//! engine moved in before it runs) proves each command's tree with a
//! group of its own: a `setsid` double fork stays in it and ends with the
//! command, a process that kills what holds its command cannot make the
//! end unproven, a pause freezes the groups (`frozen 1`), and a delete
//! removes them.
//!
//! Without the backend the same engine fell back to the subreaper anchor
//! ("no cgroup this server can write"): a killed anchor gave
//! `tree_exited: false`, and nothing was frozen by the kernel.
//!
//! The tests need root (to make and give the group) and a cgroup2 mount:
//! `/sys/fs/cgroup` where it is cgroup2, else `/sys/fs/cgroup/unified`,
//! mounted here when missing. A host where neither can be had fails the
//! test: it could not exercise its model.

#[path = "common/binary.rs"]
mod binary;
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use binary::Engine;
use common::marker;
use reqwest::Method;
use serde_json::{json, Value};

/// The ordinary user the engine runs as (see [`binary::ordinary_user`]).
fn ordinary_user() -> Option<(u32, u32)> {
    binary::ordinary_user("machine_cgroup_v2")
}

/// `statfs` magic of a cgroup2 file system.
const CGROUP2_MAGIC: i64 = 0x6367_7270;

fn is_cgroup2(dir: &Path) -> bool {
    // `f_type` is `i64` here, another integer type on other targets.
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::statfs(dir).is_ok_and(|s| s.f_type as i64 == CGROUP2_MAGIC)
}

/// The cgroup2 mount: `/sys/fs/cgroup` on a pure v2 host, else
/// `/sys/fs/cgroup/unified` (mounted here when it is not).
fn cgroup2_mount() -> PathBuf {
    let pure = Path::new("/sys/fs/cgroup");
    if is_cgroup2(pure) {
        return pure.to_path_buf();
    }
    let unified = Path::new("/sys/fs/cgroup/unified");
    if !is_cgroup2(unified) {
        let _ = std::fs::create_dir_all(unified);
        let out = std::process::Command::new("mount")
            .args(["-t", "cgroup2", "none"])
            .arg(unified)
            .output()
            .expect("run mount");
        assert!(
            out.status.success() && is_cgroup2(unified),
            "no cgroup2 mount here and none could be made at {} ({}): this test cannot \
             exercise the delegated cgroup v2 model",
            unified.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    unified.to_path_buf()
}

/// A group delegated to the ordinary user, removed (everything in it
/// killed first) when dropped.
struct Delegated {
    dir: PathBuf,
}

impl Delegated {
    fn make(tag: &str, (uid, gid): (u32, u32)) -> Delegated {
        let dir = cgroup2_mount().join(format!("createos-test-{tag}-{}", std::process::id()));
        remove_tree(&dir);
        std::fs::create_dir(&dir).expect("mkdir the delegated group");
        for owned in [
            dir.clone(),
            dir.join("cgroup.procs"),
            dir.join("cgroup.subtree_control"),
            dir.join("cgroup.threads"),
        ] {
            std::os::unix::fs::chown(&owned, Some(uid), Some(gid)).expect("chown the group");
        }
        Delegated { dir }
    }

    /// Every group below it, as paths relative to it.
    fn groups(&self) -> Vec<String> {
        let mut found = Vec::new();
        walk(&self.dir, &self.dir, &mut found);
        found
    }

    /// The groups below it whose name holds `needle`.
    fn groups_named(&self, needle: &str) -> Vec<String> {
        self.groups()
            .into_iter()
            .filter(|g| g.rsplit('/').next().is_some_and(|n| n.contains(needle)))
            .collect()
    }
}

fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            out.push(
                path.strip_prefix(base)
                    .expect("below")
                    .to_string_lossy()
                    .into_owned(),
            );
            walk(base, &path, out);
        }
    }
}

/// Kills everything in the group at `dir` and removes it with its
/// children.
fn remove_tree(dir: &Path) {
    if !dir.is_dir() {
        return;
    }
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    let mut all = Vec::new();
    walk(dir, dir, &mut all);
    all.sort_by_key(|g| std::cmp::Reverse(g.matches('/').count()));
    let deadline = Instant::now() + Duration::from_secs(5);
    for g in all.iter().map(|g| dir.join(g)).chain([dir.to_path_buf()]) {
        while std::fs::remove_dir(&g).is_err() && g.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Delegated {
    fn drop(&mut self) {
        remove_tree(&self.dir);
    }
}

/// The engine binary as the ordinary user inside a group delegated to
/// it; `None` without root (skipped, and said so).
fn engine_in_delegated_group(tag: &str) -> Option<(Engine, Delegated)> {
    engine_in_delegated_group_with(tag, &[])
}

/// [`engine_in_delegated_group`] with the engine's `args`.
fn engine_in_delegated_group_with(tag: &str, args: &[&str]) -> Option<(Engine, Delegated)> {
    let user = ordinary_user()?;
    let group = Delegated::make(tag, user);
    let procs = group.dir.join("cgroup.procs");
    let engine = Engine::start_in(tag, args, None, Some(user), Some(&procs));
    Some((engine, group))
}

/// The `0::` line of `/proc/PID/cgroup`: the process's cgroup v2 group,
/// relative to the mount.
fn v2_group_of(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string))
}

/// The marked processes whose command line starts with `prefix`.
fn marked_running(m: &str, prefix: &str) -> Vec<i32> {
    common::marked_pids(m)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.starts_with(prefix.as_bytes()))
        })
        .collect()
}

async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Kills the process holding the command (its parent in the machine),
/// if the command can see one: the anchor where there is one.
const KILL_THE_HOLDER: &str = "P=$PPID; if [ \"$P\" -gt 1 ]; then kill -9 \"$P\"; fi";

/// The startup line names the model, and a one-shot command's `setsid`
/// double fork is in the command's own group (its host `/proc/PID/cgroup`
/// says so) and ends with the command's end, even after the command
/// killed what would hold it without a cgroup: only the group proves
/// that. The sandbox's delete removes its groups.
#[tokio::test(flavor = "multi_thread")]
async fn a_delegated_v2_group_holds_each_command_and_proves_its_end() {
    let Some((engine, group)) = engine_in_delegated_group("v2-tree") else {
        return;
    };
    let m = marker("v2tree");
    let sb = engine.sandbox().await;
    // A managed process (it keeps its tree) started in the background by
    // a double fork in a new session.
    let pid = engine
        .spawn(
            &sb,
            &format!(
                "export TEST_MARKER={m}; setsid bash -c '(exec -a v2-background sleep 3001 &)'; \
                 {KILL_THE_HOLDER}; exec -a v2-command sleep 3002"
            ),
        )
        .await;
    eventually("the background process and the command run", || {
        !marked_running(&m, "v2-background").is_empty()
            && !marked_running(&m, "v2-command").is_empty()
    })
    .await;
    let background = marked_running(&m, "v2-background")[0];
    let held_in = v2_group_of(background).expect("the background process's cgroup");
    let delegated = format!(
        "/{}",
        group
            .dir
            .strip_prefix(cgroup2_mount())
            .expect("under the mount")
            .display()
    );
    assert!(
        held_in.starts_with(&format!("{delegated}/")) && held_in != delegated,
        "the double-forked process is in a group below the delegated {delegated}: {held_in}"
    );
    assert!(
        !group.groups_named(&sb).is_empty(),
        "the sandbox has a group of its own under {delegated}: {:?}",
        group.groups()
    );
    let v = engine.delete_process(&sb, &pid, 100).await;
    assert_eq!(
        v["tree_exited"], true,
        "the command's group proves its end: {v}"
    );
    assert!(
        common::marked_pids(&m).is_empty(),
        "nothing of the command is left: {:?}",
        common::marked_pids(&m)
    );
    // A one-shot command: what it leaves behind ends with it.
    let (st, v) = engine
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{sb}/exec"),
            Some(json!({"cmd": "/bin/bash", "args": ["-c", format!(
                "export TEST_MARKER={m}; setsid bash -c '(exec -a v2-left sleep 3003 &)'; \
                 {KILL_THE_HOLDER}; echo started"
            )]})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"]["result"]["stdout"], "started\n", "{v}");
    assert!(
        common::marked_pids(&m).is_empty(),
        "the one-shot command's double fork ended with it: {:?}",
        common::marked_pids(&m)
    );
    engine.delete_sandbox(&sb).await;
    eventually("the sandbox's groups are removed", || {
        group.groups_named(&sb).is_empty()
    })
    .await;
    let stderr = engine.stop_clean();
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.contains("cgroup v2 delegated") && first.contains(&delegated),
        "the startup line names the delegated cgroup v2 group {delegated}: {first}"
    );
}

/// A sandbox process that kills its command's parent (the anchor, where
/// the tree has one) still leaves a proven end: `tree_exited: true`, and
/// nothing of the command left.
#[tokio::test(flavor = "multi_thread")]
async fn killing_the_holder_still_gives_a_proven_end() {
    let Some((engine, _group)) = engine_in_delegated_group("v2-holder") else {
        return;
    };
    let m = marker("v2holder");
    let sb = engine.sandbox().await;
    let pid = engine
        .spawn(
            &sb,
            &format!("export TEST_MARKER={m}; (sleep 3011 &); {KILL_THE_HOLDER}; sleep 3012"),
        )
        .await;
    eventually("the marked sleeps run", || {
        common::marked_pids(&m).len() >= 2
    })
    .await;
    let v = engine.delete_process(&sb, &pid, 100).await;
    assert_eq!(v["tree_exited"], true, "a proven end: {v}");
    assert!(
        common::marked_pids(&m).is_empty(),
        "tree_exited true and nothing left: {:?}",
        common::marked_pids(&m)
    );
    engine.delete_sandbox(&sb).await;
    engine.stop_clean();
}

/// Whether `cgroup.events` of the group at `dir` says `frozen 1`.
fn frozen(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .is_ok_and(|e| e.lines().any(|l| l == "frozen 1"))
}

/// A pause freezes the sandbox's groups (the kernel's `cgroup.freeze`:
/// `frozen 1` in `cgroup.events`), a resume thaws them, and the processes
/// run on.
#[tokio::test(flavor = "multi_thread")]
async fn pause_freezes_the_sandboxs_groups() {
    let Some((engine, group)) = engine_in_delegated_group("v2-pause") else {
        return;
    };
    let m = marker("v2pause");
    let sb = engine.sandbox().await;
    let _pid = engine
        .spawn(
            &sb,
            &format!("export TEST_MARKER={m}; setsid bash -c '(sleep 3021 &)'; sleep 3022"),
        )
        .await;
    eventually("the marked sleeps run", || {
        common::marked_pids(&m).len() >= 2
    })
    .await;
    let held: Vec<PathBuf> = common::marked_pids(&m)
        .into_iter()
        .filter_map(v2_group_of)
        .map(|g| cgroup2_mount().join(g.trim_start_matches('/')))
        .collect();
    assert!(
        held.iter().all(|g| g.starts_with(&group.dir)),
        "the sandbox's processes are in the delegated group: {held:?}"
    );
    let wait_status = |want: &'static str| {
        let engine = &engine;
        let sb = sb.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let (_, v): (u16, Value) = engine
                    .call(Method::GET, &format!("/v1/sandboxes/{sb}"), None)
                    .await;
                if v["data"]["status"] == want {
                    return;
                }
                assert!(Instant::now() < deadline, "never {want}: {v}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let (st, v) = engine
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{sb}/pause"),
            Some(json!({})),
        )
        .await;
    assert!(st < 300, "{v}");
    wait_status("paused").await;
    for g in &held {
        assert!(frozen(g), "{} is frozen once paused", g.display());
    }
    let (st, v) = engine
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{sb}/resume"),
            Some(json!({})),
        )
        .await;
    assert!(st < 300, "{v}");
    wait_status("running").await;
    for g in &held {
        assert!(!frozen(g), "{} is thawed once resumed", g.display());
    }
    engine.delete_sandbox(&sb).await;
    assert!(common::marked_pids(&m).is_empty());
    eventually("the sandbox's groups are removed", || {
        group.groups_named(&sb).is_empty()
    })
    .await;
    engine.stop_clean();
}

/// The controllers a sandbox is limited by on cgroup v2.
const LIMITS: [&str; 3] = ["pids", "memory", "cpu"];

/// Where the cgroup2 mount offers `pids`, `memory` and `cpu` (a pure
/// cgroup v2 host, such as CI's KVM guest), each sandbox is limited by
/// them: the startup line says so, a fork bomb stops at 2048 tasks, a
/// command using more memory than the sandbox's limit is killed inside
/// the sandbox and told why, and the sandbox goes on. This CI machine's
/// cgroup2 mount offers none of them (they are all on v1): skipped here,
/// and listed as such.
#[tokio::test(flavor = "multi_thread")]
async fn limits_are_enforced_where_the_delegated_group_offers_them() {
    if !rustix::process::geteuid().is_root() {
        test_support::skipped("machine_cgroup_v2: needs root to delegate a cgroup");
        return;
    }
    let mount = cgroup2_mount();
    let offered = std::fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
    if !LIMITS
        .iter()
        .all(|c| offered.split_whitespace().any(|o| o == *c))
    {
        test_support::skipped(&format!(
            "the cgroup2 mount {} offers no pids, memory and cpu controllers ({offered:?}): \
             limits on cgroup v2 cannot be shown on this host",
            mount.display()
        ));
        return;
    }
    // The delegated group gets them, as systemd's Delegate=yes gives them.
    for c in LIMITS {
        std::fs::write(mount.join("cgroup.subtree_control"), format!("+{c}"))
            .unwrap_or_else(|e| panic!("enabling {c} below {}: {e}", mount.display()));
    }
    let Some((engine, group)) =
        engine_in_delegated_group_with("v2-limits", &["--sandbox-memory", "256M"])
    else {
        return;
    };
    let sb = engine.sandbox().await;
    // The first command makes the sandbox's group.
    let (st, v) = engine
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{sb}/exec"),
            Some(json!({"cmd": "true"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let sandbox_group = group
        .groups_named(&sb)
        .into_iter()
        .find(|g| {
            g.rsplit('/')
                .next()
                .is_some_and(|n| n.starts_with("sandbox-"))
        })
        .map(|g| group.dir.join(g))
        .expect("the sandbox's group");
    let read = |file: &str| {
        std::fs::read_to_string(sandbox_group.join(file))
            .unwrap_or_else(|e| panic!("{file} of {}: {e}", sandbox_group.display()))
    };
    assert_eq!(read("pids.max").trim(), "2048");
    assert_eq!(read("memory.max").trim(), (256u64 << 20).to_string());
    assert!(
        read("cpu.max").trim().ends_with(" 100000"),
        "{}",
        read("cpu.max")
    );
    // A fork bomb stops at the sandbox's task limit. Threads are tasks
    // too, and cost next to no memory: forked processes would meet the
    // 256 MiB limit long before 2048 tasks.
    let m = marker("v2limits");
    let (st, v) = engine
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{sb}/exec"),
            Some(json!({"cmd": "/bin/bash", "args": ["-c", format!(
                "export TEST_MARKER={m}; python3 -c '
import threading
threading.stack_size(65536)
done = threading.Event()
n = 0
while n < 5000:
    try:
        threading.Thread(target=done.wait, daemon=True).start()
    except RuntimeError:
        break
    n += 1
print(n, flush=True)
'"
            )]})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let forked: u64 = v["data"]["result"]["stdout"]
        .as_str()
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("the fork count: {v}"));
    assert!(
        forked < 2048,
        "the sandbox's pids.max stopped the fork bomb ({forked} tasks)"
    );
    // More memory than the limit: killed inside the sandbox, and said so.
    let (st, v) = engine
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{sb}/exec"),
            Some(json!({"cmd": "python3", "args": ["-c", "b = b'x' * (1 << 30); print('used', len(b))"]})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let r = &v["data"]["result"];
    assert_eq!(r["stdout"], "", "{r}");
    assert!(
        r["signal"] == "SIGKILL" || r["exit_code"] == 137,
        "not killed by SIGKILL: {r}"
    );
    assert!(
        r["stderr"]
            .as_str()
            .unwrap_or_default()
            .contains("the sandbox reached its memory limit (256 MiB)"),
        "{r}"
    );
    // Within the limit the sandbox goes on.
    let (st, v) = engine
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{sb}/exec"),
            Some(json!({"cmd": "python3", "args": ["-c", "b = b'x' * (64 << 20); print('used', len(b))"]})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"]["result"]["stdout"], "used 67108864\n", "{v}");
    engine.delete_sandbox(&sb).await;
    let stderr = engine.stop_clean();
    let first = stderr.lines().next().unwrap_or_default();
    for enforced in [
        "pids.max 2048 tasks per sandbox, and RLIMIT_NPROC (enforced)",
        "memory.max 256 MiB per sandbox, no swap (enforced)",
        "CPU(s) per sandbox (enforced)",
    ] {
        assert!(
            first.contains(enforced),
            "the startup line says {enforced:?}: {first}"
        );
    }
}
