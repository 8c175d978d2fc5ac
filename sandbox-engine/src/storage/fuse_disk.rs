//! A sandbox disk mounted by a server that is not root (issue 37 item 6):
//! the same ext4 image as root's, served by `fuse2fs` (Debian package
//! `fuse2fs`), a daemon of this server, and mounted through `fusermount`
//! (package `fuse`), which lets an ordinary user mount FUSE file systems.
//!
//! # Options and ownership
//! The daemon runs `-o fakeroot,allow_other,default_permissions`:
//! - `allow_other`: without it the kernel lets only processes whose ids
//!   all equal the server's reach the mount, so a sandbox command that
//!   switches to one of the sandbox's subordinate ids (a database's own
//!   user) and root on the host would get `EACCES` on the whole root.
//!   `fusermount` accepts it only where `/etc/fuse.conf` says
//!   `user_allow_other`; where it does not, the server gives sandboxes no
//!   disk of its own and says so with the fix ([`unusable`]).
//! - `default_permissions`: the kernel checks each access against the
//!   modes and owners the image stores, with the caller's capabilities
//!   in its own user namespace (the sandbox's uid 0 keeps its
//!   `CAP_CHOWN`/`CAP_DAC_OVERRIDE` over the files of its ids).
//! - `fakeroot`: fuse2fs itself trusts the kernel's check (it would
//!   otherwise refuse every `chown` of a caller that is not host uid 0).
//!
//! The image is made with `-E root_owner` (the server's uid and gid), so
//! the root belongs to the sandbox's uid 0 inside. A file the sandbox gives
//! to uid 1001 is stored with the host id the machine maps 1001 to (one of
//! the user's subordinate ids), as on a loop-mounted disk.
//!
//! # The daemon's end
//! Each daemon is a child of this server, in a session of its own, with
//! none of the server's descriptors. Detaching a disk unmounts it lazily
//! (`fusermount -u -z`); the daemon exits by itself once nothing uses the
//! file system any more. What may still use it then is no sandbox process
//! (those are proven gone first) but a copy of the host's mounts: any
//! process on the host that makes a mount namespace of its own copies
//! every mount there, this disk included, and keeps it while it lives
//! (seen in CI: another run's engine under `bwrap --dev-bind / /`). So a
//! daemon still running [`GRACE`] after the unmount is killed (SIGKILL:
//! it is our unreaped child, so its pid names no other process). With
//! it gone, nothing can write to the image any more: such copies answer
//! `ENOTCONN`. The disk counts as detached only when the mount is gone
//! from the server's mount namespace *and* the daemon has been reaped
//! ([`remains`]). A server killed without a shutdown leaves that to the
//! death guard ([`crate::trees::deathguard::end_fuse_on_death`]): a lazy
//! unmount, SIGKILL to the daemon (only if its pid still names the process
//! started then), the image removed.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The environment variable naming the `fuse2fs` program to use (else it
/// is looked up in `PATH` and the usual system directories).
pub const FUSE2FS_ENV: &str = "CREATEOS_LOCAL_FUSE2FS";

/// How long a daemon may take to show its mount (it replays nothing: an
/// image without a journal mounts in a few milliseconds).
const MOUNT_WAIT: Duration = Duration::from_secs(10);

/// How long a daemon may take to exit by itself after its disk was
/// unmounted (it writes back what it holds), before it is killed.
pub const GRACE: Duration = Duration::from_millis(500);

/// The daemon serving each mounted disk, by mount point.
fn daemons() -> &'static Mutex<HashMap<PathBuf, Daemon>> {
    // Process-wide: this process's fuse2fs children, by mount point in its one mount
    // namespace; whoever detaches a disk (a successor in this process too) reaps its daemon.
    static DAEMONS: OnceLock<Mutex<HashMap<PathBuf, Daemon>>> = OnceLock::new();
    DAEMONS.get_or_init(Default::default)
}

struct Daemon {
    child: Child,
    /// Its start time (`/proc/PID/stat`), as the death guard was told.
    starttime: u64,
    image: PathBuf,
    /// When its disk was unmounted (lazily), if it was.
    unmounted_at: Option<Instant>,
}

