//! Durable records of the sandboxes an engine created, so that a successor
//! on the same state directory can prove a dead engine's sandboxes gone
//! (or say that it cannot), see [`crate::ServerBuilder::state_dir`].
//!
//! # What is written
//! One small JSON file per sandbox, `<state>/sandboxes/<id>.json`, written
//! atomically (a temporary file, `fsync`, `rename`, `fsync` of the
//! directory) before the create is answered: the id, its face, its root
//! and data directory, its host uid (a root server), and every process
//! tree of it the engine started that the engine's death guard names: a
//! PID namespace as its init (host pid and start time) and the namespace's
//! identity (`st_dev` and `st_ino` of `/proc/PID/ns/pid`), or a process
//! group (leader, start time, the per-process marker). A delete that
//! confirmed every process gone ends the record: on a state directory with
//! a complete history (see below) the file is removed, since an id the
//! directory does not hold is a 404 there; on one without, it is kept,
//! marked `deleted`: it is what proves a later 404.
//!
//! # What a successor does
//! At start ([`Records::open`]) every record not marked deleted is
//! verified ([`verify`]): a namespace whose init is still that init is
//! killed (SIGKILL to the init and to every process seen in it: the
//! kernel ends the namespace with its init), then `/proc` is scanned until
//! no process is in it (bounded); a group is killed while its leader is
//! still that leader; every process still carrying the sandbox's uid must
//! be gone too. Only then is the sandbox *proven gone*: its record is marked
//! deleted, its files are removed, and the API answers 404 for it. When
//! something cannot be proven (a process still there after the wait, a
//! tree without identity), the sandbox is *unconfirmed*: the API answers
//! 500 for it (as for a delete whose processes survived), never 404, and a
//! DELETE tries again.
//!
//! # Ids never recorded
//! Ids are random and each is recorded before its create is answered, so
//! a state directory that has recorded since it was made knows every id
//! issued on it: an unknown id is a 404. A state directory this engine did
//! not make itself ([`HISTORY`] missing: an embedder made it to say that
//! engines before it kept no records) cannot tell: an unknown id is then
//! answered 500 `unconfirmed` too.
//!
//! # Limits
//! A tree is recorded right after it is started (the death guard learns it
//! at the same moment): an engine killed in between leaves a tree no
//! record names. On a root server the sandbox's own uid still finds it;
//! without root, nothing does.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::storage::disk::DiskStillInUse;
use crate::trees::deathguard::Guarded;
use crate::trees::procfs::{self, ProcInfo};

/// The file that says the state directory has recorded every sandbox
/// since it was made (written by the engine that made it).
pub const HISTORY: &str = "complete-history";

/// How long a successor waits for a predecessor's processes to be gone.
pub const VERIFY_WAIT: Duration = Duration::from_secs(5);

/// Which API face created a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Face {
    /// `/v1/sandboxes`.
    CreateOs,
    /// `/daytona/api/sandbox`.
    Daytona,
}

/// A process tree of a sandbox, named so that a successor can find it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum TreeId {
    /// A PID namespace.
    Namespace {
        /// Host pid of its init.
        init_pid: i32,
        /// The init's start time (clock ticks since boot); `None` when the
        /// init was already gone when the tree was recorded.
        init_start: Option<u64>,
        /// `st_dev` of `/proc/PID/ns/pid` (`None`: not read).
        dev: Option<u64>,
        /// `st_ino` of `/proc/PID/ns/pid`: the namespace inode.
        ino: u64,
    },
    /// A process group (process-group mode, no isolation).
    Group {
        /// The leader's pid (= group and session id).
        leader: i32,
        /// The leader's start time.
        start: u64,
        /// The `CREATEOS_LOCAL_MARKER=...` entry of its processes.
        marker: String,
    },
}

/// One sandbox as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Its id.
    pub id: String,
    /// The face that created it.
    pub face: Face,
    /// Its root directory.
    pub root: PathBuf,
    /// The data directory its root is in.
    pub data_dir: PathBuf,
    /// Whether that data directory was the engine's own temporary one
    /// (removed at shutdown).
    pub owned_data_dir: bool,
    /// Its owner's host uid (a root server): the first of its range of ids
    /// ([`crate::trees::id_map::IdRange::of_owner`]; a lone uid in records of
    /// engines before the ranges).
    pub uid: Option<u32>,
    /// Its process trees.
    #[serde(default)]
    pub trees: Vec<TreeId>,
    /// A delete confirmed every process gone.
    #[serde(default)]
    pub deleted: bool,
}

