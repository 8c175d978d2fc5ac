//! Each sandbox's own disk: a fixed-size file system, so that a sandbox
//! filling its root (its `/tmp` included) meets `ENOSPC` inside, never a
//! full host disk (issue 24 item 3: 4 GiB written to `/tmp` went to the
//! host's disk).
//!
//! # How
//! Where the server is root and the host can mount loop devices, every
//! sandbox root is an ext4 file system of its own: a sparse image file
//! `<data dir>/.disks/<id>.img` of the sandbox's disk size, mounted
//! (`loop,nosuid,nodev`) on the sandbox root before the root is prepared.
//! The image takes host disk only for what the sandbox writes.
//!
//! The file system is made once per server, at start: an empty ext4 image
//! of the sandboxes' size, `<data dir>/.disks/template.ext4` (a link to a
//! file under `/dev/shm` where that is a tmpfs), which the
//! start-up trial mounts read-only (so a host that cannot mount one gives
//! sandboxes no disk, see "Elsewhere"). Each sandbox's image is a copy of
//! it that shares no blocks with it once written (a reflink where the host
//! file system has them, else a sparse copy of its about 1 MiB of data),
//! attached to a free loop device and mounted with system calls: about
//! 1 ms, against about 10 ms for `mkfs.ext4` and `mount -o loop` per
//! sandbox. The template is removed at shutdown, and by the death guard
//! when the server is killed. It lives outside every sandbox root, in a
//! directory only root can enter, so no sandbox can reach it. Everything
//! the sandbox holds is counted: what its commands write anywhere in their
//! root (`/tmp`, `/var/tmp`, `/root`, `/paperclip-workspace`) and what the
//! server writes there for it (Files API uploads, staged input). Deleting
//! the sandbox unmounts the file system (lazily: a descriptor still open
//! keeps it until closed) and removes the image; a server killed without
//! a shutdown leaves that to its death guard ([`crate::trees::deathguard`]).
//!
//! The host's file systems do not support per-directory quotas here (the
//! data directory's ext4 is mounted without project or user quotas, and
//! remounting the host's root is not the server's to do), hence one file
//! system per sandbox.
//!
//! # Host-wide
//! Images are sparse, so sandboxes together could promise more than the
//! host has. A creation is therefore refused (429 `disk_limit`) unless the
//! data directory's file system keeps, after every existing sandbox disk
//! of this data directory is filled up, the new sandbox's disk plus a
//! reserve ([`RESERVE`], 1 GiB) free.
//!
//! # Without root
//! A server that is not root cannot attach loop devices; it mounts the
//! same image with `fuse2fs` instead, as a daemon of its own
//! ([`crate::storage::fuse_disk`]), where `fuse2fs` and `fusermount` are
//! installed, `/dev/fuse` opens and `/etc/fuse.conf` allows
//! `user_allow_other`. Proving a disk detached then also waits for its
//! daemon to exit.
//!
//! # Elsewhere
//! A host without either way, or without `mkfs.ext4`, gives sandboxes no
//! disk of their own (checked once at start): their roots are plain
//! directories of the data directory, without a size limit. The startup
//! line and `sandbox describe` say "no disk quota", why, and the fix
//! ([`describe_here`]); the size is then a budget the server measures
//! usage against ([`crate::storage::disk_budget`]).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// Largest default size of each sandbox's disk: 2 GiB.
pub const DEFAULT_SANDBOX_DISK: u64 = 2 << 30;

/// Smallest default size of each sandbox's disk: 512 MiB.
pub const MIN_DEFAULT_SANDBOX_DISK: u64 = 512 << 20;

/// The default size of each sandbox's disk for a server whose sandboxes
/// live in `data_dir`, at most `max_sandboxes` at once: the data
/// directory's free space less [`RESERVE`], shared by that many sandboxes,
/// between [`MIN_DEFAULT_SANDBOX_DISK`] and [`DEFAULT_SANDBOX_DISK`]
/// (rounded down to MiB). So the budget's sandboxes fit with their disks
/// filled on the disk as it is at start (2 GiB each on the test machine's
/// 19 GiB free would let 9 of 16).
pub fn default_size(data_dir: &Path, max_sandboxes: usize) -> u64 {
    let free = rustix::fs::statvfs(data_dir).map_or(0, |s| s.f_bavail.saturating_mul(s.f_frsize));
    let share = free.saturating_sub(RESERVE) / (max_sandboxes.max(1) as u64);
    share.clamp(MIN_DEFAULT_SANDBOX_DISK, DEFAULT_SANDBOX_DISK) >> 20 << 20
}

/// Smallest disk a sandbox can be given (an ext4 file system needs some
/// room of its own): 16 MiB.
pub const MIN_SANDBOX_DISK: u64 = 16 << 20;

/// Where the image of the sandbox root `root` lives.
pub fn image_of(root: &Path) -> Option<PathBuf> {
    let name = root.file_name()?.to_str()?;
    Some(root.parent()?.join(".disks").join(format!("{name}.img")))
}

