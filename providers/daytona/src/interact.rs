//! Running one interactive process (`provider.interact`) over Daytona's
//! session commands, the only running process the toolbox lets a client
//! talk to over plain HTTP. (Its PTY sessions carry their data over a
//! WebSocket, which a `wasi:http` component cannot open.)
//!
//! What the HTTP API gives: `POST .../command/{cid}/input {"data"}`
//! writes text to an asynchronous command's stdin; there is no way to
//! close that stdin, to send it bytes that are not UTF-8, to signal a
//! command, or to get a terminal. So the session command is a small bash
//! controller ([`controller`]) that does those inside the sandbox, driven
//! by one-line frames written as that input:
//! - `d LEN\n` then LEN characters of base64: input bytes, exactly (split
//!   UTF-8, binary, `^C` as the byte 3), decoded and written to the
//!   command's stdin (its terminal, or its pipe);
//! - `c\n`: close the command's stdin (pipes);
//! - `r ROWS COLS\n`: resize the terminal (`stty -F`, which the kernel
//!   answers with `SIGWINCH` to its foreground processes);
//! - `s NAME\n`: signal the command's processes.
//!
//! A terminal is a real pseudo-terminal allocated in the sandbox by
//! `script(1)` (util-linux; the controller says so and exits 127 when the
//! image lacks it), its output one stream; a signal goes to every process
//! of its session. Pipes run the command in a process group of its own
//! reading a FIFO the controller writes; a signal goes to that group. Both
//! are started as jobs (`set -m`), so that they do not inherit the
//! ignored `SIGINT` of a shell's background commands (`^C` must work).
//!
//! The log of a session command is text the service labels line by line
//! (a last line without a newline gets one, and bytes `01 01 01` or
//! `02 02 02` in output read as labels), so the controller writes each
//! chunk the process prints as one line of base64 (coreutils' `dd` and
//! `base64`, a chunk as soon as it is written: a prompt without a newline
//! shows at once), and [`Interactive::decode`] gives back the exact bytes.
//!
//! Output is followed exactly as `execute` follows a command
//! ([`crate::execute`]), the host's events carried out between chunks (on
//! the real service, which answers logs without following them, between
//! polls). The end, whatever it was, deletes the session: that terminates
//! the command's tree and the controller's helpers, and only its
//! confirmation makes a result (otherwise `cleanup-failed`).

use crate::api::{self, Face};
use crate::config::Config;
use crate::execute::{invalid, Run, Session, Stop};
use provider_sdk::errors::ApiError;
use provider_sdk::interaction::{base64_into, signal_name};
use provider_sdk::platform::{
    random_hex, BodyReader, BodyStep, Method, Platform, StreamId, TransportError, Wait, MS,
};
use provider_sdk::script;
use provider_sdk::types::{ExecuteResult, InteractionEvent, InteractionRequest, ProviderError};
use serde_json::json;

/// The most input bytes one `input` request carries (512 KiB of base64,
/// under the local engine's 1 MiB a request).
pub const MAX_INPUT_BYTES: usize = 384 * 1024;

/// How long the output must pause, after a piece of input was written,
/// before the next piece is written (a command echoing its input is never
/// stalled by output nobody reads).
pub const QUIET_MS: u64 = 50;

/// How often events are looked for while the provider waits between two
/// reads of the log (the real service, which does not follow logs).
pub const EVENT_POLL_MS: u64 = 20;

/// The state of an interactive process besides its output.
#[derive(Debug, Default)]
pub(crate) struct Interactive {
    /// A terminal (its output is one stream), not pipes.
    pub(crate) terminal: bool,
    /// Input taken from the host and not yet written.
    pending: Vec<u8>,
    /// The output paused since the last piece of input was written.
    quiet: bool,
    /// `close-input` was carried out.
    input_closed: bool,
    /// The start of an output line not complete yet, per stream (stdout,
    /// stderr).
    lines: [Vec<u8>; 2],
}

