//! The kit itself: its checks can fail, and a fault a backend cannot
//! produce is "not applicable", never a pass. Needs `./build.sh`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use sandbox_conformance::workspace_targets::{self, CREATEOS_FACE};
use sandbox_conformance::{
    built_component, Backend, FaultPoint, LiveBackend, LocalFace, Scenario, Target, Verdict,
};
use sandbox_engine::{BackgroundServer, FaultAction, FaultRule, Server};
use serde_json::json;

#[test]
fn conformance_kit_scenario_names_are_unique_and_round_trip() {
    let all = Scenario::all();
    // The fault-free ones (three of them interactive), one per cleanup fault
    // point, and `output_lost`.
    assert_eq!(all.len(), 14 + FaultPoint::ALL.len() + 1);
    for scenario in &all {
        assert_eq!(Scenario::from_name(&scenario.name()), Some(*scenario));
    }
    let mut names: Vec<String> = all.iter().map(|s| s.name()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), all.len());
}

/// A target whose fault rule never matches a request: the provider sees no
/// fault and confirms the timeout, so the scenario must fail, not pass.
#[test]
fn conformance_kit_fails_when_the_fault_does_not_happen() {
    let face = LocalFace {
        faults: |_| {
            vec![FaultRule::new(
                "DELETE",
                "/v1/nowhere/*",
                FaultAction::Status { status: 503 },
            )]
        },
        ..CREATEOS_FACE
    };
    let target = workspace_targets::local("createos-no-fault", "createos_provider.wasm", face);
    let outcome = Scenario::CleanupFailed(FaultPoint::CommandTerminationFails).run(&target);
    let error = outcome.expect_err("a fault that never happened cannot pass");
    let text = format!("{error:#}");
    assert!(text.contains("must end in cleanup-failed"), "{text}");
    assert!(text.contains("timed out true"), "{text}");
}

/// A running backend named by a config has no fault injection: every fault
/// scenario is not applicable, and `check` fails unless it is listed so.
#[test]
fn conformance_kit_reports_faults_a_backend_cannot_produce_as_not_applicable() {
    let server = BackgroundServer::start(Server::builder().api_key("kit-live-key").quiet(true))
        .expect("server starts");
    let backend = LiveBackend::new(json!({
        "apiUrl": server.base_url(),
        "apiKey": "kit-live-key",
    }))
    .on_this_machine(true);
    let target = Target::new(
        "createos-live",
        built_component("createos_provider.wasm"),
        Arc::new(move || Ok(Box::new(backend.clone()) as Box<dyn Backend>)),
    );
    let scenario = Scenario::CleanupFailed(FaultPoint::SandboxDeletionFails);
    let verdict = scenario.run(&target).expect("no failure");
    assert!(
        matches!(&verdict, Verdict::NotApplicable(why) if why.contains("sandbox_deletion_fails")),
        "{verdict:?}"
    );
    let unlisted = catch_unwind(AssertUnwindSafe(|| {
        sandbox_conformance::check(&target, scenario, &[])
    }));
    assert!(unlisted.is_err(), "an unlisted not-applicable must fail");
    sandbox_conformance::check(
        &target,
        scenario,
        &["cleanup_failed_sandbox_deletion_fails"],
    );
    let listed_but_passing = catch_unwind(AssertUnwindSafe(|| {
        sandbox_conformance::check(&target, Scenario::ExitCodes, &["exit_codes"])
    }));
    assert!(
        listed_but_passing.is_err(),
        "a scenario listed as not applicable that passes must fail"
    );
    let report = server.shutdown();
    assert!(report.all_exited(), "{report:?}");
}
