//! Proving a sandbox gone (issue 40 item 1): what a sandbox delete (both
//! faces), a Daytona stop and a shutdown wait for before they say
//! "destroyed", "stopped" or "none survived".
//!
//! Every command tree of the sandbox was verified gone first (its pids
//! group or PID namespace empty, see [`crate::sandboxes::supervisor`]). What is left
//! is the sandbox's machine ([`crate::machine`]): its two `bwrap`
//! processes and the holder, which used to end on the idle timer about
//! 3 s after the answer. Here it is ended at once and proven gone the way
//! a tree is: a fresh `/proc` scan finds no live process of the sandbox's
//! own ids (the machine's init and `bwrap` included: every process of the
//! sandbox, nested namespaces too, has one of them and nothing else has).
//! A scan that cannot be made (out of descriptors) proves nothing and
//! counts as a failure, never as "nothing left". Then the disk: unmounted
//! and no loop device attached to its image ([`crate::storage::disk::detach_proven`]).
//!
//! The proof is waited for up to [`PROOF_WAIT`]; without it the caller
//! answers 500 with what may still run, keeps the sandbox (status `error`)
//! and its record, and a retry tries again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::machine::Machines;
use crate::storage::disk::DiskStillInUse;
use crate::trees::id_map::IdRange;

/// Why a sandbox is not proven gone: what may still run or still hold its
/// disk. Each says it in words, with what a person can check; the faces
/// answer it as a 500 and keep the sandbox.
#[derive(Debug, thiserror::Error)]
pub enum NotProvenGone {
    /// A sandbox without ids of its own: its machine's init, or a process
    /// of its PID namespace, outlived the SIGKILL.
    #[error(
        "the sandbox's machine (host pid {init_pid}) or a process of it still runs after its \
         SIGKILL; it may still run"
    )]
    MachineSurvived {
        /// The sandbox's root.
        root: PathBuf,
        /// The host pid of its machine's init.
        init_pid: i32,
    },
    /// Processes of the sandbox's own ids outlived its machine.
    #[error(
        "{} process(es) with the sandbox's {ids} still run after its machine was killed \
         (host pids {pids:?}); they may still run",
        .pids.len()
    )]
    ProcessesSurvived {
        /// The sandbox's root.
        root: PathBuf,
        /// The sandbox's host ids.
        ids: IdRange,
        /// The host pids found with them.
        pids: Vec<i32>,
    },
    /// The `/proc` scan could not be made: nothing is proven.
    #[error("the sandbox's processes could not be listed ({source}); they may still run")]
    Unlisted {
        /// The sandbox's root.
        root: PathBuf,
        /// Why the scan failed (out of descriptors, for example).
        source: std::io::Error,
    },
    /// Its processes are gone but its disk is still attached.
    #[error(transparent)]
    Disk(#[from] DiskStillInUse),
    /// The proof itself did not run to its end (its thread was lost).
    #[error("the proof that the sandbox at {} is gone could not be made: {reason}", .root.display())]
    NotMade {
        /// The sandbox's root.
        root: PathBuf,
        /// What stopped it.
        reason: String,
    },
}

/// How long a delete, a stop or a shutdown waits for the proof that a
/// sandbox's processes are gone.
pub const PROOF_WAIT: Duration = Duration::from_secs(5);

/// How long a delete or a shutdown waits for the proof that a sandbox's
/// disk is detached. Longer than [`PROOF_WAIT`]: the unmount itself
/// drops the file system's cached tree, 1.5 to 2.5 s for a sandbox that
/// built 100 000 nested directories on this host, and more with other
/// sandboxes doing the same (`tests/hostile_sandbox.rs`).
pub const DISK_PROOF_WAIT: Duration = crate::storage::disk::PROOF_WAIT;

/// Ends the machine of the sandbox at `root` and proves everything of the
/// sandbox gone, waiting up to `within`. `Ok(true)` when it had a
/// machine; `Err` says what may still run.
///
/// Only the machine is killed (through its own pidfd: provably the
/// sandbox's); what else still has one of the sandbox's ids is waited for, never
/// killed. After the machine's init the kernel ends its whole PID
/// namespace, and the host-side launchers end with their children; a
/// process of those ids that stays may belong to a sandbox of another
/// engine that drew the same range (as [`crate::storage::records::verify`] reasons),
/// so it makes the proof fail rather than being killed.
pub fn end_processes(
    machines: &Machines,
    root: &Path,
    within: Duration,
) -> Result<bool, NotProvenGone> {
    let machine = machines.end_now(root).is_some();
    let deadline = Instant::now() + within;
    let mut pause = crate::util::Backoff::up_to(Duration::from_millis(5));
    // Without ids of its own (a server that is not root) a sandbox's
    // processes share the server's uid: its machine is what proves them
    // gone. Its init exits only once the kernel has ended every process
    // of its PID namespace, nested namespaces included; a fresh scan
    // confirms that none is left in it.
    let Some(ids) = crate::trees::host_processes::sandbox_ids(root) else {
        for ended in machines.take_ended(root) {
            while !ended.is_gone() {
                if Instant::now() >= deadline {
                    return Err(NotProvenGone::MachineSurvived {
                        root: root.to_path_buf(),
                        init_pid: ended.init_pid,
                    });
                }
                std::thread::sleep(pause.next_pause());
            }
        }
        crate::trees::process_limits::remove_sandbox_groups_at(root, None);
        return Ok(machine);
    };
    loop {
        let why = match crate::trees::host_processes::live_of_ids_checked(ids) {
            Ok(left) if left.is_empty() => {
                crate::trees::process_limits::remove_sandbox_groups_at(root, Some(ids.first));
                return Ok(machine);
            }
            Ok(left) => NotProvenGone::ProcessesSurvived {
                root: root.to_path_buf(),
                ids,
                pids: left.iter().map(|p| p.pid).collect(),
            },
            Err(source) => NotProvenGone::Unlisted {
                root: root.to_path_buf(),
                source,
            },
        };
        if Instant::now() >= deadline {
            return Err(why);
        }
        std::thread::sleep(pause.next_pause());
    }
}

/// [`end_processes`] (waiting up to [`PROOF_WAIT`]), then, when `disk`
/// is set, the sandbox's disk detached and proven so
/// ([`crate::storage::disk::detach_proven`], up to [`DISK_PROOF_WAIT`]).
/// `Ok(true)` when the sandbox had a machine.
pub fn end_sandbox(machines: &Machines, root: &Path, disk: bool) -> Result<bool, NotProvenGone> {
    // Read while its disk is mounted: the mount point under it belongs to
    // the server.
    let owner = crate::trees::host_processes::sandbox_uid(root);
    let machine = end_processes(machines, root, PROOF_WAIT)?;
    if disk {
        crate::storage::disk::detach_proven(root, DISK_PROOF_WAIT)?;
        // The sandbox ends here (a delete or a shutdown, not a stop): its
        // range of ids may go to another sandbox.
        if let Some(owner) = owner {
            crate::trees::id_map::release(owner);
        }
    }
    Ok(machine)
}