/// What a successor found of a predecessor's sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No process of it is left (proven by a fresh scan).
    Gone,
    /// Not proven gone: why.
    Unconfirmed(Unconfirmed),
}

/// Why a predecessor's sandbox is not proven gone: what may still run or
/// hold its disk, with the host pids a person can check (`ps -p PID`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unconfirmed {
    /// Processes of one of its recorded trees outlived the wait.
    #[error("host pids {} still run in one of its process trees", pids_text(.pids))]
    TreesRun {
        /// Their host pids.
        pids: Vec<i32>,
    },
    /// Its namespace's init is there but could not be read (out of
    /// descriptors).
    #[error("its init, host pid {init_pid}, could not be read")]
    InitUnread {
        /// The init's host pid.
        init_pid: i32,
    },
    /// The scan of its trees could not be made.
    #[error("its processes could not be listed ({source})")]
    Unlisted {
        /// Why (out of descriptors, for example).
        source: Arc<std::io::Error>,
    },
    /// Processes of its own ids outlived the wait.
    #[error("host pids {} still run as its {ids}", pids_text(.pids))]
    IdsRun {
        /// Its ids.
        ids: crate::trees::id_map::IdRange,
        /// Their host pids.
        pids: Vec<i32>,
    },
    /// The scan of its ids could not be made.
    #[error("the processes of its {ids} could not be listed ({source})")]
    IdsUnlisted {
        /// Its ids.
        ids: crate::trees::id_map::IdRange,
        /// Why.
        source: Arc<std::io::Error>,
    },
    /// Its processes are gone; its disk is still attached.
    #[error(transparent)]
    Disk(Arc<DiskStillInUse>),
}

/// Two reasons are the same when they say the same (an I/O error has no
/// equality of its own).
impl PartialEq for Unconfirmed {
    fn eq(&self, other: &Unconfirmed) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for Unconfirmed {}

fn pids_text(pids: &[i32]) -> String {
    pids.iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The records of one engine (one state directory).
#[derive(Debug)]
pub struct Records {
    dir: PathBuf,
    /// `lock` in the state directory, held while the engine runs: two
    /// engines on one state directory would kill each other's sandboxes.
    lock: std::fs::File,
    complete: bool,
    /// This engine's sandboxes, by id.
    own: Mutex<HashMap<String, Record>>,
    /// Predecessors' sandboxes not proven gone, by id: why.
    unconfirmed: Mutex<HashMap<String, Record>>,
    /// Every id recorded on this state directory before this engine.
    known: Mutex<std::collections::HashSet<String>>,
    /// This engine's recorded sandboxes by root, while it runs (for the
    /// places that start trees and know only the root, see
    /// [`Records::note_tree`]).
    roots: Mutex<HashMap<PathBuf, String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Records {
    /// Opens (or makes) the state directory `dir`, locks it, and verifies
    /// every sandbox its predecessors did not see deleted (see the module
    /// docs): what is proven gone has its record ended and its files removed.
    pub fn open(dir: &Path) -> std::io::Result<Arc<Records>> {
        let made = !dir.exists();
        std::fs::create_dir_all(dir.join("sandboxes"))?;
        if made {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            write_atomic(
                &dir.join(HISTORY),
                b"every sandbox since this directory was made\n",
            )?;
        }
        let complete = dir.join(HISTORY).is_file();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!(
                        "another engine keeps its records in {}; nothing was started",
                        dir.display()
                    ),
                ))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        let records = Arc::new(Records {
            dir: dir.to_path_buf(),
            lock: file,
            complete,
            own: Mutex::new(HashMap::new()),
            unconfirmed: Mutex::new(HashMap::new()),
            known: Mutex::new(Default::default()),
            roots: Mutex::new(HashMap::new()),
        });
        records.recover_interrupted_writes();
        let mut open = Vec::new();
        for record in records.read_all()? {
            if record.deleted {
                if complete {
                    // Written by an engine before deleted records were
                    // removed (see `forget_or_write`).
                    let _ = records.forget_or_write(&record);
                    continue;
                }
            } else {
                open.push(record.clone());
            }
            lock(&records.known).insert(record.id);
        }
        // First every sandbox is looked at once (and what is provably its
        // own is killed), then the ones not yet gone are waited for, all
        // within one bound: many sandboxes do not add up their waits.
        let deadline = Instant::now() + VERIFY_WAIT;
        let mut pending = Vec::new();
        for record in open {
            match verify(&record, Duration::ZERO) {
                Verdict::Gone if records.settle(&record, Duration::ZERO).is_ok() => {}
                _ => pending.push(record),
            }
        }
        // A lazy unmount completes once nothing holds the file system: the
        // disks get their own bound after the processes'.
        let disk_deadline = deadline + VERIFY_WAIT;
        for record in pending {
            let left = deadline.saturating_duration_since(Instant::now());
            let verdict = match verify(&record, left) {
                Verdict::Gone => match records.settle(
                    &record,
                    disk_deadline.saturating_duration_since(Instant::now()),
                ) {
                    Ok(()) => Verdict::Gone,
                    Err(disk) => Verdict::Unconfirmed(Unconfirmed::Disk(Arc::new(disk))),
                },
                unconfirmed => unconfirmed,
            };
            match verdict {
                Verdict::Gone => {}
                Verdict::Unconfirmed(why) => {
                    // Said even when quiet: something may still run.
                    eprintln!(
                        "createos-local: sandbox {} of an engine that ended before this one is \
                         not proven gone ({why}); check them with `ps -p PID`. It is answered \
                         500, never 404, until a DELETE of it (`sandbox lease destroy`) proves \
                         it gone",
                        record.id
                    );
                    lock(&records.unconfirmed).insert(record.id.clone(), record);
                }
            }
        }
        Ok(records)
    }

    /// Every record in the directory (unreadable ones are an error: they
    /// may name a sandbox that runs).
    fn read_all(&self) -> std::io::Result<Vec<Record>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(self.dir.join("sandboxes"))? {
            let path = entry?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let text = std::fs::read(&path)?;
            let record: Record = serde_json::from_slice(&text).map_err(|e| {
                std::io::Error::other(format!("the record {} is unreadable: {e}", path.display()))
            })?;
            out.push(record);
        }
        Ok(out)
    }

