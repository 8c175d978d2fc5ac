//! Running commands: exit codes, env, cwd, stdin, hostile quoting.

use anyhow::{ensure, Result};
use sandbox_host::types::{ExecuteRequest, ProviderError};
use sandbox_host::CancelToken;

use crate::command::{bash, cmd, outcome_text};
use crate::procs::unique_marker;
use crate::scenarios::{succeeded, with_session};
use crate::target::Target;
use crate::verdict::Verdict;

/// Each command's own exit code and output per stream; a killed command
/// and a missing command are never a success.
pub fn exit_codes(target: &Target) -> Result<Verdict> {
    with_session(target, None, |s| {
        let lease = s.acquire()?;
        let id = &lease.id;

        let echo = s.run(id, &cmd("echo", &["hello"]))?;
        ensure!(
            echo.exit_code == Some(0)
                && echo.stdout == "hello\n"
                && echo.stderr.is_empty()
                && !echo.timed_out
                && echo.signal.is_none(),
            "echo hello: {}",
            outcome_text(&Ok(echo))
        );
        ensure!(
            !echo.process_id.is_empty(),
            "a result names the process it ran"
        );

        let both = s.run(id, &bash("echo out; echo err >&2; exit 7"))?;
        ensure!(
            both.exit_code == Some(7) && both.stdout == "out\n" && both.stderr == "err\n",
            "a command printing on both streams and exiting 7: {}",
            outcome_text(&Ok(both))
        );

        for code in [1, 2, 42, 255] {
            let exited = s.run(id, &bash(&format!("exit {code}")))?;
            ensure!(
                exited.exit_code == Some(code) && !exited.timed_out,
                "exit {code}: {}",
                outcome_text(&Ok(exited))
            );
        }
        let failed = s.run(id, &cmd("false", &[]))?;
        ensure!(
            failed.exit_code == Some(1),
            "false: {}",
            outcome_text(&Ok(failed))
        );

        // Killed by a signal: the signal's name, or the shell's 128 + 9.
        let killed = s.run(id, &bash("echo before; kill -KILL $$; echo after"))?;
        ensure!(
            (killed.signal.as_deref() == Some("SIGKILL") || killed.exit_code == Some(137))
                && killed.stdout == "before\n"
                && !killed.timed_out,
            "a command killed by SIGKILL: {}",
            outcome_text(&Ok(killed))
        );

        // A missing command: a non-zero exit (a shell says 127) or a typed
        // error, never a success and never a trap.
        let missing = format!("kit-no-such-command-{}", unique_marker());
        let outcome = s.execute(id, &cmd(&missing, &[]), None, CancelToken::new())?;
        let is_failure = match &outcome {
            Ok(result) => result.exit_code.is_some_and(|c| c != 0),
            Err(error) => !matches!(error, ProviderError::CleanupFailed(_)),
        };
        ensure!(
            is_failure,
            "a missing command must fail plainly: {}",
            outcome_text(&outcome)
        );
        Ok(Verdict::passed())
    })
}

/// Env values, the working directory and stdin reach the command exactly;
/// no stdin is an immediate end of input, not a hang.
pub fn env_cwd_stdin(target: &Target) -> Result<Verdict> {
    with_session(target, None, |s| {
        let lease = s.acquire()?;
        let id = &lease.id;
        let run = |request: ExecuteRequest, what: &str| {
            succeeded(what, s.execute(id, &request, None, CancelToken::new())?)
        };

        let env = ExecuteRequest {
            env: vec![
                ("KIT_ONE".into(), "one".into()),
                ("KIT_TWO".into(), "two words".into()),
                ("KIT_EMPTY".into(), String::new()),
            ],
            ..bash("printf '%s|%s|%s|%s' \"$KIT_ONE\" \"$KIT_TWO\" \"${KIT_EMPTY-unset}\" \"${KIT_NEVER-unset}\"")
        };
        let out = run(env, "env values")?;
        ensure!(
            out.stdout == "one|two words||unset",
            "env values: got {:?}",
            out.stdout
        );

        let cwd = ExecuteRequest {
            cwd: Some("/tmp".into()),
            ..bash("pwd; echo here > kit-cwd-file; cat /tmp/kit-cwd-file")
        };
        let out = run(cwd, "cwd /tmp")?;
        ensure!(
            out.stdout == "/tmp\nhere\n",
            "a command in cwd /tmp: got {:?}",
            out.stdout
        );

        let cases: [(&str, Option<Vec<u8>>, String); 4] = [
            ("no stdin", None, String::new()),
            ("empty stdin", Some(Vec::new()), String::new()),
            (
                "text stdin",
                Some(b"line one\nline two\nno newline".to_vec()),
                "line one\nline two\nno newline".into(),
            ),
            (
                "stdin with quotes and unicode",
                Some("'\"$(x)`y` ünï 🦀\n".as_bytes().to_vec()),
                "'\"$(x)`y` ünï 🦀\n".into(),
            ),
        ];
        for (what, stdin, expected) in cases {
            let out = run(
                ExecuteRequest {
                    stdin,
                    ..cmd("cat", &[])
                },
                what,
            )?;
            ensure!(out.stdout == expected, "{what}: cat gave {:?}", out.stdout);
        }

        let big = vec![b'x'; 1 << 20];
        let out = run(
            ExecuteRequest {
                stdin: Some(big),
                ..cmd("wc", &["-c"])
            },
            "1 MiB of stdin",
        )?;
        ensure!(
            out.stdout.trim() == "1048576",
            "1 MiB of stdin: wc -c counted {:?}",
            out.stdout
        );
        Ok(Verdict::passed())
    })
}

