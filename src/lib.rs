//! The conformance kit: provider-neutral scenarios that any
//! `sandbox-provider` component passes against its backend.
//!
//! The kit drives a component only through the host
//! ([`SandboxRuntime`](sandbox_host::SandboxRuntime): environment, acquire,
//! execute, release, resume, destroy, sweep), so any provider built for the
//! contract can be plugged in as a [`Target`]: its component, and a
//! [`Backend`] per scenario (an in-process `createos-local` face with its
//! fault rules, [`LocalBackend`], or a running service named by a config,
//! [`LiveBackend`]). A scenario that needs a [`FaultPoint`] or a
//! capability the target lacks reports [`Verdict::NotApplicable`], never a
//! silent pass.
//!
//! `tests/conformance.rs` runs the suite on every provider of the
//! workspace ([`conformance_suite!`]); `cargo run -p sandbox-conformance
//! --bin conformance -- --provider my.wasm --config my-config.json` runs it
//! on anyone's.
//!
//! This is the workspace's root package: `tests/` holds the kit's own
//! tests and `output_volume.rs`, the one suite that runs the same checks on
//! both providers; each provider's suites live beside it
//! (`providers/<name>/tests`).

#![deny(missing_docs)]

pub mod backend;
pub mod command;
pub mod fault;
pub mod local;
pub mod scenarios;
pub mod session;
pub mod suite;
pub mod target;
pub mod verdict;
pub mod workspace_targets;

pub use backend::{Backend, LiveBackend};
pub use fault::FaultPoint;
pub use local::{LocalBackend, LocalFace};
pub use session::Session;
pub use suite::Scenario;
pub use target::Target;
pub use verdict::Verdict;

/// Where `./build.sh` puts the component whose file name is `file_name`
/// (for example `createos_provider.wasm`).
pub use test_support::built_component;
/// The machine's processes seen in `/proc` and unique markers, shared
/// with every suite of the workspace.
pub use test_support::procs;

/// Runs `scenario` on `target` and checks its verdict: it must pass, or,
/// when its name is in `not_applicable`, be not applicable (so a target's
/// gaps are declared where its tests are, never a silent pass). Panics
/// with the reason otherwise; prints the verdict.
pub fn check(target: &Target, scenario: Scenario, not_applicable: &[&str]) {
    let name = scenario.name();
    let expected_na = not_applicable.contains(&name.as_str());
    match scenario.run(target) {
        Ok(verdict) => {
            eprintln!("conformance {} {name}: {verdict}", target.name());
            match (&verdict, expected_na) {
                (Verdict::Passed(_), false) | (Verdict::NotApplicable(_), true) => {}
                (Verdict::Passed(_), true) => panic!(
                    "{name} passed on {}, but the suite lists it as not applicable: remove it \
                     from the list",
                    target.name()
                ),
                (Verdict::NotApplicable(why), false) => panic!(
                    "{name} is not applicable to {} ({why}); list it as not applicable if that \
                     is intended",
                    target.name()
                ),
            }
        }
        Err(error) => panic!("conformance {} {name} failed: {error:#}", target.name()),
    }
}

/// One test per scenario for a target, in a module whose name contains
/// `conformance` and the provider (`cargo test conformance` runs them all,
/// `cargo test conformance_createos` one provider's):
///
/// ```ignore
/// sandbox_conformance::conformance_suite!(conformance_createos, sandbox_conformance::workspace_targets::createos());
/// sandbox_conformance::conformance_suite!(conformance_mine, my_target(), not_applicable = ["cleanup_failed_output_stream_hangs"]);
/// ```
#[macro_export]
macro_rules! conformance_suite {
    ($module:ident, $target:expr) => {
        $crate::conformance_suite!($module, $target, not_applicable = []);
    };
    ($module:ident, $target:expr, not_applicable = [$($na:literal),* $(,)?]) => {
        mod $module {
            use $crate::{FaultPoint, Scenario};

            fn check(scenario: Scenario) {
                static TARGET: ::std::sync::OnceLock<$crate::Target> = ::std::sync::OnceLock::new();
                let target = TARGET.get_or_init(|| $target);
                $crate::check(target, scenario, &[$($na),*]);
            }

            #[test]
            fn exit_codes() {
                check(Scenario::ExitCodes);
            }
            #[test]
            fn env_cwd_stdin() {
                check(Scenario::EnvCwdStdin);
            }
            #[test]
            fn hostile_quoting() {
                check(Scenario::HostileQuoting);
            }
            #[test]
            fn live_output() {
                check(Scenario::LiveOutput);
            }
            #[test]
            fn utf8_across_chunks() {
                check(Scenario::Utf8AcrossChunks);
            }
            #[test]
            fn result_chars() {
                check(Scenario::ResultChars);
            }
            #[test]
            fn timeout_leaves_no_survivor() {
                check(Scenario::TimeoutLeavesNoSurvivor);
            }
            #[test]
            fn cancellation_leaves_no_survivor() {
                check(Scenario::CancellationLeavesNoSurvivor);
            }
            #[test]
            fn lifecycle() {
                check(Scenario::Lifecycle);
            }
            #[test]
            fn lifecycle_reuse() {
                check(Scenario::LifecycleReuse);
            }
            #[test]
            fn secret_never_visible() {
                check(Scenario::SecretNeverVisible);
            }
            #[test]
            fn interactive_terminal() {
                check(Scenario::InteractiveTerminal);
            }
            #[test]
            fn interactive_pipes() {
                check(Scenario::InteractivePipes);
            }
            #[test]
            fn interactive_end() {
                check(Scenario::InteractiveEnd);
            }
            #[test]
            fn cleanup_failed_command_creation_unanswered() {
                check(Scenario::CleanupFailed(FaultPoint::CommandCreationUnanswered));
            }
            #[test]
            fn cleanup_failed_command_creation_server_error() {
                check(Scenario::CleanupFailed(FaultPoint::CommandCreationServerError));
            }
            #[test]
            fn cleanup_failed_command_termination_fails() {
                check(Scenario::CleanupFailed(FaultPoint::CommandTerminationFails));
            }
            #[test]
            fn cleanup_failed_command_termination_unconfirmed() {
                check(Scenario::CleanupFailed(FaultPoint::CommandTerminationUnconfirmed));
            }
            #[test]
            fn cleanup_failed_command_termination_times_out() {
                check(Scenario::CleanupFailed(FaultPoint::CommandTerminationTimesOut));
            }
            #[test]
            fn cleanup_failed_command_termination_invalid_answer() {
                check(Scenario::CleanupFailed(FaultPoint::CommandTerminationInvalidAnswer));
            }
            #[test]
            fn cleanup_failed_sandbox_deletion_fails() {
                check(Scenario::CleanupFailed(FaultPoint::SandboxDeletionFails));
            }
            #[test]
            fn cleanup_failed_sandbox_deletion_unanswered() {
                check(Scenario::CleanupFailed(FaultPoint::SandboxDeletionUnanswered));
            }
            #[test]
            fn cleanup_failed_sandbox_creation_ambiguous() {
                check(Scenario::CleanupFailed(FaultPoint::SandboxCreationAmbiguous));
            }
            #[test]
            fn cleanup_failed_output_stream_hangs() {
                check(Scenario::CleanupFailed(FaultPoint::OutputStreamHangs));
            }
            #[test]
            fn output_lost() {
                check(Scenario::OutputLost);
            }
        }
    };
}
