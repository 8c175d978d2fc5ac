//! Running commands: `run` (acquire, execute, release), `lease exec`,
//! `lease acquire`, `lease sweep`, and Ctrl-C.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

use anyhow::{Context, Result};
use sandbox_host::types::{
    AcquireRequest, Capabilities, ExecuteRequest, ExecuteResult, OutputStream, ProviderError,
    WorkspaceRequest,
};
use sandbox_host::{
    cleanup_text, loss_text, trap_of, CancelToken, Environment, LeaseRefused, LeaseState,
    Operation, OUTPUT_SINK,
};

use crate::backend::{show_progress, Setup};
use crate::live::{self, Live, Undelivered};
use crate::report;
use crate::{
    Global, RunArgs, EXIT_CLEANUP_FAILED, EXIT_INTERRUPTED, EXIT_READER_CLOSED, EXIT_SANDBOX_ERROR,
    EXIT_TIMED_OUT,
};

/// `run`: acquire, execute with live output, release (or destroy when
/// cleanup could not be confirmed).
pub fn run(setup: &Setup, global: &Global, args: &RunArgs) -> Result<u8> {
    let env = setup.environment(global)?;
    let cancel = interrupt_token(STOPPING, leftovers(setup));
    if show_progress() {
        eprintln!("sandbox: creating a sandbox…");
    }
    let request = AcquireRequest {
        run_id: "cli-run".into(),
        requested_cwd: args.cwd.clone(),
        workspace_mode: None,
        requested_expires_at: None,
        egress: None,
        adapter_type: None,
        image: None,
        template: None,
    };
    let record = match setup.runtime.acquire(&env, &request)? {
        Ok(record) => record,
        Err(ProviderError::CleanupFailed(failure)) => {
            eprintln!(
                "sandbox: acquiring a sandbox failed: {}",
                cleanup_text(&failure)
            );
            match failure.sandbox_id {
                Some(_) => eprintln!("sandbox: the lease is poisoned; {}", leftovers(setup)),
                None => eprintln!(
                    "sandbox: no sandbox id is known to delete it by; look for it in the \
                     provider's console"
                ),
            }
            return Ok(EXIT_CLEANUP_FAILED);
        }
        Err(error) => {
            match setup.isolation_refused() {
                Some(why) => eprintln!("sandbox: {}", refused_text(&why)),
                None => eprintln!(
                    "sandbox: acquiring a sandbox failed: {}",
                    report::error_text(&error)
                ),
            }
            return Ok(EXIT_SANDBOX_ERROR);
        }
    };
    if show_progress() {
        eprintln!("sandbox: sandbox ready");
    }
    let code = execute_and_settle(setup, &env, &record.id, args, cancel, true);
    Ok(code)
}

/// The embedded engine's refusal of the first command (see
/// [`Setup::isolation_refused`]), for people.
fn refused_text(why: &str) -> String {
    format!("the embedded local backend refused to run the command, nothing was run: {why}")
}

/// `lease exec`: execute on an existing lease; the lease stays active
/// unless cleanup failed (then it is destroyed).
pub fn exec(setup: &Setup, env: &Environment, lease_id: &str, args: &RunArgs) -> Result<u8> {
    let cancel = interrupt_token(STOPPING, leftovers(setup));
    Ok(execute_and_settle(
        setup, env, lease_id, args, cancel, false,
    ))
}

/// `lease acquire`: prints the new lease id.
pub fn acquire(
    setup: &Setup,
    env: &Environment,
    request: &AcquireRequest,
    json: bool,
) -> Result<u8> {
    match setup.runtime.acquire(env, request)? {
        Ok(record) => {
            report::lease_acquired(&record, json);
            Ok(0)
        }
        Err(error) => {
            eprintln!(
                "sandbox: acquiring a lease failed: {}{}",
                report::error_text(&error),
                template_hint(request, &error)
            );
            Ok(match error {
                ProviderError::CleanupFailed(_) => EXIT_CLEANUP_FAILED,
                _ => EXIT_SANDBOX_ERROR,
            })
        }
    }
}

