//! Nothing outlives the server, even when it is killed with SIGKILL.
//!
//! A server that dies without an orderly shutdown cannot terminate its
//! process trees itself. So the first process tree started by this OS
//! process also starts one *guard*: a small `bash` loop, in a session of
//! its own, whose stdin is a pipe that only this process holds open (the
//! write end is close-on-exec, so no child keeps it). Every tree is
//! announced to the guard when it starts and withdrawn once verified gone.
//! When this process ends, however it ends, the kernel closes the pipe; the
//! guard reads end-of-file and sends SIGKILL to what is still announced:
//!
//! - a bwrap tree is named by the host pid of its namespace's init and the
//!   namespace inode; the guard kills that pid only if `/proc/PID/ns/pid`
//!   still names that namespace (so a reused pid is never hit), and the
//!   kernel then kills every process of the namespace;
//! - a process-group tree (no isolation) is named by its leader, which is
//!   also its process group; the guard kills the group unless the leader's
//!   pid now belongs to another process (different start time; a pid is
//!   not reused while it names a live process group). Members that left
//!   the group (`setsid`, `setpgid`) are not found: that mode is no
//!   isolation.
//!
//! - a machine still starting (see [`crate::machine`]) is named by its
//!   sandbox root: every process whose command line binds that root as
//!   `/` is killed. That is bwrap before it runs the machine's init: its
//!   inner process is made before it asks to die with the outer one, so a
//!   server killed in between would leave it running, known to no one;
//!   once the init runs, the kernel ends the machine with the server.
//!
//! - a directory (the sandboxes' in-memory `/etc` copy under `/dev/shm`,
//!   see [`crate::storage::rootfs::prepare_etc`]) is removed, so that a killed
//!   server does not leave it in memory; only paths with the copy's name
//!   prefix are ever removed.
//!
//! - a sandbox disk (see [`crate::storage::disk`]) is unmounted, every loop
//!   device backed by its image detached (it is announced before its loop
//!   device is attached, so a server killed between the two leaves none)
//!   and its image removed, so that a killed server does not leave loop
//!   devices behind;
//!   the template the disks are copied from is removed; a disk a server
//!   that is not root mounted with fuse2fs (see
//!   [`crate::storage::fuse_disk`]) is unmounted lazily with `fusermount`,
//!   its daemon killed (only if its pid still has the start time it had)
//!   and its image removed.
//!
//! Why not bwrap's `--die-with-parent` for every tree: a one-shot
//! command's outer bwrap exits when the command exits, and
//! `--die-with-parent` then kills the namespace at once, ending background
//! processes the command left running, which the API keeps alive until
//! they are deleted (`leader_exited` vs `tree_exited`). A sandbox
//! machine's outer bwrap exits only with the machine, so machines do use
//! it, started from a thread that lasts as long as the process
//! ([`crate::machine::lasting_spawner`]): that also covers a machine
//! forked before the guard heard of it.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// Where the guard finds `umount`, `losetup` and `fusermount`.
const GUARD_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// The guard's program: remember announced trees; on end-of-file kill them.
const GUARD_SCRIPT: &str = r#"
declare -A live
while IFS=' ' read -r op kind pid id; do
  case $op in
    +) live["$kind $pid"]=$id ;;
    -) unset "live[$kind $pid]" ;;
  esac
done
for key in "${!live[@]}"; do
  kind=${key% *}; pid=${key#* }; id=${live[$key]}
  case $kind in
    ns) [ "$(readlink "/proc/$pid/ns/pid" 2>/dev/null)" = "pid:[$id]" ] && kill -KILL "$pid" ;;
    pg) if read -r stat < "/proc/$pid/stat"; then
          set -- ${stat##*) }
          [ "${20}" = "$id" ] || continue
        fi
        kill -KILL -- "-$pid" ;;
    bw) for proc in /proc/[0-9]*; do
          line=$(tr '\0' ' ' < "$proc/cmdline")
          case $line in *" --bind $id / "*) kill -KILL "${proc#/proc/}" ;; esac
        done ;;
    rm) case $pid in /dev/shm/createos-local-etc-*) rm -rf -- "$pid" ;; esac ;;
    um) case $id in */.disks/*.img) ;; *) continue ;; esac
        umount -l -- "$pid"
        for dev in $(losetup -n -O NAME -j "$id"); do losetup -d "$dev"; done
        rm -f -- "$id" ;;
    fu) read -r start root image <<<"$id"
        case $image in */.disks/*.img|*/.disks/template.ext4) ;; *) continue ;; esac
        fusermount -u -z "$root"
        if read -r stat < "/proc/$pid/stat"; then
          set -- ${stat##*) }
          [ "${20}" = "$start" ] && kill -KILL "$pid"
        fi
        case $image in *.img) rm -f -- "$image" ;; esac ;;
    rf) case $pid in */.disks/template.ext4|/dev/shm/createos-local-disk-*.ext4) rm -f -- "$pid" ;; esac ;;
  esac
