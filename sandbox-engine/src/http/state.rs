//! The state both faces share: the sandboxes and processes, the Daytona
//! registry, budgets and bounded pools, and the work every handler does on
//! it whatever face it answers for (taking a pool slot, making and removing
//! a sandbox root, pruning finished processes).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;

use super::error::{over_budget, ApiError};
use crate::faults::Faults;
use crate::machine::isolation::IsolationMode;
use crate::sandboxes::store::Store;
use crate::sandboxes::teardown::NotProvenGone;
use crate::trees::budgets::Budgets;

/// Everything handlers share.
#[derive(Debug)]
pub struct AppState {
    /// The expected `X-Api-Key`.
    pub api_key: String,
    /// Fault rules and the request record.
    pub faults: Faults,
    /// Sandboxes.
    pub store: Store,
    /// Isolation in force.
    pub mode: IsolationMode,
    /// bwrap binary (bwrap mode only).
    pub bwrap: Option<PathBuf>,
    /// Where sandbox roots live.
    pub data_dir: PathBuf,
    /// Duration of the asynchronous sandbox transitions.
    pub transition_delay: Duration,
    /// Journal capacity per process.
    pub journal_capacity: usize,
    /// The request rate limit, when one is set.
    pub rate_limit: Option<crate::network::rate_limit::RateLimiter>,
    /// The runtime that starts, watches and terminates processes (its own
    /// threads: spawning and `/proc` scans are synchronous work that must
    /// not hold up the threads answering requests).
    pub supervision: tokio::runtime::Handle,
    /// Slots of the bounded pool for blocking file-system work.
    pub blocking: Arc<tokio::sync::Semaphore>,
    /// Slots for uploads in progress (each holds a writing thread).
    pub uploads: Arc<tokio::sync::Semaphore>,
    /// The Daytona face's sandboxes and sessions.
    pub daytona: crate::sandboxes::daytona_registry::Registry,
    /// How long a request body may send nothing before the request is
    /// answered 408 and its slot is released.
    pub body_read_timeout: Duration,
    /// How long and how many finished processes are kept.
    pub retention: crate::sandboxes::store::Retention,
    /// How much output finished processes keep, engine-wide.
    pub output_budget: Arc<crate::sandboxes::output_budget::OutputBudget>,
    /// Host-wide budgets (sandbox count, live processes).
    pub budgets: Budgets,
    /// Whether clients may open sandboxes' ports ([`crate::network::ingress`]):
    /// the operator enabled it, and sandboxes are machines.
    pub ingress: bool,
    /// The shortest idle window a sandbox may ask for.
    pub min_auto_pause: Duration,
    /// The sandboxes' opened ports.
    pub ports: crate::network::ingress::Ports,
    /// Size of each sandbox's own disk, when sandboxes get one (see
    /// [`crate::storage::disk`]).
    pub disk: Option<u64>,
    /// The Daytona `toolboxProxyUrl`: the toolbox listener's
    /// `http://127.0.0.1:<port>/toolbox`, or `<base>/daytona/toolbox`.
    pub toolbox_url: String,
    /// The durable records of this engine's sandboxes, when it keeps them
    /// (see [`crate::ServerBuilder::state_dir`]).
    pub records: Option<Arc<crate::storage::records::Records>>,
    /// Whether the data directory is the server's own temporary one.
    pub owned_data_dir: bool,
    /// What this server owns that its machines and commands use (its
    /// egress policies), handed down with each spawn.
    pub registries: crate::machine::ServerRegistries,
    /// The sandboxes' disk budget, where they get no disk of their own
    /// (see [`crate::storage::disk_budget`]).
    pub disk_budget: Option<Arc<crate::storage::disk_budget::DiskBudget>>,
}

/// Shared state handle.
pub type Shared = Arc<AppState>;

/// Blocking file-system work (other than uploads) running at once.
pub const BLOCKING_SLOTS: usize = 16;

/// Uploads written at once.
pub const UPLOAD_SLOTS: usize = 8;

/// How long a request waits for a free slot before it is answered 503.
pub const SLOT_WAIT: Duration = Duration::from_secs(10);