fn find_tool(name: &str) -> Option<PathBuf> {
    crate::util::find_in_path(name).or_else(|| {
        ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(name))
            .find(|p| p.is_file())
    })
}

fn run(cmd: &mut Command, what: &str) -> std::io::Result<()> {
    let out = cmd
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(std::io::Error::other(format!(
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// The pre-formatted image every sandbox disk of `data_dir` is copied
/// from (see the module docs): the file itself, or a link to it in memory
/// ([`MEMORY_TEMPLATE_PREFIX`]). Not named `*.img`: it is no sandbox's disk
/// and is never mounted writable, so the host-wide budget does not count
/// it.
pub fn template_of(data_dir: &Path) -> PathBuf {
    data_dir.join(".disks").join("template.ext4")
}

/// The name prefix of a template kept in memory: where `/dev/shm` is a
/// tmpfs the template lives there (about 1 MiB of memory), so that making
/// it writes nothing to disk and removing it frees no disk blocks (about
/// 1 ms less at each start and shutdown than on the data directory's
/// ext4).
pub const MEMORY_TEMPLATE_PREFIX: &str = "createos-local-disk-";

/// Whether sandboxes can get a disk of their own here, and their template:
/// makes the template of `size` bytes in `data_dir` (from the one kept in
/// `kept`, if any, see [`kept_template`]) and mounts it once, read-only,
/// as the trial. `Err` says why not (and nothing is left).
pub fn probe(data_dir: &Path, size: u64, kept: Option<&Path>) -> Result<(), NoSandboxDisks> {
    // Uid 0 of a user namespace (a container) cannot attach loop devices;
    // it may mount with fuse2fs.
    if !crate::trees::id_map::ranges_here() {
        if let Some(why) = crate::storage::fuse_disk::unusable() {
            return Err(NoSandboxDisks::NoFuse { why });
        }
    }
    remove_template(data_dir);
    let template = template_of(data_dir);
    let trial = data_dir.join(".disk-probe");
    // A disk the host could not hold (every creation is refused, see
    // [`admit`]) gets no template: the trial then uses the smallest disk,
    // which goes once tried.
    let size = size.max(MIN_SANDBOX_DISK);
    let free = rustix::fs::statvfs(data_dir).map_or(0, |s| s.f_bavail.saturating_mul(s.f_frsize));
    let affordable = free >= size.saturating_add(RESERVE);
    let made = if affordable { size } else { MIN_SANDBOX_DISK };
    // The trial of a template; also whether it was a copy of a kept one.
    let try_template = || {
        let mut copied = false;
        let result = make_template(&template, made, kept).and_then(|was_copied| {
            copied = was_copied;
            std::fs::create_dir_all(&trial)?;
            let mut mounted = mount_image(&template, &trial, true);
            if mounted.is_ok() && crate::storage::fuse_disk::serves(&trial) {
                mounted = crate::storage::fuse_disk::detach_within(&trial, PROOF_WAIT)
                    .map_err(std::io::Error::other);
            } else if mounted.is_ok() {
                let _ = unmount(&trial);
            }
            let _ = std::fs::remove_dir(&trial);
            mounted
        });
        (result, copied)
    };
    let result = match (try_template(), kept) {
        // A kept file system that does not mount is not kept: made (and
        // kept) anew.
        ((Err(_), true), Some(dir)) => {
            let _ = std::fs::remove_file(kept_template(dir, made));
            remove_template(data_dir);
            try_template().0
        }
        ((result, _), _) => result,
    };
    if result.is_err() || !affordable {
        remove_template(data_dir);
    }
    result.map_err(|source| NoSandboxDisks::Trial {
        data_dir: data_dir.to_path_buf(),
        source,
    })
}

/// Why the sandboxes of a server get no disk of their own (see [`probe`]):
/// their files then go to the data directory's file system, measured
/// against a budget instead.
#[derive(Debug, thiserror::Error)]
pub enum NoSandboxDisks {
    /// A server that is not the host's root needs fuse2fs, which cannot
    /// run here.
    #[error("the server is not the host's root and {why}")]
    NoFuse {
        /// Why fuse2fs cannot run, with the command that fixes it.
        why: String,
    },
    /// The template could not be made or its trial mount failed.
    #[error("{source}")]
    Trial {
        /// The data directory the template was made in.
        data_dir: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}

/// Makes the template: a sparse file of `size` bytes with an empty ext4
/// file system (a copy of the one kept in `kept`, see [`fill_template`]),
/// removed by the death guard if the server dies. Returns whether it is
/// such a copy.
fn make_template(template: &Path, size: u64, kept: Option<&Path>) -> std::io::Result<bool> {
    if let Some(dir) = template.parent() {
        disks_dir(dir)?;
    }
    let memory = Path::new(crate::storage::rootfs::MEMORY_DIR);
    let copied = if crate::storage::rootfs::is_tmpfs(memory) {
        let file = memory.join(format!(
            "{MEMORY_TEMPLATE_PREFIX}{}-{}.ext4",
            std::process::id(),
            crate::util::random_hex(8)
        ));
        // Removed even if the server dies while it is being filled.
        crate::trees::deathguard::remove_file_on_death(&file);
        let linked = fill_template(&file, size, kept)
            .and_then(|filled| std::os::unix::fs::symlink(&file, template).map(|()| filled));
        linked.inspect_err(|_| {
            let _ = std::fs::remove_file(&file);
            crate::trees::deathguard::forget_file_removal(&file);
        })?
    } else {
        fill_template(template, size, kept).inspect_err(|_| {
            let _ = std::fs::remove_file(template);
        })?
    };
    crate::trees::deathguard::remove_file_on_death(template);
    Ok(copied)
}

/// Which formatting a kept file system was made with: part of its name,
/// so that one made by another version of [`format()`] is never used.
const KEPT_FORMAT: &str = "ext4-i4096-nojournal-1";

/// Where an empty file system of `size` bytes is kept in `dir` between
/// servers ([`crate::ServerBuilder::keep_disk_templates_in`]): the CLI's
/// own engines keep theirs in its data directory, so that a `sandbox
/// run` copies about 1 MiB instead of running `mkfs.ext4` (3 to 6 ms of
/// its start, issue 41 item 2). It is only ever copied, never mounted or
/// written in place; the copy is what the start-up trial mounts, and one
/// that fails there is removed and made anew. Only the newest size is
/// kept (the default size follows the free disk space).
pub fn kept_template(dir: &Path, size: u64) -> PathBuf {
    dir.join(format!("empty-{KEPT_FORMAT}-{size}.img"))
}

/// Fills the new file `file` with an empty file system of `size` bytes:
/// a copy of the one kept in `kept` when it holds one this server could
/// have made (a regular file of that size, this user's, for this user
/// alone), else made here by [`format()`] and then kept there for the next
/// server (written beside it and renamed, so no server copies half of
/// one). Keeping is best effort: a failure leaves nothing kept. Returns
/// whether `file` is a copy of a kept one.
fn fill_template(file: &Path, size: u64, kept: Option<&Path>) -> std::io::Result<bool> {
    let Some(dir) = kept else {
        create_sparse(file, size)?;
        return format(file).map(|()| false);
    };
    let keep = kept_template(dir, size);
    let usable = std::fs::symlink_metadata(&keep).is_ok_and(|m| {
        m.file_type().is_file()
            && m.len() == size
            && m.uid() == rustix::process::geteuid().as_raw()
            && m.mode() & 0o077 == 0
    });
    if usable {
        copy_sparse(&keep, file)?;
        return restrict(file).map(|()| true);
    }
    create_sparse(file, size)?;
    format(file)?;
    let _ = store_kept(file, dir, &keep);
    Ok(false)
}

/// Keeps a copy of the file system `file` as `keep` in `dir` (see
/// [`fill_template`]), removing the other sizes kept there.
fn store_kept(file: &Path, dir: &Path, keep: &Path) -> std::io::Result<()> {
    disks_dir(dir)?;
    let partial = dir.join(format!(
        ".partial-{}-{}",
        std::process::id(),
        crate::util::random_hex(4)
    ));
    let stored = copy_sparse(file, &partial)
        .and_then(|()| restrict(&partial))
        .and_then(|()| std::fs::rename(&partial, keep));
    if stored.is_err() {
        let _ = std::fs::remove_file(&partial);
        return stored;
    }
    for entry in std::fs::read_dir(dir)?.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path != keep && name.to_string_lossy().starts_with("empty-") {
            let _ = std::fs::remove_file(path);
        }
    }
    Ok(())
}

/// Makes `file` readable and writable by its owner alone.
fn restrict(file: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600))
}

/// Removes the template of `data_dir` (see [`template_of`]), if any: the
/// file in memory a link names (only one of ours), and the link or file.
pub fn remove_template(data_dir: &Path) {
    let template = template_of(data_dir);
    if let Ok(target) = std::fs::read_link(&template) {
        let ours = target.parent() == Some(Path::new(crate::storage::rootfs::MEMORY_DIR))
            && target
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(MEMORY_TEMPLATE_PREFIX));
        if ours && std::fs::remove_file(&target).is_ok() {
            crate::trees::deathguard::forget_file_removal(&target);
        }
    }
    if std::fs::remove_file(&template).is_ok() {
        crate::trees::deathguard::forget_file_removal(&template);
    }
}

/// Serializes admission and creation of disks, so that two creations at
/// once cannot both take the last room.
fn creating() -> &'static Mutex<()> {
    // Process-wide: it guards the free room of the file system, which all servers here share.
    static LOCK: Mutex<()> = Mutex::new(());
    &LOCK
}