done 2>/dev/null
"#;

/// One tree the guard must kill if the server dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guarded {
    /// A PID namespace: host pid of its init and the namespace inode.
    Namespace {
        /// Host pid of the namespace's init.
        init_pid: i32,
        /// `/proc/PID/ns/pid` inode.
        ns: u64,
    },
    /// A process group led by `leader`, started at `starttime` (clock ticks).
    Group {
        /// Leader pid (= process group id).
        leader: i32,
        /// Leader start time from `/proc/PID/stat`.
        starttime: u64,
    },
}

impl Guarded {
    fn line(&self, op: char) -> String {
        match self {
            Self::Namespace { init_pid, ns } => format!("{op} ns {init_pid} {ns}\n"),
            Self::Group { leader, starttime } => format!("{op} pg {leader} {starttime}\n"),
        }
    }
}

fn guard_pipe() -> &'static Mutex<Option<std::fs::File>> {
    static GUARD: OnceLock<Mutex<Option<std::fs::File>>> = OnceLock::new();
    GUARD.get_or_init(|| Mutex::new(start_guard().ok()))
}

fn start_guard() -> std::io::Result<std::fs::File> {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let mut cmd = Command::new("/bin/bash");
    cmd.args(["-c", GUARD_SCRIPT, "createos-local-guard"])
        .env_clear()
        .env("PATH", GUARD_PATH)
        .stdin(Stdio::from(read))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid and close_range only (async-signal-safe): the guard
    // must not receive the terminal's or the server's process-group
    // signals, nor keep any descriptor of the server.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::setsid()?;
            crate::trees::fds::mark_cloexec_from(3);
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    // The guard is never waited for while the server lives; reap it in the
    // background so that it does not stay a zombie after a shutdown.
    std::thread::Builder::new()
        .name("createos-local-guard".into())
        .spawn(move || {
            let _ = child.wait();
        })?;
    Ok(std::fs::File::from(write))
}

fn send(line: &str) -> bool {
    let mut pipe = guard_pipe().lock().unwrap_or_else(|p| p.into_inner());
    match pipe.as_mut() {
        Some(f) => f.write_all(line.as_bytes()).is_ok(),
        None => false,
    }
}

/// Announces a tree to the guard. `false` when there is no guard (it could
/// not be started): the tree then dies only with an orderly shutdown.
pub fn watch(tree: Guarded) -> bool {
    send(&tree.line('+'))
}

/// Asks the guard to remove the directory `path` if this process dies
/// without removing it itself (only a `/dev/shm/createos-local-etc-*`
/// path without white space is accepted; `false` otherwise, or when there
/// is no guard).
pub fn remove_on_death(path: &std::path::Path) -> bool {
    match removable(path) {
        Some(p) => send(&format!("+ rm {p} 0\n")),
        None => false,
    }
}

/// Withdraws [`remove_on_death`] (the directory was removed).
pub fn forget_removal(path: &std::path::Path) {
    if let Some(p) = removable(path) {
        send(&format!("- rm {p} 0\n"));
    }
}

fn removable(path: &std::path::Path) -> Option<&str> {
    let p = path.to_str()?;
    (p.starts_with("/dev/shm/createos-local-etc-")
        && !p.contains(char::is_whitespace)
        && !p.contains(".."))
    .then_some(p)
}

fn disk_line(op: char, root: &std::path::Path, image: &std::path::Path) -> Option<String> {
    let (r, i) = (root.to_str()?, image.to_str()?);
    let plain = |p: &str| !p.contains(char::is_whitespace) && !p.contains("..");
    (plain(r) && plain(i) && i.contains("/.disks/") && i.ends_with(".img"))
        .then(|| format!("{op} um {r} {i}\n"))
}

/// Asks the guard to unmount the sandbox disk mounted on `root`, detach
/// the loop devices backed by its `image` and remove it if this process
/// dies first (`false` for paths with white space, or without a guard).
/// Asked before the disk is attached: what the guard finds not mounted or
/// not attached it skips.
pub fn unmount_on_death(root: &std::path::Path, image: &std::path::Path) -> bool {
    disk_line('+', root, image).is_some_and(|l| send(&l))
}

/// Withdraws [`unmount_on_death`] (the disk was detached).
pub fn forget_unmount(root: &std::path::Path, image: &std::path::Path) {
    if let Some(l) = disk_line('-', root, image) {
        send(&l);
    }
}

fn fuse_line(
    op: char,
    pid: i32,
    starttime: u64,
    root: &std::path::Path,
    image: &std::path::Path,
) -> Option<String> {
    let (r, i) = (root.to_str()?, image.to_str()?);
    let plain = |p: &str| !p.contains(char::is_whitespace) && !p.contains("..");
    (plain(r) && plain(i) && i.contains("/.disks/"))
        .then(|| format!("{op} fu {pid} {starttime} {r} {i}\n"))
}

