//! `cargo bench -p createos-provider --bench provider` (after
//! `./build.sh`): the figures of BENCHMARKS.md, each measured in this run
//! next to its baseline.
//!
//! 1. cold start: compile once; instantiate per call vs a Node.js plugin
//!    worker process answering one JSON-RPC request over stdio;
//! 2. per-command overhead: `execute` of `true` through the component vs a
//!    native Rust client making the same requests to the same backend;
//! 3. output path: 64 MiB of output (split UTF-8 included), component vs
//!    the same decoding code run natively, and the instance's memory
//!    high-water with the 4 Mi character cap; with `BENCH_COMPARE_WASM`
//!    naming another build of the component (another `opt-level`, say),
//!    that build and this one in turns on the same output path;
//! 4. rate budget: `execute` of `true` against an instant backend under
//!    CreateOS's declared limit vs the old fixed 300 ms gap, and 300
//!    commands against a backend enforcing the limit (429s, floor);
//! 5. cancellation and exit latency;
//! 6. component size and instance memory;
//! 7. lease store: operations per second through the `LeaseStore` trait
//!    and the latency a store adds to each command, PostgreSQL (a
//!    throwaway cluster, fsync on) measured against an SQLite file;
//! 8. the `sandbox` CLI end to end (`lease exec` on a held lease, `run`)
//!    next to a bare `bwrap ... true` in the same run, with a per-stage
//!    breakdown and cold vs warm start (needs `cargo build --release -p
//!    sandbox-host`).
//!
//! Arguments that do not start with `-` select sections by number or name
//! (`cargo bench -p createos-provider --bench provider -- 2 output`).
//! Targets are reported, never asserted; a wrong result (bad output,
//! failed command) panics.

// `ProviderError` is the WIT variant (its cleanup case carries the partial
// output); it is returned once per command, so its size is no concern.
#![allow(clippy::result_large_err)]

#[path = "provider/net.rs"]
mod net;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use net::{ExitStamp, NativeClient, Recorder, Replay};
use sandbox_engine::{BackgroundServer, Server};
use sandbox_host::types::{
    EnvironmentContext, ExecuteRequest, ExecuteResult, Lease, ProviderError,
};
use sandbox_host::{
    new_engine, open_store, CancelToken, Environment, Guard, HostInstance, HostOptions, LeaseState,
    LeaseStore, Liveness, NetworkTransport, Operation, Policy, ProviderComponent, RateLimit,
    RequestPacer, SandboxRuntime, ScriptedChunk, ScriptedResponse, ScriptedTransport, Secrets,
    SqliteLeases, ThrowawayPostgres, Transport,
};
use test_support::RequestExt;

const KEY: &str = "bench-key-5c0ffee";
const MIB: u64 = 1024 * 1024;
/// The output of section 3: 64 MiB.
const OUTPUT_BYTES: u64 = 64 * MIB;
/// The repeated line of section 3 (39 bytes: 1-, 2-, 3- and 4-byte characters,
/// so reads of any power-of-two size split characters).
const OUTPUT_LINE: &str = "héllo € 𝄞 wörld — 0123456789\n";

// ---------------------------------------------------------------- report

#[derive(Clone, Copy, PartialEq, Eq)]
enum Status {
    Met,
    Missed,
    Info,
    Skipped,
}

struct Row {
    section: &'static str,
    figure: String,
    value: String,
    baseline: String,
    ratio: String,
    target: String,
    status: Status,
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
    notes: Vec<String>,
}

impl Report {
    #[allow(clippy::too_many_arguments)]
    fn row(
        &mut self,
        section: &'static str,
        figure: impl Into<String>,
        value: impl Into<String>,
        baseline: impl Into<String>,
        ratio: impl Into<String>,
        target: impl Into<String>,
        status: Status,
    ) {
        let row = Row {
            section,
            figure: figure.into(),
            value: value.into(),
            baseline: baseline.into(),
            ratio: ratio.into(),
            target: target.into(),
            status,
        };
        eprintln!(
            "  [{}] {}: {} | {} | {}",
            row.section, row.figure, row.value, row.baseline, row.ratio
        );
        self.rows.push(row);
    }

    fn info(&mut self, section: &'static str, figure: impl Into<String>, value: impl Into<String>) {
        self.row(section, figure, value, "", "", "", Status::Info);
    }

    fn note(&mut self, note: impl Into<String>) {
        let note = note.into();
        eprintln!("  note: {note}");
        self.notes.push(note);
    }

    fn print(&self, machine: &str, total: Duration) {
        println!();
        println!("## Results ({machine}; whole run {:.1} s)", secs(total));
        println!();
        println!("| # | figure | measured | baseline | ratio | target | status |");
        println!("|---|---|---|---|---|---|---|");
        for r in &self.rows {
            let status = match r.status {
                Status::Met => "met",
                Status::Missed => "**missed**",
                Status::Info => "",
                Status::Skipped => "skipped",
            };
            println!(
                "| {} | {} | {} | {} | {} | {} | {} |",
                r.section, r.figure, r.value, r.baseline, r.ratio, r.target, status
            );
        }
        if !self.notes.is_empty() {
            println!();
            for n in &self.notes {
                println!("- {n}");
            }
        }
    }
}

