#![allow(dead_code)]
//! The real `createos-local` binary as a child of the test: started with
//! a data directory of the test's own (so that its sandboxes' roots, and
//! from them their uids, can be read), optionally under a descriptor
//! limit, and stopped with SIGTERM. For tests that watch the engine from
//! outside: its CPU time and descriptors in `/proc`, what it leaves
//! behind after a delete or a stop.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub const KEY: &str = "binary-key";

pub struct Engine {
    pub child: Child,
    pub base: String,
    pub toolbox: Option<String>,
    pub data: PathBuf,
    pub http: reqwest::Client,
    stopped: bool,
}

impl Drop for Engine {
    /// A test that failed before [`Engine::stop`] still ends its engine
    /// (SIGKILL: its death guard ends what it started).
    fn drop(&mut self) {
        if !self.stopped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Engine {
    /// Starts the binary with `args` (besides `--port 0` and a data
    /// directory named after `tag`); `nofile` sets both limits of
    /// `RLIMIT_NOFILE` before it runs (the engine raises only the soft
    /// one, so this is its ceiling).
    pub fn start(tag: &str, args: &[&str], nofile: Option<u64>) -> Engine {
        Engine::start_as(tag, args, nofile, None)
    }

    /// [`start`](Engine::start) as the host user `user` (uid and gid,
    /// through `setpriv`, from a root test), which owns the data
    /// directory: the engine as an ordinary user runs it.
    pub fn start_as(
        tag: &str,
        args: &[&str],
        nofile: Option<u64>,
        user: Option<(u32, u32)>,
    ) -> Engine {
        Engine::start_in(tag, args, nofile, user, None)
    }

    /// [`start_as`](Engine::start_as), the engine moved first (by this
    /// root test, between fork and exec, as systemd does for a unit with
    /// `Delegate=yes`) into the cgroup v2 group whose `cgroup.procs` is
    /// `cgroup_procs`: it starts there, alone.
    pub fn start_in(
        tag: &str,
        args: &[&str],
        nofile: Option<u64>,
        user: Option<(u32, u32)>,
        cgroup_procs: Option<&Path>,
    ) -> Engine {
        Engine::start_with_env(tag, args, nofile, user, cgroup_procs, &[])
    }

    /// [`start_in`](Engine::start_in) with `env` added to the engine's
    /// environment.
    pub fn start_with_env(
        tag: &str,
        args: &[&str],
        nofile: Option<u64>,
        user: Option<(u32, u32)>,
        cgroup_procs: Option<&Path>,
        env: &[(&str, &str)],
    ) -> Engine {
        let data = std::env::temp_dir().join(format!("cl-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data).expect("data dir");
        let mut cmd = match user {
            None => Command::new(env!("CARGO_BIN_EXE_createos-local")),
            Some((uid, gid)) => {
                std::os::unix::fs::chown(&data, Some(uid), Some(gid)).expect("chown data dir");
                let mut cmd = Command::new("setpriv");
                cmd.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .arg("--clear-groups")
                    .arg("--")
                    .arg(env!("CARGO_BIN_EXE_createos-local"))
                    .env("HOME", &data);
                cmd
            }
        };
        cmd.args(["--port", "0", "--data-dir"])
            .arg(&data)
            .args(args)
            .env("CREATEOS_API_KEY", KEY)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(procs) = cgroup_procs {
            let procs = std::fs::OpenOptions::new()
                .write(true)
                .open(procs)
                .expect("the delegated group's cgroup.procs");
            // SAFETY: one write(2) on a descriptor the child owns, between
            // fork and exec ("0": the writing process).
            unsafe {
                cmd.pre_exec(move || {
                    rustix::io::write(&procs, b"0")
                        .map(|_| ())
                        .map_err(std::io::Error::from)
                });
            }
        }
        if let Some(n) = nofile {
            // SAFETY: setrlimit only, between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = rustix::process::Rlimit {
                        current: Some(n),
                        maximum: Some(n),
                    };
                    rustix::process::setrlimit(rustix::process::Resource::Nofile, lim)
                        .map_err(std::io::Error::from)
                });
            }
        }
        let mut child = cmd.spawn().expect("start createos-local");
        let (base, mut lines) = test_support::local::listening(&mut child);
        let toolbox = if args.contains(&"--toolbox-port") {
            lines
                .next()
                .and_then(Result::ok)
                .and_then(|l| l.strip_prefix("toolbox on ").map(str::to_string))
        } else {
            None
        };
        // The rest of stdout is drained so the engine never blocks on it.
        std::thread::spawn(move || for _ in lines.by_ref() {});
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .expect("client");
        Engine {
            child,
            base,
            toolbox,
            data,
            http,
            stopped: false,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Its CPU time so far (user and system), from `/proc/PID/stat`.
    pub fn cpu(&self) -> Duration {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        // After the command name: state is field 3, utime 14, stime 15.
        let ticks: u64 = [11, 12]
            .iter()
            .filter_map(|i| fields.get(*i).and_then(|f| f.parse::<u64>().ok()))
            .sum();
        // SAFETY: sysconf has no preconditions.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
        Duration::from_secs_f64(ticks as f64 / per_second as f64)
    }

    /// How many descriptors it has open.
    pub fn descriptors(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).map_or(0, |d| d.count())
    }

    /// Its resident memory in bytes, from `/proc/PID/status`.
    pub fn rss(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("X-Api-Key", KEY);
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

    /// A CreateOS sandbox, once `running`.
    pub async fn sandbox(&self) -> String {
        let (st, v) = self
            .call(
                reqwest::Method::POST,
                "/v1/sandboxes",
                Some(json!({"shape": "s-1vcpu-256mb", "ingress_enabled": false})),
            )
            .await;
        assert_eq!(st, 201, "{v}");
        let sb = v["data"]["id"].as_str().expect("id").to_string();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, v) = self
                .call(reqwest::Method::GET, &format!("/v1/sandboxes/{sb}"), None)
                .await;
            if v["data"]["status"] == "running" {
                return sb;
            }
            assert!(Instant::now() < deadline, "{v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts a managed process running `script` under bash; its id.
    pub async fn spawn(&self, sb: &str, script: &str) -> String {
        let (st, v) = self
            .call(
                reqwest::Method::POST,
                &format!("/v1/sandboxes/{sb}/processes"),
                Some(json!({"cmd": "/bin/bash", "args": ["-c", script]})),
            )
            .await;
        assert_eq!(st, 201, "{v}");
        v["data"]["process_id"]
            .as_str()
            .expect("process id")
            .to_string()
    }

    /// Deletes the CreateOS sandbox `sb`, which must answer 200 (its
    /// end proven); the answer.
    pub async fn delete_sandbox(&self, sb: &str) -> Value {
        let (st, v) = self
            .call(
                reqwest::Method::DELETE,
                &format!("/v1/sandboxes/{sb}"),
                None,
            )
            .await;
        assert_eq!(st, 200, "deleting {sb}: {v}");
        v
    }

    /// Deletes the process `pid` of `sb` (its tree) after `grace_ms`,
    /// which must answer 200; the answer's `data`.
    pub async fn delete_process(&self, sb: &str, pid: &str, grace_ms: u64) -> Value {
        let (st, v) = self
            .call(
                reqwest::Method::DELETE,
                &format!("/v1/sandboxes/{sb}/processes/{pid}?grace_ms={grace_ms}"),
                None,
            )
            .await;
        assert_eq!(st, 200, "deleting process {pid} of {sb}: {v}");
        v["data"].clone()
    }

    /// The root named `sb` (a CreateOS sandbox's id) on the host.
    pub fn root(&self, sb: &str) -> PathBuf {
        self.data.join(sb)
    }

    /// [`Engine::stop`] that must exit 0; what it wrote on stderr.
    pub fn stop_clean(self) -> String {
        let (clean, stderr) = self.stop();
        assert!(clean, "the engine's stop was not clean: {stderr}");
        stderr
    }

    /// Sends SIGTERM and waits for the exit: whether it exited 0, and
    /// what it wrote on stderr.
    pub fn stop(mut self) -> (bool, String) {
        self.stopped = true;
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(self.pid()).expect("pid"),
            rustix::process::Signal::TERM,
        );
        let status = self.child.wait().expect("wait for the engine");
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        (status.success(), err)
    }
}

/// The host uid owning a sandbox root (a root server gives each sandbox
/// its own), read before the root is removed.
pub fn owner(root: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(root).ok().map(|m| m.uid())
}

/// Live (not zombie) processes of the host whose real uid is one of the
/// sandbox ids `uid` owns (its whole range, see `sandbox_engine::trees::id_map`),
/// each as `pid: command line`: a fresh scan of `/proc`.
pub fn live_of_uid(uid: u32) -> Vec<String> {
    let ids = sandbox_engine::trees::id_map::IdRange::of_owner(uid);
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
        };
        let zombie = matches!(field("State:").as_deref(), Some("Z") | Some("X"));
        let ours = field("Uid:")
            .and_then(|u| u.parse::<u32>().ok())
            .is_some_and(|u| ids.contains(u));
        if zombie || !ours {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        found.push(format!(
            "{pid}: {}",
            String::from_utf8_lossy(&cmdline)
                .replace('\0', " ")
                .trim_end()
        ));
    }
    found
}

/// What is left of the disk of the sandbox whose root is `data/<sb>`: a
/// mount on its root, a loop device backed by its image.
pub fn disk_remains(data: &Path, sb: &str) -> Vec<String> {
    let root = data.join(sb);
    let image = data.join(".disks").join(format!("{sb}.img"));
    let mut left = Vec::new();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let root_text = root.to_string_lossy().to_string();
    for line in mounts.lines() {
        if line.split_whitespace().nth(4) == Some(root_text.as_str()) {
            left.push(format!("mounted: {line}"));
        }
    }
    let image_text = image.to_string_lossy().to_string();
    if let Ok(devices) = std::fs::read_dir("/sys/block") {
        for d in devices.flatten() {
            let backing =
                std::fs::read_to_string(d.path().join("loop/backing_file")).unwrap_or_default();
            let backing = backing.trim_end();
            if backing == image_text || backing.strip_suffix(" (deleted)") == Some(&image_text) {
                left.push(format!("{}: {backing}", d.file_name().to_string_lossy()));
            }
        }
    }
    left
}

/// A sandbox's machine as seen running from outside, by its own identity
/// rather than by a uid (a server that is not root runs every sandbox as
/// its own uid, the test and the engine included): the PID namespace of
/// its init, its outer `bwrap` (the init's parent on the host), and as
/// root its range of ids too.
#[derive(Debug, Clone)]
pub struct MachineSeen {
    /// The inode of its PID namespace.
    pub ns: u64,
    /// That namespace held open, so that its inode cannot name another
    /// namespace once it ends (the kernel hands freed namespace inodes
    /// out again: a later machine, such as the next engine's startup
    /// probe, could otherwise be taken for this one's survivor).
    pub ns_held: Option<std::sync::Arc<std::fs::File>>,
    /// Host pid and start time of the outer `bwrap` that holds it.
    pub holder: Option<(i32, u64)>,
    /// Its owner's uid where it has a range of its own (a root server).
    pub owner: Option<u32>,
}

/// `(pid, ppid, start time, state)` of every process, from `/proc/PID/stat`.
fn proc_table() -> Vec<(i32, i32, u64, char)> {
    let mut table = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let state = fields.first().and_then(|s| s.chars().next()).unwrap_or('?');
        let ppid = fields.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let start = fields.get(19).and_then(|s| s.parse().ok()).unwrap_or(0);
        table.push((pid, ppid, start, state));
    }
    table
}