    /// A record whose write a killed engine did not finish is a temporary
    /// file beside the records (see [`write_atomic`]). One that holds a
    /// whole record takes its place when there is none (the sandbox's
    /// creation got that far, so it is proven gone like any other); a
    /// partial one goes (its creation stopped before the record, so
    /// nothing of it ran). Run while this engine holds the lock: no
    /// writer of them is alive.
    fn recover_interrupted_writes(&self) {
        let Ok(entries) = std::fs::read_dir(self.dir.join("sandboxes")) else {
            return;
        };
        for path in entries.flatten().map(|e| e.path()) {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if !(name.starts_with('.') && name.contains(".json.tmp-")) {
                continue;
            }
            let whole = std::fs::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Record>(&bytes).ok());
            match whole {
                Some(record) if !self.path_of(&record.id).exists() => {
                    let _ = std::fs::rename(&path, self.path_of(&record.id));
                }
                _ => {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
    }

    fn path_of(&self, id: &str) -> PathBuf {
        self.dir.join("sandboxes").join(format!("{id}.json"))
    }

    fn write(&self, record: &Record) -> std::io::Result<()> {
        let text = serde_json::to_vec(record).map_err(std::io::Error::other)?;
        write_atomic(&self.path_of(&record.id), &text)
    }

    /// Ends the record of a sandbox proven gone. On a complete history the
    /// file is removed: an id the directory does not hold is a 404 there
    /// anyway, so deleted records would only pile up (one per sandbox
    /// ever, all read at each start). Otherwise it is kept, marked
    /// deleted: there it is what proves a later 404. (A removal lost to a
    /// crash leaves the record as it was: the next engine proves it gone
    /// again.)
    fn forget_or_write(&self, record: &Record) -> std::io::Result<()> {
        if !self.complete {
            return self.write(record);
        }
        match std::fs::remove_file(self.path_of(&record.id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// A predecessor's sandbox whose processes are proven gone: its disk is
    /// proven detached (no mount on its root, no loop device on its image;
    /// a successor once ended the record of a sandbox whose loop device was
    /// still attached), then its record ended (a failure to write is
    /// harmless, the next engine proves it again) and its files removed.
    /// `Err` says what still holds the disk after `wait`: the sandbox
    /// stays unconfirmed.
    fn settle(&self, record: &Record, wait: Duration) -> Result<(), DiskStillInUse> {
        // Only a sandbox root (named after its id) is ever removed.
        let name = record.root.file_name().and_then(|n| n.to_str());
        let is_root = name == Some(record.id.as_str())
            || name == Some(format!("daytona-{}", record.id).as_str());
        let is_root = is_root && record.root.parent() == Some(record.data_dir.as_path());
        if is_root {
            crate::storage::disk::detach_proven(&record.root, wait)?;
        }
        let mut done = record.clone();
        done.deleted = true;
        let _ = self.forget_or_write(&done);
        // Proven gone: its groups are empty and go too.
        if let Some(uid) = record.uid {
            crate::trees::process_limits::remove_sandbox_groups(uid);
        }
        if !is_root {
            return Ok(());
        }
        let _ = crate::storage::disk::remove_tree(&record.root);
        let _ = crate::storage::disk::remove_tree(
            &record.data_dir.join(format!(".removing-{}", record.id)),
        );
        if record.owned_data_dir {
            // The dead engine's own temporary directory goes once nothing
            // of it is left unproven.
            let others = lock(&self.unconfirmed)
                .values()
                .any(|r| r.data_dir == record.data_dir);
            let sandboxes = std::fs::read_dir(&record.data_dir)
                .map(|d| {
                    d.flatten().any(|e| {
                        let name = e.file_name().to_string_lossy().to_string();
                        name.starts_with("sb-") || name.starts_with("daytona-")
                    })
                })
                .unwrap_or(false);
            if !others && !sandboxes {
                crate::storage::disk::remove_template(&record.data_dir);
                crate::storage::rootfs::remove_etc(&record.data_dir);
                let _ = crate::storage::disk::remove_tree(&record.data_dir);
            }
        }
        Ok(())
    }

    /// Lets a successor open the state directory (the engine stopped).
    pub fn release(&self) {
        lock(&self.roots).clear();
        let _ = self.lock.unlock();
    }

    /// Records a new sandbox (durably) before its create is answered.
    pub fn created(
        self: &Arc<Self>,
        id: &str,
        face: Face,
        root: &Path,
        data_dir: &Path,
        owned_data_dir: bool,
    ) -> std::io::Result<()> {
        let record = Record {
            id: id.to_string(),
            face,
            root: root.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            owned_data_dir,
            uid: crate::trees::host_processes::sandbox_uid(root),
            trees: Vec::new(),
            deleted: false,
        };
        let mut own = lock(&self.own);
        self.write(&record)?;
        own.insert(id.to_string(), record);
        drop(own);
        lock(&self.roots).insert(root.to_path_buf(), id.to_string());
        Ok(())
    }

    /// Marks a sandbox deleted (every process confirmed gone).
    pub fn deleted(&self, id: &str) {
        let mut own = lock(&self.own);
        if let Some(mut record) = own.remove(id) {
            record.deleted = true;
            if let Err(e) = self.forget_or_write(&record) {
                eprintln!(
                    "createos-local: could not mark sandbox {id} deleted in its record ({e}); \
                     the next engine proves it gone again"
                );
            }
            lock(&self.roots).remove(&record.root);
            lock(&self.known).insert(id.to_string());
        }
    }

    /// Adds a tree to the record of the sandbox `id`.
    fn add_tree(&self, id: &str, tree: TreeId) {
        let mut own = lock(&self.own);
        let Some(record) = own.get_mut(id) else {
            return;
        };
        if record.trees.contains(&tree) {
            return;
        }
        record.trees.push(tree);
        if let Err(e) = self.write(record) {
            eprintln!(
                "createos-local: could not record a process tree of sandbox {id} ({e}); if this \
                 engine dies, its successor may not prove that sandbox gone"
            );
        }
    }

    /// What the API answers for `id`, which no live sandbox of this engine
    /// has: `None` for 404 (proven gone, or never issued on this state
    /// directory), else the reason it cannot be called gone.
    pub fn unproven(&self, id: &str) -> Option<Unproven> {
        if let Some(record) = lock(&self.unconfirmed).get(id) {
            return Some(Unproven::Predecessor {
                id: record.id.clone(),
            });
        }
        if !self.complete && !lock(&self.known).contains(id) && !lock(&self.own).contains_key(id) {
            return Some(Unproven::Unknown { id: id.to_string() });
        }
        None
    }

    /// A DELETE of a predecessor's sandbox not proven gone: verifies it
    /// again. `Ok(true)`: proven gone now; `Ok(false)`: not a sandbox this
    /// engine holds unproven; `Err`: still not proven.
    pub fn retry(&self, id: &str) -> Result<bool, StillUnproven> {
        let Some(record) = lock(&self.unconfirmed).get(id).cloned() else {
            return match self.unproven(id) {
                Some(why) => Err(why.into()),
                None => Ok(false),
            };
        };
        match verify(&record, VERIFY_WAIT) {
            Verdict::Gone => match self.settle(&record, crate::storage::disk::PROOF_WAIT) {
                Ok(()) => {
                    lock(&self.unconfirmed).remove(id);
                    Ok(true)
                }
                Err(source) => Err(StillUnproven::Disk {
                    id: id.to_string(),
                    source,
                }),
            },
            Verdict::Unconfirmed(why) => Err(StillUnproven::Processes {
                id: id.to_string(),
                why,
            }),
        }
    }
}

/// Why the API cannot call a sandbox id gone that no live sandbox of this
/// engine has (see [`Records::unproven`]): the faces answer it 500
/// `unconfirmed`, never 404.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unproven {
    /// A predecessor's sandbox whose processes were not proven gone.
    #[error(
        "sandbox {id} belonged to an engine that ended before this one, and this engine could \
         not prove that its processes are gone; they may still run. A DELETE tries again"
    )]
    Predecessor {
        /// The sandbox's id.
        id: String,
    },
    /// An id a state directory without a complete history cannot place.
    #[error(
        "this engine does not know sandbox {id}: an engine that kept no records may have \
         created it, so it cannot be called gone"
    )]
    Unknown {
        /// The id asked for.
        id: String,
    },
}