/// Takes a slot of `pool` within [`SLOT_WAIT`], or answers 503 (nothing
/// was done).
pub async fn slot(
    pool: &Arc<tokio::sync::Semaphore>,
    what: &str,
) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    match tokio::time::timeout(SLOT_WAIT, pool.clone().acquire_owned()).await {
        Ok(Ok(permit)) => Ok(permit),
        _ => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            format!("the server is busy with other {what}; nothing was done, retry later"),
        )),
    }
}

/// Runs blocking file-system work on the bounded pool (see [`slot`]).
pub async fn blocking<T: Send + 'static>(
    state: &AppState,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    let permit = slot(&state.blocking, "file-system work").await?;
    let out = tokio::task::spawn_blocking(move || {
        let out = f();
        drop(permit);
        out
    })
    .await
    .map_err(|e| ApiError::internal(format!("file-system task failed: {e}")))?;
    Ok(out)
}

/// Makes a new sandbox's root (with its own disk, see [`crate::storage::disk`]):
/// 429 `disk_limit` over the host-wide disk budget, 500 when the server
/// failed.
pub async fn make_root(state: &AppState, root: PathBuf) -> Result<(), ApiError> {
    let disk = state.disk;
    match blocking(state, move || crate::storage::disk::prepare(&root, disk)).await? {
        Ok(()) => Ok(()),
        Err(crate::storage::disk::PrepareError::Refused(r)) => Err(over_budget(r)),
        Err(crate::storage::disk::PrepareError::Io(e)) => Err(ApiError::internal(format!(
            "cannot create sandbox root: {e}"
        ))),
    }
}

/// Records a new sandbox durably before its create is answered (see
/// [`crate::storage::records`]); 500 when the record could not be written (the
/// engine could not prove it gone later).
pub async fn record_created(
    state: &AppState,
    id: &str,
    face: crate::storage::records::Face,
    root: &std::path::Path,
) -> Result<(), ApiError> {
    let Some(records) = state.records.clone() else {
        return Ok(());
    };
    let (id, root, data_dir, owned) = (
        id.to_string(),
        root.to_path_buf(),
        state.data_dir.clone(),
        state.owned_data_dir,
    );
    blocking(state, move || {
        records.created(&id, face, &root, &data_dir, owned)
    })
    .await?
    .map_err(|e| {
        ApiError::internal(format!(
            "the sandbox could not be recorded in the engine's state directory ({e}); nothing \
             was created"
        ))
    })
}

/// Marks a sandbox deleted in its record (every process confirmed gone).
pub fn record_deleted(state: &AppState, id: &str) {
    if let Some(records) = &state.records {
        records.deleted(id);
    }
}

/// The 500 answered for a sandbox id this engine cannot call gone (see
/// [`crate::storage::records::Records::unproven`]), `None` for a 404.
pub fn unproven(state: &AppState, id: &str) -> Option<ApiError> {
    let why = state.records.as_ref()?.unproven(id)?;
    Some(ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "unconfirmed",
        why.to_string(),
    ))
}

/// A DELETE of a sandbox id no live sandbox of this engine has: a
/// predecessor's sandbox not yet proven gone is verified again (see
/// [`crate::storage::records::Records::retry`]). `Ok(true)`: proven gone now;
/// `Ok(false)`: answer as for any unknown id.
pub async fn retry_unproven(state: &AppState, id: &str) -> Result<bool, ApiError> {
    let Some(records) = state.records.clone() else {
        return Ok(false);
    };
    let id = id.to_string();
    blocking(state, move || records.retry(&id))
        .await?
        .map_err(|why| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "unconfirmed",
                why.to_string(),
            )
        })
}

