//! Issue 37 items 3 and 8: on a pure cgroup v2 host, an engine run by an
//! ordinary user in a group delegated to it (as `systemd-run --user
//! --scope -p Delegate=yes` gives one) bounds each sandbox with the
//! kernel's `pids.max`, `memory.max` and `cpu.max`: a fork bomb stops at
//! its sandbox's limit while another sandbox still forks, a memory hog is
//! killed inside its sandbox only while another sandbox's memory and the
//! engine live on, and a busy sandbox gets no more CPU than its `cpu.max`
//! (measured as a ratio of CPU time to wall time, never a timed
//! assertion).
//!
//! The engine here is in-process: this test binary is the engine, started
//! in its delegated group by `.ci/guest-v2/init.sh` inside a guest whose
//! controllers are all on cgroup v2 (this CI machine keeps them on v1,
//! where these limits cannot be seen). Elsewhere the tests are skipped,
//! and say so, unless this process's own cgroup v2 group offers the pids,
//! memory and cpu controllers and is ours to write. In the guest
//! (`SANDBOX_EXPECT_CGROUP_V2_LIMITS=1`) a host that cannot show them
//! fails the tests.
//!
//! Before the cgroup v2 backend the engine took the subreaper anchor in
//! such a group ("no cgroup this server can write"): memory was not
//! limited at all, and no sandbox had a `pids.max` or `cpu.max`.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{marker, Harness};
use reqwest::StatusCode;
use sandbox_engine::{IsolationMode, IsolationPreference, Server};

/// The memory limit given to the engine (`--sandbox-memory`).
const MEMORY_LIMIT: u64 = 256 << 20;

/// A line on the test's real stderr (libtest shows `eprintln!` only for
/// failing tests): the measurements are shown in CI whatever the result.
fn show(line: String) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// One test at a time: a fork bomb or a memory hog in one test would
/// disturb another's measurement.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `statfs` magic of a cgroup2 file system.
const CGROUP2_MAGIC: i64 = 0x6367_7270;

/// The cgroup2 mount: `/sys/fs/cgroup` on a pure v2 host, else the hybrid
/// layout's `/sys/fs/cgroup/unified`.
fn cgroup2_mount() -> Option<PathBuf> {
    // `f_type` is `i64` here, another integer type on other targets.
    #[allow(clippy::unnecessary_cast)]
    let is_cgroup2 =
        |dir: &PathBuf| rustix::fs::statfs(dir).is_ok_and(|s| s.f_type as i64 == CGROUP2_MAGIC);
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(PathBuf::from)
        .find(is_cgroup2)
}

/// The cgroup v2 group of process `pid` (`self` for this one), as a path
/// under the mount.
fn v2_group_of(pid: &str) -> Option<PathBuf> {
    let mount = cgroup2_mount()?;
    let line = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = line.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(rel.trim_start_matches('/')))
}

/// The group delegated to this run: the one this process started in (a
/// scope such as `systemd-run --user --scope -p Delegate=yes` gives),
/// read before any engine of this process moved it deeper. Every test
/// asks it first, one at a time ([`ONE_AT_A_TIME`]), so the first ask is
/// before the first engine.
fn delegated_group() -> Option<PathBuf> {
    static STARTED_IN: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    STARTED_IN
        .get_or_init(|| {
            use std::os::unix::fs::MetadataExt;
            let me = rustix::process::geteuid().as_raw();
            v2_group_of("self").filter(|g| std::fs::metadata(g).is_ok_and(|m| m.uid() == me))
        })
        .clone()
}

/// Whether these tests can show the limits here; `false` (and the skip is
/// recorded) where they cannot and are not expected to. Panics where they
/// are expected (in the guest) and cannot.
fn limits_here(test: &str) -> bool {
    let expected = std::env::var_os("SANDBOX_EXPECT_CGROUP_V2_LIMITS").is_some();
    let offered = delegated_group().map(|g| {
        let controllers = std::fs::read_to_string(g.join("cgroup.controllers")).unwrap_or_default();
        let words: Vec<&str> = controllers.split_whitespace().collect();
        (g, ["pids", "memory", "cpu"].map(|c| words.contains(&c)))
    });
    match offered {
        Some((_, [true, true, true])) => true,
        _ if !expected => {
            test_support::skipped(&format!(
                "{test}: no cgroup v2 group delegated to this user with the pids, memory and \
                 cpu controllers (.ci/guest-v2.sh runs this suite in a guest that has one)"
            ));
            false
        }
        None => panic!(
            "{test}: this process did not start in a cgroup v2 group its user owns, so the \
             limits cannot be shown (the guest's init must start it in a delegated scope)"
        ),
        Some((g, present)) => panic!(
            "{test}: the delegated group {} offers pids, memory, cpu: {present:?}; all three \
             are needed to show the limits",
            g.display()
        ),
    }
}

