//! Finding the provider, the lease store and the backend, and building the
//! environment (config, secret) for a command.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use sandbox_host::{
    open_store, shared_engine, ArtifactCache, Environment, GuestStderr, LeaseStore,
    NetworkTransport, ProviderComponent, RateLimit, RequestPacer, SandboxRuntime, Secrets,
    SqliteLeases, KEY_ORIGIN_VAR,
};
use serde_json::Value;

use crate::Global;

/// The provider used without `--provider` (./build.sh builds it).
const DEFAULT_PROVIDER: &str = "createos";

/// Everything a subcommand works with.
pub struct Setup {
    pub runtime: SandboxRuntime,
    local: Option<EmbeddedEngine>,
}

/// The embedded local engine (`createos-local`, in this process) and how the
/// provider reaches it.
struct EmbeddedEngine {
    #[cfg(feature = "local-backend")]
    server: sandbox_engine::BackgroundServer,
    /// The config fields that point the provider at the embedded engine.
    urls: Vec<(String, String)>,
    api_key: String,
}

impl Setup {
    /// The provider alone (describe, validate-config): no store on disk, no backend.
    pub fn provider_only(global: &Global) -> Result<Self> {
        let store = Arc::new(SqliteLeases::open_in_memory()?);
        Ok(Setup {
            runtime: runtime(global, store)?,
            local: None,
        })
    }

    /// The provider and a backend: the configured API, or (when none is
    /// configured and `allow_embedded`) an embedded local backend. Leases go
    /// to the durable store, except with the embedded backend, whose
    /// sandboxes end with this process.
    pub fn with_backend(global: &Global, allow_embedded: bool) -> Result<Self> {
        // Without --api-url and --config nothing names an API: the embedded
        // engine is certain, so it starts (probing isolation and disks on
        // its own thread) while the component loads.
        let early = (allow_embedded && global.api_url.is_none() && global.config.is_none())
            .then(|| EmbeddedEngine::begin(&EngineSetting::of_run(global), Ports::ANY, None))
            .transpose()?;
        let component = load_component(global)?;
        let description = component
            .instantiate(sandbox_host::HostOptions::new())?
            .describe()?;
        let url_fields: Vec<String> = description
            .origin_fields
            .iter()
            .map(|o| o.config_field.clone())
            .collect();
        if configures_a_url(global, &url_fields)? {
            return Self::for_stored_leases(global);
        }
        let first = url_fields.first().map_or("apiUrl", String::as_str);
        if !allow_embedded {
            bail!(
                "this command needs a backend that outlives this process: pass --api-url \
                 or set {first} in --config"
            );
        }
        // The engine probes isolation and disks on its own thread while
        // the runtime is built here.
        let starting = match early {
            Some(starting) => starting,
            None => EmbeddedEngine::begin(&EngineSetting::of_run(global), Ports::ANY, None)?,
        };
        let store = Arc::new(SqliteLeases::open_in_memory()?);
        // The embedded backend has no rate limit to respect.
        let runtime = runtime_of(component, global, store)?.with_rate_limit(None);
        let local = starting.wait(&description.driver_key)?;
        Ok(Setup {
            runtime,
            local: Some(local),
        })
    }

    /// One short line for stderr when the embedded engine runs sandboxes in
    /// a weaker model than one machine per sandbox (issue 37 item 7): what
    /// is missing and the fix. `None` with one machine per sandbox, with
    /// another backend, and with `--isolation process-group` (which has
    /// its own warning).
    #[cfg(feature = "local-backend")]
    pub fn weaker_model(&self) -> Option<String> {
        let local = self.local.as_ref()?;
        if *local.server.isolation() != sandbox_engine::IsolationMode::Bwrap
            || sandbox_engine::machine::enabled_here()
        {
            return None;
        }
        Some(format!(
            "sandbox: weaker model here: namespaces per command, not one machine per sandbox \
             (what a command leaves running ends with it): {}",
            sandbox_engine::machine::user_namespaces_refused()
                .unwrap_or_else(|| "this host gives no tree proof for machines".to_string())
        ))
    }

    #[cfg(not(feature = "local-backend"))]
    pub fn weaker_model(&self) -> Option<String> {
        None
    }