/// Free space kept on the data directory's file system beyond everything
/// sandbox disks may still take: 1 GiB.
pub const RESERVE: u64 = 1 << 30;

/// Bytes the sandbox disk mounted at `root` may still take.
fn still_free(root: &Path) -> u64 {
    rustix::fs::statvfs(root).map_or(0, |s| s.f_bavail.saturating_mul(s.f_frsize))
}

/// `Err` when one more disk of `size` bytes in `data_dir` would let the
/// sandbox disks fill the data directory's file system (see the module
/// docs).
fn admit(data_dir: &Path, size: u64) -> Result<(), crate::trees::budgets::Refusal> {
    let Ok(fs) = rustix::fs::statvfs(data_dir) else {
        return Ok(());
    };
    let free = fs.f_bavail.saturating_mul(fs.f_frsize);
    let mut owed: u64 = 0;
    let mut disks = 0;
    if let Ok(entries) = std::fs::read_dir(data_dir.join(".disks")) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".img")) else {
                continue;
            };
            // What the image may still grow by: the free room of its file
            // system once mounted (images are sparse), its whole size
            // while it is being made.
            let root = data_dir.join(id);
            let mounted = match (std::fs::metadata(&root), std::fs::metadata(data_dir)) {
                (Ok(r), Ok(d)) => r.dev() != d.dev(),
                _ => false,
            };
            let may_take = if mounted {
                still_free(&root)
            } else {
                entry.metadata().map_or(0, |m| m.len())
            };
            owed = owed.saturating_add(may_take);
            disks += 1;
        }
    }
    let needed = owed.saturating_add(size).saturating_add(RESERVE);
    if free >= needed {
        return Ok(());
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    Err(crate::trees::budgets::Refusal {
        code: "disk_limit",
        message: format!(
            "the host disk of this server's data directory has {:.1} GiB free; its {disks} sandbox \
             disk(s) may still take {:.1} GiB and one more needs {:.1} GiB (--sandbox-disk) plus \
             {:.1} GiB kept free for the host; nothing was created: delete a sandbox, free disk \
             space, or give sandboxes smaller disks, then retry",
            gib(free),
            gib(owed),
            gib(size),
            gib(RESERVE)
        ),
    })
}

