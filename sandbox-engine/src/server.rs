//! Starting and stopping the server: [`Server::builder`] → [`RunningServer`],
//! or [`RunningServer::start_in_background`] → [`BackgroundServer`] for
//! synchronous hosts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::faults::Faults;
use crate::http::middleware::{Face, Faces, ADMIN_PREFIX};
use crate::http::state::{AppState, Shared};
use crate::machine::isolation::{self, IsolationMode, IsolationPreference};
use crate::network::connections::ConnectionLimits;
use crate::sandboxes::store::Store;

/// The soft descriptor limit the server asks for at start (bounded by the
/// hard limit).
const DESCRIPTOR_LIMIT: u64 = 16_384;

/// Default time an upload body may send nothing (see
/// [`ServerBuilder::body_read_timeout`]).
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The faces the server speaks: the Daytona face on its own paths, the
/// CreateOS face on every other (its `/v1`, the admin API, unknown paths).
const FACES: Faces = Faces {
    default: &crate::api::CreateOs,
    others: &[&crate::daytona::Daytona],
};

/// The router of the server's origin: the CreateOS face under `/v1`, the
/// admin API, the Daytona API under `/daytona/api`, and, unless the toolbox
/// has a listener of its own (`toolbox_listener`), the Daytona toolbox
/// under `/daytona/toolbox`.
fn main_origin(state: Shared, toolbox_listener: bool) -> axum::Router {
    let mut mounts = vec![
        (crate::api::API_PREFIX, crate::api::routes()),
        (ADMIN_PREFIX, crate::api::admin_routes()),
        (crate::daytona::API_PREFIX, crate::daytona::api_routes()),
    ];
    if !toolbox_listener {
        mounts.push((
            crate::daytona::TOOLBOX_PREFIX,
            crate::daytona::toolbox_routes(),
        ));
    }
    crate::http::router::origin(state, FACES, FACES.default, mounts)
}

/// The router of the toolbox listener's origin: the Daytona toolbox under
/// `/toolbox` (as the real `toolboxProxyUrl`), nothing else.
fn toolbox_origin(state: Shared) -> axum::Router {
    let daytona: &'static dyn Face = &crate::daytona::Daytona;
    crate::http::router::origin(
        state,
        FACES,
        daytona,
        vec![(
            crate::daytona::TOOLBOX_LISTENER_PREFIX,
            crate::daytona::toolbox_routes(),
        )],
    )
}

/// Entry point: `Server::builder()`.
#[derive(Debug)]
pub struct Server;

impl Server {
    /// A builder with defaults: loopback port 0 (any free port), a fresh
    /// temporary data directory, isolation `Auto`, 300 ms transitions, 1 MiB
    /// journals.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }
}

/// Configures a server before [`ServerBuilder::start`].
#[derive(Debug, Clone)]
pub struct ServerBuilder {
    api_key: String,
    addr: SocketAddr,
    data_dir: Option<PathBuf>,
    isolation: IsolationPreference,
    transition_delay: Duration,
    journal_capacity: usize,
    faults: Faults,
    quiet: bool,
    rate_limit: Option<(u32, Duration)>,
    connections: ConnectionLimits,
    allow_unconfined: bool,
    prove_isolation_at_start: bool,
    toolbox_addr: Option<SocketAddr>,
    retention: crate::sandboxes::store::Retention,
    finished_output: usize,
    budgets: crate::trees::budgets::Budgets,
    body_read_timeout: Duration,
    egress: crate::network::egress::Policy,
    ingress: bool,
    min_auto_pause: Duration,
    sandbox_disk: Option<u64>,
    kept_disks: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    worker_threads: usize,
}

impl Default for ServerBuilder {
    fn default() -> Self {
        Self {
            api_key: String::new(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: None,
            isolation: IsolationPreference::Auto,
            transition_delay: Duration::from_millis(300),
            journal_capacity: crate::storage::journal::DEFAULT_CAPACITY,
            faults: Faults::default(),
            quiet: false,
            rate_limit: None,
            connections: ConnectionLimits::default(),
            allow_unconfined: false,
            prove_isolation_at_start: true,
            toolbox_addr: None,
            retention: crate::sandboxes::store::Retention::default(),
            finished_output: crate::sandboxes::output_budget::DEFAULT_FINISHED_OUTPUT,
            budgets: crate::trees::budgets::Budgets::for_host(),
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            egress: crate::network::egress::Policy::default(),
            ingress: false,
            min_auto_pause: Duration::from_secs(*crate::api::sandboxes::AUTO_PAUSE_RANGE.start()),
            sandbox_disk: None,
            kept_disks: None,
            state_dir: None,
            worker_threads: DEFAULT_WORKER_THREADS,
        }
    }
}

/// Threads of each of a server's runtimes (see [`ServerBuilder::worker_threads`]).
const DEFAULT_WORKER_THREADS: usize = 2;

impl ServerBuilder {
    /// The key every request must carry in `X-Api-Key` (required, non-empty).
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = key.into();
        self
    }

