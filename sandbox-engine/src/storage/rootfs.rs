//! The file system a bwrap sandbox sees: its own root directory (with its
//! own `/tmp`, `/paperclip-workspace`, `$HOME`, and a minimal `/etc`), plus
//! the host's system directories mounted read-only.
//!
//! # Who owns a sandbox's files
//! When the server runs as root, every sandbox gets its own range of
//! unprivileged host uids and gids ([`crate::trees::id_map`]); its first id is the
//! sandbox's owner: commands start as it (uid 0 *inside* the sandbox's user
//! namespace maps to it, the rest of the range to ids 1-65535), and the
//! sandbox's own directories belong to it. The owner of the sandbox root
//! *is* the record of that range. Files the server
//! writes through the Files API take the owner of the sandbox root (see
//! the Files API module). A server that is not root runs commands as its own
//! uid, and nothing is re-owned.
//!
//! # The minimal `/etc`
//! `/etc` in a sandbox is a read-only copy made once per server
//! ([`prepare_etc`], `<data dir>/.sandbox-etc`, one bind mount per command:
//! mounting each entry separately cost about 30 ms per command). It holds a
//! `passwd` and `group` naming only `root` and `nobody`, `hostname`,
//! `hosts`, and a short `profile` (so `bash -l` does not run the host's
//! login scripts), plus copies of the host entries programs need to work
//! ([`ETC_FROM_HOST`]): name resolution,
//! certificates, the dynamic loader's cache, `alternatives` (the targets of
//! `/usr/bin/awk`, `java`, ...), time zone, locale aliases and the
//! configuration some runtimes keep in `/etc` (`java-*`, `python3*`,
//! `perl`); of these, the two directories of links (`ssl/certs`,
//! `alternatives`) are bound read-only from the host over empty mount
//! points in the copy rather than copied ([`ETC_BOUND_FROM_HOST`]).
//! Everything else of the host's `/etc` (`shadow`, `ssh`,
//! `sudoers`, `gitconfig`, `npmrc`, `pip.conf`, `environment`, ...) is
//! absent.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Host system directories mounted read-only into bwrap sandboxes (`etc`
/// is not one of them: see the module docs). The Files API refuses paths
/// under all of these and under `etc`.
pub const HOST_DIRS: &[&str] = &[
    "usr", "opt", "bin", "sbin", "lib", "lib32", "lib64", "libx32",
];

/// Host system directories a sandbox sees read-only (and `etc`, its own
/// minimal one). The Files API refuses paths under them.
pub const SYSTEM_DIRS: &[&str] = &[
    "usr", "etc", "opt", "bin", "sbin", "lib", "lib32", "lib64", "libx32",
];

/// Entries of the host's `/etc` mounted read-only into every sandbox (when
/// they exist). A trailing `*` matches a name prefix.
pub const ETC_FROM_HOST: &[&str] = &[
    "resolv.conf",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "protocols",
    "services",
    "networks",
    "rpc",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "pki/tls/certs",
    "crypto-policies",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "timezone",
    "locale.alias",
    "os-release",
    "debian_version",
    "lsb-release",
    "mime.types",
    "magic",
    "magic.mime",
    "inputrc",
    "terminfo",
    "shells",
    "xml",
    "sgml",
    "groff",
    "perl",
    "java-*",
    "python3*",
    "maven",
];

/// Directories of [`ETC_FROM_HOST`] that hold hundreds of links each
/// (`ssl/certs` the certificates' hash names, `alternatives` the targets of
/// `/usr/bin/awk`, `java`, ...): where the host's is a real directory, it
/// is bound read-only into every sandbox at that place in its `/etc`
/// ([`etc_bound_from_host`]) instead of being copied. Copying their some
/// 700 links was most of the copy's time, on the path of every server's
/// start (about 15 ms of a `sandbox run`'s 60, issue 41 item 2); binding
/// them costs a sandbox's machine one mount each. The sandbox sees the
/// same links, read-only, either way.
pub const ETC_BOUND_FROM_HOST: &[&str] = &["ssl/certs", "alternatives"];

/// Directories every sandbox root starts with, and their modes.
const SANDBOX_DIRS: &[(&str, u32)] = &[
    ("tmp", 0o1777),
    ("paperclip-workspace", 0o755),
    ("root", 0o700),
    ("var", 0o755),
    ("var/tmp", 0o1777),
    ("etc", 0o755),
    ("dev", 0o755),
    ("proc", 0o755),
];

