//! The `sandbox` CLI passes the operator's egress policy to its embedded
//! engine (issue 25 item 4): with `--egress` naming a server this test
//! starts on the host's loopback, `curl` in the sandbox reaches it through
//! the sandbox's proxy; a bad entry is a clear error before anything runs.
//! Skipped (with a note) until ./build.sh has built the provider, or where
//! the engine has no sandbox machines (needs root and a pids cgroup).

use std::path::Path;
use std::process::Command;

mod common;

use common::built_provider as provider;

fn sandbox(provider: &Path) -> Command {
    common::sandbox_cli(provider, "sandbox-cli-egress")
}

/// Serves `body` to every HTTP request on a loopback port, in a thread.
fn host_server(body: &'static str) -> u16 {
    test_support::http::serve_text("127.0.0.1", |_| body.to_string())
}

#[test]
fn run_with_egress_reaches_only_the_allowed_host() {
    let provider = provider();
    if !sandbox_engine::machine::enabled_here() {
        test_support::skipped("no sandbox machines on this host");
        return;
    }
    let allowed = host_server("hello through the proxy\n");
    let other = host_server("must not be reached\n");
    let output = sandbox(&provider)
        .args(["run", "--egress", &format!("127.0.0.1:{allowed}"), "--", "sh", "-c"])
        .arg(format!(
            "curl -s --max-time 10 --noproxy '' http://127.0.0.1:{allowed}/; \
             curl -s --max-time 10 --noproxy '' -o /dev/null -w '%{{http_code}}\\n' http://127.0.0.1:{other}/"
        ))
        .env_remove("CREATEOS_API_KEY")
        .output()
        .expect("run sandbox");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(stdout, "hello through the proxy\n403\n", "{output:?}");
    let bad = sandbox(&provider)
        .args(["run", "--egress", "http://x/y", "--", "true"])
        .env_remove("CREATEOS_API_KEY")
        .output()
        .expect("run sandbox");
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("is not a host pattern"), "{err}");
}
