//! The commands scenarios run, built as plain `execute-request`s, and the
//! words a failed check uses for an outcome.

use sandbox_host::error_text;
use sandbox_host::types::{ExecuteRequest, ExecuteResult, ProviderError};

/// A generous command timeout: long enough for a slow, shared machine,
/// never reached by a command that ends on its own.
pub const GENEROUS_MS: u64 = 120_000;

/// The timeout of commands that are meant to time out: long enough for
/// bash to start and print `ready` on a slow machine.
pub const SHORT_MS: u64 = 8_000;

/// `command args…` with no cwd, env or stdin and a generous timeout.
pub fn cmd(command: &str, args: &[&str]) -> ExecuteRequest {
    ExecuteRequest {
        command: command.to_owned(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        cwd: None,
        env: Vec::new(),
        stdin: None,
        timeout_ms: Some(GENEROUS_MS),
        result_chars: None,
    }
}

/// `bash -c script`.
pub fn bash(script: &str) -> ExecuteRequest {
    cmd("bash", &["-c", script])
}

/// A process tree that ignores SIGTERM, every process carrying `marker` in
/// its command line: a background `sleep` and a foreground one. Prints
/// `ready` once both exist. It never ends on its own.
pub fn stubborn_tree(marker: &str) -> ExecuteRequest {
    bash(&format!(
        "trap '' TERM; (exec -a {marker} sleep 600) & echo ready; exec -a {marker} sleep 600"
    ))
}

/// A command that leaves a process carrying `marker` running in the
/// background (its output detached) and exits at once.
pub fn background_leftover(marker: &str) -> ExecuteRequest {
    bash(&format!(
        "(exec -a {marker} sleep 600) </dev/null >/dev/null 2>&1 & echo started"
    ))
}

/// An outcome in words, for a failed check.
pub fn outcome_text(outcome: &Result<ExecuteResult, ProviderError>) -> String {
    match outcome {
        Ok(result) => format!(
            "exit code {:?}, signal {:?}, timed out {}, stdout {:?}, stderr {:?}",
            result.exit_code, result.signal, result.timed_out, result.stdout, result.stderr
        ),
        Err(error) => format!("error: {}", error_text(error)),
    }
}