/// Why a DELETE of a predecessor's sandbox (see [`Records::retry`]) still
/// cannot call it gone: it stays unconfirmed and a later DELETE tries
/// again.
#[derive(Debug, thiserror::Error)]
pub enum StillUnproven {
    /// Not a sandbox this engine holds unproven, and not one it can place.
    #[error(transparent)]
    Unproven(#[from] Unproven),
    /// Its processes are gone; its disk is still attached.
    #[error(
        "sandbox {id} belonged to an engine that ended before this one; its processes are gone \
         but its disk is not proven detached: {source}"
    )]
    Disk {
        /// The sandbox's id.
        id: String,
        /// What still holds its disk.
        source: DiskStillInUse,
    },
    /// Processes of it may still run.
    #[error(
        "sandbox {id} belonged to an engine that ended before this one and is still not proven \
         gone: {why}"
    )]
    Processes {
        /// The sandbox's id.
        id: String,
        /// What was found (the host pids, or why they could not be listed).
        why: Unconfirmed,
    },
}

impl Records {
    /// Notes a tree the engine just started in the sandbox at `root` (a
    /// no-op when that sandbox is not recorded, or the engine stopped).
    pub fn note_tree(&self, root: &Path, tree: &Guarded, marker: Option<&str>) {
        let Some(id) = lock(&self.roots).get(root).cloned() else {
            return;
        };
        self.add_tree(&id, tree_id(tree, marker));
    }
}

