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
//! # A server that is not root (issue 37 item 2)
//! It cannot hand out host ids of its own, but the administrator may have
//! given its user subordinate ids (`/etc/subuid`, `/etc/subgid`), which
//! the setuid helpers `newuidmap` and `newgidmap` (Debian package
//! `uidmap`) map for it. Then each sandbox gets a *slice* of them
//! ([`OwnIds::Slices`], [`slice_for`]): uid 0 inside is the server's own
//! uid (so the sandbox's files stay the server's to remove), and ids
//! `1..=N` are the slice, so the sandbox's root `chown`s and `tar -x`
//! keeps an archive's owners for every id up to `N` (4096 ids where the
//! user has the usual 65 536 subordinate ids: 16 sandboxes at once). The
//! same [`MapGate`] holds bwrap while the helpers write its child's maps.
//! A slice is claimed for the sandbox's life (a lock file per slice in a
//! directory of the user's own, held by the engine, so two engines of one
//! user never share one) and skipped while any process of the host still
//! runs as one of its ids (a dead predecessor's sandbox not yet ended).
//! Without subordinate ids, or without the helpers, or once every slice
//! is taken, a sandbox maps only its uid 0, as bwrap does alone: `chown`
//! to another id fails with `EINVAL`; [`describe_here`] says so with the
//! command that fixes it.
//!
//! Files a sandbox gave to its other ids are not the server's: removing a
//! sandbox's root falls back to [`remove_with_every_own_id`], an `rm` in
//! a user namespace that maps all of the user's subordinate ids.

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

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
/// the server is the host's root (it writes the sandbox's id maps
/// itself); elsewhere commands run as the server's own uid (and a slice
/// of its subordinate ids, [`slice_for`]). The engine asks this, never
/// the uid. Uid 0 of a user namespace (a rootless container, or a server
/// under `bwrap --unshare-user --uid 0`) is no host root: it cannot map
/// host ids it does not hold.
pub fn ranges_here() -> bool {
    static HOST_ROOT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HOST_ROOT.get_or_init(|| {
        rustix::process::geteuid().is_root()
            && std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|m| is_initial_uid_map(&m))
    })
}

/// Whether `map` (a `uid_map`) is the initial user namespace's: every id
/// as itself.
fn is_initial_uid_map(map: &str) -> bool {
    let lines: Vec<Vec<&str>> = map
        .lines()
        .map(|l| l.split_whitespace().collect())
        .filter(|f: &Vec<&str>| !f.is_empty())
        .collect();
    lines.len() == 1 && lines[0] == ["0", "0", "4294967295"]
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
    maps: IdMaps,
    /// Read end of `--info-fd` (bwrap writes its child's pid there).
    info: OwnedFd,
    info_child: OwnedFd,
    /// Write end of `--userns-block-fd` (one byte lets bwrap go on).
    block: OwnedFd,
    block_child: OwnedFd,
}

impl MapGate {
    pub(crate) fn new(range: IdRange) -> std::io::Result<MapGate> {
        MapGate::with_maps(IdMaps::range(range))
    }

    /// A gate that writes `maps` (through the helpers where they say so).
    pub(crate) fn with_maps(maps: IdMaps) -> std::io::Result<MapGate> {
        let flags = rustix::pipe::PipeFlags::CLOEXEC;
        let (info, info_child) = rustix::pipe::pipe_with(flags)?;
        let (block_child, block) = rustix::pipe::pipe_with(flags)?;
        Ok(MapGate {
            maps,
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
            maps,
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
        let written = maps.write(pid.as_raw_nonzero().get());
        if let Err(e) = written {
            let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
            return Err(e);
        }
        rustix::io::write(&block, b"1")?;
        Ok(())
    }
}

/// The id maps of one user namespace: lines of `inside outside count`
/// for uids and gids, written by the server itself (root) or by
/// `newuidmap` and `newgidmap` (a server that is not root, which may map
/// only its own id and its subordinate ids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdMaps {
    uids: Vec<(u32, u32, u32)>,
    gids: Vec<(u32, u32, u32)>,
    by_helpers: bool,
}

impl IdMaps {
    /// `0 FIRST COUNT` for both (a root server's range).
    fn range(range: IdRange) -> IdMaps {
        IdMaps {
            uids: vec![(0, range.first, range.count)],
            gids: vec![(0, range.first, range.count)],
            by_helpers: false,
        }
    }

