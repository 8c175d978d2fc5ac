//! The lease state machine, in one place: which state may follow which, and
//! what an operation demands of a lease before it may touch the sandbox.
//!
//! Pure: a store (SQLite today, another database later) reads the lease and
//! the liveness of the hosts that marked it, asks [`decide`](crate::leases::rules::decide), and applies
//! the [`Decision`](crate::leases::rules::Decision) in the same transaction. Nothing here knows SQL.
//!
//! The rules:
//! - An operation that uses the sandbox (execute, realize, resume) takes a
//!   *busy mark* owned by a host instance; release and destroy move the
//!   lease to `closing` (or keep it `poisoned`) and own the close.
//! - A mark or a close owned by another host that is alive refuses the
//!   operation. One owned by a host whose heartbeat expired means that host
//!   died mid-operation: the lease is poisoned first, durably, whatever the
//!   operation was; only destroy (and sweep) may go on.
//! - `closing` refuses everything that would use the sandbox, so a command
//!   cannot start between release's cancellation and its pause.

use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Result};

/// Where a lease is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeaseState {
    /// Recorded before `acquire-lease` (or `probe`) ran, owned by the host
    /// running it; if that host dies, a sandbox may exist with no id to
    /// clean it up with: sweep marks it `unknown`.
    Acquiring,
    /// Acquired and usable.
    Active,
    /// A release or destroy is under way: nothing may start on it.
    Closing,
    /// Released (paused or deleted by the provider).
    Released,
    /// Something may still run in the sandbox: never reuse, only destroy.
    Poisoned,
    /// Destroyed; final.
    Destroyed,
    /// The acquire's outcome is unknown and there is no id to clean up
    /// with; kept so a person can look. Final.
    Unknown,
}

impl LeaseState {
    /// The stored name (`acquiring`, `active`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Acquiring => "acquiring",
            LeaseState::Active => "active",
            LeaseState::Closing => "closing",
            LeaseState::Released => "released",
            LeaseState::Poisoned => "poisoned",
            LeaseState::Destroyed => "destroyed",
            LeaseState::Unknown => "unknown",
        }
    }

    /// Whether a lease in this state may move to `next`.
    pub fn may_become(self, next: LeaseState) -> bool {
        use LeaseState::*;
        match self {
            Destroyed | Unknown => false,
            Poisoned => matches!(next, Destroyed | Poisoned),
            Acquiring => matches!(next, Acquiring | Active | Poisoned | Destroyed | Unknown),
            Active => matches!(next, Active | Closing | Poisoned),
            Released => matches!(next, Active | Closing | Poisoned),
            Closing => matches!(next, Active | Released | Poisoned | Destroyed),
        }
    }

    /// Whether the lease is over (nothing to do with it any more).
    pub fn is_final(self) -> bool {
        matches!(self, LeaseState::Destroyed | LeaseState::Unknown)
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LeaseState {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> Result<Self> {
        Ok(match text {
            "acquiring" => LeaseState::Acquiring,
            "active" => LeaseState::Active,
            "closing" => LeaseState::Closing,
            "released" => LeaseState::Released,
            "poisoned" => LeaseState::Poisoned,
            "destroyed" => LeaseState::Destroyed,
            "unknown" => LeaseState::Unknown,
            other => bail!("unknown lease state {other:?}"),
        })
    }
}

/// What an operation is about to do with a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Run a command (`execute`): takes a busy mark.
    Execute,
    /// Prepare the workspace (`realize-workspace`): takes a busy mark.
    Realize,
    /// Resume a released lease (`resume-lease`): takes a busy mark.
    Resume,
    /// Change what a live lease's sandbox may reach or expose
    /// (`set-egress`, `open-port`): takes a busy mark.
    Configure,
    /// Keep a live lease's sandbox's files as a template
    /// (`capture-template`): takes a busy mark.
    Capture,
    /// Release (`release-lease`): moves the lease to `closing`.
    Release,
    /// Destroy (`destroy-lease`): moves the lease to `closing`, or keeps it
    /// `poisoned`, and owns the close.
    Destroy,
    /// Look at the lease for a sweep: poisons it if its owner died, nothing else.
    Inspect,
}

