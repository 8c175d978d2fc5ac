//! `-t` and `-i`: a command that runs as an interactive process
//! (`provider.interact`, contract 0.6.0), talked to while it runs, as
//! `docker exec -it` or `ssh -t` would.
//!
//! - `-t`: a terminal in the sandbox of this terminal's window size,
//!   resized with it (`SIGWINCH`, where the provider claims
//!   `terminal-resize`); this terminal in raw mode, so every key (`^C`,
//!   `^D`, `^Z` included) goes to the command as bytes; stdin is passed on
//!   as it comes (as `ssh -t`: a terminal without keys is of no use). A
//!   stdin that is not a terminal is passed on as keys too, and its end
//!   is `^D`.
//! - `-i` alone: pipes; stdin is passed on as it comes, and its end closes
//!   the command's stdin. `^C` here stops the command (as without `-i`).
//!
//! The host sends only what the process can take
//! ([`Interaction::try_send`]): no resize to pipes or to a provider
//! without `terminal-resize`, no `close-input` to a terminal, nothing
//! after the input's end.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use sandbox_host::types::{
    Capabilities, ExecuteRequest, ExecuteResult, InteractionEvent, InteractionRequest,
    ProviderError,
};
use sandbox_host::{CancelToken, Environment, Interaction, OutputSink};

use crate::backend::Setup;
use crate::terminal::{self, RawMode};
use crate::RunArgs;

/// How long an interactive command may run without `--timeout`: the
/// contract's longest (24 h), not the provider's default for commands.
pub const DEFAULT_TIMEOUT_MS: u64 = 86_400_000;

/// How often the stdin reader looks whether the command has ended.
const POLL: Duration = Duration::from_millis(100);

/// Runs `request` as an interactive process on `lease_id` (see the module
/// docs); the outcome as `execute`'s.
pub fn run(
    setup: &Setup,
    env: &Environment,
    lease_id: &str,
    request: &ExecuteRequest,
    args: &RunArgs,
    sink: OutputSink,
    cancel: CancelToken,
) -> Result<Result<Result<ExecuteResult, ProviderError>>> {
    let capabilities = setup.runtime.description().capabilities;
    let provider = setup.runtime.component().contract();
    let (needed, what, flag) = if args.tty {
        (Capabilities::LOGIN_PTY, "a terminal", "-t")
    } else {
        (Capabilities::DUPLEX_CHANNELS, "input while it runs", "-i")
    };
    if !capabilities.contains(needed) {
        bail!(
            "the provider ({provider}) cannot give a command {what} (it does not claim {}); \
             nothing ran. Run without {flag}: a piped or redirected stdin, or --stdin FILE, \
             is given to the command whole",
            if args.tty {
                "login-pty"
            } else {
                "duplex-channels"
            }
        );
    }
    let resizable = capabilities.contains(Capabilities::TERMINAL_RESIZE);
    let terminal_size = args
        .tty
        .then(|| terminal::window_size().unwrap_or(terminal::DEFAULT_SIZE));
    let mut environment = request.env.clone();
    if args.tty && !environment.iter().any(|(name, _)| name == "TERM") {
        let term = std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into());
        environment.push(("TERM".into(), term));
    }
    let interaction_request = InteractionRequest {
        command: request.command.clone(),
        args: request.args.clone(),
        cwd: request.cwd.clone(),
        env: environment,
        terminal: terminal_size,
        timeout_ms: Some(request.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)),
        result_chars: request.result_chars,
    };
    let interaction = Interaction::for_process(args.tty, resizable);
    let ended = Arc::new(AtomicBool::new(false));
    let raw = if args.tty { RawMode::enter()? } else { None };
    let input = spawn_input(&interaction, &ended, args.tty);
    let window = args
        .tty
        .then(|| spawn_window(&interaction, &ended))
        .flatten();
    let outcome = setup.runtime.interact(
        env,
        lease_id,
        &interaction_request,
        interaction,
        Some(sink),
        cancel,
    );
    ended.store(true, Ordering::Relaxed);
    drop(raw);
    if let Some(window) = window {
        let _ = window.join();
    }
    // The stdin reader stops within `POLL`: it holds no key typed after.
    let _ = input.join();
    Ok(outcome)
}

/// Passes stdin on as input events until its end (then `^D` for a
/// terminal, `close-input` for pipes) or the command's end.
fn spawn_input(
    interaction: &Interaction,
    ended: &Arc<AtomicBool>,
    tty: bool,
) -> std::thread::JoinHandle<()> {
    let interaction = interaction.clone();
    let ended = ended.clone();
    std::thread::spawn(move || {
        let stdin = rustix::stdio::stdin();
        let mut buffer = vec![0u8; 64 * 1024];
        while !ended.load(Ordering::Relaxed) {
            let mut fds = [rustix::event::PollFd::new(
                &stdin,
                rustix::event::PollFlags::IN,
            )];
            let timeout = rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: POLL.as_nanos() as _,
            };
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => break,
            }
            match rustix::io::read(stdin, &mut buffer) {
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => continue,
                Ok(0) | Err(_) => {
                    // The end of input: `^D` to a terminal, closed pipes.
                    let _ = interaction.try_send(if tty {
                        InteractionEvent::Input(vec![0x04])
                    } else {
                        InteractionEvent::CloseInput
                    });
                    break;
                }
                Ok(read) => {
                    let input = InteractionEvent::Input(buffer[..read].to_vec());
                    if interaction.try_send(input).is_err() {
                        break;
                    }
                }
            }
        }
    })
}

/// Follows this terminal's window size (`SIGWINCH`): each new size goes
/// to the command's terminal where the provider can resize it; otherwise
/// the first change says once why the terminal keeps its size.
fn spawn_window(
    interaction: &Interaction,
    ended: &Arc<AtomicBool>,
) -> Option<std::thread::JoinHandle<()>> {
    let interaction = interaction.clone();
    let ended = ended.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    // Registered before the command starts: no change is missed.
    let mut changes = {
        let _entered = runtime.enter();
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok()?
    };
    Some(std::thread::spawn(move || {
        runtime.block_on(async move {
            let mut said = false;
            while !ended.load(Ordering::Relaxed) {
                match tokio::time::timeout(POLL, changes.recv()).await {
                    Ok(Some(())) => {}
                    Ok(None) => return,
                    Err(_) => continue,
                }
                let Some(size) = terminal::window_size() else {
                    continue;
                };
                match interaction.try_send(InteractionEvent::Resize(size)) {
                    Err(refused) if !said => {
                        said = true;
                        eprint!("\r\nsandbox: note: {refused}\r\n");
                    }
                    _ => {}
                }
            }
        })
    }))
}