/// What to check when the service refused to make a sandbox of a
/// template: that the template still exists (a deleted one is the usual
/// cause; the service answers 400 or 404 without saying so).
fn template_hint(request: &AcquireRequest, error: &ProviderError) -> String {
    match (&request.template, error) {
        (Some(template), ProviderError::ApiRejected(r)) if matches!(r.status, 400 | 404) => {
            format!("; the template {template} may no longer exist (see `sandbox template list`)")
        }
        _ => String::new(),
    }
}

/// `lease sweep`: destroys every poisoned lease, environment by environment.
pub fn sweep(setup: &Setup, global: &Global) -> Result<u8> {
    let mut groups: BTreeMap<(String, String, String), String> = BTreeMap::new();
    for record in setup.runtime.store().needing_sweep()? {
        groups
            .entry((
                record.provider.clone(),
                record.company_id.clone(),
                record.environment_id.clone(),
            ))
            .or_insert(record.id);
    }
    let mut failures = 0;
    let mut results = Vec::new();
    for ((_, _, _), any_lease) in groups {
        let env = setup.environment_of(global, &any_lease)?;
        for (record, outcome) in setup.runtime.sweep(&env)? {
            if outcome.is_err() {
                failures += 1;
            }
            results.push((record, outcome));
        }
    }
    report::swept(&results, global.json);
    waiting(setup, &results)?;
    Ok(if failures == 0 { 0 } else { 1 })
}

/// Says which leases sweep left alone and what it waits for: an operation
/// of a `sandbox` process that is alive (on this machine, checked
/// directly; elsewhere, by its heartbeat).
fn waiting(setup: &Setup, swept: &[(sandbox_host::LeaseRecord, Result<(), String>)]) -> Result<()> {
    for record in setup.runtime.store().needing_sweep()? {
        if swept.iter().any(|(r, _)| r.id == record.id) || record.state.is_final() {
            continue;
        }
        let Some(holder) = record.busy_owner.as_ref().or(record.closing_owner.as_ref()) else {
            continue;
        };
        eprintln!(
            "sandbox: lease {} ({}) left alone: the sandbox process {holder} is still using it; \
             sweep handles it once that process has ended (on this machine: at once; on \
             another: once its heartbeat is older than its expiry)",
            record.id, record.state
        );
    }
    Ok(())
}

fn execute_and_settle(
    setup: &Setup,
    env: &Environment,
    lease_id: &str,
    args: &RunArgs,
    cancel: CancelToken,
    release: bool,
) -> u8 {
    let code = match execute(setup, env, lease_id, args, cancel) {
        Ok(code) => code,
        Err(error) if error.downcast_ref::<LeaseRefused>().is_some() => {
            // Refused before anything ran: the lease is not this process's
            // to settle (another host may be using or destroying it).
            eprintln!("sandbox: {error:#}");
            return EXIT_SANDBOX_ERROR;
        }
        Err(error) => {
            eprintln!("sandbox: {error:#}");
            EXIT_SANDBOX_ERROR
        }
    };
    let settled = settle(setup, env, lease_id, release).unwrap_or_else(|error| {
        eprintln!("sandbox: {error:#}");
        EXIT_SANDBOX_ERROR
    });
    combine(code, settled)
}

/// The command's status, unless settling the lease failed: a cleanup
/// failure always wins, and any failure beats a success.
fn combine(command: u8, settled: u8) -> u8 {
    if settled == EXIT_CLEANUP_FAILED || (command == 0 && settled != 0) {
        settled
    } else {
        command
    }
}

