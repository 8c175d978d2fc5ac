//! Output: live through the output sink, in order, equal to the result;
//! the sink gets the exact bytes printed (contract 0.4.0), and the result
//! their text, UTF-8 decoded per stream across chunks.

use std::sync::{Arc, Mutex};

use anyhow::{bail, ensure, Result};
use sandbox_host::types::{Capabilities, ExecuteRequest, OutputStream, ProviderError};
use sandbox_host::{CancelToken, OutputCapture, OutputSink};

use crate::command::{bash, outcome_text, stubborn_tree, GENEROUS_MS};
use crate::fault::FaultPoint;
use crate::procs::unique_marker;
use crate::scenarios::cleanup::{confirmed_end, poisoned, swept};
use crate::scenarios::{not_observable, succeeded, with_session};
use crate::session::Session;
use crate::target::Target;
use crate::verdict::Verdict;

/// Output reaches the sink while the command runs (the command never ends:
/// only output seen live can trigger its cancellation), in order, and the
/// sink's text equals the result's.
pub fn live_output(target: &Target) -> Result<Verdict> {
    with_session(target, None, |s| {
        if !s
            .runtime()
            .description()
            .capabilities
            .contains(Capabilities::INCREMENTAL_OUTPUT)
        {
            return Ok(Verdict::NotApplicable(
                "the provider does not declare incremental-output".into(),
            ));
        }
        let lease = s.acquire()?;
        let id = &lease.id;
        let mut notes = Vec::new();

        let marker = unique_marker();
        let token = CancelToken::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink: OutputSink = {
            let (token, seen) = (token.clone(), seen.clone());
            Arc::new(move |stream, chunk: &[u8]| {
                if stream == OutputStream::Stdout {
                    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                    seen.extend_from_slice(chunk);
                    if seen.windows(6).any(|w| w == b"first\n") {
                        token.cancel();
                    }
                }
            })
        };
        let request = bash(&format!("echo first; exec -a {marker} sleep 600"));
        let outcome = s.execute(id, &request, Some(sink), token.clone())?;
        match &outcome {
            Err(ProviderError::Cancelled(Some(partial))) if partial.stdout == "first\n" => {}
            other => bail!(
                "a command printing `first` and then sleeping: its output should have reached \
                 the sink live (and cancelled it), got {}",
                outcome_text(other)
            ),
        }
        match s.survivors(&marker) {
            Some(left) => ensure!(left.is_empty(), "after cancellation, alive: {left:?}"),
            None => notes.push(not_observable("no survivor after cancellation")),
        }

        let capture = OutputCapture::new();
        let request = bash("for i in $(seq 1 300); do echo out-$i; echo err-$i >&2; done");
        let result = succeeded(
            "300 lines on each stream",
            s.execute(id, &request, Some(capture.sink()), CancelToken::new())?,
        )?;
        let expected_out: String = (1..=300).map(|i| format!("out-{i}\n")).collect();
        let expected_err: String = (1..=300).map(|i| format!("err-{i}\n")).collect();
        ensure!(
            result.stdout == expected_out && result.stderr == expected_err,
            "300 lines on each stream: the result's streams are not the lines in order"
        );
        ensure!(
            capture.text(OutputStream::Stdout) == expected_out,
            "the sink's stdout differs from the result's (order or content)"
        );
        ensure!(
            capture.text(OutputStream::Stderr) == expected_err,
            "the sink's stderr differs from the result's (order or content)"
        );
        Ok(Verdict::Passed(notes))
    })
}