/// Why a sandbox root could not be made.
#[derive(Debug)]
pub enum PrepareError {
    /// Over the host-wide disk budget (a 429).
    Refused(crate::trees::budgets::Refusal),
    /// The server failed (a 500).
    Io(std::io::Error),
}

/// Makes the sandbox root `root`: with a disk of `disk` bytes of its own
/// when given (admitted first, see [`admit`]), then its directories
/// ([`crate::storage::rootfs::prepare_root`]). Nothing is left behind on failure.
pub fn prepare(root: &Path, disk: Option<u64>) -> Result<(), PrepareError> {
    if let Some(size) = disk {
        let data_dir = root.parent().unwrap_or(Path::new("/"));
        let image = {
            // Admission and the image's creation are one step; making and
            // mounting the file system need not be.
            let _creating = creating().lock().unwrap_or_else(|p| p.into_inner());
            admit(data_dir, size).map_err(PrepareError::Refused)?;
            new_image(root, size).map_err(PrepareError::Io)?
        };
        mount_disk(root, &image).map_err(PrepareError::Io)?;
    }
    crate::storage::rootfs::prepare_root(root).map_err(|e| {
        if detach(root) {
            let _ = std::fs::remove_dir(root);
        }
        PrepareError::Io(e)
    })
}

/// The image of `root`, `size` bytes with an empty ext4 file system: a
/// copy of the template (see [`template_of`]) when there is one of that
/// size, else made here with `mkfs.ext4`. Removed again on failure.
fn new_image(root: &Path, size: u64) -> std::io::Result<PathBuf> {
    let image = image_of(root).ok_or_else(|| std::io::Error::other("no image path"))?;
    if let Some(dir) = image.parent() {
        disks_dir(dir)?;
    }
    let size = size.max(MIN_SANDBOX_DISK);
    let template = root.parent().map(template_of);
    let made = match template.filter(|t| std::fs::metadata(t).is_ok_and(|m| m.len() == size)) {
        Some(template) => copy_sparse(&template, &image),
        None => create_sparse(&image, size).and_then(|()| format(&image)),
    };
    match made {
        Ok(()) => Ok(image),
        Err(e) => {
            let _ = std::fs::remove_file(&image);
            Err(e)
        }
    }
}

/// Creates `dir`, where disk images live: only root may enter it.
fn disks_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// A new empty sparse file of `size` bytes at `path`, for root alone.
fn create_sparse(path: &Path, size: u64) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    if let Err(e) = file.set_len(size) {
        drop(file);
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(())
}

/// Makes an empty ext4 file system in the file `image`.
fn format(image: &Path) -> std::io::Result<()> {
    let mkfs =
        find_tool("mkfs.ext4").ok_or_else(|| std::io::Error::other("mkfs.ext4 not found"))?;
    run(
        Command::new(mkfs)
            .args(["-q", "-F", "-m", "0", "-O", "^has_journal"])
            // An inode per 4 KiB: trees of many small files
            // (`node_modules`, a 100 000-level directory chain) run
            // out of space, not of inodes, first.
            .args(["-i", "4096"])
            // The root directory belongs to the server's uid (root's, or
            // the ordinary user's that mounts it with fuse2fs).
            .args([
                "-E",
                "nodiscard,lazy_itable_init=1,root_owner",
                "-L",
                "sandbox",
            ])
            .arg(image),
        "mkfs.ext4",
    )
}