fn execute(
    setup: &Setup,
    env: &Environment,
    lease_id: &str,
    args: &RunArgs,
    cancel: CancelToken,
) -> Result<u8> {
    // One use of the lease around the workspace and the command: the
    // lease store flushes its busy mark once, not once per operation.
    let _in_use = setup
        .runtime
        .hold(env, lease_id, Operation::Execute, cancel.clone())?;
    let workspace = WorkspaceRequest {
        remote_path: args.cwd.clone(),
    };
    let cwd = match setup.runtime.realize_workspace(env, lease_id, &workspace)? {
        Ok(cwd) => cwd,
        Err(error) => {
            eprintln!(
                "sandbox: preparing the workspace failed: {}",
                report::error_text(&error)
            );
            if matches!(&error, ProviderError::ApiRejected(r) if r.status == 404) {
                // The backend no longer has the lease's sandbox (deleted,
                // or it ended with the engine that held it).
                eprintln!(
                    "sandbox: the sandbox of lease {lease_id} no longer exists at the backend, \
                     so nothing ran and nothing of it can run again: `sandbox lease release \
                     {lease_id}` records that, and `sandbox lease acquire` gives a new lease"
                );
            }
            return Ok(EXIT_SANDBOX_ERROR);
        }
    };
    let (command, rest) = args.command.split_first().context("no command given")?;
    let mut environment = Vec::new();
    for pair in &args.env {
        let (name, value) = pair
            .split_once('=')
            .with_context(|| format!("--env {pair:?} is not NAME=VALUE"))?;
        environment.push((name.to_owned(), value.to_owned()));
    }
    let request = ExecuteRequest {
        command: command.clone(),
        args: rest.to_vec(),
        cwd: Some(cwd),
        env: environment,
        stdin: args.input.clone(),
        timeout_ms: args
            .timeout
            .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        // A provider that forwards its output live gets it all written
        // here as it comes, and the result's text is then not printed: it
        // need not keep any (its 4 Mi characters cost about 20 ms at the
        // end of a 50 MB run). One that does not gets the full cap, and
        // its result is printed.
        result_chars: streams_live(setup).then_some(0),
    };
    // The command's own timeout: a consumer that never reads stdout
    // cannot hold it past this (see live.rs).
    let timeout = args.timeout.unwrap_or(env.deadlines().timeout);
    let component = setup.runtime.component();
    let (sink, live) = Live::start(cancel.clone(), component.live_output_is_text());
    let outcome = if args.tty || args.interactive {
        crate::interactive::run(setup, env, lease_id, &request, args, sink, cancel)?
    } else {
        setup
            .runtime
            .execute(env, lease_id, &request, Some(sink), cancel)
    };
    let streamed = live.streamed();
    let replaced = live.replacement_characters();
    if replaced > 0 {
        // Not silent: an older component's live output is text, not the
        // bytes the command printed.
        eprintln!(
            "sandbox: note: the output held {replaced} U+FFFD replacement character(s): the \
             provider component was built for {}, which carries live output as UTF-8 text, so \
             bytes that were not UTF-8 (binary data) were replaced; rebuild it with the \
             provider SDK of contract 0.4.0 or later to get the exact bytes, or encode binary \
             data in the command (for example `sandbox run -- base64 FILE | base64 -d > FILE`)",
            component.contract()
        );
    }
    if let Some(lost) = live.undelivered() {
        // Output that could not be written is never a clean exit. When the
        // command ended (by itself or by the cancel the failed write sent),
        // that is the whole story; otherwise its own report follows.
        match &outcome {
            Ok(Ok(_)) => return Ok(undelivered_status(&lost, "the command had ended")),
            Ok(Err(ProviderError::Cancelled(_))) => {
                return Ok(undelivered_status(
                    &lost,
                    "the command was stopped and cleaned up",
                ))
            }
            _ => {
                let _ = undelivered_status(&lost, "the command's end is reported below");
            }
        }
    }
    let code = match outcome {
        Ok(Ok(result)) => finished(&result, streamed, request.result_chars, args),
        // Output not consumed is never a clean exit: 124 when the
        // command's timeout ended it, as for any timeout.
        Ok(Err(ProviderError::OutputLost(loss))) if loss.operation == OUTPUT_SINK => {
            eprintln!(
                "sandbox: {} bytes of the command's output were not consumed: this process's \
                 stdout or stderr was not read, and the command's timeout ({} s) ended the wait",
                loss.lost_bytes.unwrap_or(0),
                timeout.as_secs_f64()
            );
            if loss.partial.timed_out {
                eprintln!("sandbox: the command timed out and was terminated");
                EXIT_TIMED_OUT
            } else {
                EXIT_SANDBOX_ERROR
            }
        }
        Ok(Err(ProviderError::Cancelled(_))) => {
            eprintln!("sandbox: cancelled; the command was stopped and cleaned up");
            EXIT_INTERRUPTED
        }
        Ok(Err(ProviderError::CleanupFailed(failure))) => {
            if let Some(why) = setup.isolation_refused() {
                // The embedded engine refused to launch its first command:
                // its own proof that nothing ran in it, where the provider
                // saw only a 503 to the command's creation (the lease is
                // poisoned all the same and its sandbox destroyed).
                eprintln!("sandbox: {}", refused_text(&why));
                return Ok(EXIT_SANDBOX_ERROR);
            }
            if let (Some(partial), false) = (&failure.partial, streamed) {
                let _ = print_output(&partial.stdout, &partial.stderr);
            }
            eprintln!(
                "sandbox: cleanup failed: {}; the lease is poisoned and will be destroyed",
                cleanup_text(&failure)
            );
            EXIT_CLEANUP_FAILED
        }
        Ok(Err(ProviderError::OutputLost(loss))) => {
            if !streamed {
                let _ = print_output(&loss.partial.stdout, &loss.partial.stderr);
            }
            eprintln!("sandbox: output lost: {}", loss_text(&loss));
            if loss.tree_deleted {
                EXIT_SANDBOX_ERROR
            } else {
                eprintln!(
                    "sandbox: the lease is poisoned and will be destroyed (if that fails, \
                     `sandbox lease sweep` destroys it)"
                );
                EXIT_CLEANUP_FAILED
            }
        }
        Ok(Err(error)) => {
            match setup.isolation_refused() {
                Some(why) => eprintln!("sandbox: {}", refused_text(&why)),
                None => eprintln!(
                    "sandbox: the command could not run: {}",
                    report::error_text(&error)
                ),
            }
            EXIT_SANDBOX_ERROR
        }
        Err(error) => {
            let what = match trap_of(&error) {
                Some(trap) => format!("the provider component trapped ({trap})"),
                None => "the host failed".to_owned(),
            };
            eprintln!("sandbox: {what}: {error:#}");
            eprintln!(
                "sandbox: termination is unknown; the lease is poisoned and will be destroyed"
            );
            EXIT_CLEANUP_FAILED
        }
    };
    Ok(code)
}