impl Operation {
    /// The verb for messages ("cannot run a command on lease …").
    fn verb(self) -> &'static str {
        match self {
            Operation::Execute => "run a command on",
            Operation::Realize => "prepare the workspace of",
            Operation::Resume => "resume",
            Operation::Configure => "change the network or ports of",
            Operation::Capture => "capture a template from",
            Operation::Release => "release",
            Operation::Destroy => "destroy",
            Operation::Inspect => "inspect",
        }
    }

    fn allowed(self) -> &'static [LeaseState] {
        use LeaseState::*;
        match self {
            Operation::Execute | Operation::Realize | Operation::Configure | Operation::Capture => {
                &[Active]
            }
            Operation::Resume => &[Active, Released],
            Operation::Release => &[Active],
            Operation::Destroy => &[Active, Released, Poisoned],
            Operation::Inspect => &[
                Acquiring, Active, Closing, Released, Poisoned, Destroyed, Unknown,
            ],
        }
    }
}

/// A host instance that owns a mark, as the store sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// This host instance.
    Me,
    /// Another instance whose heartbeat is fresh.
    Alive(HostSeen),
    /// An instance whose heartbeat expired, or that left no record.
    Gone(Option<HostSeen>),
}

/// What the store knows of another host instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostSeen {
    /// Its instance id.
    pub id: String,
    /// Its process id (for people only: never used to judge liveness).
    pub pid: u32,
    /// The machine's name (for people).
    pub hostname: String,
    /// Milliseconds since its last heartbeat.
    pub silent_ms: i64,
    /// How long it promised to be silent at most.
    pub expiry_ms: i64,
    /// True when its process ran on this machine and is known to have
    /// ended (checked directly, without waiting for the heartbeat).
    pub exited_here: bool,
}

impl HostSeen {
    fn describe(&self) -> String {
        format!(
            "process {} on {}, host instance {},",
            self.pid, self.hostname, self.id
        )
    }
}

/// The part of a stored lease the rules look at.
#[derive(Clone, Debug)]
pub struct LeaseView<'a> {
    /// The host's id of the lease.
    pub id: &'a str,
    /// Its state.
    pub state: LeaseState,
    /// Why it is in that state.
    pub reason: Option<&'a str>,
    /// The owner of the busy mark (commands, workspace, resume, acquire).
    pub busy: Option<Owner>,
    /// The owner of a release or destroy under way.
    pub closing: Option<Owner>,
    /// Whether the provider's sandbox id is on record (an acquire or probe
    /// reports it through `host.record-sandbox` as soon as it exists).
    pub sandbox_recorded: bool,
}

/// What the store must do, in the same transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Poison the lease with this reason first (and clear marks of the
    /// dead host); committed even when the operation is refused.
    pub poison: Option<String>,
    /// Mark `unknown` with this reason (an acquire whose host died).
    pub unknown: Option<String>,
    /// Refuse the operation with this message, after applying the above.
    pub refuse: Option<String>,
    /// On success: the change to apply for this operation.
    pub change: Change,
}

/// The marks an operation that may proceed takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing (inspect, or a refusal).
    None,
    /// Take (or add to) this host's busy mark.
    MarkBusy,
    /// Move to `closing` and own the close.
    Close,
    /// Stay `poisoned` and own the close (destroy of a poisoned lease).
    CloseKeepingPoison,
}

