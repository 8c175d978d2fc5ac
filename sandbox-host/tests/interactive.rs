//! Contract 0.6.0's interactive processes, the host's side: a component's
//! `interact` takes the events a host queues (in order, each once) through
//! `host.next-interaction-event` and its pollable, says when it started,
//! and sends a terminal's output as one stream; a component built for an
//! earlier contract answers `unsupported` and claims no interactive
//! capability.

mod common;

use std::thread;
use std::time::Duration;

use sandbox_host::types::{
    Capabilities, InteractionEvent, InteractionRequest, InteractionSignal, OutputStream,
    ProviderError, TerminalSize,
};
use sandbox_host::{HostOptions, Interaction, OutputCapture, ProviderComponent};

use common::{ctx, lease};

fn request(terminal: Option<TerminalSize>) -> InteractionRequest {
    InteractionRequest {
        command: "sh".into(),
        args: vec![],
        cwd: None,
        env: vec![],
        terminal,
        timeout_ms: None,
        result_chars: None,
    }
}

fn interactive_component() -> ProviderComponent {
    let wasm = common::build_fixture("contract-v0-6");
    let engine = sandbox_host::shared_engine().unwrap();
    let component = ProviderComponent::load(&engine, &wasm).unwrap();
    // Built for 0.6.0, whose interactive processes the host converts.
    assert_eq!(component.contract(), "sandbox:provider/provider@0.6.0");
    component
}

/// Sends `events` from another thread once the guest said it started, as
/// a caller typing into a running process would.
fn type_after_start(
    interaction: &Interaction,
    events: Vec<InteractionEvent>,
) -> thread::JoinHandle<()> {
    let interaction = interaction.clone();
    thread::spawn(move || {
        while !interaction.has_started() {
            thread::sleep(Duration::from_millis(5));
        }
        for event in events {
            interaction.send(event);
            thread::sleep(Duration::from_millis(20));
        }
    })
}

#[test]
fn a_terminal_takes_input_and_resizes_in_order_and_ends_on_request() {
    let component = interactive_component();
    let interaction = Interaction::new();
    let output = OutputCapture::new();
    let mut instance = component
        .instantiate(
            HostOptions::new()
                .with_output_sink(output.sink())
                .with_interaction(interaction.clone()),
        )
        .unwrap();
    let description = instance.describe().unwrap();
    assert!(description.capabilities.contains(
        Capabilities::LOGIN_PTY | Capabilities::DUPLEX_CHANNELS | Capabilities::TERMINAL_RESIZE
    ));
    // Split UTF-8 crosses as bytes.
    let euro = "€".as_bytes();
    let typing = type_after_start(
        &interaction,
        vec![
            InteractionEvent::Input(euro[..1].to_vec()),
            InteractionEvent::Input(euro[1..].to_vec()),
            InteractionEvent::Resize(TerminalSize {
                columns: 100,
                rows: 20,
            }),
            InteractionEvent::Input(b"\x03".to_vec()),
            InteractionEvent::End,
        ],
    );
    let size = TerminalSize {
        columns: 120,
        rows: 30,
    };
    let result = instance
        .interact(&ctx("{}"), &lease(), &request(Some(size)))
        .unwrap()
        .unwrap();
    typing.join().unwrap();
    assert_eq!(result.signal.as_deref(), Some("SIGTERM"));
    assert!(interaction.has_started());
    assert_eq!(
        output.chunks(),
        vec![
            (OutputStream::Terminal, b"size 120x30\n".to_vec()),
            (OutputStream::Terminal, euro[..1].to_vec()),
            (OutputStream::Terminal, euro[1..].to_vec()),
            (OutputStream::Terminal, b"resize 100x20\n".to_vec()),
            (OutputStream::Terminal, b"\x03".to_vec()),
        ]
    );
}

#[test]
fn pipes_take_input_until_it_is_closed_and_a_signal_ends_them() {
    let component = interactive_component();
    let interaction = Interaction::new();
    let output = OutputCapture::new();
    let options = HostOptions::new()
        .with_output_sink(output.sink())
        .with_interaction(interaction.clone());
    let mut instance = component.instantiate(options.clone()).unwrap();
    // Events queued before the start wait for the guest.
    interaction.send(InteractionEvent::Input(b"hello ".to_vec()));
    let typing = type_after_start(
        &interaction,
        vec![
            InteractionEvent::Input(b"world".to_vec()),
            InteractionEvent::CloseInput,
        ],
    );
    let result = instance
        .interact(&ctx("{}"), &lease(), &request(None))
        .unwrap()
        .unwrap();
    typing.join().unwrap();
    assert_eq!(
        (result.exit_code, result.stdout.as_str()),
        (Some(0), "hello world")
    );
    assert_eq!(output.bytes(OutputStream::Stdout), b"hello world");

    let interaction = Interaction::new();
    let mut instance = component
        .instantiate(HostOptions::new().with_interaction(interaction.clone()))
        .unwrap();
    interaction.send(InteractionEvent::Signal(InteractionSignal::Interrupt));
    let result = instance
        .interact(&ctx("{}"), &lease(), &request(None))
        .unwrap()
        .unwrap();
    assert_eq!(result.signal.as_deref(), Some("SIGINT"));
}

#[test]
fn cancellation_ends_an_interactive_process_as_cancelled() {
    let component = interactive_component();
    let options = HostOptions::new();
    let cancel = options.cancel_token().clone();
    let interaction = Interaction::new();
    let mut instance = component
        .instantiate(options.with_interaction(interaction.clone()))
        .unwrap();
    let canceller = thread::spawn(move || {
        while !interaction.has_started() {
            thread::sleep(Duration::from_millis(5));
        }
        cancel.cancel();
    });
    let answer = instance
        .interact(&ctx("{}"), &lease(), &request(None))
        .unwrap();
    canceller.join().unwrap();
    assert!(
        matches!(answer, Err(ProviderError::Cancelled(None))),
        "{answer:?}"
    );
}

/// A component built before 0.6.0 has no `interact`: the host answers
/// `unsupported` without entering it, and whatever its description says,
/// it claims no interactive capability.
#[test]
fn a_component_before_0_6_has_no_interactive_processes() {
    let wasm = common::build_fixture("contract-v0-4");
    let engine = sandbox_host::shared_engine().unwrap();
    let component = ProviderComponent::load(&engine, &wasm).unwrap();
    let mut instance = component.instantiate(HostOptions::new()).unwrap();
    let capabilities = instance.describe().unwrap().capabilities;
    assert!(!capabilities.intersects(
        Capabilities::LOGIN_PTY | Capabilities::DUPLEX_CHANNELS | Capabilities::TERMINAL_RESIZE
    ));
    match instance
        .interact(&ctx("{}"), &lease(), &request(None))
        .unwrap()
    {
        Err(ProviderError::Unsupported(why)) => {
            assert!(why.contains("0.4.0") && why.contains("0.6.0"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert!(!instance.has_trapped());
}
