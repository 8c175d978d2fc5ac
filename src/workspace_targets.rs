//! The workspace's own targets: each provider component of `providers/`
//! against its face of `createos-local`, with the face's fault rules.

use std::sync::Arc;

use sandbox_engine::{BackgroundServer, FaultAction, FaultRule, ServerBuilder};
use serde_json::{json, Value};

use crate::backend::Backend;
use crate::built_component;
use crate::fault::FaultPoint;
use crate::local::{LocalBackend, LocalFace};
use crate::target::Target;

/// A target on a fresh `createos-local` per scenario.
pub fn local(name: &str, component_file: &str, face: LocalFace) -> Target {
    Target::new(
        name,
        built_component(component_file),
        Arc::new(move || Ok(Box::new(LocalBackend::start(face)?) as Box<dyn Backend>)),
    )
}

/// Long enough that a request or command never hits it on a slow machine
/// unless the scenario means it to.
const TIMEOUT_MS: u64 = 120_000;
const REQUEST_TIMEOUT_MS: u64 = 30_000;

/// A delay past the provider's request budget.
fn past_budget() -> FaultAction {
    FaultAction::Delay {
        ms: 4 * REQUEST_TIMEOUT_MS,
    }
}

/// A 200 whose body is not JSON.
fn not_json() -> FaultAction {
    FaultAction::Respond {
        status: 200,
        body: "{\"tree_exited\": tr".into(),
    }
}

/// The CreateOS provider (`createos_provider.wasm`) against the CreateOS
/// face (`/v1`).
pub fn createos() -> Target {
    local("createos", "createos_provider.wasm", CREATEOS_FACE)
        .with_reuse(json!({"reuseLease": true}))
}

/// The CreateOS face of `createos-local` (`/v1`) and its fault rules.
pub const CREATEOS_FACE: LocalFace = LocalFace {
    builder: |builder: ServerBuilder| builder,
    config: |server: &BackgroundServer| -> Value {
        json!({
            "apiUrl": server.base_url(),
            "timeoutMs": TIMEOUT_MS,
            "requestTimeoutMs": REQUEST_TIMEOUT_MS,
        })
    },
    secret_field: "apiKey",
    faults: createos_faults,
};

fn createos_faults(point: FaultPoint) -> Vec<FaultRule> {
    const PROCESSES: &str = "/v1/sandboxes/*/processes";
    const PROCESS: &str = "/v1/sandboxes/*/processes/*";
    const SANDBOXES: &str = "/v1/sandboxes";
    const SANDBOX: &str = "/v1/sandboxes/*";
    let rule = FaultRule::new;
    let unavailable = || FaultAction::Status { status: 503 };
    match point {
        FaultPoint::CommandCreationUnanswered => {
            vec![rule("POST", PROCESSES, FaultAction::DropResponse)]
        }
        FaultPoint::CommandCreationServerError => vec![rule("POST", PROCESSES, unavailable())],
        FaultPoint::CommandTerminationFails => vec![rule("DELETE", PROCESS, unavailable())],
        FaultPoint::CommandTerminationUnconfirmed => {
            vec![rule("DELETE", PROCESS, FaultAction::TreeNotExited)]
        }
        FaultPoint::CommandTerminationTimesOut => vec![rule("DELETE", PROCESS, past_budget())],
        FaultPoint::CommandTerminationInvalidAnswer => {
            vec![rule("DELETE", PROCESS, not_json())]
        }
        FaultPoint::SandboxDeletionFails => vec![rule("DELETE", SANDBOX, unavailable())],
        FaultPoint::SandboxDeletionUnanswered => {
            vec![rule("DELETE", SANDBOX, FaultAction::DropResponse)]
        }
        FaultPoint::SandboxCreationAmbiguous => vec![rule("POST", SANDBOXES, unavailable())],
        FaultPoint::OutputStreamHangs => vec![rule(
            "GET",
            "/v1/sandboxes/*/processes/*/connect",
            FaultAction::StallAfterFrames { frames: 1 },
        )],
        // One frame (`ready`), then the service's eviction error; the
        // command itself runs on.
        FaultPoint::OutputEvicted => vec![rule(
            "GET",
            "/v1/sandboxes/*/processes/*/connect",
            FaultAction::Respond {
                status: 200,
                body: "{\"type\":\"data\",\"seq\":1,\"stream\":\"stdout\",\"data_base64\":\"cmVhZHkK\"}\n\
                       {\"type\":\"error\",\"error\":\"output_offset_expired\"}\n"
                    .into(),
            },
        )],
    }
}

