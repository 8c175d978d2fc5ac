//! An on-disk cache of compiled components, keyed by the content hash of
//! the component and the engine's compatibility hash.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::Engine;

/// A directory of precompiled components (`<sha256>.cwasm`).
///
/// The files are native code that wasmtime maps and runs without checks, so
/// the directory must be writable only by the user running the host (the
/// default is under the user's cache directory). A file that fails to load
/// (other wasmtime version or settings, truncated write) is recompiled and
/// replaced.
#[derive(Clone, Debug)]
pub struct ArtifactCache {
    dir: PathBuf,
}

impl ArtifactCache {
    /// A cache in `dir` (created on first store).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ArtifactCache { dir: dir.into() }
    }

    /// `$XDG_CACHE_HOME/sandbox-host`, else `~/.cache/sandbox-host`, else a
    /// directory under the system temp dir.
    pub fn default_dir() -> PathBuf {
        if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
            return PathBuf::from(dir).join("sandbox-host");
        }
        if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
            return PathBuf::from(home).join(".cache/sandbox-host");
        }
        std::env::temp_dir().join("sandbox-host-cache")
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the artifact of `wasm` compiled by `engine` lives.
    pub fn artifact_path(&self, engine: &Engine, wasm: &[u8]) -> PathBuf {
        let mut engine_hash = std::collections::hash_map::DefaultHasher::new();
        engine
            .precompile_compatibility_hash()
            .hash(&mut engine_hash);
        let mut digest = Sha256::new();
        digest.update(wasm);
        digest.update(engine_hash.finish().to_le_bytes());
        let hex: String = digest
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        self.dir.join(format!("{hex}.cwasm"))
    }

    /// The compiled `wasm`: from the cache when present and loadable,
    /// otherwise compiled and stored (a failure to store is not an error).
    pub fn load(&self, engine: &Engine, wasm: &[u8]) -> Result<Component> {
        let path = self.artifact_path(engine, wasm);
        if path.is_file() {
            // SAFETY: the file is one this cache wrote with `serialize` for an
            // engine of the same compatibility hash, in a directory only the
            // user can write (see the type's docs); wasmtime also checks its
            // header and version before using it.
            if let Ok(component) = unsafe { Component::deserialize_file(engine, &path) } {
                return Ok(component);
            }
        }
        let component = Component::new(engine, wasm)
            .map_err(anyhow::Error::from)
            .context("compiling the provider component")?;
        let _ = self.store(&path, &component);
        Ok(component)
    }

    fn store(&self, path: &Path, component: &Component) -> Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let bytes = component.serialize().map_err(anyhow::Error::from)?;
        let temp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&temp, bytes)?;
        std::fs::rename(&temp, path)?;
        Ok(())
    }
}
