//! Forks and templates (issue 43): a paused sandbox's files copied into
//! a new sandbox, or kept under a name for sandboxes made later.
//!
//! What is copied is the sandbox's file tree (its root, on its own disk
//! where it has one), with `cp -a --reflink=auto`: owners, modes, links
//! and times kept, blocks shared where the file system has reflinks. The
//! copy goes into a root made as any other ([`crate::storage::disk::prepare`]),
//! so a fork has a disk of its own of the engine's size, and a tree that
//! does not fit there is an error, never a disk of the host filled.
//!
//! As root each sandbox's files belong to its own range of host ids
//! ([`crate::trees::id_map`]): a copy is moved from the source's range
//! to the new sandbox's ([`remap_owners`]), so uid 1001 inside the source
//! is uid 1001 inside the fork. A template keeps its files in range 0
//! (the ids as seen inside), in `.templates/NAME` beside the sandboxes'
//! roots, readable by root alone.
//!
//! Only a paused sandbox is copied (its processes are frozen, nothing
//! writes): the faces answer 409 otherwise.

use std::path::{Path, PathBuf};

/// Most templates one engine keeps.
pub const MAX_TEMPLATES: usize = 32;

/// Where the templates of the engine whose sandboxes live in `data_dir`
/// are kept.
pub fn dir_of(data_dir: &Path) -> PathBuf {
    data_dir.join(".templates")
}

/// Checks a template name: 1 to 64 of `a-z A-Z 0-9 . _ -`, not starting
/// with `.`.
pub fn check_name(name: &str) -> Result<(), BadTemplateName> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(BadTemplateName {
            name: name.to_string(),
        })
    }
}

/// A template name [`check_name`] refuses (a 400 on both faces).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "template name {name:?} must be 1 to 64 letters, digits, '.', '_' or '-', not starting \
     with '.'"
)]
pub struct BadTemplateName {
    /// The name as given.
    pub name: String,
}

/// The templates kept, by name, oldest first: `(name, created, bytes)`,
/// `created` when [`capture`] made it.
pub fn list(data_dir: &Path) -> Vec<(String, std::time::SystemTime, u64)> {
    let Ok(entries) = std::fs::read_dir(dir_of(data_dir)) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            check_name(&name).ok()?;
            let created = e.metadata().ok()?.modified().ok()?;
            Some((name, created, tree_bytes(&e.path())))
        })
        .collect();
    out.sort_by_key(|(_, created, _)| *created);
    out
}

fn tree_bytes(path: &Path) -> u64 {
    walkdir::WalkDir::new(path)
        .into_iter()
        .filter_map(Result::ok)
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// The first host uid and gid of the sandbox at `root`'s range, where
/// each sandbox has one (a root server); `None` elsewhere.
fn range_of(root: &Path) -> Option<(u32, u32)> {
    crate::trees::id_map::sandbox_owner(root)
}

/// Copies the tree under `from` into the existing directory `to`
/// (`cp -a --reflink=auto`); `to` itself keeps its own owner and mode
/// (`cp -a` would give it those of `from`, and a root's owner says whose
/// ids the sandbox runs as).
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let own = std::fs::symlink_metadata(to)?;
    copy_entries(from, to)?;
    std::os::unix::fs::lchown(to, Some(own.uid()), Some(own.gid()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(own.mode() & 0o7777))
}

fn copy_entries(from: &Path, to: &Path) -> std::io::Result<()> {
    let out = std::process::Command::new("cp")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .args(["-a", "--reflink=auto", "--"])
        .arg(from.join("."))
        .arg(to)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr);
    let said: String = said.lines().take(3).collect::<Vec<_>>().join("; ");
    Err(std::io::Error::other(format!(
        "copying the files failed ({}): {said}",
        out.status
    )))
}

