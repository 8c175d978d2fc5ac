//! Removing a directory tree whose shape a sandbox controls, with bounded
//! stack and a bounded number of open descriptors.
//!
//! `std::fs::remove_dir_all` recurses once per directory level: a chain of
//! 15 000 directories that a command built in its own `/tmp` overflowed
//! the 2 MiB stack of the thread deleting the sandbox and aborted the whole
//! server. [`remove_tree`] walks the tree iteratively with `openat(2)` and
//! `unlinkat(2)` relative to one directory descriptor at a time: it goes
//! down into the first subdirectory it finds, removes every other entry on
//! the way, and climbs back with `openat(dir, "..")` once a directory is
//! empty. Its memory is one small record (device, inode, name) per level
//! of the current path and one open directory, whatever the depth.
//!
//! Symbolic links are never followed (`O_NOFOLLOW`): a link is removed as a
//! link. Each climb checks that `..` is the directory the walk came down
//! from (same device and inode); a tree changed under the walk (a
//! directory moved meanwhile) restarts it from the root, so the walk never
//! leaves the tree it was given.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

/// How many times a walk restarts from the root after finding the tree
/// changed under it, before it gives up.
const RESTARTS: usize = 8;

/// One directory of the path from the root down to where the walk is.
struct Level {
    dev: u64,
    ino: u64,
    /// The name of this directory in its parent (empty for the root).
    name: CString,
}

fn identity(fd: &OwnedFd) -> io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

fn open_dir_at(dir: &OwnedFd, name: &CStr) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Removes `path` and everything under it, like `rm -rf` (a symlink or
/// file at `path` is removed itself). `NotFound` when nothing is there.
/// A path that may be a sandbox root with a disk of its own goes through
/// [`crate::storage::disk::remove_tree`], which detaches the disk first.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let root = match rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOTDIR) | Err(Errno::LOOP) => return std::fs::remove_file(path),
        Err(e) => return Err(e.into()),
    };
    let mut restarts = 0;
    loop {
        match empty_tree(&root) {
            Ok(()) => break,
            Err(Changed) if restarts < RESTARTS => restarts += 1,
            Err(Changed) => {
                return Err(io::Error::other(
                    "the directory tree kept changing while it was being removed",
                ))
            }
        }
    }
    // Errors of the walk surface here: what could not be removed leaves
    // the root non-empty.
    std::fs::remove_dir(path)
}

/// The tree changed under the walk (or an entry could not be removed):
/// start again from the root.
struct Changed;

/// Empties the directory `root` (iteratively, see the module docs).
/// Entries that cannot be removed are left; the caller's final `rmdir`
/// then reports the failure.
fn empty_tree(root: &OwnedFd) -> Result<(), Changed> {
    let (dev, ino) = identity(root).map_err(|_| Changed)?;
    let mut path = vec![Level {
        dev,
        ino,
        name: CString::default(),
    }];
    let mut current = rustix::fs::openat(
        root,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|_| Changed)?;
    // Directories found non-removable on this walk (by identity), so that
    // the walk does not descend into them forever.
    let mut stuck: std::collections::HashSet<(u64, u64)> = std::collections::HashSet::new();
    loop {
        let child = next_subdir(&current, &stuck);
        match child {
            Some((name, fd)) => {
                let (dev, ino) = identity(&fd).map_err(|_| Changed)?;
                path.push(Level { dev, ino, name });
                current = fd;
            }
            None => {
                if path.len() == 1 {
                    return Ok(());
                }
                let Some(done) = path.pop() else {
                    return Ok(());
                };
                let parent = open_dir_at(&current, c"..").map_err(|_| Changed)?;
                let expected = &path[path.len() - 1];
                if identity(&parent).map_err(|_| Changed)? != (expected.dev, expected.ino) {
                    return Err(Changed);
                }
                match rustix::fs::unlinkat(&parent, done.name.as_c_str(), AtFlags::REMOVEDIR) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(Errno::ACCESS) | Err(Errno::PERM) => {
                        let _ = rustix::fs::fchmod(&parent, Mode::from_raw_mode(0o700));
                        if rustix::fs::unlinkat(&parent, done.name.as_c_str(), AtFlags::REMOVEDIR)
                            .is_err()
                        {
                            stuck.insert((done.dev, done.ino));
                        }
                    }
                    Err(_) => {
                        stuck.insert((done.dev, done.ino));
                    }
                }
                current = parent;
            }
        }
    }
}