/// How a record names `tree`, a tree just started.
fn tree_id(tree: &Guarded, marker: Option<&str>) -> TreeId {
    match *tree {
        Guarded::Namespace { init_pid, ns } => {
            let start = procfs::stat(init_pid).map(|p| p.starttime);
            let identity = namespace_identity(init_pid);
            let alive = identity.is_some_and(|(_, ino)| ino == ns);
            TreeId::Namespace {
                init_pid,
                init_start: start.filter(|_| alive),
                dev: identity.filter(|_| alive).map(|(dev, _)| dev),
                ino: ns,
            }
        }
        Guarded::Group { leader, starttime } => TreeId::Group {
            leader,
            start: starttime,
            marker: format!(
                "{}={}",
                crate::trees::host_processes::MARKER_VAR,
                marker.unwrap_or_default()
            ),
        },
    }
}

/// `(st_dev, st_ino)` of `/proc/PID/ns/pid`.
pub fn namespace_identity(pid: i32) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?;
    Some((meta.dev(), meta.ino()))
}

/// Writes `bytes` to `path` atomically: a temporary file beside it,
/// `fsync`, `rename`, `fsync` of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("record"),
        crate::util::random_hex(4)
    ));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Whether the namespace init a record names is still that init.
fn init_alive(
    init_pid: i32,
    init_start: Option<u64>,
    dev: Option<u64>,
    ino: u64,
) -> Option<ProcInfo> {
    let (start, dev) = (init_start?, dev?);
    let info = procfs::stat(init_pid)?;
    (info.starttime == start
        && !info.is_zombie()
        && namespace_identity(init_pid) == Some((dev, ino)))
    .then_some(info)
}