impl Interactive {
    /// The output in `bytes` of the controller's `stream`: each complete
    /// line is the base64 of one chunk the process wrote, given back as
    /// those bytes (a terminal's as its one stream). A line that is not
    /// base64 (a message of the shell itself) is given as it is.
    pub(crate) fn decode(&mut self, stream: StreamId, bytes: &[u8]) -> Vec<(StreamId, Vec<u8>)> {
        let index = usize::from(stream == StreamId::Stderr);
        let mut chunks = Vec::new();
        let mut rest = bytes;
        while let Some(end) = memchr::memchr(b'\n', rest) {
            self.lines[index].extend_from_slice(&rest[..end]);
            let line = std::mem::take(&mut self.lines[index]);
            chunks.push((self.stream(stream), decode_line(line)));
            rest = &rest[end + 1..];
        }
        self.lines[index].extend_from_slice(rest);
        chunks.retain(|(_, bytes)| !bytes.is_empty());
        chunks
    }

    /// What is left of unfinished lines once the output ended.
    pub(crate) fn finish(&mut self) -> Vec<(StreamId, Vec<u8>)> {
        let mut chunks = Vec::new();
        for (index, stream) in [StreamId::Stdout, StreamId::Stderr].into_iter().enumerate() {
            let line = std::mem::take(&mut self.lines[index]);
            if !line.is_empty() {
                chunks.push((self.stream(stream), decode_line(line)));
            }
        }
        chunks
    }

    fn stream(&self, stream: StreamId) -> StreamId {
        if self.terminal {
            StreamId::Terminal
        } else {
            stream
        }
    }
}

fn decode_line(line: Vec<u8>) -> Vec<u8> {
    use base64::Engine as _;
    match base64::engine::general_purpose::STANDARD.decode(&line) {
        Ok(bytes) => bytes,
        Err(_) => {
            let mut line = line;
            line.push(b'\n');
            line
        }
    }
}

/// Runs `request` (checked by the SDK, its cwd resolved) in sandbox
/// `sandbox_id` until it exits, the host ends it, or its timeout (the
/// config's `timeoutMs` when it sets none).
pub fn interact(
    platform: &mut dyn Platform,
    config: &Config,
    sandbox_id: &str,
    request: &InteractionRequest,
) -> Result<ExecuteResult, ProviderError> {
    let timeout_ms = request.timeout_ms.unwrap_or(config.budget.timeout_ms);
    let session = Session {
        config,
        sandbox_id: sandbox_id.to_string(),
        session_id: format!("paperclip-{}", random_hex(platform, 12)),
        budget: config.budget.request_timeout_ms.saturating_mul(MS),
    };
    session.create(platform)?;
    let command = format!("/bin/bash -c {}", script::quote(&controller(request)));
    let command_id = session.start(platform, &command)?;
    platform.interaction_started();
    let deadline = platform.now().saturating_add(timeout_ms.saturating_mul(MS));
    let mut run = Run::new(command_id, deadline, request.result_chars);
    run.interactive = Some(Interactive {
        terminal: request.terminal.is_some(),
        ..Interactive::default()
    });
    let stop = run.follow(platform, &session);
    run.finish(platform, &session, stop)
}

/// The bash controller of `request` (see the module docs).
pub fn controller(request: &InteractionRequest) -> String {
    let size = match request.terminal {
        Some(size) => format!("{} {}", size.rows, size.columns),
        None => String::new(),
    };
    CONTROLLER.replace("@SIZE@", &size).replace(
        "@COMMAND@",
        &script::quote(&script::build_interactive(request)),
    )
}