    /// The server's own ids as 0, then `ranges` (uids, gids) from 1 on,
    /// written by the helpers.
    fn own_then(sub: &Subordinate, uids: &[SubRange], gids: &[SubRange]) -> IdMaps {
        let lines = |own: u32, ranges: &[SubRange]| {
            let mut inside = 1;
            let mut lines = vec![(0, own, 1)];
            for (first, count) in ranges {
                lines.push((inside, *first, *count));
                inside += count;
            }
            lines
        };
        IdMaps {
            uids: lines(sub.uid, uids),
            gids: lines(sub.gid, gids),
            by_helpers: true,
        }
    }

    /// Writes both maps of process `pid` (blocked in its new user
    /// namespace).
    fn write(&self, pid: i32) -> std::io::Result<()> {
        for (file, lines, helper) in [
            ("uid_map", &self.uids, "newuidmap"),
            ("gid_map", &self.gids, "newgidmap"),
        ] {
            let what = lines
                .iter()
                .map(|(inside, outside, count)| {
                    if *count == 1 {
                        format!("id {inside} as host id {outside}")
                    } else {
                        format!(
                            "ids {inside}-{} as host ids {outside}-{}",
                            inside + (count - 1),
                            outside + (count - 1)
                        )
                    }
                })
                .collect::<Vec<_>>()
                .join(", ");
            if self.by_helpers {
                let out = std::process::Command::new(helper)
                    .arg(pid.to_string())
                    .args(
                        lines
                            .iter()
                            .flat_map(|(i, o, c)| [*i, *o, *c])
                            .map(|n| n.to_string()),
                    )
                    .env_clear()
                    .stdin(std::process::Stdio::null())
                    .output()
                    .map_err(|e| {
                        std::io::Error::new(
                            e.kind(),
                            format!("cannot run {helper} to give the sandbox its {what}: {e}"),
                        )
                    })?;
                if !out.status.success() {
                    return Err(std::io::Error::other(format!(
                        "{helper} refused to give the sandbox its {what} ({}): {}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr).trim()
                    )));
                }
            } else {
                let map: String = lines
                    .iter()
                    .map(|(i, o, c)| format!("{i} {o} {c}\n"))
                    .collect();
                std::fs::write(format!("/proc/{pid}/{file}"), map).map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("cannot give the sandbox its {what} ({file}): {e}"),
                    )
                })?;
            }
        }
        Ok(())
    }
}

/// One range of `/etc/subuid` or `/etc/subgid`: first id, count.
pub type SubRange = (u32, u32);

/// The subordinate ids the user this server runs as may map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subordinate {
    /// The user's name (as `/etc/passwd` has it, else its uid).
    pub user: String,
    /// Its uid.
    pub uid: u32,
    /// Its gid.
    pub gid: u32,
    /// Its ranges in `/etc/subuid`.
    pub uids: Vec<SubRange>,
    /// Its ranges in `/etc/subgid`.
    pub gids: Vec<SubRange>,
}

/// The ranges of `user` (by name or uid) in a `/etc/subuid`-style text
/// (`NAME:FIRST:COUNT` per line). Ranges that would overflow are left out.
pub fn parse_subordinate(text: &str, user: &str, uid: u32) -> Vec<SubRange> {
    let uid = uid.to_string();
    text.lines()
        .filter_map(|line| {
            let mut fields = line.trim().split(':');
            let (who, first, count) = (fields.next()?, fields.next()?, fields.next()?);
            if who != user && who != uid {
                return None;
            }
            let (first, count) = (first.parse::<u32>().ok()?, count.parse::<u32>().ok()?);
            (count > 0 && first.checked_add(count - 1).is_some()).then_some((first, count))
        })
        .collect()
}

/// How many sandboxes at once a user's subordinate ids should serve: the
/// slice each gets is the total divided by this (at most 65 535 ids).
const SLICES_WANTED: u64 = 16;

/// The ids of one slice for `total` subordinate ids (see the module docs):
/// 4096 of the usual 65 536; never more than 65 535 (with uid 0, a full
/// range) nor fewer than 1024 when there are that many.
pub fn slice_size(total: u64) -> u32 {
    let per = (total / SLICES_WANTED).clamp(total.min(1024), 65_535);
    u32::try_from(per).unwrap_or(65_535)
}