/// The engine, in-process, in this process's delegated group, which it
/// must name as its tree proof.
async fn engine(memory: Option<u64>) -> Harness {
    let mut builder = Server::builder().isolation(IsolationPreference::RequireBwrap);
    if let Some(bytes) = memory {
        builder = builder.sandbox_memory(bytes);
    }
    let h = Harness::start_builder(builder).await;
    assert_eq!(*h.server.isolation(), IsolationMode::Bwrap);
    let model = sandbox_engine::machine::describe_model();
    let limits = sandbox_engine::trees::process_limits::describe();
    show(format!("model exercised: {model}; limits: {limits}"));
    assert!(
        model.contains("cgroup v2"),
        "the engine in a delegated cgroup v2 group uses it as its tree proof: {model}"
    );
    h
}

/// The groups from `pid`'s own up to the delegated group, innermost first.
fn groups_above(pid: i32) -> Vec<PathBuf> {
    let top = delegated_group().expect("the delegated group");
    let mut group = v2_group_of(&pid.to_string())
        .unwrap_or_else(|| panic!("process {pid} has no cgroup v2 group"));
    let mut chain = Vec::new();
    while group.starts_with(&top) {
        chain.push(group.clone());
        if group == top {
            break;
        }
        group = group.parent().expect("a parent").to_path_buf();
    }
    chain
}

/// The nearest of `groups` whose `file` holds a limit (not `max`), with
/// that limit's text.
fn limiting(groups: &[PathBuf], file: &str) -> Option<(PathBuf, String)> {
    groups.iter().find_map(|g| {
        let text = std::fs::read_to_string(g.join(file)).ok()?;
        let text = text.trim();
        (!text.starts_with("max")).then(|| (g.clone(), text.to_string()))
    })
}

/// The number after `key` in a flat keyed file (`pids.events`,
/// `memory.events`, `cpu.stat`).
fn keyed(file: &Path, key: &str) -> u64 {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

/// A fork bomb (every child forks again until the kernel refuses) stops
/// at its sandbox's `pids.max`: the sandbox's group has one, and the
/// bomb settles at no more tasks than it (the kernel's `pids.current`;
/// `pids.events` counts the forks pids.max refused); meanwhile another
/// sandbox still forks, the engine still answers and forks, and the
/// sandbox's delete ends the whole bomb.
#[tokio::test(flavor = "multi_thread")]
async fn a_fork_bomb_stops_at_its_sandboxs_pids_max() {
    let _one = ONE_AT_A_TIME.lock().await;
    if !limits_here("a_fork_bomb_stops_at_its_sandboxs_pids_max") {
        return;
    }
    let h = engine(None).await;
    let bombed = h.sandbox().await;
    let other = h.sandbox().await;
    // The sandbox's pids limit, from a process of it: a scan of `/proc`
    // through thousands of processes is slow, so the bomb is watched in
    // the kernel's own count (`pids.current`).
    let m = marker("v2bomb");
    let probe = h
        .spawn(&bombed, &format!("export TEST_MARKER={m}; exec sleep 600"))
        .await;
    let probe_pid = common::wait_marked(&m, 1).await;
    assert_eq!(probe_pid.len(), 1, "a probe runs in the sandbox");
    let groups = groups_above(probe_pid[0]);
    let (group, max) = limiting(&groups, "pids.max")
        .unwrap_or_else(|| panic!("no group of the sandbox has a pids.max (groups {groups:?})"));
    let max: u64 = max.parse().expect("pids.max is a number");
    let current = || -> u64 {
        std::fs::read_to_string(group.join("pids.current"))
            .ok()
            .and_then(|c| c.trim().parse().ok())
            .unwrap_or(0)
    };
    // Each shell (dash: small) starts two shells that do the same and
    // becomes a sleep; a shell whose fork is refused ends. So the bomb
    // grows until the kernel refuses, then settles.
    let _bomb = h
        .spawn(
            &bombed,
            &format!(
                "export TEST_MARKER={m}; exec /bin/sh -c 'f() {{ f & f & exec sleep 600; }}; f'"
            ),
        )
        .await;
    // Settled: the kernel's count unchanged for 3 s.
    let deadline = Instant::now() + Duration::from_secs(180);
    let (mut last, mut same) = (0, 0);
    let held = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = current();
        same = if now == last { same + 1 } else { 0 };
        last = now;
        if same >= 3 && now * 2 >= max {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the bomb did not settle near the sandbox's pids.max: pids.current {now} of {max}"
        );
    };
    // The launcher also sets RLIMIT_NPROC to the same number, so either
    // may be the one that refuses the last forks; `pids.events` says
    // whether pids.max was.
    let refused = keyed(&group.join("pids.events"), "max");
    show(format!(
        "fork bomb: settled at pids.current {held} of pids.max {max} in {}; forks refused by \
         pids.max: {refused} (RLIMIT_NPROC, set to the same number, may refuse first)",
        group.display()
    ));
    assert!(held <= max, "{held} tasks above pids.max {max}");
    let r = h
        .exec(&other, "for i in 1 2 3; do /bin/true; done; echo forked")
        .await;
    assert_eq!(
        r["stdout"], "forked\n",
        "another sandbox forks while the bomb holds {held}: {r}"
    );
    let engine_forks = std::process::Command::new("/bin/true").status();
    assert!(
        engine_forks.as_ref().is_ok_and(|s| s.success()),
        "the engine's own process can still fork: {engine_forks:?}"
    );
    let (st, v) = h.delete_process(&bombed, &probe, 100).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    for sb in [&bombed, &other] {
        let (st, v) = h.delete(&format!("/v1/sandboxes/{sb}")).await;
        assert_eq!(st, StatusCode::OK, "{v}");
    }
    assert!(
        common::marked_pids(&m).is_empty(),
        "the bombed sandbox's delete ends the bomb"
    );
    assert!(h.server.shutdown().await.all_exited());
}