/// Copies the file `from` to the new file `to` without sharing a block
/// that either may write later: a reflink (`FICLONE`) where the file system
/// has them (the copy gets blocks of its own as it is written), else the
/// data regions alone (`SEEK_DATA`/`SEEK_HOLE`, `copy_file_range`), the
/// holes left holes. `to` is removed on failure.
fn copy_sparse(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let src = std::fs::File::open(from)?;
    let dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)?;
    // SAFETY: an ioctl on two descriptors we own; it reads no memory.
    if unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) } == 0 {
        return Ok(());
    }
    let result = (|| {
        let end = src.metadata()?.len();
        dst.set_len(end)?;
        let mut at = 0;
        while at < end {
            let data = match rustix::fs::seek(&src, rustix::fs::SeekFrom::Data(at)) {
                Ok(d) => d,
                // No data past `at`.
                Err(rustix::io::Errno::NXIO) => break,
                Err(e) => return Err(e.into()),
            };
            let hole = rustix::fs::seek(&src, rustix::fs::SeekFrom::Hole(data))?.min(end);
            copy_range(&src, &dst, data, hole)?;
            at = hole;
        }
        Ok(())
    })();
    if result.is_err() {
        drop(dst);
        let _ = std::fs::remove_file(to);
    }
    result
}