fn met(ok: bool) -> Status {
    if ok {
        Status::Met
    } else {
        Status::Missed
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// A duration with a unit that keeps three significant digits or so.
fn fmt(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

fn median(samples: &[Duration]) -> Duration {
    let mut v = samples.to_vec();
    v.sort();
    v[v.len() / 2]
}

fn max(samples: &[Duration]) -> Duration {
    samples.iter().copied().max().unwrap_or_default()
}

fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64()
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    format!("{cores} cores, {cpu}, {date}")
}

// ---------------------------------------------------------------- setup

struct Bench {
    component: ProviderComponent,
    compile: Duration,
    wasm: PathBuf,
    server: BackgroundServer,
    base: String,
    ctx: EnvironmentContext,
    lease: Lease,
    sandbox: String,
}

impl Bench {
    /// A guard for the backend's origin spending `limit` (its own budget)
    /// in front of `inner`.
    fn guard(&self, limit: Option<RateLimit>, inner: Arc<dyn Transport>) -> Arc<Guard> {
        let policy = Policy::for_origin(&self.base)
            .unwrap()
            .with_secret_header("X-Api-Key", KEY)
            .unwrap()
            .with_rate_limit(limit)
            .with_request_pacer(RequestPacer::in_memory());
        Arc::new(Guard::new(policy, inner))
    }

    fn network(&self) -> Arc<Guard> {
        self.guard(None, Arc::new(NetworkTransport::new()))
    }

    fn execute(
        &self,
        options: HostOptions,
        request: &ExecuteRequest,
    ) -> Result<ExecuteResult, ProviderError> {
        self.component
            .instantiate(options)
            .unwrap()
            .execute(&self.ctx, &self.lease, request)
            .unwrap()
    }

    fn requests_recorded(&self) -> usize {
        self.server.faults().requests().len()
    }
}

fn request(program: &str, args: &[&str], timeout_ms: Option<u64>) -> ExecuteRequest {
    test_support::command(program, args).timeout(timeout_ms)
}

fn setup() -> Bench {
    let wasm = test_support::built_component("createos_provider.wasm");
    if !wasm.exists() {
        eprintln!("{} is missing: run ./build.sh first", wasm.display());
        std::process::exit(2);
    }
    let engine = new_engine().expect("engine");
    let started = Instant::now();
    let component = ProviderComponent::load(&engine, &wasm).expect("the component loads");
    let compile = started.elapsed();
    let server = BackgroundServer::start(
        Server::builder()
            .api_key(KEY)
            .quiet(true)
            // Section 3's 64 MiB must stay replayable (and a slow reader
            // must not lose output): keep it all.
            .journal_capacity((OUTPUT_BYTES + 32 * MIB) as usize)
            // …and replayable after the native run, however long a loaded
            // machine makes it (the default keeps a finished process 60 s).
            .finished_retention(Duration::from_secs(3600), 64),
    )
    .expect("createos-local starts");
    let base = server.base_url();
    let ctx = EnvironmentContext {
        driver_key: "createos".into(),
        company_id: "company".into(),
        environment_id: "env-bench".into(),
        issue_id: None,
        config: serde_json::json!({
            "apiUrl": base,
            "timeoutMs": 120_000,
            "requestTimeoutMs": 30_000,
        })
        .to_string(),
    };
    let mut bench = Bench {
        component,
        compile,
        wasm,
        server,
        base,
        ctx,
        lease: Lease {
            provider_lease_id: String::new(),
            metadata: String::new(),
            expires_at: None,
        },
        sandbox: String::new(),
    };
    let lease = bench
        .component
        .instantiate(HostOptions::new().with_transport(bench.network()))
        .unwrap()
        .acquire_lease(&bench.ctx, &test_support::acquire("bench"))
        .unwrap()
        .expect("a lease on the local backend");
    bench.sandbox = lease.provider_lease_id.clone();
    bench.lease = lease;
    bench
}

// ---------------------------------------------------------------- 1

fn cold_start(b: &Bench, report: &mut Report) {
    const N: usize = 200;
    report.info(
        "1",
        "compile + link + pre-instantiate the component (once)",
        fmt(b.compile),
    );
    for _ in 0..10 {
        drop(b.component.instantiate(HostOptions::new()).unwrap());
    }
    let mut instantiate = Vec::with_capacity(N);
    let mut with_describe = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        let instance = b.component.instantiate(HostOptions::new()).unwrap();
        instantiate.push(t.elapsed());
        drop(instance);
        let t = Instant::now();
        let mut instance = b.component.instantiate(HostOptions::new()).unwrap();
        let description = instance.describe().unwrap();
        with_describe.push(t.elapsed());
        assert_eq!(description.driver_key, "createos");
    }
    let node = node_worker();
    let (inst, desc) = (median(&instantiate), median(&with_describe));
    match node {
        Ok(node) => {
            let n = median(&node);
            let r1 = secs(n) / secs(inst);
            let r2 = secs(n) / secs(desc);
            let base = format!("Node worker spawn → answer {}", fmt(n));
            report.row(
                "1",
                format!("instantiate, per call (median of {N})"),
                fmt(inst),
                base.clone(),
                format!("{r1:.0}x faster"),
                "≥100x",
                met(r1 >= 100.0),
            );
            report.row(
                "1",
                "instantiate + `describe` (one answer, like the worker)",
                fmt(desc),
                base,
                format!("{r2:.0}x faster"),
                "≥100x",
                met(r2 >= 100.0),
            );
        }
        Err(why) => {
            report.row(
                "1",
                format!("instantiate, per call (median of {N})"),
                fmt(inst),
                format!("Node baseline skipped: {why}"),
                "",
                "≥100x",
                Status::Skipped,
            );
            report.info("1", "instantiate + `describe`", fmt(desc));
        }
    }
}

/// Spawn → answer of a Node worker process loading a no-op plugin and
/// answering one JSON-RPC request over stdio.
fn node_worker() -> Result<Vec<Duration>, String> {
    const N: usize = 10;
    let version = Command::new("node")
        .arg("--version")
        .output()
        .map_err(|e| format!("`node` not found ({e})"))?;
    if !version.status.success() {
        return Err("`node --version` failed".into());
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/node");
    let worker = dir.join("worker.js");
    let plugin = dir.join("noop-plugin.js");
    let mut times = Vec::new();
    // One warm-up for the file cache, then N measured.
    for i in 0..=N {
        let t = Instant::now();
        let mut child = Command::new("node")
            .arg(&worker)
            .arg(&plugin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"describe\",\"params\":{}}\n")
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        let elapsed = t.elapsed();
        drop(stdin);
        let _ = child.wait();
        if !line.contains("\"result\"") || !line.contains("noop") {
            return Err(format!("unexpected worker answer {line:?}"));
        }
        if i > 0 {
            times.push(elapsed);
        }
    }
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    eprintln!("  node {version}: {} runs", times.len());
    Ok(times)
}

// ---------------------------------------------------------------- 2

fn per_command(b: &Bench, report: &mut Report) {
    const WARMUP: usize = 3;
    const N: usize = 30;
    let request = request("true", &[], None);
    let body = net::create_body(&request);
    // A new connection per request, as the host's wasi-http transport does.
    // (A ureq keep-alive agent was tried too: it stalled about 40 ms per
    // request on reused connections here, so it is no fair baseline.)
    let native_client = NativeClient::new(&b.base, KEY, false);
    let guard = b.network();
    let (mut component, mut native) = (vec![], vec![]);
    let (mut component_requests, mut native_requests) = (0, 0);
    for i in 0..WARMUP + N {
        let before = b.requests_recorded();
        let t = Instant::now();
        let result = b
            .execute(HostOptions::new().with_transport(guard.clone()), &request)
            .expect("`true` runs");
        let took = t.elapsed();
        assert_eq!(result.exit_code, Some(0), "{result:?}");
        let middle = b.requests_recorded();

        let t = Instant::now();
        let outcome = native_client.run(&b.sandbox, &body).expect("native run");
        let took_native = t.elapsed();
        assert!(matches!(
            outcome.exit,
            Some(createos_provider::frames::ExitStatus::Code(0))
        ));
        let after = b.requests_recorded();
        if i >= WARMUP {
            component.push(took);
            native.push(took_native);
            component_requests += middle - before;
            native_requests += after - middle;
        }
    }
    let (c, n) = (median(&component), median(&native));
    let ratio = secs(c) / secs(n);
    report.row(
        "2",
        format!("`execute` of `true`, instantiate included (median of {N}, spacing 0)"),
        fmt(c),
        format!("native ureq client, same requests: {}", fmt(n)),
        format!("{ratio:.2}x"),
        "≤1.3x",
        met(ratio <= 1.3),
    );
    report.row(
        "2",
        "component overhead per command (median difference)",
        format!("+{}", fmt(c.saturating_sub(n))),
        format!(
            "means {} vs {}",
            fmt(component.iter().sum::<Duration>() / N as u32),
            fmt(native.iter().sum::<Duration>() / N as u32)
        ),
        "",
        "",
        Status::Info,
    );
    report.row(
        "2",
        "HTTP requests per command",
        format!("{:.1}", component_requests as f64 / N as f64),
        format!("native: {:.1}", native_requests as f64 / N as f64),
        "",
        "",
        Status::Info,
    );
}

// ---------------------------------------------------------------- 3

/// The expected text of section 3: `OUTPUT_LINE` repeated, cut at
/// `OUTPUT_BYTES` (possibly inside a character, which decodes to U+FFFD).
fn expected_output() -> String {
    let line = OUTPUT_LINE.as_bytes();
    let bytes: Vec<u8> = line
        .iter()
        .copied()
        .cycle()
        .take(OUTPUT_BYTES as usize)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn last_chars(text: &str, n: usize) -> &str {
    let count = text.chars().count();
    if count <= n {
        return text;
    }
    let cut = text.char_indices().nth(count - n).map_or(0, |(i, _)| i);
    &text[cut..]
}

fn output_request() -> ExecuteRequest {
    let script = format!(
        "yes '{}' | head -c {OUTPUT_BYTES}",
        OUTPUT_LINE.trim_end_matches('\n')
    );
    request("/bin/sh", &["-c", &script], Some(120_000))
}

/// Runs `request` through the component with a byte-counting sink.
fn counted(
    b: &Bench,
    transport: Arc<dyn Transport>,
    memory: Option<usize>,
    request: &ExecuteRequest,
) -> (
    Duration,
    Result<Result<ExecuteResult, ProviderError>, String>,
    u64,
) {
    counted_on(b, &b.component, transport, memory, request)
}

/// [`counted`] through `component` (this run's build or the one
/// `BENCH_COMPARE_WASM` names).
fn counted_on(
    b: &Bench,
    component: &ProviderComponent,
    transport: Arc<dyn Transport>,
    memory: Option<usize>,
    request: &ExecuteRequest,
) -> (
    Duration,
    Result<Result<ExecuteResult, ProviderError>, String>,
    u64,
) {
    let emitted = Arc::new(AtomicU64::new(0));
    let counter = emitted.clone();
    let mut options = HostOptions::new()
        .with_transport(transport)
        .with_output(move |_, chunk| {
            counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        });
    if let Some(bytes) = memory {
        options = options.with_memory_limit(bytes);
    }
    let t = Instant::now();
    let outcome = match component.instantiate(options) {
        Ok(mut instance) => instance
            .execute(&b.ctx, &b.lease, request)
            .map_err(|e| format!("{e:#}")),
        Err(e) => Err(format!("{e:#}")),
    };
    (t.elapsed(), outcome, emitted.load(Ordering::Relaxed))
}

fn check_output(result: &ExecuteResult, expected_tail: &str, what: &str) {
    assert_eq!(result.exit_code, Some(0), "{what}: exit");
    assert!(result.output_truncated, "{what}: truncation flag");
    assert!(
        result.stdout == expected_tail,
        "{what}: the tail differs from the last 4 Mi characters ({} vs {} bytes)",
        result.stdout.len(),
        expected_tail.len()
    );
}

fn output_path(b: &Bench, report: &mut Report) {
    const REPEAT: usize = 3;
    let request = output_request();
    let expected = expected_output();
    let tail = last_chars(&expected, provider_sdk::output::MAX_OUTPUT_CHARS);
    // Live output is the bytes printed (contract 0.4.0), even where the
    // cut at `OUTPUT_BYTES` falls inside a character.
    let text_bytes = OUTPUT_BYTES;

    // End to end against createos-local: the component…
    let (e2e, outcome, emitted) = counted(b, b.network(), None, &request);
    let result = outcome.unwrap().expect("the 64 MiB command runs");
    check_output(&result, tail, "component, end to end");
    assert_eq!(emitted, text_bytes, "component: live output bytes");
    // …and the native client with the same decoding code.
    let body = net::create_body(&request);
    let client = NativeClient::new(&b.base, KEY, false);
    let t = Instant::now();
    let native = client.run(&b.sandbox, &body).expect("native 64 MiB run");
    let native_e2e = t.elapsed();
    assert_eq!(native.stdout, tail, "native, end to end: tail");
    assert!(native.truncated);
    assert_eq!(native.emitted, text_bytes);
    // The bytes every replay decodes: the `/connect` body of the same
    // command, recorded by its first reader (the engine keeps no frame a
    // reader took, so the component's own run cannot be read again).
    let ndjson = Bytes::from(
        client
            .record(&b.sandbox, &body)
            .expect("a recorded run of the same command"),
    );

    // Decoding only, over the same NDJSON bytes in 64 KiB chunks.
    let replay: Arc<dyn Transport> = b.guard(None, Arc::new(Replay::new(ndjson.clone())));
    let mut component_decode = vec![];
    let mut native_decode = vec![];
    for _ in 0..REPEAT {
        let (took, outcome, emitted) = counted(b, replay.clone(), None, &request);
        let result = outcome.unwrap().expect("replayed run");
        check_output(&result, tail, "component, replay");
        assert_eq!(emitted, text_bytes);
        component_decode.push(took);

        let t = Instant::now();
        let mut decoder = net::Decoder::default();
        let mut exited = false;
        for chunk in ndjson.chunks(net::READ_CHUNK) {
            if decoder.push(chunk).expect("valid frames") {
                exited = true;
                break;
            }
        }
        assert!(exited);
        let (stdout, _, truncated) = decoder.finish();
        native_decode.push(t.elapsed());
        assert!(truncated && stdout == tail, "native decode: tail");
    }
    let (c, n) = (median(&component_decode), median(&native_decode));
    let (split, parse) = native_stages(&ndjson);
    report.note(format!(
        "native decoding stages over the 64 MiB replay: line split {}, + frame parse \
         (serde_json + base64) {}, + sink and tail (bytes; text at the end) {} (whole)",
        fmt(split),
        fmt(parse),
        fmt(n)
    ));
    let (cm, nm) = (mbps(OUTPUT_BYTES, c), mbps(OUTPUT_BYTES, n));
    report.row(
        "3",
        format!(
            "decode 64 MiB output ({:.1} MB NDJSON) in the component (median of {REPEAT})",
            ndjson.len() as f64 / 1e6
        ),
        format!("{cm:.0} MB/s ({})", fmt(c)),
        format!("same code native: {nm:.0} MB/s ({})", fmt(n)),
        format!("{:.2}x", cm / nm),
        "≥0.8x",
        met(cm / nm >= 0.8),
    );
    default_journal(b, report, &request, tail, text_bytes);
    let (ce, ne) = (mbps(OUTPUT_BYTES, e2e), mbps(OUTPUT_BYTES, native_e2e));
    report.row(
        "3",
        "64 MiB command end to end through createos-local, 96 MiB journal (second row)",
        format!("{ce:.0} MB/s ({})", fmt(e2e)),
        format!("native client: {ne:.0} MB/s ({})", fmt(native_e2e)),
        format!("{:.2}x", ce / ne),
        "",
        Status::Info,
    );

    // Memory high-water: the smallest linear-memory cap (HostOptions::
    // with_memory_limit, a StoreLimits that traps on failed growth) under
    // which the replayed 64 MiB run still completes correctly.
    let t = Instant::now();
    let (high_water, probes) = smallest_cap(64 * MIB as usize, 256 * MIB as usize, |cap| {
        let (_, outcome, _) = counted(b, replay.clone(), Some(cap), &request);
        matches!(outcome, Ok(Ok(r)) if r.stdout == tail)
    });
    report.row(
        "3",
        "instance memory high-water, 64 MiB output, 4 Mi char cap",
        format!("{:.1} MiB", high_water as f64 / MIB as f64),
        format!(
            "tail kept: {:.1} MiB of text",
            tail.len() as f64 / MIB as f64
        ),
        "",
        "",
        Status::Info,
    );
    report.note(format!(
        "memory high-water = smallest `HostOptions::with_memory_limit` cap (64 KiB resolution) \
         under which the replayed 64 MiB run completes; {probes} runs, {:.1} s. sandbox-host \
         exposes no memory size of a live instance.",
        secs(t.elapsed())
    ));
    compare_builds(b, report, &request, tail, replay);
}

/// Another build of the CreateOS component (`BENCH_COMPARE_WASM`, for
/// example one built with another `opt-level`) against this run's, on the
/// output path: the replayed 64 MiB decode and the command end to end
/// through createos-local, the two builds in turns (the order reversed
/// every other round) so that the machine's load falls on both. Ratios
/// are this build's throughput over the other's: above 1 this build is
/// faster.
fn compare_builds(
    b: &Bench,
    report: &mut Report,
    request: &ExecuteRequest,
    tail: &str,
    replay: Arc<dyn Transport>,
) {
    const ROUNDS: usize = 25;
    let Some(path) = std::env::var_os("BENCH_COMPARE_WASM").map(PathBuf::from) else {
        return;
    };
    let engine = new_engine().expect("engine");
    let other = ProviderComponent::load(&engine, &path).expect("the compared component loads");
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let builds = [&b.component, &other];
    let mut decode = [vec![], vec![]];
    let mut e2e = [vec![], vec![]];
    for round in 0..=ROUNDS {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let (took, outcome, emitted) = counted_on(b, builds[i], replay.clone(), None, request);
            let result = outcome.unwrap().expect("replayed run");
            check_output(&result, tail, "compared builds, replay");
            assert_eq!(emitted, OUTPUT_BYTES);
            let (end_to_end, outcome, emitted) =
                counted_on(b, builds[i], b.network(), None, request);
            let result = outcome.unwrap().expect("the 64 MiB command runs");
            check_output(&result, tail, "compared builds, end to end");
            assert_eq!(emitted, OUTPUT_BYTES);
            // The first round warms both up.
            if round > 0 {
                decode[i].push(took);
                e2e[i].push(end_to_end);
            }
        }
    }
    let name = |i: usize, p: &Path| {
        format!(
            "{} ({} bytes)",
            if i == 0 {
                "this build"
            } else {
                "compared build"
            },
            size(p)
        )
    };
    for (figure, samples) in [
        ("decode 64 MiB output, replayed", &decode),
        ("64 MiB command end to end through createos-local", &e2e),
    ] {
        let (this, that) = (median(&samples[0]), median(&samples[1]));
        // Each round's two runs are next to each other, so a round's ratio
        // sees one load: their median and spread say more than the ratio
        // of the medians on a busy machine.
        let mut paired: Vec<f64> = samples[0]
            .iter()
            .zip(&samples[1])
            .map(|(a, c)| secs(*c) / secs(*a))
            .collect();
        paired.sort_by(f64::total_cmp);
        let quartile = |q: usize| paired[(paired.len() - 1) * q / 4];
        report.row(
            "3",
            format!(
                "{figure}: {} (median of {ROUNDS}, in turns)",
                name(0, &b.wasm)
            ),
            format!("{:.0} MB/s ({})", mbps(OUTPUT_BYTES, this), fmt(this)),
            format!(
                "{}: {:.0} MB/s ({})",
                name(1, &path),
                mbps(OUTPUT_BYTES, that),
                fmt(that)
            ),
            format!(
                "{:.3}x (rounds: median {:.3}x, quartiles {:.3}x–{:.3}x)",
                secs(that) / secs(this),
                quartile(2),
                quartile(1),
                quartile(3)
            ),
            "",
            Status::Info,
        );
    }
    let rounds = |samples: &[Vec<Duration>; 2]| {
        samples[0]
            .iter()
            .zip(&samples[1])
            .map(|(a, c)| format!("{}/{}", fmt(*a), fmt(*c)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    report.note(format!(
        "compared build: {}; per-round times (this / compared): decode {}; end to end {}",
        path.display(),
        rounds(&decode),
        rounds(&e2e)
    ));
}

/// Section 3 at the engine's default journal (1 MiB, like the service):
/// the 64 MiB command end to end through the component and through the
/// native client, on a server of its own. Every byte must arrive (the
/// engine holds the producer back for its reader instead of evicting).
fn default_journal(
    b: &Bench,
    report: &mut Report,
    request: &ExecuteRequest,
    tail: &str,
    text_bytes: u64,
) {
    let server = BackgroundServer::start(Server::builder().api_key(KEY).quiet(true))
        .expect("createos-local starts");
    let base = server.base_url();
    let policy = Policy::for_origin(&base)
        .unwrap()
        .with_secret_header("X-Api-Key", KEY)
        .unwrap()
        .with_request_pacer(RequestPacer::in_memory());
    let transport: Arc<dyn Transport> = Arc::new(Guard::new(
        policy,
        Arc::new(NetworkTransport::new()) as Arc<dyn Transport>,
    ));
    let ctx = EnvironmentContext {
        config: serde_json::json!({
            "apiUrl": base,
            "timeoutMs": 120_000,
            "requestTimeoutMs": 30_000,
        })
        .to_string(),
        ..b.ctx.clone()
    };
    let options = || HostOptions::new().with_transport(transport.clone());
    let lease = b
        .component
        .instantiate(options())
        .unwrap()
        .acquire_lease(&ctx, &test_support::acquire("bench-default-journal"))
        .unwrap()
        .expect("a lease on the default-journal backend");
    let emitted = Arc::new(AtomicU64::new(0));
    let counter = emitted.clone();
    let t = Instant::now();
    let result = b
        .component
        .instantiate(options().with_output(move |_, chunk| {
            counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }))
        .unwrap()
        .execute(&ctx, &lease, request)
        .unwrap()
        .expect("the 64 MiB command runs at the default journal");
    let e2e = t.elapsed();
    check_output(&result, tail, "component, default journal");
    assert_eq!(
        emitted.load(Ordering::Relaxed),
        text_bytes,
        "component, default journal: live output bytes"
    );
    let client = NativeClient::new(&base, KEY, false);
    let t = Instant::now();
    let native = client
        .run(&lease.provider_lease_id, &net::create_body(request))
        .expect("native 64 MiB run at the default journal");
    let native_e2e = t.elapsed();
    assert_eq!(native.emitted, text_bytes, "native, default journal");
    let (ce, ne) = (mbps(OUTPUT_BYTES, e2e), mbps(OUTPUT_BYTES, native_e2e));
    report.row(
        "3",
        "64 MiB command end to end through createos-local, default 1 MiB journal",
        format!("{ce:.0} MB/s ({})", fmt(e2e)),
        format!("native client: {ne:.0} MB/s ({})", fmt(native_e2e)),
        format!("{:.2}x", ce / ne),
        "",
        Status::Info,
    );
    drop(server);
    cli_volume(b, report);
}

/// 50 MB through `sandbox run` (the release CLI, embedded engine at its
/// default journal, each provider) against the same command under a bare
/// bubblewrap writing to a pipe; both read by this process to the end.
/// The three sides run in turns, round by round (the order reversed every
/// other round), so a change of the machine's load falls on all of them:
/// medians of runs taken in separate blocks swung the ratio by ±0.1.
fn cli_volume(b: &Bench, report: &mut Report) {
    const N: usize = 11;
    // About 50 MB, whole lines (as before contract 0.4.0, when a cut inside
    // a character decoded to U+FFFD, so the figures stay comparable).
    let line = OUTPUT_LINE.len() as u64;
    let bytes = 50_000_000u64.div_ceil(line) * line;
    let cli = test_support::workspace_dir().join("target/release/sandbox");
    if !cli.is_file() {
        report.note(format!(
            "section 3 CLI rows skipped: {} is not built (cargo build --release --workspace)",
            cli.display()
        ));
        return;
    }
    let script = format!(
        "yes '{}' | head -c {bytes}",
        OUTPUT_LINE.trim_end_matches('\n')
    );
    let dir = std::env::temp_dir().join(format!("sandbox-bench-volume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The baseline's bubblewrap running the same script instead of `true`.
    let bare = {
        let command = bare_bwrap();
        let last = command.get_args().count() - 1;
        let mut args: Vec<_> = command.get_args().map(|a| a.to_owned()).collect();
        args.truncate(last);
        let mut c = Command::new("bwrap");
        c.args(args).args(["/bin/sh", "-c", &script]);
        c
    };
    let mut sides = vec![("bare", bare)];
    for (name, wasm) in [
        ("CreateOS", b.wasm.clone()),
        ("Daytona", b.wasm.with_file_name("daytona_provider.wasm")),
    ] {
        let mut command = Command::new(&cli);
        command
            .env("XDG_CACHE_HOME", dir.join("cache"))
            .env("SANDBOX_DATA_DIR", dir.join(format!("data-{name}")))
            .env_remove("CREATEOS_API_KEY")
            .arg("--provider")
            .arg(&wasm)
            .args(["run", "--", "/bin/sh", "-c", &script]);
        sides.push((name, command));
    }
    // Per side: whole runs (the output collected and counted) and the
    // stream alone (first byte to last), each round after one warm-up.
    let mut totals = vec![Vec::with_capacity(N); sides.len()];
    let mut spans = vec![Vec::with_capacity(N); sides.len()];
    for round in 0..=N {
        let mut order: Vec<usize> = (0..sides.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let command = &mut sides[i].1;
            let total = checked_run(command, bytes);
            let span = streaming_span(command, bytes);
            if round > 0 {
                totals[i].push(total);
                spans[i].push(span);
            }
        }
    }
    let (bare, bare_stream) = (median(&totals[0]), median(&spans[0]));
    let bare_mbps = mbps(bytes, bare);
    for (i, (name, _)) in sides.iter().enumerate().skip(1) {
        let took = median(&totals[i]);
        let ratio = mbps(bytes, took) / bare_mbps;
        report.row(
            "3",
            format!(
                "50 MB through `sandbox run`, {name} provider, default journal (median of {N}, \
                 in turns with the baseline)"
            ),
            format!("{:.0} MB/s ({})", mbps(bytes, took), fmt(took)),
            format!(
                "bare `bwrap sh -c ...` to a pipe: {bare_mbps:.0} MB/s ({})",
                fmt(bare)
            ),
            format!("{ratio:.2}x"),
            "≥0.5x",
            met(ratio >= 0.5),
        );
    }
    for (i, (name, _)) in sides.iter().enumerate().skip(1) {
        let span = median(&spans[i]);
        let ratio = mbps(bytes, span) / mbps(bytes, bare_stream);
        report.row(
            "3",
            format!(
                "50 MB through `sandbox run`, {name}: the stream alone, first byte to last \
                 (median of {N})"
            ),
            format!("{:.0} MB/s ({})", mbps(bytes, span), fmt(span)),
            format!(
                "bare `bwrap sh -c ...`, first byte to last: {:.0} MB/s ({})",
                mbps(bytes, bare_stream),
                fmt(bare_stream)
            ),
            format!("{ratio:.2}x"),
            "",
            Status::Info,
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `command` to its end with its output collected here, checks that
/// it exited 0 and printed `bytes` on stdout, and returns how long it took.
fn checked_run(command: &mut Command, bytes: u64) -> Duration {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let t = Instant::now();
    let output = command.output().expect("the command starts");
    let took = t.elapsed();
    assert!(output.status.success(), "{:?}", output.status);
    assert_eq!(output.stdout.len() as u64, bytes, "every byte arrives");
    took
}

/// Runs `command` with its stdout read here to the end (stderr dropped)
/// and returns the time from its first byte to its last, checking that
/// `bytes` arrived and that it exited 0: the rate of the stream itself,
/// without the start and the end around it.
fn streaming_span(command: &mut Command, bytes: u64) -> Duration {
    use std::io::Read;
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the command starts");
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut buffer = vec![0u8; 1 << 20];
    let (mut got, mut first) = (0u64, None);
    loop {
        let n = stdout.read(&mut buffer).expect("stdout reads");
        if n == 0 {
            break;
        }
        first.get_or_insert_with(Instant::now);
        got += n as u64;
        if got == bytes {
            break;
        }
    }
    let span = first.map_or(Duration::ZERO, |first| first.elapsed());
    let status = child.wait().expect("the command ends");
    assert!(status.success(), "{status:?}");
    assert_eq!(got, bytes, "every byte arrives");
    span
}

/// Native time of the first decoding stages over `ndjson`: line splitting
/// alone, and line splitting plus frame parsing.
fn native_stages(ndjson: &[u8]) -> (Duration, Duration) {
    use createos_provider::frames::{parse_frame, LineSplitter};
    let t = Instant::now();
    let mut lines = LineSplitter::default();
    let mut count = 0;
    for chunk in ndjson.chunks(net::READ_CHUNK) {
        count += lines.push(chunk).unwrap().len();
    }
    let split = t.elapsed();
    let t = Instant::now();
    let mut lines = LineSplitter::default();
    let mut bytes = 0;
    for chunk in ndjson.chunks(net::READ_CHUNK) {
        for line in lines.push(chunk).unwrap() {
            if let Ok(Some(createos_provider::frames::Frame::Data { bytes: b, .. })) =
                parse_frame(&line)
            {
                bytes += b.len();
            }
        }
    }
    let parse = t.elapsed();
    assert!(count > 0 && bytes as u64 == OUTPUT_BYTES);
    (split, parse)
}

/// The smallest `cap` (a multiple of 64 KiB, below `limit`) for which `ok(cap)`
/// holds, by bisection from `guess`; also the number of probes.
fn smallest_cap(guess: usize, limit: usize, ok: impl Fn(usize) -> bool) -> (usize, usize) {
    const PAGE: usize = 64 * 1024;
    let mut probes = 0;
    let mut probe = |cap: usize| {
        probes += 1;
        ok(cap)
    };
    // Find a working upper bound.
    let mut hi = guess;
    while !probe(hi) {
        assert!(hi < limit, "no cap up to {limit} bytes works");
        hi = (hi * 2).min(limit);
    }
    let mut lo = 0; // fails
    while hi - lo > PAGE {
        let mid = (lo + (hi - lo) / 2) / PAGE * PAGE;
        let mid = mid.max(lo + PAGE);
        if probe(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    (hi, probes)
}

// ---------------------------------------------------------------- 4

/// CreateOS's declared limit (300 requests per 60 s).
fn createos_limit() -> RateLimit {
    RateLimit::new(300, Duration::from_secs(60))
}

/// An instant CreateOS: every request answered at once, `connect` with an
/// exit frame. Per-command latency here is the host's and the budget's.
fn instant_createos() -> ScriptedTransport {
    ScriptedTransport::new(|request| {
        let path = request.path();
        if path.ends_with("/connect") {
            ScriptedResponse::ndjson(
                vec![ScriptedChunk::now(
                    &b"{\"type\":\"exit\",\"exit_code\":0}\n"[..],
                )],
                None,
            )
        } else if path.ends_with("/processes") {
            ScriptedResponse::jsend_success(serde_json::json!({"process_id": "p-instant"}))
        } else {
            ScriptedResponse::jsend_success(serde_json::json!({}))
        }
    })
}

/// The old metronome, as the baseline: request starts at least `gap` apart.
struct FixedGap {
    inner: Arc<dyn Transport>,
    gap: Duration,
    last: Arc<tokio::sync::Mutex<Option<Instant>>>,
}

impl Transport for FixedGap {
    fn send(&self, request: sandbox_host::OutgoingRequest) -> sandbox_host::TransportFuture {
        let (inner, gap, last) = (self.inner.clone(), self.gap, self.last.clone());
        Box::pin(async move {
            {
                let mut last = last.lock().await;
                if let Some(at) = *last {
                    tokio::time::sleep_until((at + gap).into()).await;
                }
                *last = Some(Instant::now());
            }
            inner.send(request).await
        })
    }
}

fn budget(b: &Bench, report: &mut Report) {
    const N: usize = 10;
    let request = request_true();
    let instant = instant_createos();
    let run = |transport: Arc<dyn Transport>| -> (Duration, f64) {
        let mut times = vec![];
        let before = instant.requests().len();
        for _ in 0..N {
            let t = Instant::now();
            let result = b.execute(
                HostOptions::new().with_transport(transport.clone()),
                &request,
            );
            times.push(t.elapsed());
            assert!(
                matches!(&result, Ok(r) if r.exit_code == Some(0)),
                "{result:?}"
            );
        }
        let requests = (instant.requests().len() - before) as f64 / N as f64;
        (median(&times), requests)
    };
    let budgeted = run(b.guard(Some(createos_limit()), instant.shared()));
    let metronome = run(b.guard(
        None,
        Arc::new(FixedGap {
            inner: instant.shared(),
            gap: Duration::from_millis(300),
            last: Arc::default(),
        }),
    ));
    report.row(
        "4",
        format!("`execute` of `true` on a held lease, instant backend, CreateOS's limit 300/60 s (median of {N})"),
        fmt(budgeted.0),
        format!("fixed 300 ms gap: {}", fmt(metronome.0)),
        format!("{:.3}x", secs(budgeted.0) / secs(metronome.0)),
        "≤100 ms",
        met(budgeted.0 <= Duration::from_millis(100)),
    );
    report.row(
        "4",
        "HTTP requests per command (no stdin)",
        format!("{:.1}", budgeted.1),
        "",
        "",
        "",
        Status::Info,
    );
    sustained(b, report);
}

/// 300 commands (8 at a time) against createos-local enforcing CreateOS's
/// 300-request limit over a window scaled from 60 s to 6 s (same budget
/// shape, a tenth of the wait): no 429, and the wall time against the
/// floor the limit imposes.
fn sustained(b: &Bench, report: &mut Report) {
    const COMMANDS: usize = 300;
    const WORKERS: usize = 8;
    let limit = RateLimit::new(300, Duration::from_secs(6));
    let server = BackgroundServer::start(
        Server::builder()
            .api_key(KEY)
            .quiet(true)
            .rate_limit(limit.requests, limit.window),
    )
    .expect("createos-local starts");
    let base = server.base_url();
    let budget = RequestPacer::in_memory();
    let policy = Policy::for_origin(&base)
        .unwrap()
        .with_secret_header("X-Api-Key", KEY)
        .unwrap()
        .with_request_pacer(budget.clone())
        .with_rate_limit(Some(limit));
    let guard: Arc<dyn Transport> = Arc::new(Guard::new(policy, Arc::new(NetworkTransport::new())));
    let mut ctx = b.ctx.clone();
    ctx.config = serde_json::json!({"apiUrl": base, "timeoutMs": 120_000}).to_string();
    let lease = b
        .component
        .instantiate(HostOptions::new().with_transport(guard.clone()))
        .unwrap()
        .acquire_lease(&ctx, &test_support::acquire("sustained"))
        .unwrap()
        .expect("a lease on the limited backend");
    let before = server.faults().requests().len();
    let next = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= COMMANDS {
                    break;
                }
                let word = format!("s{i}");
                let result = b
                    .component
                    .instantiate(HostOptions::new().with_transport(guard.clone()))
                    .unwrap()
                    .execute(&ctx, &lease, &request("echo", &[&word], Some(120_000)))
                    .unwrap();
                assert!(
                    matches!(&result, Ok(r) if r.stdout == format!("{word}\n")),
                    "{result:?}"
                );
            });
        }
    });
    let wall = started.elapsed();
    let records = server.faults().requests();
    let requests = records.len() - before;
    let refused = records.iter().filter(|r| r.status == 429).count();
    // The earliest the last of `requests` can start when the window already
    // holds the acquire's requests: whole windows beyond the first budget.
    let in_window = before + requests;
    let floor = limit.window * ((in_window.saturating_sub(1)) / limit.requests as usize) as u32;
    report.row(
        "4",
        format!("{COMMANDS} `echo`s, {WORKERS} at a time, backend enforcing 300 per 6 s"),
        format!("wall {}, {refused} × 429", fmt(wall)),
        format!("floor {} ({in_window} requests)", fmt(floor)),
        format!("{:.2}x floor", secs(wall) / secs(floor).max(0.001)),
        "0 × 429, ≤1.10x",
        met(refused == 0 && secs(wall) <= 1.10 * secs(floor)),
    );
    server.shutdown();
}

// ---------------------------------------------------------------- 5

fn latencies(b: &Bench, report: &mut Report) {
    const CANCELS: usize = 5;
    const EXITS: usize = 15;
    // Cancellation: `sleep 30` is running and followed; cancel the token,
    // note when the DELETE reaches the transport under the guard.
    let request = request("sleep", &["30"], Some(60_000));
    let (mut to_delete, mut to_return) = (vec![], vec![]);
    for _ in 0..CANCELS {
        let recorder = Arc::new(Recorder::new(Arc::new(NetworkTransport::new())));
        let guard = b.guard(None, recorder.clone());
        let token = CancelToken::new();
        let options = HostOptions::new()
            .with_transport(guard)
            .with_cancel(token.clone());
        let (cancelled_at, outcome, returned_at) = std::thread::scope(|scope| {
            let run = scope.spawn(|| {
                let outcome = b.execute(options, &request);
                (outcome, Instant::now())
            });
            let wait_start = Instant::now();
            while !recorder.sent().iter().any(|s| s.path.ends_with("/connect")) {
                assert!(wait_start.elapsed() < Duration::from_secs(20), "no connect");
                std::thread::sleep(Duration::from_millis(1));
            }
            // Let the guest settle into waiting on the stream.
            std::thread::sleep(Duration::from_millis(100));
            let cancelled_at = Instant::now();
            token.cancel();
            let (outcome, returned_at) = run.join().unwrap();
            (cancelled_at, outcome, returned_at)
        });
        assert!(
            matches!(outcome, Err(ProviderError::Cancelled(_))),
            "{outcome:?}"
        );
        let delete = recorder
            .sent()
            .into_iter()
            .find(|s| s.method == http::Method::DELETE)
            .expect("a DELETE after cancellation");
        to_delete.push(delete.at.saturating_duration_since(cancelled_at));
        to_return.push(returned_at - cancelled_at);
    }
    let (d, dm) = (median(&to_delete), max(&to_delete));
    report.row(
        "5",
        format!("cancel signalled → DELETE sent (median of {CANCELS})"),
        fmt(d),
        format!("max {}", fmt(dm)),
        "",
        "≤50 ms",
        met(dm <= Duration::from_millis(50)),
    );
    report.info(
        "5",
        "cancel signalled → `execute` returns `cancelled` (DELETE answered, tree gone)",
        fmt(median(&to_return)),
    );

    // Exit: the host's HTTP layer (our reader of `/connect`) receives the
    // chunk with the exit frame → `execute` returns.
    let stamp = Arc::new(ExitStamp::new(Arc::new(NetworkTransport::new())));
    let guard = b.guard(None, stamp.clone());
    let request = request_true();
    let mut exit = vec![];
    for i in 0..EXITS + 2 {
        let result = b
            .execute(HostOptions::new().with_transport(guard.clone()), &request)
            .expect("`true` runs");
        let returned = Instant::now();
        assert_eq!(result.exit_code, Some(0));
        let stamped = *stamp.stamps().last().expect("an exit frame was seen");
        if i >= 2 {
            exit.push(returned - stamped);
        }
    }
    let (e, em) = (median(&exit), max(&exit));
    report.row(
        "5",
        format!("exit frame received by the host → `execute` returns (median of {EXITS})"),
        fmt(e),
        format!("max {}", fmt(em)),
        "",
        "≤5 ms",
        met(e <= Duration::from_millis(5)),
    );
}

fn request_true() -> ExecuteRequest {
    request("true", &[], None)
}

// ---------------------------------------------------------------- 6

fn size_and_memory(b: &Bench, report: &mut Report) {
    let size = std::fs::metadata(&b.wasm).unwrap().len();
    let kib = size as f64 / 1024.0;
    report.row(
        "6",
        "component size (release, `./build.sh`)",
        format!("{kib:.0} KiB ({size} bytes)"),
        "",
        format!("{:.0}% of target", kib / 400.0 * 100.0),
        "≤400 KiB",
        met(kib <= 400.0),
    );
    let (fresh, _) = smallest_cap(MIB as usize, 256 * MIB as usize, |cap| {
        b.component
            .instantiate(HostOptions::new().with_memory_limit(cap))
            .and_then(|mut i| i.describe())
            .is_ok()
    });
    report.row(
        "6",
        "instance memory: instantiate + `describe`",
        format!("{:.2} MiB", fresh as f64 / MIB as f64),
        "",
        "",
        "",
        Status::Info,
    );
    let exit_only = b.guard(
        None,
        Arc::new(Replay::new(Bytes::from_static(
            b"{\"type\":\"exit\",\"exit_code\":0}\n",
        ))),
    );
    let request = request_true();
    let (command, _) = smallest_cap(MIB as usize, 256 * MIB as usize, |cap| {
        let (_, outcome, _) = counted(b, exit_only.clone(), Some(cap), &request);
        matches!(outcome, Ok(Ok(r)) if r.exit_code == Some(0))
    });
    report.row(
        "6",
        "instance memory: `execute` of `true`",
        format!("{:.2} MiB", command as f64 / MIB as f64),
        "",
        "",
        "",
        Status::Info,
    );
}

// ---------------------------------------------------------------- 7

/// The stores of section 7, opened side by side: the SQLite file (the
/// baseline, as one machine's `sandbox` keeps it) and a throwaway
/// PostgreSQL cluster with fsync on (as several hosts would share it).
struct Stores {
    sqlite: Arc<dyn LeaseStore>,
    postgres: Arc<dyn LeaseStore>,
    /// The same PostgreSQL with fsync off (as the tests run it), to show
    /// what the disk costs.
    postgres_no_fsync: Arc<dyn LeaseStore>,
    _clusters: [ThrowawayPostgres; 2],
    dir: PathBuf,
}

impl Stores {
    fn open() -> Stores {
        let dir = std::env::temp_dir().join(format!("sandbox-bench-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let durable = ThrowawayPostgres::start_durable("bench");
        let no_fsync = ThrowawayPostgres::start("bench-no-fsync");
        let sqlite_url = dir.join("leases.sqlite").display().to_string();
        Stores {
            sqlite: open_store(&sqlite_url).expect("the SQLite store opens"),
            postgres: open_store(&durable.url()).expect("the PostgreSQL store opens"),
            postgres_no_fsync: open_store(&no_fsync.url()).expect("the PostgreSQL store opens"),
            _clusters: [durable, no_fsync],
            dir,
        }
    }
}

impl Drop for Stores {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `q` in 0..=1 of `samples` (nearest rank).
fn quantile(samples: &[Duration], q: f64) -> Duration {
    let mut v = samples.to_vec();
    v.sort();
    let rank = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// One begin/end-use cycle (an `execute`'s bookkeeping without the
/// command) on lease `id`; panics when the store refuses.
fn use_cycle(store: &dyn LeaseStore, id: &str, ctx: &EnvironmentContext, me: &str) {
    let record = store.begin(id, Operation::Execute, ctx, me).unwrap();
    assert_eq!(record.busy_owner.as_deref(), Some(me));
    store.end_use(id, me).unwrap();
}

/// One lease's whole life in the store: acquire recorded, provider lease
/// stored, mark ended, destroy begun and ended.
fn life_cycle(store: &dyn LeaseStore, ctx: &EnvironmentContext, lease: &Lease, me: &str) {
    let record = store.begin_acquire(ctx, "bench-life", me).unwrap();
    store
        .record_lease(&record.id, lease, LeaseState::Active)
        .unwrap();
    store.end_use(&record.id, me).unwrap();
    store
        .begin(&record.id, Operation::Destroy, ctx, me)
        .unwrap();
    store
        .end_close(&record.id, me, LeaseState::Destroyed, "bench")
        .unwrap();
    let ended = store.get(&record.id).unwrap().unwrap();
    assert_eq!(ended.state, LeaseState::Destroyed);
}

/// An active lease for `lease` recorded by host `me`.
fn seeded(store: &dyn LeaseStore, ctx: &EnvironmentContext, lease: &Lease, me: &str) -> String {
    let record = store.begin_acquire(ctx, "bench", me).unwrap();
    store
        .record_lease(&record.id, lease, LeaseState::Active)
        .unwrap();
    store.end_use(&record.id, me).unwrap();
    record.id
}

fn per_second(samples: &[Duration]) -> f64 {
    samples.len() as f64 / secs(samples.iter().sum::<Duration>())
}

fn lease_stores(b: &Bench, report: &mut Report) {
    const ROUNDS: usize = 20;
    const PER_ROUND: usize = 10;
    const COMMANDS: usize = 60;
    report.info("7", "load average before (1, 5, 15 min)", load_average());
    let stores = Stores::open();
    // SQLite file (the baseline), PostgreSQL (measured), and for what
    // dominates: PostgreSQL without fsync, SQLite in memory.
    let in_memory: Arc<dyn LeaseStore> = Arc::new(SqliteLeases::open_in_memory().unwrap());
    let named: [(&str, Arc<dyn LeaseStore>); 4] = [
        ("SQLite file", stores.sqlite.clone()),
        ("PostgreSQL", stores.postgres.clone()),
        ("PostgreSQL, fsync off", stores.postgres_no_fsync.clone()),
        ("SQLite in memory", in_memory),
    ];
    let hosts: Vec<HostInstance> = named
        .iter()
        .map(|(_, store)| HostInstance::register(store.clone(), Liveness::DEFAULT).unwrap())
        .collect();

    // (a) Through the trait, alternating blocks so all see the same load.
    let leases: Vec<String> = named
        .iter()
        .zip(&hosts)
        .map(|((_, store), host)| seeded(store.as_ref(), &b.ctx, &b.lease, host.id()))
        .collect();
    let mut uses = vec![vec![]; named.len()];
    let mut lives = vec![vec![]; named.len()];
    for round in 0..ROUNDS + 1 {
        for (i, ((_, store), host)) in named.iter().zip(&hosts).enumerate() {
            for _ in 0..PER_ROUND {
                let t = Instant::now();
                use_cycle(store.as_ref(), &leases[i], &b.ctx, host.id());
                let used = t.elapsed();
                let t = Instant::now();
                life_cycle(store.as_ref(), &b.ctx, &b.lease, host.id());
                let lived = t.elapsed();
                // The first round warms connections and caches.
                if round > 0 {
                    uses[i].push(used);
                    lives[i].push(lived);
                }
            }
        }
    }
    let n = ROUNDS * PER_ROUND;
    let rate = |samples: &[Duration]| {
        format!(
            "{:.0}/s (median {}, p90 {})",
            per_second(samples),
            fmt(median(samples)),
            fmt(quantile(samples, 0.9))
        )
    };
    for (what, samples, calls) in [
        ("begin (mark busy) + end-use cycle", &uses, 2),
        (
            "acquire → record lease → end-use → begin destroy → end close (+ get)",
            &lives,
            6,
        ),
    ] {
        let sqlite = per_second(&samples[0]);
        report.row(
            "7",
            format!("{what}: cycles/s, {calls} store calls each (mean of {n})"),
            format!("PostgreSQL {}", rate(&samples[1])),
            format!("SQLite file {}", rate(&samples[0])),
            format!("{:.2}x SQLite's rate", per_second(&samples[1]) / sqlite),
            "",
            Status::Info,
        );
        for (k, (name, _)) in named.iter().enumerate().skip(2) {
            report.row(
                "7",
                format!("  same cycle, {name} (what the disk costs)"),
                rate(&samples[k]),
                "SQLite file, above",
                format!("{:.2}x SQLite's rate", per_second(&samples[k]) / sqlite),
                "",
                Status::Info,
            );
        }
    }
    drop(hosts);

    // (b) `SandboxRuntime::execute` of `true` against the instant CreateOS,
    // with each store (and an in-memory one, the no-store baseline).
    let instant = instant_createos();
    let in_memory: Arc<dyn LeaseStore> = Arc::new(SqliteLeases::open_in_memory().unwrap());
    let runtimes: Vec<(&str, SandboxRuntime)> = [
        ("in-memory SQLite", in_memory),
        ("SQLite file", stores.sqlite.clone()),
        ("PostgreSQL", stores.postgres.clone()),
        ("PostgreSQL (fsync off)", stores.postgres_no_fsync.clone()),
    ]
    .into_iter()
    .map(|(name, store)| {
        let runtime = SandboxRuntime::new(b.component.clone(), store, instant.shared())
            .unwrap()
            .with_request_pacer(RequestPacer::in_memory())
            .with_rate_limit(None);
        (name, runtime)
    })
    .collect();
    let secrets = Secrets::none().with("apiKey", KEY);
    let prepared: Vec<(Environment, String)> = runtimes
        .iter()
        .map(|(_, runtime)| {
            let env = runtime
                .environment(
                    &b.ctx.company_id,
                    &b.ctx.environment_id,
                    &b.ctx.config,
                    &secrets,
                )
                .unwrap();
            let id = seeded(runtime.store(), env.context(), &b.lease, runtime.host_id());
            (env, id)
        })
        .collect();
    let request = request_true();
    let mut times = vec![vec![]; runtimes.len()];
    for i in 0..COMMANDS + 3 {
        for (k, ((_, runtime), (env, id))) in runtimes.iter().zip(&prepared).enumerate() {
            let t = Instant::now();
            let result = runtime
                .execute(env, id, &request, None, CancelToken::new())
                .unwrap();
            let took = t.elapsed();
            assert!(
                matches!(&result, Ok(r) if r.exit_code == Some(0)),
                "{result:?}"
            );
            if i >= 3 {
                times[k].push(took);
            }
        }
    }
    let (base_median, base_p90) = (median(&times[0]), quantile(&times[0], 0.9));
    report.row(
        "7",
        format!("`execute` of `true`, instant backend, in-memory store (median of {COMMANDS})"),
        format!("median {}, p90 {}", fmt(base_median), fmt(base_p90)),
        "",
        "",
        "",
        Status::Info,
    );
    let added = |k: usize| {
        (
            median(&times[k]).saturating_sub(base_median),
            quantile(&times[k], 0.9).saturating_sub(base_p90),
        )
    };
    let (sqlite_median, sqlite_p90) = added(1);
    for k in 1..runtimes.len() {
        let (m, p) = added(k);
        report.row(
            "7",
            format!("same with the {} store: added per command", runtimes[k].0),
            format!(
                "median +{}, p90 +{} (median {}, p90 {})",
                fmt(m),
                fmt(p),
                fmt(median(&times[k])),
                fmt(quantile(&times[k], 0.9))
            ),
            if k >= 2 {
                format!(
                    "SQLite file: median +{}, p90 +{}",
                    fmt(sqlite_median),
                    fmt(sqlite_p90)
                )
            } else {
                String::new()
            },
            if k >= 2 {
                format!(
                    "{:.2}x the command time with SQLite",
                    secs(median(&times[k])) / secs(median(&times[1]))
                )
            } else {
                String::new()
            },
            "",
            Status::Info,
        );
    }
    report.info("7", "load average after (1, 5, 15 min)", load_average());
    report.note(
        "7: stores on the same disk (/tmp); SQLite in WAL mode with synchronous=FULL, \
         PostgreSQL a local cluster over loopback TCP with fsync on (the fsync-off rows: \
         a second cluster without it); blocks of 10 cycles per store alternate, commands \
         alternate one by one, so all see the same load",
    );
}

// ---------------------------------------------------------------- main

/// A section: its number, its name, and what runs it.
type Section = (&'static str, &'static str, fn(&Bench, &mut Report));

// ---------------------------------------------------------------- 8

/// Medians of `n` timed runs of `command` (after one warm-up), which must
/// succeed.
fn timed_runs(n: usize, mut command: impl FnMut() -> Command) -> Duration {
    let mut samples = Vec::with_capacity(n);
    for i in 0..=n {
        let t = Instant::now();
        let output = command().output().expect("the command starts");
        let took = t.elapsed();
        assert!(output.status.success(), "{output:?}");
        if i > 0 {
            samples.push(took);
        }
    }
    median(&samples)
}

/// The issue's baseline: a bare bubblewrap start of `true`.
fn bare_bwrap() -> Command {
    let mut command = Command::new("bwrap");
    command.args([
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--unshare-pid",
        "true",
    ]);
    command
}

fn cli_end_to_end(b: &Bench, report: &mut Report) {
    const N: usize = 20;
    let cli = test_support::workspace_dir().join("target/release/sandbox");
    if !cli.is_file() {
        report.note(format!(
            "section 8 skipped: {} is not built (cargo build --release -p sandbox-host)",
            cli.display()
        ));
        return;
    }
    let dir = std::env::temp_dir().join(format!("sandbox-bench-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("key");
    std::fs::write(&key_file, KEY).unwrap();
    let cache = dir.join("cache");
    let sandbox = |args: &[&str]| {
        let mut command = Command::new(&cli);
        command
            .env("XDG_CACHE_HOME", &cache)
            .env("SANDBOX_DATA_DIR", dir.join("data"))
            .env_remove("CREATEOS_API_KEY")
            .arg("--provider")
            .arg(&b.wasm)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    };
    let remote = |args: &[&str]| {
        let mut command = sandbox(&["--api-url", &b.base, "--api-key-file"]);
        command.arg(&key_file).args(args);
        command
    };

    // Cold start: the first `describe` compiles the component into the
    // artifact cache; every later start loads it from there.
    let t = Instant::now();
    let cold = sandbox(&["describe"]).output().unwrap();
    let cold = (t.elapsed(), cold.status.success());
    assert!(cold.1, "describe runs");
    let bare = timed_runs(N, bare_bwrap);
    let start = timed_runs(N, || sandbox(&["--version"]));
    let describe = timed_runs(N, || sandbox(&["describe"]));
    let list = timed_runs(N, || remote(&["lease", "list"]));
    let acquired = remote(&["lease", "acquire"]).output().unwrap();
    assert!(acquired.status.success(), "{acquired:?}");
    let lease = String::from_utf8(acquired.stdout)
        .unwrap()
        .trim()
        .to_owned();
    let requests_before = b.requests_recorded();
    let exec = timed_runs(N, || remote(&["lease", "exec", &lease, "--", "true"]));
    let requests = (b.requests_recorded() - requests_before) as f64 / (N + 1) as f64;
    let run = timed_runs(N, || sandbox(&["run", "--", "true"]));
    let destroyed = remote(&["lease", "destroy", &lease]).output().unwrap();
    assert!(destroyed.status.success(), "{destroyed:?}");
    let _ = std::fs::remove_dir_all(&dir);

    let ratio = |d: Duration| secs(d) / secs(bare);
    report.row(
        "8",
        format!("`sandbox lease exec L -- true` on a held lease (median of {N})"),
        fmt(exec),
        format!("bare `bwrap ... true`: {}", fmt(bare)),
        format!("{:.1}x", ratio(exec)),
        "≤10x",
        met(ratio(exec) <= 10.0),
    );
    report.row(
        "8",
        format!("`sandbox run -- true` (embedded engine; median of {N})"),
        fmt(run),
        format!("bare `bwrap ... true`: {}", fmt(bare)),
        format!("{:.1}x", ratio(run)),
        "≤25x",
        met(ratio(run) <= 25.0),
    );
    report.row(
        "8",
        "CLI start, cold (compiles the component into the artifact cache)",
        fmt(cold.0),
        format!("warm (`describe`, cached): {}", fmt(describe)),
        format!("{:.1}x", secs(cold.0) / secs(describe)),
        "",
        Status::Info,
    );
    let stage = |name: &str, d: Duration| format!("{name} {}", fmt(d));
    report.note(format!(
        "section 8 breakdown of `lease exec` (medians, each stage the difference of two \
         commands): {}; {}; {}; {} ({requests:.1} HTTP requests per command; the backend's own \
         POST /processes and bash start are in createos-local's spawn bench)",
        stage("process start and argument parsing (`--version`)", start),
        stage(
            "+ component from the artifact cache, instance, describe",
            describe.saturating_sub(start)
        ),
        stage(
            "+ lease store and environment (`lease list`)",
            list.saturating_sub(describe)
        ),
        stage(
            "+ execute: requests, backend spawn, bash, release of the mark",
            exec.saturating_sub(list)
        ),
    ));
}

fn main() {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let selected = |number: &str, name: &str| {
        filters.is_empty()
            || filters
                .iter()
                .any(|f| f == number || name.contains(f.as_str()))
    };
    let started = Instant::now();
    let machine = machine();
    eprintln!("provider benchmarks on {machine}");
    let bench = setup();
    let mut report = Report::default();
    report.note(format!(
        "backend: createos-local at {} (isolation {:?}); the component's HTTP goes through \
         sandbox-host's Guard (no rate limit except in 4) and NetworkTransport",
        bench.base,
        bench.server.isolation()
    ));
    let sections: [Section; 8] = [
        ("1", "cold", cold_start),
        ("2", "command", per_command),
        ("3", "output", output_path),
        ("4", "budget", budget),
        ("5", "latency", latencies),
        ("6", "size", size_and_memory),
        ("7", "store", lease_stores),
        ("8", "cli", cli_end_to_end),
    ];
    for (number, name, run) in sections {
        if selected(number, name) {
            eprintln!("section {number} ({name})…");
            let t = Instant::now();
            run(&bench, &mut report);
            eprintln!("section {number} done in {:.1} s", secs(t.elapsed()));
        }
    }
    let shutdown = bench.server.shutdown();
    if !shutdown.all_exited() {
        report.note(format!(
            "createos-local shutdown found survivors: {shutdown:?}"
        ));
    }
    report.print(&machine, started.elapsed());
}