    /// The listen address (default `127.0.0.1:0`). Non-loopback addresses
    /// are refused by [`ServerBuilder::start`]: this server runs arbitrary
    /// commands for whoever holds the key.
    pub fn addr(mut self, addr: SocketAddr) -> Self {
        self.addr = addr;
        self
    }

    /// Shortcut for a loopback port (0 = any free port).
    pub fn port(mut self, port: u16) -> Self {
        self.addr = SocketAddr::from(([127, 0, 0, 1], port));
        self
    }

    /// Where sandbox roots are created. Default: a new directory under the
    /// system temp dir, removed at shutdown. A given directory is kept
    /// (only the sandbox roots inside it are removed).
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// A durable state directory (default: none): every sandbox is
    /// recorded there before its create is answered, with what proves its
    /// processes gone later, and an engine started on the directory of one
    /// that died proves that engine's sandboxes gone (killing what is left
    /// of them) before it answers anything, answering 404 for them only
    /// once proven, 500 otherwise (see [`crate::storage::records`]). Two engines
    /// cannot share one.
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// The sandboxes' outbound network (see [`crate::network::egress`]): off by
    /// default; an allow-list enables the proxy on each sandbox machine's
    /// loopback (only where sandboxes are machines, see
    /// [`crate::machine::enabled_here`]).
    pub fn egress(mut self, policy: crate::network::egress::Policy) -> Self {
        self.egress = policy;
        self
    }

    /// A way into sandboxes' ports (off by default): with it, a client
    /// may open a port of a sandbox as a loopback URL guarded by a secret
    /// token (see [`crate::network::ingress`]); without it, asking is a
    /// 403 that names this switch. Only where sandboxes are machines.
    pub fn ingress(mut self, on: bool) -> Self {
        self.ingress = on;
        self
    }

    /// The shortest idle window a sandbox may ask for
    /// (`auto_pause_after_seconds`; default 60 s, as the service): tests
    /// shorten it.
    pub fn min_auto_pause(mut self, window: Duration) -> Self {
        self.min_auto_pause = window;
        self
    }

    /// Isolation preference (default [`IsolationPreference::Auto`]).
    pub fn isolation(mut self, pref: IsolationPreference) -> Self {
        self.isolation = pref;
        self
    }

    /// Lets [`IsolationPreference::Auto`] fall back to unconfined process
    /// groups (no isolation) when bwrap cannot run here. Default `false`:
    /// the server refuses to start instead.
    pub fn allow_unconfined(mut self, allow: bool) -> Self {
        self.allow_unconfined = allow;
        self
    }

    /// How long pause, resume and create stay in their transitional status.
    pub fn transition_delay(mut self, d: Duration) -> Self {
        self.transition_delay = d;
        self
    }

    /// Output journal capacity per process, in bytes (default 1 MiB).
    pub fn journal_capacity(mut self, bytes: usize) -> Self {
        self.journal_capacity = bytes;
        self
    }