/// Copies bytes `start..end` of `src` to the same offsets of `dst`.
fn copy_range(
    src: &std::fs::File,
    dst: &std::fs::File,
    start: u64,
    end: u64,
) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let (mut off_in, mut off_out) = (start, start);
    while off_in < end {
        let len = usize::try_from(end - off_in).unwrap_or(usize::MAX);
        match rustix::fs::copy_file_range(src, Some(&mut off_in), dst, Some(&mut off_out), len) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => {}
            // A kernel or file system without it: plain reads and writes.
            Err(
                rustix::io::Errno::XDEV
                | rustix::io::Errno::NOSYS
                | rustix::io::Errno::OPNOTSUPP
                | rustix::io::Errno::INVAL,
            ) => {
                let mut buf = vec![0u8; 1 << 16];
                while off_in < end {
                    let want = buf
                        .len()
                        .min(usize::try_from(end - off_in).unwrap_or(usize::MAX));
                    let n = src.read_at(&mut buf[..want], off_in)?;
                    if n == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    dst.write_all_at(&buf[..n], off_in)?;
                    off_in += n as u64;
                }
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Mounts `image` on `root` (created if needed), tells the death guard,
/// and removes the image (and the empty `root`) on failure.
fn mount_disk(root: &Path, image: &Path) -> std::io::Result<()> {
    // A loop device is announced to the death guard before it is attached:
    // a server killed between the attach and the mount would otherwise
    // leave it attached, known to no one (its successor has no record of
    // a sandbox not created yet). A fuse2fs disk's daemon is announced
    // when it starts.
    let loop_disk = crate::trees::id_map::ranges_here();
    if loop_disk {
        crate::trees::deathguard::unmount_on_death(root, image);
    }
    let result = std::fs::create_dir_all(root).and_then(|()| mount_image(image, root, false));
    match result {
        Ok(()) => {
            let _ = std::fs::remove_dir(root.join("lost+found"));
            Ok(())
        }
        Err(e) => {
            if loop_disk {
                crate::trees::deathguard::forget_unmount(root, image);
            }
            let _ = std::fs::remove_file(image);
            // Only an empty directory (never a mounted one) goes.
            let _ = std::fs::remove_dir(root);
            Err(e)
        }
    }
}

/// Mounts the ext4 file system in `image` on the directory `at`
/// (`nosuid,nodev,noatime`, read-only when asked) through a loop device
/// that detaches itself once unmounted: with system calls
/// ([`loop_device::mount`]), else with `mount -o loop`.
fn mount_image(image: &Path, at: &Path, read_only: bool) -> std::io::Result<()> {
    if !crate::trees::id_map::ranges_here() {
        return crate::storage::fuse_disk::mount(image, at, read_only);
    }
    let direct = loop_device::mount(image, at, read_only);
    if direct.is_ok() {
        return direct;
    }
    let Some(mount) = find_tool("mount") else {
        return direct;
    };
    let options = if read_only {
        "loop,ro,nosuid,nodev,noatime"
    } else {
        "loop,nosuid,nodev,noatime"
    };
    run(
        Command::new(mount).args(["-o", options]).arg(image).arg(at),
        "mount",
    )
}

/// Unmounts what is mounted on `at` (lazily: a descriptor still open keeps
/// it until closed).
fn unmount(at: &Path) -> std::io::Result<()> {
    // A server that is not root mounts only with fuse2fs, and unmounts
    // with fusermount (also a predecessor's disk the death guard left).
    if crate::storage::fuse_disk::serves(at) || !crate::trees::id_map::ranges_here() {
        return crate::storage::fuse_disk::unmount(at);
    }
    let path = std::ffi::CString::new(at.as_os_str().as_encoded_bytes())?;
    // SAFETY: a plain system call on a NUL-terminated path we own.
    let done = unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
    if done == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Loop devices through their ioctls, as `mount -o loop` does, without
/// starting a process (`<linux/loop.h>`).
mod loop_device {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::path::Path;

    const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
    const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
    const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
    const LO_FLAGS_READ_ONLY: u32 = 1;
    const LO_FLAGS_AUTOCLEAR: u32 = 4;
    const LO_NAME_SIZE: usize = 64;

    #[repr(C)]
    struct LoopInfo64 {
        device: u64,
        inode: u64,
        rdevice: u64,
        offset: u64,
        sizelimit: u64,
        number: u32,
        encrypt_type: u32,
        encrypt_key_size: u32,
        flags: u32,
        file_name: [u8; LO_NAME_SIZE],
        crypt_name: [u8; LO_NAME_SIZE],
        encrypt_key: [u8; 32],
        init: [u64; 2],
    }

    #[repr(C)]
    struct LoopConfig {
        fd: u32,
        block_size: u32,
        info: LoopInfo64,
        reserved: [u64; 8],
    }

    fn open(path: &Path, flags: libc::c_int) -> std::io::Result<OwnedFd> {
        let c = CString::new(path.as_os_str().as_encoded_bytes())?;
        // SAFETY: open(2) on a NUL-terminated path; the descriptor is ours.
        let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor open(2) just returned.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Attaches `image` to a free loop device (detached again when its
    /// last user closes it) and mounts its ext4 file system on `at`.
    pub(super) fn mount(image: &Path, at: &Path, read_only: bool) -> std::io::Result<()> {
        let mode = if read_only {
            libc::O_RDONLY
        } else {
            libc::O_RDWR
        };
        let file = open(image, mode)?;
        let control = open(Path::new("/dev/loop-control"), libc::O_RDWR)?;
        let mut info = LoopInfo64 {
            device: 0,
            inode: 0,
            rdevice: 0,
            offset: 0,
            sizelimit: 0,
            number: 0,
            encrypt_type: 0,
            encrypt_key_size: 0,
            flags: LO_FLAGS_AUTOCLEAR | if read_only { LO_FLAGS_READ_ONLY } else { 0 },
            file_name: [0; LO_NAME_SIZE],
            crypt_name: [0; LO_NAME_SIZE],
            encrypt_key: [0; 32],
            init: [0; 2],
        };
        let name = image.as_os_str().as_encoded_bytes();
        let n = name.len().min(LO_NAME_SIZE - 1);
        info.file_name[..n].copy_from_slice(&name[..n]);
        let config = LoopConfig {
            fd: file.as_raw_fd() as u32,
            block_size: 0,
            info,
            reserved: [0; 8],
        };
        // Another process may take the free device first: ask again.
        for _ in 0..32 {
            // SAFETY: an ioctl without arguments on a descriptor we own.
            let number = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
            if number < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let path = format!("/dev/loop{number}");
            let device = open(Path::new(&path), mode)?;
            // SAFETY: LOOP_CONFIGURE reads a `struct loop_config`, which
            // `config` is (repr(C), same layout), for the call's duration.
            let configured =
                unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CONFIGURE as _, &config) };
            if configured < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EBUSY) {
                    continue;
                }
                return Err(e);
            }
            let source = CString::new(path)?;
            let target = CString::new(at.as_os_str().as_encoded_bytes())?;
            let mut flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME;
            if read_only {
                flags |= libc::MS_RDONLY;
            }
            // SAFETY: mount(2) with NUL-terminated strings we own and no data.
            let mounted = unsafe {
                libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    c"ext4".as_ptr(),
                    flags,
                    std::ptr::null(),
                )
            };
            if mounted < 0 {
                let e = std::io::Error::last_os_error();
                // SAFETY: detaches the device we attached above.
                unsafe {
                    libc::ioctl(device.as_raw_fd(), LOOP_CLR_FD as _);
                }
                return Err(std::io::Error::other(format!(
                    "mount of {}: {e}",
                    image.display()
                )));
            }
            // The mount holds the device now; closing ours lets the
            // device detach itself at unmount.
            return Ok(());
        }
        Err(std::io::Error::other("no free loop device"))
    }
}