/// Whether the provider declares that it forwards output live
/// (`incremental-output`), so that a run needs no text in its result.
fn streams_live(setup: &Setup) -> bool {
    setup
        .runtime
        .description()
        .capabilities
        .contains(Capabilities::INCREMENTAL_OUTPUT)
}

/// The status of a run whose output could not all be written (see
/// live.rs): 141 (128 + SIGPIPE, as a pipeline's writer) when the reader
/// closed the stream, said only by the status as `yes | head` does; else
/// a message and 125.
fn undelivered_status(lost: &Undelivered, end: &str) -> u8 {
    if lost.reader_closed() {
        return EXIT_READER_CLOSED;
    }
    eprintln!(
        "sandbox: writing the command's {} failed ({}); {end}, and {} bytes of its output \
         were not written",
        lost.stream_name(),
        lost.message,
        lost.bytes
    );
    EXIT_SANDBOX_ERROR
}

fn finished(
    result: &ExecuteResult,
    streamed: bool,
    result_chars: Option<u32>,
    args: &RunArgs,
) -> u8 {
    // The tail cap applies to the result only: output that was written
    // live above is complete, so only a printed result can lack its start.
    if !streamed {
        if let Err(lost) = print_output(&result.stdout, &result.stderr) {
            return undelivered_status(&lost, "the command had ended");
        }
        let replaced = live::replacement_characters(result.stdout.as_bytes())
            + live::replacement_characters(result.stderr.as_bytes());
        if replaced > 0 {
            // Not silent: the result carries text, not the bytes printed.
            eprintln!(
                "sandbox: note: the output above came from the provider's result, which \
                 carries text: it held {replaced} U+FFFD replacement character(s), where the \
                 command may have printed bytes that were not UTF-8"
            );
        }
        if result.output_truncated && result_chars == Some(0) {
            // The provider declared live output, yet forwarded none of what
            // the command printed: nothing of it reached this terminal.
            eprintln!(
                "sandbox: the provider declares live output but forwarded none of the command's \
                 output, and its result carries none (the run asked for none, expecting it live); \
                 the output was lost: report this to the provider's authors"
            );
            return EXIT_SANDBOX_ERROR;
        }
        if result.output_truncated {
            eprintln!(
                "sandbox: note: the provider kept only the last 4 Mi characters of each stream; \
                 older output was not shown"
            );
        }
    }
    if result.timed_out {
        let limit = args
            .timeout
            .map(|t| format!(" after {t:?}"))
            .unwrap_or_default();
        eprintln!("sandbox: the command timed out{limit} and was terminated");
        return EXIT_TIMED_OUT;
    }
    match (result.exit_code, &result.signal) {
        (Some(code), _) => exit_status(code),
        (None, Some(signal)) => 128 + signal_number(signal).unwrap_or(0),
        (None, None) => {
            eprintln!(
                "sandbox: the provider reported neither an exit code nor a signal for the command"
            );
            EXIT_SANDBOX_ERROR
        }
    }
}