/// Decides what `operation` may do with `lease`. `command` names the CLI
/// command that clears a doubtful lease (for messages).
pub fn decide(operation: Operation, lease: &LeaseView<'_>) -> Decision {
    let mut decision = Decision {
        poison: None,
        unknown: None,
        refuse: None,
        change: Change::None,
    };
    let id = lease.id;
    let mut state = lease.state;
    let mut reason = lease.reason.map(str::to_owned);

    // 1. A mark of a host that died: the lease is in doubt.
    let dead = |owner: &Option<Owner>| match owner {
        Some(Owner::Gone(seen)) => Some(match seen {
            Some(seen) if seen.exited_here => {
                format!("{} has ended (checked on this machine)", seen.describe())
            }
            Some(seen) => format!(
                "{} stopped heartbeating {:.1} s ago",
                seen.describe(),
                seen.silent_ms as f64 / 1000.0
            ),
            None => "a host that left no heartbeat record".to_owned(),
        }),
        _ => None,
    };
    if let Some(who) = dead(&lease.busy) {
        if state == LeaseState::Acquiring && !lease.sandbox_recorded {
            let why = format!(
                "the host running its acquire died ({who}); a sandbox may exist with no id to clean it up with"
            );
            decision.unknown = Some(why.clone());
            state = LeaseState::Unknown;
            reason = Some(why);
        } else if state == LeaseState::Acquiring {
            let why = format!(
                "the host running its acquire or probe died ({who}) after its sandbox was created; \
                 sweep destroys that sandbox"
            );
            decision.poison = Some(why.clone());
            state = LeaseState::Poisoned;
            reason = Some(why);
        } else if !state.is_final() {
            let why = format!(
                "the host that was using it died ({who}); a command may still run in the sandbox"
            );
            decision.poison = Some(why.clone());
            state = LeaseState::Poisoned;
            reason = Some(why);
        }
    }
    if let Some(who) = dead(&lease.closing) {
        if !state.is_final() && decision.poison.is_none() {
            let why = format!(
                "the host releasing or destroying it died ({who}); the sandbox may still run"
            );
            decision.poison = Some(why.clone());
            state = LeaseState::Poisoned;
            reason = Some(why);
        }
    }
    if operation == Operation::Inspect {
        return decision;
    }

    // 2. Another live host is using or closing it.
    let alive = |owner: &Option<Owner>| match owner {
        Some(Owner::Alive(seen)) => Some(seen.clone()),
        _ => None,
    };
    if let Some(seen) = alive(&lease.busy) {
        decision.refuse = Some(format!(
            "cannot {} lease {id}: {} is running an operation on it; wait for it to finish. If that \
             process is gone, the lease is poisoned once its heartbeat is {:.0} s old and \
             `sandbox lease sweep` destroys it",
            operation.verb(),
            seen.describe(),
            seen.expiry_ms as f64 / 1000.0
        ));
        return decision;
    }
    match &lease.closing {
        Some(Owner::Alive(seen)) => {
            decision.refuse = Some(format!(
                "cannot {} lease {id}: {} is releasing or destroying it",
                operation.verb(),
                seen.describe()
            ));
            return decision;
        }
        Some(Owner::Me) => {
            decision.refuse = Some(format!(
                "cannot {} lease {id}: this process is releasing or destroying it",
                operation.verb()
            ));
            return decision;
        }
        _ => {}
    }

    // 3. The state must allow the operation.
    if !operation.allowed().contains(&state) {
        let why = reason.map(|r| format!(" ({r})")).unwrap_or_default();
        let hint = match state {
            LeaseState::Poisoned => format!(
                "; something may still run in it: `sandbox lease destroy {id}` (or `sandbox lease sweep`) destroys it"
            ),
            LeaseState::Closing => "; it is being released or destroyed".to_owned(),
            LeaseState::Released if operation != Operation::Destroy => {
                "; resume it first".to_owned()
            }
            _ => String::new(),
        };
        decision.refuse = Some(format!(
            "cannot {} lease {id}: it is {state}{why}{hint}",
            operation.verb()
        ));
        return decision;
    }

    decision.change = match operation {
        Operation::Execute
        | Operation::Realize
        | Operation::Resume
        | Operation::Configure
        | Operation::Capture => Change::MarkBusy,
        Operation::Release => Change::Close,
        Operation::Destroy if state == LeaseState::Poisoned => Change::CloseKeepingPoison,
        Operation::Destroy => Change::Close,
        Operation::Inspect => Change::None,
    };
    decision
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen() -> HostSeen {
        HostSeen {
            id: "h1".into(),
            pid: 1,
            hostname: "box".into(),
            silent_ms: 20_000,
            expiry_ms: 10_000,
            exited_here: false,
        }
    }

    fn view(state: LeaseState, busy: Option<Owner>, closing: Option<Owner>) -> LeaseView<'static> {
        LeaseView {
            id: "L",
            state,
            reason: None,
            busy,
            closing,
            sandbox_recorded: false,
        }
    }

    #[test]
    fn a_mark_of_a_dead_host_poisons_for_every_operation() {
        for operation in [
            Operation::Execute,
            Operation::Realize,
            Operation::Resume,
            Operation::Configure,
            Operation::Capture,
            Operation::Release,
            Operation::Destroy,
            Operation::Inspect,
        ] {
            let d = decide(
                operation,
                &view(LeaseState::Active, Some(Owner::Gone(Some(seen()))), None),
            );
            assert!(d.poison.is_some(), "{operation:?}");
            match operation {
                Operation::Destroy => {
                    assert_eq!(d.change, Change::CloseKeepingPoison);
                    assert!(d.refuse.is_none());
                }
                Operation::Inspect => assert!(d.refuse.is_none()),
                _ => {
                    let message = d.refuse.expect("refused");
                    assert!(message.contains("sandbox lease destroy L"), "{message}");
                }
            }
        }
    }

    #[test]
    fn a_live_owner_refuses_and_a_closing_lease_refuses_use() {
        let d = decide(
            Operation::Execute,
            &view(LeaseState::Active, Some(Owner::Alive(seen())), None),
        );
        assert!(d.poison.is_none());
        assert!(d.refuse.unwrap().contains("sandbox lease sweep"));
        for operation in [Operation::Execute, Operation::Resume, Operation::Release] {
            let d = decide(operation, &view(LeaseState::Closing, None, Some(Owner::Me)));
            assert!(d.refuse.is_some(), "{operation:?}");
            assert_eq!(d.change, Change::None);
        }
        let d = decide(
            Operation::Execute,
            &view(LeaseState::Active, Some(Owner::Me), None),
        );
        assert_eq!(d.change, Change::MarkBusy);
    }

    #[test]
    fn an_acquire_whose_host_died_becomes_unknown() {
        let d = decide(
            Operation::Inspect,
            &view(LeaseState::Acquiring, Some(Owner::Gone(None)), None),
        );
        assert!(d.unknown.is_some());
        assert!(d.poison.is_none());
    }

    /// Pins the gap of issue 9, item 4: a host that died mid-acquire or
    /// mid-probe after the provider recorded its sandbox id leaves a lease
    /// that sweep destroys (poisoned), not an `unknown` with nothing to
    /// clean up with.
    #[test]
    fn an_acquire_whose_host_died_after_recording_its_sandbox_is_poisoned() {
        let mut lease = view(LeaseState::Acquiring, Some(Owner::Gone(None)), None);
        lease.sandbox_recorded = true;
        let d = decide(Operation::Inspect, &lease);
        assert!(d.unknown.is_none());
        assert!(d.poison.unwrap().contains("sweep destroys"));
    }

    #[test]
    fn transitions_never_leave_poisoned_except_to_destroyed() {
        use LeaseState::*;
        let all = [
            Acquiring, Active, Closing, Released, Poisoned, Destroyed, Unknown,
        ];
        for next in all {
            assert_eq!(
                Poisoned.may_become(next),
                matches!(next, Destroyed | Poisoned)
            );
            assert!(!Destroyed.may_become(next));
            assert!(!Unknown.may_become(next));
        }
        assert!(!Active.may_become(Released), "release goes through closing");
        assert!(
            !Active.may_become(Destroyed),
            "destroy goes through closing"
        );
    }
}
