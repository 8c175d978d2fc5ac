//! The `sandbox` CLI when its own output cannot be written: a reader that
//! closes the pipe (`sandbox run -- yes | head`) stops the command at once,
//! as a pipeline's writer ends with SIGPIPE (status 141), and a stdout that
//! fails to write (a full disk behind a redirect) is an error that says so,
//! never a clean exit. Both providers, the embedded engine.

use std::io::Read;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

mod common;

/// Both components ./build.sh builds.
fn providers() -> [PathBuf; 2] {
    let createos = common::built_provider();
    let daytona = createos.with_file_name("daytona_provider.wasm");
    assert!(daytona.is_file(), "./build.sh builds both providers");
    [createos, daytona]
}

/// Before: the CLI ignored the failed writes and went on until the
/// command's timeout (here 300 s), losing the output behind the exit code
/// the command would have had.
#[test]
fn a_reader_that_closes_stdout_stops_the_command_with_status_141() {
    let providers = providers();
    for provider in &providers {
        let marker = test_support::procs::unique_marker();
        let mut child = common::sandbox_cli(provider, "cli-closed-output")
            .args(["run", "--timeout", "300s", "--", "sh", "-c"])
            .arg(format!("exec yes {marker}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running sandbox");
        let mut stdout = child.stdout.take().unwrap();
        let mut first = vec![0u8; 64];
        stdout
            .read_exact(&mut first)
            .expect("the command's first output");
        assert!(String::from_utf8_lossy(&first).starts_with(&marker));
        drop(stdout);
        let deadline = Instant::now() + Duration::from_secs(90);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "{}: still running 90 s after its reader closed stdout",
                    provider.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert_eq!(status.code(), Some(141), "{}: {stderr}", provider.display());
        assert!(
            !stderr.contains("output lost"),
            "{}: {stderr}",
            provider.display()
        );
        assert_eq!(
            test_support::procs::survivors(&marker),
            Vec::<String>::new(),
            "{}: the command outlived its run",
            provider.display()
        );
    }
}

/// Before: `sandbox run -- echo hello > /dev/full` exited 0 and the
/// output was gone.
#[test]
fn a_stdout_that_cannot_be_written_is_an_error_not_a_clean_exit() {
    let providers = providers();
    for provider in &providers {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        let output = common::sandbox_cli(provider, "cli-full-output")
            .args(["run", "--", "echo", "hello"])
            .stdout(full)
            .output()
            .expect("running sandbox");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(125),
            "{}: {stderr}",
            provider.display()
        );
        assert!(
            stderr.contains("writing the command's stdout failed")
                && stderr.contains("No space left on device")
                && stderr.contains("bytes of its output were not written"),
            "{}: {stderr}",
            provider.display()
        );
    }
}

/// Before: the host capped every response body at 1 GiB, so `yes` (about
/// 1 GiB in a few seconds) had its output stream cut mid-way; the
/// provider's reconnect found what was in flight gone and the run ended
/// in `output lost` long before its timeout. Now the stream runs until the
/// command's own timeout (124), every byte read.
#[test]
fn a_command_printing_past_a_gibibyte_runs_to_its_timeout_without_loss() {
    let providers = providers();
    let runs: Vec<_> = providers
        .iter()
        .map(|provider| {
            let mut child = common::sandbox_cli(provider, "cli-endless-output")
                .args(["run", "--timeout", "15s", "--", "yes"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("running sandbox");
            let mut stdout = child.stdout.take().unwrap();
            let counter = std::thread::spawn(move || {
                let mut buffer = vec![0u8; 1 << 20];
                let mut total = 0u64;
                while let Ok(n) = stdout.read(&mut buffer) {
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                }
                total
            });
            (provider, child, counter)
        })
        .collect();
    for (provider, child, counter) in runs {
        let output = child.wait_with_output().unwrap();
        let bytes = counter.join().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(124),
            "{} after {bytes} bytes: {stderr}",
            provider.display()
        );
        assert!(
            !stderr.contains("output lost"),
            "{}: {stderr}",
            provider.display()
        );
        if bytes <= 1 << 30 {
            eprintln!(
                "note: {} printed {bytes} bytes in 15 s, less than the old 1 GiB cap on this machine",
                provider.display()
            );
        }
    }
}
