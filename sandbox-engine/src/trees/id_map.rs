//! A sandbox's own range of host ids (issue 44 item 1): as root, each
//! sandbox gets [`IDS_PER_SANDBOX`] host uids and gids of its own, mapped
//! to ids `0..65536` of its user namespace, so its root owns every id a
//! machine has: `chown`, `tar -x` of another user's archive, package
//! managers and `useradd` work as in the service's VM.
//!
//! # The ranges
//! Range `n` starts at `FIRST_ID + n * 65536` ([`range_start`]), inside the
//! span systemd documents for container ranges (`0x00080000` to
//! `0x6FFFFFFF`), and far above the ids of real users. The first id of a
//! range is the sandbox's *owner*: bwrap runs as it, its root directory
//! belongs to it, and it is uid 0 inside. No id of one range is ever used
//! by another sandbox or by the host (two engines on one host draw their
//! ranges from a random start, as they drew single uids before).
//!
//! # Writing the map
//! bwrap, running unprivileged as the owner, can map only its own id. So
//! it is started with `--userns-block-fd` and `--info-fd` ([`MapGate`]):
//! once it has made the user namespace it writes its child's pid to the
//! info pipe and waits; the server (root in the initial namespace) writes
//! the child's `uid_map` and `gid_map` (`0 FIRST 65536`), then lets it go
//! on. A map that cannot be written ends the sandbox's start: its bwrap is
//! killed before it runs anything.
//!
//! A server that is not root keeps bwrap's own one-id map (a subordinate
//! range through `newuidmap` is the every-host issue's).

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};

/// Host ids of one sandbox (uids, and as many gids).
pub const IDS_PER_SANDBOX: u32 = 65_536;

/// The first host id of range 0.
const FIRST_ID: u32 = 0x4000_0000;

/// How many ranges there are: up to `0x6FFF_FFFF`, the end of the span
/// systemd leaves to container ranges.
pub const RANGES: u32 = (0x7000_0000 - FIRST_ID) / IDS_PER_SANDBOX;

/// The first host id (the owner) of range `n` (taken modulo [`RANGES`]).
pub fn range_start(n: u32) -> u32 {
    FIRST_ID + (n % RANGES) * IDS_PER_SANDBOX
}

/// Whether `uid` is the first id (the owner) of a sandbox's range.
pub fn is_range_start(uid: u32) -> bool {
    (FIRST_ID..0x7000_0000).contains(&uid) && (uid - FIRST_ID).is_multiple_of(IDS_PER_SANDBOX)
}

/// Whether each sandbox gets a range of host ids of its own here: where
/// the server is root (it writes the sandbox's id maps itself);
/// elsewhere commands run as the server's own uid. The engine asks this,
/// never the uid: a server given subordinate ranges would answer here.
pub fn ranges_here() -> bool {
    rustix::process::geteuid().is_root()
}

/// The uid and gid commands of the sandbox at `root` run as: its owner,
/// when the server runs as root and the root was prepared by
/// [`crate::storage::rootfs::prepare_root`]; `None` (run as the server's own uid) otherwise.
pub fn sandbox_owner(root: &std::path::Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    if !ranges_here() {
        return None;
    }
    let meta = std::fs::metadata(root).ok()?;
    is_range_start(meta.uid()).then_some((meta.uid(), meta.gid()))
}

/// The host ids of one sandbox: `first..first + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    /// The first id (the sandbox's owner, uid 0 inside).
    pub first: u32,
    /// How many ids.
    pub count: u32,
}

impl IdRange {
    /// The range a sandbox owned by `owner` holds: its whole range when
    /// `owner` starts one, else that one id (a record of an older engine).
    pub fn of_owner(owner: u32) -> IdRange {
        let count = if is_range_start(owner) {
            IDS_PER_SANDBOX
        } else {
            1
        };
        IdRange {
            first: owner,
            count,
        }
    }

    /// Whether `id` is one of them.
    pub fn contains(&self, id: u32) -> bool {
        id >= self.first && id - self.first < self.count
    }
}

impl std::fmt::Display for IdRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.count == 1 {
            write!(f, "uid {}", self.first)
        } else {
            write!(f, "uids {}-{}", self.first, self.first + (self.count - 1))
        }
    }
}

/// Where engines on one host claim ranges: a lock file per range, held
/// (`flock`) by the engine whose sandbox uses the range, so two engines
/// never hand out the same ids (a soak makes thousands of sandboxes,
/// cycling through most of the ranges). The kernel drops a dead engine's
/// locks with it.
pub const CLAIMS_DIR: &str = "/run/createos-local/id-ranges";

/// The ranges this process holds, by first id.
fn claims() -> &'static std::sync::Mutex<std::collections::HashMap<u32, std::fs::File>> {
    static CLAIMS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<u32, std::fs::File>>,
    > = std::sync::OnceLock::new();
    CLAIMS.get_or_init(Default::default)
}

/// Claims a range no other sandbox on this host holds, trying range
/// `start`, then the next ones: returns its first id, held until
/// [`release`]. A range another engine (or this one) holds is skipped.
/// `None` when every range is held, or the claims directory cannot be
/// made (then no range is handed out: a sandbox without ids of its own is
/// refused by its caller rather than sharing ids).
pub fn claim(start: u32) -> Option<u32> {
    std::fs::create_dir_all(CLAIMS_DIR).ok()?;
    claim_in(std::path::Path::new(CLAIMS_DIR), start)
}

