//! Validation of a command request and the bash script that runs it.
//!
//! Every value is single-quoted, so the shell never interprets it: a `'`
//! inside a value becomes `'"'"'` (close the quote, a double-quoted `'`,
//! reopen). The script is run as `/bin/bash -lc <script>`.

use crate::config::MAX_TIMEOUT_MS;
use crate::http::is_valid_id;
use crate::types::{ExecuteRequest, InteractionRequest, ProviderError};

/// Why a request was refused before any network request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidRequest(pub String);

/// The checks before running a command in sandbox `sandbox_id`: the
/// request is valid ([`validate`]), its timeout (`default_timeout_ms` when
/// it sets none) is from 1 to [`MAX_TIMEOUT_MS`], and the id can go into a
/// path. Returns the timeout.
pub fn check(
    request: &ExecuteRequest,
    default_timeout_ms: u64,
    sandbox_id: &str,
) -> Result<u64, ProviderError> {
    validate(request).map_err(|e| ProviderError::InvalidRequest(e.0))?;
    let timeout_ms = request.timeout_ms.unwrap_or(default_timeout_ms);
    if timeout_ms == 0 || timeout_ms > MAX_TIMEOUT_MS {
        return Err(ProviderError::InvalidRequest(format!(
            "timeout must be from 1 to {MAX_TIMEOUT_MS} ms"
        )));
    }
    if !is_valid_id(sandbox_id) {
        return Err(ProviderError::ForeignLease(
            "the lease has an invalid sandbox id".into(),
        ));
    }
    Ok(timeout_ms)
}

/// Checks a request the way the spec's step 1 requires: a command, env
/// names matching `^[A-Za-z_][A-Za-z0-9_]*$`, and no NUL in any value.
pub fn validate(request: &ExecuteRequest) -> Result<(), InvalidRequest> {
    validate_command(&request.command, &request.args, &request.cwd, &request.env)
}

fn validate_command(
    command: &str,
    args: &[String],
    cwd: &Option<String>,
    env: &[(String, String)],
) -> Result<(), InvalidRequest> {
    if command.is_empty() {
        return Err(InvalidRequest("command must not be empty".into()));
    }
    if command.contains('\0') {
        return Err(InvalidRequest("command contains a NUL character".into()));
    }
    if let Some(i) = args.iter().position(|a| a.contains('\0')) {
        return Err(InvalidRequest(format!(
            "argument {i} contains a NUL character"
        )));
    }
    if let Some(cwd) = cwd {
        if cwd.is_empty() {
            return Err(InvalidRequest("cwd must not be empty".into()));
        }
        if cwd.contains('\0') {
            return Err(InvalidRequest("cwd contains a NUL character".into()));
        }
    }
    for (name, value) in env {
        if !is_env_name(name) {
            // Quoted and escaped as Rust writes a string (control
            // characters visible); the same code the component already
            // carries, where `escape_default` cost another 1.3 KiB.
            return Err(InvalidRequest(format!(
                "environment variable name {name:?} is invalid (must match ^[A-Za-z_][A-Za-z0-9_]*$)"
            )));
        }
        if value.contains('\0') {
            return Err(InvalidRequest(format!(
                "environment variable `{name}` contains a NUL character"
            )));
        }
    }
    Ok(())
}

/// Checks an interactive process's request as [`validate`] checks a
/// command's, and that a terminal has at least one column and one row and
/// a timeout, when given, is from 1 to [`MAX_TIMEOUT_MS`].
pub fn validate_interaction(request: &InteractionRequest) -> Result<(), InvalidRequest> {
    validate_command(&request.command, &request.args, &request.cwd, &request.env)?;
    if let Some(size) = request.terminal {
        if size.columns == 0 || size.rows == 0 {
            return Err(InvalidRequest(
                "a terminal needs at least one column and one row".into(),
            ));
        }
    }
    if let Some(timeout_ms) = request.timeout_ms {
        if timeout_ms == 0 || timeout_ms > MAX_TIMEOUT_MS {
            return Err(InvalidRequest(format!(
                "timeout must be from 1 to {MAX_TIMEOUT_MS} ms"
            )));
        }
    }
    Ok(())
}

