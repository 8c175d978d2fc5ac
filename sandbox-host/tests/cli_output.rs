//! The `sandbox` CLI's live output at volume (issue 23 item 2): every byte
//! the command prints reaches the CLI's own stdout, in order, on both
//! providers with the embedded engine at its default journal; the result's
//! tail cap is no reason to say output was dropped.

use std::path::PathBuf;
use std::process::Output;

mod common;

/// The component `file` built by ./build.sh, or `None` (with a note).
fn built(file: &str) -> Option<PathBuf> {
    let wasm = common::workspace_dir()
        .join("target/wasm32-wasip2/release")
        .join(file);
    if wasm.is_file() {
        Some(wasm)
    } else {
        eprintln!("skipped: {} not built yet (run ./build.sh)", wasm.display());
        None
    }
}

fn run(file: &str, tag: &str, args: &[&str]) -> Option<Output> {
    let provider = built(file)?;
    Some(
        common::sandbox_cli(&provider, tag)
            .arg("run")
            .args(args)
            .output()
            .expect("running sandbox"),
    )
}

fn seq_is_byte_exact(file: &str, tag: &str) {
    let Some(output) = run(file, tag, &["--", "seq", "1", "3000000"]) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{file}: {stderr}");
    let want: String = (1..=3_000_000).map(|i| format!("{i}\n")).collect();
    assert!(
        output.stdout == want.as_bytes(),
        "{file}: {} of {} bytes on stdout; stderr: {stderr}",
        output.stdout.len(),
        want.len()
    );
    // Everything was written live: no note that output was dropped.
    assert!(!stderr.contains("dropped"), "{file}: {stderr}");
}

#[test]
fn run_seq_to_three_million_prints_every_byte_with_createos() {
    seq_is_byte_exact("createos_provider.wasm", "cli-output-createos");
}

#[test]
fn run_seq_to_three_million_prints_every_byte_with_daytona() {
    seq_is_byte_exact("daytona_provider.wasm", "cli-output-daytona");
}