fn claim_in(dir: &std::path::Path, start: u32) -> Option<u32> {
    use rustix::fs::{flock, FlockOperation};
    for i in 0..RANGES {
        let n = (start.wrapping_add(i)) % RANGES;
        let first = range_start(n);
        let mut held = claims().lock().unwrap_or_else(|p| p.into_inner());
        if held.contains_key(&first) {
            continue;
        }
        let Ok(file) = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(first.to_string()))
        else {
            continue;
        };
        if flock(&file, FlockOperation::NonBlockingLockExclusive).is_ok() {
            held.insert(first, file);
            return Some(first);
        }
    }
    None
}

/// Gives up the range whose first id is `first` (its sandbox is proven
/// gone and its files removed with its disk).
pub fn release(first: u32) {
    claims()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&first);
}

/// The handshake that lets the server write a bwrap sandbox's id map (see
/// the module docs). Made before bwrap is spawned; its [`MapGate::bwrap_args`]
/// go on bwrap's command line and its [`MapGate::child_fds`] must survive
/// into bwrap (cleared of close-on-exec between fork and exec); after the
/// spawn, [`MapGate::open`] writes the map and lets bwrap go on.
pub(crate) struct MapGate {
    range: IdRange,
    /// Read end of `--info-fd` (bwrap writes its child's pid there).
    info: OwnedFd,
    info_child: OwnedFd,
    /// Write end of `--userns-block-fd` (one byte lets bwrap go on).
    block: OwnedFd,
    block_child: OwnedFd,
}

impl MapGate {
    pub(crate) fn new(range: IdRange) -> std::io::Result<MapGate> {
        let flags = rustix::pipe::PipeFlags::CLOEXEC;
        let (info, info_child) = rustix::pipe::pipe_with(flags)?;
        let (block_child, block) = rustix::pipe::pipe_with(flags)?;
        Ok(MapGate {
            range,
            info,
            info_child,
            block,
            block_child,
        })
    }

    /// `--info-fd N --userns-block-fd M`.
    pub(crate) fn bwrap_args(&self) -> [String; 4] {
        [
            "--info-fd".to_string(),
            self.info_child.as_raw_fd().to_string(),
            "--userns-block-fd".to_string(),
            self.block_child.as_raw_fd().to_string(),
        ]
    }

    /// The descriptors bwrap itself must inherit.
    pub(crate) fn child_fds(&self) -> [i32; 2] {
        [self.info_child.as_raw_fd(), self.block_child.as_raw_fd()]
    }

    /// After bwrap was spawned: waits for its child's pid, writes that
    /// child's `uid_map` and `gid_map`, and lets it go on. On an error the
    /// child is killed (it never runs unmapped) and bwrap's own process is
    /// left to the caller.
    pub(crate) fn open(self) -> std::io::Result<()> {
        let MapGate {
            range,
            info,
            info_child,
            block,
            block_child,
        } = self;
        drop(info_child);
        drop(block_child);
        let mut text = String::new();
        // bwrap closes its info descriptor once written (and its child
        // closes its copy at once), so this ends.
        std::fs::File::from(info).read_to_string(&mut text)?;
        let value: serde_json::Value = serde_json::from_str(text.trim()).map_err(|_| {
            std::io::Error::other(format!(
                "bubblewrap did not say which process to map (it printed {:?})",
                text.trim()
            ))
        })?;
        let pid = value["child-pid"]
            .as_i64()
            .and_then(|p| i32::try_from(p).ok())
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| std::io::Error::other("bubblewrap named no child process"))?;
        // Pinned, so that a kill below can only reach that very process.
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?;
        let map = format!("0 {} {}\n", range.first, range.count);
        let written = ["uid_map", "gid_map"].iter().try_for_each(|file| {
            std::fs::write(format!("/proc/{}/{file}", pid.as_raw_nonzero()), &map).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cannot give the sandbox its {range} ({file}): {e}"),
                )
            })
        });
        if let Err(e) = written {
            let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
            return Err(e);
        }
        rustix::io::write(&block, b"1")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_start_on_their_boundaries_and_never_overlap() {
        assert_eq!(range_start(0), 0x4000_0000);
        assert_eq!(range_start(1), 0x4001_0000);
        assert_eq!(range_start(RANGES), range_start(0));
        let last = range_start(RANGES - 1);
        assert!(u64::from(last) + u64::from(IDS_PER_SANDBOX) <= 0x7000_0000);
        for n in [0, 1, 77, RANGES - 1] {
            let first = range_start(n);
            assert!(is_range_start(first));
            assert!(!is_range_start(first + 1));
            let r = IdRange::of_owner(first);
            assert!(r.contains(first) && r.contains(first + 65_535));
            assert!(!r.contains(first + 65_536) && !r.contains(first - 1));
        }
        // An older engine's single sandbox uid is one id.
        let old = IdRange::of_owner(2_000_123);
        assert_eq!(old.count, 1);
        assert!(old.contains(2_000_123) && !old.contains(2_000_124));
    }

    /// A range held by another engine (another open file's lock) is never
    /// handed out; released, it is.
    #[test]
    fn a_range_another_engine_holds_is_skipped() {
        use rustix::fs::{flock, FlockOperation};
        let dir = std::env::temp_dir().join(format!("id-claims-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let start = 4000;
        let theirs = std::fs::File::create(dir.join(range_start(start).to_string())).unwrap();
        flock(&theirs, FlockOperation::NonBlockingLockExclusive).unwrap();
        let mine = claim_in(&dir, start).expect("a free range");
        assert_eq!(
            mine,
            range_start(start + 1),
            "the held range was handed out"
        );
        // Ours is not handed out twice either.
        let next = claim_in(&dir, start).expect("a free range");
        assert_eq!(next, range_start(start + 2));
        drop(theirs);
        release(mine);
        release(next);
        let again = claim_in(&dir, start).expect("a free range");
        assert_eq!(again, range_start(start));
        release(again);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