    /// Why the embedded engine refused the sandbox's first command: it
    /// starts without a probe and that command proves bubblewrap works
    /// (`prove_isolation_at_start(false)`); where bubblewrap cannot
    /// confine it, the refusal and its fix, which the provider's error
    /// (an HTTP 503) does not carry. `None` with another backend.
    #[cfg(feature = "local-backend")]
    pub fn isolation_refused(&self) -> Option<String> {
        self.local.as_ref()?.server.isolation_refused()
    }

    #[cfg(not(feature = "local-backend"))]
    pub fn isolation_refused(&self) -> Option<String> {
        None
    }

    /// The provider and the durable lease store: `--store` (a PostgreSQL
    /// URL several hosts share, or a file), else the SQLite file in the
    /// data directory. A wrong URL, an unreachable database or a newer
    /// schema fail here, before any sandbox is created.
    pub fn for_stored_leases(global: &Global) -> Result<Self> {
        let dir = data_dir(global);
        // The component loads (reads, checks its digest, maps its compiled
        // code) on a thread of its own while the stores open: the two cost
        // about the same, and a command on a held lease waited for both in
        // turn (BENCHMARKS.md, issue 41 item 1).
        std::thread::scope(|scope| {
            let component = scope.spawn(|| load_component(global));
            let stores = open_stores(global, &dir);
            let component = component
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            // A store that cannot be opened is reported first, as when
            // the stores opened before the component loaded.
            let (store, pacer) = stores?;
            let component = component?;
            Ok(Setup {
                runtime: runtime_of(component, global, store)?.with_request_pacer(pacer),
                local: None,
            })
        })
    }

    /// The environment from `--config`, `--api-url` (or the embedded
    /// backend) and the resolved secret.
    pub fn environment(&self, global: &Global) -> Result<Environment> {
        let mut config: Value =
            serde_json::from_str(&read_config(global)?).context("the config is not JSON")?;
        let object = config
            .as_object_mut()
            .context("the config is not a JSON object")?;
        if let Some(url) = &global.api_url {
            let field = self
                .runtime
                .description()
                .origin_fields
                .first()
                .map(|o| o.config_field.clone())
                .context("the provider declares no API URL field for --api-url to set")?;
            object.insert(field, Value::String(url.clone()));
        }
        if let Some(local) = &self.local {
            for (field, url) in &local.urls {
                object.insert(field.clone(), Value::String(url.clone()));
            }
        }
        let config = config.to_string();
        let secrets = self.secrets(global)?;
        self.explain_withheld_keys(&config, &secrets);
        self.runtime
            .environment(&global.company, &global.environment, &config, &secrets)
    }

    /// The environment a stored lease was acquired in (its stored config,
    /// which never holds the secret, plus the secret resolved again).
    pub fn environment_of(&self, global: &Global, lease_id: &str) -> Result<Environment> {
        let record = self
            .runtime
            .store()
            .get(lease_id)?
            .with_context(|| format!("no lease {lease_id} in the lease store"))?;
        let secrets = self.secrets(global)?;
        self.explain_withheld_keys(&record.config, &secrets);
        self.runtime.environment(
            &record.company_id,
            &record.environment_id,
            &record.config,
            &secrets,
        )
    }

    /// Stops the embedded backend, if one runs, and says if anything survived.
    pub fn finish(self) {
        if let Some(local) = self.local {
            let _ = local.stop();
        }
    }

    /// Says, before any request, when a key variable is set but withheld
    /// from the API the config names (only the provider's own API gets the
    /// variable's key): otherwise the user sees only the API's 401.
    fn explain_withheld_keys(&self, config: &str, secrets: &Secrets) {
        let Ok(withheld) = secrets.withheld_keys(config, self.runtime.description()) else {
            return; // the environment itself reports a bad config
        };
        let mut by_var: Vec<(String, Vec<String>)> = Vec::new();
        for (var, origin) in withheld {
            let origin = origin.to_string();
            match by_var.iter_mut().find(|(v, _)| *v == var) {
                Some((_, origins)) if !origins.contains(&origin) => origins.push(origin),
                Some(_) => {}
                None => by_var.push((var, vec![origin])),
            }
        }
        for (var, origins) in by_var {
            let how = match origins.as_slice() {
                [origin] => format!(
                    "To send it to this API, set {KEY_ORIGIN_VAR}={origin} (or pass the key \
                     with --api-key-file FILE)."
                ),
                _ => format!(
                    "{KEY_ORIGIN_VAR} names one origin only, so pass the key with \
                     --api-key-file FILE (or SANDBOX_API_KEY_FILE)."
                ),
            };
            eprintln!(
                "sandbox: note: {var} is set but its key is not sent to {}: the CLI sends that \
                 variable's key only to the provider's own API. {how}",
                origins.join(" and ")
            );
        }
    }