/// Removes `path` and everything under it ([`crate::storage::fstree::remove_tree`]),
/// a sandbox root with a disk of its own detached first: the disk goes
/// whole. A server that is not root and gave the sandbox a slice of its
/// subordinate ids may not remove what the sandbox gave to those ids:
/// then the rest goes with every id of its user
/// ([`crate::trees::id_map::remove_with_every_own_id`]). The sandbox's
/// slice is free again once its root is gone.
pub fn remove_tree(path: &Path) -> std::io::Result<()> {
    detach(path);
    let identity = crate::trees::id_map::root_identity(path);
    // What could not be removed leaves a directory not empty (the walk's
    // own errors do not surface): any failure but "not there" is retried
    // with every id of the user, where it has subordinate ones.
    let removed = match crate::storage::fstree::remove_tree(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            match crate::util::find_in_path("bwrap") {
                Some(bwrap) => {
                    crate::trees::id_map::remove_with_every_own_id(&bwrap, path).map_err(|_| e)
                }
                None => Err(e),
            }
        }
        other => other,
    };
    if let Some(identity) = identity.filter(|_| !path.exists()) {
        crate::trees::id_map::release_slice(identity);
    }
    removed
}

/// Unmounts the disk of `root` (lazily) and removes its image; `true` when
/// `root` had one. The directory `root` itself stays (empty).
pub fn detach(root: &Path) -> bool {
    let Some(image) = image_of(root) else {
        return false;
    };
    if !image.exists() {
        return false;
    }
    if crate::storage::fuse_disk::serves(root) {
        // Unproven here (its callers only clean up): the daemon is given
        // a moment to exit and be reaped.
        let _ = crate::storage::fuse_disk::detach_within(root, std::time::Duration::from_secs(2));
    } else {
        let _ = unmount(root);
    }
    let _ = std::fs::remove_file(&image);
    crate::trees::deathguard::forget_unmount(root, &image);
    true
}

/// How sandboxes' disks are made on this host, in words, for `sandbox
/// describe`: a loop device as root, fuse2fs otherwise, or "no disk
/// quota" with why and the fix.
pub fn describe_here() -> String {
    if crate::trees::id_map::ranges_here() {
        return "an ext4 disk of its own per sandbox (a loop device; --sandbox-disk sets its size)"
            .to_string();
    }
    match crate::storage::fuse_disk::unusable() {
        None => "an ext4 disk of its own per sandbox, mounted with fuse2fs (a daemon of the \
                 engine; --sandbox-disk sets its size)"
            .to_string(),
        Some(why) => format!(
            "no disk quota: sandboxes write to the data directory's file system without a size \
             limit ({why})"
        ),
    }
}

/// How long [`detach_proven`] waits, at most, for a disk to be proven
/// detached before it says what holds it (a delete, a successor settling
/// a predecessor's sandbox).
pub const PROOF_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// Detaches the disk of `root` ([`detach`]) and proves it detached: no
/// mount on `root` in the server's mount namespace and no loop device
/// backed by its image, waiting up to `within` (a lazy unmount completes
/// once no process, no machine's mount namespace, holds the file system).
/// `Ok` also for a root without a disk of its own; `Err` says what is
/// left. The death guard keeps the disk on its list until then.
pub fn detach_proven(root: &Path, within: std::time::Duration) -> Result<(), DiskStillInUse> {
    let Some(image) = image_of(root) else {
        return Ok(());
    };
    let deadline = std::time::Instant::now() + within;
    let mut pause = crate::util::Backoff::up_to(std::time::Duration::from_millis(5));
    loop {
        let left = match remains(root, &image) {
            Ok(left) if left.is_empty() => {
                let _ = std::fs::remove_file(&image);
                crate::trees::deathguard::forget_unmount(root, &image);
                return Ok(());
            }
            Ok(left) => left.join(", "),
            Err(e) => format!("its mounts and loop devices could not be read ({e})"),
        };
        // Unmounted (lazily); again on every round in case an earlier
        // attempt failed.
        let unmounted = unmount(root);
        if std::time::Instant::now() >= deadline {
            return Err(DiskStillInUse {
                root: root.to_path_buf(),
                unmount: unmounted.err().filter(|_| left.contains("mounted")),
                holders: holders(root),
                left,
            });
        }
        std::thread::sleep(pause.next_pause());
    }
}

/// A sandbox's disk not proven detached within the time given: what a
/// delete, a shutdown or a successor answers instead of "gone".
#[derive(Debug, thiserror::Error)]
#[error(
    "the disk of {} is still in use: {left}{}{}",
    .root.display(),
    held_text(.holders),
    unmount_text(.unmount.as_ref())
)]
pub struct DiskStillInUse {
    /// The sandbox root whose disk it is.
    pub root: PathBuf,
    /// What holds it, in words ("mounted on …", "attached to /dev/loopN"),
    /// or why that could not be read.
    pub left: String,
    /// The processes whose mount namespaces still hold the mount.
    pub holders: Vec<String>,
    /// The unmount's own failure, where a mount is what is left.
    pub unmount: Option<std::io::Error>,
}

fn held_text(holders: &[String]) -> String {
    if holders.is_empty() {
        String::new()
    } else {
        format!(
            " (mounted in the mount namespaces of {})",
            holders.join(", ")
        )
    }
}