/// The Daytona provider (`daytona_provider.wasm`) against the Daytona face
/// (API under `/daytona/api`, toolbox on a second listener).
pub fn daytona() -> Target {
    local("daytona", "daytona_provider.wasm", DAYTONA_FACE).with_reuse(json!({"reuseLease": true}))
}

/// The Daytona face of `createos-local` (API under `/daytona/api`, the
/// toolbox on a second listener) and its fault rules.
pub const DAYTONA_FACE: LocalFace = LocalFace {
    builder: |builder: ServerBuilder| builder.toolbox_port(0),
    config: |server: &BackgroundServer| -> Value {
        json!({
            "apiUrl": server.daytona_api_url(),
            "toolboxUrl": server.toolbox_url(),
            "timeoutMs": TIMEOUT_MS,
            "requestTimeoutMs": REQUEST_TIMEOUT_MS,
        })
    },
    secret_field: "apiKey",
    faults: daytona_faults,
};

fn daytona_faults(point: FaultPoint) -> Vec<FaultRule> {
    const SESSION: &str = "/toolbox/*/process/session/*";
    const EXEC: &str = "/toolbox/*/process/session/*/exec";
    const SANDBOXES: &str = "/daytona/api/sandbox";
    const SANDBOX: &str = "/daytona/api/sandbox/*";
    let rule = FaultRule::new;
    let unavailable = || FaultAction::Status { status: 503 };
    // A command's doubt is resolved by deleting its session (which
    // terminates what it started): the doubt stays only when that delete
    // fails too.
    let session_delete_fails = || rule("DELETE", SESSION, unavailable());
    match point {
        FaultPoint::CommandCreationUnanswered => vec![
            rule("POST", EXEC, FaultAction::DropResponse),
            session_delete_fails(),
        ],
        FaultPoint::CommandCreationServerError => {
            vec![rule("POST", EXEC, unavailable()), session_delete_fails()]
        }
        FaultPoint::CommandTerminationFails => vec![session_delete_fails()],
        FaultPoint::CommandTerminationUnconfirmed => {
            vec![rule("DELETE", SESSION, FaultAction::DropResponse)]
        }
        FaultPoint::CommandTerminationTimesOut => vec![rule("DELETE", SESSION, past_budget())],
        FaultPoint::CommandTerminationInvalidAnswer => {
            vec![rule("DELETE", SESSION, not_json())]
        }
        FaultPoint::SandboxDeletionFails => vec![rule("DELETE", SANDBOX, unavailable())],
        FaultPoint::SandboxDeletionUnanswered => {
            vec![rule("DELETE", SANDBOX, FaultAction::DropResponse)]
        }
        FaultPoint::SandboxCreationAmbiguous => vec![rule("POST", SANDBOXES, unavailable())],
        FaultPoint::OutputStreamHangs => vec![rule(
            "GET",
            "/toolbox/*/process/session/*/command/*/logs",
            FaultAction::StallAfterFrames { frames: 1 },
        )],
        // The face evicts a command's log only while no follower is
        // attached, and no fault rule moves its log-offset header: not
        // producible here (the provider's handling is unit-tested).
        FaultPoint::OutputEvicted => vec![],
    }
}
