//! The request builders: `ExecuteRequest`, a command with defaults
//! elsewhere (no working directory, environment, input or timeout),
//! adjusted with [`RequestExt`]; `AcquireRequest` for a run.

use sandbox_host::types::{AcquireRequest, ExecuteRequest};

/// A request to acquire a lease for run `run_id`, with defaults elsewhere
/// (no working directory, workspace mode or expiry asked for).
pub fn acquire(run_id: &str) -> AcquireRequest {
    AcquireRequest {
        run_id: run_id.into(),
        requested_cwd: None,
        workspace_mode: None,
        requested_expires_at: None,
        egress: None,
        adapter_type: None,
        image: None,
        template: None,
    }
}

/// A request to run `program args...`, with defaults elsewhere.
pub fn command(program: &str, args: &[&str]) -> ExecuteRequest {
    ExecuteRequest {
        command: program.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        cwd: None,
        env: Vec::new(),
        stdin: None,
        timeout_ms: None,
        result_chars: None,
    }
}

/// A request to run `script` with `/bin/sh -c`.
pub fn sh(script: &str) -> ExecuteRequest {
    command("/bin/sh", &["-c", script])
}

/// A request to run `script` with `/bin/bash -c`.
pub fn bash(script: &str) -> ExecuteRequest {
    command("/bin/bash", &["-c", script])
}

/// Adjusts a request built by [`command`], [`sh`] or [`bash`].
pub trait RequestExt {
    /// The command's timeout in milliseconds (`None`: the provider's).
    fn timeout(self, timeout_ms: Option<u64>) -> Self;
    /// The command's timeout in milliseconds.
    fn timeout_ms(self, timeout_ms: u64) -> Self;
    /// The bytes given to the command's standard input.
    fn stdin(self, input: &[u8]) -> Self;
    /// One more environment variable for the command.
    fn env(self, name: &str, value: &str) -> Self;
    /// The command's working directory.
    fn cwd(self, dir: &str) -> Self;
}

impl RequestExt for ExecuteRequest {
    fn timeout(mut self, timeout_ms: Option<u64>) -> Self {
        self.timeout_ms = timeout_ms;
        self
    }

    fn timeout_ms(self, timeout_ms: u64) -> Self {
        self.timeout(Some(timeout_ms))
    }

    fn stdin(mut self, input: &[u8]) -> Self {
        self.stdin = Some(input.to_vec());
        self
    }

    fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    fn cwd(mut self, dir: &str) -> Self {
        self.cwd = Some(dir.into());
        self
    }
}