/// A command that uses four times its sandbox's `memory.max` is killed
/// by the kernel inside that sandbox (SIGKILL, the sandbox's
/// `memory.events` counts it, the engine says why), while a process
/// another sandbox holds 64 MiB in lives on and the engine answers; the
/// hog's sandbox goes on within its limit.
#[tokio::test(flavor = "multi_thread")]
async fn a_memory_hog_is_killed_inside_its_sandbox_only() {
    let _one = ONE_AT_A_TIME.lock().await;
    if !limits_here("a_memory_hog_is_killed_inside_its_sandbox_only") {
        return;
    }
    let h = engine(Some(MEMORY_LIMIT)).await;
    let hogging = h.sandbox().await;
    let other = h.sandbox().await;
    let m = marker("v2mem");
    let holder = h
        .spawn(
            &other,
            &format!(
                "export TEST_MARKER={m}; exec python3 -c '
import time
b = bytearray(64 << 20)
for i in range(0, len(b), 4096):
    b[i] = 1
time.sleep(600)
'"
            ),
        )
        .await;
    let held = common::wait_marked(&m, 1).await;
    assert_eq!(held.len(), 1, "the other sandbox's holder runs");
    let hog = marker("v2hog");
    let r = h
        .exec(
            &hogging,
            &format!(
                "export TEST_MARKER={hog}; python3 -c 'b = b\"x\" * (1 << 30); print(\"used\", len(b))'"
            ),
        )
        .await;
    eprintln!("memory hog: {r}");
    assert_eq!(r["stdout"], "", "1 GiB was used under a 256 MiB limit: {r}");
    assert!(
        r["signal"] == "SIGKILL" || r["exit_code"] == 137,
        "the hog was not killed by SIGKILL: {r}"
    );
    let stderr = r["stderr"].as_str().unwrap_or_default();
    assert!(
        stderr.contains("the sandbox reached its memory limit (256 MiB)"),
        "the engine says why the command was killed: {r}"
    );
    // The hog's sandbox's group counted the kill; the other's did not.
    let probe = h
        .spawn(
            &hogging,
            &format!("export TEST_MARKER={hog}; exec sleep 600"),
        )
        .await;
    let hog_pid = common::wait_marked(&hog, 1).await;
    assert_eq!(hog_pid.len(), 1, "a probe runs in the hog's sandbox");
    let hog_groups = groups_above(hog_pid[0]);
    let (group, max) = limiting(&hog_groups, "memory.max").unwrap_or_else(|| {
        panic!("no group of the hog's sandbox has a memory.max: {hog_groups:?}")
    });
    let kills = keyed(&group.join("memory.events"), "oom_kill");
    show(format!(
        "memory hog: memory.max {max} in {}, oom_kill {kills}",
        group.display()
    ));
    assert_eq!(
        max.parse::<u64>().ok(),
        Some(MEMORY_LIMIT),
        "{}",
        group.display()
    );
    assert!(kills >= 1, "the kill is counted in {}", group.display());
    let other_groups = groups_above(held[0]);
    let (other_group, _) = limiting(&other_groups, "memory.max")
        .unwrap_or_else(|| panic!("no group of the other sandbox has a memory.max"));
    assert_ne!(
        other_group, group,
        "each sandbox has a memory group of its own"
    );
    assert_eq!(
        keyed(&other_group.join("memory.events"), "oom_kill"),
        0,
        "nothing was killed in the other sandbox"
    );
    assert_eq!(
        common::marked_pids(&m),
        held,
        "the other sandbox's 64 MiB holder lives on"
    );
    let r = h
        .exec(
            &hogging,
            "python3 -c 'b = b\"x\" * (64 << 20); print(\"used\", len(b))'",
        )
        .await;
    assert_eq!(
        r["stdout"], "used 67108864\n",
        "within the limit the sandbox goes on: {r}"
    );
    let (st, v) = h.delete_process(&hogging, &probe, 100).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (st, v) = h.delete_process(&other, &holder, 100).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    for sb in [&hogging, &other] {
        let (st, v) = h.delete(&format!("/v1/sandboxes/{sb}")).await;
        assert_eq!(st, StatusCode::OK, "{v}");
    }
    assert!(h.server.shutdown().await.all_exited());
}

