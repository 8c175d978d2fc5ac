//! The conformance kit: provider-neutral scenarios that any
//! `sandbox-provider` component passes against its backend.
//!
//! This is the workspace's umbrella package: `src/` holds the kit, and
//! `tests/` runs it (and the end-to-end suites) against every provider in
//! `providers/`.

use std::path::PathBuf;

/// Where `./build.sh` puts the component whose file name is `file_name`
/// (for example `createos_provider.wasm`).
pub fn built_component(file_name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/wasm32-wasip2/release")
        .join(file_name)
}
