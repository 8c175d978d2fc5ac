//! A soak of `createos-local` (issue 40 item 5): the engine binary runs for
//! a set time under a mixed workload on both faces (create, exec, big
//! output, stdin, pause/resume, egress through its proxy, delete) with a
//! hostile share (stalled bodies, request floods, fork bombs, descriptor
//! hogs inside sandboxes, idle connections), while its RSS, descriptors,
//! threads, CPU and the latency of a plain request are sampled every
//! second. It prints a Markdown summary with its verdict (flat after
//! warm-up, nothing leaked, every sandbox proven gone at the end) and
//! writes the samples (`soak.csv`) and a plot drawn by `plotters`
//! (`soak.svg`) to `target/soak/`.
//!
//! `cargo bench -p sandbox-engine --bench soak -- --seconds 600` (the long
//! run of BENCHMARKS.md); `.ci/run` runs a short one (`--seconds 30
//! --check`), where a failed verdict is a failure. Only loopback is used:
//! the egress target is a server this bench starts on 127.0.0.1.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

const KEY: &str = "soak-key";

/// One second's sample of the engine.
#[derive(Clone, Copy, Default)]
struct Sample {
    second: f64,
    rss_mib: f64,
    fds: u64,
    threads: u64,
    cpu_percent: f64,
    p50_ms: f64,
    p99_ms: f64,
}

struct Engine {
    child: Child,
    base: String,
    data: PathBuf,
}

fn proc_status(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

/// User + system CPU ticks of `pid`.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(close) = stat.rfind(')') else {
        return 0;
    };
    let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    let at = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    at(11) + at(12)
}

fn fd_count(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Option<(u16, Value)> {
        let mut rb = self.http.request(method, format!("{}{path}", self.base));
        rb = if path.starts_with("/daytona") {
            rb.header("Authorization", format!("Bearer {KEY}"))
        } else {
            rb.header("X-Api-Key", KEY)
        };
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let resp = rb.send().await.ok()?;
        let st = resp.status().as_u16();
        Some((st, resp.json().await.unwrap_or(Value::Null)))
    }

    /// Waits (up to 30 s) until sandbox `sb` shows `status`.
    async fn settle(&self, sb: &str, status: &str) -> Option<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let (_, v) = self
                .call(Method::GET, &format!("/v1/sandboxes/{sb}"), None)
                .await?;
            if v["data"]["status"] == status {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Some(())
    }

    /// Runs `script`: `Err(status)` when the engine refused it.
    async fn exec(&self, sb: &str, script: &str) -> Option<Result<Value, u16>> {
        let body = json!({"cmd": "/bin/sh", "args": ["-c", script]});
        let (st, v) = self
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{sb}/exec"),
                Some(body),
            )
            .await?;
        Some(if st == 200 {
            Ok(v["data"]["result"].clone())
        } else {
            Err(st)
        })
    }
}

/// Counts of what the workload did, for the summary.
/// How a round went.
enum Outcome {
    /// Everything as expected.
    Ok,
    /// The engine refused a step with 429 or 503 (its budgets at work:
    /// an answer, not a fault).
    Refused,
    /// Something other than expected (said on stderr).
    Wrong,
}

/// Per kind of round: CreateOS life, Daytona life, hostile.
#[derive(Default)]
struct Tally {
    ok: [AtomicU64; 3],
    refused: [AtomicU64; 3],
    wrong: [AtomicU64; 3],
    failed: [AtomicU64; 3],
}