/// Ends what is left of the sandbox at `root` once its command trees are
/// verified gone, and proves it ([`crate::sandboxes::teardown::end_sandbox`]: its
/// machine and every process of its uid; its disk too when `disk`), off
/// the runtime's threads. `Ok(true)` when it had a machine; `Err` says
/// what may still run or exist.
/// A failed proof is also said on stderr, quiet or not: the client's
/// 500 may reach its user without the reason (a provider component does
/// not pass a response body on).
pub async fn prove_gone(
    state: &AppState,
    root: PathBuf,
    disk: bool,
) -> Result<bool, NotProvenGone> {
    let at = root.clone();
    let machines = state.registries.machines.clone();
    let proof = state
        .supervision
        .spawn_blocking(move || crate::sandboxes::teardown::end_sandbox(&machines, &root, disk))
        .await
        .map_err(|e| NotProvenGone::NotMade {
            root: at.clone(),
            reason: e.to_string(),
        })
        .and_then(|proof| proof);
    if let Err(why) = &proof {
        eprintln!(
            "createos-local: the sandbox at {} is not proven gone: {why}",
            at.display()
        );
    }
    proof
}

/// Removes the root of a deleted sandbox. The root is first renamed to
/// `.removing-<id>` beside it (one step: the sandbox's files are gone from
/// their path when the delete answers), then removed on a thread of its
/// own, iteratively whatever the depth of the tree (see [`crate::storage::fstree`]):
/// a tree of 100 000 levels takes a minute on a slow disk, longer than a
/// client waits for a DELETE. Shutdown waits for these removals. A
/// failure is logged and the path is removed again at shutdown; `Err` only
/// when no removal could be started.
pub async fn remove_root(
    state: &AppState,
    id: &str,
    root: PathBuf,
) -> Result<(), RemovalNotStarted> {
    let trash = state.data_dir.join(format!(".removing-{id}"));
    state.registries.egress.set_sandbox(&root, None);
    state.ports.close(&root);
    // Its own disk goes first (a mount point cannot be renamed).
    let r = root.clone();
    let _ = tokio::task::spawn_blocking(move || crate::storage::disk::detach(&r)).await;
    let target = match std::fs::rename(&root, &trash) {
        Ok(()) => trash,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        // Could not rename: remove it where it is.
        Err(_) => root,
    };
    let path = target.clone();
    let label = id.to_string();
    let spawned = std::thread::Builder::new()
        .name("createos-local-remove".into())
        .spawn(move || match crate::storage::disk::remove_tree(&path) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => {
                eprintln!(
                    "createos-local: could not remove the files of sandbox {label}: {e}; \
                     they are removed again at shutdown"
                );
                false
            }
        });
    match spawned {
        Ok(handle) => {
            state.store.removing(target, handle);
            Ok(())
        }
        Err(source) => {
            state.store.leave(target.clone());
            Err(RemovalNotStarted {
                id: id.to_string(),
                at: target,
                source,
            })
        }
    }
}

/// A deleted sandbox whose files could not start being removed (no
/// thread to spare): its processes are gone, its files go at shutdown.
#[derive(Debug, thiserror::Error)]
#[error(
    "removing the files of sandbox {id} could not start ({source}); its processes are gone and \
     its files are removed at shutdown"
)]
pub struct RemovalNotStarted {
    /// The sandbox's id.
    pub id: String,
    /// Where its files are (its root, or `.removing-<id>` beside it).
    pub at: PathBuf,
    /// Why no thread could start.
    pub source: std::io::Error,
}

/// Drops finished processes beyond the retention (both faces: a Daytona
/// session forgets the commands whose process was dropped, and goes once
/// all of its commands have).
pub fn prune_finished(state: &AppState) {
    let pruned = state.store.prune_finished(state.retention);
    if pruned.is_empty() {
        return;
    }
    for (id, dropped) in pruned {
        if let Some(sb) = state.daytona.get(&id) {
            sb.retire_commands(&dropped);
        }
    }
    // The journals just freed are many small allocations that glibc keeps
    // in its arenas: give them back to the system, so that the server's
    // memory returns to its baseline (see BENCHMARKS.md).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases free memory of the allocator.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Runs `fut` as its own task on the supervision runtime (see
/// [`AppState::supervision`]) so that it completes (and registers or cleans
/// up what it started) even when the client goes away mid-request, and so
/// that starting, watching and terminating processes never holds up the
/// threads that answer other requests.
pub async fn detached<T: Send + 'static>(
    supervision: &tokio::runtime::Handle,
    fut: impl std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
) -> Result<T, ApiError> {
    supervision
        .spawn(fut)
        .await
        .map_err(|e| ApiError::internal(format!("request task failed: {e}")))?
}