/// What a hostile argument list looks like.
const HOSTILE: &[&str] = &[
    "plain",
    "",
    " lead and trail ",
    "it's",
    "\"double\"",
    "'\"'\"'",
    "$HOME",
    "${PATH}",
    "a;b && c || d",
    "| > < & 2>&1",
    "back\\slash\\",
    "line1\nline2\n",
    "tab\there\r",
    "*",
    "~",
    "-n",
    "--",
    "%s %d %%",
    "!bang #hash",
    "ünïcödé ✓ 日本語 🦀",
];

/// Quotes, substitutions, globs, newlines and Unicode in arguments, env
/// values and the cwd arrive verbatim, and nothing in them runs.
pub fn hostile_quoting(target: &Target) -> Result<Verdict> {
    with_session(target, None, |s| {
        let lease = s.acquire()?;
        let id = &lease.id;
        let marker = unique_marker();
        let pwned = format!("/tmp/kitpwned-{marker}");
        let mut hostile: Vec<String> = HOSTILE.iter().map(|a| (*a).to_owned()).collect();
        hostile.push(format!("$(touch {pwned})"));
        hostile.push(format!("`touch {pwned}`"));
        hostile.push(format!("; touch {pwned}"));
        let expected: String = hostile.iter().map(|a| format!("[{a}]\n")).collect();

        let mut args = vec!["[%s]\\n".to_owned()];
        args.extend(hostile.iter().cloned());
        let request = ExecuteRequest {
            args,
            ..cmd("printf", &[])
        };
        let out = succeeded(
            "hostile arguments",
            s.execute(id, &request, None, CancelToken::new())?,
        )?;
        ensure!(
            out.stdout == expected,
            "hostile arguments: printf printed {:?}, expected {:?}",
            out.stdout,
            expected
        );

        let names: Vec<String> = (0..hostile.len()).map(|i| format!("KIT_H{i}")).collect();
        let script = format!(
            "printf '[%s]\\n' {}",
            names
                .iter()
                .map(|n| format!("\"${n}\""))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let request = ExecuteRequest {
            env: names.iter().cloned().zip(hostile.iter().cloned()).collect(),
            ..bash(&script)
        };
        let out = succeeded(
            "hostile env values",
            s.execute(id, &request, None, CancelToken::new())?,
        )?;
        ensure!(
            out.stdout == expected,
            "hostile env values: printed {:?}, expected {:?}",
            out.stdout,
            expected
        );

        let dir = format!("/tmp/kit dir 'q' \"d\" $(touch {pwned}) ü");
        succeeded(
            "mkdir of a hostile directory name",
            s.execute(id, &cmd("mkdir", &["-p", &dir]), None, CancelToken::new())?,
        )?;
        let request = ExecuteRequest {
            cwd: Some(dir.clone()),
            ..cmd("pwd", &[])
        };
        let out = succeeded(
            "a hostile cwd",
            s.execute(id, &request, None, CancelToken::new())?,
        )?;
        ensure!(
            out.stdout == format!("{dir}\n"),
            "a hostile cwd: pwd printed {:?}",
            out.stdout
        );

        let check = s.run(id, &cmd("test", &["-e", &pwned]))?;
        ensure!(
            check.exit_code == Some(1),
            "a substitution in an argument, env value or cwd ran: {pwned} exists ({})",
            outcome_text(&Ok(check))
        );
        Ok(Verdict::passed())
    })
}