impl Tally {
    fn note(&self, kind: usize, outcome: Option<Outcome>) {
        match outcome {
            Some(Outcome::Ok) => &self.ok[kind],
            Some(Outcome::Refused) => &self.refused[kind],
            Some(Outcome::Wrong) => &self.wrong[kind],
            None => &self.failed[kind],
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    fn sum(counts: &[AtomicU64; 3]) -> u64 {
        counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    fn line(&self, kind: usize) -> String {
        format!(
            "{} / {} / {} / {}",
            self.ok[kind].load(Ordering::Relaxed),
            self.refused[kind].load(Ordering::Relaxed),
            self.wrong[kind].load(Ordering::Relaxed),
            self.failed[kind].load(Ordering::Relaxed)
        )
    }
}

/// Whether a status is the engine refusing work under its budgets.
fn refusal(status: u16) -> bool {
    status == 429 || status == 503
}

/// What a round saw: refusals and things other than expected.
#[derive(Default)]
struct Seen {
    refused: bool,
    wrong: Vec<String>,
}

impl Seen {
    /// Checks an exec's answer with `good`, naming `what` when it is not.
    fn exec(&mut self, what: &str, answer: Result<Value, u16>, good: impl Fn(&Value) -> bool) {
        match answer {
            Ok(r) if good(&r) => {}
            Ok(r) => self.wrong.push(format!("{what}: {r}")),
            Err(st) if refusal(st) => self.refused = true,
            Err(st) => self.wrong.push(format!("{what}: HTTP {st}")),
        }
    }

    fn status(&mut self, what: &str, st: u16, v: &Value, good: bool) {
        if refusal(st) {
            self.refused = true;
        } else if !good {
            self.wrong.push(format!("{what}: {st} {v}"));
        }
    }

    fn outcome(self, round: &str) -> Outcome {
        if !self.wrong.is_empty() {
            eprintln!(
                "soak: a {round} round went wrong: {}",
                self.wrong.join("; ")
            );
            Outcome::Wrong
        } else if self.refused {
            Outcome::Refused
        } else {
            Outcome::Ok
        }
    }
}

/// The ordinary share: a CreateOS sandbox through its whole life.
async fn createos_round(c: &Client, target_url: &str, round: u64) -> Option<Outcome> {
    let mut seen = Seen::default();
    let body = json!({"shape": "s-1vcpu-1gb", "env": { "EGRESS_TARGET": target_url }});
    let (st, v) = c.call(Method::POST, "/v1/sandboxes", Some(body)).await?;
    if st != 201 {
        seen.status("create", st, &v, false);
        return Some(seen.outcome("CreateOS"));
    }
    let sb = v["data"]["id"].as_str()?.to_string();
    c.settle(&sb, "running").await?;
    // 1 333 336 base64 characters and a newline after every 76.
    let big = c
        .exec(&sb, "head -c 1000000 /dev/urandom | base64 | wc -c")
        .await?;
    seen.exec("big output", big, |r| r["stdout"] == "1350880\n");
    // Stdin: a staged file read by the command.
    let path = format!("/v1/sandboxes/{sb}/files?path=/tmp/in.txt");
    let (st, v) = c
        .call(Method::PUT, &path, Some(json!("soak input")))
        .await?;
    seen.status("staging", st, &v, (200..300).contains(&st));
    let read = c.exec(&sb, "wc -c < /tmp/in.txt").await?;
    seen.exec("staged input", read, |r| r["exit_code"] == 0);
    if round.is_multiple_of(3) {
        for (step, settled) in [("pause", "paused"), ("resume", "running")] {
            let path = format!("/v1/sandboxes/{sb}/{step}");
            let (st, v) = c.call(Method::POST, &path, Some(json!({}))).await?;
            seen.status(step, st, &v, (200..300).contains(&st));
            c.settle(&sb, settled).await?;
        }
    }
    // Egress through the sandbox's proxy to the bench's own server.
    let egress = c
        .exec(&sb, "curl -s -m 5 --noproxy '' \"$EGRESS_TARGET\" || true")
        .await?;
    seen.exec("egress", egress, |r| {
        r["stdout"]
            .as_str()
            .is_some_and(|s| s.contains("soak-egress-ok"))
    });
    let (st, v) = c
        .call(Method::DELETE, &format!("/v1/sandboxes/{sb}"), None)
        .await?;
    seen.status("delete", st, &v, st == 200);
    Some(seen.outcome("CreateOS"))
}

/// The Daytona face: create, a command, delete.
async fn daytona_round(c: &Client) -> Option<Outcome> {
    let mut seen = Seen::default();
    let body = json!({"snapshot": "daytona-small", "autoStopInterval": 0});
    let (st, v) = c
        .call(Method::POST, "/daytona/api/sandbox", Some(body))
        .await?;
    if st != 200 {
        seen.status("create", st, &v, false);
        return Some(seen.outcome("Daytona"));
    }
    let id = v["id"].as_str()?.to_string();
    let cmd = json!({"command": "sh -c 'seq 1 20000 | tail -1'"});
    let path = format!("/daytona/toolbox/{id}/process/execute");
    let (st, r) = c.call(Method::POST, &path, Some(cmd)).await?;
    let good = r["result"].as_str().is_some_and(|s| s.contains("20000"));
    seen.status("execute", st, &r, st == 200 && good);
    let (st, v) = c
        .call(Method::DELETE, &format!("/daytona/api/sandbox/{id}"), None)
        .await?;
    seen.status("delete", st, &v, st == 200);
    Some(seen.outcome("Daytona"))
}

/// The hostile share, one of four per round.
async fn hostile_round(c: &Client, addr: &str, round: u64) -> Option<Outcome> {
    let mut seen = Seen::default();
    match round % 4 {
        // A stalled body: headers promising 1 MB, a few bytes, then silence
        // (the engine times it out); and a burst of idle connections.
        0 => {
            let addr = addr.to_string();
            tokio::task::spawn_blocking(move || {
                let mut held = Vec::new();
                if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
                    let _ = s.write_all(
                        format!(
                            "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nX-Api-Key: {KEY}\r\n\
                             Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{{"
                        )
                        .as_bytes(),
                    );
                    held.push(s);
                }
                for _ in 0..50 {
                    if let Ok(s) = std::net::TcpStream::connect(&addr) {
                        held.push(s);
                    }
                }
                std::thread::sleep(Duration::from_secs(2));
            })
            .await
            .ok()?;
        }
        // A flood of requests, most unauthenticated: each is answered.
        1 => {
            let mut all = Vec::new();
            for i in 0..200u32 {
                let c = c.clone();
                all.push(tokio::spawn(async move {
                    let rb = c.http.get(format!("{}/v1/sandboxes/none-{i}", c.base));
                    let rb = if i.is_multiple_of(4) {
                        rb.header("X-Api-Key", KEY)
                    } else {
                        rb
                    };
                    rb.send().await.is_ok()
                }));
            }
            for t in all {
                if !t.await.unwrap_or(false) {
                    seen.wrong.push("a flooding request got no answer".into());
                }
            }
        }
        // A fork bomb in a sandbox (stopped at its process limit), or a
        // descriptor hog: each ends with its sandbox deleted.
        kind => {
            let body = json!({"shape": "s-1vcpu-1gb"});
            let (st, v) = c.call(Method::POST, "/v1/sandboxes", Some(body)).await?;
            if st != 201 {
                seen.status("create", st, &v, false);
                return Some(seen.outcome("hostile"));
            }
            let sb = v["data"]["id"].as_str()?.to_string();
            c.settle(&sb, "running").await?;
            let script = if kind == 2 {
                "i=0; while [ $i -lt 3000 ]; do sleep 30 & i=$((i+1)); done 2>/dev/null; echo done"
            } else {
                "python3 -c 'import os\nfds=[]\ntry:\n while True: fds.append(os.open(\"/dev/null\", os.O_RDONLY))\nexcept OSError: print(len(fds))'"
            };
            let answer = c.exec(&sb, script).await?;
            // A shell gives up at its first failed fork (exit 2): any
            // answer is right for the bomb; the hog counts what it got.
            seen.exec("hostile command", answer, |r| {
                kind == 2 || r["exit_code"] == 0
            });
            let (st, v) = c
                .call(Method::DELETE, &format!("/v1/sandboxes/{sb}"), None)
                .await?;
            seen.status("delete", st, &v, st == 200);
        }
    }
    Some(seen.outcome("hostile"))
}

/// A loopback HTTP server answering `soak-egress-ok` (the egress target).
fn egress_target() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = stream;
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\nConnection: close\r\n\r\nsoak-egress-ok",
                );
            });
        }
    });
    format!("127.0.0.1:{}", addr.port())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn draw(samples: &[Sample], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1000, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((4, 1));
    let end = samples.last().map_or(1.0, |s| s.second).max(1.0);
    type Series = (&'static str, fn(&Sample) -> f64, RGBColor);
    let rows: [(&str, Vec<Series>); 4] = [
        ("RSS (MiB)", vec![("RSS", |s| s.rss_mib, BLUE)]),
        (
            "descriptors and threads",
            vec![
                ("fds", |s| s.fds as f64, RED),
                ("threads", |s| s.threads as f64, GREEN),
            ],
        ),
        (
            "CPU (% of one core)",
            vec![("CPU", |s| s.cpu_percent, MAGENTA)],
        ),
        (
            "GET latency (ms)",
            vec![("p50", |s| s.p50_ms, BLACK), ("p99", |s| s.p99_ms, RED)],
        ),
    ];
    for (panel, (title, series)) in panels.iter().zip(rows) {
        let top = samples
            .iter()
            .flat_map(|s| series.iter().map(move |(_, f, _)| f(s)))
            .fold(1.0_f64, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(panel)
            .caption(title, ("sans-serif", 18))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..end, 0.0..top)?;
        chart.configure_mesh().x_desc("seconds").draw()?;
        for (name, f, color) in series {
            chart
                .draw_series(LineSeries::new(
                    samples.iter().map(|s| (s.second, f(s))),
                    color,
                ))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        }
        chart.configure_series_labels().border_style(BLACK).draw()?;
    }
    root.present()?;
    Ok(())
}

fn main() {
    let mut seconds = 120u64;
    let mut check = false;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--seconds" => {
                seconds = args
                    .get(i + 1)
                    .and_then(|s| s.parse().ok())
                    .expect("--seconds N");
                i += 1;
            }
            "--check" => check = true,
            _ => {} // cargo bench passes --bench
        }
        i += 1;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let verdict_ok = runtime.block_on(soak(seconds));
    if check && !verdict_ok {
        eprintln!("soak: the verdict failed (see above)");
        std::process::exit(1);
    }
}

