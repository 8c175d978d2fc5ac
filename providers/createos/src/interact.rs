//! Running one interactive process (`provider.interact`) over CreateOS's
//! managed processes: a terminal (`kind: "pty"` with `cols` and `rows`) or
//! a pipe process whose stdin stays open, created like `execute`'s, then
//! followed on `/connect` exactly as `execute` follows a command
//! ([`crate::execute`]), with the host's events carried out between output
//! chunks as soon as they come:
//! - input: `POST .../input {data_base64}`, in pieces of at most
//!   [`MAX_INPUT_BYTES`];
//! - resize: `POST .../resize {cols, rows}` (the local engine offers it;
//!   the real service has no resize, so `describe` does not claim
//!   `terminal-resize` and hosts never send one);
//! - close input: `POST .../stdin/close` (409, already closed, is fine);
//! - signal: `POST .../signal {signal}`;
//! - end: SIGTERM, then the tree `DELETE` with its `tree_exited` proof, as
//!   every other end that is not the command's own exit.
//!
//! An event request that fails ends the process the same way, with that
//! failure as the error (or `cleanup-failed` when the end is not proven):
//! an input request that failed midway may have written part of its bytes,
//! and the command must read exactly the bytes sent.

use crate::api;
use crate::config::Config;
use crate::execute::{create, request_wait, Run, Stop};
use provider_sdk::interaction::{base64_into, signal_name};
use provider_sdk::platform::{Method, Platform, Request, MS};
use provider_sdk::script;
use provider_sdk::types::{ExecuteResult, InteractionEvent, InteractionRequest, ProviderError};
use serde_json::{json, Value};

/// The most input bytes one `/input` request carries (what the public
/// CreateOS plugin sends at most).
pub const MAX_INPUT_BYTES: usize = 256 * 1024;

/// How long the output must pause, after a piece of input was written,
/// before the next piece is written (see [`take_event`]).
pub const QUIET_MS: u64 = 50;

/// Runs `request` in sandbox `sandbox_id` (an id `lease::check` found
/// valid) until it exits, the host ends it, or its timeout (the config's
/// `timeoutMs` when it sets none).
pub fn interact(
    platform: &mut dyn Platform,
    config: &Config,
    sandbox_id: &str,
    request: &InteractionRequest,
) -> Result<ExecuteResult, ProviderError> {
    let budget = config.budget.request_timeout_ms.saturating_mul(MS);
    let timeout_ms = request.timeout_ms.unwrap_or(config.budget.timeout_ms);
    let process_id = create_process(platform, budget, sandbox_id, request)?;
    platform.interaction_started();
    let deadline = platform.now().saturating_add(timeout_ms.saturating_mul(MS));
    let mut run = Run::new(
        sandbox_id,
        &process_id,
        deadline,
        budget,
        request.result_chars,
    );
    run.interactive = true;
    let stop = run.follow(platform);
    run.finish(platform, stop)
}

/// `POST /processes` of a terminal or a pipe process; as `execute`'s, any
/// outcome but a definite rejection, a request that never reached the
/// server, or a valid id means a process may exist.
fn create_process(
    platform: &mut dyn Platform,
    budget: u64,
    sandbox_id: &str,
    request: &InteractionRequest,
) -> Result<String, ProviderError> {
    let mut body = json!({
        "cmd": "/bin/bash",
        "args": ["-lc", script::build_interactive(request)],
    });
    if let Some(size) = request.terminal {
        body["kind"] = Value::from("pty");
        body["cols"] = Value::from(size.columns);
        body["rows"] = Value::from(size.rows);
    }
    if let Some(cwd) = &request.cwd {
        body["cwd"] = Value::String(cwd.clone());
    }
    create(platform, budget, sandbox_id, body)
}