fn tool(name: &str) -> Option<PathBuf> {
    crate::util::find_in_path(name).or_else(|| {
        ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
            .iter()
            .map(|d| Path::new(d).join(name))
            .find(|p| p.is_file())
    })
}

fn fuse2fs() -> Option<PathBuf> {
    match std::env::var_os(FUSE2FS_ENV) {
        Some(p) => Some(PathBuf::from(p)).filter(|p| p.is_file()),
        None => tool("fuse2fs"),
    }
}

/// Whether `helper` is setuid but not owned by root as this process sees
/// it: a file of the host's root seen from a user namespace that does not
/// map it is owned by the overflow uid (65534), and the kernel runs it
/// without its setuid bit. (A helper that is not setuid at all is left to
/// the mount's own probe.)
fn setuid_root_lost(helper: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(helper).is_ok_and(|m| m.mode() & 0o4000 != 0 && m.uid() != 0)
}

/// Why this server (not root) cannot give sandboxes a fuse2fs disk here,
/// with the command that fixes it; `None` when it can.
pub fn unusable() -> Option<String> {
    if fuse2fs().is_none() {
        return Some(
            "fuse2fs is not installed; fix: apt-get install fuse2fs fuse (as root)".to_string(),
        );
    }
    if tool("fusermount").is_none() {
        return Some(
            "fusermount is not installed (fuse2fs mounts through it); fix: apt-get install fuse \
             (as root)"
                .to_string(),
        );
    }
    if let Some(fusermount) = tool("fusermount").filter(|f| setuid_root_lost(f)) {
        return Some(format!(
            "fusermount cannot mount here: {} is not owned by root as this server sees it (a \
             user namespace that does not map the host's root, as in a rootless container), so \
             its setuid root does not apply; fix: run the engine on the host, as root (a loop \
             device per sandbox) or as an ordinary user (fuse2fs)",
            fusermount.display()
        ));
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Some(format!(
            "/dev/fuse cannot be opened by this user ({e}); fix: modprobe fuse and chmod 0666 \
             /dev/fuse (as root)"
        ));
    }
    let conf = std::fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
    if !conf.lines().any(|l| l.trim() == "user_allow_other") {
        return Some(
            "/etc/fuse.conf does not allow user_allow_other (without it only this user's own \
             uid could reach a sandbox's disk); fix: echo user_allow_other >> /etc/fuse.conf (as \
             root)"
                .to_string(),
        );
    }
    None
}

