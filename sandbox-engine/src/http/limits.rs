//! Input limits: how large a request and each of its fields may be. Every
//! limit is checked before the value is used, and a request over a limit is
//! a 400 (413 for bodies) naming the field, never a silent truncation.

use std::collections::BTreeMap;

use super::error::ApiError;

/// Largest file upload: 256 MiB, enforced by [`super::files::write_stream`]
/// while the body streams to disk (every other body: [`MAX_JSON_BODY`]).
pub const MAX_BODY: usize = 256 * 1024 * 1024;

/// Largest JSON request body (every route but file uploads): 4 MiB. Bodies
/// are refused with 413 before more than this is read.
pub const MAX_JSON_BODY: usize = 4 * 1024 * 1024;

/// Largest short string field (`shape`, `rootfs`, `region`, `cwd`,
/// `signal`): 4 KiB.
pub const MAX_NAME: usize = 4096;

/// Largest single argument or environment value: 128 KiB (Linux's
/// `MAX_ARG_STRLEN`; `execve` refuses longer strings anyway).
pub const MAX_ARG: usize = 128 * 1024;

/// Most arguments of one command.
pub const MAX_ARGS: usize = 4096;

/// Most environment entries of one sandbox or one process.
pub const MAX_ENV_ENTRIES: usize = 1024;

/// Most bytes of `cmd` + `args` + environment together: 1 MiB (below the
/// kernel's `execve` limit of a quarter of the stack limit).
pub const MAX_EXEC_TOTAL: usize = 1024 * 1024;

/// 400 when an optional short string field is over [`MAX_NAME`].
pub fn name(field: &str, value: Option<&str>) -> Result<(), ApiError> {
    match value {
        Some(v) if v.len() > MAX_NAME => Err(ApiError::bad_request(format!(
            "{field} is {} bytes long; at most {MAX_NAME} are accepted",
            v.len()
        ))),
        _ => Ok(()),
    }
}

/// 400 when an environment map has too many entries or too long keys or
/// values.
pub fn env(field: &str, env: &BTreeMap<String, String>) -> Result<usize, ApiError> {
    if env.len() > MAX_ENV_ENTRIES {
        return Err(ApiError::bad_request(format!(
            "{field} has {} entries; at most {MAX_ENV_ENTRIES} are accepted",
            env.len()
        )));
    }
    let mut total = 0;
    for (k, v) in env {
        if k.len() > MAX_NAME || v.len() > MAX_ARG {
            return Err(ApiError::bad_request(format!(
                "{field} entry {:?} is too long (keys up to {MAX_NAME} bytes, values up to {MAX_ARG})",
                truncate(k, 64)
            )));
        }
        total += k.len() + v.len() + 2;
    }
    Ok(total)
}

/// 400 when a command line is over the argument limits.
pub fn command(cmd: &str, args: &[String]) -> Result<usize, ApiError> {
    if cmd.len() > MAX_ARG {
        return Err(ApiError::bad_request(format!(
            "cmd is {} bytes long; at most {MAX_ARG} are accepted",
            cmd.len()
        )));
    }
    if args.len() > MAX_ARGS {
        return Err(ApiError::bad_request(format!(
            "{} args given; at most {MAX_ARGS} are accepted",
            args.len()
        )));
    }
    if let Some((i, a)) = args.iter().enumerate().find(|(_, a)| a.len() > MAX_ARG) {
        return Err(ApiError::bad_request(format!(
            "args[{i}] is {} bytes long; at most {MAX_ARG} are accepted",
            a.len()
        )));
    }
    Ok(cmd.len() + 1 + args.iter().map(|a| a.len() + 1).sum::<usize>())
}

/// The first `n` characters of `s`, for messages.
fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// What a client asking to open a sandbox's port hears while the operator
/// has ingress off.
pub const INGRESS_OFF: &str = "ingress is off on this engine: nothing outside a sandbox can reach \
     its ports; the operator enables it with `createos-local --ingress` (needs sandbox machines)";

/// A port of a sandbox from a request path: 1–65535, or why not.
pub fn port(text: &str) -> Result<u16, BadPort> {
    text.parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| BadPort {
            text: text.to_string(),
        })
}

/// A port in a request path that is not one (a 400 on both faces).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("port {text:?} is not a port number (1-65535)")]
pub struct BadPort {
    /// The path's text.
    pub text: String,
}