/// The controller: `c` is the command's script, `t` the terminal's rows
/// and columns (empty for pipes); `$d` holds the FIFO of the command's
/// stdin, its session id (`sid`) and its terminal's name (`tty`).
const CONTROLLER: &str = r#"c=@COMMAND@
t='@SIZE@'
enc() { local x; while x=$(dd bs=65536 count=1 status=none | base64 -w0) && [ -n "$x" ]; do printf '%s\n' "$x"; done; }
say() { printf 'sandbox: %s\n' "$1" | base64 -w0 >&2; echo >&2; }
d=$(mktemp -d /tmp/sandbox-interact.XXXXXXXX) || exit 125
trap 'rm -rf -- "$d"' EXIT
mkfifo "$d/in" "$d/out" "$d/err" || exit 125
enc < "$d/out" &
o=$!
enc < "$d/err" >&2 &
q=$!
set -m
if [ -n "$t" ]; then
  set -- $t
  { printf 'echo $$ > %s/sid\ntty > %s/tty.new && mv %s/tty.new %s/tty\nstty rows %s cols %s\n' "$d" "$d" "$d" "$d" "$1" "$2"; printf '%s\n' "$c"; } > "$d/pty"
  if command -v script >/dev/null 2>&1; then
    SHELL=/bin/bash script -q -e -c "exec /bin/bash -l $d/pty" /dev/null < "$d/in" > "$d/out" 2> "$d/err" &
  else
    say 'a terminal needs script(1) from util-linux in the sandbox (Debian: apt-get install bsdutils); nothing ran'
    (exit 127) < "$d/in" > "$d/out" 2> "$d/err" &
  fi
  p=$!
else
  /bin/bash -lc "$c" < "$d/in" > "$d/out" 2> "$d/err" &
  p=$!
  echo $p > "$d/sid"
fi
set +m
exec 3> "$d/in" 4<&0
await() { local i=0; while [ ! -s "$d/$1" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done; }
sig() {
  local q x s
  await sid; s=$(cat "$d/sid")
  for q in /proc/[0-9]*; do
    read -r x 2>/dev/null < "$q/stat" || continue
    x=${x##*) }
    set -- $x
    { [ "$3" = "$s" ] || [ "$4" = "$s" ]; } && kill -s "$g" "${q#/proc/}" 2>/dev/null
  done
}
(
  while read -r o a b; do
    case $o in
      d) dd bs="$a" count=1 iflag=fullblock status=none | base64 -d >&3 ;;
      c) exec 3>&- ;;
      r) await tty; stty -F "$(cat "$d/tty")" rows "$a" cols "$b" ;;
      s) g=$a; sig ;;
    esac
  done
) <&4 &
r=$!
exec 3>&- 4<&-
wait "$p"
e=$?
wait "$o" "$q"
kill "$r" 2>/dev/null
exit "$e""#;

/// The next step of following an interactive process's log: a piece of
/// input is written or an event carried out first, then the next chunk,
/// or [`BodyStep::Event`] when an event came. `Err` when an event ends
/// the process or failed.
pub(crate) fn next_step(
    run: &mut Run,
    platform: &mut dyn Platform,
    session: &Session,
    body: &mut dyn BodyReader,
) -> Result<Result<BodyStep, TransportError>, Option<Stop>> {
    let interactive = run.interactive.as_mut().expect("an interactive run");
    if interactive.pending.is_empty() || interactive.quiet {
        interactive.quiet = false;
        if let Some(stop) = take_event(run, platform, session) {
            return Err(Some(stop));
        }
    }
    let pending = run
        .interactive
        .as_ref()
        .is_some_and(|i| !i.pending.is_empty());
    if !pending {
        return Ok(body.next_chunk_or_event(run.command_wait()));
    }
    // More input to write: first the output the last piece caused, until
    // it pauses.
    let deadline = run.command_wait().deadline;
    let pause = platform.now().saturating_add(QUIET_MS * MS);
    let wait = Wait {
        deadline: pause.min(deadline),
        cancellable: true,
    };
    Ok(match body.next_chunk(wait) {
        Err(TransportError::Deadline) if pause < deadline => {
            if let Some(interactive) = run.interactive.as_mut() {
                interactive.quiet = true;
            }
            Ok(BodyStep::Event)
        }
        other => other.map(|chunk| chunk.map_or(BodyStep::End, BodyStep::Chunk)),
    })
}