/// Mounts the ext4 image `image` on `at` with a fuse2fs daemon of this
/// server, and waits until the mount shows in `/proc/self/mountinfo`.
pub fn mount(image: &Path, at: &Path, read_only: bool) -> std::io::Result<()> {
    let program = fuse2fs().ok_or_else(|| std::io::Error::other("fuse2fs not found"))?;
    let mut options = "fakeroot,allow_other,default_permissions,nosuid,nodev,noatime".to_string();
    if read_only {
        options.push_str(",ro");
    }
    let mut cmd = Command::new(program);
    cmd.arg(image)
        .arg(at)
        .args(["-f", "-o", &options])
        .env_clear()
        .env("PATH", "/usr/bin:/bin:/usr/sbin:/sbin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setsid and marking descriptors close-on-exec only
    // (async-signal-safe): the daemon gets no signal meant for the
    // server's process group and keeps none of its descriptors.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::setsid()?;
            crate::trees::fds::mark_cloexec_from(3);
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let pid = child.id() as i32;
    let starttime = crate::trees::procfs::stat(pid).map_or(0, |s| s.starttime);
    crate::trees::deathguard::end_fuse_on_death(pid, starttime, at, image);
    let deadline = Instant::now() + MOUNT_WAIT;
    loop {
        if mounted(at)? {
            break;
        }
        if let Some(status) = child.try_wait()? {
            crate::trees::deathguard::forget_fuse(pid, starttime, at, image);
            let mut said = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut said);
            }
            return Err(std::io::Error::other(format!(
                "fuse2fs of {} ended ({status}): {}",
                image.display(),
                said.trim()
            )));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let _ = fusermount_lazy(at);
            crate::trees::deathguard::forget_fuse(pid, starttime, at, image);
            return Err(std::io::Error::other(format!(
                "fuse2fs of {} did not mount it within {} s",
                image.display(),
                MOUNT_WAIT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // What the daemon says later goes nowhere, but is read so that it
    // never blocks on a full pipe.
    if let Some(mut e) = child.stderr.take() {
        let _ = std::thread::Builder::new()
            .name("createos-local-fuse2fs".into())
            .spawn(move || {
                let _ = std::io::copy(&mut e, &mut std::io::sink());
            });
    }
    daemons().lock().unwrap_or_else(|p| p.into_inner()).insert(
        at.to_path_buf(),
        Daemon {
            child,
            starttime,
            image: image.to_path_buf(),
            unmounted_at: None,
        },
    );
    Ok(())
}

/// Whether a daemon of this server serves (or served, not yet reaped) a
/// disk on `at`.
pub fn serves(at: &Path) -> bool {
    daemons()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains_key(at)
}

/// Unmounts the disk on `at` lazily (`fusermount -u -z`), and kills its
/// daemon if it still runs [`GRACE`] after that (see the module docs).
pub fn unmount(at: &Path) -> std::io::Result<()> {
    if mounted(at)? {
        fusermount_lazy(at)?;
    }
    let mut daemons = daemons().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(daemon) = daemons.get_mut(at) {
        let since = *daemon.unmounted_at.get_or_insert_with(Instant::now);
        if since.elapsed() >= GRACE && matches!(daemon.child.try_wait(), Ok(None)) {
            daemon.child.kill()?;
        }
    }
    Ok(())
}

fn fusermount_lazy(at: &Path) -> std::io::Result<()> {
    let program = tool("fusermount").ok_or_else(|| std::io::Error::other("no fusermount"))?;
    let out = Command::new(program)
        .args(["-u", "-z"])
        .arg(at)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(std::io::Error::other(format!(
        "fusermount -u -z {} failed ({}): {}",
        at.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// What is left of the fuse2fs disk on `at`: its daemon while it has not
/// exited (it is reaped here once it has). Empty when there was none.
pub fn remains(at: &Path) -> Vec<String> {
    let mut daemons = daemons().lock().unwrap_or_else(|p| p.into_inner());
    let Some(daemon) = daemons.get_mut(at) else {
        return Vec::new();
    };
    let pid = daemon.child.id() as i32;
    match daemon.child.try_wait() {
        Ok(None) => vec![format!("its fuse2fs daemon {pid} still runs")],
        // Exited and reaped (or it cannot be waited for: not ours any
        // more), so its pid names nothing of ours.
        Ok(Some(_)) | Err(_) => {
            let daemon = daemons.remove(at).expect("present");
            crate::trees::deathguard::forget_fuse(pid, daemon.starttime, at, &daemon.image);
            Vec::new()
        }
    }
}

/// Unmounts the disk on `at` and waits up to `within` for its daemon to
/// exit; `Err` says what is left.
pub fn detach_within(at: &Path, within: Duration) -> Result<(), FuseDiskStillInUse> {
    let deadline = Instant::now() + within;
    loop {
        let unmounted = unmount(at);
        let left = remains(at);
        if left.is_empty() && !mounted(at).unwrap_or(true) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(FuseDiskStillInUse {
                at: at.to_path_buf(),
                left,
                unmount: unmounted.err(),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A fuse2fs disk not detached within the time given: what is left of it.
#[derive(Debug, thiserror::Error)]
#[error(
    "the disk on {} is still in use: {}{}",
    .at.display(),
    .left.join(", "),
    .unmount.as_ref().map(|e| format!(" ({e})")).unwrap_or_default()
)]
pub struct FuseDiskStillInUse {
    /// Where the disk is mounted.
    pub at: PathBuf,
    /// What holds it, in words ("its fuse2fs daemon PID still runs").
    pub left: Vec<String>,
    /// The unmount's own failure, if it failed.
    pub unmount: Option<std::io::Error>,
}

/// Whether something is mounted on `at` in this mount namespace.
fn mounted(at: &Path) -> std::io::Result<bool> {
    let escaped = crate::util::mountinfo_escaped(at);
    Ok(std::fs::read_to_string("/proc/self/mountinfo")?
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(escaped.as_str())))
}