/// Moves every owner and group of the tree at `tree` that lies in
/// `from..from + IDS_PER_SANDBOX` to the same place in the range that
/// starts at `to` (uids and gids alike); links are changed, never
/// followed.
pub fn remap_owners(tree: &Path, from: (u32, u32), to: (u32, u32)) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let span = crate::trees::id_map::IDS_PER_SANDBOX;
    let moved =
        |id: u32, from: u32, to: u32| (id >= from && id - from < span).then(|| to + (id - from));
    for entry in walkdir::WalkDir::new(tree) {
        let entry = entry.map_err(std::io::Error::other)?;
        let meta = entry.metadata().map_err(std::io::Error::other)?;
        let uid = moved(meta.uid(), from.0, to.0);
        let gid = moved(meta.gid(), from.1, to.1);
        if uid.is_some() || gid.is_some() {
            std::os::unix::fs::lchown(entry.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// Copies the files of the paused sandbox at `source` into the new root
/// `root` (made already, see the module docs).
pub fn fork_into(source: &Path, root: &Path) -> std::io::Result<()> {
    let to = range_of(root);
    copy_tree(source, root)?;
    if let (Some(from), Some(to)) = (range_of(source), to) {
        remap_owners(root, from, to)?;
    }
    Ok(())
}

/// Keeps the files of the paused sandbox at `source` as template `name`
/// of the engine at `data_dir`. `Err` with a reason a person can act
/// on: a name in use, too many templates, a copy that failed (nothing is
/// left of it).
pub fn capture(data_dir: &Path, name: &str, source: &Path) -> Result<(), CaptureError> {
    check_name(name).map_err(|e| CaptureError::Refused(e.to_string()))?;
    let dir = dir_of(data_dir);
    std::fs::create_dir_all(&dir).map_err(CaptureError::Io)?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
    }
    if list(data_dir).len() >= MAX_TEMPLATES {
        return Err(CaptureError::Refused(format!(
            "this engine keeps at most {MAX_TEMPLATES} templates: delete one first"
        )));
    }
    let target = dir.join(name);
    match std::fs::create_dir(&target) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(CaptureError::Exists(format!(
                "a template named {name:?} exists already"
            )))
        }
        Err(e) => return Err(CaptureError::Io(e)),
    }
    let made = copy_tree(source, &target)
        .and_then(|()| match range_of(source) {
            Some(from) => remap_owners(&target, from, (0, 0)),
            None => Ok(()),
        })
        .and_then(|()| stamp_created(&target));
    if let Err(e) = made {
        let _ = crate::storage::fstree::remove_tree(&target);
        return Err(CaptureError::Io(e));
    }
    // The name lives again: no longer one of the deleted.
    let _ = std::fs::remove_file(deleted_dir_of(data_dir).join(name));
    Ok(())
}

/// Marks the template at `dir` as made now: its modification time is what
/// [`list`] reports as created (the copy carries the source's time).
fn stamp_created(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.set_modified(std::time::SystemTime::now())
}

/// Why a template was not captured.
#[derive(Debug)]
pub enum CaptureError {
    /// A bad name or too many templates (a 400 or 429).
    Refused(String),
    /// The name is taken (a 409).
    Exists(String),
    /// The copy failed (a 500).
    Io(std::io::Error),
}

/// Copies template `name` of the engine at `data_dir` into the new root
/// `root`; `Ok(false)` when there is no such template.
pub fn instantiate(data_dir: &Path, name: &str, root: &Path) -> std::io::Result<bool> {
    if check_name(name).is_err() {
        return Ok(false);
    }
    let template = dir_of(data_dir).join(name);
    if !template.is_dir() {
        return Ok(false);
    }
    let to = range_of(root);
    copy_tree(&template, root)?;
    if let Some(to) = to {
        remap_owners(root, (0, 0), to)?;
    }
    Ok(true)
}

/// Whether template `name` exists.
pub fn exists(data_dir: &Path, name: &str) -> bool {
    check_name(name).is_ok() && dir_of(data_dir).join(name).is_dir()
}

/// Where the engine at `data_dir` marks the templates it deleted: a face
/// that takes unknown image names as they are (Daytona's `snapshot`) must
/// still refuse the name of a template that is gone, or a sandbox asked
/// of a deleted template would start empty, silently.
fn deleted_dir_of(data_dir: &Path) -> PathBuf {
    data_dir.join(".templates-deleted")
}

/// Whether `name` is a template this engine made and then deleted (and
/// did not make again).
pub fn was_deleted(data_dir: &Path, name: &str) -> bool {
    check_name(name).is_ok()
        && !exists(data_dir, name)
        && deleted_dir_of(data_dir).join(name).exists()
}

/// Deletes template `name`; `Ok(false)` when there is none. Sandboxes
/// made from it keep their own copies. The name is marked deleted first
/// ([`was_deleted`]): a mark that cannot be written leaves the template
/// in place.
pub fn delete(data_dir: &Path, name: &str) -> std::io::Result<bool> {
    if !exists(data_dir, name) {
        return Ok(false);
    }
    let marks = deleted_dir_of(data_dir);
    std::fs::create_dir_all(&marks)?;
    std::fs::File::create(marks.join(name))?;
    crate::storage::fstree::remove_tree(&dir_of(data_dir).join(name))?;
    Ok(true)
}