fn unmount_text(unmount: Option<&std::io::Error>) -> String {
    unmount
        .map(|e| format!(" (unmount: {e})"))
        .unwrap_or_default()
}

/// What holds the disk of `root` whose image is `image`: a mount on `root`
/// in this mount namespace, loop devices backed by the image (removed or
/// not). Empty when nothing does; `Err` when it could not be read.
pub fn remains(root: &Path, image: &Path) -> std::io::Result<Vec<String>> {
    let mut left = crate::storage::fuse_disk::remains(root);
    let escaped = crate::util::mountinfo_escaped(root);
    for line in std::fs::read_to_string("/proc/self/mountinfo")?.lines() {
        if line.split(' ').nth(4) == Some(escaped.as_str()) {
            left.push(format!("mounted on {}", root.display()));
        }
    }
    let image_text = image.to_string_lossy();
    for device in std::fs::read_dir("/sys/block")? {
        let device = device?;
        let backing = match std::fs::read_to_string(device.path().join("loop/backing_file")) {
            Ok(b) => b,
            // Not a loop device, or one without a file.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => continue,
            Err(e) => return Err(e),
        };
        let backing = backing.trim_end();
        if backing == image_text || backing.strip_suffix(" (deleted)") == Some(&*image_text) {
            left.push(format!(
                "attached to /dev/{}",
                device.file_name().to_string_lossy()
            ));
        }
    }
    Ok(left)
}

/// The processes whose mount namespace still has a mount on `root` (for
/// the message of a disk that stays attached).
fn holders(root: &Path) -> Vec<String> {
    let escaped = crate::util::mountinfo_escaped(root);
    crate::trees::procfs::all_pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).is_ok_and(|m| {
                m.lines()
                    .any(|l| l.split(' ').nth(4) == Some(escaped.as_str()))
            })
        })
        .map(|pid| {
            let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("{pid} {}", name.trim())
        })
        .collect()
}

/// Parses a size such as `2G`, `512M`, `65536K` or `1073741824` (binary
/// units; `0` = no disk of its own).
pub fn parse_size(text: &str) -> Result<u64, DiskSizeError> {
    let bytes = crate::util::parse_bytes(text)?;
    if bytes != 0 && bytes < MIN_SANDBOX_DISK {
        return Err(DiskSizeError::TooSmall {
            text: text.to_string(),
        });
    }
    Ok(bytes)
}

/// A sandbox disk size (`--sandbox-disk`) that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiskSizeError {
    /// Not a size at all.
    #[error(transparent)]
    Invalid(#[from] crate::util::InvalidSize),
    /// Smaller than the smallest disk a sandbox can have.
    #[error("size {text:?} is too small: a sandbox disk needs at least 16M (or 0 for none)")]
    TooSmall {
        /// The text as given.
        text: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 41 item 2: the empty file system is kept between servers: the
    /// first formats it and keeps a copy (this user's alone), the next
    /// copies it (the same bytes: `mkfs.ext4` would give a new UUID), and
    /// a kept one that does not mount is made anew. Where this host gives
    /// sandboxes no disk, there is nothing to keep.
    #[test]
    fn a_kept_file_system_is_copied_by_the_next_server_and_a_broken_one_made_anew() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("kept-disk-{}", crate::util::random_hex(6)));
        let server = |name: &str| {
            let dir = base.join(name);
            std::fs::create_dir_all(&dir).expect("mkdir");
            dir
        };
        let (first, second, third) = (server("a"), server("b"), server("c"));
        let kept = base.join("kept");
        if let Err(why) = probe(&first, MIN_SANDBOX_DISK, None) {
            eprintln!("skipped: sandboxes get no disk here ({why})");
            let _ = std::fs::remove_dir_all(&base);
            return;
        }
        remove_template(&first);
        let keep = kept_template(&kept, MIN_SANDBOX_DISK);
        let read = |path: &Path| std::fs::read(path).expect("read");

        probe(&first, MIN_SANDBOX_DISK, Some(&kept)).expect("first");
        let mode = std::fs::metadata(&keep).expect("kept").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(read(&template_of(&first)), read(&keep));

        probe(&second, MIN_SANDBOX_DISK, Some(&kept)).expect("second");
        assert_eq!(read(&template_of(&second)), read(&template_of(&first)));

        std::fs::write(&keep, vec![0u8; MIN_SANDBOX_DISK as usize]).expect("break it");
        probe(&third, MIN_SANDBOX_DISK, Some(&kept)).expect("third");
        let made = read(&template_of(&third));
        assert!(made.iter().any(|b| *b != 0), "made anew");
        assert_eq!(read(&keep), made, "and kept");

        for dir in [&first, &second, &third] {
            remove_template(dir);
        }
        std::fs::remove_dir_all(&base).expect("cleanup");
    }

    #[test]
    fn sizes_parse_in_binary_units() {
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("0"), Ok(0));
        assert!(parse_size("1K").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