/// True for a portable environment variable name.
pub fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Single-quotes a value for bash.
pub fn quote(value: &str) -> String {
    let mut quoted = String::with_capacity(value.len() + 2);
    quoted.push('\'');
    for c in value.chars() {
        if c == '\'' {
            quoted.push_str("'\"'\"'");
        } else {
            quoted.push(c);
        }
    }
    quoted.push('\'');
    quoted
}

/// Builds the script of a validated request.
///
/// `cd -- '<cwd>' || exit` when a cwd is given, then
/// `exec env -- K='v' ... '<command>' '<arg>' ... < '<stdin file>'`, or
/// `< /dev/null` when no stdin was given: the command never reads the
/// process's stdin pipe, so no request is needed to close it. `env` applies the variables to the
/// command alone, and its `--` keeps a command starting with `-` from being
/// read as an option. GNU env reads every leading `NAME=VALUE` word as an
/// assignment, so a command whose name contains `=` is started through
/// `/bin/bash -c 'exec -- "$@"' bash` instead, which takes it literally.
/// Without variables the shell execs the command itself
/// (`exec -- '<command>' ...`: bash's `exec` also searches `PATH`, takes
/// the word after `--` literally, and exits 127 or 126 as `env` does when
/// the command is missing or not executable), one program start fewer
/// per command.
pub fn build(request: &ExecuteRequest, stdin_path: Option<&str>) -> String {
    let mut script = command_script(&request.cwd, &request.env, &request.command, &request.args);
    script.push_str(" < ");
    match stdin_path {
        Some(path) => script.push_str(&quote(path)),
        None => script.push_str("/dev/null"),
    }
    script
}

/// The script of a validated interactive process
/// ([`validate_interaction`]): as [`build`]'s, with the process's own
/// stdin (its terminal, or the pipe the host writes to) left to the
/// command.
pub fn build_interactive(request: &InteractionRequest) -> String {
    command_script(&request.cwd, &request.env, &request.command, &request.args)
}