/// The command's exit code as this process's status. A code no process
/// can exit with (negative, or above 255) is never success.
fn exit_status(code: i32) -> u8 {
    match u8::try_from(code) {
        Ok(status) => status,
        Err(_) => {
            eprintln!(
                "sandbox: the provider reported exit code {code}, which no process exits with; \
                 reporting a sandbox failure"
            );
            EXIT_SANDBOX_ERROR
        }
    }
}

/// Writes a result's output (when none arrived live); what could not be
/// written, if a write failed.
fn print_output(stdout: &str, stderr: &str) -> Result<(), Undelivered> {
    let failed = |stream, error: std::io::Error, bytes: usize| Undelivered {
        stream,
        error: error.kind(),
        message: error.to_string(),
        bytes: bytes as u64,
    };
    let mut out = std::io::stdout().lock();
    out.write_all(stdout.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| failed(OutputStream::Stdout, e, stdout.len() + stderr.len()))?;
    std::io::stderr()
        .write_all(stderr.as_bytes())
        .map_err(|e| failed(OutputStream::Stderr, e, stderr.len()))
}

fn signal_number(name: &str) -> Option<u8> {
    let name = name.strip_prefix("SIG").unwrap_or(name);
    Some(match name {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "ABRT" => 6,
        "KILL" => 9,
        "SEGV" => 11,
        "PIPE" => 13,
        "ALRM" => 14,
        "TERM" => 15,
        _ => return None,
    })
}

/// After the command: destroy a poisoned lease, or release a healthy one
/// when `release`. Returns the exit status this step implies.
fn settle(setup: &Setup, env: &Environment, lease_id: &str, release: bool) -> Result<u8> {
    let state = setup
        .runtime
        .store()
        .get(lease_id)?
        .map(|record| record.state);
    match state {
        Some(LeaseState::Poisoned) => destroy_poisoned(setup, env, lease_id),
        Some(LeaseState::Active) if release => match setup.runtime.release(env, lease_id) {
            Ok(Ok(_)) => Ok(0),
            Ok(Err(error)) => {
                eprintln!(
                    "sandbox: releasing the sandbox failed: {}",
                    report::error_text(&error)
                );
                if setup.runtime.store().get(lease_id)?.map(|r| r.state)
                    == Some(LeaseState::Poisoned)
                {
                    destroy_poisoned(setup, env, lease_id)
                } else {
                    // The run is over: a sandbox that could not be released
                    // is destroyed rather than left running.
                    match setup.runtime.destroy(env, lease_id) {
                        Ok(Ok(_)) => {
                            eprintln!("sandbox: the sandbox was destroyed instead");
                            Ok(EXIT_SANDBOX_ERROR)
                        }
                        _ => destroy_poisoned(setup, env, lease_id),
                    }
                }
            }
            Err(error) => {
                eprintln!("sandbox: releasing the sandbox failed: {error:#}");
                destroy_poisoned(setup, env, lease_id)
            }
        },
        _ => Ok(0),
    }
}

fn destroy_poisoned(setup: &Setup, env: &Environment, lease_id: &str) -> Result<u8> {
    match setup.runtime.destroy(env, lease_id) {
        Ok(Ok(_)) => {
            eprintln!("sandbox: the poisoned sandbox was destroyed");
            // Nothing ran in the embedded engine that refused its first
            // command (see `execute`), and its sandbox is gone: the run
            // failed, it did not leave anything unconfirmed.
            if setup.isolation_refused().is_some() {
                return Ok(EXIT_SANDBOX_ERROR);
            }
        }
        Ok(Err(error)) => eprintln!(
            "sandbox: destroying the poisoned sandbox failed ({}); it stays poisoned for `sandbox lease sweep`",
            report::error_text(&error)
        ),
        Err(error) => eprintln!(
            "sandbox: destroying the poisoned sandbox failed ({error:#}); it stays poisoned for `sandbox lease sweep`"
        ),
    }
    Ok(EXIT_CLEANUP_FAILED)
}