/// Cuts `ranges` into slices of `size` ids (what is left of a range
/// smaller than `size` is not used).
fn cut(ranges: &[SubRange], size: u32) -> Vec<IdRange> {
    let mut slices = Vec::new();
    if size == 0 {
        return slices;
    }
    for (first, count) in ranges {
        for k in 0..count / size {
            slices.push(IdRange {
                first: first + k * size,
                count: size,
            });
        }
    }
    slices
}

/// The ids a server that is not root gives its sandboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnIds {
    /// A slice of the user's subordinate ids per sandbox.
    Slices {
        /// Whose ids.
        sub: Subordinate,
        /// The uid slices, one per sandbox.
        uids: Vec<IdRange>,
        /// The gid slices, paired with the uid slices by index.
        gids: Vec<IdRange>,
    },
    /// Only uid 0 inside (the server's own uid): why, and the fix.
    OnlyRoot {
        /// What is missing.
        why: String,
        /// The command that fixes it.
        fix: String,
    },
}

impl OwnIds {
    /// Decides from the user's entries and whether the helpers exist.
    pub fn decide(
        user: &str,
        uid: u32,
        gid: u32,
        subuid: &str,
        subgid: &str,
        helpers: bool,
    ) -> OwnIds {
        let uids = parse_subordinate(subuid, user, uid);
        let gids = parse_subordinate(subgid, user, uid);
        let fix_ids = format!(
            "usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user} \
             (as root, with a range no other user has)"
        );
        if uids.is_empty() || gids.is_empty() {
            return OwnIds::OnlyRoot {
                why: format!("{user} has no subordinate ids in /etc/subuid and /etc/subgid"),
                fix: fix_ids,
            };
        }
        if !helpers {
            return OwnIds::OnlyRoot {
                why: "newuidmap and newgidmap are not installed".to_string(),
                fix: "apt-get install uidmap (Fedora: dnf install shadow-utils)".to_string(),
            };
        }
        let total = |r: &[SubRange]| r.iter().map(|(_, c)| u64::from(*c)).sum::<u64>();
        let size = slice_size(total(&uids).min(total(&gids)));
        let (mut us, mut gs) = (cut(&uids, size), cut(&gids, size));
        let n = us.len().min(gs.len());
        us.truncate(n);
        gs.truncate(n);
        OwnIds::Slices {
            sub: Subordinate {
                user: user.to_string(),
                uid,
                gid,
                uids,
                gids,
            },
            uids: us,
            gids: gs,
        }
    }
}

/// The name of the user `uid` in `/etc/passwd` (else the uid in digits).
fn user_name(uid: u32) -> String {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .find_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            (f.nth(1)?.parse::<u32>().ok()? == uid).then(|| name.to_string())
        })
        .unwrap_or_else(|| uid.to_string())
}

/// What a server that is not root gives its sandboxes here (read once);
/// `None` for a root server (it has ranges of its own, [`ranges_here`]).
pub fn own_ids_here() -> Option<&'static OwnIds> {
    static OWN: std::sync::OnceLock<Option<OwnIds>> = std::sync::OnceLock::new();
    OWN.get_or_init(|| {
        if ranges_here() {
            return None;
        }
        let uid = rustix::process::getuid().as_raw();
        let gid = rustix::process::getgid().as_raw();
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let helpers = ["newuidmap", "newgidmap"]
            .iter()
            .all(|h| crate::util::find_in_path(h).is_some());
        Some(OwnIds::decide(
            &user_name(uid),
            uid,
            gid,
            &read("/etc/subuid"),
            &read("/etc/subgid"),
            helpers,
        ))
    })
    .as_ref()
}

/// The ids a sandbox's root owns here, in words, for the engine's startup
/// line, `sandbox describe` and `doctor`: where something is missing, what
/// and the command that fixes it.
pub fn describe_here() -> String {
    match own_ids_here() {
        None => format!(
            "ids 0-{} of each sandbox its own (a range of host ids per sandbox)",
            IDS_PER_SANDBOX - 1
        ),
        Some(OwnIds::Slices { sub, uids, .. }) => format!(
            "ids 0-{} of each sandbox its own (uid 0 is {}, the rest a slice of its \
             subordinate ids; {} sandboxes at once, later ones only uid 0)",
            uids.first().map_or(0, |r| r.count),
            sub.user,
            uids.len()
        ),
        Some(OwnIds::OnlyRoot { why, fix }) => {
            format!("only uid 0 in a sandbox ({why}: chown to another id fails inside; fix: {fix})")
        }
    }
}

/// One sandbox's slice of its server's subordinate ids (a server that is
/// not root, see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    /// Host uids of ids `1..` inside.
    pub uids: IdRange,
    /// Host gids of ids `1..` inside.
    pub gids: IdRange,
}

