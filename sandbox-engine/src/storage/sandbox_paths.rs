//! Files API confinement: every path is resolved *inside* a sandbox root.
//!
//! Request paths must be absolute, contain no `..`, `.` or empty-name tricks
//! that matter, no NUL, and must not lie under a host system directory that
//! bwrap mounts read-only (see [`crate::storage::rootfs::SYSTEM_DIRS`]).
//!
//! Resolution uses `openat2(2)` with `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`
//! relative to an fd of the sandbox root: the kernel resolves every symlink
//! as if the root were `/`, the way processes inside a bwrap sandbox see
//! them, and `..` can never climb above the root. A symlink such as
//! `/tmp/l -> /etc/passwd` therefore names `<root>/etc/passwd` (an empty
//! mount point), never the host file, and there is no window between a check
//! and the use of the path. Parent directories are created one component at
//! a time with `mkdirat` on an fd resolved the same way. The last component
//! of a write is opened with `O_NOFOLLOW` semantics relative to its parent fd
//! (a symlink there is replaced atomically with a temporary file and
//! `renameat`, so a link is never followed on write).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::storage::rootfs::SYSTEM_DIRS;

/// Why a path was refused or could not be used.
#[derive(Debug, PartialEq, Eq)]
pub enum PathError {
    /// Not absolute, contains `..`, NUL, or is the root itself.
    Invalid(&'static str),
    /// Under a read-only host system directory.
    SystemDir,
    /// The file (or a parent) does not exist.
    NotFound,
    /// A directory where a file was wanted, or the other way round.
    NotAFile,
    /// Another I/O failure.
    Io(String),
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Invalid(why) => f.write_str(why),
            Self::SystemDir => f.write_str("host system directories are read-only"),
            Self::NotFound => f.write_str("no such file or directory in the sandbox"),
            Self::NotAFile => f.write_str("wrong file type"),
            Self::Io(msg) => write!(f, "I/O error: {msg}"),
        }
    }
}

/// Checks the lexical form of a request path and splits it into components.
pub fn components(path: &str) -> Result<Vec<&str>, PathError> {
    if path.contains('\0') {
        return Err(PathError::Invalid("path contains NUL"));
    }
    if !path.starts_with('/') {
        return Err(PathError::Invalid("path must be absolute"));
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(PathError::Invalid("path must not contain '..'"));
    }
    Ok(parts)
}

fn check_file_path(path: &str) -> Result<Vec<&str>, PathError> {
    let parts = components(path)?;
    match parts.first() {
        None => Err(PathError::Invalid("path names the root directory")),
        Some(first) if SYSTEM_DIRS.contains(first) => Err(PathError::SystemDir),
        Some(_) => Ok(parts),
    }
}

fn map_errno(e: Errno) -> PathError {
    match e {
        Errno::NOENT => PathError::NotFound,
        Errno::ISDIR | Errno::NOTDIR => PathError::NotAFile,
        Errno::LOOP => PathError::Invalid("too many symlinks"),
        other => PathError::Io(other.to_string()),
    }
}

fn resolve_flags() -> ResolveFlags {
    ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS
}

fn open_root(root: &Path) -> Result<OwnedFd, PathError> {
    rustix::fs::open(
        root,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(map_errno)
}

fn open_in_root(root: &OwnedFd, rel: &str, flags: OFlags) -> Result<OwnedFd, PathError> {
    let rel = if rel.is_empty() { "." } else { rel };
    rustix::fs::openat2(
        root,
        rel,
        flags | OFlags::CLOEXEC,
        Mode::empty(),
        resolve_flags(),
    )
    .map_err(map_errno)
}

/// Opens a regular file inside the sandbox root for reading; returns it
/// with its size. The path is opened with `O_PATH` first (which never
/// blocks and has no side effect on a FIFO, socket or device), its type is
/// checked on that descriptor with `fstat`, and only a regular file is then
/// reopened for reading through `/proc/self/fd` (the same inode, so nothing
/// can be swapped in between). Anything else is [`PathError::NotAFile`].
pub fn open_file(root: &Path, path: &str) -> Result<(File, u64), PathError> {
    let parts = check_file_path(path)?;
    let rootfd = open_root(root)?;
    let handle = open_in_root(&rootfd, &parts.join("/"), OFlags::PATH)?;
    let stat = rustix::fs::fstat(&handle).map_err(map_errno)?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(PathError::NotAFile);
    }
    let fd = rustix::fs::open(
        format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&handle)),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(map_errno)?;
    Ok((File::from(fd), stat.st_size as u64))
}