/// Multi-byte characters written one byte at a time (so that the backend
/// is likely to cut them across chunks) arrive whole on both streams, in
/// the result (where an invalid byte is U+FFFD) and through the sink (the
/// exact bytes, the invalid one included); and every byte value (binary
/// data) reaches the sink unchanged.
pub fn utf8_across_chunks(target: &Target) -> Result<Verdict> {
    with_session(target, None, |s| {
        let lease = s.acquire()?;
        let bytes = |fd: &str| {
            let write = |b: &str| format!("printf '{b}' >&{fd}; sleep 0.2; ");
            [
                "\\xe2", "\\x82", "\\xac", "\\xf0", "\\x9f", "\\xa6", "\\x80", "\\xc3", "\\xbc",
                "a\\xffb", "\\n",
            ]
            .iter()
            .map(|b| write(b))
            .collect::<String>()
        };
        let script = format!("{}{}", bytes("1"), bytes("2"));
        let capture = OutputCapture::new();
        let result = succeeded(
            "bytes of multi-byte characters written one at a time",
            s.execute(
                &lease.id,
                &bash(&script),
                Some(capture.sink()),
                CancelToken::new(),
            )?,
        )?;
        let expected = "€🦀üa\u{FFFD}b\n";
        ensure!(
            result.stdout == expected && result.stderr == expected,
            "characters split across writes: stdout {:?}, stderr {:?}, expected {expected:?} on both",
            result.stdout,
            result.stderr
        );
        let printed = "€🦀üa\u{FF}b\n"
            .chars()
            .flat_map(|c| match c {
                '\u{FF}' => vec![0xff],
                c => c.to_string().into_bytes(),
            })
            .collect::<Vec<u8>>();
        for (stream, name) in [
            (OutputStream::Stdout, "stdout"),
            (OutputStream::Stderr, "stderr"),
        ] {
            let bytes = capture.bytes(stream);
            ensure!(
                bytes == printed,
                "the sink's {name} is {bytes:x?}, expected the bytes printed {printed:x?}"
            );
        }

        // Every byte value, on both streams.
        let all: String = (0..=255u8).map(|b| format!("\\x{b:02x}")).collect();
        let capture = OutputCapture::new();
        succeeded(
            "every byte value printed",
            s.execute(
                &lease.id,
                &bash(&format!("printf '{all}'; printf '{all}' >&2")),
                Some(capture.sink()),
                CancelToken::new(),
            )?,
        )?;
        let every: Vec<u8> = (0..=255u8).collect();
        for stream in [OutputStream::Stdout, OutputStream::Stderr] {
            let bytes = capture.bytes(stream);
            ensure!(
                bytes == every,
                "printing every byte value: the sink got {} bytes that differ from the 256 \
                 printed ({bytes:x?})",
                bytes.len()
            );
        }
        Ok(Verdict::passed())
    })
}

/// The result's text follows the request's `result-chars` (contract
/// 0.5.0): unset, each stream's whole text; a small number, its last
/// characters (counted as characters, not bytes) with `output-truncated`;
/// 0, no text at all. The live output is the whole of what was printed
/// every time.
pub fn result_chars(target: &Target) -> Result<Verdict> {
    with_session(target, None, |s| {
        let lease = s.acquire()?;
        let (out, err) = ("héllo wörld €\n", "δέκα 10\n");
        let script = format!("printf '{out}'; printf '{err}' >&2");
        let live_output = s
            .runtime()
            .description()
            .capabilities
            .contains(Capabilities::INCREMENTAL_OUTPUT);
        for (asked, stdout, stderr, truncated) in [
            (None, out, err, false),
            (Some(100), out, err, false),
            (Some(4), "d €\n", " 10\n", true),
            (Some(0), "", "", true),
        ] {
            let mut request = bash(&script);
            request.result_chars = asked;
            let capture = OutputCapture::new();
            let result = succeeded(
                "a command printing a line on each stream",
                s.execute(
                    &lease.id,
                    &request,
                    Some(capture.sink()),
                    CancelToken::new(),
                )?,
            )?;
            ensure!(
                (
                    result.stdout.as_str(),
                    result.stderr.as_str(),
                    result.output_truncated
                ) == (stdout, stderr, truncated),
                "asked for {asked:?} characters of each stream, the result held stdout {:?} and \
                 stderr {:?} (output-truncated {}); expected {stdout:?}, {stderr:?} ({truncated})",
                result.stdout,
                result.stderr,
                result.output_truncated
            );
            if live_output {
                for (stream, name, printed) in [
                    (OutputStream::Stdout, "stdout", out),
                    (OutputStream::Stderr, "stderr", err),
                ] {
                    let bytes = capture.bytes(stream);
                    ensure!(
                        bytes == printed.as_bytes(),
                        "asked for {asked:?} characters in the result, the sink's {name} was \
                         {:?}: the live output must be the whole of what was printed",
                        String::from_utf8_lossy(&bytes)
                    );
                }
            }
        }
        Ok(Verdict::passed())
    })
}

