//! Builds the provider components the `sandbox` CLI carries inside it
//! (issue 39): the CreateOS and Daytona providers of this workspace, for
//! `wasm32-wasip2`, release, with the size settings `build.sh` uses, so
//! that `cargo install --path sandbox-host` alone gives a `sandbox` that
//! runs from any directory. As wasmtime builds its test programs: a
//! nested `cargo build` of the sibling crates, in a target directory of
//! its own (the outer build holds the locks of its own).
//!
//! Outside this workspace (the packaged crate, `sandbox-host/package.sh`),
//! the components come from the package's own `embedded/` directory,
//! where that script put the workspace's release builds with their crate
//! versions (`versions.txt`). `SANDBOX_EMBED_DIR` may name another
//! directory holding `createos_provider.wasm` and `daytona_provider.wasm`
//! (and optionally `versions.txt`) to embed instead.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::Digest;

const TARGET: &str = "wasm32-wasip2";
const PROVIDERS: [(&str, &str); 2] = [
    ("createos", "createos-provider"),
    ("daytona", "daytona-provider"),
];

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
    println!("cargo:rerun-if-env-changed=SANDBOX_EMBED_DIR");
    let packaged = manifest.join("embedded");
    let built = match std::env::var_os("SANDBOX_EMBED_DIR") {
        Some(dir) => PathBuf::from(dir),
        None if in_workspace(&manifest) => build_in_workspace(&manifest, &out),
        None if packaged.join("versions.txt").is_file() => {
            println!("cargo:rerun-if-changed={}", packaged.display());
            packaged
        }
        None => fail(
            "the providers' sources are not beside this crate and the package has no \
             embedded/ components: build from the sandbox workspace, or set SANDBOX_EMBED_DIR \
             to a directory holding createos_provider.wasm and daytona_provider.wasm",
        ),
    };
    let mut table = String::from(
        "/// The provider components built into this binary: (name, crate version,\n\
         /// SHA-256 of the bytes, bytes).\n\
         pub const EMBEDDED: [(&str, &str, &str, &[u8]); 2] = [\n",
    );
    for (name, krate) in PROVIDERS {
        let file = format!("{}.wasm", krate.replace('-', "_"));
        let from = built.join(&file);
        let to = out.join(&file);
        if let Err(e) = std::fs::copy(&from, &to) {
            fail(&format!(
                "the {name} provider component {} could not be read: {e}",
                from.display()
            ));
        }
        let version = crate_version(&manifest, &built, name);
        let bytes = std::fs::read(&to).expect("just copied");
        let digest: String = sha2::Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        table.push_str(&format!(
            "    ({name:?}, {version:?}, {digest:?}, include_bytes!({:?})),\n",
            to.display().to_string()
        ));
    }
    table.push_str("];\n");
    std::fs::write(out.join("embedded_components.rs"), table).expect("writing OUT_DIR");
}

/// Builds both providers from the workspace around `manifest` and returns
/// the directory holding their components.
fn build_in_workspace(manifest: &Path, out: &Path) -> PathBuf {
    let workspace = manifest
        .parent()
        .expect("sandbox-host lives in the workspace");
    for watched in [
        "providers/createos/src",
        "providers/createos/Cargo.toml",
        "providers/daytona/src",
        "providers/daytona/Cargo.toml",
        "crates/provider-sdk/src",
        "crates/provider-sdk/Cargo.toml",
        "wit",
        "Cargo.lock",
        ".cargo/config.toml",
    ] {
        println!(
            "cargo:rerun-if-changed={}",
            workspace.join(watched).display()
        );
    }
    ensure_target();
    // OUT_DIR is <target>/[<triple>/]<profile>/build/<pkg>-<hash>/out: the
    // components go beside the profiles, shared by every profile's build.
    let target_dir = out
        .ancestors()
        .nth(4)
        .unwrap_or(out)
        .join("embedded-components");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace)
        .args(["build", "--release", "--lib", "--target", TARGET])
        .arg("--target-dir")
        .arg(&target_dir);
    for (_, krate) in PROVIDERS {
        cmd.args(["-p", krate]);
    }
    // The size settings of build.sh; the host build's own flags and
    // wrappers (clippy's among them) are not the components'.
    cmd.env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "s")
        .env("CARGO_PROFILE_RELEASE_LTO", "true")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_PANIC", "abort")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET");
    let status = cmd.status().unwrap_or_else(|e| {
        fail(&format!(
            "cargo could not be run to build the components: {e}"
        ))
    });
    if !status.success() {
        fail("building the provider components for wasm32-wasip2 failed (see above)");
    }
    target_dir.join(TARGET).join("release")
}

/// Installs the `wasm32-wasip2` target when rustup can, else stops with the
/// command that does.
fn ensure_target() {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let installed = |root: &PathBuf| root.join("lib/rustlib").join(TARGET).join("lib").is_dir();
    if sysroot.as_ref().is_some_and(installed) {
        return;
    }
    let added = Command::new("rustup")
        .args(["target", "add", TARGET])
        .status()
        .is_ok_and(|s| s.success());
    if !added {
        fail(
            "the sandbox CLI carries its provider components, built for wasm32-wasip2, and this \
             toolchain lacks that target: run `rustup target add wasm32-wasip2`",
        );
    }
}

/// Whether this crate sits in the sandbox workspace, beside the providers'
/// sources.
fn in_workspace(manifest: &Path) -> bool {
    manifest.join("../providers/createos/Cargo.toml").is_file()
}

/// The crate version of provider `name`: the `version` of
/// `providers/<name>/Cargo.toml`'s package in the workspace, else the line
/// `<name> <version>` of `versions.txt` beside the components in `built`.
fn crate_version(manifest: &Path, built: &Path, name: &str) -> String {
    let from_manifest =
        std::fs::read_to_string(manifest.join("../providers").join(name).join("Cargo.toml"))
            .ok()
            .and_then(|text| {
                text.lines()
                    .map(str::trim)
                    .find_map(|l| l.strip_prefix("version = \""))
                    .and_then(|v| v.strip_suffix('"'))
                    .map(str::to_owned)
            });
    let from_list = || {
        std::fs::read_to_string(built.join("versions.txt"))
            .ok()?
            .lines()
            .find_map(|line| {
                line.strip_prefix(name)?
                    .strip_prefix(' ')
                    .map(str::to_owned)
            })
    };
    from_manifest
        .or_else(from_list)
        .unwrap_or_else(|| "unknown".to_owned())
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1);
}