    fn secrets(&self, global: &Global) -> Result<Secrets> {
        let mut secrets = Secrets::from_env_for(&self.runtime.description().driver_key);
        let key = match (&self.local, &global.api_key_file) {
            (Some(local), _) => Some(local.api_key.clone()),
            (None, Some(file)) => Some(
                std::fs::read_to_string(file)
                    .with_context(|| format!("reading the API key file {}", file.display()))?
                    .trim()
                    .to_owned(),
            ),
            (None, None) => None,
        };
        if let Some(key) = key {
            for field in &self.runtime.description().secrets {
                secrets = secrets.with(&field.config_field, key.clone());
            }
        }
        Ok(secrets)
    }
}

/// The embedded engine served on its own by `sandbox engine`, with the
/// files that point other `sandbox` processes at it.
pub struct Engine {
    local: EmbeddedEngine,
    /// `engine/lock` in the data directory, locked while this engine
    /// serves: the kernel releases it when the process ends, however.
    _lock: std::fs::File,
    /// A config naming the engine's URLs for the provider.
    pub config_file: PathBuf,
    /// The engine's API key (mode 0600).
    pub key_file: PathBuf,
}

impl Engine {
    /// Starts the engine for `global`'s provider on `port` (0: any free
    /// port; `None`: the port of the engine that served this data
    /// directory before, when it is free) and writes its config and key
    /// under the data directory. The engine keeps its records in
    /// `engine/state`: a predecessor that died has its sandboxes proven
    /// gone (or reported unconfirmed) before this one answers. With
    /// `ingress` the engine lets sandboxes' ports be opened, and the config
    /// sets the provider's `ingress` field (when its schema has one) so
    /// that its sandboxes are made to allow it.
    pub fn start(global: &Global, port: Option<u16>, ingress: bool) -> Result<Engine> {
        let dir = data_dir(global).join("engine");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let lock = lock_engine_dir(&dir)?;
        let component = load_component(global)?;
        let description = component
            .instantiate(sandbox_host::HostOptions::new())?
            .describe()?;
        let config_file = dir.join(format!("{}.json", description.driver_key));
        let state = dir.join("state");
        if !state.exists() && config_file.exists() {
            // An engine that kept no records served here: the state
            // directory made now cannot vouch for ids it issued (see
            // sandbox_engine::storage::records).
            std::fs::create_dir_all(&state)
                .with_context(|| format!("creating {}", state.display()))?;
        }
        let before = previous_ports(&config_file);
        let (ports, taken) = match port {
            Some(api) => (Ports { api, toolbox: 0 }, None),
            None => match before {
                Some(old) if old.free() => (old, None),
                Some(old) => (Ports::ANY, Some(old.api)),
                None => (Ports::ANY, None),
            },
        };
        let setting = EngineSetting {
            isolation: global.isolation,
            egress: &global.egress,
            ingress,
            kept_disks: kept_disks(global),
        };
        let local = match EmbeddedEngine::start_on(&setting, &description.driver_key, ports, &state)
        {
            // Taken between the check and the bind: any port.
            Err(_) if port.is_none() && ports != Ports::ANY => {
                let local = EmbeddedEngine::start_on(
                    &setting,
                    &description.driver_key,
                    Ports::ANY,
                    &state,
                )?;
                eprintln!("sandbox: {}", port_taken_note(ports.api));
                local
            }
            other => other?,
        };
        if let Some(old) = taken {
            eprintln!("sandbox: {}", port_taken_note(old));
        }
        let key_file = dir.join("api-key");
        write_private(&key_file, local.api_key.as_bytes())?;
        let mut config: serde_json::Map<String, Value> = local
            .urls
            .iter()
            .map(|(field, url)| (field.clone(), Value::String(url.clone())))
            .collect();
        if ingress && schema_has_field(&description.config_schema, "ingress") {
            config.insert("ingress".into(), Value::Bool(true));
        }
        write_private(&config_file, Value::Object(config).to_string().as_bytes())?;
        Ok(Engine {
            local,
            _lock: lock,
            config_file,
            key_file,
        })
    }

