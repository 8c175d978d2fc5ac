//! Shared test helpers: the test provider component, built and compiled
//! once per test binary.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use sandbox_host::types::{EnvironmentContext, Lease};
use sandbox_host::{shared_engine, ProviderComponent};

pub fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate is inside the workspace")
        .to_path_buf()
}

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

/// Pids of live processes whose command line is exactly `words`.
pub fn processes(words: &[&str]) -> Vec<u32> {
    let wanted: Vec<u8> = words
        .iter()
        .flat_map(|w| [w.as_bytes(), b"\0"].concat())
        .collect();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(Path::new("/proc").join(pid.to_string()).join("cmdline"))
            .unwrap_or_default();
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = state
            .rsplit(')')
            .next()
            .is_some_and(|s| s.trim_start().starts_with('Z'));
        if cmdline == wanted && !zombie {
            found.push(pid);
        }
    }
    found
}

/// The CreateOS component ./build.sh built, or `None` (with a note) before
/// it ran.
pub fn built_provider() -> Option<PathBuf> {
    let wasm = workspace_dir().join("target/wasm32-wasip2/release/createos_provider.wasm");
    if wasm.is_file() {
        Some(wasm)
    } else {
        eprintln!("skipped: {} not built yet (run ./build.sh)", wasm.display());
        None
    }
}

/// The `sandbox` CLI with `provider`, a data directory of its own (named
/// by `tag`) and no CREATEOS_API_KEY from the test's environment.
pub fn sandbox_cli(provider: &Path, tag: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sandbox"));
    let data = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
    command
        .env("SANDBOX_PROVIDER", provider)
        .env("SANDBOX_DATA_DIR", data)
        .env_remove("CREATEOS_API_KEY")
        // A piped stdin is read and given to the command: tests that want
        // one set it; none inherits the test runner's.
        .stdin(std::process::Stdio::null());
    command
}