/// A sandbox that keeps every CPU busy gets no more CPU than its
/// `cpu.max` allows: measured inside it as CPU seconds per wall second
/// over a few seconds (a ratio, whatever the machine's speed), against
/// the quota its group has, with the kernel's throttling counted in
/// `cpu.stat`.
#[tokio::test(flavor = "multi_thread")]
async fn a_busy_sandbox_gets_no_more_cpu_than_its_cpu_max() {
    let _one = ONE_AT_A_TIME.lock().await;
    if !limits_here("a_busy_sandbox_gets_no_more_cpu_than_its_cpu_max") {
        return;
    }
    let h = engine(None).await;
    let sb = h.sandbox().await;
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let m = marker("v2cpu");
    let probe = h
        .spawn(&sb, &format!("export TEST_MARKER={m}; exec sleep 600"))
        .await;
    let pid = common::wait_marked(&m, 1).await;
    assert_eq!(pid.len(), 1, "a probe runs in the sandbox");
    let groups = groups_above(pid[0]);
    let (group, max) = limiting(&groups, "cpu.max")
        .unwrap_or_else(|| panic!("no group of the sandbox has a cpu.max: {groups:?}"));
    let (quota, period) = max
        .split_once(' ')
        .and_then(|(q, p)| Some((q.parse::<f64>().ok()?, p.parse::<f64>().ok()?)))
        .unwrap_or_else(|| panic!("cpu.max {max:?} is not QUOTA PERIOD"));
    let allowed = quota / period;
    assert!(
        allowed < cpus as f64,
        "the sandbox's cpu.max ({max}: {allowed:.2} CPUs) is not below this machine's {cpus} \
         CPUs, so its throttling cannot be seen"
    );
    let throttled_before = keyed(&group.join("cpu.stat"), "nr_throttled");
    // One busy worker per CPU for 4 s of wall time; the ratio is the CPU
    // time they got over the wall time they ran.
    let r = h
        .exec(
            &sb,
            &format!(
                "python3 -c '
import os, time
start = time.monotonic()
kids = []
for _ in range({cpus}):
    pid = os.fork()
    if pid == 0:
        end = time.monotonic() + 4
        while time.monotonic() < end:
            pass
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
wall = time.monotonic() - start
t = os.times()
print(\"%.3f\" % ((t.children_user + t.children_system) / wall))
'"
            ),
        )
        .await;
    let used: f64 = r["stdout"]
        .as_str()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("the busy workers reported no ratio: {r}"));
    let throttled = keyed(&group.join("cpu.stat"), "nr_throttled") - throttled_before;
    show(format!(
        "cpu: {cpus} busy workers got {used:.3} CPUs (CPU time / wall time); cpu.max {max} \
         allows {allowed:.3} ({:.2}x of it used); throttled {throttled} times in {}",
        used / allowed,
        group.display()
    ));
    assert!(
        used <= allowed * 1.25 + 0.05,
        "the sandbox used {used:.3} CPUs, above its cpu.max's {allowed:.3}"
    );
    assert!(
        throttled > 0,
        "the kernel never throttled the sandbox's group"
    );
    let (st, v) = h.delete_process(&sb, &probe, 100).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (st, v) = h.delete(&format!("/v1/sandboxes/{sb}")).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert!(h.server.shutdown().await.all_exited());
}