    /// Pre-configured fault rules (the same handle is returned by
    /// [`RunningServer::faults`]).
    pub fn faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// Most connections served at once (default 512); a connection over
    /// the cap is answered 503 `too_many_connections` and closed.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.connections.max_connections = n;
        self
    }

    /// How long a new connection may stay silent before its first request
    /// (default 15 s); then it is closed.
    pub fn first_request_timeout(mut self, d: Duration) -> Self {
        self.connections.first_request_timeout = d;
        self
    }

    /// How long a client may take to send a request's headers, and how long
    /// an idle keep-alive connection is kept (default 120 s, longer than the
    /// usual 90 s client pool timeout so that clients close idle
    /// connections first).
    pub fn header_read_timeout(mut self, d: Duration) -> Self {
        self.connections.header_read_timeout = d;
        self
    }

    /// Threads of each of the server's two runtimes: the one that answers
    /// requests ([`BackgroundServer`]'s) and the one that supervises the
    /// processes (reads their pipes, reaps them); 2 by default, at least 1.
    /// An engine that serves one command at a time (the `sandbox` CLI's
    /// own, for one run) is faster on 1 on a small machine: fewer threads
    /// hand each chunk of output to one another (a 50 MB run on 2 cores:
    /// 150 → 136 ms, BENCHMARKS.md).
    pub fn worker_threads(mut self, threads: usize) -> Self {
        self.worker_threads = threads.max(1);
        self
    }

    /// The most memory each sandbox may use, in bytes, where the host has
    /// a memory controller (see [`crate::trees::process_limits::sandbox_memory`];
    /// default half the host's RAM, at most 8 GiB). Process-wide: it
    /// applies to every sandbox this process starts from now on.
    pub fn sandbox_memory(self, bytes: u64) -> Self {
        crate::trees::process_limits::set_sandbox_memory(bytes);
        self
    }

    /// Suppresses the start-up and shutdown log lines on stderr.
    pub fn quiet(mut self, quiet: bool) -> Self {
        self.quiet = quiet;
        self
    }

    /// Answers 429 (with `Retry-After`) to a `/v1` request when `requests`
    /// were already admitted in the last `window`, as CreateOS limits a
    /// caller. Off by default.
    pub fn rate_limit(mut self, requests: u32, window: Duration) -> Self {
        self.rate_limit = Some((requests, window));
        self
    }

    /// Serves the Daytona toolbox on a second loopback listener (0 = any
    /// free port), at `http://127.0.0.1:<port>/toolbox/{sandboxId}/...`, the
    /// `toolboxProxyUrl` of every Daytona sandbox. Without it the toolbox is
    /// served on the main origin under `/daytona/toolbox`. With it, the main
    /// origin does not serve the toolbox (as the real service, whose API and
    /// toolbox proxy are different origins).
    pub fn toolbox_port(mut self, port: u16) -> Self {
        self.toolbox_addr = Some(SocketAddr::from(([127, 0, 0, 1], port)));
        self
    }

    /// How many bytes of output all finished processes of the server keep
    /// together (default [`crate::sandboxes::output_budget::DEFAULT_FINISHED_OUTPUT`],
    /// 64 MiB): past it, the output of the oldest finished processes is
    /// evicted (their records stay; a replay answers 410
    /// `output_offset_expired`). See [`crate::sandboxes::output_budget`].
    pub fn finished_output(mut self, bytes: usize) -> Self {
        self.finished_output = bytes;
        self
    }

    /// How long finished processes (leader exited, tree gone) keep their
    /// exit and output, and how many per sandbox (default 60 s and 16, the
    /// most recently finished). After that a process answers 404 on both
    /// faces, and its memory is returned.
    pub fn finished_retention(mut self, ttl: Duration, keep: usize) -> Self {
        self.retention = crate::sandboxes::store::Retention { ttl, keep };
        self
    }

    /// How long an upload body may send nothing (default 30 s); then the
    /// request is answered 408 `body_timeout`, nothing is written and its
    /// upload slot is free again, so stalled clients cannot hold every slot.
    pub fn body_read_timeout(mut self, d: Duration) -> Self {
        self.body_read_timeout = d;
        self
    }

    /// Most sandboxes at once, both faces together (default: see
    /// [`crate::trees::budgets::Budgets::for_host`]); one more is a 429
    /// `sandbox_limit`.
    pub fn max_sandboxes(mut self, n: usize) -> Self {
        self.budgets.max_sandboxes = n;
        self
    }

    /// Most live managed processes across every sandbox (default: see
    /// [`crate::trees::budgets::Budgets::for_host`]); one more is a 429
    /// `process_limit`.
    pub fn max_processes(mut self, n: usize) -> Self {
        self.budgets.max_processes = n;
        self
    }

    /// The size in bytes of each sandbox's own disk (its root, `/tmp`
    /// included; see [`crate::storage::disk`]); 0 = none (the sandbox writes to the
    /// data directory's file system without a limit). Default: see
    /// [`crate::storage::disk::default_size`].
    pub fn sandbox_disk(mut self, bytes: u64) -> Self {
        self.sandbox_disk = Some(bytes);
        self
    }

    /// A directory where the empty file system the sandboxes' disks are
    /// copied from is kept between servers (default: none, each server
    /// formats its own at start). See [`crate::storage::disk::kept_template`].
    pub fn keep_disk_templates_in(mut self, dir: impl Into<PathBuf>) -> Self {
        self.kept_disks = Some(dir.into());
        self
    }

    /// Whether bubblewrap is proven to work before the server answers
    /// (default): a probe runs a command in a machine of its own at start,
    /// and a server where it fails refuses to start. With `false` and
    /// [`IsolationPreference::RequireBwrap`], only `bwrap` in `PATH` is
    /// checked at start and the first sandbox's command proves the rest:
    /// where bubblewrap cannot confine it, that command is refused (503,
    /// with the same words and fix as the refusal to start) and nothing
    /// runs. For a server that exists for one sandbox (`sandbox run`),
    /// whose first command follows at once: its start no longer pays for
    /// a machine of its own (issue 41 item 2).
    pub fn prove_isolation_at_start(mut self, prove: bool) -> Self {
        self.prove_isolation_at_start = prove;
        self
    }

    /// Detects isolation, binds, and starts serving on the current tokio
    /// runtime.
    pub async fn start(self) -> std::io::Result<RunningServer> {
        use std::io::{Error, ErrorKind};
        if self.api_key.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "an API key is required",
            ));
        }
        if !self.addr.ip().is_loopback() || self.toolbox_addr.is_some_and(|a| !a.ip().is_loopback())
        {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "createos-local only listens on loopback addresses",
            ));
        }
        let (data_dir, owned) = match self.data_dir {
            Some(d) => (d, false),
            None => (
                std::env::temp_dir().join(format!(
                    "createos-local-{}-{}",
                    std::process::id(),
                    crate::util::random_hex(4)
                )),
                true,
            ),
        };
        std::fs::create_dir_all(&data_dir)?;
        // A predecessor's sandboxes are proven gone (or held unconfirmed)
        // before anything is answered.
        let records = match &self.state_dir {
            Some(dir) => Some(crate::storage::records::Records::open(dir)?),
            None => None,
        };
        // Whether sandboxes get a disk of their own (the template's mkfs
        // and a trial mount of it, a few milliseconds) is found out while
        // bubblewrap is probed: both are on the start path of every
        // `sandbox run`.
        let size = self.sandbox_disk.unwrap_or_else(|| {
            crate::storage::disk::default_size(&data_dir, self.budgets.max_sandboxes)
        });
        let mut disk_probe = (size != 0).then(|| {
            let dir = data_dir.clone();
            let kept = self.kept_disks.clone();
            std::thread::spawn(move || crate::storage::disk::probe(&dir, size, kept.as_deref()))
        });
        let mut disk_probed = move || match disk_probe.take().map(|h| h.join()) {
            Some(Ok(result)) => result.map_err(|e| e.to_string()),
            Some(Err(_)) => Err("the disk probe failed".to_string()),
            None => Err("no disk asked for".to_string()),
        };
        // What this server owns and hands down to its machines and
        // commands; the probe's machine already belongs to it.
        let mut registries = crate::machine::ServerRegistries {
            records: records.clone(),
            ..Default::default()
        };
        let (mode, bwrap, why) = match self.isolation {
            IsolationPreference::ProcessGroup => {
                (IsolationMode::ProcessGroup, None, "requested".to_string())
            }
            pref => {
                let probe = data_dir.join(".bwrap-probe");
                // Without a probe, the first sandbox's launcher proves
                // bubblewrap works (see `prove_isolation_at_start`).
                let probing =
                    self.prove_isolation_at_start || pref != IsolationPreference::RequireBwrap;
                // The host's /etc is copied while bubblewrap is probed
                // (the probe needs the loader's files alone).
                let result = match crate::storage::rootfs::begin_etc(&data_dir) {
                    Ok(etc) => {
                        let into = etc.clone();
                        let filling = std::thread::Builder::new()
                            .name("createos-local-etc".into())
                            .spawn(move || crate::storage::rootfs::fill_etc(&into));
                        let probed = if probing {
                            isolation::probe_bwrap(&probe, &registries)
                                .await
                                .inspect(|_| registries.isolation.note())
                        } else {
                            crate::util::find_in_path("bwrap")
                                .ok_or(isolation::BwrapUnusable::NotFound)
                        };
                        let filled = match filling {
                            Ok(thread) => thread.join().unwrap_or_else(|_| {
                                Err(std::io::Error::other("the copying thread failed"))
                            }),
                            // No thread to spare: copied here, after the probe.
                            Err(_) => crate::storage::rootfs::fill_etc(&etc),
                        };
                        match filled {
                            Ok(()) => probed.map_err(|e| e.to_string()),
                            Err(e) => Err(format!("cannot prepare the sandboxes' /etc: {e}")),
                        }
                    }
                    Err(e) => Err(format!("cannot prepare the sandboxes' /etc: {e}")),
                };
                let _ = crate::storage::disk::remove_tree(&probe);
                match result {
                    Ok(path) => (IsolationMode::Bwrap, Some(path), "bwrap works".to_string()),
                    Err(e) if pref == IsolationPreference::Auto && self.allow_unconfined => {
                        crate::storage::rootfs::remove_etc(&data_dir);
                        (IsolationMode::ProcessGroup, None, e)
                    }
                    Err(e) => {
                        // Nothing is removed while the probe's disk may be mounted.
                        let _ = disk_probed();
                        crate::storage::disk::remove_template(&data_dir);
                        crate::storage::rootfs::remove_etc(&data_dir);
                        if owned {
                            let _ = crate::storage::disk::remove_tree(&data_dir);
                        }
                        return Err(Error::other(isolation::cannot_confine(&e)));
                    }
                }
            }
        };
        let machines = mode == IsolationMode::Bwrap && crate::machine::enabled_here();
        // The policy applies where sandboxes are machines; elsewhere there
        // is no proxy, and none is registered.
        registries.egress = Arc::new(crate::network::egress::Policies::with_ceiling(
            (machines && self.egress.enabled()).then(|| self.egress.clone()),
        ));
        if !self.quiet {
            match mode {
                IsolationMode::Bwrap => eprintln!(
                    "createos-local: isolation mode bwrap ({}; {} namespaces, sandbox root as \
                     /); {}; outbound network: {}; ingress: {}; limits: {}",
                    crate::machine::describe_model(),
                    if crate::machine::namespaces_without_user_here() {
                        "PID, network, IPC and UTS (no user namespace: commands run as this \
                         server's uid with no capability)"
                    } else {
                        "user, PID, network, IPC and UTS"
                    },
                    if machines {
                        crate::trees::id_map::describe_here()
                    } else {
                        "only uid 0 in a sandbox, with no capability (each command has \
                         namespaces of its own)"
                            .to_string()
                    },
                    match (machines, self.egress.enabled()) {
                        (_, false) => "off (each sandbox has its own loopback only)".to_string(),
                        (true, true) => format!(
                            "through the proxy on each sandbox's 127.0.0.1:{}, {}",
                            crate::network::egress::PROXY_PORT,
                            self.egress.describe()
                        ),
                        (false, true) => format!(
                            "off: the egress {} needs sandbox machines",
                            self.egress.describe()
                        ),
                    },
                    match (machines, self.ingress) {
                        (_, false) => "off",
                        (true, true) => "a loopback URL per opened port, behind its token",
                        (false, true) => "off: ingress needs sandbox machines",
                    },
                    crate::trees::process_limits::describe()
                ),
                IsolationMode::ProcessGroup => eprintln!(
                    "createos-local: isolation mode process-group ({why}): NO isolation, commands are NOT confined: \
                     they run as this user on the host's file system and network; only cwd is mapped into the sandbox root"
                ),
            }
        }
        // Each sandbox's own disk, where the host can mount one; else a
        // budget this server measures.
        let mut disk_budget = None;
        let disk = if size == 0 {
            None
        } else {
            match disk_probed() {
                Ok(()) => Some(size.max(crate::storage::disk::MIN_SANDBOX_DISK)),
                Err(why) => {
                    if !self.quiet {
                        eprintln!(
                            "createos-local: no disk quota: sandboxes get no disk of their own here \
                             ({why}): their files go to the data directory's file system without a \
                             size limit; each is measured every {} s against a budget of {} MiB \
                             (--sandbox-disk), over which its new commands are refused (429 \
                             disk_budget)",
                            crate::storage::disk_budget::INTERVAL.as_secs(),
                            size.max(crate::storage::disk::MIN_SANDBOX_DISK) >> 20
                        );
                    }
                    disk_budget = Some(crate::storage::disk_budget::DiskBudget::start(
                        &data_dir,
                        size.max(crate::storage::disk::MIN_SANDBOX_DISK),
                    ));
                    None
                }
            }
        };
        if !self.quiet {
            if let Some(size) = disk {
                eprintln!(
                    "createos-local: each sandbox has a disk of its own of {} MiB (its root, /tmp \
                     included; --sandbox-disk){}",
                    size >> 20,
                    if crate::trees::id_map::ranges_here() {
                        ""
                    } else {
                        ", mounted with fuse2fs"
                    }
                );
            }
        }
        // Room for the connection cap and the pipes of many processes.
        crate::network::connections::raise_descriptor_limit(DESCRIPTOR_LIMIT);
        let listener = TcpListener::bind(self.addr).await?;
        let addr = listener.local_addr()?;
        let toolbox_listener = match self.toolbox_addr {
            Some(a) => Some(TcpListener::bind(a).await?),
            None => None,
        };
        let toolbox_addr = match &toolbox_listener {
            Some(l) => Some(l.local_addr()?),
            None => None,
        };
        let toolbox_url = match toolbox_addr {
            Some(a) => format!("http://{a}{}", crate::daytona::TOOLBOX_LISTENER_PREFIX),
            None => format!("http://{addr}{}", crate::daytona::TOOLBOX_PREFIX),
        };
        let supervision = SupervisionRuntime::start(self.worker_threads)?;
        let state = Arc::new(AppState {
            registries,
            disk_budget,
            supervision: supervision.handle(),
            api_key: self.api_key,
            faults: self.faults.clone(),
            store: Store::default(),
            mode: mode.clone(),
            bwrap,
            data_dir: data_dir.clone(),
            transition_delay: self.transition_delay,
            journal_capacity: self.journal_capacity,
            rate_limit: self.rate_limit.map(|(requests, window)| {
                crate::network::rate_limit::RateLimiter::new(requests, window)
            }),
            blocking: Arc::new(tokio::sync::Semaphore::new(
                crate::http::state::BLOCKING_SLOTS,
            )),
            uploads: Arc::new(tokio::sync::Semaphore::new(
                crate::http::state::UPLOAD_SLOTS,
            )),
            daytona: crate::sandboxes::daytona_registry::Registry::default(),
            toolbox_url,
            retention: self.retention,
            output_budget: Arc::new(crate::sandboxes::output_budget::OutputBudget::new(
                self.finished_output,
            )),
            budgets: self.budgets,
            body_read_timeout: self.body_read_timeout,
            ingress: self.ingress && machines,
            min_auto_pause: self.min_auto_pause,
            ports: Default::default(),
            disk,
            records,
            owned_data_dir: owned,
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        // Drops finished processes past their retention.
        let sweeper = {
            let state = Arc::downgrade(&state);
            let mut stop = stop_rx.clone();
            let tick =
                (self.retention.ttl / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
            async move {
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(tick) => {}
                        _ = stop.wait_for(|s| *s) => return,
                    }
                    let Some(state) = state.upgrade() else { return };
                    crate::http::state::prune_finished(&state);
                }
            }
        };
        tokio::spawn(sweeper);
        // Deletes, with proof, the sandboxes whose hard expiry has come.
        let reaper = {
            let state = Arc::downgrade(&state);
            let mut stop = stop_rx.clone();
            async move {
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = stop.wait_for(|s| *s) => return,
                    }
                    let Some(state) = state.upgrade() else { return };
                    crate::api::sandboxes::reap_expired(&state).await;
                    crate::api::sandboxes::reap_idle(&state).await;
                }
            }
        };
        tokio::spawn(reaper);
        let app = main_origin(state.clone(), toolbox_listener.is_some());
        let limits = self.connections;
        let toolbox = toolbox_listener.map(|l| (l, toolbox_origin(state.clone()), stop_rx.clone()));
        let key = state.api_key.clone();
        let check: crate::network::connections::KeyCheck =
            Arc::new(move |headers| crate::http::middleware::carries_key(headers, &key, FACES));
        let task = tokio::spawn(async move {
            let main =
                crate::network::connections::serve(listener, app, limits, check.clone(), stop_rx);
            match toolbox {
                Some((l, toolbox_app, stop)) => {
                    let second =
                        crate::network::connections::serve(l, toolbox_app, limits, check, stop);
                    tokio::join!(main, second);
                }
                None => main.await,
            }
        });
        Ok(RunningServer {
            addr,
            toolbox_addr,
            state,
            _supervision: supervision,
            mode,
            stop: Some(stop_tx),
            task: Some(task),
            owned_data_dir: owned,
            quiet: self.quiet,
        })
    }
}

