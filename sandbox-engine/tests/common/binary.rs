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

    /// The root named `sb` (a CreateOS sandbox's id) on the host.
    pub fn root(&self, sb: &str) -> PathBuf {
        self.data.join(sb)
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
