//! createos-local under load: the server's memory around the bursts of
//! issue 19 (before, peak, and a few seconds after), and the latency of a
//! normal request while the server is loaded. Prints a Markdown table for
//! BENCHMARKS.md ("createos-local under load"); nothing is asserted except
//! that the work itself succeeded.
//!
//! The server is the `createos-local` binary in its own process, so that its
//! memory is measured alone (`VmRSS`, and `VmHWM` reset through
//! `/proc/PID/clear_refs` before each burst).
//!
//! `cargo bench -p sandbox-engine --bench load`

use std::process::Child;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::StatusCode;
use serde_json::{json, Value};

const KEY: &str = "bench-key";

struct Server {
    child: Child,
    base: String,
    http: reqwest::Client,
}

impl Server {
    fn start() -> Self {
        let (child, base) = test_support::local::start_binary(
            env!("CARGO_BIN_EXE_createos-local"),
            ["--port", "0"],
            KEY,
        );
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(600))
            .build()
            .expect("client");
        Self { child, base, http }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn status_kib(&self, field: &str) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    fn reset_peak(&self) {
        let _ = std::fs::write(format!("/proc/{}/clear_refs", self.pid()), "5");
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut rb = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("X-Api-Key", KEY);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        match rb.send().await {
            Ok(resp) => {
                let st = resp.status().as_u16();
                let v = resp.json().await.unwrap_or(Value::Null);
                (st, v)
            }
            Err(_) => (0, Value::Null),
        }
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
                Some(json!({"shape": "s-1vcpu-1gb"})),
            )
            .await;
        assert_eq!(st, 201, "{v}");
        let id = v["data"]["id"].as_str().expect("id").to_string();
        loop {
            let (_, v) = self
                .call(reqwest::Method::GET, &format!("/v1/sandboxes/{id}"), None)
                .await;
            if v["data"]["status"] == "running" {
                return id;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn exec(&self, sb: &str, script: &str) -> Value {
        let (st, v) = self
            .call(
                reqwest::Method::POST,
                &format!("/v1/sandboxes/{sb}/exec"),
                Some(json!({"cmd": "/bin/sh", "args": ["-c", script]})),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        v["data"]["result"].clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(self.child.id() as i32).expect("pid"),
            rustix::process::Signal::TERM,
        );
        let _ = self.child.wait();
    }
}

struct Burst {
    what: &'static str,
    outcome: String,
    before: u64,
    peak: u64,
    after: u64,
}

async fn burst<F: std::future::Future<Output = String>>(
    s: &Server,
    what: &'static str,
    work: F,
) -> Burst {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = s.status_kib("VmRSS:");
    s.reset_peak();
    let outcome = work.await;
    let peak = s.status_kib("VmHWM:");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = s.status_kib("VmRSS:");
    eprintln!("burst: {what}: {outcome}");
    Burst {
        what,
        outcome,
        before,
        peak,
        after,
    }
}

/// Sends `calls` at once and tallies their statuses.
async fn tally_responses(
    calls: impl IntoIterator<
        Item = impl std::future::Future<Output = reqwest::Result<reqwest::Response>>,
    >,
) -> String {
    let statuses: Vec<u16> = futures_util::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.map_or(0, |r| r.status().as_u16()))
        .collect();
    tally(&statuses)
}

fn tally(statuses: &[u16]) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for s in statuses {
        *counts.entry(*s).or_insert(0) += 1;
    }
    counts
        .iter()
        .map(|(s, n)| {
            if *s == 0 {
                format!("{n}× transport error")
            } else {
                format!("{n}× {s}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

struct Latency {
    what: &'static str,
    samples: Vec<Duration>,
    errors: usize,
}

impl Latency {
    fn pct(&self, p: f64) -> f64 {
        let mut v = self.samples.clone();
        v.sort();
        if v.is_empty() {
            return f64::NAN;
        }
        let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
        v[i].as_secs_f64() * 1000.0
    }
}

/// Sends `GET /v1/sandboxes/{sb}` on a new connection every 5 ms until
/// `load` completes; returns the latencies.
async fn probe_during<F: std::future::Future<Output = ()>>(
    s: &Server,
    sb: &str,
    what: &'static str,
    load: F,
) -> Latency {
    let probe = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let url = format!("{}/v1/sandboxes/{sb}", s.base);
    let done = std::sync::atomic::AtomicBool::new(false);
    let sampler = async {
        let mut samples = Vec::new();
        let mut errors = 0;
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            let t = Instant::now();
            match probe.get(&url).header("X-Api-Key", KEY).send().await {
                Ok(r) if r.status() == StatusCode::OK => {
                    let _ = r.bytes().await;
                    samples.push(t.elapsed());
                }
                _ => errors += 1,
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (samples, errors)
    };
    let loader = async {
        load.await;
        done.store(true, std::sync::atomic::Ordering::SeqCst);
    };
    let ((samples, errors), ()) = tokio::join!(sampler, loader);
    let l = Latency {
        what,
        samples,
        errors,
    };
    eprintln!(
        "latency: {what}: n={} p50={:.1} ms p99={:.1} ms max={:.1} ms errors={}",
        l.samples.len(),
        l.pct(0.5),
        l.pct(0.99),
        l.pct(1.0),
        l.errors
    );
    l
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let s = Server::start();
    let started = Instant::now();
    let sb = s.sandbox().await;
    let mut bursts = Vec::new();

    // 1. Process creation with a 50 MB argv, 20 at once.
    let big_argv = Bytes::from(
        json!({"cmd": "/bin/true", "args": ["x".repeat(50_000_000)]})
            .to_string()
            .into_bytes(),
    );
    bursts.push(
        burst(&s, "20 process creations with a 50 MB argv", async {
            let calls = (0..20).map(|_| {
                s.http
                    .post(format!("{}/v1/sandboxes/{sb}/processes", s.base))
                    .header("X-Api-Key", KEY)
                    .header("Content-Type", "application/json")
                    .body(big_argv.clone())
                    .send()
            });
            tally_responses(calls).await
        })
        .await,
    );
    drop(big_argv);

    // 2. Eight 200 MB uploads at once.
    let upload = Bytes::from(vec![b'u'; 200_000_000]);
    bursts.push(
        burst(&s, "8 uploads of 200 MB at once", async {
            let calls = (0..8).map(|i| {
                s.http
                    .put(format!(
                        "{}/v1/sandboxes/{sb}/files?path=/tmp/upload{i}",
                        s.base
                    ))
                    .header("X-Api-Key", KEY)
                    .body(upload.clone())
                    .send()
            });
            tally_responses(calls).await
        })
        .await,
    );
    drop(upload);
    s.exec(&sb, "rm -f /tmp/upload*").await;

    // 3. Four execs of 60 MB output at once.
    bursts.push(
        burst(&s, "4 execs of 60 MB output at once", async {
            let calls = (0..4).map(|_| s.exec(&sb, "head -c 60000000 /dev/zero | tr '\\0' a"));
            let results = futures_util::future::join_all(calls).await;
            let kept: Vec<String> = results
                .iter()
                .map(|r| {
                    format!(
                        "{} MiB kept, truncated {}",
                        r["stdout"].as_str().map_or(0, str::len) >> 20,
                        r["stdout_truncated"]
                    )
                })
                .collect();
            kept.join("; ")
        })
        .await,
    );

    // 4. GET of a 4 GB sparse file.
    s.exec(&sb, "truncate -s 4G /tmp/sparse").await;
    bursts.push(
        burst(&s, "GET of a 4 GB sparse file", async {
            let mut resp = s
                .http
                .get(format!(
                    "{}/v1/sandboxes/{sb}/files?path=/tmp/sparse",
                    s.base
                ))
                .header("X-Api-Key", KEY)
                .send()
                .await
                .expect("download");
            let st = resp.status();
            let mut n = 0u64;
            while let Ok(Some(c)) = resp.chunk().await {
                n += c.len() as u64;
            }
            format!("{st}, {n} bytes streamed")
        })
        .await,
    );
    s.exec(&sb, "rm -f /tmp/sparse").await;

    // Latency.
    let mut lat = Vec::new();
    lat.push(
        probe_during(&s, &sb, "no load", async {
            tokio::time::sleep(Duration::from_secs(3)).await;
        })
        .await,
    );
    let addr = s.base.trim_start_matches("http://").to_string();
    lat.push(
        probe_during(&s, &sb, "300 idle connections + 100 execs", async {
            let mut idle = Vec::new();
            for _ in 0..300 {
                if let Ok(c) = tokio::net::TcpStream::connect(&addr).await {
                    idle.push(c);
                }
            }
            let execs = (0..100).map(|_| s.exec(&sb, "seq 1 20000 >/dev/null; sleep 1; echo done"));
            let results = futures_util::future::join_all(execs).await;
            if let Some(bad) = results.iter().find(|r| r["stdout"] != "done\n") {
                panic!("an exec under load went wrong: {bad}");
            }
            drop(idle);
        })
        .await,
    );
    let created = std::sync::Mutex::new(Vec::new());
    lat.push(
        probe_during(&s, &sb, "200 processes being created", async {
            let path = format!("/v1/sandboxes/{sb}/processes");
            let calls = (0..200).map(|_| {
                s.call(
                    reqwest::Method::POST,
                    &path,
                    Some(json!({"cmd": "/bin/sleep", "args": ["30"]})),
                )
            });
            for (st, v) in futures_util::future::join_all(calls).await {
                assert_eq!(st, 201, "{v}");
                if let Some(id) = v["data"]["process_id"].as_str() {
                    created.lock().expect("lock").push(id.to_string());
                }
            }
        })
        .await,
    );
    let ids = created.lock().expect("lock").clone();
    let paths: Vec<String> = ids
        .iter()
        .map(|id| format!("/v1/sandboxes/{sb}/processes/{id}?grace_ms=100"))
        .collect();
    let deletes = paths
        .iter()
        .map(|p| s.call(reqwest::Method::DELETE, p, None));
    futures_util::future::join_all(deletes).await;

    let mib = |k: u64| k as f64 / 1024.0;
    println!("### Memory (server RSS, MiB)\n");
    println!("| burst | outcome | before | peak | after (3 s) |");
    println!("|---|---|---:|---:|---:|");
    for b in &bursts {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} |",
            b.what,
            b.outcome,
            mib(b.before),
            mib(b.peak),
            mib(b.after)
        );
    }
    println!("\n### Latency of `GET /v1/sandboxes/{{id}}` (new connection each, ms)\n");
    println!("| while | requests | p50 | p99 | max | failed |");
    println!("|---|---:|---:|---:|---:|---:|");
    for l in &lat {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {} |",
            l.what,
            l.samples.len(),
            l.pct(0.5),
            l.pct(0.99),
            l.pct(1.0),
            l.errors
        );
    }
    eprintln!("whole run {:.1} s", started.elapsed().as_secs_f64());
}