/// Waits until `until` between two reads of the log, carrying out the
/// host's events meanwhile; a stop when one ends the process, failed, or
/// the deadline or cancellation came.
pub(crate) fn pause(
    run: &mut Run,
    platform: &mut dyn Platform,
    session: &Session,
    until: u64,
) -> Option<Stop> {
    loop {
        if let Some(stop) = take_event(run, platform, session) {
            return Some(stop);
        }
        if run
            .interactive
            .as_ref()
            .is_some_and(|i| !i.pending.is_empty())
        {
            continue;
        }
        let now = platform.now();
        if now >= until {
            return None;
        }
        let step = now.saturating_add(EVENT_POLL_MS * MS).min(until);
        match platform.sleep_until(step, run.command_wait()) {
            Err(TransportError::Cancelled) => return Some(Stop::Cancelled),
            Err(_) => return Some(Stop::TimedOut),
            Ok(()) => {}
        }
    }
}

/// Writes the next piece of input taken earlier, or carries out the
/// host's next event; a stop when one ends the process (`end`), was not
/// one this process can take (typed `invalid-request`, the process then
/// ended), or failed.
fn take_event(run: &mut Run, platform: &mut dyn Platform, session: &Session) -> Option<Stop> {
    let interactive = run.interactive.as_mut()?;
    let frame =
        if !interactive.pending.is_empty() {
            let rest = interactive
                .pending
                .split_off(interactive.pending.len().min(MAX_INPUT_BYTES));
            let piece = std::mem::replace(&mut interactive.pending, rest);
            let mut frame = String::with_capacity(piece.len() / 3 * 4 + 16);
            frame.push_str(&format!("d {}\n", piece.len().div_ceil(3) * 4));
            base64_into(&mut frame, &piece);
            frame
        } else {
            match platform.next_interaction_event()? {
                InteractionEvent::Input(bytes) if interactive.input_closed && !bytes.is_empty() => {
                    return Some(refused(
                        "input came after close-input: the process's stdin is closed, so those \
                     bytes cannot reach it",
                    ))
                }
                // Written a piece at a time from the next step on.
                InteractionEvent::Input(bytes) => {
                    interactive.pending = bytes;
                    return None;
                }
                InteractionEvent::Resize(_) if !interactive.terminal => return Some(refused(
                    "a resize was sent to a process with pipes, which has no terminal to resize",
                )),
                InteractionEvent::Resize(size) => format!("r {} {}\n", size.rows, size.columns),
                InteractionEvent::CloseInput if interactive.terminal => return Some(refused(
                    "close-input was sent to a terminal, whose end of input is the byte 0x04 (^D)",
                )),
                InteractionEvent::CloseInput if interactive.input_closed => return None,
                InteractionEvent::CloseInput => {
                    interactive.input_closed = true;
                    "c\n".to_string()
                }
                InteractionEvent::Signal(signal) => format!("s {}\n", &signal_name(signal)[3..]),
                InteractionEvent::End => return Some(Stop::Ended),
            }
        };
    write(run, platform, session, frame).err().map(Stop::Failed)
}

fn refused(why: &str) -> Stop {
    Stop::Failed(ProviderError::InvalidRequest(format!(
        "{why}; the process was ended"
    )))
}