/// Asks the guard, if this process dies first, to unmount the fuse2fs
/// disk on `root` (`fusermount -u -z`), kill its daemon `pid` (only while
/// that pid has the start time `starttime`) and remove its `image` (a
/// sandbox's `*.img`). `false` for paths with white space, or without a
/// guard.
pub fn end_fuse_on_death(
    pid: i32,
    starttime: u64,
    root: &std::path::Path,
    image: &std::path::Path,
) -> bool {
    fuse_line('+', pid, starttime, root, image).is_some_and(|l| send(&l))
}

/// Withdraws [`end_fuse_on_death`] (the daemon was reaped).
pub fn forget_fuse(pid: i32, starttime: u64, root: &std::path::Path, image: &std::path::Path) {
    if let Some(l) = fuse_line('-', pid, starttime, root, image) {
        send(&l);
    }
}

fn file_line(op: char, path: &std::path::Path) -> Option<String> {
    let p = path.to_str()?;
    let memory = p.starts_with("/dev/shm/createos-local-disk-") && p.ends_with(".ext4");
    (!p.contains(char::is_whitespace)
        && !p.contains("..")
        && (memory || p.ends_with("/.disks/template.ext4")))
    .then(|| format!("{op} rf {p} 0\n"))
}

/// Asks the guard to remove the sandbox disks' template file `path` (see
/// [`crate::storage::disk::template_of`]: the file or link in the data directory,
/// or the file in memory) if this process dies first (`false` for any
/// other path, one with white space, or without a guard).
pub fn remove_file_on_death(path: &std::path::Path) -> bool {
    file_line('+', path).is_some_and(|l| send(&l))
}

/// Withdraws [`remove_file_on_death`] (the file was removed).
pub fn forget_file_removal(path: &std::path::Path) {
    if let Some(l) = file_line('-', path) {
        send(&l);
    }
}

/// A machine being started, announced to the guard until it runs (see
/// [`kill_starting_on_death`]); withdrawn when dropped.
pub struct Starting(Option<String>);

/// Asks the guard to kill every process that binds `root` as `/` (a
/// machine's bwrap, before its init runs) if this process dies before the
/// returned value is dropped. Nothing is announced for a root with a line
/// break, or without a guard.
pub fn kill_starting_on_death(root: &std::path::Path) -> Starting {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let Some(r) = root.to_str().filter(|r| !r.contains('\n')) else {
        return Starting(None);
    };
    let token = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let key = format!("bw {token}");
    Starting(send(&format!("+ {key} {r}\n")).then_some(key))
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(key) = self.0.take() {
            send(&format!("- {key} -\n"));
        }
    }
}

/// Withdraws a tree that was verified gone.
pub fn release(tree: Guarded) {
    send(&tree.line('-'));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A disk announced before its loop device was attached and never
    /// mounted (the server was killed between the two): once the server
    /// is gone, the guard detaches the loop device and removes the image.
    #[test]
    fn the_guard_detaches_the_loop_device_of_a_disk_never_mounted() {
        if !crate::trees::id_map::ranges_here() {
            test_support::skipped("attaching a loop device needs the host's root");
            return;
        }
        let dir = std::env::temp_dir().join(format!("guard-loop-{}", std::process::id()));
        let (root, disks) = (dir.join("sb-1"), dir.join(".disks"));
        std::fs::create_dir_all(&disks).unwrap();
        let image = disks.join("sb-1.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(8 << 20)
            .unwrap();
        let attached = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&image)
            .output()
            .unwrap();
        assert!(attached.status.success(), "{attached:?}");
        let device = String::from_utf8(attached.stdout)
            .unwrap()
            .trim()
            .to_owned();
        let backed_by = |image: &std::path::Path| {
            let out = Command::new("losetup")
                .args(["-n", "-O", "NAME", "-j"])
                .arg(image)
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        };
        assert_eq!(backed_by(&image), device);

        let mut guard = Command::new("/bin/bash")
            .args(["-c", GUARD_SCRIPT, "createos-local-guard-test"])
            .env_clear()
            .env("PATH", GUARD_PATH)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let line = disk_line('+', &root, &image).unwrap();
        guard
            .stdin
            .take()
            .unwrap()
            .write_all(line.as_bytes())
            .unwrap();
        // Its stdin closed: what a killed server leaves the guard.
        let ended = guard.wait().unwrap();

        let left = backed_by(&image);
        if !left.is_empty() {
            let _ = Command::new("losetup").args(["-d", &left]).status();
        }
        let image_left = image.exists();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(ended.success(), "the guard ended with {ended}");
        assert_eq!(left, "", "the loop device was detached");
        assert!(!image_left, "the image was removed");
    }
}