/// Writes the next piece of input taken earlier, or carries out the
/// host's next event; a stop when one ends the process (`end`) or failed
/// (the process is then ended). One step at a time: the caller reads the
/// output a piece caused until it pauses for [`QUIET_MS`] before the next,
/// so the output a process's server holds back never stalls a write.
pub(crate) fn take_event(run: &mut Run, platform: &mut dyn Platform) -> Option<Stop> {
    let outcome = if !run.pending_input.is_empty() {
        let rest = run
            .pending_input
            .split_off(run.pending_input.len().min(MAX_INPUT_BYTES));
        let piece = std::mem::replace(&mut run.pending_input, rest);
        input(run, platform, &piece)
    } else {
        match platform.next_interaction_event()? {
            // Written a piece at a time from the next step on.
            InteractionEvent::Input(bytes) => {
                run.pending_input = bytes;
                Ok(())
            }
            InteractionEvent::Resize(size) => post(
                run,
                platform,
                "resize",
                format!(r#"{{"cols":{},"rows":{}}}"#, size.columns, size.rows),
            ),
            InteractionEvent::CloseInput => match post(run, platform, "stdin/close", "{}".into()) {
                Err(ProviderError::ApiRejected(rejection)) if rejection.status == 409 => Ok(()),
                other => other,
            },
            InteractionEvent::Signal(signal) => signal_request(run, platform, signal_name(signal)),
            InteractionEvent::End => return Some(Stop::Ended),
        }
    };
    outcome.err().map(Stop::Failed)
}

fn input(run: &Run, platform: &mut dyn Platform, bytes: &[u8]) -> Result<(), ProviderError> {
    let mut body = String::with_capacity(bytes.len() / 3 * 4 + 24);
    body.push_str(r#"{"data_base64":""#);
    base64_into(&mut body, bytes);
    body.push_str(r#""}"#);
    post(run, platform, "input", body)
}

/// `POST .../processes/{pid}/{action}` with the request budget; not
/// cancellable (once sent, only its answer says what it did).
fn post(
    run: &Run,
    platform: &mut dyn Platform,
    action: &str,
    body: String,
) -> Result<(), ProviderError> {
    let request = Request::new(Method::Post, format!("{}/{action}", run.process_path()))
        .with_body("application/json", body.into_bytes());
    let wait = request_wait(platform, run.budget, false);
    api::call(platform, &request, wait)
        .map(|_| ())
        .map_err(|error| error.into_provider_error(action))
}

/// Best effort: a signal before the tree `DELETE`, whose answer alone proves
/// the end.
pub(crate) fn signal(run: &Run, platform: &mut dyn Platform, signal: &str) {
    let _ = signal_request(run, platform, signal);
}

fn signal_request(
    run: &Run,
    platform: &mut dyn Platform,
    signal: &str,
) -> Result<(), ProviderError> {
    post(
        run,
        platform,
        "signal",
        format!(r#"{{"signal":"{signal}"}}"#),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::ok;
    use base64::Engine as _;
    use provider_sdk::config::ProviderConfig;
    use provider_sdk::platform::{StreamId, TransportError};
    use provider_sdk::testing::{bash_interaction, Answer, FakePlatform};
    use provider_sdk::types::{InteractionSignal, TerminalSize};
    use wasm_bindgen_test::wasm_bindgen_test;

    const PROCESS: &str = "/v1/sandboxes/sb/processes/p1";

    fn config() -> Config {
        Config::parse(r#"{"requestTimeoutMs": 2000}"#).unwrap()
    }

    fn pty_frame(seq: u64, text: &[u8]) -> Vec<u8> {
        let data = base64::engine::general_purpose::STANDARD.encode(text);
        format!(
            "{{\"type\":\"data\",\"seq\":{seq},\"stream\":\"pty\",\"data_base64\":\"{data}\"}}\n"
        )
        .into_bytes()
    }

    /// A fake sandbox: creation gives p1, `/connect` gives `connect`, the
    /// tree DELETE proves the end, `/input` answers `input`, the rest 200.
    fn sandbox(connect: Vec<Vec<u8>>, input: impl Fn() -> Answer + 'static) -> FakePlatform {
        FakePlatform::new(move |req| match (req.method, req.path.as_str()) {
            (Method::Post, "/v1/sandboxes/sb/processes") => ok(json!({"process_id": "p1"})),
            (Method::Get, p) if p.starts_with(&format!("{PROCESS}/connect")) => {
                Answer::Stream(200, connect.iter().cloned().map(Ok).collect())
            }
            (Method::Delete, p) if p.starts_with(PROCESS) => ok(json!({"tree_exited": true})),
            (Method::Post, p) if p == format!("{PROCESS}/input") => input(),
            _ => ok(json!({})),
        })
    }

    fn body_json(platform: &FakePlatform, index: usize) -> Value {
        let (request, _) = &platform.requests[index];
        serde_json::from_slice(&request.body.as_ref().unwrap().1).unwrap()
    }

    /// A terminal: created as `kind: "pty"` of the size asked, started
    /// once it exists, its events carried out in order (input, resize,
    /// signal), its output the terminal stream; `end` sends SIGTERM, then
    /// the tree DELETE proves it gone, and the result says SIGTERM.
    #[wasm_bindgen_test(unsupported = test)]
    fn a_terminal_carries_out_events_in_order_and_ends_with_proof() {
        let mut platform = sandbox(vec![pty_frame(1, b"$ ")], || ok(json!({})));
        platform.queue_event(10, InteractionEvent::Input(b"ls\r".to_vec()));
        platform.queue_event(
            10,
            InteractionEvent::Resize(TerminalSize {
                columns: 100,
                rows: 40,
            }),
        );
        platform.queue_event(20, InteractionEvent::Signal(InteractionSignal::Interrupt));
        platform.queue_event(30, InteractionEvent::End);
        let size = TerminalSize {
            columns: 80,
            rows: 24,
        };
        let result = interact(
            &mut platform,
            &config(),
            "sb",
            &bash_interaction(Some(size)),
        )
        .unwrap();
        assert_eq!(
            (result.exit_code, result.signal.as_deref(), result.timed_out),
            (None, Some("SIGTERM"), false)
        );
        assert_eq!(result.stdout, "$ ");
        assert_eq!(platform.output, vec![(StreamId::Terminal, b"$ ".to_vec())]);
        let create = body_json(&platform, 0);
        assert_eq!(
            (&create["kind"], &create["cols"], &create["rows"]),
            (&json!("pty"), &json!(80), &json!(24))
        );
        assert!(!create["args"][1].as_str().unwrap().contains("/dev/null"));
        assert_eq!(platform.started.len(), 1);
        assert_eq!(
            platform.calls(),
            [
                "POST /v1/sandboxes/sb/processes".to_string(),
                format!("GET {PROCESS}/connect?after=0"),
                format!("POST {PROCESS}/input"),
                format!("POST {PROCESS}/resize"),
                format!("POST {PROCESS}/signal"),
                format!("POST {PROCESS}/signal"),
                format!("DELETE {PROCESS}?grace_ms=1000"),
            ]
            .map(|call| call.to_uppercase())
        );
        assert_eq!(body_json(&platform, 2)["data_base64"], json!("bHMN"));
        assert_eq!(body_json(&platform, 3), json!({"cols": 100, "rows": 40}));
        assert_eq!(body_json(&platform, 4), json!({"signal": "SIGINT"}));
        assert_eq!(body_json(&platform, 5), json!({"signal": "SIGTERM"}));
    }

    /// Pipes: no `kind`, a big input goes in pieces of at most 256 KiB
    /// whose bytes are exactly the input, and close-input is
    /// `stdin/close`, a 409 (already closed) being no error.
    #[wasm_bindgen_test(unsupported = test)]
    fn pipes_take_a_big_input_in_pieces_and_close_their_input() {
        let mut platform = FakePlatform::new(move |req| match (req.method, req.path.as_str()) {
            (Method::Post, "/v1/sandboxes/sb/processes") => ok(json!({"process_id": "p1"})),
            (Method::Get, _) => Answer::Stream(200, vec![]),
            (Method::Post, p) if p.ends_with("stdin/close") => Answer::Full(409, b"{}".to_vec()),
            (Method::Delete, _) => ok(json!({"tree_exited": true})),
            _ => ok(json!({})),
        });
        let big: Vec<u8> = (0..600 * 1024).map(|i| (i % 251) as u8).collect();
        platform.queue_event(1, InteractionEvent::Input(big.clone()));
        platform.queue_event(2, InteractionEvent::CloseInput);
        platform.queue_event(3, InteractionEvent::End);
        let result = interact(&mut platform, &config(), "sb", &bash_interaction(None)).unwrap();
        assert_eq!(result.signal.as_deref(), Some("SIGTERM"));
        assert!(body_json(&platform, 0).get("kind").is_none());
        let mut sent = Vec::new();
        for index in 0..platform.requests.len() {
            if platform.requests[index].0.path.ends_with("/input") {
                let piece = base64::engine::general_purpose::STANDARD
                    .decode(body_json(&platform, index)["data_base64"].as_str().unwrap())
                    .unwrap();
                assert!(piece.len() <= MAX_INPUT_BYTES);
                sent.extend(piece);
            }
        }
        assert_eq!(sent, big);
        assert!(platform
            .calls()
            .contains(&format!("POST {PROCESS}/STDIN/CLOSE").to_uppercase()));
    }

    /// An input request that failed midway may have written part of its
    /// bytes: the process is ended (tree DELETE with proof) and the
    /// failure is the error, with what the terminal printed.
    #[wasm_bindgen_test(unsupported = test)]
    fn an_input_that_may_have_half_failed_ends_the_process() {
        let mut platform = sandbox(vec![pty_frame(1, b"ok")], || {
            Answer::Fail(TransportError::Connection("reset".into()))
        });
        platform.queue_event(5, InteractionEvent::Input(b"x".to_vec()));
        let size = TerminalSize {
            columns: 80,
            rows: 24,
        };
        let error = interact(
            &mut platform,
            &config(),
            "sb",
            &bash_interaction(Some(size)),
        )
        .unwrap_err();
        match error {
            ProviderError::TransportFailed(failure) => {
                assert_eq!(failure.partial.unwrap().stdout, "ok")
            }
            _ => panic!("expected transport-failed"),
        }
        assert_eq!(
            platform.calls().last().unwrap(),
            &format!("DELETE {PROCESS}?grace_ms=1000").to_uppercase()
        );
    }
}
