//! The provider components built into this binary (`build.rs`): the
//! workspace's CreateOS and Daytona providers, so that an installed
//! `sandbox` needs no file beside it. `--provider createos|daytona` names
//! one of them; `--provider FILE` still loads any component.

use sha2::{Digest, Sha256};

include!(concat!(env!("OUT_DIR"), "/embedded_components.rs"));

/// One embedded component.
#[derive(Clone, Copy)]
pub struct Embedded {
    /// `createos` or `daytona`.
    pub name: &'static str,
    /// Its crate's version.
    pub version: &'static str,
    /// The SHA-256 of its bytes, hex (what `--version` and `describe` show).
    pub digest: &'static str,
    /// The component's bytes.
    pub bytes: &'static [u8],
}

/// Every embedded component.
pub fn all() -> impl Iterator<Item = Embedded> {
    EMBEDDED
        .iter()
        .map(|(name, version, digest, bytes)| Embedded {
            name,
            version,
            digest,
            bytes,
        })
}

/// The embedded component a `--provider` value names: `createos`,
/// `createos.wasm` and `createos_provider.wasm` all name the CreateOS one.
pub fn named(value: &str) -> Option<Embedded> {
    let stem = value.strip_suffix(".wasm").unwrap_or(value);
    let stem = stem.strip_suffix("_provider").unwrap_or(stem);
    all().find(|e| e.name == stem)
}

/// The SHA-256 of `bytes`, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What `sandbox --version` prints: the CLI's version, the contract
/// versions it hosts and each embedded component.
pub fn version_text() -> String {
    let contracts: Vec<&str> = sandbox_host::SERVED_INTERFACES
        .iter()
        .filter_map(|i| i.rsplit_once('@').map(|(_, v)| v))
        .collect();
    let mut text = format!(
        "{}\nhosts the sandbox-provider contract {}\n",
        env!("CARGO_PKG_VERSION"),
        contracts.join(", ")
    );
    for e in all() {
        text.push_str(&format!(
            "embedded {} provider {} (sha256 {})\n",
            e.name, e.version, e.digest
        ));
    }
    text.trim_end().to_owned()
}
