//! Interactive processes (contract 0.6.0, `provider.interact`): a terminal
//! is a real pseudo-terminal of the size asked (and of the new size after a
//! resize, where the provider claims `terminal-resize`), `^C` reaches its
//! foreground process, a REPL answers lines typed a while apart; pipes
//! take events queued together without waiting for a later one and carry
//! 10 MB byte-exact both ways; `end` leaves nothing running.
//!
//! A target that claims neither `login-pty` nor `duplex-channels` has
//! nothing to check here (not applicable).

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Result};
use sandbox_host::types::{
    Capabilities, ExecuteResult, InteractionEvent, InteractionRequest, OutputStream, ProviderError,
    TerminalSize,
};
use sandbox_host::{error_text, CancelToken, Interaction, OutputSink};

use crate::command::outcome_text;
use crate::procs::unique_marker;
use crate::scenarios::{not_observable, with_session};
use crate::session::Session;
use crate::target::Target;
use crate::verdict::Verdict;

/// How long the kit waits for output it expects (a bound against a hang,
/// not a measure of speed).
const PATIENCE: Duration = Duration::from_secs(60);

/// A running interactive process: its events and its output so far.
struct Talk {
    interaction: Interaction,
    output: Arc<Mutex<Vec<u8>>>,
}

impl Talk {
    fn send(&self, event: InteractionEvent) {
        self.interaction.send(event);
    }

    fn type_text(&self, text: &str) {
        self.send(InteractionEvent::Input(text.as_bytes().to_vec()));
    }

    fn output(&self) -> Vec<u8> {
        self.output
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.output()).into_owned()
    }

    /// Waits until the output contains `needle` (after `from` bytes).
    fn wait_for(&self, from: usize, needle: &str) -> Result<usize> {
        let found = test_support::eventually(PATIENCE, || {
            let output = self.output();
            String::from_utf8_lossy(&output[from.min(output.len())..]).contains(needle)
        });
        ensure!(
            found,
            "expected {needle:?} in the output, got {:?}",
            self.text()
        );
        Ok(self.output().len())
    }
}

/// Runs `request` on `lease` through the runtime while `script` talks to
/// it from this thread once it started; when `script` fails, the process
/// is ended before the failure is reported.
fn talk<T>(
    session: &Session,
    lease: &str,
    request: &InteractionRequest,
    script: impl FnOnce(&Talk) -> Result<T>,
) -> Result<Talked<T>> {
    let talk = Talk {
        interaction: Interaction::new(),
        output: Arc::default(),
    };
    let sink: OutputSink = {
        let output = talk.output.clone();
        Arc::new(move |_stream: OutputStream, chunk: &[u8]| {
            output
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(chunk)
        })
    };
    thread::scope(|scope| {
        let running = scope.spawn(|| {
            session.runtime().interact(
                session.env(),
                lease,
                request,
                talk.interaction.clone(),
                Some(sink),
                CancelToken::new(),
            )
        });
        let started = test_support::eventually(PATIENCE, || {
            talk.interaction.has_started() || running.is_finished()
        });
        let value = if started && talk.interaction.has_started() {
            script(&talk)
        } else {
            Err(anyhow!("the interactive process never said it started"))
        };
        if value.is_err() {
            talk.send(InteractionEvent::End);
        }
        let outcome = running
            .join()
            .map_err(|_| anyhow!("the interact call panicked"))??;
        Ok((value?, outcome, talk.output()))
    })
}

/// What [`talk`] gives: the script's value, the process's outcome, and
/// everything it printed.
type Talked<T> = (T, Result<ExecuteResult, ProviderError>, Vec<u8>);

fn terminal(command: &str, args: &[&str], columns: u16, rows: u16) -> InteractionRequest {
    InteractionRequest {
        command: command.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        cwd: None,
        env: vec![],
        terminal: Some(TerminalSize { columns, rows }),
        timeout_ms: Some(120_000),
        result_chars: None,
    }
}

