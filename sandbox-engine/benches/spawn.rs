//! The spawn hot path of createos-local (issue 11): how long
//! `POST /v1/sandboxes/{id}/processes` takes next to the server's own
//! bubblewrap command line run bare, and how long a login shell takes
//! inside a sandbox next to a plain one. Every figure is measured in the
//! same run as its baseline, alternating one with the other, and printed
//! as a Markdown table for BENCHMARKS.md ("createos-local: spawn hot
//! path"). Targets are reported, never asserted; a wrong result (a failed
//! request, a command that did not succeed) panics.
//!
//! The server is the `createos-local` binary in its own process (as in
//! the `load` bench) with a data directory the bench chooses, so that the
//! baseline can run the very same bwrap command line
//! ([`sandbox_engine::machine::isolation::bare_bwrap_command`]) on the same sandbox
//! root, as the same sandbox uid.
//!
//! `cargo bench -p sandbox-engine --bench spawn [-- ROUNDS]` (default 40)

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const KEY: &str = "bench-key";
const WARMUP: usize = 3;

struct Server {
    child: Child,
    base: String,
    http: reqwest::Client,
    data_dir: PathBuf,
}

impl Server {
    fn start(data_dir: PathBuf) -> Self {
        let args = ["--port", "0", "--isolation", "bwrap", "--data-dir"];
        let (child, base) = test_support::local::start_binary(
            env!("CARGO_BIN_EXE_createos-local"),
            args.iter()
                .map(std::ffi::OsStr::new)
                .chain([data_dir.as_os_str()]),
            KEY,
        );
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .expect("client");
        Self {
            child,
            base,
            http,
            data_dir,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut rb = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("X-Api-Key", KEY);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let resp = rb.send().await.expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    // The same client steps as the other bench of this crate (`load.rs`,
    // `spawn.rs`) on purpose: each bench is a program of its own
    // (`harness = false`) whose timing must not move when the other's
    // client changes, so neither borrows the other's code.
    async fn sandbox(&self) -> String {
        let (st, v) = self
            .call(
                reqwest::Method::POST,
                "/v1/sandboxes",
                Some(json!({"shape": "s-1vcpu-256mb"})),
            )
            .await;
        assert_eq!(st, 201, "{v}");
        let id = v["data"]["id"].as_str().expect("id").to_string();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, v) = self
                .call(reqwest::Method::GET, &format!("/v1/sandboxes/{id}"), None)
                .await;
            if v["data"]["status"] == "running" {
                return id;
            }
            assert!(Instant::now() < deadline, "sandbox never ran: {v}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `POST /processes`; returns the time to the answer and the id.
    async fn create(&self, sb: &str, body: Value) -> (Duration, String) {
        let path = format!("/v1/sandboxes/{sb}/processes");
        let started = Instant::now();
        let (st, v) = self.call(reqwest::Method::POST, &path, Some(body)).await;
        let took = started.elapsed();
        assert_eq!(st, 201, "{v}");
        let id = v["data"]["process_id"].as_str().expect("process_id");
        (took, id.to_string())
    }

    /// Reads `/connect` to its exit frame; panics unless the exit is 0.
    async fn follow_to_exit(&self, sb: &str, pid: &str) {
        let url = format!(
            "{}/v1/sandboxes/{sb}/processes/{pid}/connect?after=0",
            self.base
        );
        let resp = self
            .http
            .get(url)
            .header("X-Api-Key", KEY)
            .send()
            .await
            .expect("connect");
        let body = resp.text().await.expect("connect body");
        let exit = body
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|f| f["type"] == "exit")
            .unwrap_or_else(|| panic!("no exit frame in {body}"));
        assert_eq!(exit["exit_code"], 0, "{body}");
    }

    async fn forget(&self, sb: &str, pid: &str) {
        let (st, v) = self
            .call(
                reqwest::Method::DELETE,
                &format!("/v1/sandboxes/{sb}/processes/{pid}"),
                None,
            )
            .await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["data"]["tree_exited"], true, "{v}");
    }

    async fn exec(&self, sb: &str, cmd: &str, args: &[&str]) -> (Duration, Value) {
        let started = Instant::now();
        let (st, v) = self
            .call(
                reqwest::Method::POST,
                &format!("/v1/sandboxes/{sb}/exec"),
                Some(json!({"cmd": cmd, "args": args})),
            )
            .await;
        let took = started.elapsed();
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["data"]["result"]["exit_code"], 0, "{v}");
        (took, v)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).expect("pid");
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// Median and 90th percentile of a sample.
#[derive(Clone, Copy)]
struct Stats {
    median: f64,
    p90: f64,
}

impl Stats {
    fn of(ms: &[f64]) -> Self {
        let mut v = ms.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        Self {
            median: at(0.5),
            p90: at(0.9),
        }
    }

