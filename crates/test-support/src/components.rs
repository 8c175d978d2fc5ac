//! The components `./build.sh` builds, found and loaded the same way by
//! every suite.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sandbox_host::{shared_engine, ProviderComponent};

/// The workspace's root folder (where `target/` is).
pub fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/test-support is two folders below the workspace root")
        .to_path_buf()
}

/// Where `./build.sh` puts the component whose file name is `file_name`
/// (for example `createos_provider.wasm`, or
/// `examples/minimal_provider.wasm`).
pub fn built_component(file_name: &str) -> PathBuf {
    workspace_dir()
        .join("target/wasm32-wasip2/release")
        .join(file_name)
}

/// The component `file_name` built by `./build.sh`, compiled; panics with
/// the command that builds it when it is missing.
pub fn load(file_name: &str) -> ProviderComponent {
    load_path(&built_component(file_name))
}

/// The component at `path`, compiled on the shared engine; panics with
/// the command that builds it when it is missing.
pub fn load_path(path: &Path) -> ProviderComponent {
    assert!(
        path.exists(),
        "{} is missing: run ./build.sh first",
        path.display()
    );
    let engine = shared_engine().expect("engine");
    ProviderComponent::load(&engine, path).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The CreateOS component (`$CREATEOS_PROVIDER_WASM`, or the one
/// `./build.sh` built), compiled once per test binary.
pub fn createos() -> &'static ProviderComponent {
    static COMPONENT: OnceLock<ProviderComponent> = OnceLock::new();
    COMPONENT.get_or_init(|| match std::env::var_os("CREATEOS_PROVIDER_WASM") {
        Some(path) => load_path(Path::new(&path)),
        None => load("createos_provider.wasm"),
    })
}

/// The Daytona component `./build.sh` built, compiled once per test binary.
pub fn daytona() -> &'static ProviderComponent {
    static COMPONENT: OnceLock<ProviderComponent> = OnceLock::new();
    COMPONENT.get_or_init(|| load("daytona_provider.wasm"))
}