    /// `(config field, URL)` for each URL the provider is pointed at.
    pub fn urls(&self) -> &[(String, String)] {
        &self.local.urls
    }

    /// Stops the engine (every sandbox in it ends); false when some
    /// process could not be confirmed gone.
    pub fn stop(self) -> bool {
        let _ = std::fs::remove_file(&self.key_file);
        self.local.stop()
    }
}

/// The loopback ports an engine listens on (0: any free port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ports {
    api: u16,
    toolbox: u16,
}

impl Ports {
    const ANY: Ports = Ports { api: 0, toolbox: 0 };

    /// Whether both ports can be bound now on loopback.
    fn free(self) -> bool {
        [self.api, self.toolbox]
            .iter()
            .filter(|p| **p != 0)
            .all(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
    }
}

/// The ports in the config a previous `sandbox engine` wrote (its API
/// URL's, and its toolbox URL's when it has one).
fn previous_ports(config_file: &Path) -> Option<Ports> {
    let text = std::fs::read_to_string(config_file).ok()?;
    let fields: serde_json::Map<String, Value> = serde_json::from_str(&text).ok()?;
    let port_of = |field: &str| -> Option<u16> {
        let url = fields.get(field)?.as_str()?.parse::<http::Uri>().ok()?;
        url.port_u16()
    };
    Some(Ports {
        api: port_of("apiUrl")?,
        toolbox: port_of("toolboxUrl").unwrap_or(0),
    })
}

/// What it means that the previous engine's port is taken.
fn port_taken_note(port: u16) -> String {
    format!(
        "note: port {port}, where the engine before this one served, is taken, so this one \
         serves on another: leases acquired from that engine still point at port {port} and \
         cannot reach this one; their commands keep failing and they stay poisoned. Free the \
         port and start `sandbox engine` again to clear them"
    )
}

/// When the config in use is the one a `sandbox engine` wrote (under the
/// data directory's `engine/`) and nothing listens at its API URL any more,
/// what that means for the user's leases; `None` otherwise. The check is a
/// fact of this moment (a refused connection to a loopback URL), not a
/// proof about any sandbox: the leases stay as the store has them.
pub fn dead_engine_note(global: &Global) -> Option<String> {
    let config = global.config.as_deref()?;
    let engine_dir = std::fs::canonicalize(data_dir(global).join("engine")).ok()?;
    if std::fs::canonicalize(config).ok()?.parent()? != engine_dir {
        return None;
    }
    let text = std::fs::read_to_string(config).ok()?;
    let fields: serde_json::Map<String, Value> = serde_json::from_str(&text).ok()?;
    let url = fields.get("apiUrl")?.as_str()?;
    let authority = url.parse::<http::Uri>().ok()?.authority()?.clone();
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let address = std::net::SocketAddr::new(host.parse().ok()?, authority.port_u16()?);
    if !address.ip().is_loopback() {
        return None;
    }
    match std::net::TcpStream::connect_timeout(&address, std::time::Duration::from_secs(1)) {
        Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => Some(format!(
            "the engine this lease came from (`sandbox engine`, {url}) is not running: it was \
             stopped or died, and its sandboxes ended with it (an engine's guard ends every \
             process in it). This lease cannot run commands again. Start `sandbox engine` again \
             on this data directory: it serves on the same port when that port is free and \
             proves that engine's sandboxes gone, and then `sandbox lease release` or \
             `sandbox lease destroy` clears this lease; acquire a new lease to run commands. \
             Until then the lease stays as `sandbox lease list` shows it"
        )),
        _ => None,
    }
}

/// Locks `dir/lock` for the engine about to serve from `dir`. A second
/// engine on the same data directory would rewrite the key and config files
/// the first one's leases use (their next commands would be refused with
/// 401, or sent to the wrong engine), so it is refused before it starts.
fn lock_engine_dir(dir: &Path) -> Result<std::fs::File> {
    let path = dir.join("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => bail!(
            "another `sandbox engine` already serves the data directory {}; nothing was \
             started. Point other shells at the running one (the export line it printed), \
             stop it first, or give this one a directory of its own (--data-dir DIR)",
            dir.parent().unwrap_or(dir).display()
        ),
        Err(std::fs::TryLockError::Error(error)) => {
            Err(error).with_context(|| format!("locking {}", path.display()))
        }
    }
}