    fn show(&self) -> String {
        format!("{} (p90 {})", ms(self.median), ms(self.p90))
    }
}

fn ms(v: f64) -> String {
    if v < 1.0 {
        format!("{:.0} µs", v * 1000.0)
    } else {
        format!("{v:.2} ms")
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The bare bwrap run: spawn to exit of `bwrap <server's arguments> -- true`.
fn bare_bwrap(bwrap: &std::path::Path, root: &std::path::Path) -> Duration {
    let mut cmd = sandbox_engine::machine::isolation::bare_bwrap_command(bwrap, root, "true", &[]);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let started = Instant::now();
    let status = cmd.status().expect("bare bwrap");
    let took = started.elapsed();
    assert!(status.success(), "bare bwrap failed: {status}");
    took
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let bwrap = Command::new("bwrap")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    format!(
        "{cores} cores, {cpu}, {mem_gib:.0} GiB, Linux {}, {bwrap}",
        kernel.trim()
    )
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn utc_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// One table row.
struct Row {
    figure: String,
    measured: Stats,
    baseline_name: String,
    baseline: Stats,
    target: String,
    met: Option<bool>,
}

impl Row {
    fn print(&self) {
        let ratio = self.measured.median / self.baseline.median;
        let over = self.measured.median - self.baseline.median;
        let status = match self.met {
            Some(true) => "met",
            Some(false) => "**missed**",
            None => "",
        };
        println!(
            "| {} | {} | {}: {} | {ratio:.2}x | {}{} | {} | {status} |",
            self.figure,
            self.measured.show(),
            self.baseline_name,
            self.baseline.show(),
            if over >= 0.0 { "+" } else { "−" },
            ms(over.abs()),
            self.target,
        );
    }
}

/// `bash -lc true` and `bash -c true`, alternating, timed inside the
/// sandbox with bash's `EPOCHREALTIME` (no process start of the sandbox
/// itself is included). Returns (login, plain) in milliseconds.
async fn shells_inside(server: &Server, sb: &str, rounds: usize) -> (Vec<f64>, Vec<f64>) {
    let script = format!(
        "us() {{ local t=$EPOCHREALTIME; echo ${{t/./}}; }}
         for i in $(seq {}); do
           a=$(us); bash -lc true || exit 1; b=$(us); bash -c true || exit 1; c=$(us)
           [ $i -gt {WARMUP} ] && echo \"$((b - a)) $((c - b))\"
         done",
        rounds + WARMUP
    );
    let (_, v) = server.exec(sb, "/bin/bash", &["-c", &script]).await;
    let out = v["data"]["result"]["stdout"].as_str().expect("stdout");
    let mut login = Vec::new();
    let mut plain = Vec::new();
    for line in out.lines() {
        let mut it = line
            .split_whitespace()
            .map(|n| n.parse::<f64>().expect("µs"));
        login.push(it.next().expect("login") / 1000.0);
        plain.push(it.next().expect("plain") / 1000.0);
    }
    assert_eq!(login.len(), rounds, "{out}");
    (login, plain)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(40);
    let bwrap = sandbox_engine::util::find_in_path("bwrap").expect("bwrap in PATH");
    let data_dir =
        std::env::temp_dir().join(format!("createos-local-spawn-bench-{}", std::process::id()));
    std::fs::create_dir_all(&data_dir).expect("data dir");
    let load_before = load();
    let started = Instant::now();
    let server = Server::start(data_dir.clone());
    let (_, info) = server
        .call(reqwest::Method::GET, "/_admin/info", None)
        .await;
    let isolation = info["data"]["isolation"]
        .as_str()
        .unwrap_or("?")
        .to_string();
    let sb = server.sandbox().await;
    let root = server.data_dir.join(&sb);
    assert!(root.is_dir(), "the sandbox root is {}", root.display());

    // 1. POST /processes of `true` vs the bare bwrap run.
    eprintln!("spawn bench: POST /processes vs bare bwrap, {rounds} rounds");
    let (mut post, mut bare, mut to_exit, mut bare2) = (vec![], vec![], vec![], vec![]);
    for i in 0..rounds + WARMUP {
        let b = bare_bwrap(&bwrap, &root);
        let (p, id) = server.create(&sb, json!({"cmd": "true"})).await;
        server.follow_to_exit(&sb, &id).await;
        server.forget(&sb, &id).await;
        // POST and `/connect` to the exit frame, as the provider runs one
        // command (stdin close left out: the command reads no stdin).
        let b2 = bare_bwrap(&bwrap, &root);
        let whole = Instant::now();
        let (_, id) = server.create(&sb, json!({"cmd": "true"})).await;
        server.follow_to_exit(&sb, &id).await;
        let w = whole.elapsed();
        server.forget(&sb, &id).await;
        if i >= WARMUP {
            post.push(millis(p));
            bare.push(millis(b));
            to_exit.push(millis(w));
            bare2.push(millis(b2));
        }
    }

    // 2. One-shot exec of `true` (one request) vs the bare bwrap run.
    eprintln!("spawn bench: exec vs bare bwrap");
    let (mut exec, mut bare3) = (vec![], vec![]);
    for i in 0..rounds + WARMUP {
        let b = bare_bwrap(&bwrap, &root);
        let (e, _) = server.exec(&sb, "true", &[]).await;
        if i >= WARMUP {
            exec.push(millis(e));
            bare3.push(millis(b));
        }
    }

    // 3. Sandbox create (the root prepared on disk) and delete (nothing
    // running), what `sandbox run` pays once each.
    eprintln!("spawn bench: sandbox create and delete vs bare bwrap");
    let (mut create, mut delete, mut bare5) = (vec![], vec![], vec![]);
    for i in 0..rounds.min(20) + WARMUP {
        let b = bare_bwrap(&bwrap, &root);
        let t = Instant::now();
        let (st, v) = server
            .call(
                reqwest::Method::POST,
                "/v1/sandboxes",
                Some(json!({"shape": "s-1vcpu-256mb"})),
            )
            .await;
        let c = t.elapsed();
        assert_eq!(st, 201, "{v}");
        let id = v["data"]["id"].as_str().expect("id").to_string();
        let t = Instant::now();
        let (st, v) = server
            .call(
                reqwest::Method::DELETE,
                &format!("/v1/sandboxes/{id}"),
                None,
            )
            .await;
        let d = t.elapsed();
        assert_eq!(st, 200, "{v}");
        if i >= WARMUP {
            create.push(millis(c));
            delete.push(millis(d));
            bare5.push(millis(b));
        }
    }

    // 4. Server start (what the `sandbox` CLI's embedded backend pays on
    // every `sandbox run`): spawn of the binary to its `listening` line,
    // which includes building the sandboxes' /etc and the bwrap probe.
    eprintln!("spawn bench: server start vs bare bwrap");
    let (mut start, mut bare4) = (vec![], vec![]);
    for i in 0..rounds.min(10) + 1 {
        let b = bare_bwrap(&bwrap, &root);
        let dir = data_dir.with_extension(format!("start-{i}"));
        let t = Instant::now();
        let other = Server::start(dir);
        let s = t.elapsed();
        drop(other);
        if i >= 1 {
            start.push(millis(s));
            bare4.push(millis(b));
        }
    }

    // 5. Login shell vs plain shell inside the sandbox.
    eprintln!("spawn bench: bash -lc true vs bash -c true inside the sandbox");
    let (login, plain) = shells_inside(&server, &sb, rounds).await;
    let whole = started.elapsed();
    let load_after = load();

    let bare_name = "bare `bwrap … true` (same arguments, spawn → exit)";
    let post_stats = Stats::of(&post);
    let bare_stats = Stats::of(&bare);
    let login_stats = Stats::of(&login);
    let rows = [
        Row {
            figure: "`POST /processes` of `true` (request → 201)".into(),
            measured: post_stats,
            baseline_name: bare_name.into(),
            baseline: bare_stats,
            target: "≤ 5 ms over baseline".into(),
            met: Some(post_stats.median - bare_stats.median <= 5.0),
        },
        Row {
            figure: "`POST /processes` + `/connect` to the exit frame, `true`".into(),
            measured: Stats::of(&to_exit),
            baseline_name: bare_name.into(),
            baseline: Stats::of(&bare2),
            target: String::new(),
            met: None,
        },
        Row {
            figure: "`POST /exec` of `true` (one request, tree verified gone)".into(),
            measured: Stats::of(&exec),
            baseline_name: bare_name.into(),
            baseline: Stats::of(&bare3),
            target: String::new(),
            met: None,
        },
        Row {
            figure: "`POST /sandboxes` (root prepared on disk)".into(),
            measured: Stats::of(&create),
            baseline_name: bare_name.into(),
            baseline: Stats::of(&bare5),
            target: String::new(),
            met: None,
        },
        Row {
            figure: "`DELETE /sandboxes/{id}` (no process, root removed)".into(),
            measured: Stats::of(&delete),
            baseline_name: bare_name.into(),
            baseline: Stats::of(&bare5),
            target: String::new(),
            met: None,
        },
        Row {
            figure: format!(
                "server start, spawn → `listening` ({} starts; /etc copy and bwrap probe included)",
                start.len()
            ),
            measured: Stats::of(&start),
            baseline_name: bare_name.into(),
            baseline: Stats::of(&bare4),
            target: String::new(),
            met: None,
        },
        Row {
            figure: "`bash -lc true` inside the sandbox".into(),
            measured: login_stats,
            baseline_name: "`bash -c true`, same sandbox".into(),
            baseline: Stats::of(&plain),
            target: "≤ 10 ms".into(),
            met: Some(login_stats.median <= 10.0),
        },
    ];
    println!(
        "### createos-local: spawn hot path ({}, isolation {isolation}; whole run {:.1} s)\n",
        utc_now(),
        whole.as_secs_f64()
    );
    println!("Machine: {}. Load average before {load_before}, after {load_after}. Median of {rounds} rounds after {WARMUP} warm-ups, each figure alternating with its baseline.\n", machine());
    println!("| figure | measured | baseline | ratio | over baseline | target | status |");
    println!("|---|---|---|---|---|---|---|");
    for row in &rows {
        row.print();
    }
}