/// Lost output (contract 0.3.0): the server drops output the provider had
/// not read while the command runs on. The provider reports `output-lost`
/// (never a result, never an invalid answer) carrying exactly what reached
/// the live sink; it deletes the command's tree first. With the deletion
/// proven (`tree-deleted`) nothing survives and the lease stays usable;
/// with the termination unconfirmed too, `tree-deleted` is false, the host
/// poisons the lease, and sweep destroys it with no survivor.
pub fn output_lost(target: &Target) -> Result<Verdict> {
    with_session(target, None, |s| {
        if !s.backend().supports(FaultPoint::OutputEvicted) {
            return Ok(Verdict::NotApplicable(format!(
                "the {} backend cannot drop output a reader has not received",
                target.name()
            )));
        }
        let mut notes = Vec::new();

        let marker = unique_marker();
        let lease = s.acquire()?;
        s.backend().inject(FaultPoint::OutputEvicted)?;
        let loss = lost(s, &lease.id, &marker)?;
        ensure!(
            loss,
            "output-lost says the tree's deletion is unconfirmed, though the backend confirms it"
        );
        confirmed_end(s, &lease.id, &marker, &mut notes)?;

        let marker = unique_marker();
        let lease = s.acquire()?;
        s.backend().inject(FaultPoint::OutputEvicted)?;
        s.backend()
            .inject(FaultPoint::CommandTerminationUnconfirmed)?;
        let loss = lost(s, &lease.id, &marker)?;
        ensure!(
            !loss,
            "output-lost says the tree was deleted, though its termination was not confirmed"
        );
        let record = poisoned(s, &lease.id, FaultPoint::OutputEvicted)?;
        swept(s, &record, &marker, &mut notes)?;
        Ok(Verdict::Passed(notes))
    })
}

/// Runs a command that ignores SIGTERM under the injected eviction and
/// checks the `output-lost`; returns its `tree-deleted`.
fn lost(s: &Session, lease_id: &str, marker: &str) -> Result<bool> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink: OutputSink = {
        let seen = seen.clone();
        Arc::new(move |stream, chunk: &[u8]| {
            if stream == OutputStream::Stdout {
                seen.lock().unwrap().extend_from_slice(chunk);
            }
        })
    };
    let request = ExecuteRequest {
        timeout_ms: Some(GENEROUS_MS),
        result_chars: None,
        ..stubborn_tree(marker)
    };
    let outcome = s.execute(lease_id, &request, Some(sink), CancelToken::new())?;
    let Err(ProviderError::OutputLost(loss)) = &outcome else {
        bail!(
            "output the server dropped must be output-lost; got {}",
            outcome_text(&outcome)
        );
    };
    let seen = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    ensure!(
        loss.partial.stdout == seen,
        "output-lost keeps {:?}, but {seen:?} reached the live sink",
        loss.partial.stdout
    );
    let text = sandbox_host::error_text(&outcome.clone().unwrap_err());
    ensure!(
        text.contains("incomplete"),
        "the message does not say the output is incomplete: {text}"
    );
    Ok(loss.tree_deleted)
}