/// A server serving on a loopback port.
#[derive(Debug)]
pub struct RunningServer {
    addr: SocketAddr,
    toolbox_addr: Option<SocketAddr>,
    state: Arc<AppState>,
    /// Held for its `Drop`: the supervision runtime lives as long as the server.
    _supervision: SupervisionRuntime,
    mode: IsolationMode,
    stop: Option<watch::Sender<bool>>,
    task: Option<JoinHandle<()>>,
    owned_data_dir: bool,
    quiet: bool,
}

/// The runtime behind [`AppState::supervision`]: threads of its own
/// ([`ServerBuilder::worker_threads`]), shut down (without blocking) when
/// the server is dropped.
#[derive(Debug)]
struct SupervisionRuntime(Option<tokio::runtime::Runtime>);

impl SupervisionRuntime {
    fn start(threads: usize) -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("createos-local-supervision")
            .enable_all()
            .build()?;
        Ok(Self(Some(rt)))
    }

    fn handle(&self) -> tokio::runtime::Handle {
        match &self.0 {
            Some(rt) => rt.handle().clone(),
            None => tokio::runtime::Handle::current(),
        }
    }
}

impl Drop for SupervisionRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// What shutdown found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Managed processes (and unfinished execs) that were still known.
    pub processes: usize,
    /// Sandbox machines that were running, each ended and proven gone (or
    /// named in `unverified`).
    pub machines: usize,
    /// Host pids still alive after termination (empty = verified).
    pub survivors: Vec<i32>,
    /// Ids of processes whose tree could not be verified gone, and
    /// sandboxes whose processes or disk could not be proven gone (with
    /// what may still run or exist).
    pub unverified: Vec<String>,
}

