//! Liveness of host instances on this machine, checked directly instead of
//! waiting for a heartbeat to expire.
//!
//! Each host instance holds an exclusive `flock` on a file named after its
//! instance id in a per-user directory of this machine (`$XDG_RUNTIME_DIR`
//! or the temporary directory). The kernel drops the lock when the process
//! ends, however it ends (`kill -9` included), and never hands it to a
//! later process that happens to get the same pid. So another process on
//! this machine that can take the lock knows the holder is gone at once.
//!
//! Only a definite answer counts: when the file is missing (a host on
//! another machine, in another container, of another user, or of an
//! older version) or the lock cannot be tried, the heartbeat decides as
//! before. The heartbeat stays the rule for every other host.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

/// The lock one host instance holds while it lives; dropping it removes
/// the file (the lock itself ends with the file descriptor).
#[derive(Debug)]
pub(crate) struct LocalHold {
    _file: File,
    path: PathBuf,
}

impl Drop for LocalHold {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Takes the lock of host instance `id`, or `None` when this machine
/// offers no place for it (the heartbeat alone then speaks for the host).
pub(crate) fn hold(id: &str) -> Option<LocalHold> {
    let dir = locks_dir()?;
    let path = lock_path(&dir, id)?;
    if !private_dir(&dir, true) {
        return None;
    }
    // Locked before it gets its name: nobody can find the file unlocked
    // and take its holder for dead.
    let staging = dir.join(format!(".{id}.{}.new", std::process::id()));
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&staging)
        .ok()?;
    if file.try_lock().is_err() || std::fs::rename(&staging, &path).is_err() {
        let _ = std::fs::remove_file(&staging);
        return None;
    }
    Some(LocalHold { _file: file, path })
}

/// True only when host instance `id` held its lock on this machine and its
/// process has ended: the lock could be taken. False when it is alive or
/// unknown here.
pub(crate) fn has_exited(id: &str) -> bool {
    let Some(dir) = locks_dir().filter(|dir| private_dir(dir, false)) else {
        return false;
    };
    let Some(path) = lock_path(&dir, id) else {
        return false;
    };
    let Ok(file) = File::open(&path) else {
        return false;
    };
    match file.try_lock() {
        Ok(()) => {
            let _ = std::fs::remove_file(&path);
            true
        }
        Err(TryLockError::WouldBlock) | Err(TryLockError::Error(_)) => false,
    }
}

/// `{dir}/{id}.lock` for an id of the store's shape (`host-<hex>`): an id
/// read from a shared database never names another path.
fn lock_path(dir: &Path, id: &str) -> Option<PathBuf> {
    let plain = !id.is_empty()
        && id.len() <= 100
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    plain.then(|| dir.join(format!("{id}.lock")))
}

/// Whether `dir` is this user's own directory that nobody else may write
/// (created with mode 0700 when `create`): in a directory another user
/// controls, a planted unlocked file could make a live host look dead.
fn private_dir(dir: &Path, create: bool) -> bool {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if create {
        let _ = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir);
    }
    let (Ok(meta), Ok(me)) = (
        std::fs::symlink_metadata(dir),
        std::fs::metadata("/proc/self"),
    ) else {
        return false;
    };
    meta.is_dir() && meta.uid() == me.uid() && meta.mode() & 0o022 == 0
}

/// `$XDG_RUNTIME_DIR/sandbox-hosts`, else `<tmp>/sandbox-hosts-<uid>`.
fn locks_dir() -> Option<PathBuf> {
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(runtime).join("sandbox-hosts"));
    }
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").ok()?.uid();
    Some(std::env::temp_dir().join(format!("sandbox-hosts-{uid}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_reads_alive_and_an_unlocked_file_exited() {
        let id = format!("host-test-{}", std::process::id());
        assert!(!has_exited(&id), "no file: unknown, not exited");
        let held = hold(&id).expect("a lock directory");
        assert!(!has_exited(&id), "held by a live holder");
        drop(held);
        assert!(!has_exited(&id), "removed: unknown");
        // What a holder killed with SIGKILL leaves: its file, no lock.
        let path = lock_path(&locks_dir().unwrap(), &id).unwrap();
        File::create(&path).unwrap();
        assert!(has_exited(&id));
        assert!(!path.exists());
        assert!(!has_exited("../etc/passwd"));
    }
}