/// Writes `bytes` to a new file only its owner can read.
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
        .with_context(|| format!("writing {}", path.display()))
}

/// The embedded engine while it starts (see [`EmbeddedEngine::begin`]).
struct StartingEngine {
    #[cfg(feature = "local-backend")]
    server: sandbox_engine::StartingServer,
    api_key: String,
}

impl StartingEngine {
    /// Waits until the engine listens; its URLs for the provider whose
    /// driver is `driver_key`. The engine has the createos and daytona
    /// faces only: another provider stops it again, nothing having run.
    #[cfg(feature = "local-backend")]
    fn wait(self, driver_key: &str) -> Result<EmbeddedEngine> {
        if !matches!(driver_key, "createos" | "daytona") {
            bail!(
                "the embedded engine serves the createos and daytona APIs, not {driver_key}'s: \
                 pass --api-url (and the provider's other URLs in --config)"
            );
        }
        let server = self.server.wait().context(
            "the embedded local backend refused to start, nothing was run \
             (or pass --api-url to use another backend)",
        )?;
        // The engine serves each provider's API face; the config fields
        // that point a provider at it are that provider's.
        let urls = if driver_key == "daytona" {
            vec![
                ("apiUrl".to_owned(), server.daytona_api_url()),
                ("toolboxUrl".to_owned(), server.toolbox_url().to_owned()),
            ]
        } else {
            vec![("apiUrl".to_owned(), server.base_url())]
        };
        Ok(EmbeddedEngine {
            server,
            urls,
            api_key: self.api_key,
        })
    }

    #[cfg(not(feature = "local-backend"))]
    fn wait(self, _driver_key: &str) -> Result<EmbeddedEngine> {
        let _ = self.api_key;
        bail!("this build has no embedded backend: pass --api-url or set the API URL in --config")
    }
}

/// Whether a config JSON Schema names `field` among its properties.
fn schema_has_field(schema: &str, field: &str) -> bool {
    serde_json::from_str::<Value>(schema)
        .ok()
        .and_then(|schema| schema.get("properties")?.get(field).cloned())
        .is_some()
}

/// How an embedded engine is set up: its isolation, its egress allow-list
/// (the ceiling of every sandbox's own), and whether ports may be opened.
struct EngineSetting<'a> {
    isolation: crate::Isolation,
    egress: &'a [String],
    ingress: bool,
    /// Where the empty file system of the sandboxes' disks is kept
    /// between engines (the data directory's `disk-templates`): formatting
    /// one was 3 to 6 ms of every start.
    kept_disks: PathBuf,
}

impl<'a> EngineSetting<'a> {
    /// The engine `sandbox run` starts for itself: no ports to open.
    fn of_run(global: &'a Global) -> Self {
        EngineSetting {
            isolation: global.isolation,
            egress: &global.egress,
            ingress: false,
            kept_disks: kept_disks(global),
        }
    }
}

/// See [`EngineSetting::kept_disks`].
fn kept_disks(global: &Global) -> PathBuf {
    data_dir(global).join("disk-templates")
}

impl EmbeddedEngine {
    fn start_on(
        setting: &EngineSetting<'_>,
        driver_key: &str,
        ports: Ports,
        state: &Path,
    ) -> Result<Self> {
        Self::begin(setting, ports, Some(state))?.wait(driver_key)
    }