/// The sandbox's own `/etc` files: (name, content).
const ETC_FILES: &[(&str, &str)] = &[
    (
        "passwd",
        "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    ),
    ("group", "root:x:0:\nnogroup:x:65534:\n"),
    ("hostname", "sandbox\n"),
    (
        "hosts",
        "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    ),
    (
        "profile",
        "# The sandbox's own login profile (createos-local). The host's login\n\
         # scripts are not part of the sandbox.\n\
         umask 022\n",
    ),
];

/// The owner uid (= gid) of a new sandbox when the server runs as root,
/// the first id of a range no other sandbox on the host holds
/// ([`crate::trees::id_map::claim`]); `None` otherwise. Ranges are tried in turn
/// from a random start. As root, no free range is an error: the sandbox
/// is refused rather than run as the server's own uid.
fn allocate_owner() -> std::io::Result<Option<(u32, u32)>> {
    use std::sync::atomic::{AtomicU32, Ordering};
    // Process-wide: a cursor where the search starts; the ranges are claimed host-wide.
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    if !crate::trees::id_map::ranges_here() {
        return Ok(None);
    }
    let next = NEXT.get_or_init(|| {
        let seed = u32::from_str_radix(&crate::util::random_hex(4), 16).unwrap_or(0);
        AtomicU32::new(seed)
    });
    let uid =
        crate::trees::id_map::claim(next.fetch_add(1, Ordering::Relaxed)).ok_or_else(|| {
            std::io::Error::other(format!(
                "no range of ids is free for a new sandbox (each is claimed in {}; every one is \
             held, or that directory cannot be made)",
                crate::trees::id_map::CLAIMS_DIR
            ))
        })?;
    Ok(Some((uid, uid)))
}

/// Creates a sandbox root: its own directories and `/etc`, plus mount
/// points (or copies of the host's symlinks) for the read-only host
/// directories, all owned by the sandbox's own uid (see the module docs).
pub fn prepare_root(root: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(root)?;
    let owner = allocate_owner()?;
    let give = |path: &Path| -> std::io::Result<()> {
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
        }
        Ok(())
    };
    give(root)?;
    for (dir, mode) in SANDBOX_DIRS {
        let path = root.join(dir);
        std::fs::create_dir_all(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode))?;
        give(&path)?;
    }
    for dir in HOST_DIRS {
        let host = Path::new("/").join(dir);
        let Ok(meta) = std::fs::symlink_metadata(&host) else {
            continue;
        };
        let inside = root.join(dir);
        if std::fs::symlink_metadata(&inside).is_ok() {
            continue;
        }
        if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&host)?, &inside)?;
        } else if meta.is_dir() {
            std::fs::create_dir_all(&inside)?;
        }
    }
    Ok(())
}

/// The path bwrap mounts as the sandboxes' `/etc`: `.sandbox-etc` beside
/// their roots (a directory, or a link to one in memory, see
/// [`prepare_etc`]).
pub fn etc_template(root: &Path) -> PathBuf {
    root.parent().unwrap_or(root).join(".sandbox-etc")
}

/// Where the in-memory copies of `/etc` go, when the host has one: a
/// tmpfs at `/dev/shm`.
pub(crate) const MEMORY_DIR: &str = "/dev/shm";

/// The name prefix of an in-memory `/etc` copy (see [`prepare_etc`]).
const MEMORY_ETC_PREFIX: &str = "createos-local-etc-";

pub(crate) fn is_tmpfs(dir: &Path) -> bool {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    rustix::fs::statfs(dir).is_ok_and(|s| s.f_type as u64 == TMPFS_MAGIC)
}

/// Builds the `/etc` every sandbox in `data_dir` sees (read-only): the
/// sandbox's own files and copies of [`ETC_FROM_HOST`] (files with symlinks
/// followed, directories copied as they are, `cp -a`). Returns where the
/// copy is.
///
/// The copy is made in memory when `/dev/shm` is a tmpfs (a directory of
/// its own there, reached through the `.sandbox-etc` link in `data_dir`):
/// on a disk file system its some 750 entries (mostly the links of
/// `alternatives` and `ssl/certs`) took 0.3 to 1.5 s of every server start
/// on the test machine, against about 30 ms in memory. Otherwise
/// `.sandbox-etc` is the directory itself. [`remove_etc`] removes either;
/// if the server is killed before it can, its [`crate::trees::deathguard`]
/// removes the in-memory copy.
pub fn prepare_etc(data_dir: &Path) -> std::io::Result<PathBuf> {
    let etc = begin_etc(data_dir)?;
    fill_etc(&etc)?;
    Ok(etc)
}

