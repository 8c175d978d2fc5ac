//! Provider-neutral fault points: what goes wrong, in the words of the
//! contract (a command's creation, its termination, a sandbox's creation
//! or deletion, its output stream), not in the paths of one API. A target
//! maps each point it can produce to its backend's fault rules.

use sandbox_host::types::CleanupPhase;

/// One failure a backend's fault injection can produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// The request that starts a command is carried out, but its answer
    /// never arrives (the connection closes): the command runs, and the
    /// provider cannot know it. A target may add a failure of the
    /// provider's cleanup of that doubt (for example the delete of the
    /// command's session), so that the doubt stays.
    CommandCreationUnanswered,
    /// The request that starts a command is answered with a 5xx: it may
    /// have started.
    CommandCreationServerError,
    /// The request that terminates a command (on timeout or cancellation)
    /// is answered with a 5xx: the command's tree may still run.
    CommandTerminationFails,
    /// The termination request is carried out, but its outcome is not
    /// confirmed: no answer arrives, or the answer holds no proof that the
    /// whole tree is gone.
    CommandTerminationUnconfirmed,
    /// The termination request gets no answer within the provider's
    /// request budget (its deadline passes).
    CommandTerminationTimesOut,
    /// The termination request is answered 2xx with a body that is not a
    /// valid answer.
    CommandTerminationInvalidAnswer,
    /// The request that deletes the sandbox is answered with a 5xx.
    SandboxDeletionFails,
    /// The sandbox deletion is carried out, but its answer never arrives.
    SandboxDeletionUnanswered,
    /// The request that creates a sandbox is answered with a 5xx: a sandbox
    /// may exist, and no id is known to delete it by.
    SandboxCreationAmbiguous,
    /// The command's output stream stops delivering (the connection stays
    /// open, the body never ends): the provider's deadline must still end
    /// the command.
    OutputStreamHangs,
    /// The server drops the command's output before the provider read it
    /// (its replay window moved past the reader: CreateOS's
    /// `output_offset_expired`), while the command still runs. Not a
    /// cleanup fault: the `output_lost` scenario runs it.
    OutputEvicted,
}

impl FaultPoint {
    /// Every fault point of a `cleanup_failed_*` scenario, in the order
    /// the suite runs them.
    pub const ALL: [FaultPoint; 10] = [
        FaultPoint::CommandCreationUnanswered,
        FaultPoint::CommandCreationServerError,
        FaultPoint::CommandTerminationFails,
        FaultPoint::CommandTerminationUnconfirmed,
        FaultPoint::CommandTerminationTimesOut,
        FaultPoint::CommandTerminationInvalidAnswer,
        FaultPoint::SandboxDeletionFails,
        FaultPoint::SandboxDeletionUnanswered,
        FaultPoint::SandboxCreationAmbiguous,
        FaultPoint::OutputStreamHangs,
    ];

    /// The point's name (`command_termination_fails`, …), as scenario
    /// names and the runner use it.
    pub fn name(self) -> &'static str {
        match self {
            FaultPoint::CommandCreationUnanswered => "command_creation_unanswered",
            FaultPoint::CommandCreationServerError => "command_creation_server_error",
            FaultPoint::CommandTerminationFails => "command_termination_fails",
            FaultPoint::CommandTerminationUnconfirmed => "command_termination_unconfirmed",
            FaultPoint::CommandTerminationTimesOut => "command_termination_times_out",
            FaultPoint::CommandTerminationInvalidAnswer => "command_termination_invalid_answer",
            FaultPoint::SandboxDeletionFails => "sandbox_deletion_fails",
            FaultPoint::SandboxDeletionUnanswered => "sandbox_deletion_unanswered",
            FaultPoint::SandboxCreationAmbiguous => "sandbox_creation_ambiguous",
            FaultPoint::OutputStreamHangs => "output_stream_hangs",
            FaultPoint::OutputEvicted => "output_evicted",
        }
    }

    /// The `cleanup-failed` phase the provider must report for this point
    /// (`None`: the output stream hanging may also end in a confirmed
    /// timeout).
    pub fn phase(self) -> Option<CleanupPhase> {
        match self {
            FaultPoint::CommandCreationUnanswered | FaultPoint::CommandCreationServerError => {
                Some(CleanupPhase::ProcessCreation)
            }
            FaultPoint::CommandTerminationFails
            | FaultPoint::CommandTerminationUnconfirmed
            | FaultPoint::CommandTerminationTimesOut
            | FaultPoint::CommandTerminationInvalidAnswer => Some(CleanupPhase::ProcessTermination),
            FaultPoint::SandboxDeletionFails | FaultPoint::SandboxDeletionUnanswered => {
                Some(CleanupPhase::SandboxDeletion)
            }
            FaultPoint::SandboxCreationAmbiguous => Some(CleanupPhase::LeaseSetup),
            FaultPoint::OutputStreamHangs | FaultPoint::OutputEvicted => None,
        }
    }
}

/// A cleanup phase in the contract's words.
pub fn phase_name(phase: CleanupPhase) -> &'static str {
    match phase {
        CleanupPhase::ProcessCreation => "process-creation",
        CleanupPhase::ProcessTermination => "process-termination",
        CleanupPhase::LeaseSetup => "lease-setup",
        CleanupPhase::SandboxDeletion => "sandbox-deletion",
    }
}