/// The PID namespace inode of `pid` (`None`: gone, or not readable).
pub fn pid_ns(pid: i32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| m.ino())
}

/// The PID namespaces (other than the engine's own) that processes
/// started by the engine at `engine_pid` run in, each with the host pid
/// of its topmost process found (the machine's init) and that process's
/// parent.
pub fn machines_under(engine_pid: i32) -> std::collections::HashMap<u64, (i32, i32)> {
    let table = proc_table();
    let own = pid_ns(engine_pid);
    let mut below: std::collections::HashSet<i32> = [engine_pid].into();
    loop {
        let before = below.len();
        for (pid, ppid, _, _) in &table {
            if below.contains(ppid) {
                below.insert(*pid);
            }
        }
        if below.len() == before {
            break;
        }
    }
    let mut found = std::collections::HashMap::new();
    for (pid, ppid, _, state) in &table {
        if !below.contains(pid) || matches!(state, 'Z' | 'X') {
            continue;
        }
        let Some(ns) = pid_ns(*pid).filter(|ns| Some(*ns) != own) else {
            continue;
        };
        // The parent outside the namespace: this is its init.
        if pid_ns(*ppid) != Some(ns) {
            found.entry(ns).or_insert((*pid, *ppid));
        }
    }
    found
}

impl MachineSeen {
    /// The one machine among those running under `engine_pid` that is
    /// not in `known` (the test made one sandbox's machine start since).
    pub fn new_under(
        engine_pid: i32,
        known: &std::collections::HashSet<u64>,
        owner: Option<u32>,
    ) -> MachineSeen {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let fresh: Vec<(u64, (i32, i32))> = machines_under(engine_pid)
                .into_iter()
                .filter(|(ns, _)| !known.contains(ns))
                .collect();
            if fresh.len() == 1 {
                let (ns, (init, holder)) = fresh[0];
                let ns_held = std::fs::File::open(format!("/proc/{init}/ns/pid"))
                    .ok()
                    .filter(|f| {
                        use std::os::unix::fs::MetadataExt;
                        f.metadata().is_ok_and(|m| m.ino() == ns)
                    })
                    .map(std::sync::Arc::new);
                let start = proc_table()
                    .into_iter()
                    .find(|(pid, ..)| *pid == holder)
                    .map(|(_, _, start, _)| start);
                return MachineSeen {
                    ns,
                    ns_held,
                    holder: start.map(|s| (holder, s)),
                    owner: owner.filter(|_| rustix::process::geteuid().is_root()),
                };
            }
            assert!(
                Instant::now() < deadline,
                "expected one new machine under the engine, found {fresh:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What of it still runs, each as `pid: command line`: a fresh scan
    /// for processes in its PID namespace or below one of them (nested
    /// namespaces), its outer `bwrap`, and as root any process of its
    /// range of ids.
    pub fn survivors(&self) -> Vec<String> {
        let table: Vec<_> = proc_table()
            .into_iter()
            .filter(|(.., state)| !matches!(state, 'Z' | 'X'))
            .collect();
        let mut found: std::collections::HashSet<i32> = table
            .iter()
            .filter(|(pid, ..)| pid_ns(*pid) == Some(self.ns))
            .map(|(pid, ..)| *pid)
            .collect();
        if let Some((holder, start)) = self.holder {
            if table.iter().any(|(p, _, s, _)| *p == holder && *s == start) {
                found.insert(holder);
            }
        }
        loop {
            let before = found.len();
            for (pid, ppid, ..) in &table {
                if found.contains(ppid) {
                    found.insert(*pid);
                }
            }
            if found.len() == before {
                break;
            }
        }
        let mut left: Vec<String> = found
            .into_iter()
            .map(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let status =
                    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                let pick = |k: &str| {
                    status
                        .lines()
                        .find(|l| l.starts_with(k))
                        .unwrap_or("")
                        .to_string()
                };
                format!(
                    "{pid}: {} [{} {} {} {}]",
                    String::from_utf8_lossy(&cmdline)
                        .replace('\0', " ")
                        .trim_end(),
                    pick("Name:"),
                    pick("State:"),
                    pick("PPid:"),
                    pick("NSpid:")
                )
            })
            .collect();
        if let Some(owner) = self.owner {
            left.extend(live_of_uid(owner));
        }
        left.sort();
        left.dedup();
        left
    }
}

/// The ordinary user tests start the engine as: `sandbox-ci` (made here
/// when missing, as `.ci/run` makes it), as (uid, gid); `None` (skipped,
/// and said so with `who` and why) without root.
pub fn ordinary_user(who: &str) -> Option<(u32, u32)> {
    if !rustix::process::geteuid().is_root() {
        test_support::skipped(&format!(
            "{who}: needs root to start the engine as another user"
        ));
        return None;
    }
    let id = |flag: &str| id_of("sandbox-ci", flag);
    // One `useradd` at a time: two tests of one binary that both found no
    // user ran it together, and the second rewrote /etc/passwd with a new
    // uid and gave the user a second range of subordinate ids.
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _making = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    if id("-u").is_none() {
        let made = std::process::Command::new("useradd")
            .args(["-m", "sandbox-ci"])
            .status()
            .is_ok_and(|s| s.success());
        assert!(made || id("-u").is_some(), "useradd sandbox-ci failed");
    }
    Some((id("-u").expect("uid"), id("-g").expect("gid")))
}

/// `id FLAG USER` (`-u` or `-g`) as a number; `None` without that user.
pub fn id_of(user: &str, flag: &str) -> Option<u32> {
    std::process::Command::new("id")
        .args([flag, user])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<u32>()
                .ok()
        })
}