/// Live processes in the namespace `(dev, ino)` (`dev` unknown: by
/// inode); `Err` when the scan could not be made (out of descriptors).
fn in_namespace(dev: Option<u64>, ino: u64) -> Result<Vec<ProcInfo>, Unconfirmed> {
    Ok(procfs::try_live_in_namespace(ino)
        .map_err(|e| Unconfirmed::Unlisted {
            source: Arc::new(e),
        })?
        .into_iter()
        .filter(|p| dev.is_none() || namespace_identity(p.pid).is_none_or(|(d, _)| Some(d) == dev))
        .collect())
}

/// Proves every process of `record` gone, killing what is provably its own,
/// within `wait` (see the module docs).
pub fn verify(record: &Record, wait: Duration) -> Verdict {
    use rustix::process::Signal;
    let deadline = Instant::now() + wait;
    for tree in &record.trees {
        // The outer bwrap of a machine (its init's parent on the host),
        // seen while the init lived: gone only once it is too (a server
        // that is not root has no uid to find it by).
        let mut outer: Option<ProcInfo> = None;
        loop {
            // `Err`: no scan could be made; that proves nothing.
            let left: Result<Vec<ProcInfo>, Unconfirmed> = match tree {
                TreeId::Namespace {
                    init_pid,
                    init_start,
                    dev,
                    ino,
                } => {
                    // The init as it is now, by pid and start time: also
                    // while it exits (its namespace link is gone before the
                    // kernel ends the rest of its namespace, and before its
                    // parent, the outer bwrap, sees it end).
                    let init_now = init_start
                        .and_then(|start| procfs::stat(*init_pid).filter(|p| p.starttime == start));
                    if outer.is_none() {
                        if let Some(init) = &init_now {
                            // Only while it is the init's parent: once
                            // it ended first, the init's parent is
                            // whichever process adopted it.
                            outer = procfs::stat(init.ppid).filter(|p| {
                                procfs::pid_namespace(p.pid) != Some(*ino)
                                    && procfs::binds_as_root(p.pid, &record.root)
                            });
                        }
                    }
                    if let Some(init) = init_alive(*init_pid, *init_start, *dev, *ino) {
                        // While its init lives the namespace is that very
                        // one: every process in it is the sandbox's.
                        for p in in_namespace(*dev, *ino).unwrap_or_default() {
                            crate::trees::host_processes::signal_verified(&p, Signal::KILL);
                        }
                        crate::trees::host_processes::signal_verified(&init, Signal::KILL);
                        Ok(vec![init])
                    } else if !procfs::is_dead(*init_pid)
                        && namespace_identity(*init_pid) == dev.map(|d| (d, *ino))
                    {
                        // Its init could not be read (out of descriptors)
                        // but is there: not proven gone.
                        Err(Unconfirmed::InitUnread {
                            init_pid: *init_pid,
                        })
                    } else {
                        // Its init is gone: the kernel ends the rest and
                        // lets nothing new in. What is still seen under
                        // the inode is waited for, never killed (an
                        // inode of a namespace gone may name a new one),
                        // and so is its outer bwrap, which exits with it.
                        in_namespace(*dev, *ino).map(|mut left| {
                            if let Some(exiting) = init_now.filter(|p| !p.is_zombie()) {
                                left.push(exiting);
                            }
                            if let Some(o) = &outer {
                                if let Some(now) = procfs::stat(o.pid)
                                    .filter(|p| p.starttime == o.starttime && !p.is_zombie())
                                {
                                    left.push(now);
                                }
                            }
                            left
                        })
                    }
                }
                TreeId::Group {
                    leader,
                    start,
                    marker,
                } => {
                    let leader_alive =
                        procfs::stat(*leader).filter(|p| p.starttime == *start && !p.is_zombie());
                    match procfs::try_all_pids() {
                        Err(e) => Err(Unconfirmed::Unlisted {
                            source: Arc::new(e),
                        }),
                        Ok(_) => {
                            let members: Vec<ProcInfo> = procfs::snapshot()
                                .into_iter()
                                .filter(|p| !p.is_zombie())
                                .filter(|p| {
                                    (leader_alive.is_some()
                                        && (p.pgid == *leader || p.sid == *leader))
                                        || procfs::environ_contains(p.pid, marker.as_bytes())
                                })
                                .collect();
                            for p in &members {
                                crate::trees::host_processes::signal_verified(p, Signal::KILL);
                            }
                            Ok(members)
                        }
                    }
                }
            };
            if left.as_ref().is_ok_and(|l| l.is_empty()) {
                break;
            }
            if Instant::now() >= deadline {
                return Verdict::Unconfirmed(match left {
                    Ok(left) => Unconfirmed::TreesRun {
                        pids: left.iter().map(|p| p.pid).collect(),
                    },
                    Err(why) => why,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // Every process of a sandbox has one of its ids: what still has one
    // may be a tree started just before the engine died (never recorded),
    // or a sandbox of another engine that drew the same range. Waited for,
    // never killed.
    if let Some(uid) = record.uid {
        let ids = crate::trees::id_map::IdRange::of_owner(uid);
        loop {
            let left = crate::trees::host_processes::live_of_ids_checked(ids);
            if left.as_ref().is_ok_and(|l| l.is_empty()) {
                break;
            }
            if Instant::now() >= deadline {
                return Verdict::Unconfirmed(match left {
                    Ok(left) => Unconfirmed::IdsRun {
                        ids,
                        pids: left.iter().map(|p| p.pid).collect(),
                    },
                    Err(e) => Unconfirmed::IdsUnlisted {
                        ids,
                        source: Arc::new(e),
                    },
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Verdict::Gone
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(trees: Vec<TreeId>) -> Record {
        Record {
            id: "sb-test".into(),
            face: Face::CreateOs,
            root: PathBuf::from("/nonexistent/sb-test"),
            data_dir: PathBuf::from("/nonexistent"),
            owned_data_dir: false,
            uid: None,
            trees,
            deleted: false,
        }
    }

    /// A process in a PID namespace of its own (`unshare --pid --fork`),
    /// as (the unshare child, the init's host pid, the tree id).
    fn namespace_with_sleep() -> (std::process::Child, TreeId) {
        let child = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child", "sleep", "1000"])
            .spawn()
            .expect("unshare");
        let outer = child.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(10);
        let init = loop {
            if let Some(&c) = procfs::children(outer).unwrap_or_default().first() {
                if namespace_identity(c) != namespace_identity(outer) {
                    break c;
                }
            }
            assert!(Instant::now() < deadline, "unshare did not fork");
            std::thread::sleep(Duration::from_millis(10));
        };
        let (dev, ino) = namespace_identity(init).expect("ns");
        let tree = TreeId::Namespace {
            init_pid: init,
            init_start: procfs::stat(init).map(|p| p.starttime),
            dev: Some(dev),
            ino,
        };
        (child, tree)
    }

    #[test]
    fn a_record_without_live_trees_is_gone() {
        let tree = TreeId::Namespace {
            init_pid: 1,
            init_start: Some(u64::MAX),
            dev: Some(0),
            ino: 1,
        };
        assert_eq!(
            verify(&record(vec![tree]), Duration::from_secs(1)),
            Verdict::Gone
        );
    }

    #[test]
    fn a_live_namespace_is_killed_before_it_is_called_gone() {
        if !rustix::process::geteuid().is_root() {
            test_support::skipped("unshare --pid needs root here");
            return;
        }
        let (mut child, tree) = namespace_with_sleep();
        let TreeId::Namespace { init_pid, ino, .. } = tree.clone() else {
            unreachable!()
        };
        assert!(!procfs::live_in_namespace(ino).is_empty());
        assert_eq!(
            verify(&record(vec![tree]), Duration::from_secs(10)),
            Verdict::Gone
        );
        assert!(procfs::live_in_namespace(ino).is_empty());
        assert!(procfs::stat(init_pid).is_none_or(|p| p.is_zombie()));
        let _ = child.wait();
    }

    #[test]
    fn a_group_is_killed_while_its_leader_is_that_leader() {
        use std::os::unix::process::CommandExt;
        let marker = format!("records-test-{}", crate::util::random_hex(4));
        let mut child = std::process::Command::new("sleep");
        child
            .arg("1000")
            .env(crate::trees::host_processes::MARKER_VAR, &marker)
            .process_group(0);
        let mut child = child.spawn().expect("sleep");
        let leader = child.id() as i32;
        let start = procfs::stat(leader).expect("stat").starttime;
        let tree = TreeId::Group {
            leader,
            start,
            marker: format!("{}={marker}", crate::trees::host_processes::MARKER_VAR),
        };
        assert_eq!(
            verify(&record(vec![tree]), Duration::from_secs(10)),
            Verdict::Gone
        );
        let status = child.wait().expect("wait");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn a_process_of_the_uid_left_is_unconfirmed() {
        // The test's own uid always has a live process: this one.
        let mut r = record(Vec::new());
        r.uid = Some(rustix::process::getuid().as_raw());
        match verify(&r, Duration::from_millis(100)) {
            Verdict::Unconfirmed(why) => {
                assert!(why.to_string().contains("still run as its uid"), "{why}")
            }
            Verdict::Gone => panic!("called gone while processes of its uid run"),
        }
    }

    #[test]
    fn records_survive_and_successors_settle_them() {
        let dir = std::env::temp_dir().join(format!("records-test-{}", crate::util::random_hex(4)));
        let root = dir.join("data/sb-one");
        std::fs::create_dir_all(&root).unwrap();
        {
            let records = Records::open(&dir.join("state")).unwrap();
            // A second engine on the same state directory is refused.
            assert!(Records::open(&dir.join("state")).is_err());
            records
                .created("sb-one", Face::CreateOs, &root, &dir.join("data"), false)
                .unwrap();
            records
                .created(
                    "sb-two",
                    Face::CreateOs,
                    &dir.join("data/sb-two"),
                    &dir.join("data"),
                    false,
                )
                .unwrap();
            records.deleted("sb-two");
            assert!(
                !dir.join("state/sandboxes/sb-two.json").exists(),
                "a complete history keeps no record of a deleted sandbox"
            );
            assert_eq!(records.unproven("sb-two"), None);
            assert_eq!(records.unproven("sb-never"), None);
        }
        let text = std::fs::read_to_string(dir.join("state/sandboxes/sb-one.json")).unwrap();
        let before: Record = serde_json::from_str(&text).unwrap();
        assert!(!before.deleted);
        // The successor proves sb-one gone (no tree, no uid), removes its
        // root and ends its record.
        let records = Records::open(&dir.join("state")).unwrap();
        assert_eq!(records.unproven("sb-one"), None);
        assert!(!root.exists());
        assert!(!dir.join("state/sandboxes/sb-one.json").exists());
        drop(records);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An engine killed while it wrote a record leaves the temporary file:
    /// a whole record is proven gone like any other (and then goes), a
    /// partial one is removed, and nothing of either stays.
    #[test]
    fn a_record_write_cut_short_by_a_kill_leaves_nothing_behind() {
        let dir = std::env::temp_dir().join(format!("records-test-{}", crate::util::random_hex(4)));
        // Made by the engine: a complete history, so a proven sandbox's
        // record goes rather than staying marked deleted.
        drop(Records::open(&dir).unwrap());
        let whole = Record {
            id: "sb-cut".into(),
            face: Face::CreateOs,
            root: dir.join("data/sb-cut"),
            data_dir: dir.join("data"),
            owned_data_dir: false,
            uid: None,
            trees: Vec::new(),
            deleted: false,
        };
        let sandboxes = dir.join("sandboxes");
        std::fs::write(
            sandboxes.join(".sb-cut.json.tmp-0a1b"),
            serde_json::to_vec(&whole).unwrap(),
        )
        .unwrap();
        std::fs::write(sandboxes.join(".sb-half.json.tmp-2c3d"), b"{\"id\":\"sb-ha").unwrap();
        let records = Records::open(&dir).unwrap();
        let left: Vec<_> = std::fs::read_dir(&sandboxes)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(left.is_empty(), "left in the records: {left:?}");
        assert_eq!(records.unproven("sb-cut"), None, "proven gone: a 404");
        drop(records);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Without a complete history the record of a deleted sandbox is what
    /// proves the 404 to a successor: it is kept, marked deleted.
    #[test]
    fn without_a_complete_history_a_deleted_sandbox_keeps_its_record() {
        let dir = std::env::temp_dir().join(format!("records-test-{}", crate::util::random_hex(4)));
        std::fs::create_dir_all(&dir).unwrap();
        {
            let records = Records::open(&dir).unwrap();
            let root = dir.join("data/sb-gone");
            records
                .created("sb-gone", Face::CreateOs, &root, &dir.join("data"), false)
                .unwrap();
            records.deleted("sb-gone");
        }
        let text = std::fs::read_to_string(dir.join("sandboxes/sb-gone.json")).unwrap();
        let kept: Record = serde_json::from_str(&text).unwrap();
        assert!(kept.deleted);
        let records = Records::open(&dir).unwrap();
        assert_eq!(records.unproven("sb-gone"), None);
        assert!(records.unproven("sb-never").is_some());
        drop(records);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_state_directory_made_by_someone_else_cannot_vouch_for_unknown_ids() {
        let dir = std::env::temp_dir().join(format!("records-test-{}", crate::util::random_hex(4)));
        std::fs::create_dir_all(&dir).unwrap();
        let records = Records::open(&dir).unwrap();
        assert!(records.unproven("sb-never").is_some());
        drop(records);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
