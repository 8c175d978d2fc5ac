//! End-to-end: the `sandbox` binary with the real CreateOS provider and the
//! embedded local backend. Skipped (with a note) until ./build.sh has built
//! the provider.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

fn provider() -> Option<PathBuf> {
    let wasm = common::workspace_dir().join("target/wasm32-wasip2/release/createos_provider.wasm");
    if wasm.is_file() {
        Some(wasm)
    } else {
        eprintln!("skipped: {} not built yet (run ./build.sh)", wasm.display());
        None
    }
}

fn sandbox(provider: &PathBuf) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sandbox"));
    let data = std::env::temp_dir().join(format!("sandbox-cli-{}", std::process::id()));
    command
        .env("SANDBOX_PROVIDER", provider)
        .env("SANDBOX_DATA_DIR", data)
        .env_remove("CREATEOS_API_KEY");
    command
}

fn run(provider: &PathBuf, args: &[&str]) -> Output {
    sandbox(provider)
        .arg("run")
        .args(args)
        .output()
        .expect("running sandbox")
}

#[test]
fn run_propagates_the_exit_code_and_output_in_order() {
    let Some(provider) = provider() else { return };
    let output = run(
        &provider,
        &[
            "--",
            "sh",
            "-c",
            "echo one; sleep 0.3; echo two; echo oops >&2; exit 7",
        ],
    );
    assert_eq!(output.status.code(), Some(7), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "one\ntwo\n");
    assert!(String::from_utf8_lossy(&output.stderr).contains("oops"));
}

#[test]
fn run_echo_hello_works_with_no_setup() {
    let Some(provider) = provider() else { return };
    let output = run(&provider, &["--", "echo", "hello"]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "hello\n");
}

#[test]
fn a_timed_out_command_exits_124_promptly() {
    let Some(provider) = provider() else { return };
    let started = Instant::now();
    let output = run(
        &provider,
        &["--timeout", "2s", "--", "sh", "-c", "sleep 300 & sleep 300"],
    );
    assert_eq!(output.status.code(), Some(124), "{output:?}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn ctrl_c_cancels_cleans_up_and_exits_130() {
    let Some(provider) = provider() else { return };
    let mut child = sandbox(&provider)
        .args(["run", "--", "sh", "-c", "echo started; exec sleep 60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "started\n");
    let started = Instant::now();
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{output:?}");
    assert!(started.elapsed() < Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cleaned up"), "{stderr}");
}

#[test]
fn describe_and_validate_config_print_json() {
    let Some(provider) = provider() else { return };
    let output = sandbox(&provider)
        .args(["describe", "--json"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(value["driverKey"], "createos");

    let output = sandbox(&provider)
        .args(["validate-config", "--json"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(value["ok"], true);
}