fn command_script(
    cwd: &Option<String>,
    env: &[(String, String)],
    command: &str,
    args: &[String],
) -> String {
    let mut script = String::new();
    if let Some(cwd) = cwd {
        script.push_str("cd -- ");
        script.push_str(&quote(cwd));
        script.push_str(" || exit\n");
    }
    if env.is_empty() {
        script.push_str("exec --");
    } else {
        script.push_str("exec env --");
        for (name, value) in env {
            script.push(' ');
            script.push_str(name);
            script.push('=');
            script.push_str(&quote(value));
        }
        if command.contains('=') {
            script.push_str(" /bin/bash -c 'exec -- \"$@\"' bash");
        }
    }
    script.push(' ');
    script.push_str(&quote(command));
    for arg in args {
        script.push(' ');
        script.push_str(&quote(arg));
    }
    script
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn request(command: &str, args: &[&str]) -> ExecuteRequest {
        ExecuteRequest {
            command: command.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            cwd: None,
            env: Vec::new(),
            stdin: None,
            timeout_ms: None,
            result_chars: None,
        }
    }

    /// Runs a script the way the sandbox does and returns its stdout.
    fn run(script: &str) -> String {
        let out = Command::new("/bin/bash")
            .arg("-c")
            .arg(script)
            .output()
            .expect("bash runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn quoting_closes_and_reopens_around_single_quotes() {
        assert_eq!(quote("a'b"), "'a'\"'\"'b'");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("$(x) `y` \\ \" ;|&"), "'$(x) `y` \\ \" ;|&'");
    }

    // Runs a real bash: native only.
    #[test]
    fn hostile_arguments_reach_the_command_verbatim() {
        let hostile = [
            "'; rm -rf / #",
            "$(touch /tmp/pwned)",
            "`id`",
            "a\nb",
            "--help",
            "*",
            "\\'\"",
            "€ ünïcödé",
            "",
        ];
        let req = request("printf", &["%s|"]);
        let mut req = req;
        req.args.extend(hostile.iter().map(|s| s.to_string()));
        let expected: String = hostile.iter().map(|s| format!("{s}|")).collect();
        assert_eq!(run(&build(&req, None)), expected);
    }

    // Runs a real bash: native only.
    #[test]
    fn env_and_cwd_are_applied_without_interpretation() {
        let dir = std::env::temp_dir().join("createos script cwd 'q' $(x)");
        std::fs::create_dir_all(&dir).unwrap();
        let mut req = request("sh", &["-c", "pwd; printf '%s' \"$HOSTILE\""]);
        req.cwd = Some(dir.to_string_lossy().into_owned());
        req.env = vec![("HOSTILE".into(), "'$(id)' \"`x`\" ; exit 3".into())];
        let out = run(&build(&req, None));
        assert_eq!(out, format!("{}\n'$(id)' \"`x`\" ; exit 3", dir.display()));
    }

    // Runs a real bash: native only.
    #[test]
    fn a_missing_cwd_fails_the_command_instead_of_running_elsewhere() {
        let mut req = request("echo", &["ran"]);
        req.cwd = Some("/nonexistent/dir".into());
        assert_eq!(run(&build(&req, None)), "");
    }

    // Runs a real bash: native only.
    #[test]
    fn commands_with_dashes_or_equals_are_taken_literally() {
        for env in [Vec::new(), vec![("V".to_owned(), "1".to_owned())]] {
            let mut req = request("-l", &[]);
            req.env = env.clone();
            // A subshell: a script whose `exec` failed must not end the
            // shell that reports its status.
            assert_eq!(
                run(&format!("({}) 2>/dev/null; echo $?", build(&req, None))),
                "127\n",
                "`-l` runs no login shell (env {env:?})"
            );
            let mut req = request("A=1", &[]);
            req.env = env.clone();
            let out = Command::new("/bin/bash")
                .arg("-c")
                .arg(build(&req, None))
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(127), "env {env:?}");
            assert!(out.stdout.is_empty(), "env must not print the environment");
        }
    }

    // Runs a real bash: native only.
    #[test]
    fn a_missing_or_unexecutable_command_exits_as_env_would() {
        let file =
            std::env::temp_dir().join(format!("createos-script-noexec-{}", std::process::id()));
        std::fs::write(&file, "echo ran\n").unwrap();
        for env in [Vec::new(), vec![("V".to_owned(), "1".to_owned())]] {
            for (command, code) in [("no-such-command-here", 127), (file.to_str().unwrap(), 126)] {
                let mut req = request(command, &[]);
                req.env = env.clone();
                let out = Command::new("/bin/bash")
                    .arg("-c")
                    .arg(build(&req, None))
                    .output()
                    .unwrap();
                assert_eq!(out.status.code(), Some(code), "{command} with env {env:?}");
                assert!(out.stdout.is_empty());
            }
        }
        std::fs::remove_file(&file).ok();
    }

    #[test]
    fn without_variables_the_shell_execs_the_command_itself() {
        let req = request("echo", &["hi"]);
        assert_eq!(build(&req, None), "exec -- 'echo' 'hi' < /dev/null");
        let mut req = request("echo", &["hi"]);
        req.env = vec![("V".into(), "1".into())];
        assert_eq!(
            build(&req, None),
            "exec env -- V='1' 'echo' 'hi' < /dev/null"
        );
    }

    // Runs a real bash: native only.
    #[test]
    fn stdin_comes_from_the_staged_file() {
        let path = std::env::temp_dir().join("createos-script-stdin 'x'");
        std::fs::write(&path, "from file").unwrap();
        let req = request("cat", &[]);
        assert_eq!(
            run(&build(&req, Some(&path.to_string_lossy()))),
            "from file"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn validation_refuses_bad_input() {
        assert!(validate(&request("", &[])).is_err());
        assert!(validate(&request("a\0", &[])).is_err());
        assert!(validate(&request("ls", &["\0"])).is_err());
        for name in ["", "1A", "A-B", "A B", "É", "A=B"] {
            let mut req = request("ls", &[]);
            req.env = vec![(name.into(), "v".into())];
            assert!(validate(&req).is_err(), "{name:?}");
        }
        let mut req = request("ls", &[]);
        req.env = vec![("_ok_1".into(), "v".into())];
        assert!(validate(&req).is_ok());
        req.env = vec![("OK".into(), "a\0".into())];
        assert!(validate(&req).is_err());
        req.env.clear();
        req.cwd = Some("/a\0".into());
        assert!(validate(&req).is_err());
    }
}