impl ShutdownReport {
    /// Every process tree was verified gone.
    pub fn all_exited(&self) -> bool {
        self.unverified.is_empty() && self.survivors.is_empty()
    }
}

impl RunningServer {
    /// Starts a server with `api_key` on its own tokio runtime thread, for
    /// synchronous hosts.
    pub fn start_in_background(api_key: impl Into<String>) -> std::io::Result<BackgroundServer> {
        BackgroundServer::start(Server::builder().api_key(api_key))
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>` (no trailing slash, no `/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Fault rules and the request record.
    pub fn faults(&self) -> &Faults {
        &self.state.faults
    }

    /// The Daytona API base URL: `http://127.0.0.1:<port>/daytona/api`.
    pub fn daytona_api_url(&self) -> String {
        format!("http://{}{}", self.addr, crate::daytona::API_PREFIX)
    }

    /// The Daytona `toolboxProxyUrl` (see [`ServerBuilder::toolbox_port`]).
    pub fn toolbox_url(&self) -> &str {
        &self.state.toolbox_url
    }

    /// The toolbox listener's address, when there is one.
    pub fn toolbox_addr(&self) -> Option<SocketAddr> {
        self.toolbox_addr
    }

    /// The rate limit's counters, when a limit is set.
    pub fn rate_limit_stats(&self) -> Option<crate::network::rate_limit::RateLimitStats> {
        self.state.rate_limit.as_ref().map(|l| l.stats())
    }

    /// The isolation mode in force.
    pub fn isolation(&self) -> &IsolationMode {
        &self.mode
    }

    /// Where sandbox roots live.
    pub fn data_dir(&self) -> &std::path::Path {
        &self.state.data_dir
    }

    /// The size of each sandbox's own disk when the server gives them one
    /// (see [`crate::storage::disk`]); `None` when sandboxes write to the data
    /// directory's file system without a per-sandbox limit.
    pub fn sandbox_disk(&self) -> Option<u64> {
        self.state.disk
    }

    /// Terminates every process tree (SIGTERM, 500 ms grace, SIGKILL,
    /// verification), stops serving, removes sandbox roots, and reports
    /// survivors (also logged to stderr).
    pub async fn shutdown(mut self) -> ShutdownReport {
        let report = terminate_all(&self.state).await;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(task) = self.task.take() {
            // Open `/connect` streams end with their exit frames; do not wait
            // forever for idle keep-alive connections.
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(3), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        // Sandbox trees may be arbitrarily deep: removed iteratively, off
        // the runtime's threads.
        let state = self.state.clone();
        let data_dir = self.owned_data_dir.then(|| self.state.data_dir.clone());
        let etc_of = self.state.data_dir.clone();
        if let Some(budget) = &self.state.disk_budget {
            budget.stop();
        }
        let _ = tokio::task::spawn_blocking(move || {
            state.store.finish_removals();
            let mut roots: Vec<PathBuf> =
                state.store.all().iter().map(|sb| sb.root.clone()).collect();
            roots.extend(state.store.take_leftovers());
            for root in roots {
                let _ = crate::storage::disk::remove_tree(&root);
            }
            // The template and the /etc copy go side by side.
            let template_of = etc_of.clone();
            let template = std::thread::Builder::new()
                .name("createos-local-remove".into())
                .spawn(move || crate::storage::disk::remove_template(&template_of));
            crate::storage::rootfs::remove_etc(&etc_of);
            if !template.is_ok_and(|t| t.join().is_ok()) {
                crate::storage::disk::remove_template(&etc_of);
            }
            if let Some(dir) = data_dir {
                let _ = crate::storage::disk::remove_tree(&dir);
            }
        })
        .await;
        if let Some(records) = &self.state.records {
            records.release();
        }
        if !self.quiet {
            if report.all_exited() {
                eprintln!(
                    "createos-local: shutdown: {} process tree(s) and {} machine(s) terminated, none survived",
                    report.processes, report.machines
                );
            } else {
                eprintln!(
                    "createos-local: shutdown: {} process tree(s) or sandbox(es) NOT verified gone \
                     (pids still alive: {:?}): {}",
                    report.unverified.len(),
                    report.survivors,
                    report.unverified.join("; ")
                );
            }
        }
        report
    }
}

impl Drop for RunningServer {
    /// A server dropped without [`RunningServer::shutdown`] (a panicking
    /// test, an early return) still kills its process trees with SIGKILL —
    /// best effort and unverified — stops serving and removes its files.
    fn drop(&mut self) {
        if self.stop.is_none() {
            return;
        }
        for sb in self.state.store.all() {
            for p in sb.processes() {
                p.kill_now();
            }
            self.state.registries.machines.end_now(&sb.root);
            let _ = crate::storage::disk::remove_tree(&sb.root);
        }
        // The rest of this server's machines (its start-up probe's).
        for root in self.state.registries.machines.running() {
            self.state.registries.machines.end_now(&root);
        }
        // Removals of deleted sandboxes finish first (they work inside the
        // data directory removed below).
        self.state.store.finish_removals();
        for root in self.state.store.take_leftovers() {
            let _ = crate::storage::disk::remove_tree(&root);
        }
        crate::storage::disk::remove_template(&self.state.data_dir);
        if let Some(budget) = &self.state.disk_budget {
            budget.stop();
        }
        crate::storage::rootfs::remove_etc(&self.state.data_dir);
        if self.owned_data_dir {
            let _ = crate::storage::disk::remove_tree(&self.state.data_dir);
        }
        if let Some(records) = &self.state.records {
            records.release();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
    }
}

async fn terminate_all(state: &AppState) -> ShutdownReport {
    let mut report = ShutdownReport::default();
    let mut tasks = Vec::new();
    for sb in state.store.all() {
        sb.force(crate::sandboxes::store::Status::Destroying);
        sb.close().await;
        for p in sb.processes() {
            report.processes += 1;
            tasks.push(tokio::spawn(async move {
                let t = p.terminate(Duration::from_millis(500)).await;
                (p.id.clone(), t)
            }));
        }
    }
    for t in tasks {
        match t.await {
            Ok((id, t)) => {
                if !t.verified {
                    report.unverified.push(id);
                    report.survivors.extend(t.survivors);
                }
            }
            Err(e) => report.unverified.push(format!("<task failed: {e}>")),
        }
    }
    // Then every sandbox's machine, and every other machine of this
    // server still running (the start-up probe's), each ended and proven
    // gone with its disk.
    let mut ends = Vec::new();
    let mut roots: Vec<(String, PathBuf)> = state
        .store
        .all()
        .iter()
        .map(|sb| (format!("sandbox {}", sb.id), sb.root.clone()))
        .collect();
    for root in state.registries.machines.running() {
        if !roots.iter().any(|(_, r)| *r == root) {
            roots.push((format!("the machine of {}", root.display()), root));
        }
    }
    for (what, root) in roots {
        ends.push(async move {
            let ended = crate::http::state::prove_gone(state, root, true).await;
            (what, ended)
        });
    }
    for (what, ended) in futures_util::future::join_all(ends).await {
        match ended {
            Ok(machine) => report.machines += usize::from(machine),
            Err(why) => report.unverified.push(format!("{what}: {why}")),
        }
    }
    report
}

/// A server running on its own runtime thread. Dropping it shuts it down
/// (prefer [`BackgroundServer::shutdown`] to get the report).
#[derive(Debug)]
pub struct BackgroundServer {
    addr: SocketAddr,
    faults: Faults,
    mode: IsolationMode,
    toolbox_url: String,
    proof: Arc<isolation::IsolationProof>,
    stop: Option<std::sync::mpsc::Sender<std::sync::mpsc::Sender<ShutdownReport>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the server thread reports once it listens: address, faults,
/// isolation and toolbox URL.
type Ready = (
    SocketAddr,
    Faults,
    IsolationMode,
    String,
    Arc<isolation::IsolationProof>,
);

/// A [`BackgroundServer`] still starting on its thread (see
/// [`BackgroundServer::spawn`]): [`StartingServer::wait`] gives the running
/// server or the reason it did not start. Dropped without waiting, it
/// waits, then shuts the server down.
#[derive(Debug)]
pub struct StartingServer {
    ready: Option<std::sync::mpsc::Receiver<std::io::Result<Ready>>>,
    stop: Option<std::sync::mpsc::Sender<std::sync::mpsc::Sender<ShutdownReport>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StartingServer {
    /// Blocks until the server listens (or failed to start).
    pub fn wait(mut self) -> std::io::Result<BackgroundServer> {
        let ready = self.ready.take().map(|r| r.recv());
        let (addr, faults, mode, toolbox_url, proof) = match ready {
            Some(Ok(r)) => r?,
            _ => {
                return Err(std::io::Error::other(
                    "server thread ended before listening",
                ))
            }
        };
        Ok(BackgroundServer {
            addr,
            faults,
            mode,
            toolbox_url,
            proof,
            stop: self.stop.take(),
            thread: self.thread.take(),
        })
    }
}

impl Drop for StartingServer {
    fn drop(&mut self) {
        if let Some(ready) = self.ready.take() {
            let _ = ready.recv();
        }
        if let Some(stop) = self.stop.take() {
            let (tx, rx) = std::sync::mpsc::channel();
            if stop.send(tx).is_ok() {
                let _ = rx.recv();
            }
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl BackgroundServer {
    /// Starts `builder` on a new thread with its own multi-thread runtime
    /// and blocks until it listens (or failed to).
    pub fn start(builder: ServerBuilder) -> std::io::Result<Self> {
        Self::spawn(builder)?.wait()
    }

    /// Starts `builder` on a new thread with its own multi-thread runtime
    /// without waiting: the caller does other work while the server probes
    /// isolation and disks, then [`StartingServer::wait`]s.
    pub fn spawn(builder: ServerBuilder) -> std::io::Result<StartingServer> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<std::io::Result<Ready>>();
        let (stop_tx, stop_rx) =
            std::sync::mpsc::channel::<std::sync::mpsc::Sender<ShutdownReport>>();
        let thread = std::thread::Builder::new()
            .name("createos-local".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(builder.worker_threads)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                rt.block_on(async move {
                    let server = match builder.start().await {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let info = (
                        server.addr(),
                        server.faults().clone(),
                        server.isolation().clone(),
                        server.toolbox_url().to_string(),
                        server.state.registries.isolation.clone(),
                    );
                    let _ = ready_tx.send(Ok(info));
                    // Wait for a shutdown request (or the handle being dropped).
                    let reply = tokio::task::spawn_blocking(move || stop_rx.recv().ok())
                        .await
                        .ok()
                        .flatten();
                    let report = server.shutdown().await;
                    if let Some(reply) = reply {
                        let _ = reply.send(report);
                    }
                });
            })?;
        Ok(StartingServer {
            ready: Some(ready_rx),
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The Daytona API base URL: `http://127.0.0.1:<port>/daytona/api`.
    pub fn daytona_api_url(&self) -> String {
        format!("http://{}{}", self.addr, crate::daytona::API_PREFIX)
    }

    /// The Daytona `toolboxProxyUrl` (see [`ServerBuilder::toolbox_port`]).
    pub fn toolbox_url(&self) -> &str {
        &self.toolbox_url
    }

    /// Fault rules and the request record.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The isolation mode in force.
    pub fn isolation(&self) -> &IsolationMode {
        &self.mode
    }

    /// Why bubblewrap could not confine this server's first command, when
    /// it was started without proving it
    /// ([`ServerBuilder::prove_isolation_at_start`]) and that command was
    /// refused: the words and fix of a refusal to start.
    pub fn isolation_refused(&self) -> Option<String> {
        self.proof.refused()
    }

    /// Shuts down (blocking) and returns the report.
    pub fn shutdown(mut self) -> ShutdownReport {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> ShutdownReport {
        let mut report = ShutdownReport::default();
        if let Some(stop) = self.stop.take() {
            let (tx, rx) = std::sync::mpsc::channel();
            if stop.send(tx).is_ok() {
                if let Ok(r) = rx.recv() {
                    report = r;
                }
            }
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        report
    }
}

impl Drop for BackgroundServer {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}
