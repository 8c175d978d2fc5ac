//! Tests that cannot run on this machine say so where CI shows it.
//!
//! A test that needs what a machine may lack (root, a pids cgroup, loop
//! devices, a C compiler) returns early there. The test harness hides a
//! passing test's stderr, so such a test would look like a pass. Each one
//! calls [`skipped`] instead: the reason goes to stderr and, when the
//! environment variable [`SKIPS_FILE_VAR`] names a file, one line is
//! appended to it. `.ci/run` sets it and prints the file after the tests,
//! so every test that did not run is listed in the CI log.

use std::io::Write;

/// The environment variable naming the file that collects skipped tests.
pub const SKIPS_FILE_VAR: &str = "SANDBOX_TEST_SKIPS";

/// Records that the current test did not run, and why. The test then
/// returns; the caller writes the `return`.
pub fn skipped(reason: &str) {
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    let binary = std::env::args()
        .next()
        .and_then(|path| {
            std::path::Path::new(&path)
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    let line = format!("{binary} {test}: skipped: {reason}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os(SKIPS_FILE_VAR) {
        // Appends of one short line each: lines of tests running at once
        // do not mix.
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            let _ = file.write_all(format!("{line}\n").as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_appended_to_the_named_file_with_the_test_and_the_reason() {
        let file = std::env::temp_dir().join(format!("skips-{}", std::process::id()));
        let _ = std::fs::remove_file(&file);
        std::env::set_var(SKIPS_FILE_VAR, &file);
        skipped("no pids cgroup here");
        std::env::remove_var(SKIPS_FILE_VAR);
        let text = std::fs::read_to_string(&file).unwrap();
        let _ = std::fs::remove_file(&file);
        assert!(
            text.contains("a_skip_is_appended_to_the_named_file_with_the_test_and_the_reason"),
            "{text}"
        );
        assert!(text.ends_with(": skipped: no pids cgroup here\n"), "{text}");
    }
}
