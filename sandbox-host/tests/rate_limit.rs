//! The rate limit as a budget (issue 18), with the real CreateOS provider
//! against createos-local enforcing a test-sized limit and counting what it
//! refuses: the host spends the budget at once, waits only when it is
//! spent, never exceeds it (the backend answers 429 to any request beyond
//! it, and must answer none), shares it between processes, and honours a 429.

#![cfg(feature = "local-backend")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use sandbox_engine::{BackgroundServer, FaultAction, FaultRule, Server};
use sandbox_host::types::{ExecuteResult, ProviderError};
use sandbox_host::{
    shared_engine, CancelToken, Environment, NetworkTransport, ProviderComponent, RateLimit,
    RequestPacer, SandboxRuntime, Secrets, SqliteLeases,
};

mod common;
use test_support::RequestExt;

const KEY: &str = "rate-key";

fn provider_wasm() -> PathBuf {
    let wasm = common::workspace_dir().join("target/wasm32-wasip2/release/createos_provider.wasm");
    assert!(
        wasm.is_file(),
        "{} is missing: run ./build.sh first",
        wasm.display()
    );
    wasm
}

fn provider() -> ProviderComponent {
    ProviderComponent::load(&shared_engine().unwrap(), provider_wasm())
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// A backend answering 429 beyond `requests` per `window`.
fn limited_backend(requests: u32, window: Duration) -> BackgroundServer {
    BackgroundServer::start(
        Server::builder()
            .api_key(KEY)
            .quiet(true)
            .transition_delay(Duration::from_millis(20))
            .rate_limit(requests, window),
    )
    .unwrap()
}

fn refused(server: &BackgroundServer) -> usize {
    server
        .faults()
        .requests()
        .iter()
        .filter(|r| r.status == 429)
        .count()
}

fn runtime(limit: RateLimit, budget: &RequestPacer) -> SandboxRuntime {
    SandboxRuntime::new(
        provider(),
        Arc::new(SqliteLeases::open_in_memory().unwrap()),
        Arc::new(NetworkTransport::new()),
    )
    .unwrap()
    .with_request_pacer(budget.clone())
    .with_rate_limit(Some(limit))
}

fn environment(rt: &SandboxRuntime, server: &BackgroundServer) -> Environment {
    let config = format!(r#"{{"apiUrl":"{}","timeoutMs":60000}}"#, server.base_url());
    rt.environment("co", "env", &config, &Secrets::none().with("apiKey", KEY))
        .unwrap()
}

fn acquire(rt: &SandboxRuntime, env: &Environment) -> String {
    let request = test_support::acquire("rate");
    rt.acquire(env, &request).unwrap().unwrap().id
}

fn echo(rt: &SandboxRuntime, env: &Environment, lease: &str, word: &str) -> ExecuteResult {
    let request = test_support::command("echo", &[word]).timeout_ms(60_000);
    rt.execute(env, lease, &request, None, CancelToken::new())
        .unwrap()
        .unwrap_or_else(|e| panic!("{e:?}"))
}

fn assert_echoed(result: &ExecuteResult, word: &str) {
    assert_eq!(result.exit_code, Some(0), "{result:?}");
    assert_eq!(result.stdout, format!("{word}\n"), "{result:?}");
    assert!(!result.timed_out);
}

/// A burst that fits the budget starts every request at once: no waiting,
/// no 429 (the fixed 300 ms gap made 10 commands take about 9 s).
#[test]
fn a_burst_of_ten_commands_within_the_budget_never_waits() {
    let server = limited_backend(60, Duration::from_secs(2));
    let budget = RequestPacer::in_memory();
    let rt = runtime(RateLimit::new(60, Duration::from_secs(2)), &budget);
    let env = environment(&rt, &server);
    let lease = acquire(&rt, &env);
    std::thread::scope(|scope| {
        let runs: Vec<_> = (0..10)
            .map(|i| {
                let (rt, env, lease) = (&rt, &env, &lease);
                scope.spawn(move || (i, echo(rt, env, lease, &format!("burst-{i}"))))
            })
            .collect();
        for run in runs {
            let (i, result) = run.join().unwrap();
            assert_echoed(&result, &format!("burst-{i}"));
        }
    });
    let stats = budget.stats();
    assert_eq!(stats.waited, 0, "{stats:?}");
    assert_eq!(refused(&server), 0);
}

/// Over several windows the host keeps to the limit exactly: the backend,
/// which refuses any request beyond it, refuses none, and the budget did
/// have to wait (the limit was reached, so the test is not vacuous).
#[test]
fn two_hundred_requests_over_several_windows_never_exceed_the_limit() {
    let window = Duration::from_millis(1000);
    let server = limited_backend(20, window);
    let budget = RequestPacer::in_memory();
    let rt = runtime(RateLimit::new(20, window), &budget);
    let env = environment(&rt, &server);
    let lease = acquire(&rt, &env);
    std::thread::scope(|scope| {
        for worker in 0..4 {
            let (rt, env, lease, server) = (&rt, &env, &lease, &server);
            scope.spawn(move || {
                let mut i = 0;
                while server.faults().requests().len() < 200 {
                    let word = format!("w{worker}-{i}");
                    assert_echoed(&echo(rt, env, lease, &word), &word);
                    i += 1;
                }
            });
        }
    });
    assert!(server.faults().requests().len() >= 200);
    assert_eq!(refused(&server), 0, "the backend refused a request");
    assert!(budget.stats().waited > 0, "{:?}", budget.stats());
}

/// A 429 (here injected on the output stream and on process creation, with
/// no `Retry-After`) pauses the origin for a window, then the same request
/// is repeated: the command runs exactly once and its output is whole.
#[test]
fn a_429_is_honoured_and_nothing_is_lost() {
    let server = BackgroundServer::start(
        Server::builder()
            .api_key(KEY)
            .quiet(true)
            .transition_delay(Duration::from_millis(20)),
    )
    .unwrap();
    let budget = RequestPacer::in_memory();
    let rt = runtime(RateLimit::new(50, Duration::from_millis(300)), &budget);
    let env = environment(&rt, &server);
    let lease = acquire(&rt, &env);
    server.faults().add(FaultRule::new(
        "POST",
        "/v1/sandboxes/*/processes",
        FaultAction::Status { status: 429 },
    ));
    server.faults().add(FaultRule::new(
        "GET",
        "/v1/sandboxes/*/processes/*/connect",
        FaultAction::Status { status: 429 },
    ));
    let request = test_support::command(
        "bash",
        &["-c", "echo once >> /tmp/ran; seq 1 2000; cat /tmp/ran"],
    )
    .timeout_ms(60_000);
    let result = rt
        .execute(&env, &lease, &request, None, CancelToken::new())
        .unwrap()
        .unwrap_or_else(|e| panic!("{e:?}"));
    let expected: String = (1..=2000).map(|n| format!("{n}\n")).collect::<String>() + "once\n";
    assert_eq!(result.exit_code, Some(0), "{result:?}");
    assert_eq!(result.stdout, expected);
    assert_eq!(budget.stats().throttled, 2, "{:?}", budget.stats());
    assert_eq!(
        server.faults().count("POST", "/v1/sandboxes/*/processes"),
        2,
        "one refused creation, one repeated"
    );
}

/// A 429 that keeps coming is repeated a bounded number of times, never
/// past the deadline, and then reaches the provider as a rejection.
#[test]
fn a_persistent_429_ends_as_a_typed_rejection() {
    let server = BackgroundServer::start(Server::builder().api_key(KEY).quiet(true)).unwrap();
    let budget = RequestPacer::in_memory();
    let rt = runtime(RateLimit::new(50, Duration::from_millis(100)), &budget);
    let env = environment(&rt, &server);
    server
        .faults()
        .add(FaultRule::new("POST", "/v1/sandboxes", FaultAction::Status { status: 429 }).always());
    let request = test_support::acquire("rate");
    let outcome = rt.acquire(&env, &request).unwrap();
    assert!(
        matches!(outcome, Err(ProviderError::ApiRejected(ref r)) if r.status == 429),
        "{outcome:?}"
    );
    // The first answer and three repeats.
    assert_eq!(server.faults().count("POST", "/v1/sandboxes"), 4);
}

/// Two `sandbox` processes on one machine share one budget through the
/// ledger in their data directory: together they never exceed the limit
/// (with a budget in each process's memory they would each start at full
/// speed, and the backend would refuse).
#[test]
fn two_sandbox_processes_share_one_budget() {
    let server = limited_backend(12, Duration::from_millis(1500));
    let dir = tempdir("shared-budget");
    let key_file = dir.join("key");
    std::fs::write(&key_file, KEY).unwrap();
    let run = |tag: &str| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sandbox"));
        command
            .arg("--provider")
            .arg(provider_wasm())
            .arg("--data-dir")
            .arg(&dir)
            .arg("--api-url")
            .arg(server.base_url())
            .arg("--api-key-file")
            .arg(&key_file)
            .args(["--rate-limit", "12/1500", "run", "--", "echo", tag])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        command.spawn().unwrap()
    };
    let children: Vec<_> = (0..3)
        .flat_map(|i| [run(&format!("a{i}")), run(&format!("b{i}"))])
        .collect();
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "{:?}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let total = server.faults().requests().len();
    assert!(
        total > 24,
        "the runs needed more than two windows ({total})"
    );
    assert_eq!(refused(&server), 0, "the backend refused a request");
}

fn tempdir(tag: &str) -> PathBuf {
    let dir: &Path = &std::env::temp_dir();
    let dir = dir.join(format!("sandbox-rate-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Found by the shared scenarios: under CreateOS's declared limit (300 per
/// 60 s) a 429 without Retry-After paused the origin a whole minute, longer
/// than the provider's request budget; the provider gave up first and
/// reported the process creation unconfirmed (`cleanup-failed`, lease
/// poisoned) for a request the 429 proves never ran. A pause that cannot
/// fit one request's budget now goes to the provider at once as the 429:
/// a definite rejection, and the lease stays usable.
#[test]
fn a_429_whose_pause_outlasts_the_request_budget_is_a_rejection_not_a_doubt() {
    let server = BackgroundServer::start(Server::builder().api_key(KEY).quiet(true)).unwrap();
    let budget = RequestPacer::in_memory();
    let rt = runtime(RateLimit::new(300, Duration::from_secs(60)), &budget);
    let config = format!(
        r#"{{"apiUrl":"{}","timeoutMs":60000,"requestTimeoutMs":5000}}"#,
        server.base_url()
    );
    let env = rt
        .environment("co", "env", &config, &Secrets::none().with("apiKey", KEY))
        .unwrap();
    let lease = acquire(&rt, &env);
    server.faults().add(FaultRule::new(
        "POST",
        "/v1/sandboxes/*/processes",
        FaultAction::Status { status: 429 },
    ));
    let request = test_support::command("true", &[]);
    let outcome = rt
        .execute(&env, &lease, &request, None, CancelToken::new())
        .unwrap();
    assert!(
        matches!(&outcome, Err(ProviderError::ApiRejected(r)) if r.status == 429),
        "{outcome:?}"
    );
    let record = rt.store().get(&lease).unwrap().unwrap();
    assert_eq!(record.state, sandbox_host::LeaseState::Active);
    assert_eq!(
        server.faults().count("POST", "/v1/sandboxes/*/processes"),
        1
    );
}