    /// Starts the engine on its own thread without waiting for it to
    /// listen.
    #[cfg(feature = "local-backend")]
    fn begin(
        setting: &EngineSetting<'_>,
        ports: Ports,
        state: Option<&Path>,
    ) -> Result<StartingEngine> {
        use sandbox_engine::IsolationPreference;
        let policy = sandbox_engine::network::egress::Policy::parse(setting.egress)
            .map_err(|e| anyhow::anyhow!(e))?;
        if policy.enabled() && !sandbox_engine::machine::enabled_here() {
            eprintln!(
                "sandbox: warning: --egress needs one machine per sandbox (user namespaces \
                 that work); commands here have no outbound network"
            );
        }
        let api_key = random_key()?;
        let preference = match setting.isolation {
            crate::Isolation::Bwrap => IsolationPreference::RequireBwrap,
            crate::Isolation::ProcessGroup => {
                eprintln!(
                    "sandbox: warning: --isolation process-group: commands run with NO isolation \
                     (as you, on this machine's files and network)"
                );
                IsolationPreference::ProcessGroup
            }
        };
        let mut builder = sandbox_engine::Server::builder()
            .port(ports.api)
            .api_key(api_key.clone())
            .isolation(preference)
            .egress(policy)
            .ingress(setting.ingress)
            .toolbox_port(ports.toolbox)
            // Sandboxes of the embedded engine run at once: no
            // simulated `creating` state to poll through.
            .transition_delay(std::time::Duration::ZERO)
            .quiet(true);
        builder = builder.keep_disk_templates_in(&setting.kept_disks);
        match state {
            Some(state) => builder = builder.state_dir(state),
            // This process's own engine serves its one command: one thread
            // per runtime hands the output on with fewer wake-ups (a 50 MB
            // run on 2 cores: 150 -> 136 ms). `sandbox engine` keeps two.
            // Its first command, which follows at once, proves that
            // bubblewrap confines commands here instead of a probe machine
            // of its own (issue 41 item 2); `sandbox engine` probes at
            // start, so that an operator learns of a refusal at once.
            None => builder = builder.worker_threads(1).prove_isolation_at_start(false),
        }
        let server = sandbox_engine::BackgroundServer::spawn(builder).context(
            "the embedded local backend refused to start, nothing was run \
             (or pass --api-url to use another backend)",
        )?;
        Ok(StartingEngine { server, api_key })
    }

    #[cfg(not(feature = "local-backend"))]
    fn begin(
        setting: &EngineSetting<'_>,
        _ports: Ports,
        _state: Option<&Path>,
    ) -> Result<StartingEngine> {
        if !setting.egress.is_empty() {
            bail!("--egress applies to the embedded backend, which this build does not have");
        }
        bail!("this build has no embedded backend: pass --api-url or set the API URL in --config")
    }

    /// Stops the backend; false (with a warning) when some process could
    /// not be confirmed gone.
    fn stop(self) -> bool {
        let _ = (&self.urls, &self.api_key);
        #[cfg(feature = "local-backend")]
        {
            let report = self.server.shutdown();
            if !report.all_exited() {
                let pids: Vec<String> = report.survivors.iter().map(i32::to_string).collect();
                eprintln!(
                    "sandbox: warning: the local backend could not confirm that every process \
                     exited: {} of its {} processes unverified, host pids still alive: {}; \
                     check them with `ps -p PID` and end them with `kill -9 PID`",
                    report.unverified.len(),
                    report.processes,
                    if pids.is_empty() {
                        "none found".to_owned()
                    } else {
                        pids.join(" ")
                    }
                );
                return false;
            }
        }
        true
    }
}

/// The `--config` file's text, or `{}`.
pub fn read_config(global: &Global) -> Result<String> {
    match &global.config {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("reading the config {}", path.display())),
        None => Ok("{}".to_owned()),
    }
}

/// Whether `--api-url` or the config names one of the provider's API URLs.
fn configures_a_url(global: &Global, url_fields: &[String]) -> Result<bool> {
    if global.api_url.is_some() {
        return Ok(true);
    }
    let config: Value =
        serde_json::from_str(&read_config(global)?).context("the config is not JSON")?;
    Ok(url_fields
        .iter()
        .any(|field| config.get(field).and_then(Value::as_str).is_some()))
}

