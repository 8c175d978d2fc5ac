//! Shared test helpers: the test provider component, built and compiled
//! once per test binary.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use sandbox_host::types::{EnvironmentContext, Lease};
use sandbox_host::{shared_engine, Liveness, ProviderComponent};

pub use test_support::workspace_dir;

/// Builds the test provider once per test binary and compiles it once.
pub fn test_provider() -> &'static ProviderComponent {
    static COMPONENT: OnceLock<ProviderComponent> = OnceLock::new();
    COMPONENT.get_or_init(|| {
        let wasm = build_fixture("test-provider");
        let engine = shared_engine().expect("engine");
        ProviderComponent::load(&engine, &wasm).unwrap_or_else(|e| panic!("{e:#}"))
    })
}

/// Builds the fixture crate `tests/fixtures/<name>` for wasm32-wasip2 and
/// returns its component's path.
pub fn build_fixture(name: &str) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .join("Cargo.toml");
    let target_dir = workspace_dir().join("target/sandbox-host-fixtures");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--manifest-path",
        ])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .expect("running cargo to build a fixture component");
    assert!(
        status.success(),
        "building the fixture {name} failed (is `rustup target add wasm32-wasip2` done?)"
    );
    target_dir
        .join("wasm32-wasip2/release")
        .join(format!("{}.wasm", name.replace('-', "_")))
}

pub fn ctx(config: &str) -> EnvironmentContext {
    EnvironmentContext {
        driver_key: "test".into(),
        company_id: "company".into(),
        environment_id: "env".into(),
        issue_id: None,
        config: config.into(),
    }
}

pub fn lease() -> Lease {
    Lease {
        provider_lease_id: "sb-1".into(),
        metadata: "{}".into(),
        expires_at: None,
    }
}

/// Heartbeat 100 ms, gone after 1 s.
pub fn short_liveness() -> Liveness {
    Liveness::new(Duration::from_millis(100), Duration::from_secs(1)).unwrap()
}

/// The CreateOS component ./build.sh built. A test never passes without
/// it: a missing component fails the test with the command that builds it
/// (the README's test command runs ./build.sh first).
pub fn built_provider() -> PathBuf {
    let wasm = test_support::built_component("createos_provider.wasm");
    assert!(
        wasm.is_file(),
        "{} is not built: run ./build.sh first",
        wasm.display()
    );
    wasm
}

/// The `sandbox` CLI with `provider`, a data directory of its own (named
/// by `tag`) and no CREATEOS_API_KEY from the test's environment.
pub fn sandbox_cli(provider: &Path, tag: &str) -> Command {
    test_support::sandbox_cli!(tag)
        .provider(provider)
        .command(&[])
}