fn claims(session: &Session, capability: Capabilities) -> bool {
    session
        .runtime()
        .description()
        .capabilities
        .contains(capability)
}

fn exited_zero(what: &str, outcome: &Result<ExecuteResult, ProviderError>) -> Result<()> {
    match outcome {
        Ok(result) if result.exit_code == Some(0) && !result.timed_out => Ok(()),
        other => bail!("{what}: expected exit code 0, got {}", outcome_text(other)),
    }
}

/// A terminal: `stty size` answers the size asked (and the new size after
/// a resize, where claimed), `tty` names a `/dev/pts/N`, a Python REPL
/// answers two lines typed a while apart, `^C` ends a `sleep`.
pub fn terminal_session(target: &Target) -> Result<Verdict> {
    with_session(target, None, |s| {
        if !claims(s, Capabilities::LOGIN_PTY) {
            return Ok(Verdict::NotApplicable(
                "the provider does not claim login-pty".into(),
            ));
        }
        let mut notes = Vec::new();
        let lease = s.acquire()?;
        let id = &lease.id;

        let request = terminal("sh", &["-c", "stty size; tty"], 100, 30);
        let (text, outcome, _) = talk(s, id, &request, |t| {
            t.wait_for(0, "/dev/pts/")?;
            Ok(t.text())
        })?;
        exited_zero("stty size; tty", &outcome)?;
        ensure!(
            text.contains("30 100"),
            "`stty size` in a 100x30 terminal said {text:?}"
        );
        let tty = text
            .lines()
            .find_map(|line| line.trim().strip_prefix("/dev/pts/"))
            .unwrap_or("");
        ensure!(
            !tty.is_empty() && tty.chars().all(|c| c.is_ascii_digit()),
            "`tty` named no /dev/pts/N: {text:?}"
        );

        if claims(s, Capabilities::TERMINAL_RESIZE) {
            let request = terminal("sh", &["-c", "stty size; read line; stty size"], 80, 24);
            let (_, outcome, _) = talk(s, id, &request, |t| {
                let seen = t.wait_for(0, "24 80")?;
                t.send(InteractionEvent::Resize(TerminalSize {
                    columns: 120,
                    rows: 40,
                }));
                t.type_text("\r");
                t.wait_for(seen, "40 120")
            })?;
            exited_zero("stty size after a resize", &outcome)?;
        } else {
            notes.push(
                "resize not checked: the provider does not claim terminal-resize".to_string(),
            );
        }

        let mut repl = terminal("python3", &["-q", "-i"], 80, 24);
        repl.env = vec![("PYTHON_BASIC_REPL".into(), "1".into())];
        let (_, outcome, _) = talk(s, id, &repl, |t| {
            let seen = t.wait_for(0, ">>> ")?;
            t.type_text("print(6 * 7)\r");
            let seen = t.wait_for(seen, "42")?;
            // The second line comes a while later: the REPL waits for it.
            thread::sleep(Duration::from_millis(500));
            t.type_text("print('a' + 'b')\r");
            t.wait_for(seen, "ab")?;
            t.type_text("exit()\r");
            Ok(())
        })?;
        exited_zero("python3 -i", &outcome)?;

        let request = terminal("sh", &["-c", "echo ready; exec sleep 600"], 80, 24);
        let (_, outcome, _) = talk(s, id, &request, |t| {
            t.wait_for(0, "ready")?;
            thread::sleep(Duration::from_millis(200));
            t.type_text("\x03");
            Ok(())
        })?;
        match &outcome {
            Ok(result)
                if result.signal.as_deref() == Some("SIGINT") || result.exit_code == Some(130) => {}
            other => bail!(
                "^C in the terminal did not end sleep by SIGINT: {}",
                outcome_text(other)
            ),
        }
        Ok(Verdict::Passed(notes))
    })
}