/// The first part of [`prepare_etc`]: the directory and its link, the
/// sandbox's own files and the dynamic loader's (`ld.so.*`), so that a
/// command can already start with it (the bubblewrap probe) while
/// [`fill_etc`] copies the rest. Returns where the copy is.
pub fn begin_etc(data_dir: &Path) -> std::io::Result<PathBuf> {
    remove_etc(data_dir);
    let link = data_dir.join(".sandbox-etc");
    let memory = Path::new(MEMORY_DIR);
    let etc = if is_tmpfs(memory) {
        let dir = memory.join(format!(
            "{MEMORY_ETC_PREFIX}{}-{}",
            std::process::id(),
            crate::util::random_hex(8)
        ));
        std::fs::create_dir(&dir)?;
        // Removed even if this process is killed (see the deathguard).
        crate::trees::deathguard::remove_on_death(&dir);
        std::os::unix::fs::symlink(&dir, &link)?;
        dir
    } else {
        std::fs::create_dir_all(&link)?;
        link
    };
    std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o755)).ok();
    std::fs::set_permissions(&etc, std::fs::Permissions::from_mode(0o755))?;
    for (name, content) in ETC_FILES {
        std::fs::write(etc.join(name), content)?;
    }
    copy_from_host(&etc, true)?;
    // The mount points of the bound directories: the copy is read-only
    // once bound as `/etc`, so bwrap could not make them.
    for host in etc_bound_from_host() {
        if let Ok(rel) = host.strip_prefix("/etc") {
            std::fs::create_dir_all(etc.join(rel))?;
        }
    }
    Ok(etc)
}

/// The entries of [`ETC_BOUND_FROM_HOST`] that are real directories on
/// this host (not links), as host paths, computed once.
pub fn etc_bound_from_host() -> &'static [PathBuf] {
    // Process-wide: a fact of the host (its `/etc`), read once.
    static LIST: OnceLock<Vec<PathBuf>> = OnceLock::new();
    LIST.get_or_init(|| {
        ETC_BOUND_FROM_HOST
            .iter()
            .map(|rel| Path::new("/etc").join(rel))
            .filter(|host| std::fs::symlink_metadata(host).is_ok_and(|m| m.file_type().is_dir()))
            .collect()
    })
}

/// The rest of [`prepare_etc`] after [`begin_etc`]: the host's entries
/// into the copy at `etc`.
pub fn fill_etc(etc: &Path) -> std::io::Result<()> {
    copy_from_host(etc, false)
}

/// Copies [`etc_from_host`] into `etc`: the loader's entries (`ld.so*`)
/// when `loader`, the others otherwise.
fn copy_from_host(etc: &Path, loader: bool) -> std::io::Result<()> {
    for host in etc_from_host() {
        let Ok(rel) = host.strip_prefix("/etc") else {
            continue;
        };
        if rel.to_str().is_some_and(|r| r.starts_with("ld.so")) != loader {
            continue;
        }
        if etc_bound_from_host().contains(host) {
            continue;
        }
        let copy = etc.join(rel);
        if let Some(parent) = copy.parent() {
            std::fs::create_dir_all(parent)?;
        }
        if host.is_dir() {
            copy_tree(host, &copy).map_err(|e| {
                std::io::Error::other(format!(
                    "cannot copy {} into the sandboxes' /etc: {e}",
                    host.display()
                ))
            })?;
        } else {
            std::fs::copy(host, &copy)?;
        }
    }
    Ok(())
}

/// Removes the sandboxes' `/etc` of `data_dir` made by [`prepare_etc`]:
/// the in-memory copy a `.sandbox-etc` link names (only one of ours:
/// under `/dev/shm`, with our name prefix), and the link or directory.
pub fn remove_etc(data_dir: &Path) {
    let link = data_dir.join(".sandbox-etc");
    match std::fs::read_link(&link) {
        Ok(target) => {
            let ours = target.parent() == Some(Path::new(MEMORY_DIR))
                && target
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(MEMORY_ETC_PREFIX));
            if ours {
                let _ = crate::storage::fstree::remove_tree(&target);
                crate::trees::deathguard::forget_removal(&target);
            }
            let _ = std::fs::remove_file(&link);
        }
        Err(_) => {
            let _ = crate::storage::fstree::remove_tree(&link);
        }
    }
}

/// Copies the directory `from` to `to` the way `cp -a` does for what
/// `/etc` holds, in this process (one `cp` process per directory cost
/// about half a second of every server start): directories and regular
/// files with their permission bits, symbolic links as links (never
/// followed, so a link to a host file stays a link that resolves inside
/// the sandbox). Other file types (sockets, FIFOs, devices) are skipped.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(from)?;
    if meta.file_type().is_symlink() {
        // `cp -a` copies a link named on its command line as a link too.
        return std::os::unix::fs::symlink(std::fs::read_link(from)?, to);
    }
    std::fs::create_dir(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let source = entry.path();
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&source)?, &target)?;
        } else if kind.is_dir() {
            copy_tree(&source, &target)?;
        } else if kind.is_file() {
            std::fs::copy(&source, &target)?;
        }
    }
    std::fs::set_permissions(to, meta.permissions())
}