async fn soak(seconds: u64) -> bool {
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/soak");
    std::fs::create_dir_all(&out).expect("target/soak");
    let data = std::env::temp_dir().join(format!("soak-data-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    std::fs::create_dir_all(&data).unwrap();
    let target = egress_target();
    let (child, base) = test_support::local::start_binary(
        env!("CARGO_BIN_EXE_createos-local"),
        [
            "--port",
            "0",
            "--data-dir",
            &data.display().to_string(),
            "--egress",
            &target,
            "--finished-ttl",
            "5",
        ],
        KEY,
    );
    let engine = Engine { child, base, data };
    let pid = engine.child.id();
    let addr = engine.base.trim_start_matches("http://").to_string();
    let client = Client {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap(),
        base: engine.base.clone(),
    };
    // The sandboxes' commands reach the target through the proxy
    // (HTTP_PROXY is set for them); the URL is in their environment.
    let c = client.clone();
    let target_url = format!("http://{target}/");
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let mut workers = Vec::new();
    for kind in 0..3usize {
        let (c, stop, tally, addr, target_url) = (
            c.clone(),
            stop.clone(),
            tally.clone(),
            addr.clone(),
            target_url.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut round = 0;
            while !stop.load(Ordering::Relaxed) {
                let outcome = match kind {
                    0 => createos_round(&c, &target_url, round).await,
                    1 => daytona_round(&c).await,
                    _ => hostile_round(&c, &addr, round).await,
                };
                tally.note(kind, outcome);
                round += 1;
            }
        }));
    }
    // The probe: a plain request every 100 ms, its latency per second.
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::default();
    let probe = {
        let (c, stop, latencies) = (client.clone(), stop.clone(), latencies.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let answered = c
                    .call(Method::GET, "/v1/sandboxes/probe-none", None)
                    .await
                    .is_some();
                let ms = if answered {
                    started.elapsed().as_secs_f64() * 1000.0
                } else {
                    30_000.0
                };
                latencies.lock().unwrap().push(ms);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let ticks_per_second = 100.0; // USER_HZ on Linux
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut last_ticks = cpu_ticks(pid);
    let baseline_fds = fd_count(pid);
    let baseline_threads = proc_status(pid, "Threads:");
    while started.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let ticks = cpu_ticks(pid);
        let mut lat = std::mem::take(&mut *latencies.lock().unwrap());
        lat.sort_by(|a, b| a.total_cmp(b));
        samples.push(Sample {
            second: started.elapsed().as_secs_f64(),
            rss_mib: proc_status(pid, "VmRSS:") as f64 / 1024.0,
            fds: fd_count(pid),
            threads: proc_status(pid, "Threads:"),
            cpu_percent: (ticks - last_ticks) as f64 / ticks_per_second * 100.0,
            p50_ms: percentile(&lat, 0.5),
            p99_ms: percentile(&lat, 0.99),
        });
        last_ticks = ticks;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(120), w).await;
    }
    let _ = probe.await;
    // Quiet again: what the engine holds once the load and its clients
    // (and their pooled connections) are gone.
    drop(c);
    drop(client);
    let client = Client {
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap(),
        base: engine.base.clone(),
    };
    // Idle worker threads of a tokio blocking pool leave only after their
    // keep-alive (10 s by default), so "once quiet" is the first second
    // (within 30 s) at which descriptors and threads are back near where
    // they started; a real leak never gets there and is reported.
    let quiet_started = Instant::now();
    let (mut settled_fds, mut settled_threads);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        settled_fds = fd_count(pid);
        settled_threads = proc_status(pid, "Threads:");
        let settled = settled_fds <= baseline_fds + 8 && settled_threads <= baseline_threads + 4;
        if settled || quiet_started.elapsed() >= Duration::from_secs(30) {
            break;
        }
    }
    let quiet_after = quiet_started.elapsed().as_secs();
    let settled_rss = proc_status(pid, "VmRSS:") as f64 / 1024.0;
    let (_, listed) = client
        .call(Method::GET, "/v1/sandboxes", None)
        .await
        .unwrap_or_default();
    let left_sandboxes = listed["data"].as_array().map_or(0, |a| a.len());

    // The end: an orderly stop, and nothing of any sandbox left.
    let mut child = engine.child;
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let stopped = child.wait().map(|s| s.success()).unwrap_or(false);
    let leftover_mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(str::to_owned))
        .filter(|m| m.starts_with(&engine.data.display().to_string()))
        .collect();
    let leftover_loops: Vec<String> = std::fs::read_dir("/sys/block")
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
                .filter(|b| b.starts_with(&engine.data.display().to_string()))
                .collect()
        })
        .unwrap_or_default();
    let leftover_processes: Vec<u32> = test_support::procs::live()
        .into_iter()
        .filter(|p| p.cmdline_contains(&engine.data.display().to_string()))
        .map(|p| p.pid)
        .collect();

    // Flat after warm-up: the second half's peak RSS within 25 % (and
    // 16 MiB) of the first half's after the first tenth.
    let warm = samples.len() / 10;
    let mid = warm + (samples.len() - warm) / 2;
    let peak = |s: &[Sample]| s.iter().map(|x| x.rss_mib).fold(0.0, f64::max);
    let (first_peak, second_peak) = (peak(&samples[warm..mid]), peak(&samples[mid..]));
    let flat = second_peak <= first_peak * 1.25 + 16.0;
    let no_fd_leak = settled_fds <= baseline_fds + 8;
    let no_thread_leak = settled_threads <= baseline_threads + 4;
    let all_gone = stopped
        && leftover_mounts.is_empty()
        && leftover_loops.is_empty()
        && leftover_processes.is_empty();
    let mut all_lat: Vec<f64> = samples.iter().map(|s| s.p99_ms).collect();
    all_lat.sort_by(|a, b| a.total_cmp(b));

    let mut csv = String::from("second,rss_mib,fds,threads,cpu_percent,p50_ms,p99_ms\n");
    for s in &samples {
        csv.push_str(&format!(
            "{:.1},{:.1},{},{},{:.1},{:.2},{:.2}\n",
            s.second, s.rss_mib, s.fds, s.threads, s.cpu_percent, s.p50_ms, s.p99_ms
        ));
    }
    std::fs::write(out.join("soak.csv"), csv).expect("soak.csv");
    if let Err(e) = draw(&samples, &out.join("soak.svg")) {
        eprintln!("soak: the plot could not be drawn: {e}");
    }
    let cpu: f64 = samples.iter().map(|s| s.cpu_percent).sum::<f64>() / samples.len().max(1) as f64;
    println!("### Soak of createos-local, {seconds} s\n");
    println!("| figure | value |\n|---|---|");
    for (kind, name) in ["CreateOS life", "Daytona life", "hostile"]
        .iter()
        .enumerate()
    {
        println!(
            "| {name} rounds (as expected / refused 429-503 / other / no answer) | {} |",
            tally.line(kind)
        );
    }
    println!("| RSS peak, first half / second half after warm-up | {first_peak:.1} / {second_peak:.1} MiB |");
    println!("| quiet again (descriptors and threads back near the start) after | {quiet_after} s of 30 |");
    println!("| RSS once quiet | {settled_rss:.1} MiB |");
    println!(
        "| descriptors: start / peak / once quiet | {baseline_fds} / {} / {settled_fds} |",
        samples.iter().map(|s| s.fds).max().unwrap_or(0)
    );
    println!(
        "| threads: start / peak / once quiet | {baseline_threads} / {} / {settled_threads} |",
        samples.iter().map(|s| s.threads).max().unwrap_or(0)
    );
    println!("| CPU, mean | {cpu:.0} % of one core |");
    println!(
        "| GET latency p99 per second: median / worst | {:.1} / {:.1} ms |",
        percentile(&all_lat, 0.5),
        percentile(&all_lat, 1.0)
    );
    println!("| sandboxes left listed once quiet | {left_sandboxes} |");
    println!(
        "| after the stop: mounts / loop devices / processes of its sandboxes | {} / {} / {} |",
        leftover_mounts.len(),
        leftover_loops.len(),
        leftover_processes.len()
    );
    println!("\nplot: {}", out.join("soak.svg").display());
    let answered = Tally::sum(&tally.failed) == 0;
    let as_expected = Tally::sum(&tally.wrong) == 0;
    let _ = Tally::sum(&tally.refused);
    let verdict = flat && no_fd_leak && no_thread_leak && all_gone && answered && as_expected;
    println!(
        "verdict: {} (flat after warm-up: {flat}; no descriptor leak: {no_fd_leak}; no thread leak: \
         {no_thread_leak}; every sandbox gone after the stop: {all_gone}; every round answered: \
         {answered}, as expected: {as_expected})",
        if verdict { "PASS" } else { "FAIL" },
    );
    let _ = std::fs::remove_dir_all(&engine.data);
    verdict
}
