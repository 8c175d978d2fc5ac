//! The suite: every provider-neutral scenario, its name, and how it runs
//! against a target.

use std::fmt;

use anyhow::Result;

use crate::fault::FaultPoint;
use crate::scenarios;
use crate::target::Target;
use crate::verdict::Verdict;

/// One scenario of the suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// Commands exit with their own code, output per stream; a killed one
    /// is not a success; a missing command is not a success.
    ExitCodes,
    /// Env values, the working directory and stdin (none, empty, text,
    /// 1 MiB) reach the command exactly.
    EnvCwdStdin,
    /// Quotes, `$()`, backticks, globs, newlines and Unicode in arguments,
    /// env values and the cwd arrive verbatim and run nothing.
    HostileQuoting,
    /// Output arrives through the output sink while the command runs, in
    /// order, and equals the result.
    LiveOutput,
    /// Multi-byte characters written a byte at a time arrive whole; an
    /// invalid byte is U+FFFD.
    Utf8AcrossChunks,
    /// The result keeps the characters the request's `result-chars` asks
    /// for (the last ones; none at 0), the live output everything.
    ResultChars,
    /// A command that ignores SIGTERM times out with its whole tree gone
    /// and its partial output kept; the lease stays usable.
    TimeoutLeavesNoSurvivor,
    /// A cancelled command ends `cancelled` with its partial output and its
    /// whole tree gone; the lease stays usable.
    CancellationLeavesNoSurvivor,
    /// Acquire, release, destroy (twice), and leases that refuse commands
    /// once released or destroyed.
    Lifecycle,
    /// A reusable lease keeps its files across release (paused) and resume.
    LifecycleReuse,
    /// The key reaches the backend and nothing else: not the component's
    /// config, the lease store, the sandbox's environment, any output or
    /// error.
    SecretNeverVisible,
    /// A fault point: `cleanup-failed` with the right phase, the lease
    /// poisoned and refused, and sweep (once the fault is gone) destroying
    /// it with no survivor.
    CleanupFailed(FaultPoint),
    /// The server drops output the provider had not read (contract 0.3.0):
    /// `output-lost`, never a result or an invalid answer, keeping what
    /// arrived; with the tree's deletion proven the lease stays usable and
    /// nothing survives; with it unconfirmed too, the lease is poisoned and
    /// sweep destroys it with no survivor.
    OutputLost,
    /// A terminal (contract 0.6.0, `login-pty`): `stty size` answers the
    /// size asked (and the resized size, with `terminal-resize`), `tty`
    /// names a `/dev/pts/N`, a Python REPL answers two lines typed a while
    /// apart, `^C` ends a `sleep`.
    InteractiveTerminal,
    /// Pipes kept open (`duplex-channels`): `cat` gives back 10 MB of
    /// arbitrary bytes exactly.
    InteractivePipes,
    /// `end` of an interactive process leaves nothing of its tree running.
    InteractiveEnd,
}

impl Scenario {
    /// The scenarios that need no fault injection.
    pub const FAULT_FREE: [Scenario; 14] = [
        Scenario::ExitCodes,
        Scenario::EnvCwdStdin,
        Scenario::HostileQuoting,
        Scenario::LiveOutput,
        Scenario::Utf8AcrossChunks,
        Scenario::ResultChars,
        Scenario::TimeoutLeavesNoSurvivor,
        Scenario::CancellationLeavesNoSurvivor,
        Scenario::Lifecycle,
        Scenario::LifecycleReuse,
        Scenario::SecretNeverVisible,
        Scenario::InteractiveTerminal,
        Scenario::InteractivePipes,
        Scenario::InteractiveEnd,
    ];

    /// Every scenario: the fault-free ones, one per cleanup fault point,
    /// then lost output.
    pub fn all() -> Vec<Scenario> {
        let mut all = Scenario::FAULT_FREE.to_vec();
        all.extend(FaultPoint::ALL.map(Scenario::CleanupFailed));
        all.push(Scenario::OutputLost);
        all
    }

    /// The scenario's name (`exit_codes`, `cleanup_failed_command_termination_fails`, …).
    pub fn name(self) -> String {
        match self {
            Scenario::ExitCodes => "exit_codes".into(),
            Scenario::EnvCwdStdin => "env_cwd_stdin".into(),
            Scenario::HostileQuoting => "hostile_quoting".into(),
            Scenario::LiveOutput => "live_output".into(),
            Scenario::Utf8AcrossChunks => "utf8_across_chunks".into(),
            Scenario::ResultChars => "result_chars".into(),
            Scenario::TimeoutLeavesNoSurvivor => "timeout_leaves_no_survivor".into(),
            Scenario::CancellationLeavesNoSurvivor => "cancellation_leaves_no_survivor".into(),
            Scenario::Lifecycle => "lifecycle".into(),
            Scenario::LifecycleReuse => "lifecycle_reuse".into(),
            Scenario::SecretNeverVisible => "secret_never_visible".into(),
            Scenario::CleanupFailed(point) => format!("cleanup_failed_{}", point.name()),
            Scenario::OutputLost => "output_lost".into(),
            Scenario::InteractiveTerminal => "interactive_terminal".into(),
            Scenario::InteractivePipes => "interactive_pipes".into(),
            Scenario::InteractiveEnd => "interactive_end".into(),
        }
    }

    /// The scenario called `name`.
    pub fn from_name(name: &str) -> Option<Scenario> {
        Scenario::all().into_iter().find(|s| s.name() == name)
    }

    /// Runs the scenario against `target` on a fresh backend. An error
    /// says which check failed and what happened instead.
    pub fn run(self, target: &Target) -> Result<Verdict> {
        match self {
            Scenario::ExitCodes => scenarios::exec::exit_codes(target),
            Scenario::EnvCwdStdin => scenarios::exec::env_cwd_stdin(target),
            Scenario::HostileQuoting => scenarios::exec::hostile_quoting(target),
            Scenario::LiveOutput => scenarios::output::live_output(target),
            Scenario::Utf8AcrossChunks => scenarios::output::utf8_across_chunks(target),
            Scenario::ResultChars => scenarios::output::result_chars(target),
            Scenario::TimeoutLeavesNoSurvivor => scenarios::termination::timeout(target),
            Scenario::CancellationLeavesNoSurvivor => scenarios::termination::cancellation(target),
            Scenario::Lifecycle => scenarios::lifecycle::release_and_destroy(target),
            Scenario::LifecycleReuse => scenarios::lifecycle::reuse(target),
            Scenario::SecretNeverVisible => scenarios::secret::never_visible(target),
            Scenario::CleanupFailed(point) => scenarios::cleanup::cleanup_failed(target, point),
            Scenario::OutputLost => scenarios::output::output_lost(target),
            Scenario::InteractiveTerminal => scenarios::interactive::terminal_session(target),
            Scenario::InteractivePipes => scenarios::interactive::pipes_round_trip(target),
            Scenario::InteractiveEnd => scenarios::interactive::end_leaves_no_process(target),
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}