/// Gives a file or directory the server created to the owner of the
/// sandbox root (the unprivileged uid commands run as, see
/// [`crate::storage::rootfs`]), so that commands can change what the Files API
/// wrote. Best effort: a failure leaves it owned by the server.
fn give_to_root_owner(rootfd: &OwnedFd, fd: &OwnedFd) {
    if let Ok(st) = rustix::fs::fstat(rootfd) {
        let _ = rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(st.st_uid)),
            Some(rustix::fs::Gid::from_raw(st.st_gid)),
        );
    }
}

/// Opens (creating as needed) the directory `parts` inside the root.
fn ensure_dir(rootfd: &OwnedFd, parts: &[&str]) -> Result<OwnedFd, PathError> {
    let mut dir = open_in_root(rootfd, "", OFlags::DIRECTORY | OFlags::RDONLY)?;
    for (i, name) in parts.iter().enumerate() {
        let prefix = parts[..=i].join("/");
        match open_in_root(rootfd, &prefix, OFlags::DIRECTORY | OFlags::RDONLY) {
            Ok(fd) => dir = fd,
            Err(PathError::NotFound) => {
                // `name` is a single component (no '/', no '..'): mkdirat on
                // the already-confined parent fd cannot leave the root.
                let created = match rustix::fs::mkdirat(&dir, *name, Mode::from_raw_mode(0o755)) {
                    Ok(()) => true,
                    Err(Errno::EXIST) => false,
                    Err(e) => return Err(map_errno(e)),
                };
                dir = open_in_root(rootfd, &prefix, OFlags::DIRECTORY | OFlags::RDONLY)?;
                if created {
                    give_to_root_owner(rootfd, &dir);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(dir)
}

/// Writes a file inside the sandbox root from `data` (read to its end),
/// creating parent directories. An error from `data` leaves no file behind.
/// The write goes to a temporary file in the same directory that is then
/// renamed over the target, so readers never see a half-written file and a
/// symlink at the target is replaced, not followed.
pub fn write_file(root: &Path, path: &str, data: &mut dyn Read) -> Result<(), PathError> {
    let parts = check_file_path(path)?;
    let (name, parents) = parts
        .split_last()
        .ok_or(PathError::Invalid("path names the root directory"))?;
    let rootfd = open_root(root)?;
    let dir = ensure_dir(&rootfd, parents)?;
    let tmp_name = format!(".createos-local-tmp-{}", crate::util::random_hex(8));
    let fd = rustix::fs::openat(
        &dir,
        tmp_name.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(map_errno)?;
    give_to_root_owner(&rootfd, &fd);
    let mut file = File::from(fd);
    let written = std::io::copy(data, &mut file).and_then(|_| file.flush());
    drop(file);
    if let Err(e) = written {
        let _ = rustix::fs::unlinkat(&dir, tmp_name.as_str(), rustix::fs::AtFlags::empty());
        return Err(PathError::Io(e.to_string()));
    }
    // A directory at the target makes rename fail with EISDIR/ENOTEMPTY.
    if let Err(e) = rustix::fs::renameat(&dir, tmp_name.as_str(), &dir, *name) {
        let _ = rustix::fs::unlinkat(&dir, tmp_name.as_str(), rustix::fs::AtFlags::empty());
        return Err(match e {
            Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST => PathError::NotAFile,
            other => map_errno(other),
        });
    }
    Ok(())
}

/// Creates a directory (and its missing parents) inside the sandbox root,
/// each new one with `mode` and owned like the root; an existing directory
/// is fine, an existing file is [`PathError::NotAFile`].
pub fn create_dir(root: &Path, path: &str, mode: u32) -> Result<(), PathError> {
    let parts = check_file_path(path)?;
    let rootfd = open_root(root)?;
    let dir = ensure_dir(&rootfd, &parts)?;
    let _ = rustix::fs::fchmod(&dir, Mode::from_raw_mode(mode & 0o7777));
    Ok(())
}

/// Resolves a directory inside the root and returns its real host path (used
/// to validate a process `cwd`, and as the host cwd in fallback mode).
pub fn resolve_dir(root: &Path, path: &str) -> Result<std::path::PathBuf, PathError> {
    let parts = components(path)?;
    let rootfd = open_root(root)?;
    let fd = open_in_root(
        &rootfd,
        &parts.join("/"),
        OFlags::DIRECTORY | OFlags::RDONLY,
    )?;
    let real = std::fs::read_link(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&fd)
    ))
    .map_err(|e| PathError::Io(e.to_string()))?;
    Ok(real)
}

/// One entry of a directory listed with [`list_dir`] (symlinks are not
/// followed: a link is listed as itself).
#[derive(Debug, Clone)]
pub struct DirEntryInfo {
    /// The entry's name.
    pub name: String,
    /// True for a directory.
    pub is_dir: bool,
    /// Size in bytes.
    pub size: u64,
    /// The mode bits (type and permissions).
    pub mode: u32,
    /// Last modification, seconds since the epoch.
    pub modified: i64,
    /// Owner uid and gid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
}

/// Lists a directory inside the sandbox root, resolved like every other
/// path here (in the root, symlinks confined) and read through that one
/// descriptor, so nothing outside the root can be listed.
pub fn list_dir(root: &Path, path: &str) -> Result<Vec<DirEntryInfo>, PathError> {
    let parts = components(path)?;
    let rootfd = open_root(root)?;
    let dirfd = open_in_root(
        &rootfd,
        &parts.join("/"),
        OFlags::DIRECTORY | OFlags::RDONLY,
    )?;
    let mut dir = rustix::fs::Dir::read_from(&dirfd).map_err(map_errno)?;
    let mut entries = Vec::new();
    while let Some(entry) = dir.read() {
        let entry = entry.map_err(map_errno)?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let Ok(stat) = rustix::fs::statat(&dirfd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
        else {
            continue; // removed meanwhile
        };
        entries.push(DirEntryInfo {
            name: String::from_utf8_lossy(name.to_bytes()).into_owned(),
            is_dir: rustix::fs::FileType::from_raw_mode(stat.st_mode)
                == rustix::fs::FileType::Directory,
            size: stat.st_size as u64,
            mode: stat.st_mode,
            modified: stat.st_mtime,
            uid: stat.st_uid,
            gid: stat.st_gid,
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp_root() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("confine-test-{}", crate::util::random_hex(6)));
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    #[test]
    fn lexical_checks() {
        assert!(matches!(components("rel/path"), Err(PathError::Invalid(_))));
        assert!(matches!(components("/a/../b"), Err(PathError::Invalid(_))));
        assert!(matches!(check_file_path("/"), Err(PathError::Invalid(_))));
        assert_eq!(check_file_path("/etc/passwd"), Err(PathError::SystemDir));
        assert_eq!(components("/a//./b").ok(), Some(vec!["a", "b"]));
    }

    #[test]
    fn symlinks_resolve_inside_root() {
        let root = tmp_root();
        let outside = tmp_root();
        std::fs::write(outside.join("secret"), b"host").expect("write");
        std::fs::create_dir_all(root.join("tmp")).expect("mkdir");
        std::os::unix::fs::symlink(outside.join("secret"), root.join("tmp/abs")).expect("ln");
        std::os::unix::fs::symlink("../../../../../../..", root.join("tmp/up")).expect("ln");
        assert_eq!(
            open_file(&root, "/tmp/abs").map(|(_, len)| len),
            Err(PathError::NotFound)
        );
        write_file(&root, "/tmp/up/x/file", &mut &b"in"[..]).expect("write via up link");
        assert_eq!(std::fs::read(root.join("x/file")).expect("read"), b"in");
        write_file(&root, "/tmp/abs", &mut &b"replaced"[..]).expect("write over link");
        assert_eq!(
            std::fs::read(outside.join("secret")).expect("read"),
            b"host"
        );
        let _ = std::fs::remove_dir_all(&root);
        let _ = std::fs::remove_dir_all(&outside);
    }
}