/// Pipes: three inputs queued together all reach `head -n 3`, which
/// answers nothing before it has them all, with no later event (a host
/// writes several frames at once, as Paperclip's HTTP/2 bridge does, and a
/// provider that takes one event per wake-up must still be woken for the
/// rest); `cat` gives back 10 MB of arbitrary bytes exactly once its input
/// is closed.
pub fn pipes_round_trip(target: &Target) -> Result<Verdict> {
    with_session(target, None, |s| {
        if !claims(s, Capabilities::DUPLEX_CHANNELS) {
            return Ok(Verdict::NotApplicable(
                "the provider does not claim duplex-channels".into(),
            ));
        }
        let lease = s.acquire()?;
        let head = InteractionRequest {
            command: "head".into(),
            args: vec!["-n".into(), "3".into()],
            cwd: None,
            env: vec![],
            terminal: None,
            timeout_ms: Some(120_000),
            result_chars: Some(0),
        };
        let lines = ["one\n", "two\n", "three\n"];
        let ((), outcome, answered) = talk(s, &lease.id, &head, |t| {
            for line in lines {
                t.type_text(line);
            }
            t.wait_for(0, "three\n").map(|_| ())
        })?;
        exited_zero("head -n 3", &outcome)?;
        ensure!(
            answered == lines.concat().as_bytes(),
            "head -n 3 answered {:?} to three lines queued together",
            String::from_utf8_lossy(&answered)
        );
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let bytes: Vec<u8> = (0..10_000_000)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 24) as u8
            })
            .collect();
        let request = InteractionRequest {
            command: "cat".into(),
            args: vec![],
            cwd: None,
            env: vec![],
            terminal: None,
            timeout_ms: Some(300_000),
            result_chars: Some(0),
        };
        let ((), outcome, echoed) = talk(s, &lease.id, &request, |t| {
            for piece in bytes.chunks(1 << 20) {
                t.send(InteractionEvent::Input(piece.to_vec()));
            }
            t.send(InteractionEvent::CloseInput);
            Ok(())
        })?;
        exited_zero("cat", &outcome)?;
        ensure!(
            echoed.len() == bytes.len(),
            "cat gave back {} bytes of the {} sent",
            echoed.len(),
            bytes.len()
        );
        ensure!(
            echoed == bytes,
            "cat gave back other bytes than those sent (first difference at byte {})",
            echoed
                .iter()
                .zip(&bytes)
                .position(|(a, b)| a != b)
                .unwrap_or(0)
        );
        Ok(Verdict::passed())
    })
}

/// `end` ends the process and its whole tree, proven: the result says
/// SIGTERM (or a `cleanup-failed` would have said it may run) and nothing
/// of it is left.
pub fn end_leaves_no_process(target: &Target) -> Result<Verdict> {
    with_session(target, None, |s| {
        let pty = claims(s, Capabilities::LOGIN_PTY);
        if !pty && !claims(s, Capabilities::DUPLEX_CHANNELS) {
            return Ok(Verdict::NotApplicable(
                "the provider claims neither login-pty nor duplex-channels".into(),
            ));
        }
        let lease = s.acquire()?;
        let marker = unique_marker();
        // A tree that ignores SIGTERM, every process carrying the marker.
        let script = format!(
            "trap '' TERM; (exec -a {marker} sleep 600) & echo ready; exec -a {marker} sleep 600"
        );
        let mut request = terminal("bash", &["-c", &script], 80, 24);
        if !pty {
            request.terminal = None;
        }
        let (_, outcome, _) = talk(s, &lease.id, &request, |t| {
            t.wait_for(0, "ready")?;
            t.send(InteractionEvent::End);
            Ok(())
        })?;
        match &outcome {
            Ok(result) if result.signal.is_some() && result.exit_code.is_none() => {}
            Ok(_) => bail!(
                "end: expected a process ended by a signal, got {}",
                outcome_text(&outcome)
            ),
            Err(error) => bail!("end: {}", error_text(error)),
        }
        match s.survivors(&marker) {
            Some(left) => ensure!(left.is_empty(), "end left processes running: {left:?}"),
            None => return Ok(Verdict::Passed(vec![not_observable("no process left")])),
        }
        Ok(Verdict::passed())
    })
}