/// The provider component, compiled once per machine (the artifact cache).
fn load_component(global: &Global) -> Result<ProviderComponent> {
    let engine = shared_engine()?;
    let cache = ArtifactCache::new(ArtifactCache::default_dir());
    match find_provider(global.provider.as_deref())? {
        ProviderSource::File(path) => ProviderComponent::load_cached(&engine, &path, &cache),
        ProviderSource::Embedded(embedded) => {
            let what = || format!("loading the {} provider built into sandbox", embedded.name);
            let component = cache.load(&engine, embedded.bytes).with_context(what)?;
            ProviderComponent::from_component(&engine, component).with_context(what)
        }
    }
}

fn runtime(global: &Global, store: Arc<dyn LeaseStore>) -> Result<SandboxRuntime> {
    runtime_of(load_component(global)?, global, store)
}

/// The lease store (`--store`, or the data directory's SQLite file) and
/// the request budget every `sandbox` process sharing the data directory
/// spends, one per API origin.
fn open_stores(global: &Global, dir: &Path) -> Result<(Arc<dyn LeaseStore>, RequestPacer)> {
    let store: Arc<dyn LeaseStore> = match &global.store {
        Some(url) => open_store(url)?,
        None => Arc::new(SqliteLeases::open(dir.join("leases.sqlite"))?),
    };
    let pacer = RequestPacer::open(&dir.join("rate-budget.sqlite"))?;
    Ok((store, pacer))
}

/// The runtime of an already loaded `component`.
fn runtime_of(
    component: ProviderComponent,
    global: &Global,
    store: Arc<dyn LeaseStore>,
) -> Result<SandboxRuntime> {
    let stderr = if global.verbose {
        GuestStderr::Inherit
    } else {
        GuestStderr::Discard
    };
    let runtime = SandboxRuntime::new(component, store, Arc::new(NetworkTransport::new()))?
        .with_guest_stderr(stderr);
    Ok(match &global.rate_limit {
        Some(text) => runtime.with_rate_limit(Some(RateLimit::parse(text)?)),
        None => runtime,
    })
}

/// Where the provider component comes from (`--provider`).
pub enum ProviderSource {
    /// A component file.
    File(PathBuf),
    /// One built into this binary.
    Embedded(crate::embedded::Embedded),
}

impl ProviderSource {
    /// One line for people: which component, its version and digest.
    pub fn label(&self) -> String {
        match self {
            ProviderSource::File(path) => {
                let digest = std::fs::read(path)
                    .map(|bytes| crate::embedded::sha256_hex(&bytes))
                    .unwrap_or_else(|e| format!("unreadable: {e}"));
                format!("{} (sha256 {digest})", path.display())
            }
            ProviderSource::Embedded(e) => format!(
                "{} provider {}, built into this binary (sha256 {})",
                e.name, e.version, e.digest
            ),
        }
    }
}

/// `--provider`: a component file, or the name of a component built into
/// this binary (`createos`, `daytona`; `daytona.wasm` and
/// `daytona_provider.wasm` name it too). Default: `createos`.
pub fn find_provider(explicit: Option<&Path>) -> Result<ProviderSource> {
    let wanted = explicit.unwrap_or(Path::new(DEFAULT_PROVIDER));
    if wanted.is_file() {
        return Ok(ProviderSource::File(wanted.to_owned()));
    }
    match wanted.to_str() {
        Some(name) if !name.contains('/') => match crate::embedded::named(name) {
            Some(embedded) => Ok(ProviderSource::Embedded(embedded)),
            None => {
                let names: Vec<&str> = crate::embedded::all().map(|e| e.name).collect();
                bail!(
                    "no provider named {name}: this sandbox carries {}; pass a component file \
                     with --provider FILE",
                    names.join(" and ")
                )
            }
        },
        _ => bail!("the provider component {} does not exist", wanted.display()),
    }
}

pub fn data_dir(global: &Global) -> PathBuf {
    if let Some(dir) = &global.data_dir {
        return dir.clone();
    }
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("sandbox");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(home).join(".local/share/sandbox");
    }
    PathBuf::from(".sandbox")
}

#[cfg(feature = "local-backend")]
fn random_key() -> Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom for the local backend's key")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether progress lines should be shown (stderr is a terminal).
pub fn show_progress() -> bool {
    std::io::stderr().is_terminal()
}