/// `POST .../command/{cid}/input {"data": frame}` with the request
/// budget; not cancellable (once sent, only its answer says what it did).
/// 409 (the command exited, or took no input) is no error: its exit is
/// what the log says next.
fn write(
    run: &Run,
    platform: &mut dyn Platform,
    session: &Session,
    frame: String,
) -> Result<(), ProviderError> {
    let request = api::request(
        session.config,
        Face::Toolbox,
        Method::Post,
        &format!("{}/input", run.command_path(session)),
        Some(json!({ "data": frame })),
    );
    let wait = session.wait(platform, false);
    match api::call(platform, &request, wait) {
        Ok(_) | Err(ApiError::Status(409)) => Ok(()),
        Err(ApiError::Invalid(reason)) => Err(invalid("input", &reason)),
        Err(error) => Err(error.into_provider_error("input")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use provider_sdk::config::ProviderConfig;
    use provider_sdk::testing::{bash_interaction, Answer, FakePlatform};
    use provider_sdk::types::{InteractionSignal, TerminalSize};
    use wasm_bindgen_test::wasm_bindgen_test;

    const SESSION: &str = "/toolbox/sb/process/session/paperclip-abababababababababababab";

    fn config() -> Config {
        Config::parse(
            r#"{"apiUrl":"http://127.0.0.1:1/api","toolboxUrl":"http://127.0.0.1:2/toolbox"}"#,
        )
        .unwrap()
    }

    fn size(columns: u16, rows: u16) -> Option<TerminalSize> {
        Some(TerminalSize { columns, rows })
    }

    /// A sandbox whose command never exits by itself: the log holds
    /// `log`, the session's delete answers 204, everything else 200.
    fn sandbox(log: Vec<u8>) -> FakePlatform {
        FakePlatform::new(move |req| {
            let path = req.path.as_str();
            if path.ends_with("/process/session") {
                Answer::Full(201, Vec::new())
            } else if path.ends_with("/exec") {
                Answer::Full(202, br#"{"cmdId":"c1"}"#.to_vec())
            } else if path.contains("/logs") {
                Answer::Full(200, log.clone())
            } else if path.ends_with("/command/c1") {
                Answer::Full(200, br#"{"id":"c1"}"#.to_vec())
            } else if req.method == Method::Delete {
                Answer::Full(204, Vec::new())
            } else {
                Answer::Full(200, Vec::new())
            }
        })
    }

    /// The frames written as input, in order.
    fn frames(platform: &FakePlatform) -> Vec<String> {
        platform
            .requests
            .iter()
            .filter(|(request, _)| request.path.ends_with("/command/c1/input"))
            .map(|(request, _)| {
                let body: serde_json::Value =
                    serde_json::from_slice(&request.body.as_ref().unwrap().1).unwrap();
                body["data"].as_str().unwrap().to_string()
            })
            .collect()
    }

    fn data_of(frame: &str) -> Vec<u8> {
        let (header, text) = frame.split_once('\n').unwrap();
        let length: usize = header.strip_prefix("d ").unwrap().parse().unwrap();
        assert_eq!(length, text.len(), "the header gives the text's length");
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap()
    }

    /// A terminal: the controller allocates it with script(1) at the size
    /// asked; a UTF-8 character split across two inputs crosses as its
    /// exact bytes, then resize and ^C-as-signal frames, in order; `end`
    /// deletes the session and the result says SIGTERM; the log's base64
    /// lines come back as the terminal's bytes.
    #[wasm_bindgen_test(unsupported = test)]
    fn a_terminal_writes_frames_in_order_and_ends_with_the_session_delete() {
        let mut log = b"\x01\x01\x01".to_vec();
        log.extend(b"aGkNCg==\n"); // "hi\r\n"
        let mut platform = sandbox(log);
        let euro = "€".as_bytes().to_vec();
        platform.queue_event(10, InteractionEvent::Input(euro[..1].to_vec()));
        platform.queue_event(10, InteractionEvent::Input(euro[1..].to_vec()));
        platform.queue_event(10, InteractionEvent::Resize(size(100, 40).unwrap()));
        platform.queue_event(20, InteractionEvent::Signal(InteractionSignal::Interrupt));
        platform.queue_event(30, InteractionEvent::End);
        let result = interact(
            &mut platform,
            &config(),
            "sb",
            &bash_interaction(size(80, 24)),
        )
        .unwrap();
        assert_eq!(
            (result.exit_code, result.signal.as_deref()),
            (None, Some("SIGTERM"))
        );
        assert_eq!(result.stdout, "hi\r\n");
        assert_eq!(platform.output_bytes(StreamId::Terminal), b"hi\r\n");
        let sent = frames(&platform);
        assert_eq!(sent.len(), 4, "{sent:?}");
        assert_eq!(data_of(&sent[0]), euro[..1]);
        assert_eq!(data_of(&sent[1]), euro[1..]);
        assert_eq!(sent[2], "r 40 100\n");
        assert_eq!(sent[3], "s INT\n");
        let (exec, _) = platform
            .requests
            .iter()
            .find(|(r, _)| r.path.ends_with("/exec"))
            .unwrap();
        let exec = String::from_utf8_lossy(&exec.body.as_ref().unwrap().1).into_owned();
        assert!(
            exec.contains("script -q -e") && exec.contains("24 80"),
            "{exec}"
        );
        assert_eq!(platform.started.len(), 1);
        assert_eq!(
            platform.calls().last().unwrap(),
            &format!("DELETE {SESSION}").to_uppercase()
        );
    }

    /// Events a process cannot take are refused with a typed
    /// `invalid-request`, the process ended by the session's delete
    /// first: a resize of pipes, input after close-input, close-input to
    /// a terminal.
    #[wasm_bindgen_test(unsupported = test)]
    fn events_a_process_cannot_take_end_it_with_a_typed_error() {
        let cases: [(Option<TerminalSize>, Vec<InteractionEvent>, &str); 3] = [
            (
                None,
                vec![InteractionEvent::Resize(size(100, 40).unwrap())],
                "resize",
            ),
            (
                None,
                vec![
                    InteractionEvent::CloseInput,
                    InteractionEvent::Input(b"late".to_vec()),
                ],
                "after close-input",
            ),
            (size(80, 24), vec![InteractionEvent::CloseInput], "^D"),
        ];
        for (terminal, events, words) in cases {
            let mut platform = sandbox(Vec::new());
            for event in events {
                platform.queue_event(10, event);
            }
            match interact(&mut platform, &config(), "sb", &bash_interaction(terminal)) {
                Err(ProviderError::InvalidRequest(message)) => {
                    assert!(message.contains(words), "{message}");
                    assert!(message.contains("ended"), "{message}");
                }
                other => panic!("expected invalid-request, got {other:?}"),
            }
            assert_eq!(
                platform.calls().last().unwrap(),
                &format!("DELETE {SESSION}").to_uppercase()
            );
        }
    }

    /// A huge paste goes in frames of at most [`MAX_INPUT_BYTES`] whose
    /// bytes are exactly the paste; pipes close their input with `c`.
    #[wasm_bindgen_test(unsupported = test)]
    fn a_huge_paste_goes_in_exact_pieces() {
        let mut platform = sandbox(Vec::new());
        let paste: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        platform.queue_event(10, InteractionEvent::Input(paste.clone()));
        platform.queue_event(10, InteractionEvent::CloseInput);
        platform.queue_event(10_000, InteractionEvent::End);
        let result = interact(&mut platform, &config(), "sb", &bash_interaction(None)).unwrap();
        assert_eq!(result.signal.as_deref(), Some("SIGTERM"));
        let sent = frames(&platform);
        let (close, pieces) = sent.split_last().unwrap();
        assert_eq!(close, "c\n");
        assert_eq!(pieces.len(), 3);
        let mut joined = Vec::new();
        for piece in pieces {
            let bytes = data_of(piece);
            assert!(bytes.len() <= MAX_INPUT_BYTES);
            joined.extend(bytes);
        }
        assert_eq!(joined, paste);
    }

    /// Output lines split anywhere come back whole, per stream; a line
    /// that is not base64 (a message of the shell) is kept as text.
    #[wasm_bindgen_test(unsupported = test)]
    fn output_lines_decode_across_chunks_and_streams() {
        let mut pipes = Interactive::default();
        let mut chunks = pipes.decode(StreamId::Stdout, b"aGVs");
        chunks.extend(pipes.decode(StreamId::Stderr, b"ZXJy\nbash: oops"));
        chunks.extend(pipes.decode(StreamId::Stdout, b"bG8=\n"));
        chunks.extend(pipes.finish());
        assert_eq!(
            chunks,
            vec![
                (StreamId::Stderr, b"err".to_vec()),
                (StreamId::Stdout, b"hello".to_vec()),
                (StreamId::Stderr, b"bash: oops\n".to_vec()),
            ]
        );
    }
}