/// The host `/etc` entries to copy (existing ones only, patterns
/// expanded), computed once.
pub fn etc_from_host() -> &'static [PathBuf] {
    // Process-wide: a fact of the host (its `/etc`), read once.
    static LIST: OnceLock<Vec<PathBuf>> = OnceLock::new();
    LIST.get_or_init(|| {
        let etc = Path::new("/etc");
        let names: Vec<String> = std::fs::read_dir(etc)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        let mut out = Vec::new();
        for entry in ETC_FROM_HOST {
            match entry.strip_suffix('*') {
                Some(prefix) => {
                    let mut hits: Vec<&String> =
                        names.iter().filter(|n| n.starts_with(prefix)).collect();
                    hits.sort();
                    out.extend(hits.into_iter().map(|n| etc.join(n)));
                }
                None => {
                    let path = etc.join(entry);
                    // `exists` follows symlinks: a dangling one is skipped.
                    if path.exists() {
                        out.push(path);
                    }
                }
            }
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 11 (server start): the sandboxes' `/etc` copy is made in
    /// memory when `/dev/shm` is a tmpfs, is reached through the path bwrap
    /// is given, and is removed with the data directory's link.
    #[test]
    fn the_sandboxes_etc_is_made_in_memory_and_removed() {
        let data = std::env::temp_dir().join(format!("etc-test-{}", crate::util::random_hex(6)));
        std::fs::create_dir_all(&data).expect("mkdir");
        let etc = prepare_etc(&data).expect("prepare");
        let mounted = etc_template(&data.join("sb-x"));
        assert!(mounted.join("profile").is_file());
        assert!(mounted.join("passwd").is_file());
        if is_tmpfs(Path::new(MEMORY_DIR)) {
            assert!(etc.starts_with(MEMORY_DIR), "{}", etc.display());
            assert!(is_tmpfs(&etc));
        }
        // The directories of links are mount points, not copies.
        for host in etc_bound_from_host() {
            let point = etc.join(host.strip_prefix("/etc").expect("under /etc"));
            assert!(point.is_dir(), "{}", point.display());
            assert_eq!(std::fs::read_dir(&point).expect("read").count(), 0);
        }
        // A second server start on the same data directory replaces it.
        let again = prepare_etc(&data).expect("prepare again");
        assert!(!etc.exists() || etc == again);
        remove_etc(&data);
        assert!(!again.exists());
        assert!(std::fs::symlink_metadata(&mounted).is_err());
        let _ = std::fs::remove_dir_all(&data);
    }

    /// What the sandboxes' `/etc` copy relied on `cp -a` for: nested
    /// directories, permission bits, and symbolic links copied as links
    /// (a relative one and one to an absolute host path), not followed.
    #[test]
    fn a_copied_tree_keeps_links_modes_and_nesting() {
        let base = std::env::temp_dir().join(format!("copy-tree-{}", crate::util::random_hex(6)));
        let from = base.join("from");
        std::fs::create_dir_all(from.join("sub/deeper")).expect("mkdir");
        std::fs::write(from.join("sub/deeper/file"), b"data").expect("write");
        std::fs::write(from.join("script"), b"#!/bin/sh\n").expect("write");
        std::fs::set_permissions(from.join("script"), std::fs::Permissions::from_mode(0o750))
            .expect("chmod");
        std::fs::set_permissions(from.join("sub"), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        std::os::unix::fs::symlink("sub/deeper/file", from.join("relative")).expect("ln");
        std::os::unix::fs::symlink("/etc/shadow", from.join("absolute")).expect("ln");
        let to = base.join("to");
        copy_tree(&from, &to).expect("copy");
        assert_eq!(
            std::fs::read(to.join("sub/deeper/file")).expect("read"),
            b"data"
        );
        let mode = |p: &Path| {
            std::fs::symlink_metadata(p)
                .expect("meta")
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode(&to.join("script")), 0o750);
        assert_eq!(mode(&to.join("sub")), 0o700);
        assert_eq!(mode(&to), mode(&from));
        for (link, target) in [("relative", "sub/deeper/file"), ("absolute", "/etc/shadow")] {
            let path = to.join(link);
            assert!(std::fs::symlink_metadata(&path)
                .expect("meta")
                .file_type()
                .is_symlink());
            assert_eq!(std::fs::read_link(&path).expect("link"), Path::new(target));
        }
        let _ = std::fs::remove_dir_all(&base);
    }
}