/// Slices held by this process, by the identity of their sandbox's root
/// directory ([`root_identity`]: it survives the rename a delete makes
/// before removing the files), with their lock files.
type HeldSlices = std::sync::Mutex<std::collections::HashMap<(u64, u64), (Slice, std::fs::File)>>;

/// `(st_dev, st_ino)` of the directory `root`: what names a sandbox's
/// slice ([`slice_for`], [`release_slice`]).
pub fn root_identity(root: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(root)
        .ok()
        .filter(|m| m.is_dir())
        .map(|m| (m.dev(), m.ino()))
}

fn slices_held() -> &'static HeldSlices {
    static HELD: std::sync::OnceLock<HeldSlices> = std::sync::OnceLock::new();
    HELD.get_or_init(Default::default)
}

/// The directory of this user's slice claims: `$XDG_RUNTIME_DIR/createos-local`
/// or `/tmp/createos-local-<uid>`, made `0700`; refused when it is not the
/// user's own, private directory.
fn user_claims_dir() -> Option<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let uid = rustix::process::getuid().as_raw();
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute() && d.is_dir())
        .map(|d| d.join("createos-local"))
        .unwrap_or_else(|| PathBuf::from(format!("/tmp/createos-local-{uid}")));
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    let meta = std::fs::symlink_metadata(&dir).ok()?;
    (meta.is_dir() && meta.uid() == uid && meta.mode() & 0o077 == 0).then_some(dir)
}

/// Whether any live process of the host runs as one of `ids` (uids).
fn ids_in_use(ids: IdRange) -> bool {
    crate::trees::procfs::all_pids().into_iter().any(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| l.strip_prefix("Uid:")).map(|v| {
                    v.split_whitespace()
                        .any(|u| u.parse().is_ok_and(|u| ids.contains(u)))
                })
            })
            .unwrap_or(false)
    })
}

/// The slice of the sandbox at `root`: the one it holds, else one claimed
/// now for its life (until [`release_slice`]). `None` for a root server,
/// where the user has no subordinate ids (or no helpers), or when every
/// slice is held.
pub fn slice_for(root: &Path) -> Option<Slice> {
    use rustix::fs::{flock, FlockOperation};
    let Some(OwnIds::Slices { uids, gids, .. }) = own_ids_here() else {
        return None;
    };
    let key = root_identity(root)?;
    let mut held = slices_held().lock().unwrap_or_else(|p| p.into_inner());
    if let Some((slice, _)) = held.get(&key) {
        return Some(*slice);
    }
    let dir = user_claims_dir()?;
    // From a random start, so that engines rarely try the same slice.
    let start = usize::from_str_radix(&crate::util::random_hex(4), 16).unwrap_or(0);
    for i in 0..uids.len() {
        let n = (start + i) % uids.len();
        let slice = Slice {
            uids: uids[n],
            gids: gids[n],
        };
        if held.values().any(|(s, _)| *s == slice) {
            continue;
        }
        let Ok(file) = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("slice-{}", slice.uids.first)))
        else {
            continue;
        };
        if flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
            continue;
        }
        if ids_in_use(slice.uids) {
            continue;
        }
        held.insert(key, (slice, file));
        return Some(slice);
    }
    None
}

/// Gives up the slice of the sandbox whose root directory was `identity`
/// ([`root_identity`], read before the root was removed): its machine is
/// proven gone and its files are removed.
pub fn release_slice(identity: (u64, u64)) {
    slices_held()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&identity);
}

/// The gate that maps the ids of the machine of the sandbox at `root`:
/// its range as root, its slice otherwise; `None` where bwrap maps its
/// one id itself.
pub(crate) fn gate_for(root: &Path) -> std::io::Result<Option<MapGate>> {
    if let Some((uid, _)) = sandbox_owner(root) {
        return MapGate::new(IdRange::of_owner(uid)).map(Some);
    }
    let (Some(slice), Some(OwnIds::Slices { sub, .. })) = (slice_for(root), own_ids_here()) else {
        return Ok(None);
    };
    let maps = IdMaps::own_then(
        sub,
        &[(slice.uids.first, slice.uids.count)],
        &[(slice.gids.first, slice.gids.count)],
    );
    MapGate::with_maps(maps).map(Some)
}