/// Removes every non-directory entry of `dir` it meets and returns the
/// first subdirectory (opened, not followed if a link) that is not known
/// to be stuck; `None` once only stuck directories (or nothing) remain.
fn next_subdir(
    dir: &OwnedFd,
    stuck: &std::collections::HashSet<(u64, u64)>,
) -> Option<(CString, OwnedFd)> {
    let reader = rustix::fs::openat(
        dir,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut entries = Dir::new(reader).ok()?;
    let mut made_writable = false;
    while let Some(entry) = entries.read() {
        let Ok(entry) = entry else {
            return None;
        };
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let kind = match entry.file_type() {
            FileType::Unknown => match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => FileType::from_raw_mode(st.st_mode),
                Err(_) => continue,
            },
            k => k,
        };
        if kind == FileType::Directory {
            let opened = match open_dir_at(dir, name) {
                Err(Errno::ACCESS) | Err(Errno::PERM) => {
                    let _ = rustix::fs::chmodat(
                        dir,
                        name,
                        Mode::from_raw_mode(0o700),
                        AtFlags::empty(),
                    );
                    open_dir_at(dir, name)
                }
                other => other,
            };
            match opened {
                Ok(fd) => {
                    if identity(&fd).is_ok_and(|id| stuck.contains(&id)) {
                        continue;
                    }
                    return Some((name.to_owned(), fd));
                }
                // Replaced by a file or link meanwhile: removed below.
                Err(Errno::NOTDIR) | Err(Errno::LOOP) => {}
                Err(_) => continue,
            }
        }
        match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Err(Errno::ACCESS) | Err(Errno::PERM) if !made_writable => {
                made_writable = true;
                let _ = rustix::fs::fchmod(dir, Mode::from_raw_mode(0o700));
                let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
            }
            Err(Errno::ISDIR) => {
                let _ = rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR);
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("{name}-{}", crate::util::random_hex(6)));
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    /// Builds a chain of `depth` directories named `d` under `base`, with
    /// descriptors only (the path is far longer than `PATH_MAX`).
    fn chain(base: &Path, depth: usize) {
        let mut dir = rustix::fs::open(base, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
            .expect("open");
        for i in 0..depth {
            rustix::fs::mkdirat(&dir, c"d", Mode::from_raw_mode(0o755)).expect("mkdirat");
            if i % 1000 == 0 {
                let f = rustix::fs::openat(
                    &dir,
                    c"f",
                    OFlags::WRONLY | OFlags::CREATE,
                    Mode::from_raw_mode(0o644),
                )
                .expect("file");
                drop(f);
                rustix::fs::symlinkat(c"/", &dir, c"up").expect("symlink");
            }
            dir = open_dir_at(&dir, c"d").expect("open d");
        }
    }

    /// Issue 24 item 1: a deep tree is removed on a thread with a small
    /// stack (std's recursive removal overflowed it). 20 000 levels on a
    /// 64 KiB stack leave a recursive walk a few bytes per level, far less
    /// than any frame; the 100 000-level runs through both faces and the CLI
    /// are in `tests/hostile_sandbox.rs` and `cli_isolation.rs`.
    #[test]
    fn a_very_deep_tree_is_removed_with_a_small_stack() {
        let base = scratch("deep-tree");
        let root = base.join("root");
        std::fs::create_dir(&root).expect("mkdir");
        chain(&root, 20_000);
        let r = root.clone();
        std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || remove_tree(&r))
            .expect("thread")
            .join()
            .expect("no overflow")
            .expect("removed");
        assert!(std::fs::symlink_metadata(&root).is_err());
        let _ = std::fs::remove_dir(&base);
    }

    /// Links are removed, never followed; files, FIFOs and read-only
    /// directories go too; a missing path is `NotFound`.
    #[test]
    fn links_are_not_followed_and_modes_do_not_stop_removal() {
        use std::os::unix::fs::PermissionsExt;
        let base = scratch("tree-links");
        let outside = base.join("outside");
        std::fs::create_dir(&outside).expect("mkdir");
        std::fs::write(outside.join("keep"), b"keep").expect("write");
        let root = base.join("root");
        std::fs::create_dir_all(root.join("a/b/c")).expect("mkdir");
        std::os::unix::fs::symlink(&outside, root.join("a/link")).expect("ln");
        std::os::unix::fs::symlink(&outside, root.join("a/b/c/link")).expect("ln");
        std::fs::write(root.join("a/b/file"), b"x").expect("write");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("a/fifo").as_path(),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .expect("fifo");
        std::fs::set_permissions(root.join("a/b"), std::fs::Permissions::from_mode(0o500))
            .expect("chmod");
        remove_tree(&root).expect("removed");
        assert!(std::fs::symlink_metadata(&root).is_err());
        assert_eq!(std::fs::read(outside.join("keep")).expect("kept"), b"keep");
        assert_eq!(
            remove_tree(&root).expect_err("gone").kind(),
            io::ErrorKind::NotFound
        );
        let link = base.join("link");
        std::os::unix::fs::symlink(&outside, &link).expect("ln");
        remove_tree(&link).expect("link removed");
        assert!(outside.join("keep").exists());
        let _ = std::fs::remove_dir_all(&base);
    }
}
