//! Finding the provider, the lease store and the backend, and building the
//! environment (config, secret) for a command.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use sandbox_host::{
    open_store, shared_engine, ArtifactCache, Environment, GuestStderr, LeaseBackend, LeaseStore,
    NetworkTransport, ProviderComponent, RateBudget, RateLimit, SandboxRuntime, Secrets,
};
use serde_json::Value;

use crate::Global;

/// The component ./build.sh produces.
const PROVIDER_FILE: &str = "createos_provider.wasm";
/// The config field `--api-url` sets (the CreateOS provider's).
const API_URL_FIELD: &str = "apiUrl";

/// Everything a subcommand works with.
pub struct Setup {
    pub runtime: SandboxRuntime,
    local: Option<LocalBackend>,
}

struct LocalBackend {
    #[cfg(feature = "local-backend")]
    server: createos_local::BackgroundServer,
    api_url: String,
    api_key: String,
}

impl Setup {
    /// The provider alone (describe, validate-config): no store on disk, no backend.
    pub fn provider_only(global: &Global) -> Result<Self> {
        let store = Arc::new(LeaseStore::open_in_memory()?);
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
        if configured_api_url(global)?.is_some() {
            return Self::for_stored_leases(global);
        }
        if !allow_embedded {
            bail!(
                "this command needs a backend that outlives this process: pass --api-url \
                 or set apiUrl in --config"
            );
        }
        let local = LocalBackend::start(global.isolation)?;
        let store = Arc::new(LeaseStore::open_in_memory()?);
        // The embedded backend has no rate limit to respect.
        let runtime = runtime(global, store)?.with_rate_limit(None);
        Ok(Setup {
            runtime,
            local: Some(local),
        })
    }

    /// The provider and the durable lease store: `--store` (a PostgreSQL
    /// URL several hosts share, or a file), else the SQLite file in the
    /// data directory. A wrong URL, an unreachable database or a newer
    /// schema fail here, before any sandbox is created.
    pub fn for_stored_leases(global: &Global) -> Result<Self> {
        let dir = data_dir(global);
        let store: Arc<dyn LeaseBackend> = match &global.store {
            Some(url) => open_store(url)?,
            None => Arc::new(LeaseStore::open(dir.join("leases.sqlite"))?),
        };
        // One request budget per API origin for every `sandbox` process
        // sharing this data directory.
        let budget = RateBudget::open(&dir.join("rate-budget.sqlite"))?;
        Ok(Setup {
            runtime: runtime(global, store)?.with_rate_budget(budget),
            local: None,
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
            object.insert(API_URL_FIELD.into(), Value::String(url.clone()));
        }
        if let Some(local) = &self.local {
            object.insert(API_URL_FIELD.into(), Value::String(local.api_url.clone()));
        }
        let config = config.to_string();
        let secrets = self.secrets(global)?;
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
            local.stop();
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

impl LocalBackend {
    #[cfg(feature = "local-backend")]
    fn start(isolation: crate::Isolation) -> Result<Self> {
        use createos_local::IsolationPreference;
        let api_key = random_key()?;
        let preference = match isolation {
            crate::Isolation::Bwrap => IsolationPreference::RequireBwrap,
            crate::Isolation::ProcessGroup => {
                eprintln!(
                    "sandbox: warning: --isolation process-group: commands run with NO isolation \
                     (as you, on this machine's files and network)"
                );
                IsolationPreference::ProcessGroup
            }
        };
        let server = createos_local::BackgroundServer::start(
            createos_local::Server::builder()
                .api_key(api_key.clone())
                .isolation(preference)
                .quiet(true),
        )
        .context(
            "the embedded local backend refused to start, nothing was run \
             (or pass --api-url to use another backend)",
        )?;
        let api_url = server.base_url();
        Ok(LocalBackend {
            server,
            api_url,
            api_key,
        })
    }

    #[cfg(not(feature = "local-backend"))]
    fn start(_isolation: crate::Isolation) -> Result<Self> {
        bail!("this build has no embedded backend: pass --api-url or set apiUrl in --config")
    }

    fn stop(self) {
        #[cfg(feature = "local-backend")]
        {
            let report = self.server.shutdown();
            if !report.all_exited() {
                eprintln!("sandbox: warning: the local backend could not confirm that every process exited: {report:?}");
            }
        }
        let _ = (self.api_url, self.api_key);
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

fn configured_api_url(global: &Global) -> Result<Option<String>> {
    if let Some(url) = &global.api_url {
        return Ok(Some(url.clone()));
    }
    let config: Value =
        serde_json::from_str(&read_config(global)?).context("the config is not JSON")?;
    Ok(config
        .get(API_URL_FIELD)
        .and_then(Value::as_str)
        .map(str::to_owned))
}

fn runtime(global: &Global, store: Arc<dyn LeaseBackend>) -> Result<SandboxRuntime> {
    let path = find_provider(global.provider.as_deref())?;
    let engine = shared_engine()?;
    let cache = ArtifactCache::new(ArtifactCache::default_dir());
    let component = ProviderComponent::load_cached(&engine, &path, &cache)?;
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

/// `--provider`, else `createos_provider.wasm` beside the binary or in the
/// `target/wasm32-wasip2/release` next to its target dir, else under the
/// current directory or one of its parents.
fn find_provider(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(path) = explicit {
        return Ok(path.to_owned());
    }
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_owned))
    {
        candidates.push(dir.join(PROVIDER_FILE));
        for up in dir.ancestors().skip(1).take(2) {
            candidates.push(up.join("wasm32-wasip2/release").join(PROVIDER_FILE));
        }
    }
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            candidates.push(dir.join("target/wasm32-wasip2/release").join(PROVIDER_FILE));
        }
    }
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    bail!(
        "no provider component found: run ./build.sh or pass --provider FILE (looked for {PROVIDER_FILE} beside the binary and under target/wasm32-wasip2/release)"
    )
}

fn data_dir(global: &Global) -> PathBuf {
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