/// Removes `path` as uid 0 of a user namespace that maps the server's
/// own id and every subordinate id of its user: files a sandbox gave to
/// the ids of its slice are no longer the server's alone. Runs
/// `bwrap ... rm -rf --one-file-system -- PATH` with every capability in
/// that namespace (only over files of those ids). `Err` when the user has
/// no subordinate ids or `rm` failed.
pub fn remove_with_every_own_id(bwrap: &Path, path: &Path) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    let Some(OwnIds::Slices { sub, .. }) = own_ids_here() else {
        return Err(std::io::Error::other("no subordinate ids to remove with"));
    };
    let gate = MapGate::with_maps(IdMaps::own_then(sub, &sub.uids, &sub.gids))?;
    let fds = gate.child_fds();
    let mut cmd = std::process::Command::new(bwrap);
    cmd.args([
        "--unshare-user",
        "--uid",
        "0",
        "--gid",
        "0",
        "--cap-add",
        "ALL",
        "--bind",
        "/",
        "/",
    ])
    .args(gate.bwrap_args())
    .args(["--", "/bin/rm", "-rf", "--one-file-system", "--"])
    .arg(path)
    .current_dir("/")
    .env_clear()
    .env("PATH", "/usr/bin:/bin")
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    // SAFETY: fcntl only, on descriptors this process owns.
    unsafe {
        cmd.pre_exec(move || {
            for raw in fds {
                let fd = std::os::fd::BorrowedFd::borrow_raw(raw);
                rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    if let Err(e) = gate.open() {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "rm with the user's subordinate ids ended with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
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

    #[test]
    fn only_the_initial_user_namespace_is_host_root() {
        assert!(is_initial_uid_map("         0          0 4294967295\n"));
        assert!(!is_initial_uid_map("         0       1002          1\n"));
        assert!(!is_initial_uid_map("0 0 1\n1 165536 65536\n"));
    }

    /// Issue 37 item 2: a user's subordinate ids are cut into slices that
    /// never overlap; a user without any (or without the helpers) is told
    /// what is missing and the command that fixes it.
    #[test]
    fn subordinate_ids_are_cut_into_disjoint_slices_or_the_fix_is_named() {
        let subuid = "sbuser:100000:65536\nsandbox-ci:165536:65536\n1003:300000:131072\n";
        assert_eq!(
            parse_subordinate(subuid, "sandbox-ci", 1002),
            vec![(165_536, 65_536)]
        );
        assert_eq!(
            parse_subordinate(subuid, "other", 1003),
            vec![(300_000, 131_072)]
        );
        assert!(parse_subordinate("x:4294967295:2\n", "x", 1).is_empty());
        assert_eq!(slice_size(65_536), 4096);
        assert_eq!(slice_size(16 * 65_536 + 16), 65_535);
        assert_eq!(slice_size(500), 500);
        let OwnIds::Slices { uids, gids, .. } =
            OwnIds::decide("sandbox-ci", 1002, 1002, subuid, subuid, true)
        else {
            panic!("slices expected");
        };
        assert_eq!(uids.len(), 16);
        assert_eq!(gids, uids);
        for (i, a) in uids.iter().enumerate() {
            assert!(a.first >= 165_536 && a.first + a.count <= 165_536 + 65_536);
            for b in &uids[i + 1..] {
                assert!(a.first + a.count <= b.first || b.first + b.count <= a.first);
            }
        }
        match OwnIds::decide("nobody-here", 1010, 1010, subuid, subuid, true) {
            OwnIds::OnlyRoot { why, fix } => {
                assert!(why.contains("no subordinate ids"), "{why}");
                assert!(
                    fix.starts_with("usermod --add-subuids") && fix.contains("nobody-here"),
                    "{fix}"
                );
            }
            other => panic!("{other:?}"),
        }
        match OwnIds::decide("sandbox-ci", 1002, 1002, subuid, subuid, false) {
            OwnIds::OnlyRoot { fix, .. } => assert!(fix.contains("uidmap"), "{fix}"),
            other => panic!("{other:?}"),
        }
        let maps = IdMaps::own_then(
            &Subordinate {
                user: "u".into(),
                uid: 1002,
                gid: 1003,
                uids: vec![],
                gids: vec![],
            },
            &[(165_536, 4096)],
            &[(165_536, 4096)],
        );
        assert_eq!(maps.uids, vec![(0, 1002, 1), (1, 165_536, 4096)]);
        assert_eq!(maps.gids, vec![(0, 1003, 1), (1, 165_536, 4096)]);
    }
}
