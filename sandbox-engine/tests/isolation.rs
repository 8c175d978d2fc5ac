//! What a sandboxed command cannot do, proven with real processes and real
//! bubblewrap: each test runs a command that tries to break out and checks
//! from the host that it failed. Also: descriptor hygiene (issue 19 item 1),
//! the delete-versus-create race (issue 10 item 4, issue 19 item 8), and no
//! survivor after a SIGKILL of the server (issue 10 item 3).

mod common;

use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{marked_pids, marker, wait_marked, Harness, KEY};
use reqwest::StatusCode;
use sandbox_engine::{IsolationMode, IsolationPreference};
use serde_json::{json, Value};

/// A `createos-local` binary started with three extra descriptors open
/// without close-on-exec (a directory, a file, a socket), as an
/// orchestrator might leave them.
struct Backend {
    child: Child,
    base: String,
    http: reqwest::Client,
}

/// The descriptor numbers the backend inherits beyond stdio.
const LEAKED_FDS: [i32; 3] = [40, 41, 42];

impl Backend {
    fn start(isolation: &str) -> Self {
        Self::start_with(isolation, &[], &[])
    }

    /// Like [`Backend::start`], with extra arguments and environment.
    fn start_with(isolation: &str, args: &[&str], env: &[(&str, &std::path::Path)]) -> Self {
        let dir: OwnedFd = std::fs::File::open("/").expect("open /").into();
        let file: OwnedFd = std::fs::File::open("/etc/hostname")
            .or_else(|_| std::fs::File::open("/etc/passwd"))
            .expect("open a host file")
            .into();
        let (sock, _peer) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        let sock: OwnedFd = sock.into();
        let raw = [dir.as_raw_fd(), file.as_raw_fd(), sock.as_raw_fd()];
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_createos-local"));
        cmd.args(["--port", "0", "--isolation", isolation])
            .args(args)
            .envs(env.iter().copied())
            .env("CREATEOS_API_KEY", KEY)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // SAFETY: only dup2 (async-signal-safe) on descriptors this process
        // owns; the copies are not close-on-exec, so the backend inherits
        // them like descriptors an orchestrator leaves open.
        unsafe {
            cmd.pre_exec(move || {
                for (from, to) in raw.iter().zip(LEAKED_FDS) {
                    let mut target = OwnedFd::from_raw_fd(to);
                    let r =
                        rustix::io::dup2(std::os::fd::BorrowedFd::borrow_raw(*from), &mut target);
                    std::mem::forget(target);
                    r?;
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn createos-local");
        drop((dir, file, sock));
        let (base, _) = test_support::local::listening(&mut child);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client");
        Self { child, base, http }
    }

    async fn req(&self, method: reqwest::Method, path: &str, body: Value) -> (StatusCode, Value) {
        let resp = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("X-Api-Key", KEY)
            .json(&body)
            .send()
            .await
            .expect("request");
        let st = resp.status();
        (st, resp.json().await.unwrap_or(Value::Null))
    }

    async fn sandbox(&self, env: Value) -> String {
        let (st, v) = self
            .req(
                reqwest::Method::POST,
                "/v1/sandboxes",
                json!({"shape": "s-1vcpu-1gb", "ingress_enabled": false, "env": env}),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        let id = v["data"]["id"].as_str().expect("id").to_string();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, v) = self
                .req(
                    reqwest::Method::GET,
                    &format!("/v1/sandboxes/{id}"),
                    json!({}),
                )
                .await;
            if v["data"]["status"] == "running" {
                return id;
            }
            assert!(Instant::now() < deadline, "never running: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn exec(&self, sb: &str, script: &str) -> Value {
        let (st, v) = self
            .req(
                reqwest::Method::POST,
                &format!("/v1/sandboxes/{sb}/exec"),
                json!({"cmd": "/bin/sh", "args": ["-c", script]}),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        v["data"]["result"].clone()
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Issue 19 item 1: descriptors the backend inherits (a directory, a file,
/// a socket) reached every sandboxed command; `/proc/self/fd/N/...` of an
/// inherited `/` was a full host escape. Every command must start with
/// exactly 0, 1 and 2.
async fn inherited_descriptors_never_reach_a_command(isolation: &str) {
    let backend = Backend::start(isolation);
    let sb = backend.sandbox(json!({})).await;
    let r = backend.exec(&sb, "ls -l /proc/$$/fd").await;
    let listing = r["stdout"].as_str().expect("stdout");
    assert_eq!(
        test_support::procs::fd_numbers(listing),
        vec![0, 1, 2],
        "{isolation}: {r}"
    );
    // Nothing reaches the host through a leaked number either.
    let r = backend
        .exec(&sb, "for n in 40 41 42; do cat /proc/self/fd/$n/etc/hostname; done; ls /proc/self/fd/40/ 2>&1 | head -3")
        .await;
    assert!(
        r["stdout"]
            .as_str()
            .expect("stdout")
            .contains("No such file"),
        "{isolation}: {r}"
    );
    // A managed process too (the other spawn path of the API).
    let (st, v) = backend
        .req(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{sb}/processes"),
            json!({"cmd": "/bin/sh", "args": ["-c", "ls -l /proc/$$/fd"]}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let pid = v["data"]["process_id"].as_str().expect("id").to_string();
    let resp = backend
        .http
        .get(format!(
            "{}/v1/sandboxes/{sb}/processes/{pid}/connect?after=0",
            backend.base
        ))
        .header("X-Api-Key", KEY)
        .send()
        .await
        .expect("connect");
    let body = resp.bytes().await.expect("frames");
    let frames: Vec<Value> = body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .filter_map(|l| serde_json::from_slice(l).ok())
        .collect();
    let out = common::stream_bytes(&frames, "stdout", 0);
    let listing = String::from_utf8_lossy(&out);
    assert_eq!(
        test_support::procs::fd_numbers(&listing),
        vec![0, 1, 2],
        "{isolation}: {listing}"
    );
}

#[tokio::test]
async fn inherited_descriptors_never_reach_a_bwrap_command() {
    inherited_descriptors_never_reach_a_command("bwrap").await;
}

#[tokio::test]
async fn inherited_descriptors_never_reach_a_process_group_command() {
    inherited_descriptors_never_reach_a_command("process-group").await;
}

/// Waits (generously) until no process carries `m`; returns what is left.
async fn wait_unmarked(m: &str) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = marked_pids(m);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Issue 10 item 3: when the server is killed with SIGKILL (no cleanup code
/// runs), no sandboxed process survives it: neither a running command nor
/// the background processes of a command that already exited.
async fn sigkill_of_the_server_leaves_no_process(isolation: &str) {
    let mut backend = Backend::start(isolation);
    let m = marker(&format!("kill9-{isolation}"));
    let sb = backend.sandbox(json!({ "TEST_MARKER": m })).await;
    for script in ["sleep 1000 & sleep 1000", "sleep 1000 & exit 0"] {
        let (st, v) = backend
            .req(
                reqwest::Method::POST,
                &format!("/v1/sandboxes/{sb}/processes"),
                json!({"cmd": "/bin/bash", "args": ["-c", script]}),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
    }
    assert!(
        wait_marked(&m, 3).await.len() >= 3,
        "commands did not start"
    );
    let in_memory_etc = format!("createos-local-etc-{}-", backend.child.id());
    let etc_copies = || -> Vec<String> {
        std::fs::read_dir("/dev/shm")
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| n.starts_with(&in_memory_etc))
                    .collect()
            })
            .unwrap_or_default()
    };
    // Issue 24 item 3: the sandboxes' own disks (where the server mounts
    // them) do not outlive it either: unmounted, images removed.
    let data_dir = std::fs::read_dir(std::env::temp_dir())
        .expect("temp dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("createos-local-{}-", backend.child.id())))
        })
        .expect("the server's data dir");
    let disks_of = |dir: &std::path::Path| -> Vec<String> {
        let images = std::fs::read_dir(dir.join(".disks"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let prefix = dir.display().to_string();
        images
            .into_iter()
            .chain(
                mounts
                    .lines()
                    .filter(|l| l.contains(&prefix))
                    .map(str::to_string),
            )
            .collect()
    };
    let had_disks = !disks_of(&data_dir).is_empty();
    backend.child.kill().expect("SIGKILL the server");
    backend.child.wait().expect("reap the server");
    let left = wait_unmarked(&m).await;
    assert!(
        left.is_empty(),
        "{isolation}: survived the server: {left:?}"
    );
    // Issue 11: the sandboxes' in-memory /etc does not outlive it either.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !etc_copies().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(etc_copies(), Vec::<String>::new(), "{isolation}");
    if had_disks {
        while !disks_of(&data_dir).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(disks_of(&data_dir), Vec::<String>::new(), "{isolation}");
    }
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test]
async fn sigkill_of_a_bwrap_server_leaves_no_process() {
    sigkill_of_the_server_leaves_no_process("bwrap").await;
}

#[tokio::test]
async fn sigkill_of_a_process_group_server_leaves_no_process() {
    sigkill_of_the_server_leaves_no_process("process-group").await;
}

/// A harness that insists on bubblewrap (these tests are about it).
async fn confined() -> Harness {
    let h = Harness::start_builder(
        sandbox_engine::Server::builder().isolation(IsolationPreference::RequireBwrap),
    )
    .await;
    assert_eq!(*h.server.isolation(), IsolationMode::Bwrap);
    h
}

/// Issue 10 item 2: a command cannot write the host's `/usr` or the host's
/// `/tmp` (its `/tmp` is its own).
#[tokio::test]
async fn a_command_cannot_write_host_usr_or_host_tmp() {
    let h = confined().await;
    let sb = h.sandbox().await;
    let m = marker("write");
    let host_tmp = std::path::PathBuf::from(format!("/tmp/{m}-host"));
    std::fs::write(&host_tmp, "host").expect("host file");
    let r = h
        .exec(
            &sb,
            &format!(
                "touch /usr/{m}; echo sandbox > /tmp/{m}-host; touch /tmp/{m}-new; cat /tmp/{m}-host"
            ),
        )
        .await;
    assert!(
        !std::path::Path::new(&format!("/usr/{m}")).exists(),
        "wrote host /usr: {r}"
    );
    assert_eq!(std::fs::read_to_string(&host_tmp).expect("read"), "host");
    assert!(
        !std::path::Path::new(&format!("/tmp/{m}-new")).exists(),
        "{r}"
    );
    assert_eq!(r["stdout"], "sandbox\n", "its own /tmp works: {r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap_or("")
            .contains("Read-only file system"),
        "{r}"
    );
    let _ = std::fs::remove_file(&host_tmp);
    assert!(h.server.shutdown().await.all_exited());
}

/// Issue 10 item 2: host secrets are out of reach: `/etc/shadow` (only a
/// minimal `/etc` is there), the home of the user the server runs as
/// (`/root` for root; issue 37: an ordinary user's, whose files the
/// sandbox's root would own), the backend's data directory (other
/// sandboxes' roots), the lease store under the host's home.
#[tokio::test]
async fn a_command_cannot_read_host_secrets() {
    let h = confined().await;
    let sb = h.sandbox().await;
    let other = h.sandbox().await;
    let m = marker("secret");
    let home = host_home();
    let home_secret = std::path::Path::new(&home).join(&m);
    std::fs::write(&home_secret, &m).expect("host secret");
    let data_dir = h.server.data_dir().display().to_string();
    let r = h
        .exec(
            &sb,
            &format!(
                "cat /etc/shadow /etc/gshadow {home}/{m} {data_dir}/{other}/etc/passwd; \
                 ls {home}/.local/share/sandbox; ls {data_dir}; ls /; echo; ls /etc; echo; cat /etc/passwd"
            ),
        )
        .await;
    let _ = std::fs::remove_file(&home_secret);
    let out = r["stdout"].as_str().expect("stdout");
    assert!(!out.contains(&m), "{r}");
    assert!(!out.contains("root:$") && !out.contains("root:*:"), "{r}");
    assert!(!out.contains("shadow"), "no shadow in /etc: {r}");
    assert!(!out.contains(&other), "{r}");
    let passwd: Vec<&str> = out.lines().filter(|l| l.contains(":x:")).collect();
    assert_eq!(passwd.len(), 2, "only root and nobody: {r}");
    let err = r["stderr"].as_str().expect("stderr");
    assert_eq!(err.matches("No such file or directory").count(), 6, "{r}");
    assert!(h.server.shutdown().await.all_exited());
}

/// Issue 41 item 2: the directories of links of `/etc` (`ssl/certs`,
/// `alternatives`) are bound from the host rather than copied: a sandbox
/// sees the host's entries there, resolves through them (`awk` is a link
/// into `alternatives` on Debian), and cannot write there.
#[tokio::test]
async fn a_command_sees_the_hosts_certificates_and_alternatives_read_only() {
    let h = confined().await;
    let sb = h.sandbox().await;
    for dir in sandbox_engine::storage::rootfs::etc_bound_from_host() {
        let d = dir.display();
        let r = h.exec(&sb, &format!("ls -A {d}; touch {d}/x")).await;
        let mut host: Vec<String> = std::fs::read_dir(dir)
            .expect("host dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        host.sort();
        let mut inside: Vec<&str> = r["stdout"].as_str().expect("stdout").lines().collect();
        inside.sort();
        assert_eq!(inside, host, "{d}: {r}");
        assert!(
            r["stderr"]
                .as_str()
                .unwrap_or("")
                .contains("Read-only file system"),
            "{d}: {r}"
        );
    }
    let r = h.exec(&sb, "awk 'BEGIN { print 6 * 7 }'").await;
    assert_eq!(r["stdout"], "42\n", "{r}");
    assert!(h.server.shutdown().await.all_exited());
}

/// The home directory of the user this test (and so the server) runs
/// as: `HOME`, else `/root`.
fn host_home() -> String {
    std::env::var("HOME")
        .ok()
        .filter(|h| h.starts_with('/') && std::path::Path::new(h).is_dir())
        .unwrap_or_else(|| "/root".to_string())
}

/// Issue 10 item 2: no host loopback port is reachable (the backend's own
/// API included): the command has its own network namespace.
#[tokio::test]
async fn a_command_cannot_reach_host_loopback_ports() {
    let h = confined().await;
    let sb = h.sandbox().await;
    let (_, v) = h.get(&format!("/v1/sandboxes/{sb}")).await;
    assert_eq!(v["data"]["local_network"], "none", "{v}");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let api_port = h.server.addr().port();
    let r = h
        .exec(
            &sb,
            &format!(
                "for p in {port} {api_port}; do (echo hi > /dev/tcp/127.0.0.1/$p) && echo reached $p; done; \
                 (echo hi > /dev/tcp/1.1.1.1/53) && echo outbound"
            ),
        )
        .await;
    assert_eq!(r["stdout"], "", "{r}");
    assert!(
        listener.accept().is_err(),
        "a connection reached the host listener"
    );
    assert!(h.server.shutdown().await.all_exited());
}

/// Issue 10 item 2: host processes are invisible and cannot be signalled.
#[tokio::test]
async fn a_command_cannot_see_or_signal_host_processes() {
    let h = confined().await;
    let sb = h.sandbox().await;
    let me = std::process::id();
    let r = h
        .exec(
            &sb,
            &format!("kill -0 {me} && echo signalled; ls /proc | grep -c '^[0-9]'"),
        )
        .await;
    let count: usize = r["stdout"]
        .as_str()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("{r}"));
    // A sandbox machine (issue 25) also holds its init and holder.
    let most = if sandbox_engine::machine::enabled_here() {
        6
    } else {
        4
    };
    assert!(count <= most, "saw {count} processes: {r}");
    assert!(h.server.shutdown().await.all_exited());
}

/// Issue 37 item 2: no sandbox sees, signals or traces another sandbox's
/// processes, root or not (an ordinary user's sandboxes all run as that
/// user's uid where it has no subordinate ids: their PID namespaces keep
/// them apart). A command of one sandbox looks for another sandbox's
/// `sleep` in its `/proc`, signals its host pid, tries `PTRACE_ATTACH`
/// and `PTRACE_SEIZE` on it, and sends SIGSTOP to every process it sees;
/// the `sleep` is still running, untraced, afterwards.
#[tokio::test]
async fn a_sandbox_cannot_see_signal_or_trace_another_sandboxs_processes() {
    let h = confined().await;
    let m = marker("neighbour");
    let victim = h.sandbox_with_env(json!({ "TEST_MARKER": m })).await;
    let am = marker("attacker");
    let attacker = h.sandbox_with_env(json!({ "TEST_MARKER": am })).await;
    h.spawn(&victim, "exec sleep 1000").await;
    let comm = |p: i32| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    let sleeper = loop {
        if let Some(p) = marked_pids(&m).into_iter().find(|p| comm(*p) == "sleep\n") {
            break p;
        }
        assert!(Instant::now() < deadline, "the victim's sleep never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let script = format!(
        "ps -eo args | grep -c '^sleep [1]000'; \
         kill -0 {sleeper} 2>/dev/null && echo signalled-host-pid; \
         python3 -c 'import ctypes; libc = ctypes.CDLL(None, use_errno=True); \
         print(\"attach\", libc.ptrace(16, {sleeper}, 0, 0), \"seize\", libc.ptrace(0x4206, {sleeper}, 0, 0))'"
    );
    let r = h.exec(&attacker, &script).await;
    let out = r["stdout"].as_str().expect("stdout");
    assert!(
        out.starts_with("0\n"),
        "the other sandbox's sleep is visible: {r}"
    );
    assert!(!out.contains("signalled"), "{r}");
    assert!(
        out.contains("attach -1 seize -1"),
        "a ptrace succeeded: {r}"
    );
    // SIGSTOP to every process the attacker sees but its own shell, the
    // process that started it (the anchor, as an ordinary user: stopping
    // it would leave this command's end unknown) and its init: its own
    // sandbox's only.
    let r = h
        .exec(
            &attacker,
            "for p in $(ls /proc | grep -x '[0-9]*'); do case $p in 1|$$|$PPID) ;; \
             *) kill -STOP $p 2>/dev/null && echo stopped;; esac; done; echo done",
        )
        .await;
    assert!(
        r["stdout"].as_str().unwrap_or_default().ends_with("done\n"),
        "{r}"
    );
    let status = std::fs::read_to_string(format!("/proc/{sleeper}/status")).expect("still alive");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(field("TracerPid:"), "0", "{status}");
    assert!(
        field("State:").starts_with('S'),
        "the other sandbox's sleep was stopped: {status}"
    );
    for sb in [&attacker, &victim] {
        let (st, v) = h.delete(&format!("/v1/sandboxes/{sb}")).await;
        assert_eq!(st, StatusCode::OK, "{v}");
    }
    assert!(marked_pids(&m).is_empty() && marked_pids(&am).is_empty());
    assert!(h.server.shutdown().await.all_exited());
}

/// Issue 10 item 2: the command is root only inside its user namespace; on
/// the host it is an unprivileged uid whose few capabilities count only in
/// that namespace (issue 44 item 1).
#[tokio::test]
async fn a_command_is_not_root_on_the_host() {
    let h = confined().await;
    let m = marker("uid");
    let sb = h.sandbox_with_env(json!({ "TEST_MARKER": m })).await;
    let r = h.exec(&sb, "id -u").await;
    assert_eq!(r["stdout"], "0\n", "{r}");
    h.spawn(&sb, "sleep 1000").await;
    // The create answer comes once the namespace exists; bwrap forks the
    // command a moment later (bwrap's own processes carry the marker too).
    let deadline = Instant::now() + Duration::from_secs(30);
    let sleep = loop {
        let pids = marked_pids(&m);
        let found = pids.iter().copied().find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep"))
        });
        if let Some(p) = found {
            break p;
        }
        assert!(Instant::now() < deadline, "no sleep among {pids:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let status = std::fs::read_to_string(format!("/proc/{sleep}/status")).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("{name} in {status}"))
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // The host's root (uid 0 of a user namespace, as under `bwrap
    // --disable-userns`, hands out no ranges).
    if sandbox_engine::trees::id_map::ranges_here() {
        // Every id is the first of the sandbox's own range (uid 0 inside).
        for id in field("Uid:").iter().chain(field("Gid:").iter()) {
            let id: u32 = id.parse().expect("numeric id");
            assert!(
                sandbox_engine::trees::id_map::is_range_start(id),
                "{status}"
            );
        }
    }
    // Only the sandbox root's own capabilities, which count in its user
    // namespace alone (none without a machine).
    let expected = format!("{:016x}", sandbox_engine::machine::capabilities_here());
    assert_eq!(field("CapEff:"), vec![expected], "{status}");
    assert!(h.server.shutdown().await.all_exited());
}

/// Issue 10 item 2: a fork bomb stops at the process limit instead of
/// eating the host (memory: tests/memory.rs).
#[tokio::test]
async fn fork_bombs_are_bounded() {
    let h = confined().await;
    let sb = h.sandbox().await;
    let (_, v) = h.get(&format!("/v1/sandboxes/{sb}")).await;
    assert_eq!(v["data"]["local_limits"], "prlimit", "{v}");
    // Processes are limited; the address space is not (memory is bounded
    // by what a sandbox uses, tests/memory.rs).
    let r = h.exec(&sb, "ulimit -u; ulimit -v").await;
    assert_eq!(
        r["stdout"],
        format!(
            "{}\nunlimited\n",
            sandbox_engine::trees::process_limits::MAX_PROCESSES
        ),
        "{r}"
    );
    // dash gives up at the first failed fork (bash would retry).
    let bomb = format!(
        "i=0; while [ $i -lt {} ]; do sleep 1000 & i=$((i+1)); done; echo all started",
        sandbox_engine::trees::process_limits::MAX_PROCESSES + 100
    );
    let (st, v) = h
        .post(
            &format!("/v1/sandboxes/{sb}/exec"),
            json!({"cmd": "/bin/sh", "args": ["-c", bomb]}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let r = &v["data"]["result"];
    assert_eq!(r["stdout"], "", "{r}");
    assert!(r["stderr"].as_str().unwrap_or("").contains("fork"), "{r}");
    assert!(h.server.shutdown().await.all_exited());
}

/// Issue 40 item 2 (memory): when the host runs out of memory, the OOM
/// killer takes a sandbox's processes (its commands, what they left in the
/// background, the machine holding them) before the server, whose proofs
/// must outlive them. The server (this test process) keeps its own score.
#[tokio::test]
async fn sandbox_processes_are_the_oom_killers_first_choice() {
    let h = confined().await;
    let sb = h.sandbox().await;
    let own = std::fs::read_to_string("/proc/self/oom_score_adj").unwrap();
    assert_ne!(own.trim(), "1000", "the server keeps its own score");
    // The command, a process it put in the background, and the machine's
    // init (the bwrap that holds the sandbox's namespaces).
    let r = h
        .exec(
            &sb,
            "sleep 613 & cat /proc/self/oom_score_adj /proc/$!/oom_score_adj /proc/1/oom_score_adj",
        )
        .await;
    assert_eq!(r["stdout"], "1000\n1000\n1000\n", "{r}");
    assert!(h.server.shutdown().await.all_exited());
}

/// Issue 10 item 2 ("keep what agents need") and issue 11: a writable
/// workspace and `$HOME`, `/usr` tools, `bash -lc` with the sandbox's own
/// profile (not the host's login scripts), and files written through the
/// Files API stay writable for the command.
#[tokio::test]
async fn agents_keep_a_working_shell_home_and_workspace() {
    let h = confined().await;
    let sb = h.sandbox().await;
    let (st, v) = h
        .req(
            reqwest::Method::PUT,
            &format!("/v1/sandboxes/{sb}/files?path=/paperclip-workspace/sub/a.txt"),
            None,
        )
        .await;
    assert!(st.is_success(), "{v}");
    let r = h
        .exec(
            &sb,
            "bash -lc 'cd ~ && echo home > h && cat h && echo w >> /paperclip-workspace/sub/a.txt \
             && touch /paperclip-workspace/sub/b && awk \"BEGIN{print 42}\" && head -2 /etc/profile \
             && echo \"$HOME\" && ls /usr/bin/env'",
        )
        .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let out = r["stdout"].as_str().expect("stdout");
    assert!(out.starts_with("home\n42\n"), "{r}");
    assert!(
        out.contains("createos-local"),
        "the sandbox's own profile: {r}"
    );
    assert!(out.contains("/root\n/usr/bin/env\n"), "{r}");
    assert!(h.server.shutdown().await.all_exited());
}

/// Issue 11 item 2: a sandbox's login shell reads the sandbox's own
/// minimal profile and `$HOME`, nothing of the host's. The backend runs
/// with a host `$HOME` whose login and rc files all export a marker;
/// `bash -lx` traces every command its start-up files run, so the trace
/// shows exactly which profile ran. (This held already since issue 10's
/// own `/etc`; the test pins it.)
#[tokio::test]
async fn a_login_shell_reads_only_the_sandbox_profile_and_home() {
    let m = marker("profile");
    let host_home = std::env::temp_dir().join(format!("{m}-home"));
    let data_dir = std::env::temp_dir().join(format!("{m}-data"));
    std::fs::create_dir_all(&host_home).expect("host home");
    for file in [".bashrc", ".profile", ".bash_profile", ".bash_login"] {
        std::fs::write(
            host_home.join(file),
            format!("export HOST_PROFILE_MARKER={file}\n"),
        )
        .expect("host profile file");
    }
    let backend = Backend::start_with(
        "bwrap",
        &["--data-dir", data_dir.to_str().expect("utf8 path")],
        &[
            ("HOME", &host_home),
            ("BASH_ENV", &host_home.join(".bashrc")),
        ],
    );
    let sb = backend.sandbox(json!({})).await;
    let r = backend
        .exec(&sb, "bash -lxc env && echo probe > ~/home-probe")
        .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let env = r["stdout"].as_str().expect("stdout");
    assert!(!env.contains("HOST_PROFILE_MARKER"), "{r}");
    assert!(env.lines().any(|l| l == "HOME=/root"), "{r}");
    // Only the sandbox's own /etc/profile ran (`umask 022`), then the command.
    let trace: Vec<&str> = r["stderr"]
        .as_str()
        .expect("stderr")
        .lines()
        .filter(|l| l.starts_with('+'))
        .collect();
    assert_eq!(trace, ["+ umask 022", "+ env"], "{r}");
    // `$HOME` is the sandbox's own directory, not the host's.
    let probe = data_dir.join(&sb).join("root/home-probe");
    assert_eq!(
        std::fs::read_to_string(&probe).ok().as_deref(),
        Some("probe\n")
    );
    assert!(!host_home.join("home-probe").exists());
    drop(backend);
    let _ = std::fs::remove_dir_all(&host_home);
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// Issue 11 item 1: `POST /processes` waited for the command to appear
/// under bwrap's init by scanning `/proc` every 10 ms (up to 200 ms, and
/// the whole 200 ms for a command that exits at once), only to report the
/// command's host pid. The answer now comes as soon as bwrap reports the
/// namespace, and `pid` is the host pid of that process's namespace init
/// (its PID 1): known at once, stable for the tree's whole life, and the
/// process the tree's identity rests on.
#[tokio::test]
async fn the_pid_of_a_process_is_its_namespace_init() {
    let h = confined().await;
    let m = marker("pid");
    let sb = h.sandbox_with_env(json!({ "TEST_MARKER": m })).await;
    let (st, v) = h
        .post(
            &format!("/v1/sandboxes/{sb}/processes"),
            json!({"cmd": "sleep", "args": ["600"]}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let id = v["data"]["process_id"].as_str().expect("id").to_string();
    let pid = v["data"]["pid"].as_i64().expect("pid");
    if sandbox_engine::machine::enabled_here() {
        // In a sandbox machine (issue 25) the pid is the command's
        // launcher on the host; its tree is its pids group (tests/machine.rs).
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).expect("comm");
        assert_eq!(
            comm.trim_end(),
            sandbox_engine::machine::join::LAUNCHER_NAME
        );
        let (st, v) = h.delete_process(&sb, &id, 100).await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(v["data"]["tree_exited"], true, "{v}");
        assert!(marked_pids(&m).is_empty());
        assert!(h.server.shutdown().await.all_exited());
        return;
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("init status");
    let nspid = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .expect("NSpid line");
    assert_eq!(nspid.split_whitespace().last(), Some("1"), "{status}");
    // The command runs in that namespace, as the init's child.
    let comm = |p: i32| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    let sleeper = loop {
        // bwrap's own processes carry the marker too; the command is `sleep`.
        if let Some(p) = marked_pids(&m).into_iter().find(|p| comm(*p) == "sleep\n") {
            break p;
        }
        assert!(Instant::now() < deadline, "the command never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let ns = |p: i64| std::fs::read_link(format!("/proc/{p}/ns/pid")).expect("ns");
    assert_eq!(ns(i64::from(sleeper)), ns(pid));
    assert_ne!(ns(pid), ns(i64::from(std::process::id())));
    let (_, v) = h.get(&format!("/v1/sandboxes/{sb}/processes/{id}")).await;
    assert_eq!(v["data"]["pid"].as_i64(), Some(pid), "{v}");
    let (st, v) = h.delete_process(&sb, &id, 100).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["tree_exited"], true, "{v}");
    assert!(marked_pids(&m).is_empty());
    assert!(h.server.shutdown().await.all_exited());
}

/// Issue 11 item 1 (the other side of answering before the command is
/// forked): a DELETE sent the moment `POST /processes` answers must give
/// the command its SIGTERM and grace, not send it to a namespace whose
/// init ignores it and then wait out the grace for a SIGKILL. The command
/// dies of SIGTERM well within a 60 s grace.
#[tokio::test]
async fn a_delete_right_after_creation_terminates_the_command_gracefully() {
    let h = confined().await;
    let sb = h.sandbox().await;
    for round in 0..5 {
        let id = h
            .spawn_body(&sb, json!({"cmd": "sleep", "args": ["600"]}))
            .await;
        let (st, v) = h.delete_process(&sb, &id, 60_000).await;
        assert_eq!(st, StatusCode::OK, "round {round}: {v}");
        assert_eq!(v["data"]["tree_exited"], true, "round {round}: {v}");
        assert_eq!(v["data"]["signal"], "SIGTERM", "round {round}: {v}");
    }
    assert!(h.server.shutdown().await.all_exited());
}

/// Issue 10 item 4 / issue 19 item 8: a sandbox DELETE racing a process
/// creation answered `destroyed` while the new process kept running with
/// its root deleted (the creation registered after the delete's snapshot).
/// Now the delete waits for creations under way and terminates what they
/// started; a creation after the delete began is refused.
#[tokio::test]
async fn delete_racing_process_creation_leaves_no_process() {
    let h = Harness::start().await;
    for round in 0..20u64 {
        let m = marker(&format!("race{round}"));
        let sb = h.sandbox_with_env(json!({ "TEST_MARKER": m })).await;
        let path = format!("/v1/sandboxes/{sb}/processes");
        let create = h.post(&path, json!({"cmd": "sleep", "args": ["777"]}));
        let delete = async {
            tokio::time::sleep(Duration::from_millis(round % 5)).await;
            h.delete(&format!("/v1/sandboxes/{sb}")).await
        };
        let ((cst, cv), (dst, dv)) = tokio::join!(create, delete);
        assert_eq!(dst, StatusCode::OK, "round {round}: delete {dv}");
        assert!(
            cst == StatusCode::CREATED || cst.is_client_error(),
            "round {round}: create {cst} {cv}"
        );
        let left = marked_pids(&m);
        assert!(
            left.is_empty(),
            "round {round}: create {cst}, delete {dst}, still running: {left:?}"
        );
        let (st, _) = h.get(&format!("/v1/sandboxes/{sb}")).await;
        assert_eq!(st, StatusCode::NOT_FOUND);
    }
    assert!(h.server.shutdown().await.all_exited());
}

/// Issue 10 item 1: without a usable bubblewrap, `auto` refused nothing
/// and silently ran commands unconfined. Now the server refuses to start
/// and says what to install; the unconfined fallback needs an explicit
/// `--allow-unconfined` and is announced as "NO isolation".
#[test]
fn without_bubblewrap_auto_refuses_unless_unconfined_is_allowed() {
    let empty = std::env::temp_dir().join(format!("no-bwrap-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("mkdir");
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_createos-local"))
            .args(["--port", "0", "--isolation", "auto"])
            .args(extra)
            .env("CREATEOS_API_KEY", KEY)
            .env("PATH", &empty)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn createos-local")
    };
    let refused = run(&[]).wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{err}");
    assert!(refused.stdout.is_empty(), "it must not listen");
    assert!(err.contains("apt-get install bubblewrap"), "{err}");
    assert!(err.contains("--isolation process-group"), "{err}");

    let mut allowed = run(&["--allow-unconfined"]);
    let mut first = String::new();
    BufReader::new(allowed.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("read");
    assert!(first.starts_with("listening on "), "{first}");
    let _ = allowed.kill();
    let out = allowed.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("process-group") && err.contains("NO isolation"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&empty);
}

/// Whether the kernel's cgroup v2 freezer holds process `pid`: its group
/// (the `0::` line of `/proc/PID/cgroup`, on the cgroup2 mount) says
/// `frozen 1`. A delegated cgroup v2 group pauses a sandbox so, and its
/// processes then show as sleeping, not stopped.
fn frozen_by_cgroup(pid: i32) -> bool {
    let Some(group) = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        })
    else {
        return false;
    };
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .any(|mount| {
            std::fs::read_to_string(format!("{mount}{group}/cgroup.events"))
                .is_ok_and(|e| e.lines().any(|l| l == "frozen 1"))
        })
}

/// Single-letter states of the marked `sleep`/`bash` processes (bwrap's
/// own processes excluded); `F` for one the cgroup v2 freezer holds.
fn marked_states(m: &str) -> Vec<(i32, char)> {
    marked_pids(m)
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.starts_with(b"sleep") || c.starts_with(b"/bin/bash"))
        })
        .filter_map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let state = stat.rsplit(')').next()?.trim_start().chars().next()?;
            Some((p, if frozen_by_cgroup(p) { 'F' } else { state }))
        })
        .collect()
}

/// Issue 10 item 4: pause stopped only the processes its one scan saw;
/// children forked after that scan, and processes registered while the
/// pause was under way, kept running in a `paused` sandbox.
async fn pause_stops_forks_and_late_creations(pref: IsolationPreference) {
    let h = Harness::start_with(pref).await;
    let m = marker("pause");
    let sb = h.sandbox_with_env(json!({ "TEST_MARKER": m })).await;
    h.spawn(
        &sb,
        "i=0; while [ $i -lt 300 ]; do sleep 1000 & i=$((i+1)); sleep 0.01; done; wait",
    )
    .await;
    wait_marked(&m, 20).await;
    let path = format!("/v1/sandboxes/{sb}/processes");
    let late = h.post(&path, json!({"cmd": "sleep", "args": ["1001"]}));
    let pause_path = format!("/v1/sandboxes/{sb}/pause");
    let pause = h.post(&pause_path, json!({}));
    let (_, (pst, pv)) = tokio::join!(late, pause);
    assert_eq!(pst, StatusCode::OK, "{pv}");
    h.wait_status(&sb, "paused").await;
    let states = marked_states(&m);
    assert!(states.len() >= 20, "{states:?}");
    let running: Vec<_> = states
        .iter()
        .filter(|(_, s)| !matches!(s, 'T' | 'F'))
        .collect();
    assert!(
        running.is_empty(),
        "{pref:?}: not stopped in a paused sandbox: {running:?}"
    );
    let (st, v) = h.delete(&format!("/v1/sandboxes/{sb}")).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert!(h.server.shutdown().await.all_exited());
}

#[tokio::test]
async fn pause_stops_forks_and_late_creations_in_bwrap() {
    pause_stops_forks_and_late_creations(IsolationPreference::RequireBwrap).await;
}

#[tokio::test]
async fn pause_stops_forks_and_late_creations_in_process_groups() {
    pause_stops_forks_and_late_creations(IsolationPreference::ProcessGroup).await;
}
