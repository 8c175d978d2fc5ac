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
//! The image takes host disk only for what the sandbox writes. Everything
//! the sandbox holds is counted: what its commands write anywhere in their
//! root (`/tmp`, `/var/tmp`, `/root`, `/paperclip-workspace`) and what the
//! server writes there for it (Files API uploads, staged input). Deleting
//! the sandbox unmounts the file system (lazily: a descriptor still open
//! keeps it until closed) and removes the image; a server killed without
//! a shutdown leaves that to its death guard ([`crate::deathguard`]).
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
//! # Elsewhere
//! A server that is not root, or a host without loop devices or
//! `mkfs.ext4`, gives sandboxes no disk of their own (checked once at
//! start, logged): their roots are plain directories of the data
//! directory, without a size limit.

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
    crate::isolation::find_in_path(name).or_else(|| {
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

/// Whether sandboxes can get a disk of their own here: tries one (of
/// [`MIN_SANDBOX_DISK`]) in `data_dir`. `Err` says why not.
pub fn probe(data_dir: &Path) -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("the server is not root (mounting a sandbox disk needs root)".to_string());
    }
    let probe = data_dir.join(".disk-probe");
    let result = attach(&probe, MIN_SANDBOX_DISK).map_err(|e| e.to_string());
    detach(&probe);
    let _ = std::fs::remove_dir(&probe);
    result
}

/// Serializes admission and creation of disks, so that two creations at
/// once cannot both take the last room.
fn creating() -> &'static Mutex<()> {
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
fn admit(data_dir: &Path, size: u64) -> Result<(), crate::budgets::Refusal> {
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
    Err(crate::budgets::Refusal {
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
    Refused(crate::budgets::Refusal),
    /// The server failed (a 500).
    Io(std::io::Error),
}

/// Makes the sandbox root `root`: with a disk of `disk` bytes of its own
/// when given (admitted first, see [`admit`]), then its directories
/// ([`crate::rootfs::prepare_root`]). Nothing is left behind on failure.
pub fn prepare(root: &Path, disk: Option<u64>) -> Result<(), PrepareError> {
    if let Some(size) = disk {
        let data_dir = root.parent().unwrap_or(Path::new("/"));
        let image = {
            // Admission and the image's creation are one step; making and
            // mounting the file system need not be.
            let _creating = creating().lock().unwrap_or_else(|p| p.into_inner());
            admit(data_dir, size).map_err(PrepareError::Refused)?;
            create_image(root, size).map_err(PrepareError::Io)?
        };
        format_and_mount(root, &image).map_err(PrepareError::Io)?;
    }
    crate::rootfs::prepare_root(root).map_err(|e| {
        if detach(root) {
            let _ = std::fs::remove_dir(root);
        }
        PrepareError::Io(e)
    })
}

/// Creates the image of `root` (`size` bytes, sparse), makes an ext4 file
/// system in it and mounts it on `root` (created if needed).
pub fn attach(root: &Path, size: u64) -> std::io::Result<()> {
    let image = create_image(root, size)?;
    format_and_mount(root, &image)
}

/// The empty sparse image file of `root`, `size` bytes.
fn create_image(root: &Path, size: u64) -> std::io::Result<PathBuf> {
    let image = image_of(root).ok_or_else(|| std::io::Error::other("no image path"))?;
    if let Some(dir) = image.parent() {
        std::fs::create_dir_all(dir)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&image)?;
    if let Err(e) = file.set_len(size.max(MIN_SANDBOX_DISK)) {
        drop(file);
        let _ = std::fs::remove_file(&image);
        return Err(e);
    }
    Ok(image)
}

/// Makes an ext4 file system in `image` and mounts it on `root`; the image
/// is removed on failure.
fn format_and_mount(root: &Path, image: &Path) -> std::io::Result<()> {
    let tools = find_tool("mkfs.ext4")
        .ok_or_else(|| std::io::Error::other("mkfs.ext4 not found"))
        .and_then(|mkfs| {
            find_tool("mount")
                .map(|mount| (mkfs, mount))
                .ok_or_else(|| std::io::Error::other("mount not found"))
        });
    let result = tools.and_then(|(mkfs, mount)| {
        run(
            Command::new(mkfs)
                .args(["-q", "-F", "-m", "0", "-O", "^has_journal"])
                // An inode per 4 KiB: trees of many small files
                // (`node_modules`, a 100 000-level directory chain) run
                // out of space, not of inodes, first.
                .args(["-i", "4096"])
                .args(["-E", "nodiscard,lazy_itable_init=1", "-L", "sandbox"])
                .arg(image),
            "mkfs.ext4",
        )?;
        std::fs::create_dir_all(root)?;
        run(
            Command::new(mount)
                .args(["-o", "loop,nosuid,nodev,noatime"])
                .arg(image)
                .arg(root),
            "mount",
        )
    });
    match result {
        Ok(()) => {
            let _ = std::fs::remove_dir(root.join("lost+found"));
            crate::deathguard::unmount_on_death(root, image);
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_file(image);
            // Only an empty directory (never a mounted one) goes.
            let _ = std::fs::remove_dir(root);
            Err(e)
        }
    }
}

/// Removes `path` and everything under it ([`crate::fstree::remove_tree`]),
/// a sandbox root with a disk of its own detached first: the disk goes
/// whole.
pub fn remove_tree(path: &Path) -> std::io::Result<()> {
    detach(path);
    crate::fstree::remove_tree(path)
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
    if let Ok(path) = std::ffi::CString::new(root.as_os_str().as_encoded_bytes()) {
        // SAFETY: a plain system call on a NUL-terminated path we own.
        unsafe {
            libc::umount2(path.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW);
        }
    }
    let _ = std::fs::remove_file(&image);
    crate::deathguard::forget_unmount(root, &image);
    true
}

/// Parses a size such as `2G`, `512M`, `65536K` or `1073741824` (binary
/// units; `0` = no disk of its own).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let shift = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => {
            return Err(format!(
                "invalid size {text:?}: expected a number with K, M, G or T, for example 2G"
            ))
        }
    };
    let n: u64 = digits.parse().map_err(|_| {
        format!("invalid size {text:?}: expected a number with K, M, G or T, for example 2G")
    })?;
    let bytes = n
        .checked_shl(shift)
        .filter(|b| b >> shift == n)
        .ok_or_else(|| format!("size {text:?} is too large"))?;
    if bytes != 0 && bytes < MIN_SANDBOX_DISK {
        return Err(format!(
            "size {text:?} is too small: a sandbox disk needs at least 16M (or 0 for none)"
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

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
