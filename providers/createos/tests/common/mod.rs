//! What every test binary of the root package shares: the built component.

use sandbox_host::{shared_engine, ProviderComponent};
use std::path::PathBuf;
use std::sync::OnceLock;

/// The component built by `./build.sh` (or `$CREATEOS_PROVIDER_WASM`),
/// compiled once per test binary.
pub fn component() -> &'static ProviderComponent {
    static COMPONENT: OnceLock<ProviderComponent> = OnceLock::new();
    COMPONENT.get_or_init(|| {
        let path = std::env::var_os("CREATEOS_PROVIDER_WASM")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("target/wasm32-wasip2/release/createos_provider.wasm")
            });
        assert!(
            path.exists(),
            "{} is missing: run ./build.sh first",
            path.display()
        );
        let engine = shared_engine().expect("engine");
        ProviderComponent::load(&engine, &path).expect("component loads")
    })
}