/// What removes what this process may leave behind.
fn leftovers(setup: &Setup) -> &'static str {
    if setup.runtime.store().is_durable() {
        "the lease is poisoned once this process's heartbeat has expired, and \
         `sandbox lease sweep` then destroys the sandbox"
    } else {
        "the embedded backend stops with this process and reports what it could not stop"
    }
}

/// What the first signal does to a running command.
const STOPPING: &str = "stopping the command and cleaning up";

/// Lets a lease operation that cannot be cancelled (acquire, release,
/// destroy, probe, sweep) finish on the first Ctrl-C, SIGTERM or SIGHUP,
/// so it leaves nothing unrecorded; a second signal abandons it (exit 120).
pub fn finish_on_first_signal() {
    interrupt_token(
        "finishing the operation first so nothing is left unrecorded",
        "a sandbox may be left behind; once this process's heartbeat has expired, \
         `sandbox lease sweep` handles what the lease store knows",
    );
}

/// A token cancelled by the first Ctrl-C (SIGINT), SIGTERM or SIGHUP
/// (saying `doing`). A second one abandons the cleanup: the process exits
/// 120 at once, saying what may still run (`abandoned`).
fn interrupt_token(doing: &'static str, abandoned: &'static str) -> CancelToken {
    static TOKEN: OnceLock<CancelToken> = OnceLock::new();
    static STARTED: Mutex<bool> = Mutex::new(false);
    let token = TOKEN.get_or_init(CancelToken::new).clone();
    let mut started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
    if *started {
        return token;
    }
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let spawned = {
        let token = token.clone();
        std::thread::Builder::new()
            .name("sandbox-signals".into())
            .spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                runtime.block_on(async move {
                    use tokio::signal::unix::{signal, SignalKind};
                    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
                        signal(SignalKind::interrupt()),
                        signal(SignalKind::terminate()),
                        signal(SignalKind::hangup()),
                    ) else {
                        return;
                    };
                    let _ = ready_tx.send(());
                    macro_rules! next {
                        () => {
                            tokio::select! {
                                _ = int.recv() => "interrupted (Ctrl-C)",
                                _ = term.recv() => "terminated (SIGTERM)",
                                _ = hup.recv() => "hung up (SIGHUP)",
                            }
                        };
                    }
                    let first = next!();
                    // A terminal in raw mode (`-t`) is given back first:
                    // the command is being stopped, and the messages
                    // below are for a terminal in its usual mode.
                    crate::terminal::restore();
                    eprintln!(
                        "\nsandbox: {first}; {doing} (signal again to abandon the cleanup)"
                    );
                    token.cancel();
                    let second = next!();
                    eprintln!(
                        "sandbox: {second} again: cleanup abandoned; the command may still be running in its sandbox ({abandoned})"
                    );
                    crate::terminal::restore();
                    std::process::exit(i32::from(EXIT_CLEANUP_FAILED));
                });
            })
    };
    // Handlers are installed before the command starts.
    if spawned.is_err() || ready_rx.recv().is_err() {
        eprintln!("sandbox: warning: Ctrl-C, SIGTERM and SIGHUP handling is unavailable");
    }
    *started = true;
    token
}

#[cfg(test)]
mod tests {
    use super::exit_status;
    use crate::EXIT_SANDBOX_ERROR;

    /// Pins issue 9 item 6: a negative exit code clamped to 0 (success).
    #[test]
    fn exit_codes_no_process_can_have_are_never_success() {
        assert_eq!(exit_status(0), 0);
        assert_eq!(exit_status(7), 7);
        assert_eq!(exit_status(255), 255);
        for impossible in [-1, -255, 256, i32::MIN, i32::MAX] {
            assert_eq!(exit_status(impossible), EXIT_SANDBOX_ERROR, "{impossible}");
        }
    }
}
